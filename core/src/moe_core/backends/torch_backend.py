"""The torch backend: moe-core's numerical reference and CPU/GPU fallback.

Every other backend is judged against this one, so it favours being obviously
right over being fast: weights are taken to float32 (dequantized per active
expert for quantized schemes), every product and sum runs in float32, and the
result is cast to the activation dtype once at the end. Tokens are grouped by
expert with one sort and each *active* expert does one matmul pair — no Python
loop over tokens. The per-expert loop needs the expert counts on the host (one
synchronisation per forward), which is fine for a reference.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from moe_core.activations import apply_activation
from moe_core.errors import InvalidInputError
from moe_core.fused_op import FusedOp
from moe_core.weights import MoeWeights


class TorchFusedOp(FusedOp):
    name = "torch"
    a2a_backends = ("none",)
    priority = 0
    quant_schemes: ClassVar[frozenset[str]] = frozenset({"fp32", "bf16", "fp16"})
    activations: ClassVar[frozenset[str]] = frozenset({"silu", "gelu", "swiglu_oai"})
    activation_dtypes = frozenset({torch.float32, torch.bfloat16, torch.float16})
    device_types = frozenset({"cpu", "cuda"})
    supports_bias = True
    supports_router_weight_on_input = True

    def prepare(self, weights: MoeWeights) -> MoeWeights:
        # The reference keeps canonical weights as they are; dequantization
        # happens per active expert in apply, so memory stays at the stored size.
        return weights

    def expert_weights(self, w: MoeWeights, e: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Expert ``e``'s ``w13`` ``[2I, H]`` and ``w2`` ``[H, I]`` in float32."""
        return w.w13[e].float(), w.w2[e].float()

    def apply(self, hidden_states, topk_ids, topk_weights, prepared: MoeWeights, out=None):
        cfg = self.config
        m, h = hidden_states.shape
        k = topk_ids.shape[1]
        flat_ids = topk_ids.reshape(-1).long()
        result = torch.zeros(m, h, dtype=torch.float32, device=hidden_states.device)
        if m > 0:
            lo, hi = (int(v) for v in flat_ids.aminmax())
            if lo < 0 or hi >= cfg.num_experts:
                raise InvalidInputError(f"topk_ids must lie in [0, {cfg.num_experts}), found values in [{lo}, {hi}]")
            order = torch.argsort(flat_ids, stable=True)
            token_of = order // k
            counts = torch.bincount(flat_ids, minlength=cfg.num_experts).tolist()
            x = hidden_states.index_select(0, token_of).float()
            route_w = topk_weights.reshape(-1).index_select(0, order).unsqueeze(1)
            if cfg.apply_router_weight_on_input:
                x = x * route_w
            y = torch.empty(m * k, h, dtype=torch.float32, device=hidden_states.device)
            start = 0
            for e, n in enumerate(counts):
                if n == 0:
                    continue
                w13, w2 = self.expert_weights(prepared, e)
                h13 = x[start : start + n] @ w13.T
                if prepared.b13 is not None:
                    h13 = h13 + prepared.b13[e].float()
                act = apply_activation(cfg.activation, h13, alpha=cfg.swiglu_alpha, limit=cfg.swiglu_limit)
                ye = act @ w2.T
                if prepared.b2 is not None:
                    ye = ye + prepared.b2[e].float()
                y[start : start + n] = ye
                start += n
            if not cfg.apply_router_weight_on_input:
                y = y * route_w
            # Back to (token, slot) order, then a fixed-order sum over the k slots:
            # deterministic, unlike an atomic scatter-add.
            unsorted = torch.empty_like(y)
            unsorted[order] = y
            result = unsorted.view(m, k, h).sum(dim=1)
        if out is None:
            return result.to(cfg.dtype)
        out.copy_(result)
        return out
