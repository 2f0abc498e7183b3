"""``moe_triton``'s fused routers (``TritonFusedOp.router``): softmax top-k or grouped top-k of router logits in
one kernel.

Why: routed in torch ops, a Qwen3-MoE block at 2048 tokens spends about 16 µs in ``torch.topk`` alone
(a radix select per token) plus the softmax and the id cast — each a launch and a round trip through
memory — for a choice that fits in one row of registers per token (``kernels.route``). DeepSeek's grouped
top-k is a dozen torch ops (sigmoid, bias, group top-2, group top-k, scatter, mask, top-k, gather, sum,
division, scaling, casts): at decode their launches cost more host time than the experts' GEMMs.
"""

from __future__ import annotations

import torch

from moe_triton.fast_launch import launch
from moe_triton.kernels.route import _grouped_topk, _softmax_topk
from moe_triton.sizes import next_power_of_2

#: the most experts one program's row of registers holds (``BLOCK_E``); above it the layer routes in torch
MAX_EXPERTS = 1024
#: logits one program holds (``BLOCK_M * BLOCK_E``): 32 tokens of 128 experts
TILE_ELEMENTS = 4096


class SoftmaxTopKRouter:
    """``(ids int32 [M, k], weights float32 [M, k]) = router(logits [M, E])`` for ``SoftmaxTopK(k, renormalize)``,
    or with ``sigmoid_weight`` for ``SigmoidTop1`` (``k = 1``; the same choice, weight ``sigmoid(logit)``)."""

    def __init__(self, top_k: int, renormalize: bool, sigmoid_weight: bool = False) -> None:
        self.top_k = top_k
        self.renormalize = renormalize
        self.sigmoid_weight = sigmoid_weight
        self._k_pow2 = next_power_of_2(top_k)

    def __call__(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        m, e = logits.shape
        ids = torch.empty(m, self.top_k, dtype=torch.int32, device=logits.device)
        weights = torch.empty(m, self.top_k, dtype=torch.float32, device=logits.device)
        if m:
            block_e = next_power_of_2(e)
            block_m = max(1, min(64, TILE_ELEMENTS // block_e))
            launch(_softmax_topk, (-(-m // block_m),), logits, ids, weights, m, e, logits.stride(0), logits.stride(1),
                   TOP_K=self.top_k, K_POW2=self._k_pow2, RENORMALIZE=self.renormalize, BLOCK_M=block_m,
                   BLOCK_E=block_e, SIGMOID_WEIGHT=self.sigmoid_weight)  # fmt: skip
        return ids, weights

    def __repr__(self) -> str:
        if self.sigmoid_weight:
            return "SoftmaxTopKRouter(top_k=1, sigmoid_weight=True)"
        return f"SoftmaxTopKRouter(top_k={self.top_k}, renormalize={self.renormalize})"


class GroupedTopKRouter:
    """``(ids int32 [M, k], weights float32 [M, k]) = router(logits [M, E])`` for a ``GroupedTopK`` bundle whose
    ``n_group`` divides ``E``; the bundle's ``correction_bias`` is read at each call (cast to float32 on the
    logits' device only where it is not already)."""

    def __init__(self, routing) -> None:
        self.routing = routing
        self._k_pow2 = next_power_of_2(routing.top_k)
        self._g_pow2 = next_power_of_2(routing.n_group)

    def __call__(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        r = self.routing
        m, e = logits.shape
        ids = torch.empty(m, r.top_k, dtype=torch.int32, device=logits.device)
        weights = torch.empty(m, r.top_k, dtype=torch.float32, device=logits.device)
        if m:
            bias = r.correction_bias
            if bias is not None:
                bias = bias.to(device=logits.device, dtype=torch.float32).contiguous()
            block_e = next_power_of_2(e)
            block_m = max(1, min(64, TILE_ELEMENTS // block_e))
            launch(_grouped_topk, (-(-m // block_m),), logits, ids if bias is None else bias, ids, weights, m, e,
                   logits.stride(0), logits.stride(1), float(r.routed_scaling_factor), float(r.renormalize_eps),
                   float(r.renormalize_min), TOP_K=r.top_k, K_POW2=self._k_pow2, N_GROUP=r.n_group,
                   G_POW2=self._g_pow2, TOPK_GROUP=r.topk_group, PER_GROUP=e // r.n_group,
                   SIGMOID=r.scoring == "sigmoid", TOP2_SUM=r.group_scoring == "top2_sum", HAS_BIAS=bias is not None,
                   RENORMALIZE=r.renormalize, BLOCK_M=block_m, BLOCK_E=block_e)  # fmt: skip
        return ids, weights

    def __repr__(self) -> str:
        return f"GroupedTopKRouter({self.routing!r})"
