"""vLLM's routed top-k -> the explicit top-k moe's runner takes.

vLLM's router hands the method's ``apply`` ``topk_weights`` (already renormalised and scaled by the routed scaling
factor where the model asks) and ``topk_ids`` as *global* expert ids. Under expert parallelism without all-to-all
kernels, the layer's ``expert_map`` (global id -> local id, ``-1`` for another rank's expert) turns them into this
rank's ids, and moe's contract gives ``-1`` zero. moe wants int32 ids and float32 weights, so they are cast (no
copy when they already are).
"""

from __future__ import annotations

import torch


def explicit_topk(layer, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(topk_ids int32 [M, k] local to this rank, topk_weights float32 [M, k])``."""
    expert_map = layer.expert_map
    if expert_map is not None:
        topk_ids = expert_map[topk_ids.long()]
    return topk_ids.to(torch.int32), topk_weights.to(torch.float32)
