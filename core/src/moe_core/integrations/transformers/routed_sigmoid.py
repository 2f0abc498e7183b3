"""Sigmoid routing: Llama 4's top-1 with the weight applied to the expert input (``sigmoid_top1``), and
sigmoid top-k without groups, optionally biased for the choice (MiniMax-M2, Dots3Note vision, Flint,
LFM2-MoE: ``grouped_topk`` with one group)."""

from __future__ import annotations

import torch

from moe_core import routing
from moe_core.errors import InvalidInputError
from moe_core.integrations.transformers.experts import first_attr, gated_moe, require_attr, shared_of
from moe_core.integrations.transformers.routed_grouped import one_group_block
from moe_core.integrations.transformers.router import HFMoe


def from_llama4(block, dtype: torch.dtype = torch.float32) -> HFMoe:
    """``Llama4TextMoe`` -> ``HFMoe`` with ``shared`` and ``config.apply_router_weight_on_input``.

    Form: ``Llama4TextExperts`` (not behind transformers' experts hook) with ``gate_up_proj``
    ``[E, H, 2I]`` columns ``[gate; up]`` and ``down_proj`` ``[E, I, H]``, transposed here; activation
    ``act_fn`` probed. Router ``Llama4Router`` (an ``nn.Linear``, ``top_k``): transformers keeps the
    top-k logits and scales each expert's *input* by their sigmoid (the other experts get 0);
    ``top_k`` must be 1 (every Llama 4; ``MoeConfig`` allows the weight on the input only then).
    ``shared`` is ``shared_expert`` (a gated MLP), added to the routed output.
    """
    router_module = require_attr(block, "router", what="router")
    top_k = int(first_attr((router_module, block), "top_k", "experts per token"))
    if top_k != 1:
        raise InvalidInputError(f"Llama 4: top_k={top_k}; the router weight on the input needs top_k == 1")
    return gated_moe(
        block,
        dtype,
        "Llama 4",
        router_module=router_module,
        top_k=1,
        route=routing.SigmoidTop1(),
        description="sigmoid_top1 (weight on the input)",
        transposed=True,
        shared=shared_of(block, dtype, "Llama 4", "shared_expert"),
        apply_router_weight_on_input=True,
    )


def from_minimax_m2(block, dtype: torch.dtype = torch.float32) -> HFMoe:
    """``MiniMaxM2SparseMoeBlock`` -> ``HFMoe``: sigmoid of the ``gate`` logits, the choice on the scores
    plus the *block's* ``e_score_correction_bias``, weights the unbiased scores renormalised (no epsilon);
    no shared. Training-time jitter is not reproduced."""
    bias = require_attr(block, "e_score_correction_bias", what="correction bias")
    return one_group_block(block, dtype, "MiniMax-M2", bias=bias, renormalize=True, eps=0.0)


def from_dots3_note_vision(block, dtype: torch.dtype = torch.float32) -> HFMoe:
    """``Dots3NoteVisionMoE`` (the vision tower's experts) -> ``HFMoe``: as MiniMax-M2 (the correction bias on
    the block) with float32 logits, renormalised by ``sum + 1e-20``, times the gate's ``router_scaling_factor``."""
    gate = require_attr(block, "gate", what="router")
    return one_group_block(
        block,
        dtype,
        "Dots3Note vision",
        bias=require_attr(block, "e_score_correction_bias", what="correction bias"),
        renormalize=True,
        eps=1e-20,
        scale=float(first_attr((gate, block), "router_scaling_factor", "router scaling factor")),
        float32_logits=True,
    )


def from_flint(block, dtype: torch.dtype = torch.float32) -> HFMoe:
    """``FlintSparseMoeBlock`` -> ``HFMoe``: float32 logits, sigmoid, top-k, renormalised iff
    ``norm_topk_prob`` (no epsilon); ``shared`` is ``shared_expert`` added in full (no gate)."""
    shared = shared_of(block, dtype, "Flint", "shared_expert")
    return one_group_block(block, dtype, "Flint", renormalize=None, eps=0.0, float32_logits=True, shared=shared)


def from_lfm2_moe(block, dtype: torch.dtype = torch.float32) -> HFMoe:
    """``Lfm2MoeSparseMoeBlock`` -> ``HFMoe``: sigmoid of the ``gate`` logits (in the gate's dtype), the
    choice on the scores plus the block's ``expert_bias`` when ``use_expert_bias``, renormalised iff
    ``norm_topk_prob`` by ``sum + 1e-6``, times ``routed_scaling_factor``; no shared."""
    gate = require_attr(block, "gate", what="router")
    scale = float(first_attr((gate, block), "routed_scaling_factor", "routed scaling factor"))
    bias = getattr(block, "expert_bias", None) if getattr(block, "use_expert_bias", False) else None
    return one_group_block(block, dtype, "LFM2-MoE", bias=bias, renormalize=None, eps=1e-6, scale=scale)
