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


def float_scheme(dtype: torch.dtype) -> str:
    if dtype not in float_dtypes().values():
        raise InvalidInputError(
            f"dtype must be one of {', '.join(map(str, float_dtypes().values()))} (an unquantized scheme), got {dtype}"
        )
    return short_name(dtype)


def copied(t: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    if t is None:
        return None
    return t.detach().to(dtype=dtype, copy=True).contiguous()


def canonical_rows(intermediate: int, concatenated: bool, device) -> torch.Tensor:
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
    rows = canonical_rows(two_i // 2, concatenated, gate_up.device)
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
    shared = SharedExperts(
        w13=copied(w13, dtype), w2=copied(w2, dtype), gate=copied(gate_w, dtype), activation=activation
    )
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
        quant_scheme=float_scheme(dtype),
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
        w13=copied(ex.w13, dtype), w2=copied(ex.w2, dtype), b13=copied(ex.b13, dtype), b2=copied(ex.b2, dtype)
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
    description: str = "",
    names: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj"),
    transposed: bool = False,
    float32_logits: bool = False,
    shared: SharedExperts | None = None,
    **config_kwargs,
) -> HFMoe:
    """The common path of a silu/gelu-gated block without expert biases: its ``experts`` (``names``: the
    4.x per-expert gate/up/down linears), the activation probed, ``router_module``'s weight (and bias)
    for the logits, ``route`` for the choice (``description`` names it in the router's repr where ``route`` is
    not a routing bundle that names itself)."""
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
