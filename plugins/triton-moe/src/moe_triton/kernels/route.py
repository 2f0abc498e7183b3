"""The router's choice in one kernel: softmax top-k (``moe_core.routing.SoftmaxTopK``; with sigmoid weights,
``SigmoidTop1``) and grouped top-k (``moe_core.routing.GroupedTopK``) of router logits."""

from __future__ import annotations

import triton
import triton.language as tl

from moe_triton.kernels.split import _arrive, _sum_partials

__all__ = ["_gate_softmax_topk", "_grouped_topk", "_softmax_topk"]


@triton.jit
def _first_max(v, cols, BLOCK_E: tl.constexpr, AXIS: tl.constexpr = 1):
    """Along ``AXIS`` of ``v`` (``cols``: its column numbers, broadcast to ``v``): the largest value and the
    lowest column holding it (a NaN row: ``BLOCK_E``). Two reductions, not one of packed int64 keys (value bits
    over the column): at these widths the keys' per-element work costs more than the reduction they save."""
    best = tl.max(v, axis=AXIS)
    return best, tl.min(tl.where(v == tl.expand_dims(best, AXIS), cols, BLOCK_E), axis=AXIS)


@triton.jit
def _softmax_topk(
    logits_ptr, ids_ptr, weights_ptr, M, E, stride_lm, stride_le,
    TOP_K: tl.constexpr, K_POW2: tl.constexpr, RENORMALIZE: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_E: tl.constexpr, SIGMOID_WEIGHT: tl.constexpr = False,
):  # fmt: skip
    """``BLOCK_M`` tokens per program, all ``E`` logits of a token in one row of registers (float32, exact
    from bf16/fp16); the choice as ``_choose_topk`` makes it."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_E)
    src = tl.minimum(rows, M - 1).to(tl.int64)  # rows past M read the last row: no -inf - -inf below
    x = tl.load(logits_ptr + src[:, None] * stride_lm + cols[None, :] * stride_le, mask=cols[None, :] < E,
                other=float("-inf")).to(tl.float32)  # fmt: skip
    _choose_topk(x, rows, rows < M, cols, E, ids_ptr, weights_ptr, TOP_K, K_POW2, RENORMALIZE, SIGMOID_WEIGHT,
                 BLOCK_M, BLOCK_E)  # fmt: skip


@triton.jit
def _gate_softmax_topk(
    x_ptr, w_ptr, b_ptr, ids_ptr, weights_ptr, part_ptr, count_ptr, M, E, H, stride_xm, stride_xk, stride_we,
    stride_wk, stride_ps, stride_pm,
    TOP_K: tl.constexpr, K_POW2: tl.constexpr, RENORMALIZE: tl.constexpr, HAS_BIAS: tl.constexpr,
    SPLIT_K: tl.constexpr, IEEE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_E: tl.constexpr,
    BLOCK_K: tl.constexpr, SIGMOID_WEIGHT: tl.constexpr = False,
):  # fmt: skip
    """The gate GEMM and ``_softmax_topk`` in one launch: logits ``x @ w.T + b`` of ``BLOCK_M`` tokens over
    all ``E`` experts, rounded to ``x``'s dtype as ``F.linear`` rounds them, then the same choice.

    Why one launch: at decode and small batches the gate's own GEMM (N = E) and the choice are two
    launches around a few µs of work. Grid ``(row blocks, SPLIT_K)``: with few row blocks the K dimension is
    split so that more SMs stream the gate weight; each program stores its float32 partial logits (rows
    < M), and the last of a row block's programs to arrive (``kernels.split``: counters zero at launch, reset
    by that program) sums them in split order — the same logits whichever finished last — and chooses."""
    pid_m = tl.program_id(0)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_E)
    col_ok = cols < E
    src = tl.minimum(rows, M - 1).to(tl.int64)  # rows past M read the last row: no -inf - -inf below
    experts = tl.minimum(cols, E - 1).to(tl.int64)  # padding columns read the last expert; masked below
    chunk = tl.cdiv(tl.cdiv(H, SPLIT_K), BLOCK_K) * BLOCK_K
    k_lo = tl.program_id(1) * chunk
    k_hi = tl.minimum(k_lo + chunk, H)
    ks = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_E), dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        k = k0 + ks
        k_ok = k < k_hi
        a = tl.load(x_ptr + src[:, None] * stride_xm + k[None, :] * stride_xk, mask=k_ok[None, :], other=0.0)
        b = tl.load(w_ptr + experts[None, :] * stride_we + k[:, None] * stride_wk, mask=k_ok[:, None], other=0.0)
        if IEEE:
            acc = tl.dot(a, b, acc, input_precision="ieee")
        else:
            acc = tl.dot(a, b, acc)
    if SPLIT_K > 1:  # only rows < M move through memory: at decode most of the block is padding
        part = part_ptr + rows.to(tl.int64)[:, None] * stride_pm + cols[None, :]
        part_ok = (rows < M)[:, None] & (cols[None, :] < BLOCK_E)
        tl.store(part + tl.program_id(1) * stride_ps, acc, mask=part_ok)
        if _arrive(count_ptr + pid_m) < SPLIT_K - 1:
            return
        tl.atomic_xchg(count_ptr + pid_m, 0)  # zero again for the next launch on this buffer
        acc = _sum_partials(part, part_ok, stride_ps, SPLIT_K, BLOCK_M, BLOCK_E)
    if HAS_BIAS:
        acc += tl.load(b_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    logits = acc.to(x_ptr.dtype.element_ty).to(tl.float32)  # F.linear's output dtype
    logits = tl.where(col_ok[None, :], logits, float("-inf"))
    _choose_topk(logits, rows, rows < M, cols, E, ids_ptr, weights_ptr, TOP_K, K_POW2, RENORMALIZE, SIGMOID_WEIGHT,
                 BLOCK_M, BLOCK_E)  # fmt: skip


@triton.jit
def _choose_topk(x, rows, row_ok, cols, E, ids_ptr, weights_ptr, TOP_K: tl.constexpr, K_POW2: tl.constexpr,
                 RENORMALIZE: tl.constexpr, SIGMOID_WEIGHT: tl.constexpr, BLOCK_M: tl.constexpr,
                 BLOCK_E: tl.constexpr):  # fmt: skip
    """Softmax top-k of the float32 logits ``x`` ``[BLOCK_M, BLOCK_E]`` (``-inf`` in the columns past ``E``)
    of the tokens ``rows``. The k experts come out in descending order, each the lowest-numbered of equal
    logits; ``ids`` int32 ``[M, k]`` and ``weights`` float32 ``[M, k]``: ``exp(l_j - max) / sum`` over the k
    chosen (``RENORMALIZE``: the softmax of the k logits) or over all E (the softmax's value at the k); with
    ``SIGMOID_WEIGHT``, ``sigmoid(l_j)`` instead (Llama 4's top-1)."""
    top = tl.max(x, axis=1)
    slots = tl.arange(0, K_POW2)
    ids = tl.zeros([BLOCK_M, K_POW2], tl.int32)
    vals = tl.zeros([BLOCK_M, K_POW2], tl.float32)
    picked = tl.zeros([BLOCK_M, K_POW2], tl.float32)
    left = x
    for j in tl.static_range(TOP_K):
        best, idx = _first_max(left, cols[None, :], BLOCK_E)
        idx = tl.minimum(idx, E - 1)  # a row holding NaN matches no column: the id stays in [0, E) (weights NaN)
        ids = tl.where(slots[None, :] == j, idx[:, None], ids)
        vals = tl.where(slots[None, :] == j, tl.exp(best - top)[:, None], vals)
        picked = tl.where(slots[None, :] == j, best[:, None], picked)  # the chosen logits themselves
        left = tl.where(cols[None, :] == idx[:, None], float("-inf"), left)
    out = rows.to(tl.int64)[:, None] * TOP_K + slots[None, :]
    mask = row_ok[:, None] & (slots[None, :] < TOP_K)
    tl.store(ids_ptr + out, ids, mask=mask)
    if SIGMOID_WEIGHT:
        tl.store(weights_ptr + out, tl.sigmoid(picked), mask=mask)
    else:
        if RENORMALIZE:
            total = tl.sum(vals, axis=1)  # the padding slots hold 0
        else:
            total = tl.sum(tl.exp(x - top[:, None]), axis=1)  # the padding columns: exp(-inf) = 0
        tl.store(weights_ptr + out, vals / total[:, None], mask=mask)


@triton.jit
def _grouped_topk(
    logits_ptr, bias_ptr, ids_ptr, weights_ptr, M, E, stride_lm, stride_le, scale, eps, floor,
    TOP_K: tl.constexpr, K_POW2: tl.constexpr, N_GROUP: tl.constexpr, G_POW2: tl.constexpr,
    TOPK_GROUP: tl.constexpr, PER_GROUP: tl.constexpr, SIGMOID: tl.constexpr, TOP2_SUM: tl.constexpr,
    HAS_BIAS: tl.constexpr, RENORMALIZE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_E: tl.constexpr,
):  # fmt: skip
    """``moe_core.routing.grouped_topk`` for ``BLOCK_M`` tokens per program, all ``E`` logits of a token in one
    row of registers (float32): scores ``s`` (sigmoid, or softmax over E), the choice ``c = s + bias``; with
    groups (``N_GROUP > 1``, ``PER_GROUP`` experts each) a group's score is the sum of its two best ``c``
    (``TOP2_SUM``) or its best, the ``TOPK_GROUP`` best groups are kept and the others' experts leave the
    choice; the k best ``c`` (each the lowest-numbered of equal ones) get weight ``s``, divided by
    ``max(sum + eps, floor)`` (``RENORMALIZE``), times ``scale``."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < M
    cols = tl.arange(0, BLOCK_E)
    col_ok = cols < E
    src = tl.minimum(rows, M - 1).to(tl.int64)  # rows past M read the last row
    x = tl.load(logits_ptr + src[:, None] * stride_lm + cols[None, :] * stride_le, mask=col_ok[None, :],
                other=float("-inf")).to(tl.float32)  # fmt: skip
    if SIGMOID:
        scores = tl.sigmoid(x)  # the padding columns: sigmoid(-inf) = 0
    else:
        row_max = tl.max(x, axis=1)
        ex = tl.exp(x - row_max[:, None])
        row_sum = tl.sum(ex, axis=1)
        scores = ex / row_sum[:, None]
    choice = scores
    if HAS_BIAS:
        choice = choice + tl.load(bias_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    choice = tl.where(col_ok[None, :], choice, float("-inf"))
    if N_GROUP > 1:
        group_of = cols // PER_GROUP  # the padding columns lie past the last group
        slots = tl.arange(0, G_POW2)
        if N_GROUP * PER_GROUP == BLOCK_E and (PER_GROUP & (PER_GROUP - 1)) == 0:
            # the groups tile the row (DeepSeek-V3: 8 x 32): every group's best in one [BLOCK_M, G, P] reduction
            tiles = tl.reshape(choice, [BLOCK_M, N_GROUP, PER_GROUP])
            within = tl.arange(0, PER_GROUP)[None, None, :]
            group_score, at = _first_max(tiles, within, PER_GROUP, 2)
            if TOP2_SUM and PER_GROUP > 1:
                group_score += tl.max(tl.where(within == at[:, :, None], float("-inf"), tiles), axis=2)
        else:
            group_score = tl.full([BLOCK_M, G_POW2], float("-inf"), tl.float32)
            for g in tl.static_range(N_GROUP):
                in_g = tl.where((group_of == g)[None, :], choice, float("-inf"))
                best, at = _first_max(in_g, cols[None, :], BLOCK_E)
                if TOP2_SUM and PER_GROUP > 1:
                    best += tl.max(tl.where(cols[None, :] == at[:, None], float("-inf"), in_g), axis=1)
                group_score = tl.where(slots[None, :] == g, best[:, None], group_score)
        keep = tl.zeros([BLOCK_M, BLOCK_E], tl.int1)
        for _ in tl.static_range(TOPK_GROUP):
            _, g_best = _first_max(group_score, slots[None, :], G_POW2)
            keep = keep | (group_of[None, :] == g_best[:, None])
            group_score = tl.where(slots[None, :] == g_best[:, None], float("-inf"), group_score)
        choice = tl.where(keep, choice, float("-inf"))
    slots_k = tl.arange(0, K_POW2)
    ids = tl.zeros([BLOCK_M, K_POW2], tl.int32)
    for j in tl.static_range(TOP_K):
        _, idx = _first_max(choice, cols[None, :], BLOCK_E)
        idx = tl.minimum(idx, E - 1)  # as in _softmax_topk: the scores below are read at these ids
        ids = tl.where(slots_k[None, :] == j, idx[:, None], ids)
        choice = tl.where(cols[None, :] == idx[:, None], float("-inf"), choice)
    # the chosen experts' scores, recomputed from their logits with the formula above (on CUDA the last bit
    # may differ from a gather of the row's scores): a gather from the register row is one more reduction per slot
    x_k = tl.load(logits_ptr + src[:, None] * stride_lm + ids * stride_le).to(tl.float32)
    if SIGMOID:
        vals = tl.sigmoid(x_k)
    else:
        vals = tl.exp(x_k - row_max[:, None]) / row_sum[:, None]
    vals = tl.where(slots_k[None, :] < TOP_K, vals, 0.0)
    if RENORMALIZE:
        vals = vals / tl.maximum(tl.sum(vals, axis=1) + eps, floor)[:, None]  # the padding slots hold 0
    out = rows.to(tl.int64)[:, None] * TOP_K + slots_k[None, :]
    mask = row_ok[:, None] & (slots_k[None, :] < TOP_K)
    tl.store(ids_ptr + out, ids, mask=mask)
    tl.store(weights_ptr + out, vals * scale, mask=mask)
