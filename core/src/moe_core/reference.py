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
    act_quant=None,
) -> torch.Tensor:
    """Routed-expert output in ``dtype`` from *dequantized* canonical weights.

    ``act_quant`` (see ``moe_core.quant.act_quant``) is applied, in float32 as
    a kernel would, to each GEMM's whole input: all of ``hidden_states`` before
    the first GEMM, all tokens' intermediate activations before the second.
    """

    def gemm_input(t: torch.Tensor) -> torch.Tensor:
        return t if act_quant is None else act_quant(t.float()).to(dtype)

    x = hidden_states.to(dtype)
    if config.apply_router_weight_on_input:  # top_k == 1: one weight per token
        x = x * topk_weights.to(dtype)
    x = gemm_input(x)
    out = torch.zeros(hidden_states.shape, dtype=dtype, device=hidden_states.device)
    hits = []  # (expert, token rows, routing weight, activation)
    for e in range(config.num_experts):
        hit = topk_ids == e  # [M, k]
        rows = hit.any(dim=1)
        if not bool(rows.any()):
            continue
        weight = (topk_weights.to(dtype) * hit).sum(dim=1, keepdim=True)[rows]
        h13 = x[rows] @ w13[e].to(dtype).T
        if b13 is not None:
            h13 = h13 + b13[e].to(dtype)
        act = apply_activation(config.activation, h13, alpha=config.swiglu_alpha, limit=config.swiglu_limit)
        hits.append((e, rows, weight, act))
    if not hits:
        return out
    acts = gemm_input(torch.cat([h[3] for h in hits]))
    offset = 0
    for e, rows, weight, act in hits:
        y = acts[offset : offset + act.shape[0]] @ w2[e].to(dtype).T
        offset += act.shape[0]
        if b2 is not None:
            y = y + b2[e].to(dtype)
        if not config.apply_router_weight_on_input:
            y = y * weight
        out[rows] += y
    return out


def reference_for(config: MoeConfig, weights, hidden_states, topk_ids, topk_weights) -> torch.Tensor:
    """The float64 oracle for a layer in any scheme (weights dequantized first)."""
    from moe_core.quant.act_quant import activation_fake_quant

    if config.scheme.quantized:
        from moe_core.quant import dequantize_weights

        w13, w2 = dequantize_weights(weights, config.quant_scheme)
    else:
        w13, w2 = weights.w13, weights.w2
    return reference_moe(
        config,
        w13,
        w2,
        hidden_states,
        topk_ids,
        topk_weights,
        weights.b13,
        weights.b2,
        act_quant=activation_fake_quant(config.quant_scheme),
    )
