"""``moe_triton``'s fused routers (``TritonFusedOp.router``): softmax top-k or grouped top-k of router logits in
one kernel; softmax top-k with the gate GEMM in that kernel too (``TritonFusedOp.gated_router``).

Why: routed in torch ops, a Qwen3-MoE block at 2048 tokens spends about 16 µs in ``torch.topk`` alone
(a radix select per token) plus the softmax and the id cast — each a launch and a round trip through
memory — for a choice that fits in one row of registers per token (``kernels.route``). DeepSeek's grouped
top-k is a dozen torch ops (sigmoid, bias, group top-2, group top-k, scatter, mask, top-k, gather, sum,
division, scaling, casts): at decode their launches cost more host time than the experts' GEMMs. The gate
GEMM itself (N = E columns: a few dozen CTAs at prefill) is one more launch and a round trip of the logits.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from moe_triton.fast_launch import launch
from moe_triton.kernel_configs import INTERPRETER_SMS, sm_count
from moe_triton.kernels.route import _gate_softmax_topk, _grouped_topk, _softmax_topk
from moe_triton.sizes import cdiv, next_power_of_2
from moe_triton.switches import current_switches

#: the most experts one program's row of registers holds (``BLOCK_E``); above it the layer routes in torch
MAX_EXPERTS = 1024
#: logits one program holds (``BLOCK_M * BLOCK_E``): 32 tokens of 128 experts
TILE_ELEMENTS = 4096
#: the most experts the gated kernel holds (its float32 accumulator and the gate's K tile are ``BLOCK_E`` wide)
MAX_GATE_EXPERTS = 256
#: the gate's K step
GATE_BLOCK_K = 128
#: the gated kernel's row block: the MMA's least, so that the K split's last program sums few partials
GATE_BLOCK_M = 16


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


class GateTiles(NamedTuple):
    """One launch shape of the gated kernel (``gate_tiles``)."""

    block_e: int
    split: int
    num_stages: int


def gate_tiles(m: int, e: int, h: int, sms: int) -> GateTiles:
    """The gated kernel's tiles for ``m`` tokens, ``e`` experts, ``h`` hidden on
    ``sms`` SMs: ``GATE_BLOCK_M``-row blocks over all experts, K split where those blocks are fewer than the
    SMs, into slices of whole K steps, none empty."""
    block_e = max(16, next_power_of_2(e))  # tl.dot needs N >= 16
    split = max(1, min(sms // cdiv(m, GATE_BLOCK_M), cdiv(h, GATE_BLOCK_K)))
    split = cdiv(h, gate_chunk(h, split))  # whole K steps per slice: no slice left empty
    return GateTiles(block_e, split, 3 if block_e <= 128 else 2)


def gate_chunk(h: int, split: int) -> int:
    """The K slice of each of ``split`` programs, whole ``GATE_BLOCK_K`` steps (as the kernel computes it)."""
    return cdiv(cdiv(h, split), GATE_BLOCK_K) * GATE_BLOCK_K


class GatedSoftmaxTopKRouter:
    """``(ids, weights) = router(x [M, H], weight [E, H], bias [E] or None)``: ``SoftmaxTopKRouter`` of
    ``F.linear(x, weight, bias)`` with the gate GEMM in the same kernel (``kernels.route._gate_softmax_topk``)
    up to the ``gate_max_tokens`` switch's tokens, where one launch beats two (results/README.md, "the gate
    GEMM in the routing kernel"); past them, ``F.linear`` and ``SoftmaxTopKRouter``.

    Grid: row blocks of ``GATE_BLOCK_M`` tokens, each over all E experts, with K split so that enough programs
    stream the gate weight. The split's arrival counters (one per row block: at most the SM count) are
    allocated zeroed once per device and left zero by each launch; the partial logits come from the caching
    allocator per call."""

    def __init__(self, top_k: int, renormalize: bool, sigmoid_weight: bool = False) -> None:
        self.top_k = top_k
        self.renormalize = renormalize
        self.sigmoid_weight = sigmoid_weight
        self._k_pow2 = next_power_of_2(top_k)
        self._counters: dict[torch.device, torch.Tensor] = {}
        self._logits_router = SoftmaxTopKRouter(top_k, renormalize, sigmoid_weight)

    def __call__(
        self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        m, h = x.shape
        if m > current_switches().gate_max_tokens:
            return self._logits_router(F.linear(x, weight, bias))
        e = weight.shape[0]
        ids = torch.empty(m, self.top_k, dtype=torch.int32, device=x.device)
        weights = torch.empty(m, self.top_k, dtype=torch.float32, device=x.device)
        if not m:
            return ids, weights
        sms = sm_count(x.device) or INTERPRETER_SMS
        block_e, split, num_stages = gate_tiles(m, e, h, sms)
        row_blocks = cdiv(m, GATE_BLOCK_M)
        if split > 1:
            part = torch.empty(split, row_blocks * GATE_BLOCK_M, block_e, dtype=torch.float32, device=x.device)
            counters = self._counters.get(x.device)
            if counters is None:
                counters = self._counters[x.device] = torch.zeros(sms, dtype=torch.int32, device=x.device)
            strides = part.stride()[:2]
        else:
            part = counters = ids  # not read
            strides = (0, 0)
        launch(_gate_softmax_topk, (row_blocks, split), x, weight, weight if bias is None else bias, ids, weights,
               part, counters, m, e, h, x.stride(0), x.stride(1), weight.stride(0), weight.stride(1), *strides,
               TOP_K=self.top_k, K_POW2=self._k_pow2, RENORMALIZE=self.renormalize, HAS_BIAS=bias is not None,
               SPLIT_K=split, IEEE=x.dtype == torch.float32, BLOCK_M=GATE_BLOCK_M, BLOCK_E=block_e,
               BLOCK_K=GATE_BLOCK_K, SIGMOID_WEIGHT=self.sigmoid_weight,
               num_stages=num_stages)  # fmt: skip
        return ids, weights

    def __repr__(self) -> str:
        if self.sigmoid_weight:
            return "GatedSoftmaxTopKRouter(top_k=1, sigmoid_weight=True)"
        return f"GatedSoftmaxTopKRouter(top_k={self.top_k}, renormalize={self.renormalize})"


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
