"""The router's choice in one kernel: softmax top-k of router logits (``moe_core.routing.SoftmaxTopK``)."""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["_softmax_topk"]


@triton.jit
def _softmax_topk(
    logits_ptr, ids_ptr, weights_ptr, M, E, stride_lm, stride_le,
    TOP_K: tl.constexpr, K_POW2: tl.constexpr, RENORMALIZE: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_E: tl.constexpr,
):  # fmt: skip
    """``BLOCK_M`` tokens per program, all ``E`` logits of a token in one row of registers (float32, exact
    from bf16/fp16). The k experts come out in descending order, each the lowest-numbered of equal logits;
    ``ids`` int32 ``[M, k]`` and ``weights`` float32 ``[M, k]``: ``exp(l_j - max) / sum`` over the k chosen
    (``RENORMALIZE``: the softmax of the k logits) or over all E (the softmax's value at the k)."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < M
    cols = tl.arange(0, BLOCK_E)
    src = tl.minimum(rows, M - 1).to(tl.int64)  # rows past M read the last row: no -inf - -inf below
    x = tl.load(logits_ptr + src[:, None] * stride_lm + cols[None, :] * stride_le, mask=cols[None, :] < E,
                other=float("-inf")).to(tl.float32)  # fmt: skip
    top = tl.max(x, axis=1)
    slots = tl.arange(0, K_POW2)
    ids = tl.zeros([BLOCK_M, K_POW2], tl.int32)
    vals = tl.zeros([BLOCK_M, K_POW2], tl.float32)
    left = x
    for j in tl.static_range(TOP_K):
        best = tl.max(left, axis=1)
        # a row holding NaN matches no column: the id stays inside [0, E) (its weights are NaN)
        idx = tl.minimum(tl.min(tl.where(left == best[:, None], cols[None, :], BLOCK_E), axis=1), E - 1)
        ids = tl.where(slots[None, :] == j, idx[:, None], ids)
        vals = tl.where(slots[None, :] == j, tl.exp(best - top)[:, None], vals)
        left = tl.where(cols[None, :] == idx[:, None], float("-inf"), left)
    if RENORMALIZE:
        total = tl.sum(vals, axis=1)  # the padding slots hold 0
    else:
        total = tl.sum(tl.exp(x - top[:, None]), axis=1)  # the padding columns: exp(-inf) = 0
    out = rows.to(tl.int64)[:, None] * TOP_K + slots[None, :]
    mask = row_ok[:, None] & (slots[None, :] < TOP_K)
    tl.store(ids_ptr + out, ids, mask=mask)
    tl.store(weights_ptr + out, vals / total[:, None], mask=mask)
