"""DeepSeek-style blocks: group-limited top-k (``grouped_topk``) and a ``shared_experts`` MLP."""

from __future__ import annotations

import torch

from moe_core import routing
from moe_core.errors import InvalidInputError
from moe_core.integrations.transformers.experts import first_attr, gated_moe, require_attr, shared_of
from moe_core.integrations.transformers.router import HFMoe


def from_deepseek_v3(block, dtype: torch.dtype = torch.float32) -> HFMoe:
    """``DeepseekV3MoE`` -> ``HFMoe``; also its clones (the same router and ``shared_experts``, checked line by
    line against 5.24): ``DeepseekV32MoE``, ``BailingHybridMoE``, ``Glm4MoeMoE``, ``Glm4MoeLiteMoE``,
    ``Glm4vMoeTextMoE``, ``GlmMoeDsaMoE``, ``KimiLinearMoE``, ``Dots1MoE``, ``Dots3NoteTextMoE``,
    ``ExaoneMoeSparseMoEBlock``, ``SolarOpenMoE`` and ``MiMoV2FlashMoE`` (no shared experts: ``shared`` is None).

    ``shared`` is the block's ``shared_experts`` MLP (``n_shared_experts`` experts as one MLP of their
    summed width), added to the routed output: ``block(x) = routed + shared``.

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
    correction = None if bias is None else bias.detach()
    kwargs = dict(n_group=n_group, topk_group=topk_group, scoring="sigmoid", renormalize=norm)
    return _grouped_block(
        block,
        dtype,
        "DeepSeek-V3",
        top_k,
        scale,
        dict(kwargs, correction_bias=correction),
        f"correction_bias={'yes' if bias is not None else 'no'}",
    )


def from_deepseek_v2(block, dtype: torch.dtype = torch.float32) -> HFMoe:
    """``DeepseekV2Moe`` (and ``DeepseekOcr2TextMoe``, ``UnlimitedOcrTextMoe``: the same block) -> ``HFMoe``
    with ``shared``.

    Differs from DeepSeek-V3 in the router only (``DeepseekV2TopkRouter``): float32 logits, *softmax*
    scores, no correction bias, no renormalisation, times ``routed_scaling_factor``; ``topk_method``
    ``"greedy"`` is a plain top-k, ``"group_limited_greedy"`` keeps the ``topk_group`` best of
    ``n_group`` groups scored by their *best* expert (``grouped_topk(group_scoring="max")``;
    transformers masks dropped experts with ``0.0``, the same choice for positive softmax scores).
    Experts and ``shared_experts`` as DeepSeek-V3.
    """
    gate = require_attr(block, "gate", what="router")
    top_k = int(first_attr((gate, block), "top_k", "experts per token"))
    scale = float(first_attr((gate, block), "routed_scaling_factor", "routed scaling factor"))
    method = first_attr((gate, block), "topk_method", "top-k method")
    if method == "greedy":
        n_group = topk_group = 1
    elif method == "group_limited_greedy":
        n_group = int(first_attr((gate, block), "num_group", "number of expert groups", fallback="n_group"))
        topk_group = int(first_attr((gate, block), "topk_group", "groups kept per token"))
    else:
        raise InvalidInputError(f"DeepSeek-V2: topk_method {method!r} is neither 'greedy' nor 'group_limited_greedy'")
    kwargs = dict(n_group=n_group, topk_group=topk_group, scoring="softmax", renormalize=False, group_scoring="max")
    return _grouped_block(block, dtype, "DeepSeek-V2", top_k, scale, kwargs, f"topk_method={method}")


def from_mistral4(block, dtype: torch.dtype = torch.float32) -> HFMoe:
    """``Mistral4MoE`` and ``MistralLarge4TextMoE`` -> ``HFMoe`` with ``shared``.

    Router ``Mistral4TopkRouter``: *softmax* scores, no correction bias, the best ``topk_group`` of
    ``n_group`` groups scored by their two best experts (``group_scoring="top2_sum"``), top-k, weights
    renormalised iff ``norm_topk_prob``, times ``routed_scaling_factor``. Logits in the gate's dtype
    (Mistral 4) or float32 (``MistralLarge4TextTopkRouter``, which has no ``norm_topk_prob`` and always
    renormalises). transformers masks dropped experts with ``0.0``: the same choice as ``-inf`` for
    positive softmax scores. ``shared_experts`` as DeepSeek-V3.
    """
    gate = require_attr(block, "gate", what="router")
    large = type(gate).__name__.startswith("MistralLarge4")
    top_k = int(first_attr((gate, block), "top_k", "experts per token"))
    scale = float(first_attr((gate, block), "routed_scaling_factor", "routed scaling factor"))
    n_group = int(first_attr((gate, block), "num_group", "number of expert groups", fallback="n_group"))
    topk_group = int(first_attr((gate, block), "topk_group", "groups kept per token"))
    norm = True if large else bool(first_attr((gate, block), "norm_topk_prob", "renormalise the top-k weights"))
    kwargs = dict(n_group=n_group, topk_group=topk_group, scoring="softmax", renormalize=norm)
    family = "Mistral-Large-4" if large else "Mistral 4"
    return _grouped_block(block, dtype, family, top_k, scale, kwargs, "no correction bias", float32_logits=large)


def _grouped_block(
    block, dtype, family: str, top_k: int, scale: float, kwargs: dict, note: str, float32_logits: bool = True
) -> HFMoe:
    route = routing.GroupedTopK(top_k, routed_scaling_factor=scale, **kwargs)
    shown = ", ".join(f"{k}={v}" for k, v in kwargs.items() if k != "correction_bias")
    return gated_moe(
        block,
        dtype,
        family,
        router_module=require_attr(block, "gate", what="router"),
        top_k=top_k,
        route=route,
        description=f"grouped_topk(top_k={top_k}, {shown}, {note}, routed_scaling_factor={scale})",
        float32_logits=float32_logits,
        shared=shared_of(block, dtype, family, "shared_experts"),
    )


def one_group_block(
    block,
    dtype,
    family: str,
    *,
    renormalize: bool | None,
    eps: float,
    scoring: str = "sigmoid",
    bias: torch.Tensor | None = None,
    renormalize_min: float = 0.0,
    scale: float = 1.0,
    float32_logits: bool = False,
    shared=None,
) -> HFMoe:
    """Top-k of the block's ``gate`` scores without groups, the choice optionally biased: ``grouped_topk``
    with one group (MiniMax-M2, Dots3Note vision, Flint, LFM2-MoE, Ernie 4.5). ``renormalize=None`` reads
    ``norm_topk_prob`` from the router or the block; the denominator is ``max(sum + eps, renormalize_min)``."""
    gate = require_attr(block, "gate", what="router")
    top_k = int(first_attr((gate, block), "top_k", "experts per token"))
    if renormalize is None:
        renormalize = bool(first_attr((gate, block), "norm_topk_prob", "renormalise the top-k weights"))
    correction = None if bias is None else bias.detach().reshape(-1)
    kwargs = dict(scoring=scoring, renormalize=renormalize, renormalize_eps=eps, renormalize_min=renormalize_min)

    route = routing.GroupedTopK(top_k, correction_bias=correction, routed_scaling_factor=scale, **kwargs)
    shown = ", ".join(f"{k}={v}" for k, v in kwargs.items())
    return gated_moe(
        block,
        dtype,
        family,
        route=route,
        router_module=gate,
        top_k=top_k,
        description=(
            f"grouped_topk(top_k={top_k}, {shown}, correction_bias={'yes' if bias is not None else 'no'}, "
            f"routed_scaling_factor={scale})"
        ),
        float32_logits=float32_logits,
        shared=shared,
    )
