"""Hugging Face transformers MoE blocks -> ``(MoeConfig, MoeWeights, router)``.

Each converter takes an *instantiated* transformers MoE block and returns an
``HFMoe`` named tuple ``(config, weights, router)``:

- ``config`` — a ``MoeConfig`` for the block's **routed** experts
  (``quant_scheme`` follows ``dtype``: fp32 / bf16 / fp16);
- ``weights`` — canonical ``MoeWeights`` (``w13`` ``[E, 2I, H]`` rows
  ``[gate; up]``, ``w2`` ``[E, H, I]``, biases ``b13`` ``[E, 2I]``,
  ``b2`` ``[E, H]``), copies in ``dtype`` (float32 by default), contiguous, on
  the block's device;
- ``router`` — an ``HFRouter``: ``hidden_states [M, H] -> (topk_ids int32
  [M, k], topk_weights float32 [M, k])``, the block's own gate linear for the
  logits and a ``moe_core.routing`` function for the choice.

so that ``MoeRunner(config, weights)(x, *router(x))`` is the block's routed
expert output for ``x`` ``[M, H]``.

Supported blocks (``from_hf_block`` picks by class name, subclasses included):

- ``MixtralSparseMoeBlock`` -> ``from_mixtral``; routing ``softmax_topk``
  (renormalised; equal to ``topk_softmax``).
- ``Qwen3MoeSparseMoeBlock`` -> ``from_qwen3_moe``; routing
  ``softmax_topk(renormalize=norm_topk_prob)``.
- ``GptOssMLP`` -> ``from_gpt_oss``; routing ``topk_softmax`` of the biased
  router logits; activation ``swiglu_oai``; expert biases.
- ``DeepseekV3MoE`` -> ``from_deepseek_v3``; routing ``grouped_topk``
  (sigmoid, correction bias, groups, ``routed_scaling_factor``); routed
  experts only.

Expert storage forms:

- **fused** (transformers 5.x; checked against 5.0.0 and 5.24.0): one
  ``gate_up_proj`` and one ``down_proj`` 3-D parameter in the block's
  ``experts`` module. The layout is read from the flags transformers'
  ``@use_experts_implementation`` sets on the module (``is_transposed``,
  ``is_concatenated``, ``has_bias``), falling back to the family's known
  layout when the flags are absent: Mixtral, Qwen3-MoE and DeepSeek-V3 store
  ``gate_up_proj`` ``[E, 2I, H]`` with rows ``[gate; up]`` and ``down_proj``
  ``[E, H, I]``; gpt-oss (in every release since it appeared in 4.55) stores
  ``gate_up_proj`` ``[E, H, 2I]`` with *interleaved* columns
  ``[g0, u0, g1, u1, ...]``, ``down_proj`` ``[E, I, H]`` and biases
  ``gate_up_proj_bias`` ``[E, 2I]`` (interleaved too), ``down_proj_bias``
  ``[E, H]``.
- **per-expert** (transformers 4.x; checked against 4.57.6): ``experts`` is a
  ``ModuleList`` of MLPs with one ``nn.Linear`` per projection — Mixtral
  ``w1`` (gate), ``w3`` (up), ``w2`` (down); Qwen3-MoE and DeepSeek-V3
  ``gate_proj``, ``up_proj``, ``down_proj``. The router is then the block's
  ``gate`` ``nn.Linear`` (Mixtral, Qwen3-MoE) with ``top_k`` /
  ``norm_topk_prob`` on the block.

Shapes are checked against each other and against the router before anything
is trusted, and the activation is *probed*, not assumed: the experts' own gate
function (``_apply_gate`` in 5.x, ``act_fn`` in 4.x) is evaluated on a fixed
probe that crosses the swiglu clamps and compared with
``moe_core.activations``; a mismatch raises ``InvalidInputError`` rather than
producing a layer that is silently different.

Not converted (the caller must account for them): DeepSeek-V3's
``shared_experts`` (a dense MLP added to the routed output — compare against
``block(x) - block.shared_experts(x)``), Mixtral's training-time router jitter
(put the block in ``eval()`` mode or set ``router_jitter_noise=0``), and any
expert-parallel sharding (convert an unsharded block).

transformers itself is never imported here: the converters read the block's
attributes, so this module imports without transformers installed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch
import torch.nn.functional as F

from moe_core import routing
from moe_core.activations import apply_activation
from moe_core.config import MoeConfig
from moe_core.dtypes import float_dtypes, short_name
from moe_core.errors import InvalidInputError
from moe_core.weights import MoeWeights, validate_weights

__all__ = [
    "SUPPORTED_BLOCKS",
    "HFMoe",
    "HFRouter",
    "from_deepseek_v3",
    "from_gpt_oss",
    "from_hf_block",
    "from_mixtral",
    "from_qwen3_moe",
]


class HFRouter:
    """The routing of a transformers MoE block, reproduced with ``moe_core.routing``.

    ``router(hidden_states)`` takes ``[M, H]`` (any leading dims are flattened)
    and returns ``(topk_ids int32 [M, k], topk_weights float32 [M, k])``.
    Logits come from the block's own gate parameters (referenced, not copied, so
    they follow the block), computed in the gate weight's dtype as the block
    does, or in float32 where the block does that (DeepSeek-V3).
    """

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        route: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
        *,
        float32_logits: bool = False,
        description: str = "",
    ) -> None:
        self.weight = weight.detach()
        self.bias = None if bias is None else bias.detach()
        self.route = route
        self.float32_logits = float32_logits
        self.description = description

    @property
    def num_experts(self) -> int:
        return self.weight.shape[0]

    @property
    def hidden_size(self) -> int:
        return self.weight.shape[1]

    def logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """Router logits ``[M, E]`` exactly as the block's gate computes them."""
        if hidden_states.shape[-1] != self.hidden_size:
            raise InvalidInputError(
                f"hidden_states last dim is {hidden_states.shape[-1]}, the router expects {self.hidden_size}"
            )
        x = hidden_states.reshape(-1, self.hidden_size)
        w, b = self.weight, self.bias
        if self.float32_logits:
            x, w = x.float(), w.float()
            b = None if b is None else b.float()
        else:
            x = x.to(w.dtype)
        return F.linear(x, w, b)

    @torch.no_grad()
    def __call__(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.route(self.logits(hidden_states))

    def __repr__(self) -> str:
        return f"HFRouter(E={self.num_experts}, H={self.hidden_size}, {self.description})"


class HFMoe(NamedTuple):
    """A converted block: unpack as ``config, weights, router = from_hf_block(block)``."""

    config: MoeConfig
    weights: MoeWeights
    router: HFRouter


# --------------------------------------------------------------------------- helpers


def _attr(obj, *names: str, what: str):
    """The first of ``names`` that ``obj`` has (and is not None), else a clear error."""
    for name in names:
        value = getattr(obj, name, None)
        if value is not None:
            return value
    raise InvalidInputError(
        f"{type(obj).__name__} has no {' / '.join(names)} ({what}); is this the transformers block the "
        f"converter expects? See moe_core.integrations.transformers for the supported forms."
    )


def _first_attr(objs: Sequence, name: str, what: str, fallback: str | None = None):
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


def _fused_experts(
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
    gate_up = _attr(experts, "gate_up_proj", what="fused gate/up expert weights").detach()
    down = _attr(experts, "down_proj", what="fused down expert weights").detach()
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
        b13 = _attr(experts, "gate_up_proj_bias", what="gate/up expert biases").detach()
        b2 = _attr(experts, "down_proj_bias", what="down expert biases").detach()
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
        act = _attr(experts, "act_fn", what="expert activation")
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
    linear = getattr(expert, attr, None)
    weight = getattr(linear, "weight", None)
    if weight is None:
        raise InvalidInputError(f"expert {expert_index} ({type(expert).__name__}) has no {attr}.weight")
    if getattr(linear, "bias", None) is not None:
        raise InvalidInputError(
            f"expert {expert_index}: {attr} has a bias, which this model family does not have; refusing to drop it"
        )
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
    act = _attr(experts[0], "act_fn", what="expert activation")
    rows = torch.arange(2 * g.shape[1], device=g.device)
    return _Experts(torch.cat([g, u], dim=1), d, None, None, _chunk_gate(act, True), rows, "per-expert ModuleList")


def _experts_of(block, *, gate: str, up: str, down: str, transposed: bool, concatenated: bool, has_bias: bool):
    experts = _attr(block, "experts", what="the routed experts")
    if isinstance(experts, torch.nn.ModuleList):
        return _module_list_experts(experts, gate, up, down)
    return _fused_experts(experts, transposed=transposed, concatenated=concatenated, has_bias=has_bias)


def _probe(two_i: int, device) -> torch.Tensor:
    # N(0, 6^2): crosses the swiglu_oai clamps (|x| > 7) often, and covers the gelu/silu tails
    gen = torch.Generator(device="cpu").manual_seed(1234)
    return (torch.randn(64, two_i, generator=gen) * 6).to(device)


def _match_activation(ex: _Experts, candidates: Sequence[str], *, alpha: float, limit: float, family: str) -> str:
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


def _build(
    ex: _Experts,
    activation: str,
    top_k: int,
    router: HFRouter,
    dtype: torch.dtype,
    family: str,
    **config_kwargs,
) -> HFMoe:
    e, two_i, h = ex.w13.shape
    if router.num_experts != e or router.hidden_size != h:
        raise InvalidInputError(
            f"{family}: router weight is [{router.num_experts}, {router.hidden_size}] but the experts are E={e}, H={h}"
        )
    config = MoeConfig(
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
    weights = MoeWeights(
        w13=_copy(ex.w13, dtype), w2=_copy(ex.w2, dtype), b13=_copy(ex.b13, dtype), b2=_copy(ex.b2, dtype)
    )
    validate_weights(config, weights)
    return HFMoe(config, weights, router)


# --------------------------------------------------------------------------- families


def from_mixtral(block, dtype: torch.dtype = torch.float32) -> HFMoe:
    """``MixtralSparseMoeBlock`` -> ``HFMoe``.

    Forms: 5.x fused ``MixtralExperts`` (``gate_up_proj`` ``[E, 2I, H]`` rows
    ``[gate; up]``, router ``MixtralTopKRouter``) and 4.x ``ModuleList`` of
    ``MixtralBlockSparseTop2MLP`` (``w1`` gate, ``w3`` up, ``w2`` down; router
    ``nn.Linear``). Routing: softmax over experts, top-k, renormalised.
    Activation: ``hidden_act`` probed (silu for every released Mixtral).
    Router jitter (training only) is not reproduced.
    """
    gate = _attr(block, "gate", what="router")
    top_k = _first_attr((gate, block), "top_k", "experts per token")
    ex = _experts_of(block, gate="w1", up="w3", down="w2", transposed=False, concatenated=True, has_bias=False)
    activation = _match_activation(ex, ("silu", "gelu"), alpha=1.702, limit=7.0, family="Mixtral")
    router = HFRouter(
        _attr(gate, "weight", what="router weight"),
        getattr(gate, "bias", None),
        lambda logits: routing.softmax_topk(logits, top_k, renormalize=True),
        description=f"softmax_topk(top_k={top_k}, renormalize=True)",
    )
    return _build(ex, activation, top_k, router, dtype, "Mixtral")


def from_qwen3_moe(block, dtype: torch.dtype = torch.float32) -> HFMoe:
    """``Qwen3MoeSparseMoeBlock`` -> ``HFMoe``.

    Forms: 5.x fused ``Qwen3MoeExperts`` (``gate_up_proj`` ``[E, 2I, H]`` rows
    ``[gate; up]``, router ``Qwen3MoeTopKRouter`` carrying ``top_k`` and
    ``norm_topk_prob``) and 4.x ``ModuleList`` of ``Qwen3MoeMLP``
    (``gate_proj``/``up_proj``/``down_proj``; router ``nn.Linear``, ``top_k``
    and ``norm_topk_prob`` on the block). Routing: softmax over experts, top-k,
    renormalised iff ``norm_topk_prob``. Qwen3-MoE has no shared expert.
    """
    gate = _attr(block, "gate", what="router")
    top_k = _first_attr((gate, block), "top_k", "experts per token")
    norm = bool(_first_attr((gate, block), "norm_topk_prob", "renormalise the top-k weights"))
    ex = _experts_of(
        block, gate="gate_proj", up="up_proj", down="down_proj", transposed=False, concatenated=True, has_bias=False
    )
    activation = _match_activation(ex, ("silu", "gelu"), alpha=1.702, limit=7.0, family="Qwen3-MoE")
    router = HFRouter(
        _attr(gate, "weight", what="router weight"),
        getattr(gate, "bias", None),
        lambda logits: routing.softmax_topk(logits, top_k, renormalize=norm),
        description=f"softmax_topk(top_k={top_k}, renormalize={norm})",
    )
    return _build(ex, activation, top_k, router, dtype, "Qwen3-MoE")


def from_gpt_oss(block, dtype: torch.dtype = torch.float32) -> HFMoe:
    """``GptOssMLP`` -> ``HFMoe`` (activation ``swiglu_oai``, with biases).

    Form: fused ``GptOssExperts`` as in every transformers release with gpt-oss
    (4.55+ and 5.x): ``gate_up_proj`` ``[E, H, 2I]`` with interleaved columns
    ``[g0, u0, g1, u1, ...]``, ``down_proj`` ``[E, I, H]``, biases
    ``gate_up_proj_bias`` ``[E, 2I]`` (interleaved) and ``down_proj_bias``
    ``[E, H]``; de-interleaved and transposed into the canonical layout here.
    Activation: transformers computes ``gate.clamp(max=limit)``,
    ``up.clamp(-limit, limit)``, ``(up + 1) * gate * sigmoid(alpha * gate)`` —
    the same as ``moe_core.activations.swiglu_oai`` — with ``alpha``/``limit``
    read from the experts (1.702 / 7.0). In 5.x the probe re-checks that against
    the experts' own ``_apply_gate`` on every call; 4.x inlines the formula in
    ``forward``, so there the probe checks a transcription of the 4.57 source.
    Routing: top-k of the router logits (router has a bias), softmax over the k.
    """
    router_mod = _attr(block, "router", what="router")
    top_k = _first_attr((router_mod, block), "top_k", "experts per token")
    experts = _attr(block, "experts", what="the routed experts")
    if isinstance(experts, torch.nn.ModuleList):
        raise InvalidInputError("gpt-oss experts as a ModuleList is not a form transformers has shipped")
    config = getattr(experts, "config", None)
    alpha = float(getattr(experts, "alpha", None) or getattr(config, "swiglu_alpha", None) or 1.702)
    limit = float(getattr(experts, "limit", None) or getattr(config, "swiglu_limit", None) or 7.0)

    def inline_gate_4x(gate_up: torch.Tensor) -> torch.Tensor:
        # transcribed from GptOssExperts.forward of transformers 4.55-4.57 (no _apply_gate there)
        gate, up = gate_up[..., ::2], gate_up[..., 1::2]
        gate = gate.clamp(min=None, max=limit)
        up = up.clamp(min=-limit, max=limit)
        return (up + 1) * (gate * torch.sigmoid(gate * alpha))

    ex = _fused_experts(experts, transposed=True, concatenated=False, has_bias=True, inline_gate=inline_gate_4x)
    activation = _match_activation(ex, ("swiglu_oai",), alpha=alpha, limit=limit, family="gpt-oss")
    router = HFRouter(
        _attr(router_mod, "weight", what="router weight"),
        getattr(router_mod, "bias", None),
        lambda logits: routing.topk_softmax(logits, top_k),
        description=f"topk_softmax(top_k={top_k})",
    )
    return _build(ex, activation, top_k, router, dtype, "gpt-oss", swiglu_alpha=alpha, swiglu_limit=limit)


def from_deepseek_v3(block, dtype: torch.dtype = torch.float32) -> HFMoe:
    """``DeepseekV3MoE`` -> ``HFMoe`` for the **routed experts only**.

    The block's ``shared_experts`` (a dense MLP applied to every token and
    added to the routed output) are *not* part of the result: the routed
    output is ``block(x) - block.shared_experts(x)``; run the shared MLP
    yourself when you need the whole block.

    Forms: 5.x fused ``DeepseekV3Experts`` (5.0: ``DeepseekV3NaiveMoe``;
    ``gate_up_proj`` ``[E, 2I, H]`` rows ``[gate; up]``) and 4.x ``ModuleList``
    of ``DeepseekV3MLP`` (``gate_proj``/``up_proj``/``down_proj``). The router
    ``DeepseekV3TopkRouter`` holds ``weight`` and ``e_score_correction_bias``;
    ``top_k``, ``n_group`` (5.24: ``num_group``), ``topk_group``,
    ``norm_topk_prob``, ``routed_scaling_factor`` are read from the router (4.x,
    5.24) or the block (5.0). Routing: float32 logits, sigmoid scores, the
    correction bias added for the choice only, the best ``topk_group`` of
    ``n_group`` groups (a group scored by its two best experts), top-k, weights
    from the unbiased scores, renormalised iff ``norm_topk_prob``, times
    ``routed_scaling_factor``.

    Experts of dropped groups are masked with ``-inf`` (``moe_core.routing``,
    DeepSeek's official inference code, transformers since
    huggingface/transformers#45441, e.g. 5.24). Earlier transformers (4.x up to
    at least 5.0) mask with ``0.0``, which differs only when a kept expert's
    *biased* score ``sigmoid(logit) + bias`` is negative (then HF may pick an
    expert of a dropped group); real DeepSeek-V3 correction biases are positive,
    so checkpoints route identically, but random negative biases may not.
    """
    gate = _attr(block, "gate", what="router")
    where = (gate, block)  # routing parameters live on the gate (4.x, 5.24) or on the block (5.0)
    top_k = int(_first_attr(where, "top_k", "experts per token"))
    n_group = int(_first_attr(where, "num_group", "number of expert groups", fallback="n_group"))
    topk_group = int(_first_attr(where, "topk_group", "groups kept per token"))
    norm = bool(_first_attr(where, "norm_topk_prob", "renormalise the top-k weights"))
    scale = float(_first_attr(where, "routed_scaling_factor", "routed scaling factor"))
    bias = getattr(gate, "e_score_correction_bias", None)
    ex = _experts_of(
        block, gate="gate_proj", up="up_proj", down="down_proj", transposed=False, concatenated=True, has_bias=False
    )
    activation = _match_activation(ex, ("silu", "gelu"), alpha=1.702, limit=7.0, family="DeepSeek-V3")
    correction = None if bias is None else bias.detach()

    def route(logits: torch.Tensor):
        return routing.grouped_topk(
            logits,
            top_k,
            n_group=n_group,
            topk_group=topk_group,
            correction_bias=correction,
            scoring="sigmoid",
            renormalize=norm,
            routed_scaling_factor=scale,
        )

    router = HFRouter(
        _attr(gate, "weight", what="router weight"),
        None,
        route,
        float32_logits=True,
        description=(
            f"grouped_topk(top_k={top_k}, n_group={n_group}, topk_group={topk_group}, sigmoid, "
            f"correction_bias={'yes' if bias is not None else 'no'}, renormalize={norm}, "
            f"routed_scaling_factor={scale})"
        ),
    )
    return _build(ex, activation, top_k, router, dtype, "DeepSeek-V3")


#: class name -> converter; ``from_hf_block`` matches the block's class or any base class.
SUPPORTED_BLOCKS: dict[str, Callable[..., HFMoe]] = {
    "MixtralSparseMoeBlock": from_mixtral,
    "Qwen3MoeSparseMoeBlock": from_qwen3_moe,
    "GptOssMLP": from_gpt_oss,
    "DeepseekV3MoE": from_deepseek_v3,
}


def from_hf_block(block, dtype: torch.dtype = torch.float32) -> HFMoe:
    """Convert any supported transformers MoE block, chosen by its class name (or a base class's)."""
    for cls in type(block).__mro__:
        converter = SUPPORTED_BLOCKS.get(cls.__name__)
        if converter is not None:
            return converter(block, dtype=dtype)
    raise InvalidInputError(
        f"no converter for {type(block).__name__}; supported transformers MoE blocks: "
        f"{', '.join(SUPPORTED_BLOCKS)} (DeepseekV3MoE: routed experts only)"
    )
