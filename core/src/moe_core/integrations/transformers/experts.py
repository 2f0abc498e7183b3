"""Reading a transformers block's expert storage into canonical weights, and probing its activation.

The storage forms (fused 3-D parameters in 5.x, a ModuleList of MLPs in 4.x) are described in the
package docstring; everything here is shared by the family converters in ``families``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch

from moe_core.activations import apply_activation
from moe_core.config import MoeConfig
from moe_core.dtypes import float_dtypes, short_name
from moe_core.errors import InvalidInputError
from moe_core.integrations.transformers.router import HFMoe, HFRouter
from moe_core.schemes import SCHEMES
from moe_core.weights import MoeWeights, SharedExperts, validate_weights


def require_attr(obj, *names: str, what: str):
    """The first of ``names`` that ``obj`` has (and is not None), else a clear error."""
    for name in names:
        value = getattr(obj, name, None)
        if value is not None:
            return value
    raise InvalidInputError(
        f"{type(obj).__name__} has no {' / '.join(names)} ({what}); is this the transformers block the "
        f"converter expects? See moe_core.integrations.transformers for the supported forms."
    )


def first_attr(objs: Sequence, name: str, what: str, fallback: str | None = None):
    """``name`` (else ``fallback``) from the first of ``objs`` that has it (and it is not None)."""
    for attr in (name, fallback) if fallback else (name,):
        for obj in objs:
            value = getattr(obj, attr, None)
            if value is not None:
                return value
    raise InvalidInputError(f"none of {', '.join(type(o).__name__ for o in objs)} has {name!r} ({what})")


def _scheme(dtype: torch.dtype) -> str:
    if dtype not in float_dtypes().values():
        raise InvalidInputError(
            f"dtype must be one of {', '.join(map(str, float_dtypes().values()))} (an unquantized scheme), got {dtype}"
        )
    return short_name(dtype)


def _copy(t: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    if t is None:
        return None
    return t.detach().to(dtype=dtype, copy=True).contiguous()


def _canonical_rows(intermediate: int, concatenated: bool, device) -> torch.Tensor:
    """Index into a transformers gate_up axis giving canonical ``[gate; up]`` order."""
    j = torch.arange(intermediate, device=device)
    if concatenated:  # [gate; up] already
        return torch.arange(2 * intermediate, device=device)
    return torch.cat([2 * j, 2 * j + 1])  # interleaved [g0, u0, g1, u1, ...]


class _Experts(NamedTuple):
    w13: torch.Tensor  # canonical [E, 2I, H], still the block's dtype
    w2: torch.Tensor  # [E, H, I]
    b13: torch.Tensor | None
    b2: torch.Tensor | None
    #: the experts' own activation on a transformers-layout gate_up [N, 2I] -> [N, I]
    gate_fn: Callable[[torch.Tensor], torch.Tensor]
    #: transformers-layout gate_up index -> canonical order (for probing gate_fn)
    rows: torch.Tensor
    form: str


def fused_experts(
    experts,
    *,
    transposed: bool,
    concatenated: bool,
    has_bias: bool,
    inline_gate: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> _Experts:
    """transformers 5.x: 3-D ``gate_up_proj`` / ``down_proj`` parameters (family defaults overridden by flags)."""
    name = type(experts).__name__
    transposed = bool(getattr(experts, "is_transposed", transposed))
    concatenated = bool(getattr(experts, "is_concatenated", concatenated))
    has_bias = bool(getattr(experts, "has_bias", has_bias))
    if getattr(experts, "has_gate", True) is False:
        raise InvalidInputError(f"{name} has no gate projection (has_gate=False); moe_core layers are gated")
    if getattr(experts, "has_post_expert_norm", False):
        raise InvalidInputError(f"{name} applies a norm after each expert, which moe_core layers do not have")
    gate_up = require_attr(experts, "gate_up_proj", what="fused gate/up expert weights").detach()
    down = require_attr(experts, "down_proj", what="fused down expert weights").detach()
    if gate_up.dim() != 3 or down.dim() != 3:
        raise InvalidInputError(
            f"{name}: expected 3-D gate_up_proj / down_proj, got {list(gate_up.shape)} / {list(down.shape)}"
        )
    if transposed:  # [E, H, 2I] / [E, I, H] -> [E, 2I, H] / [E, H, I]
        gate_up, down = gate_up.transpose(1, 2), down.transpose(1, 2)
    e, two_i, h = gate_up.shape
    if two_i % 2 or tuple(down.shape) != (e, h, two_i // 2):
        raise InvalidInputError(
            f"{name}: gate_up_proj and down_proj shapes do not fit a gated MoE "
            f"(as [E, 2I, H] / [E, H, I] after is_transposed={transposed}: {list(gate_up.shape)} / "
            f"{list(down.shape)})"
        )
    rows = _canonical_rows(two_i // 2, concatenated, gate_up.device)
    b13 = b2 = None
    if has_bias:
        b13 = require_attr(experts, "gate_up_proj_bias", what="gate/up expert biases").detach()
        b2 = require_attr(experts, "down_proj_bias", what="down expert biases").detach()
        if tuple(b13.shape) != (e, two_i) or tuple(b2.shape) != (e, h):
            raise InvalidInputError(
                f"{name}: bias shapes {list(b13.shape)} / {list(b2.shape)}, expected [{e}, {two_i}] / [{e}, {h}]"
            )
        b13 = b13[:, rows]
    else:
        for bias_name in ("gate_up_proj_bias", "down_proj_bias"):
            if getattr(experts, bias_name, None) is not None:
                raise InvalidInputError(f"{name} has {bias_name} but is not marked has_bias; refusing to guess")
    if hasattr(experts, "_apply_gate"):  # 5.x: the gate function every experts implementation calls
        gate_fn = experts._apply_gate
    elif inline_gate is not None:  # the formula is inlined in forward (gpt-oss 4.x): the caller transcribed it
        gate_fn = inline_gate
    else:  # fused experts without the 5.x decorator: chunk + act_fn
        act = require_attr(experts, "act_fn", what="expert activation")
        gate_fn = _chunk_gate(act, concatenated)
    form = f"fused (is_transposed={transposed}, is_concatenated={concatenated}, has_bias={has_bias})"
    return _Experts(gate_up[:, rows, :], down, b13, b2, gate_fn, rows, form)


def _chunk_gate(act, concatenated: bool):
    def gate_fn(gate_up: torch.Tensor) -> torch.Tensor:
        if concatenated:
            gate, up = gate_up.chunk(2, dim=-1)
        else:
            gate, up = gate_up[..., ::2], gate_up[..., 1::2]
        return act(gate) * up

    return gate_fn


def _linear_weight(expert, attr: str, expert_index: int) -> torch.Tensor:
    return _dense_weight(getattr(expert, attr, None), f"expert {expert_index} ({type(expert).__name__}) {attr}")


def _dense_weight(linear, what: str) -> torch.Tensor:
    """An ``nn.Linear``'s weight, refusing a bias (no family here has one on these projections)."""
    weight = getattr(linear, "weight", None)
    if weight is None:
        raise InvalidInputError(f"{what} has no weight (got {type(linear).__name__})")
    if getattr(linear, "bias", None) is not None:
        raise InvalidInputError(f"{what} has a bias, which this model family does not have; refusing to drop it")
    return weight.detach()


def _module_list_experts(experts, gate: str, up: str, down: str) -> _Experts:
    """transformers 4.x: a ModuleList of per-expert MLPs with one nn.Linear per projection."""
    if len(experts) == 0 or any(m is None for m in experts):
        raise InvalidInputError("the experts ModuleList is empty or sharded (None entries); convert an unsharded block")
    g = torch.stack([_linear_weight(m, gate, n) for n, m in enumerate(experts)])  # [E, I, H]
    u = torch.stack([_linear_weight(m, up, n) for n, m in enumerate(experts)])
    d = torch.stack([_linear_weight(m, down, n) for n, m in enumerate(experts)])  # [E, H, I]
    if g.shape != u.shape or tuple(d.shape) != (g.shape[0], g.shape[2], g.shape[1]):
        raise InvalidInputError(
            f"per-expert {gate}/{up}/{down} shapes {list(g.shape[1:])}/{list(u.shape[1:])}/{list(d.shape[1:])} "
            "do not fit a gated MLP"
        )
    act = require_attr(experts[0], "act_fn", what="expert activation")
    rows = torch.arange(2 * g.shape[1], device=g.device)
    return _Experts(torch.cat([g, u], dim=1), d, None, None, _chunk_gate(act, True), rows, "per-expert ModuleList")


def experts_of(
    block,
    *,
    gate: str = "gate_proj",
    up: str = "up_proj",
    down: str = "down_proj",
    transposed: bool = False,
    concatenated: bool = True,
    has_bias: bool = False,
):
    """The block's ``experts``: a 4.x ModuleList (per-expert ``gate``/``up``/``down`` linears) or 5.x fused."""
    experts = require_attr(block, "experts", what="the routed experts")
    if isinstance(experts, torch.nn.ModuleList):
        return _module_list_experts(experts, gate, up, down)
    return fused_experts(experts, transposed=transposed, concatenated=concatenated, has_bias=has_bias)


#: attribute names of a dense MLP's activation across families (act_fn; Llama 4 activation_fn; Granite activation)
_ACT_NAMES = ("act_fn", "activation_fn", "activation")


def read_shared_mlp(mlp, gate, dtype: torch.dtype, family: str) -> SharedExperts:
    """A dense gated MLP -> ``SharedExperts`` (copies in ``dtype``), its activation probed like the routed one.

    Forms: ``gate_proj`` / ``up_proj`` / ``down_proj`` linears (DeepSeek, Qwen2-MoE, Llama 4), or one
    ``input_linear`` ``[2I, H]`` rows ``[gate; up]`` and ``output_linear`` (GraniteMoeShared). ``gate``
    is the optional ``nn.Linear(H, 1)`` whose sigmoid scales the MLP's output (Qwen2-MoE).
    """

    def weight(attr: str) -> torch.Tensor:
        linear = require_attr(mlp, attr, what="shared MLP projection")
        return _dense_weight(linear, f"{family} shared MLP {attr}")

    if hasattr(mlp, "input_linear"):
        w13, w2 = weight("input_linear"), weight("output_linear")
    else:
        w13, w2 = torch.cat([weight("gate_proj"), weight("up_proj")]), weight("down_proj")
    two_i, h = w13.shape
    if two_i % 2 or tuple(w2.shape) != (h, two_i // 2):
        raise InvalidInputError(f"{family}: shared MLP shapes {list(w13.shape)} / {list(w2.shape)} are not gated")
    act = require_attr(mlp, *_ACT_NAMES, what="shared MLP activation")
    rows = torch.arange(two_i, device=w13.device)
    ex = _Experts(w13[None], w2[None], None, None, _chunk_gate(act, True), rows, "dense MLP")
    activation = match_activation(ex, ("silu", "gelu"), alpha=1.702, limit=7.0, family=f"{family} shared MLP")
    gate_w = None if gate is None else _dense_weight(gate, f"{family} shared expert gate")
    shared = SharedExperts(w13=_copy(w13, dtype), w2=_copy(w2, dtype), gate=_copy(gate_w, dtype), activation=activation)
    shared.validate(h)
    return shared


def _probe(two_i: int, device) -> torch.Tensor:
    # N(0, 6^2): crosses the swiglu_oai clamps (|x| > 7) often, and covers the gelu/silu tails
    gen = torch.Generator(device="cpu").manual_seed(1234)
    return (torch.randn(64, two_i, generator=gen) * 6).to(device)


def match_activation(ex: _Experts, candidates: Sequence[str], *, alpha: float, limit: float, family: str) -> str:
    """Which of ``candidates`` the experts' own gate function computes; raise if none."""
    probe = _probe(ex.w13.shape[1], ex.w13.device).to(ex.w13.dtype)
    with torch.no_grad():
        theirs = ex.gate_fn(probe).float()
        probe = probe.float()
        canonical = probe[:, ex.rows]
        errors = {}
        for name in candidates:
            ours = apply_activation(name, canonical, alpha=alpha, limit=limit)
            if theirs.shape == ours.shape:
                # bf16/fp16 blocks evaluate their gate in that dtype: compare at its resolution
                tol = 1e-5 if ex.w13.dtype == torch.float32 else 2e-2
                err = ((theirs - ours).abs() / (1 + ours.abs())).max().item()
                if err <= tol:
                    return name
                errors[name] = err
    raise InvalidInputError(
        f"{family}: the experts' activation matches none of moe_core's {', '.join(candidates)} "
        f"(max relative error on a probe: {errors}); the installed transformers may have changed the "
        "formula — a converted layer would compute something else, so nothing is returned"
    )


def experts_config(ex: _Experts, activation: str, top_k: int, dtype: torch.dtype, **config_kwargs) -> MoeConfig:
    """The ``MoeConfig`` of read experts: their shapes and biases, ``activation``, ``top_k``, the unquantized
    scheme of ``dtype`` (``config_kwargs``: swiglu parameters, router weight on input)."""
    e, two_i, h = ex.w13.shape
    return MoeConfig(
        num_experts=e,
        top_k=int(top_k),
        hidden_size=h,
        intermediate_size=two_i // 2,
        quant_scheme=_scheme(dtype),
        activation=activation,
        dtype=dtype,
        has_bias=ex.b13 is not None,
        **config_kwargs,
    )


def build_moe(
    ex: _Experts,
    activation: str,
    top_k: int,
    router: HFRouter,
    dtype: torch.dtype,
    family: str,
    shared: SharedExperts | None = None,
    **config_kwargs,
) -> HFMoe:
    e, _, h = ex.w13.shape
    if router.num_experts != e or router.hidden_size != h:
        raise InvalidInputError(
            f"{family}: router weight is [{router.num_experts}, {router.hidden_size}] but the experts are E={e}, H={h}"
        )
    config = experts_config(ex, activation, top_k, dtype, **config_kwargs)
    weights = MoeWeights(
        w13=_copy(ex.w13, dtype), w2=_copy(ex.w2, dtype), b13=_copy(ex.b13, dtype), b2=_copy(ex.b2, dtype)
    )
    validate_weights(config, weights)
    if shared is not None:
        shared.validate(h)
    return HFMoe(config, weights, router, shared)


def shared_of(block, dtype: torch.dtype, family: str, mlp: str, gate: str | None = None) -> SharedExperts | None:
    """The block's shared MLP ``block.<mlp>`` (gated by ``block.<gate>`` if named), or None if it has none."""
    module = getattr(block, mlp, None)
    if module is None:
        return None
    return read_shared_mlp(
        module, None if gate is None else require_attr(block, gate, what="shared gate"), dtype, family
    )


def gated_moe(
    block,
    dtype: torch.dtype,
    family: str,
    *,
    router_module,
    top_k: int,
    route: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
    description: str,
    names: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj"),
    transposed: bool = False,
    float32_logits: bool = False,
    shared: SharedExperts | None = None,
    **config_kwargs,
) -> HFMoe:
    """The common path of a silu/gelu-gated block without expert biases: its ``experts`` (``names``: the
    4.x per-expert gate/up/down linears), the activation probed, ``router_module``'s weight (and bias)
    for the logits, ``route`` for the choice."""
    gate, up, down = names
    ex = experts_of(block, gate=gate, up=up, down=down, transposed=transposed)
    activation = match_activation(ex, ("silu", "gelu"), alpha=1.702, limit=7.0, family=family)
    router = HFRouter(
        require_attr(router_module, "weight", what="router weight"),
        getattr(router_module, "bias", None),
        route,
        float32_logits=float32_logits,
        description=description,
    )
    return build_moe(ex, activation, top_k, router, dtype, family, shared=shared, **config_kwargs)


# --- gpt-oss's MXFP4 checkpoint tensors ----------------------------------------------------------------------------

#: the transformers class that holds gpt-oss's MXFP4 checkpoint tensors (``transformers.integrations.mxfp4``)
MXFP4_EXPERTS_CLASS = "Mxfp4GptOssExperts"
#: inputs per UE8M0 scale byte (``moe_core.quant.mxfp4.MXFP4_BLOCK``; read from the scheme table, no quant import)
MXFP4_BLOCK = SCHEMES["mxfp4"].scale_block[1]


def holds_mxfp4_checkpoint(experts) -> bool:
    """Whether ``experts`` holds gpt-oss's MXFP4 checkpoint tensors instead of float weights: transformers'
    ``Mxfp4GptOssExperts`` (by class name, subclasses included) or any module with ``gate_up_proj_blocks``.
    Says nothing about whether its weights are loaded yet (``read_mxfp4_experts`` does)."""
    if experts is None:
        return False
    return any(c.__name__ == MXFP4_EXPERTS_CLASS for c in type(experts).__mro__) or hasattr(
        experts, "gate_up_proj_blocks"
    )


def _unswizzled(t, what: str) -> torch.Tensor:
    """The plain torch tensor of a triton_kernels ``Tensor`` (``t.storage.data`` in ``t.storage.layout``),
    read back with the layout's own ``unswizzle_data`` — what transformers' ``Mxfp4ReverseDeserialize`` does to
    save such a module. Only the objects' methods are called: triton_kernels is not imported here."""
    storage = getattr(t, "storage", None)
    data, layout = getattr(storage, "data", None), getattr(storage, "layout", None)
    unswizzle = getattr(layout, "unswizzle_data", None)
    if not isinstance(data, torch.Tensor) or not callable(unswizzle):
        raise InvalidInputError(
            f"{what} is a {type(t).__name__} whose storage layout ({type(layout).__name__}) has no unswizzle_data: "
            "not the triton_kernels form transformers 5.24 writes (Storage(data, layout) with the layout's "
            "swizzle_data / unswizzle_data), so its bytes cannot be read back"
        )
    out = unswizzle(data)
    if not isinstance(out, torch.Tensor):
        raise InvalidInputError(f"{what}: unswizzle_data returned {type(out).__name__}, not a torch.Tensor")
    return out


def _mxfp4_projection(experts, proj: str, e: int, n: int, k: int) -> tuple[torch.Tensor, torch.Tensor, str]:
    """``(packed uint8 [E, n, k/2], scales uint8 [E, n, k/32], form)`` of ``proj`` as gpt-oss stores it:
    one row per output (``n``), the input (``k``) packed two E2M1 codes a byte, even index in the low nibble,
    one UE8M0 scale byte per 32 inputs."""
    name = type(experts).__name__
    blocks, scales = getattr(experts, f"{proj}_blocks", None), getattr(experts, f"{proj}_scales", None)
    weight = getattr(experts, proj, None)
    precision = getattr(experts, f"{proj}_precision_config", None)
    if blocks is not None or scales is not None:
        # the checkpoint's own tensors: blocks [E, n, k/32, 16], scales [E, n, k/32]
        if blocks is None or scales is None:
            raise InvalidInputError(f"{name} has only one of {proj}_blocks / {proj}_scales; is it half loaded?")
        blocks, scales = blocks.detach(), scales.detach()
        if blocks.dim() == 4:
            blocks = blocks.flatten(-2)
        form = "checkpoint tensors (_blocks / _scales)"
    elif isinstance(weight, torch.Tensor):  # first: a torch.Tensor has a .storage() method too
        raise InvalidInputError(
            f"{name}.{proj} is a plain {weight.dtype} tensor {list(weight.shape)} and there are no scales "
            f"({proj}_precision_config is {precision!r}): the module as transformers builds it before loading; its "
            "weights arrive (as swizzled triton_kernels tensors) only when an MXFP4 checkpoint is loaded into it"
        )
    elif weight is not None and hasattr(weight, "storage"):
        # transformers 5.24 after loading: triton_kernels tensors made from the transposed [E, k/2, n] blocks and
        # [E, k/32, n] scales (swizzle_mxfp4); read back as Mxfp4ReverseDeserialize does, then transposed back
        scale = getattr(precision, "weight_scale", None)
        if scale is None:
            raise InvalidInputError(
                f"{name}.{proj} is a triton_kernels tensor but {proj}_precision_config has no scale"
            )
        blocks = _unswizzled(weight, f"{name}.{proj}").transpose(-1, -2)
        raw = scale if isinstance(scale, torch.Tensor) else _unswizzled(scale, f"{name}.{proj} scales")
        scales = raw.detach().transpose(-1, -2)
        layouts = [type(t.storage.layout).__name__ for t in (weight, scale) if not isinstance(t, torch.Tensor)]
        form = f"triton_kernels tensors ({' / '.join(layouts)})"
    else:
        raise InvalidInputError(f"{name} has no {proj}_blocks / {proj}_scales nor a loaded {proj}")
    for what, t, shape in (("packed", blocks, (e, n, k // 2)), ("scales", scales, (e, n, k // MXFP4_BLOCK))):
        if not isinstance(t, torch.Tensor) or t.dtype != torch.uint8 or tuple(t.shape) != shape:
            got = f"{t.dtype} {list(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
            raise InvalidInputError(f"{name}.{proj} {what} ({form}): {got}, expected uint8 {list(shape)}")
        if t.is_meta:
            raise InvalidInputError(f"{name}.{proj} is on the meta device: its checkpoint is not loaded")
    return blocks, scales, form


def read_mxfp4_experts(experts, dtype: torch.dtype) -> tuple[MoeWeights, str]:
    """gpt-oss experts holding MXFP4 checkpoint tensors -> ``(weights, form)``: canonical ``mxfp4``
    ``MoeWeights`` made of the checkpoint's own bytes and scales (no dequantization), biases in ``dtype``
    (the activation dtype), on the experts' device; ``form`` says which form was read.

    The result is what ``moe_core.quant.quantize_weights(w, "mxfp4")`` gives for the float experts the
    checkpoint encodes: gpt-oss stores each projection with one row per output and the packing, nibble
    order (even index low), E2M1 codes and UE8M0 scale bytes (bias 127) of ``moe_core.quant.mxfp4``, one
    scale per 32 inputs — ``w13`` ``[E, 2I, H/2]`` / scales ``[E, 2I, H/32]``, ``w2`` ``[E, H, I/2]`` /
    ``[E, H, I/32]`` — so only the gate/up rows (and the ``gate_up_proj_bias`` columns) are de-interleaved,
    ``[g0, u0, g1, u1, ...]`` -> ``[gate; up]``, as ``from_gpt_oss`` does for float weights; bytes and
    scale bytes are copied, never re-encoded.

    Forms read (transformers' ``Mxfp4GptOssExperts``, or any module with the same attributes):

    - ``gate_up_proj_blocks`` ``[E, 2I, H/32, 16]`` / ``gate_up_proj_scales`` ``[E, 2I, H/32]`` (and
      ``down_proj_*``): the checkpoint's tensors as the module held them before transformers 4.55-4.57
      swizzled them (``load_and_swizzle_mxfp4``), or as a caller set them.
    - ``gate_up_proj`` / ``down_proj`` as triton_kernels ``Tensor`` s with ``*_precision_config.weight_scale``:
      what transformers 5.24 holds once an MXFP4 checkpoint is loaded with ``Mxfp4Config(dequantize=False)``
      (``swizzle_mxfp4_convertops``: the transposed blocks in the layout ``make_default_matmul_mxfp4_w_layout``
      picks for the device — strided on CPU and before Hopper, ``HopperMXValueLayout`` on sm90, strided or
      ``BlackwellMXValueLayout`` on sm100 by triton_kernels version — and the scales always strided). They are
      **unswizzled**, not refused: through each tensor's own ``storage.layout.unswizzle_data``, the way
      transformers' ``Mxfp4ReverseDeserialize`` reads them back to save the checkpoint; a layout without
      that method (another triton_kernels API) raises ``InvalidInputError``.

    The module as transformers 5.24 builds it before loading (``gate_up_proj`` a zero ``uint8`` parameter,
    no scales, precision configs ``None``), meta tensors and shapes that do not fit the module's
    ``num_experts`` / ``hidden_size`` / ``intermediate_size`` raise ``InvalidInputError``.
    """
    name = type(experts).__name__
    e = int(require_attr(experts, "num_experts", what="expert count"))
    h = int(require_attr(experts, "hidden_size", what="hidden size"))
    i = int(require_attr(experts, "intermediate_size", what="expert intermediate size"))
    if h % MXFP4_BLOCK or i % MXFP4_BLOCK:
        raise InvalidInputError(f"{name}: hidden {h} and intermediate {i} must be multiples of {MXFP4_BLOCK} for MXFP4")
    _scheme(dtype)  # an unquantized activation dtype
    gate_up, gate_up_scales, form = _mxfp4_projection(experts, "gate_up_proj", e, 2 * i, h)
    down, down_scales, _ = _mxfp4_projection(experts, "down_proj", e, h, i)
    b13 = require_attr(experts, "gate_up_proj_bias", what="gate/up expert biases").detach()
    b2 = require_attr(experts, "down_proj_bias", what="down expert biases").detach()
    if tuple(b13.shape) != (e, 2 * i) or tuple(b2.shape) != (e, h):
        raise InvalidInputError(
            f"{name}: bias shapes {list(b13.shape)} / {list(b2.shape)}, expected [{e}, {2 * i}] / [{e}, {h}]"
        )
    rows = _canonical_rows(i, concatenated=False, device=gate_up.device)  # interleaved -> [gate; up]
    weights = MoeWeights(
        w13=gate_up[:, rows].contiguous(),  # indexing copies
        w2=_copy(down, torch.uint8),
        b13=b13[:, rows].to(dtype).contiguous(),
        b2=_copy(b2, dtype),
        w13_scale=gate_up_scales[:, rows].contiguous(),
        w2_scale=_copy(down_scales, torch.uint8),
    )
    return weights, form
