"""An independent dense oracle for checking backends, the torch one included.

Written differently from the torch backend on purpose (a mask per expert
instead of a sort, float64 instead of float32) so that a bug in one is not
silently shared by the other. Slow and memory-hungry: for tests and
``--verify`` at modest shapes only.
"""

from __future__ import annotations

import torch

from moe_core.activations import apply_activation
from moe_core.config import MoeConfig


def reference_moe(
    config: MoeConfig,
    w13: torch.Tensor,
    w2: torch.Tensor,
    hidden_states: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    b13: torch.Tensor | None = None,
    b2: torch.Tensor | None = None,
    dtype: torch.dtype = torch.float64,
) -> torch.Tensor:
    """Routed-expert output in ``dtype`` from *dequantized* canonical weights."""
    x = hidden_states.to(dtype)
    out = torch.zeros_like(x)
    for e in range(config.num_experts):
        hit = topk_ids == e  # [M, k]
        rows = hit.any(dim=1)
        if not bool(rows.any()):
            continue
        weight = (topk_weights.to(dtype) * hit).sum(dim=1, keepdim=True)[rows]
        xe = x[rows]
        if config.apply_router_weight_on_input:
            xe = xe * weight
        h13 = xe @ w13[e].to(dtype).T
        if b13 is not None:
            h13 = h13 + b13[e].to(dtype)
        act = apply_activation(config.activation, h13, alpha=config.swiglu_alpha, limit=config.swiglu_limit)
        y = act @ w2[e].to(dtype).T
        if b2 is not None:
            y = y + b2[e].to(dtype)
        if not config.apply_router_weight_on_input:
            y = y * weight
        out[rows] += y
    return out


def reference_for(config: MoeConfig, weights, hidden_states, topk_ids, topk_weights) -> torch.Tensor:
    """The float64 oracle for a layer in any scheme (weights dequantized first)."""
    if config.scheme.quantized:
        from moe_core.quant import dequantize_weights

        w13, w2 = dequantize_weights(weights, config.quant_scheme)
    else:
        w13, w2 = weights.w13, weights.w2
    return reference_moe(config, w13, w2, hidden_states, topk_ids, topk_weights, weights.b13, weights.b2)
