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
from moe_core.quant import dequantize_projection
from moe_core.quant.act_quant import activation_fake_quant
from moe_core.validation import UNASSIGNED
from moe_core.weights import MoeWeights


class TorchFusedOp(FusedOp):
    name = "torch"
    a2a_backends = ("none",)
    priority = 0
    quant_schemes: ClassVar[frozenset[str]] = frozenset({"fp32", "bf16", "fp16", "mxfp4", "nvfp4", "fp8_block"})
    activations: ClassVar[frozenset[str]] = frozenset({"silu", "gelu", "swiglu_oai"})
    activation_dtypes = frozenset({torch.float32, torch.bfloat16, torch.float16})
    device_types = frozenset({"cpu", "cuda"})
    supports_bias = True
    supports_router_weight_on_input = True
    handles_invalid_ids = True  # -1 pairs are left out; any other out-of-range id raises (it syncs anyway)
    capturable = False  # the loop over active experts reads their counts on the host

    def prepare(self, weights: MoeWeights) -> MoeWeights:
        # The reference keeps canonical weights as they are; dequantization
        # happens per active expert in apply, so memory stays at the stored size.
        return weights

    def __init__(self, problem) -> None:
        super().__init__(problem)
        # quantize-dequantize of each GEMM input for w8a8 / w4a4 schemes, else identity
        self._act_quant = activation_fake_quant(self.config.quant_scheme) or (lambda t: t)

    def expert_weight(self, w: MoeWeights, projection: str, e: int) -> torch.Tensor:
        """Expert ``e``'s ``w13`` ``[2I, H]`` or ``w2`` ``[H, I]`` in float32."""
        if self.config.scheme.quantized:
            return dequantize_projection(w, self.config.quant_scheme, projection, e)
        return getattr(w, projection)[e].float()

    def apply(self, hidden_states, topk_ids, topk_weights, prepared: MoeWeights, out=None):
        cfg = self.config
        m, h = hidden_states.shape
        k = topk_ids.shape[1]
        flat_ids = topk_ids.reshape(-1).long()
        result = torch.zeros(m, h, dtype=torch.float32, device=hidden_states.device)
        if m > 0:
            lo, hi = (int(v) for v in flat_ids.aminmax())
            if lo < UNASSIGNED or hi >= cfg.num_experts:
                raise InvalidInputError(
                    f"topk_ids must lie in [0, {cfg.num_experts}) or be {UNASSIGNED}, found values in [{lo}, {hi}]"
                )
            # unassigned pairs (-1) sort first and are left out: their slots stay zero
            order = torch.argsort(flat_ids, stable=True)
            counts = torch.bincount(flat_ids + 1, minlength=cfg.num_experts + 1).tolist()
            skipped, counts = counts[0], counts[1:]
            order = order[skipped:]
            token_of = order // k
            x = hidden_states.index_select(0, token_of).float()
            route_w = topk_weights.reshape(-1).index_select(0, order).unsqueeze(1)
            if cfg.apply_router_weight_on_input:
                x = x * route_w
            x = self._act_quant(x)
            active = [(e, n) for e, n in enumerate(counts) if n]
            # first GEMM + activation for every active expert, then the second
            # GEMM's input is quantized as one tensor (schemes with activation
            # quantization use one dynamic scale over the whole GEMM input)
            acts = torch.empty(order.numel(), cfg.intermediate_size, dtype=torch.float32, device=x.device)
            start = 0
            for e, n in active:
                h13 = x[start : start + n] @ self.expert_weight(prepared, "w13", e).T
                if prepared.b13 is not None:
                    h13 = h13 + prepared.b13[e].float()
                acts[start : start + n] = apply_activation(
                    cfg.activation, h13, alpha=cfg.swiglu_alpha, limit=cfg.swiglu_limit
                )
                start += n
            acts = self._act_quant(acts)
            y = torch.empty(order.numel(), h, dtype=torch.float32, device=x.device)
            start = 0
            for e, n in active:
                ye = acts[start : start + n] @ self.expert_weight(prepared, "w2", e).T
                if prepared.b2 is not None:
                    ye = ye + prepared.b2[e].float()
                y[start : start + n] = ye
                start += n
            if not cfg.apply_router_weight_on_input:
                y = y * route_w
            # Back to (token, slot) order, then a fixed-order sum over the k slots:
            # deterministic, unlike an atomic scatter-add.
            unsorted = torch.zeros(m * k, h, dtype=torch.float32, device=x.device)
            unsorted[order] = y
            result = unsorted.view(m, k, h).sum(dim=1)
        if out is None:
            return result.to(cfg.dtype)
        out.copy_(result)
        return out
