"""One converter per transformers MoE family: where its router, top-k and experts live, and its routing."""

from __future__ import annotations

from collections.abc import Callable

import torch

from moe_core import routing
from moe_core.errors import InvalidInputError
from moe_core.integrations.transformers.experts import (
    build_moe,
    experts_of,
    first_attr,
    fused_experts,
    match_activation,
    require_attr,
)
from moe_core.integrations.transformers.router import HFMoe, HFRouter


def from_mixtral(block, dtype: torch.dtype = torch.float32) -> HFMoe:
    """``MixtralSparseMoeBlock`` -> ``HFMoe``.

    Forms: 5.x fused ``MixtralExperts`` (``gate_up_proj`` ``[E, 2I, H]`` rows
    ``[gate; up]``, router ``MixtralTopKRouter``) and 4.x ``ModuleList`` of
    ``MixtralBlockSparseTop2MLP`` (``w1`` gate, ``w3`` up, ``w2`` down; router
    ``nn.Linear``). Routing: softmax over experts, top-k, renormalised.
    Activation: ``hidden_act`` probed (silu for every released Mixtral).
    Router jitter (training only) is not reproduced.
    """
    return _softmax_topk_block(block, dtype, "Mixtral", ("w1", "w3", "w2"), renormalize=True)


def from_qwen3_moe(block, dtype: torch.dtype = torch.float32) -> HFMoe:
    """``Qwen3MoeSparseMoeBlock`` -> ``HFMoe``.

    Forms: 5.x fused ``Qwen3MoeExperts`` (``gate_up_proj`` ``[E, 2I, H]`` rows
    ``[gate; up]``, router ``Qwen3MoeTopKRouter`` carrying ``top_k`` and
    ``norm_topk_prob``) and 4.x ``ModuleList`` of ``Qwen3MoeMLP``
    (``gate_proj``/``up_proj``/``down_proj``; router ``nn.Linear``, ``top_k``
    and ``norm_topk_prob`` on the block). Routing: softmax over experts, top-k,
    renormalised iff ``norm_topk_prob``. Qwen3-MoE has no shared expert.
    """
    return _softmax_topk_block(block, dtype, "Qwen3-MoE", ("gate_proj", "up_proj", "down_proj"), renormalize=None)


def _softmax_topk_block(block, dtype, family: str, names: tuple[str, str, str], renormalize: bool | None) -> HFMoe:
    """A block routed by softmax over its ``gate`` linear then top-k, experts gated by silu/gelu without
    biases: ``names`` are the 4.x per-expert (gate, up, down) linears; ``renormalize=None`` reads
    ``norm_topk_prob`` from the router or the block."""
    gate = require_attr(block, "gate", what="router")
    top_k = first_attr((gate, block), "top_k", "experts per token")
    if renormalize is None:
        renormalize = bool(first_attr((gate, block), "norm_topk_prob", "renormalise the top-k weights"))
    gate_name, up, down = names
    ex = experts_of(block, gate=gate_name, up=up, down=down, transposed=False, concatenated=True, has_bias=False)
    activation = match_activation(ex, ("silu", "gelu"), alpha=1.702, limit=7.0, family=family)
    router = HFRouter(
        require_attr(gate, "weight", what="router weight"),
        getattr(gate, "bias", None),
        lambda logits: routing.softmax_topk(logits, top_k, renormalize=renormalize),
        description=f"softmax_topk(top_k={top_k}, renormalize={renormalize})",
    )
    return build_moe(ex, activation, top_k, router, dtype, family)


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
    router_mod = require_attr(block, "router", what="router")
    top_k = first_attr((router_mod, block), "top_k", "experts per token")
    experts = require_attr(block, "experts", what="the routed experts")
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

    ex = fused_experts(experts, transposed=True, concatenated=False, has_bias=True, inline_gate=inline_gate_4x)
    activation = match_activation(ex, ("swiglu_oai",), alpha=alpha, limit=limit, family="gpt-oss")
    router = HFRouter(
        require_attr(router_mod, "weight", what="router weight"),
        getattr(router_mod, "bias", None),
        lambda logits: routing.topk_softmax(logits, top_k),
        description=f"topk_softmax(top_k={top_k})",
    )
    return build_moe(ex, activation, top_k, router, dtype, "gpt-oss", swiglu_alpha=alpha, swiglu_limit=limit)


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
    gate = require_attr(block, "gate", what="router")
    where = (gate, block)  # routing parameters live on the gate (4.x, 5.24) or on the block (5.0)
    top_k = int(first_attr(where, "top_k", "experts per token"))
    n_group = int(first_attr(where, "num_group", "number of expert groups", fallback="n_group"))
    topk_group = int(first_attr(where, "topk_group", "groups kept per token"))
    norm = bool(first_attr(where, "norm_topk_prob", "renormalise the top-k weights"))
    scale = float(first_attr(where, "routed_scaling_factor", "routed scaling factor"))
    bias = getattr(gate, "e_score_correction_bias", None)
    ex = experts_of(
        block, gate="gate_proj", up="up_proj", down="down_proj", transposed=False, concatenated=True, has_bias=False
    )
    activation = match_activation(ex, ("silu", "gelu"), alpha=1.702, limit=7.0, family="DeepSeek-V3")
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
        require_attr(gate, "weight", what="router weight"),
        None,
        route,
        float32_logits=True,
        description=(
            f"grouped_topk(top_k={top_k}, n_group={n_group}, topk_group={topk_group}, sigmoid, "
            f"correction_bias={'yes' if bias is not None else 'no'}, renormalize={norm}, "
            f"routed_scaling_factor={scale})"
        ),
    )
    return build_moe(ex, activation, top_k, router, dtype, "DeepSeek-V3")


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
