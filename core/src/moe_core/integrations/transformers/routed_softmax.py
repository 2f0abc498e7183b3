"""Blocks routed by a softmax over their router's logits (``softmax_topk``, ``topk_softmax``, ``sparsemixer``)."""

from __future__ import annotations

import torch

from moe_core import routing
from moe_core.errors import InvalidInputError
from moe_core.integrations.transformers.experts import (
    build_moe,
    first_attr,
    fused_experts,
    gated_moe,
    match_activation,
    read_shared_mlp,
    require_attr,
    shared_of,
)
from moe_core.integrations.transformers.routed_grouped import one_group_block
from moe_core.integrations.transformers.router import HFMoe, HFRouter

#: the per-expert (gate, up, down) linears of the 4.x ModuleList form
_GATE_UP_DOWN = ("gate_proj", "up_proj", "down_proj")
_W1_W3_W2 = ("w1", "w3", "w2")


def from_mixtral(block, dtype: torch.dtype = torch.float32) -> HFMoe:
    """``MixtralSparseMoeBlock`` (and ``MiniMaxSparseMoeBlock``, the same block) -> ``HFMoe``.

    Forms: 5.x fused ``MixtralExperts`` (``gate_up_proj`` ``[E, 2I, H]`` rows
    ``[gate; up]``, router ``MixtralTopKRouter``) and 4.x ``ModuleList`` of
    ``MixtralBlockSparseTop2MLP`` (``w1`` gate, ``w3`` up, ``w2`` down; router
    ``nn.Linear``). Routing: softmax over experts, top-k, renormalised.
    Activation: ``hidden_act`` probed (silu for every released Mixtral).
    Router jitter (training only) is not reproduced.
    """
    return _softmax_topk_block(block, dtype, "Mixtral", _W1_W3_W2, renormalize=True)


def from_qwen3_moe(block, dtype: torch.dtype = torch.float32) -> HFMoe:
    """``Qwen3MoeSparseMoeBlock`` (and ``OlmoeSparseMoeBlock``, ``FlexOlmoSparseMoeBlock``, ``MellumSparseMoeBlock``,
    ``Qwen3OmniMoeThinkerTextSparseMoeBlock``: the same block) -> ``HFMoe``.

    Forms: 5.x fused ``Qwen3MoeExperts`` (``gate_up_proj`` ``[E, 2I, H]`` rows
    ``[gate; up]``, router ``Qwen3MoeTopKRouter`` carrying ``top_k`` and
    ``norm_topk_prob``) and 4.x ``ModuleList`` of ``Qwen3MoeMLP``
    (``gate_proj``/``up_proj``/``down_proj``; router ``nn.Linear``, ``top_k``
    and ``norm_topk_prob`` on the block). Routing: softmax over experts, top-k,
    renormalised iff ``norm_topk_prob``. Qwen3-MoE and OLMoE have no shared expert.
    """
    return _softmax_topk_block(block, dtype, _family(block, "Qwen3-MoE"), _GATE_UP_DOWN, renormalize=None)


def from_qwen2_moe(block, dtype: torch.dtype = torch.float32) -> HFMoe:
    """``Qwen2MoeSparseMoeBlock`` (and ``Qwen3NextSparseMoeBlock``, ``Qwen3OmniMoeTalkerTextSparseMoeBlock``,
    ``Qwen4ExpTextSparseMoeBlock``: the same block) -> ``HFMoe`` with ``shared``.

    The routed part is Qwen3-MoE's (softmax, top-k, renormalised iff ``norm_topk_prob``, 5.x fused or
    4.x ``ModuleList``); ``shared`` is ``shared_expert`` (a gated MLP) scaled per token by
    ``sigmoid(shared_expert_gate(x))`` (``SharedExperts.gate``).
    """
    shared = shared_of(block, dtype, "Qwen2-MoE", "shared_expert", gate="shared_expert_gate")
    return _softmax_topk_block(block, dtype, "Qwen2-MoE", _GATE_UP_DOWN, renormalize=None, shared=shared)


def from_qwen3_vl_moe(block, dtype: torch.dtype = torch.float32) -> HFMoe:
    """``Qwen3VLMoeTextSparseMoeBlock`` and ``Qwen3_5MoeSparseMoeBlock`` -> ``HFMoe``.

    As Qwen3-MoE / Qwen2-MoE but the router (no ``norm_topk_prob``) always renormalises the top-k
    softmax weights; ``shared`` is Qwen3.5-MoE's ``shared_expert`` scaled by
    ``sigmoid(shared_expert_gate(x))``, ``None`` for Qwen3-VL-MoE (which has none).
    """
    family = "Qwen3.5-MoE" if hasattr(block, "shared_expert") else "Qwen3-VL-MoE"
    shared = shared_of(block, dtype, family, "shared_expert", gate="shared_expert_gate")
    return _softmax_topk_block(block, dtype, family, _GATE_UP_DOWN, renormalize=True, shared=shared)


def from_jamba(block, dtype: torch.dtype = torch.float32) -> HFMoe:
    """``JambaSparseMoeBlock`` -> ``HFMoe``: ``router`` logits, softmax over experts, top-k, the weights
    *not* renormalised; experts fused (5.x) or per-expert ``gate_proj``/``up_proj``/``down_proj``; no shared."""
    return _softmax_topk_block(block, dtype, "Jamba", _GATE_UP_DOWN, renormalize=False)


def from_lara_mini(block, dtype: torch.dtype = torch.float32) -> HFMoe:
    """``LaraMiniSparseMoeBlock`` -> ``HFMoe``: float32 logits, softmax, top-k, renormalised iff
    ``norm_topk_prob``; ``shared`` is ``shared_expert`` added in full (no gate)."""
    shared = shared_of(block, dtype, "LaraMini", "shared_expert")
    return _softmax_topk_block(
        block, dtype, "LaraMini", _GATE_UP_DOWN, renormalize=None, shared=shared, float32_logits=True
    )


def from_hunyuan_v1_moe(block, dtype: torch.dtype = torch.float32) -> HFMoe:
    """``HunYuanMoEV1Moe`` -> ``HFMoe``: the router ``gate.wg`` (an ``nn.Linear``, float32 in checkpoints:
    the logits follow its dtype), softmax, top-k (``gate.top_k``), renormalised; ``shared`` is
    ``shared_mlp`` added in full."""
    wg = require_attr(require_attr(block, "gate", what="router"), "wg", what="router linear")
    shared = shared_of(block, dtype, "HunYuan-MoE-V1", "shared_mlp")
    return _softmax_topk_block(block, dtype, "HunYuan-MoE-V1", _GATE_UP_DOWN, True, shared=shared, router_module=wg)


def from_aria(block, dtype: torch.dtype = torch.float32) -> HFMoe:
    """``AriaTextMoELayer`` -> ``HFMoe``: top-k of the ``router`` logits, softmax over the k
    (``topk_softmax``); experts ``[E, H, 2I]`` / ``[E, I, H]`` (``is_transposed``), silu; ``shared`` is
    ``shared_experts`` (refused if built with ``mlp_bias``)."""
    return _topk_softmax_block(block, dtype, "Aria", shared_of(block, dtype, "Aria", "shared_experts"), transposed=True)


def from_ernie4_5_moe(block, dtype: torch.dtype = torch.float32) -> HFMoe:
    """``Ernie4_5_MoeSparseMoeBlock`` -> ``HFMoe``.

    Router ``Ernie4_5_MoeTopKRouter``: float32 logits, softmax, the choice on the probabilities plus
    ``moe_statics.e_score_correction_bias`` (``[1, E]``), weights the unbiased probabilities divided by
    ``clamp(sum, min=norm_min)`` (``grouped_topk`` with one group, ``renormalize_min=norm_min``).
    ``shared`` is ``shared_experts`` when ``moe_num_shared_experts > 0`` (refused if ``use_bias``).
    """
    gate = require_attr(block, "gate", what="router")
    bias = getattr(getattr(gate, "moe_statics", None), "e_score_correction_bias", None)
    return one_group_block(
        block,
        dtype,
        "Ernie 4.5 MoE",
        scoring="softmax",
        bias=bias,
        renormalize=True,
        eps=0.0,
        renormalize_min=float(first_attr((gate,), "norm_min", "renormalisation floor")),
        float32_logits=True,
        shared=shared_of(block, dtype, "Ernie 4.5 MoE", "shared_experts"),
    )


def _family(block, default: str) -> str:
    return "OLMoE" if type(block).__name__.startswith("Olmoe") else default


def _softmax_topk_block(
    block, dtype, family: str, names, renormalize: bool | None, shared=None, float32_logits=False, router_module=None
) -> HFMoe:
    """A block routed by softmax over its ``gate`` (or ``router``) linear then top-k, experts gated by
    silu/gelu without biases: ``names`` are the 4.x per-expert (gate, up, down) linears;
    ``renormalize=None`` reads ``norm_topk_prob`` from the router or the block; ``router_module`` is the
    linear of the logits when it is not the router itself (HunYuan's ``gate.wg``)."""
    gate = require_attr(block, "gate", "router", what="router")
    top_k = first_attr((gate, block), "top_k", "experts per token")
    if renormalize is None:
        renormalize = bool(first_attr((gate, block), "norm_topk_prob", "renormalise the top-k weights"))
    return gated_moe(
        block,
        dtype,
        family,
        router_module=gate if router_module is None else router_module,
        top_k=top_k,
        route=routing.SoftmaxTopK(int(top_k), bool(renormalize)),
        names=names,
        float32_logits=float32_logits,
        shared=shared,
    )


def from_granite_moe(block, dtype: torch.dtype = torch.float32, shared_mlp=None) -> HFMoe:
    """``GraniteMoeMoE`` (and the Shared, SWA and Hybrid variants' ``...MoE``) -> ``HFMoe``.

    Form: 5.x fused ``GraniteMoe*Experts`` (``gate_up_proj`` ``[E, 2I, H]`` rows ``[gate; up]``),
    router ``GraniteMoe*TopKRouter`` (``weight``, ``top_k``). Routing: top-k of the logits, softmax over
    the k (``topk_softmax``). GraniteMoeShared's shared MLP lives in the *decoder layer*
    (``layer.shared_mlp``, added to ``layer.block_sparse_moe``'s output), not in the block: pass it as
    ``shared_mlp`` to get ``shared``.
    """
    shared = None if shared_mlp is None else read_shared_mlp(shared_mlp, None, dtype, "GraniteMoeShared")
    return _topk_softmax_block(block, dtype, "GraniteMoe", shared)


def _topk_softmax_block(block, dtype, family: str, shared, transposed: bool = False) -> HFMoe:
    """Top-k of the block's ``router`` logits, softmax over the k (``topk_softmax``; Aria, GraniteMoe)."""
    router_module = require_attr(block, "router", what="router")
    top_k = int(first_attr((router_module, block), "top_k", "experts per token"))
    return gated_moe(
        block,
        dtype,
        family,
        router_module=router_module,
        top_k=top_k,
        route=routing.SoftmaxTopK(int(top_k)),
        transposed=transposed,
        shared=shared,
    )


def from_phimoe(block, dtype: torch.dtype = torch.float32) -> HFMoe:
    """``PhimoeSparseMoeBlock`` -> ``HFMoe``; routing ``sparsemixer`` (top-2, eval form).

    Forms: 5.x fused ``PhimoeExperts`` with router ``PhimoeTopKRouter`` (an ``nn.Linear`` carrying
    ``top_k`` and ``router_jitter_noise``, the SparseMixer threshold) and 4.x ``ModuleList`` of
    ``w1``/``w3``/``w2`` experts with the block's ``gate`` linear. Training-time input jitter and the
    Gumbel sampling of SparseMixer are not reproduced (put the block in ``eval()``).
    """
    router_module = require_attr(block, "router", "gate", what="router")
    top_k = int(first_attr((router_module, block), "top_k", "experts per token"))
    if top_k != 2:
        raise InvalidInputError(f"PhiMoE: sparsemixer routes exactly two experts, top_k is {top_k}")
    eps = float(first_attr((router_module, block), "router_jitter_noise", "SparseMixer threshold"))
    experts = require_attr(block, "experts", what="the routed experts")
    names = _W1_W3_W2 if isinstance(experts, torch.nn.ModuleList) else _GATE_UP_DOWN
    return gated_moe(
        block,
        dtype,
        "PhiMoE",
        router_module=router_module,
        top_k=2,
        route=lambda logits: routing.sparsemixer(logits, eps),
        description=f"sparsemixer(jitter_eps={eps})",
        names=names,
    )


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
        routing.SoftmaxTopK(int(top_k)),
    )
    return build_moe(ex, activation, top_k, router, dtype, "gpt-oss", swiglu_alpha=alpha, swiglu_limit=limit)
