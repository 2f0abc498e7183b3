"""The two grouped GEMMs of the fused MoE forward, with their epilogues fused.

Both walk the block-padded, expert-sorted rows built by ``align``: program
``(pid_m, pid_n)`` computes a BLOCK_M x BLOCK_N tile of one expert. The total
of padded rows in use is ``offsets[E + 1]``; programs past it return at once.
Blocks of the null segment (expert ``E``: the pairs whose id lies outside
``[0, E)``) read no weights: GEMM1 returns at once (GEMM2 never reads their
intermediate rows) and GEMM2 writes zeros to their pairs' output rows, so such a
pair contributes exactly zero, bias and routing weight included — for valid
blocks the only extra work is one scalar compare.

- ``_gemm1``: rows of ``hidden_states`` (gathered by token) times the expert's
  ``w13``; the gate and up tiles of the same output columns are accumulated
  side by side, so the epilogue applies bias, the routing weight (when it
  scales the input) and the gated activation, and writes the intermediate
  ``[rows, I]`` once — no ``[rows, 2I]`` round trip through memory.
  With ``SPLIT_K > 1`` (decode: too few (expert block, N tile) programs to
  fill the GPU) each program covers one K slice and writes fp32 partials
  ``[SPLIT_K, rows, 2I]``; the last program of a tile to finish (an atomic
  arrival counter per tile, ``kernels.split``) sums them in split order and
  runs the epilogue, so GEMM2 always reads the activated intermediate.
- ``_gemm2``: the intermediate times ``w2``; the epilogue adds the bias,
  multiplies by the routing weight and writes each (token, slot) pair to its
  own row of ``[M*k, H]`` (a deterministic place; the k slots are summed by
  ``_sum_slots``) — or straight into the output when k == 1. It splits K the
  same way as GEMM1 (``SPLIT_K``, partials ``[SPLIT_K, rows, H]``).

Weights are read in their prepared format (``moe_triton.layout``) and
dequantized in the main loop: ``SCHEME`` 0 = bf16/fp16/fp32 as stored; 1 =
fp8_block (float8_e4m3fn with a fp32 scale per 128x128 block; the activation
tile is quantized to fp8 per token per 128 columns on the fly, BLOCK_K = 128);
2 = mxfp4 W4A16 in the chunked layout: per 64-wide K chunk one byte tile is
decoded into its low half (K rows 0..31 of the chunk) and high half (32..63)
with bit ops, and two dots consume them — no nibble interleave. ``DECODE_ASM``
(CUDA + bf16) swaps the Triton bit ops for inline PTX doing 4 bytes at a time; ``WHOLE_CHUNK`` joins the
two halves into one 64-deep MMA where the tile takes K in order (``_cat_k``).
With ``TMA`` (schemes 0 and 1) the weight tiles are read through tensor
descriptors instead of pointer tiles (``moe_triton.tma`` says when it applies).
"""

from __future__ import annotations

import triton
import triton.language as tl

from moe_triton.kernels.align import _fill
from moe_triton.kernels.operands import (
    CHUNK,
    FLOAT,
    FP8_BLOCK,
    GELU,
    HALF,
    MXFP4,
    SILU,
    SWIGLU_OAI,
    _activate,
    _col_scale,
    _dense_tile,
    _dense_tile_tma,
    _fragment_order,
    _mxfp4_chunk,
    _pdl_start,
    _quant_fp8_rows,
    _rows_desc,
    _rows_tile,
)
from moe_triton.kernels.split import _arrive, _sum_partials

__all__ = [
    "FLOAT", "FP8_BLOCK", "GELU", "MXFP4", "SILU", "SWIGLU_OAI", "_gemm1", "_gemm2", "_quant_fp8_groups", "_sum_slots",
]  # fmt: skip


@triton.jit
def _tile_ids(pid, num_m, num_n, GROUP_M: tl.constexpr):
    """Grouped launch order: GROUP_M row blocks share each column sweep (L2 reuse)."""
    width = GROUP_M * num_n
    group = pid // width
    first_m = group * GROUP_M
    size_m = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % width) % size_m
    pid_n = (pid % width) // size_m
    return pid_m, pid_n


@triton.jit
def _program_tile(num_m, n_cols, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """This program's (K split, tile, row block, column block): programs run split-major over the
    ``num_m x cdiv(n_cols, BLOCK_N)`` tiles, each split in ``_tile_ids``' grouped order; ``tile`` indexes
    the split-K arrival counters."""
    num_n = tl.cdiv(n_cols, BLOCK_N)
    tiles = num_m * num_n
    pid = tl.program_id(0)
    tile = pid % tiles
    pid_m, pid_n = _tile_ids(tile, num_m, num_n, GROUP_M)
    return pid // tiles, tile, pid_m, pid_n


@triton.jit
def _block_pairs(sorted_ptr, pid_m, num_pairs, BLOCK_M: tl.constexpr, DIRECT: tl.constexpr):
    """The row block's rows of the aligned index, their (token, slot) pairs and which rows hold one (the
    alignment pads each expert's rows with ``num_pairs``). ``DIRECT``: block ``pid_m`` is pair ``pid_m``
    alone, in its first row (the other rows are masked), and its rows index the intermediate by pair."""
    if DIRECT:
        r = tl.arange(0, BLOCK_M)
        rows = pid_m + r * 0
        pair = rows
        row_ok = r == 0
    else:
        rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        pair = tl.load(sorted_ptr + rows)
        row_ok = pair < num_pairs
    return rows, pair, row_ok


@triton.jit
def _few_rows(row_ok, TAIL_M: tl.constexpr):
    """Whether a block's pairs fit in its first ``TAIL_M`` rows (``GemmConfig.tail_m``): the alignment fills
    each segment's rows from its start, so a block's pairs come first and only a segment's last block is
    partly padding."""
    return tl.sum(row_ok.to(tl.int32), axis=0) <= TAIL_M


@triton.jit
def _head_pairs(sorted_ptr, pid_m, num_pairs, BLOCK_M: tl.constexpr, HEAD_M: tl.constexpr):
    """``_block_pairs`` of the first ``HEAD_M`` rows of aligned block ``pid_m`` (a few-row block's tile)."""
    rows = pid_m * BLOCK_M + tl.arange(0, HEAD_M)
    pair = tl.load(sorted_ptr + rows)
    return rows, pair, pair < num_pairs


@triton.jit
def _block_expert(block_expert_ptr, offsets_ptr, pid_m, num_experts, BLOCK_M: tl.constexpr, DIRECT: tl.constexpr):
    """The block's expert (``num_experts``: the null segment), or -1 for an aligned block past the rows in
    use. ``DIRECT``: ``block_expert_ptr`` holds the flat ids and block ``pid_m`` is pair ``pid_m``; an id
    outside ``[0, E)`` is the null segment."""
    if DIRECT:
        e = tl.load(block_expert_ptr + pid_m)
        expert = tl.where((e >= 0) & (e < num_experts), e, num_experts).to(tl.int64)
    else:
        expert = tl.load(block_expert_ptr + pid_m).to(tl.int64)
        expert = tl.where(pid_m * BLOCK_M >= tl.load(offsets_ptr + num_experts + 1), -1, expert)
    return expert


@triton.jit
def _persistent_tiles(offsets_ptr, num_experts, n_cols, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """(row blocks in use, column tiles) of a persistent launch: it walks ``used * num_n`` tiles, so the
    blocks the alignment's upper bound leaves unused cost it nothing."""
    used = tl.cdiv(tl.load(offsets_ptr + num_experts + 1), BLOCK_M)
    return used, tl.cdiv(n_cols, BLOCK_N)


@triton.jit
def _walk_tile(t, used, num_n, block_expert_ptr, sorted_ptr, num_pairs, num_experts, n_cols, BLOCK_M: tl.constexpr,
               BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):  # fmt: skip
    """Tile ``t`` of a persistent walk (``_persistent_tiles``, ``_tile_ids``' grouped order): its row and
    column blocks, expert and whether that has weights (false: the null segment, whose expert is given as 0 so every
    address stays valid; its K loop runs no step and its loads are masked), its rows (``_block_pairs``) and
    columns ``n0 + arange(BLOCK_N)`` with their bound."""
    pid_m, pid_n = _tile_ids(t, used, num_n, GROUP_M)
    e = tl.load(block_expert_ptr + pid_m).to(tl.int64)
    live = e < num_experts
    rows, pair, row_ok = _block_pairs(sorted_ptr, pid_m, num_pairs, BLOCK_M, False)
    n0 = pid_n * BLOCK_N
    n = n0 + tl.arange(0, BLOCK_N)
    return pid_m, pid_n, tl.where(live, e, 0), live, rows, pair, row_ok, n0, n, n < n_cols


@triton.jit
def _k_slice(K, split, SPLIT_K: tl.constexpr, BLOCK_K: tl.constexpr):
    """This program's K range ``[k_lo, k_hi)``: all of K unless split, and whole BLOCK_K tiles, so fp8
    blocks and MXFP4 chunks stay aligned."""
    k_per = tl.cdiv(tl.cdiv(K, SPLIT_K), BLOCK_K) * BLOCK_K
    k_lo = split * k_per
    return k_lo, tl.minimum(K, k_lo + k_per)


@triton.jit
def _fp8_scales1(s_ptr, xs_ptr, expert, n, n_ok, n0, N_HALF, token, row_ok, k, stride_se, stride_sn, stride_sk,
                 stride_xsm, UP_ALIGNED: tl.constexpr, A_FP8: tl.constexpr):  # fmt: skip
    """GEMM1's fp8_block scales of the K block holding column ``k``: the gate and up tiles' weight scales
    and, with ``A_FP8``, the activations' per-row scales (else zeros: GEMM1 quantizes its tile itself).

    With ``PREFETCH`` (the ``fp8_scale_prefetch`` switch) each K step loads the next block's (``k`` clamped
    to K) and uses the ones loaded a step before. Why: Triton stages only loads that feed an MMA operand
    through shared memory; these multiply the MMA's result, so loaded in the step that uses them every
    step waits for them, where loaded a step early the wait overlaps a whole step's work (at the cost of
    registers that hold them across the step)."""
    sg = _col_scale(s_ptr, expert, n, n_ok, n0, k, stride_se, stride_sn, stride_sk, True)
    su = _col_scale(s_ptr, expert, n + N_HALF, n_ok, n0 + N_HALF, k, stride_se, stride_sn, stride_sk, UP_ALIGNED)
    if A_FP8:
        xs = tl.load(xs_ptr + token * stride_xsm + k // 128, mask=row_ok, other=0.0)
    else:
        xs = tl.zeros(row_ok.shape, tl.float32)
    return sg, su, xs


@triton.jit
def _fp8_scales2(s_ptr, as_ptr, expert, n, n_ok, n0, rows, row_ok, k, stride_se, stride_sn, stride_sk, stride_asm,
                 A_FP8: tl.constexpr):  # fmt: skip
    """GEMM2's counterpart of ``_fp8_scales1``: the weight scales and, with ``A_FP8``, the codes' row scales."""
    sb = _col_scale(s_ptr, expert, n, n_ok, n0, k, stride_se, stride_sn, stride_sk, True)
    if A_FP8:
        xs = tl.load(as_ptr + rows.to(tl.int64) * stride_asm + k // 128, mask=row_ok, other=0.0)
    else:
        xs = tl.zeros(row_ok.shape, tl.float32)
    return sb, xs


@triton.jit
def _rows_chunk(ptr, rows, row_ok, kc, K, stride_m, stride_k, STORED_ORDER: tl.constexpr = False):
    """The activations of the MXFP4 chunk at ``kc``: the two HALF-wide tiles its bytes' low and high
    nibbles multiply (k = kc + j and kc + HALF + j); ``STORED_ORDER``: j in the bytes' stored order
    (``moe_triton.layout``), for weight halves decoded as stored — loaded in K order (contiguous, so
    staged like any tile) and permuted in registers."""
    kk = kc + tl.arange(0, HALF)
    lo = _rows_tile(ptr, rows, row_ok, kk, K, stride_m, stride_k)
    hi = _rows_tile(ptr, rows, row_ok, kk + HALF, K, stride_m, stride_k)
    if STORED_ORDER:
        lo, hi = _fragment_order(lo, True), _fragment_order(hi, True)
    return lo, hi


@triton.jit
def _cat_k(lo, hi, N_ROWS: tl.constexpr):
    """A decoded MXFP4 chunk's two K halves (in K order, ``_mxfp4_chunk(..., IN_ORDER=True)``) as one 64-deep
    weight tile, ``lo`` then ``hi``: ``[BLOCK_N, 64]`` from ``[BLOCK_N, 32]`` halves with ``N_ROWS``, else
    ``[64, BLOCK_N]``. Why: two 32-deep MMAs into one accumulator make the second wait for the first
    (Triton leaves only an accumulator's last MMA of a loop step in flight); one 64-deep MMA does not."""
    if N_ROWS:
        t = tl.reshape(tl.permute(tl.join(lo, hi), (0, 2, 1)), (lo.shape[0], 2 * lo.shape[1]))
    else:
        t = tl.reshape(tl.permute(tl.join(lo, hi), (2, 0, 1)), (2 * lo.shape[0], lo.shape[1]))
    return t


@triton.jit
def _mma(a, w, acc, SWAP_AB: tl.constexpr, PRECISION: tl.constexpr):
    """``acc += a @ w`` for a ``[BLOCK_M, K]`` row tile and a ``[K, BLOCK_N]`` weight tile, or with ``SWAP_AB``
    ``acc^T += w @ a^T`` (``w`` given as ``[BLOCK_N, K]``, ``acc`` as ``[BLOCK_N, BLOCK_M]``)."""
    if SWAP_AB:
        out = tl.dot(w, tl.trans(a), acc, input_precision=PRECISION)
    else:
        out = tl.dot(a, w, acc, input_precision=PRECISION)
    return out


@triton.jit
def _scaled_mma(a, a_scale, w, w_scale, acc, SWAP_AB: tl.constexpr):
    """fp8_block: ``acc += (a @ w) * a_scale[:, None] * w_scale[None, :]`` (one scale per row of the codes
    ``a``, one per column of ``w``: the K tile is one 128-wide scale group), or with ``SWAP_AB`` the same
    transposed (``w`` given as ``[BLOCK_N, K]``, ``acc`` as ``[BLOCK_N, BLOCK_M]``), scaled in the same order."""
    if SWAP_AB:
        out = acc + tl.dot(w, tl.trans(a)) * a_scale[None, :] * w_scale[:, None]
    else:
        out = acc + tl.dot(a, w) * a_scale[:, None] * w_scale[None, :]
    return out


@triton.jit
def _gemm1_acc(
    x_ptr, xs_ptr, w_ptr, w_desc, s_ptr, expert, token, row_ok, n, n_ok, n0, k_lo, k_hi, N_HALF, K,
    stride_xm, stride_xk, stride_xsm, stride_we, stride_wn, stride_wk, stride_se, stride_sn, stride_sk,
    SCHEME: tl.constexpr, PRECISION: tl.constexpr, DECODE_ASM: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SWAP_AB: tl.constexpr, A_FP8: tl.constexpr, TMA: tl.constexpr,
    UP_ALIGNED: tl.constexpr, PREFETCH: tl.constexpr,
    WHOLE_CHUNK: tl.constexpr = False,
):  # fmt: skip
    """GEMM1's K loop over ``[k_lo, k_hi)`` for one tile: the fp32 gate and up accumulators ``[BLOCK_M,
    BLOCK_N]`` (transposed back already with ``SWAP_AB``). ``w_desc``: the weight descriptor with ``TMA``
    (built once per program: a persistent program reuses it for every tile), else unused."""
    dot_dtype = x_ptr.dtype.element_ty
    in_order: tl.constexpr = SWAP_AB or BLOCK_M >= 64  # MXFP4 K order of the MMA (_mxfp4_chunk's IN_ORDER)
    whole: tl.constexpr = WHOLE_CHUNK and in_order  # MXFP4: one 64-deep MMA per chunk (_cat_k)
    if SWAP_AB:
        acc_g = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
        acc_u = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if TMA:
        g_row = (expert * 2 * N_HALF + n0).to(tl.int32)
    if SCHEME == FP8_BLOCK and PREFETCH:  # the first K block's scales; each step loads the next one's
        sg_next, su_next, xs_next = _fp8_scales1(s_ptr, xs_ptr, expert, n, n_ok, n0, N_HALF, token, row_ok,
                                                 tl.minimum(k_lo, K - 1), stride_se, stride_sn, stride_sk,
                                                 stride_xsm, UP_ALIGNED, A_FP8)  # fmt: skip
    for k0 in range(k_lo, k_hi, BLOCK_K):
        if SCHEME == MXFP4:
            for c in tl.static_range(BLOCK_K // CHUNK):
                kc = k0 + c * CHUNK
                g_lo, g_hi = _mxfp4_chunk(w_ptr, s_ptr, expert, n, n_ok, kc, K, stride_we, stride_wn, stride_wk,
                                          stride_se, stride_sk, stride_sn, dot_dtype, DECODE_ASM, SWAP_AB,
                                          in_order)  # fmt: skip
                u_lo, u_hi = _mxfp4_chunk(w_ptr, s_ptr, expert, n + N_HALF, n_ok, kc, K, stride_we, stride_wn,
                                          stride_wk, stride_se, stride_sk, stride_sn, dot_dtype, DECODE_ASM,
                                          SWAP_AB, in_order)  # fmt: skip
                if whole:
                    a = _rows_tile(x_ptr, token, row_ok, kc + tl.arange(0, CHUNK), K, stride_xm, stride_xk)
                    acc_g = _mma(a, _cat_k(g_lo, g_hi, SWAP_AB), acc_g, SWAP_AB, PRECISION)
                    acc_u = _mma(a, _cat_k(u_lo, u_hi, SWAP_AB), acc_u, SWAP_AB, PRECISION)
                else:
                    a_lo, a_hi = _rows_chunk(x_ptr, token, row_ok, kc, K, stride_xm, stride_xk, not in_order)
                    acc_g = _mma(a_lo, g_lo, acc_g, SWAP_AB, PRECISION)
                    acc_g = _mma(a_hi, g_hi, acc_g, SWAP_AB, PRECISION)
                    acc_u = _mma(a_lo, u_lo, acc_u, SWAP_AB, PRECISION)
                    acc_u = _mma(a_hi, u_hi, acc_u, SWAP_AB, PRECISION)
        else:
            a = _rows_tile(x_ptr, token, row_ok, k0 + tl.arange(0, BLOCK_K), K, stride_xm, stride_xk)
            if TMA:
                bg = _dense_tile_tma(w_desc, g_row, k0, SWAP_AB)
                bu = _dense_tile_tma(w_desc, g_row + N_HALF, k0, SWAP_AB)
            else:
                bg = _dense_tile(w_ptr, expert, n, n_ok, k0, K, stride_we, stride_wn, stride_wk, BLOCK_K, SWAP_AB)
                bu = _dense_tile(w_ptr, expert, n + N_HALF, n_ok, k0, K, stride_we, stride_wn, stride_wk, BLOCK_K,
                                 SWAP_AB)  # fmt: skip
            if SCHEME == FP8_BLOCK:
                if PREFETCH:
                    sg, su, a_scale = sg_next, su_next, xs_next
                    sg_next, su_next, xs_next = _fp8_scales1(s_ptr, xs_ptr, expert, n, n_ok, n0, N_HALF, token,
                                                             row_ok, tl.minimum(k0 + BLOCK_K, K - 1), stride_se,
                                                             stride_sn, stride_sk, stride_xsm, UP_ALIGNED,
                                                             A_FP8)  # fmt: skip
                else:
                    sg, su, a_scale = _fp8_scales1(s_ptr, xs_ptr, expert, n, n_ok, n0, N_HALF, token, row_ok, k0,
                                                   stride_se, stride_sn, stride_sk, stride_xsm, UP_ALIGNED,
                                                   A_FP8)  # fmt: skip
                if A_FP8:  # BLOCK_K == 128: one scale per row for this tile
                    aq = a
                else:
                    aq, a_scale = _quant_fp8_rows(a)
                acc_g = _scaled_mma(aq, a_scale, bg, sg, acc_g, SWAP_AB)
                acc_u = _scaled_mma(aq, a_scale, bu, su, acc_u, SWAP_AB)
            else:
                acc_g = _mma(a, bg, acc_g, SWAP_AB, PRECISION)
                acc_u = _mma(a, bu, acc_u, SWAP_AB, PRECISION)
    if SWAP_AB:
        acc_g = tl.trans(acc_g)
        acc_u = tl.trans(acc_u)
    return acc_g, acc_u


@triton.jit
def _gemm1_epilogue(
    acc_g, acc_u, expert, rows, pair, row_ok, n, n_ok, pid_n, N_HALF, alpha, limit, mult_ptr, bias_ptr, topk_w_ptr,
    out_ptr, os_ptr, stride_be, stride_bn, stride_om, stride_on, stride_osm, SCHEME: tl.constexpr,
    ACTIVATION: tl.constexpr, HAS_BIAS: tl.constexpr, ROUTER_ON_INPUT: tl.constexpr, OUT_FP8: tl.constexpr,
    ROUND: tl.constexpr, TMA: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """GEMM1's epilogue of one tile: the MXFP4 multiplier, routing weight (on the input), bias and gated
    activation, stored in the rows of ``row_ok`` (as the intermediate, or its fp8 codes and scales)."""
    out_mask = row_ok[:, None] & n_ok[None, :]
    if SCHEME == MXFP4:  # undo the per-expert shift of the folded scales (1.0 for ordinary weights)
        mult = tl.load(mult_ptr + expert)
        acc_g = acc_g * mult
        acc_u = acc_u * mult
    if ROUTER_ON_INPUT:
        w = tl.load(topk_w_ptr + pair, mask=row_ok, other=0.0)
        acc_g = acc_g * w[:, None]
        acc_u = acc_u * w[:, None]
    if HAS_BIAS:
        bias = bias_ptr + expert * stride_be
        acc_g += tl.load(bias + n * stride_bn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
        acc_u += tl.load(bias + (n + N_HALF) * stride_bn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    h = _activate(acc_g, acc_u, alpha, limit, ACTIVATION)
    out = out_ptr + rows.to(tl.int64)[:, None] * stride_om + n[None, :] * stride_on
    if OUT_FP8:  # masked columns hold act(0, 0) = 0 and leave their group's amax alone
        if TMA:  # their weights were not read as zeros
            h = tl.where(n_ok[None, :], h, 0.0)
        codes, scale = _quant_fp8_rows(tl.reshape(h.to(ROUND), (BLOCK_M, BLOCK_N // 128, 128)))
        tl.store(out, tl.reshape(codes, (BLOCK_M, BLOCK_N)), mask=out_mask)
        g = pid_n * (BLOCK_N // 128) + tl.arange(0, BLOCK_N // 128)
        tl.store(os_ptr + rows.to(tl.int64)[:, None] * stride_osm + g[None, :], scale,
                 mask=row_ok[:, None] & (g * 128 < N_HALF)[None, :])  # fmt: skip
    else:
        tl.store(out, h.to(out_ptr.dtype.element_ty), mask=out_mask)


@triton.jit
def _gemm1_tile(
    x_ptr, xs_ptr, w_ptr, w_desc, s_ptr, mult_ptr, bias_ptr, topk_w_ptr, out_ptr, os_ptr, expert, live, rows, pair,
    row_ok, n0, n, n_ok, pid_n, N_HALF, K, alpha, limit, stride_xm, stride_xk, stride_xsm, stride_we, stride_wn,
    stride_wk, stride_se, stride_sn, stride_sk, stride_be, stride_bn, stride_om, stride_on, stride_osm,
    TOP_K: tl.constexpr, SCHEME: tl.constexpr, ACTIVATION: tl.constexpr, HAS_BIAS: tl.constexpr,
    ROUTER_ON_INPUT: tl.constexpr, PRECISION: tl.constexpr, DECODE_ASM: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SWAP_AB: tl.constexpr, A_FP8: tl.constexpr, OUT_FP8: tl.constexpr,
    ROUND: tl.constexpr, TMA: tl.constexpr, UP_ALIGNED: tl.constexpr, PREFETCH: tl.constexpr,
    WHOLE_CHUNK: tl.constexpr = False,
):  # fmt: skip
    """One tile of a persistent GEMM1 walk over ``BLOCK_M`` rows: K loop and epilogue (``live`` false, the
    null segment: no K step, nothing stored)."""
    row_ok = tl.where(live, row_ok, False)
    token = (pair // TOP_K).to(tl.int64)
    acc_g, acc_u = _gemm1_acc(x_ptr, xs_ptr, w_ptr, w_desc, s_ptr, expert, token, row_ok, n, n_ok, n0, 0,
                              tl.where(live, K, 0), N_HALF, K, stride_xm, stride_xk, stride_xsm, stride_we, stride_wn,
                              stride_wk, stride_se, stride_sn, stride_sk, SCHEME, PRECISION, DECODE_ASM, BLOCK_M,
                              BLOCK_N, BLOCK_K, SWAP_AB, A_FP8, TMA, UP_ALIGNED, PREFETCH, WHOLE_CHUNK)  # fmt: skip
    _gemm1_epilogue(acc_g, acc_u, expert, rows, pair, row_ok, n, n_ok, pid_n, N_HALF, alpha, limit, mult_ptr, bias_ptr,
                    topk_w_ptr, out_ptr, os_ptr, stride_be, stride_bn, stride_om, stride_on, stride_osm, SCHEME,
                    ACTIVATION, HAS_BIAS, ROUTER_ON_INPUT, OUT_FP8, ROUND, TMA, BLOCK_M, BLOCK_N)  # fmt: skip


@triton.jit
def _gemm1(
    x_ptr, xs_ptr, w_ptr, s_ptr, mult_ptr, bias_ptr, topk_w_ptr, sorted_ptr, block_expert_ptr, offsets_ptr, out_ptr,
    os_ptr, part_ptr, count_ptr, zero_ptr, num_zero, num_pairs, num_m, N_HALF, K, num_experts, alpha, limit,
    stride_xm, stride_xk, stride_xsm, stride_we, stride_wn, stride_wk, stride_se, stride_sn, stride_sk,
    stride_be, stride_bn, stride_om, stride_on, stride_osm, stride_ps, stride_pm, stride_pn,
    TOP_K: tl.constexpr, SCHEME: tl.constexpr, ACTIVATION: tl.constexpr, HAS_BIAS: tl.constexpr,
    ROUTER_ON_INPUT: tl.constexpr, PRECISION: tl.constexpr, SPLIT_K: tl.constexpr, DECODE_ASM: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    SWAP_AB: tl.constexpr = False, A_FP8: tl.constexpr = False, OUT_FP8: tl.constexpr = False,
    ROUND: tl.constexpr = tl.bfloat16, DIRECT: tl.constexpr = False, PDL: tl.constexpr = False,
    TMA: tl.constexpr = False, UP_ALIGNED: tl.constexpr = False, PREFETCH: tl.constexpr = False,
    PERSISTENT: tl.constexpr = False, TAIL_M: tl.constexpr = 0, TAIL_SWAP: tl.constexpr = False,
    WHOLE_CHUNK: tl.constexpr = False,
):  # fmt: skip
    """GEMM1. MXFP4 scale strides are (expert, chunk, n) of the prepared ``[E, Kp/64, N]`` scale pairs.

    ``SPLIT_K > 1``: ``part_ptr`` is the fp32 workspace ``[SPLIT_K, rows, 2I]`` and ``count_ptr`` one int32
    arrival counter per (row block, N tile), zero at launch; see ``kernels.split``.

    ``A_FP8`` (fp8_block): ``x`` is already quantized (``_quant_fp8_groups``: e4m3 codes, ``xs`` one fp32
    scale per row and 128 columns), so the K loop loads codes instead of quantizing the tile in every
    N-tile program; the same codes and scales, so the same result.

    ``OUT_FP8`` (fp8_block, BLOCK_N a multiple of 128): the epilogue quantizes GEMM2's input — the
    activated tile rounded to ``ROUND`` (the activations' dtype, what an unquantized intermediate would
    hold), then e4m3 codes into ``out`` and one fp32 scale per row and 128 columns into ``os``
    ``[rows, ceil(I/128)]`` — so GEMM2 reads codes instead of quantizing its K tile in every N-tile
    program; ``_quant_fp8_rows`` on each 128-column group, as GEMM2's loop would run it.

    ``SWAP_AB``: accumulate the transposed tile ``[BLOCK_N, BLOCK_M]`` = weights x rows^T, transposed
    back once before the epilogue (see ``kernel_configs.GemmConfig.swap_ab``); weight tiles are then
    loaded ``[BLOCK_N, K]``, as stored.

    ``DIRECT`` (decode, no alignment ran): ``block_expert_ptr`` holds the flat expert ids and program
    row block ``pid_m`` is pair ``pid_m`` (``_block_pairs``); the intermediate has one row per pair.
    Program 0 zeroes ``zero_ptr[:num_zero]`` (GEMM2's counters), the alignment's job on the aligned path.

    ``TMA`` (float and fp8_block weights, K-contiguous experts stored back to back): the weight tiles
    come through a tensor descriptor over ``[E * 2I, K]`` (``_dense_tile_tma``).

    ``UP_ALIGNED`` (fp8_block): I is a multiple of BLOCK_N, so each up-half tile of at most 128 rows lies
    in one 128-row scale block as every gate tile does, and both read their scales as scalars
    (``_col_scale``).

    ``PERSISTENT`` (aligned routing, unsplit; ``GemmConfig.persistent``): the launch has fewer programs
    than tiles and each walks the tiles in use ``pid, pid + programs, ...`` (``_persistent_tiles``).

    ``TAIL_M`` (with ``PERSISTENT``; 0 = off): a block whose pairs fit in its first ``TAIL_M`` rows — a
    segment's last, mostly padding — runs a ``TAIL_M``-row tile (operands swapped with ``TAIL_SWAP``) on
    the same weight tiles, so its MMAs and row loads shrink with it (``GemmConfig.tail_m``).
    """
    _pdl_start(PDL)
    if PERSISTENT:
        w_desc = _weight_desc(w_ptr, num_experts * 2 * N_HALF, K, stride_wn, BLOCK_N, BLOCK_K, TMA)
        used, num_n = _persistent_tiles(offsets_ptr, num_experts, N_HALF, BLOCK_M, BLOCK_N)
        for t in tl.range(tl.program_id(0), used * num_n, tl.num_programs(0)):
            pid_m, pid_n, expert, live, rows, pair, row_ok, n0, n, n_ok = _walk_tile(
                t, used, num_n, block_expert_ptr, sorted_ptr, num_pairs, num_experts, N_HALF, BLOCK_M, BLOCK_N, GROUP_M
            )
            if TAIL_M > 0:
                if _few_rows(row_ok, TAIL_M):
                    rows_t, pair_t, row_ok_t = _head_pairs(sorted_ptr, pid_m, num_pairs, BLOCK_M, TAIL_M)
                    _gemm1_tile(x_ptr, xs_ptr, w_ptr, w_desc, s_ptr, mult_ptr, bias_ptr, topk_w_ptr, out_ptr, os_ptr,
                                expert, live, rows_t, pair_t, row_ok_t, n0, n, n_ok, pid_n, N_HALF, K, alpha, limit,
                                stride_xm, stride_xk, stride_xsm, stride_we, stride_wn, stride_wk, stride_se,
                                stride_sn, stride_sk, stride_be, stride_bn, stride_om, stride_on, stride_osm, TOP_K,
                                SCHEME, ACTIVATION, HAS_BIAS, ROUTER_ON_INPUT, PRECISION, DECODE_ASM, TAIL_M,
                                BLOCK_N, BLOCK_K, TAIL_SWAP, A_FP8, OUT_FP8, ROUND, TMA, UP_ALIGNED,
                                PREFETCH, WHOLE_CHUNK)  # fmt: skip
                else:
                    _gemm1_tile(x_ptr, xs_ptr, w_ptr, w_desc, s_ptr, mult_ptr, bias_ptr, topk_w_ptr, out_ptr, os_ptr,
                                expert, live, rows, pair, row_ok, n0, n, n_ok, pid_n, N_HALF, K, alpha, limit,
                                stride_xm, stride_xk, stride_xsm, stride_we, stride_wn, stride_wk, stride_se,
                                stride_sn, stride_sk, stride_be, stride_bn, stride_om, stride_on, stride_osm, TOP_K,
                                SCHEME, ACTIVATION, HAS_BIAS, ROUTER_ON_INPUT, PRECISION, DECODE_ASM, BLOCK_M,
                                BLOCK_N, BLOCK_K, SWAP_AB, A_FP8, OUT_FP8, ROUND, TMA, UP_ALIGNED,
                                PREFETCH, WHOLE_CHUNK)  # fmt: skip
            else:
                _gemm1_tile(x_ptr, xs_ptr, w_ptr, w_desc, s_ptr, mult_ptr, bias_ptr, topk_w_ptr, out_ptr, os_ptr,
                            expert, live, rows, pair, row_ok, n0, n, n_ok, pid_n, N_HALF, K, alpha, limit, stride_xm,
                            stride_xk, stride_xsm, stride_we, stride_wn, stride_wk, stride_se, stride_sn, stride_sk,
                            stride_be, stride_bn, stride_om, stride_on, stride_osm, TOP_K, SCHEME, ACTIVATION,
                            HAS_BIAS, ROUTER_ON_INPUT, PRECISION, DECODE_ASM, BLOCK_M, BLOCK_N, BLOCK_K, SWAP_AB,
                            A_FP8, OUT_FP8, ROUND, TMA, UP_ALIGNED, PREFETCH, WHOLE_CHUNK)  # fmt: skip
    else:
        if DIRECT:
            if tl.program_id(0) == 0:
                _fill(zero_ptr, 0, num_zero, 0, 1024)
        split, tile, pid_m, pid_n = _program_tile(num_m, N_HALF, BLOCK_N, GROUP_M)
        expert = _block_expert(block_expert_ptr, offsets_ptr, pid_m, num_experts, BLOCK_M, DIRECT)
        if expert < 0:  # past the rows in use
            return
        if expert == num_experts:  # null segment: its pairs are zeroed by GEMM2, which never reads these rows
            return
        rows, pair, row_ok = _block_pairs(sorted_ptr, pid_m, num_pairs, BLOCK_M, DIRECT)
        token = (pair // TOP_K).to(tl.int64)
        n0 = pid_n * BLOCK_N
        n = n0 + tl.arange(0, BLOCK_N)
        n_ok = n < N_HALF
        k_lo, k_hi = _k_slice(K, split, SPLIT_K, BLOCK_K)
        w_desc = _weight_desc(w_ptr, num_experts * 2 * N_HALF, K, stride_wn, BLOCK_N, BLOCK_K, TMA)
        acc_g, acc_u = _gemm1_acc(x_ptr, xs_ptr, w_ptr, w_desc, s_ptr, expert, token, row_ok, n, n_ok, n0, k_lo,
                                  k_hi, N_HALF, K, stride_xm, stride_xk, stride_xsm, stride_we, stride_wn, stride_wk,
                                  stride_se, stride_sn, stride_sk, SCHEME, PRECISION, DECODE_ASM, BLOCK_M, BLOCK_N,
                                  BLOCK_K, SWAP_AB, A_FP8, TMA, UP_ALIGNED, PREFETCH, WHOLE_CHUNK)  # fmt: skip
        if SPLIT_K > 1:  # store this K slice's partials; the tile's last program to arrive goes on with their sum
            out_mask = row_ok[:, None] & n_ok[None, :]
            part = part_ptr + rows.to(tl.int64)[:, None] * stride_pm
            part_g = part + n[None, :] * stride_pn
            part_u = part + (n + N_HALF)[None, :] * stride_pn
            tl.store(part_g + split * stride_ps, acc_g, mask=out_mask)
            tl.store(part_u + split * stride_ps, acc_u, mask=out_mask)
            counter = count_ptr + tile
            if _arrive(counter) < SPLIT_K - 1:
                return
            tl.atomic_xchg(counter, 0)
            acc_g = _sum_partials(part_g, out_mask, stride_ps, SPLIT_K, BLOCK_M, BLOCK_N)
            acc_u = _sum_partials(part_u, out_mask, stride_ps, SPLIT_K, BLOCK_M, BLOCK_N)
        _gemm1_epilogue(acc_g, acc_u, expert, rows, pair, row_ok, n, n_ok, pid_n, N_HALF, alpha, limit, mult_ptr,
                        bias_ptr, topk_w_ptr, out_ptr, os_ptr, stride_be, stride_bn, stride_om, stride_on, stride_osm,
                        SCHEME, ACTIVATION, HAS_BIAS, ROUTER_ON_INPUT, OUT_FP8, ROUND, TMA, BLOCK_M,
                        BLOCK_N)  # fmt: skip


@triton.jit
def _out_tile(out_ptr, pair, n, stride_om, stride_on, TOP_K: tl.constexpr, OUT_BY_TOKEN: tl.constexpr):
    """GEMM2's output pointers of a tile: each pair's own row of ``[M*k, N]``, or its token's row of
    ``[M, N]`` when ``OUT_BY_TOKEN`` (k == 1)."""
    dest = pair // TOP_K if OUT_BY_TOKEN else pair
    return out_ptr + dest.to(tl.int64)[:, None] * stride_om + n[None, :] * stride_on


@triton.jit
def _gemm2_acc(
    a_ptr, as_ptr, a_desc, w_ptr, w_desc, s_ptr, expert, pid_m, rows, row_ok, n, n_ok, n0, k_lo, k_hi, N, K,
    stride_am, stride_ak, stride_asm, stride_we, stride_wn, stride_wk, stride_se, stride_sn, stride_sk,
    SCHEME: tl.constexpr, PRECISION: tl.constexpr, DECODE_ASM: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SWAP_AB: tl.constexpr, A_FP8: tl.constexpr, TMA: tl.constexpr,
    TMA_A: tl.constexpr, PREFETCH: tl.constexpr,
    WHOLE_CHUNK: tl.constexpr = False,
):  # fmt: skip
    """GEMM2's K loop over ``[k_lo, k_hi)`` for one tile: the fp32 accumulator ``[BLOCK_M, BLOCK_N]``.
    ``w_desc`` / ``a_desc``: the descriptors with ``TMA`` / ``TMA_A`` (else unused)."""
    dot_dtype = a_ptr.dtype.element_ty  # MXFP4: the intermediate's dtype, which its weights decode to
    in_order: tl.constexpr = SWAP_AB or BLOCK_M >= 64  # MXFP4 K order of the MMA (_mxfp4_chunk's IN_ORDER)
    whole: tl.constexpr = WHOLE_CHUNK and in_order  # MXFP4: one 64-deep MMA per chunk (_cat_k)
    if SWAP_AB:
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if TMA:
        w_row = (expert * N + n0).to(tl.int32)
    if SCHEME == FP8_BLOCK and PREFETCH:  # as in _gemm1: each step loads the next K block's scales
        sb_next, as_next = _fp8_scales2(s_ptr, as_ptr, expert, n, n_ok, n0, rows, row_ok, tl.minimum(k_lo, K - 1),
                                        stride_se, stride_sn, stride_sk, stride_asm, A_FP8)  # fmt: skip
    for k0 in range(k_lo, k_hi, BLOCK_K):
        if SCHEME == MXFP4:
            for c in tl.static_range(BLOCK_K // CHUNK):
                kc = k0 + c * CHUNK
                b_lo, b_hi = _mxfp4_chunk(w_ptr, s_ptr, expert, n, n_ok, kc, K, stride_we, stride_wn, stride_wk,
                                          stride_se, stride_sk, stride_sn, dot_dtype, DECODE_ASM, SWAP_AB,
                                          in_order)  # fmt: skip
                if whole:
                    a = _rows_tile(a_ptr, rows, row_ok, kc + tl.arange(0, CHUNK), K, stride_am, stride_ak)
                    acc = _mma(a, _cat_k(b_lo, b_hi, SWAP_AB), acc, SWAP_AB, PRECISION)
                else:
                    a_lo, a_hi = _rows_chunk(a_ptr, rows, row_ok, kc, K, stride_am, stride_ak, not in_order)
                    acc = _mma(a_lo, b_lo, acc, SWAP_AB, PRECISION)
                    acc = _mma(a_hi, b_hi, acc, SWAP_AB, PRECISION)
        else:
            if TMA_A:
                a = a_desc.load([pid_m * BLOCK_M, k0])
            else:
                a = _rows_tile(a_ptr, rows, row_ok, k0 + tl.arange(0, BLOCK_K), K, stride_am, stride_ak)
            if TMA:
                b = _dense_tile_tma(w_desc, w_row, k0, SWAP_AB)
            else:
                b = _dense_tile(w_ptr, expert, n, n_ok, k0, K, stride_we, stride_wn, stride_wk, BLOCK_K, SWAP_AB)
            if SCHEME == FP8_BLOCK:
                if PREFETCH:
                    sb, a_scale = sb_next, as_next
                    sb_next, as_next = _fp8_scales2(s_ptr, as_ptr, expert, n, n_ok, n0, rows, row_ok,
                                                    tl.minimum(k0 + BLOCK_K, K - 1), stride_se, stride_sn, stride_sk,
                                                    stride_asm, A_FP8)  # fmt: skip
                else:
                    sb, a_scale = _fp8_scales2(s_ptr, as_ptr, expert, n, n_ok, n0, rows, row_ok, k0, stride_se,
                                               stride_sn, stride_sk, stride_asm, A_FP8)  # fmt: skip
                if A_FP8:  # BLOCK_K == 128: one scale per row for this tile
                    aq = a
                else:
                    aq, a_scale = _quant_fp8_rows(a)
                acc = _scaled_mma(aq, a_scale, b, sb, acc, SWAP_AB)
            else:
                acc = _mma(a, b, acc, SWAP_AB, PRECISION)
    if SWAP_AB:
        acc = tl.trans(acc)
    return acc


@triton.jit
def _weight_desc(w_ptr, rows, K, stride_wn, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, TMA: tl.constexpr):
    """The descriptor over all experts' weights ``[rows, K]`` where ``TMA`` asks for one (else the plain
    pointer, unused): built once per program."""
    if TMA:
        desc = _rows_desc(w_ptr, rows, K, stride_wn, BLOCK_N, BLOCK_K)
    else:
        desc = w_ptr
    return desc


@triton.jit
def _gemm2_descs(a_ptr, w_ptr, num_m, N, K, num_experts, stride_am, stride_wn, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, TMA: tl.constexpr, TMA_A: tl.constexpr):  # fmt: skip
    """GEMM2's (weight, intermediate) descriptors where ``TMA`` / ``TMA_A`` ask for them (else the plain
    pointers, unused): built once per program."""
    w_desc = _weight_desc(w_ptr, num_experts * N, K, stride_wn, BLOCK_N, BLOCK_K, TMA)
    if TMA_A:
        a_desc = _rows_desc(a_ptr, num_m * BLOCK_M, K, stride_am, BLOCK_M, BLOCK_K)
    else:
        a_desc = a_ptr
    return w_desc, a_desc


@triton.jit
def _gemm2_epilogue(
    acc, expert, live, pair, row_ok, n, n_ok, mult_ptr, bias_ptr, topk_w_ptr, out_ptr, stride_be, stride_bn,
    stride_om, stride_on, TOP_K: tl.constexpr, SCHEME: tl.constexpr, HAS_BIAS: tl.constexpr,
    ROUTER_ON_INPUT: tl.constexpr, OUT_BY_TOKEN: tl.constexpr,
):  # fmt: skip
    """GEMM2's epilogue of one tile: the MXFP4 multiplier, bias and routing weight, each pair's row stored.
    ``live`` false (the null segment, ``acc`` zero): no bias, and its rows stored only when
    ``OUT_BY_TOKEN`` (k == 1: the token's output row is this pair's alone, so it gets zeros)."""
    if SCHEME == MXFP4:
        acc = acc * tl.load(mult_ptr + expert)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + expert * stride_be + n * stride_bn, mask=tl.where(live, n_ok, False),
                       other=0.0).to(tl.float32)[None, :]  # fmt: skip
    if not ROUTER_ON_INPUT:
        acc = acc * tl.load(topk_w_ptr + pair, mask=row_ok, other=0.0)[:, None]
    if OUT_BY_TOKEN:
        store_ok = row_ok
    else:
        store_ok = tl.where(live, row_ok, False)
    tl.store(_out_tile(out_ptr, pair, n, stride_om, stride_on, TOP_K, OUT_BY_TOKEN), acc.to(out_ptr.dtype.element_ty),
             mask=store_ok[:, None] & n_ok[None, :])  # fmt: skip


@triton.jit
def _gemm2_tile(
    a_ptr, as_ptr, a_desc, w_ptr, w_desc, s_ptr, mult_ptr, bias_ptr, topk_w_ptr, out_ptr, expert, live, pid_m, rows,
    pair, row_ok, n0, n, n_ok, N, K, stride_am, stride_ak, stride_asm, stride_we, stride_wn, stride_wk, stride_se,
    stride_sn, stride_sk, stride_be, stride_bn, stride_om, stride_on, TOP_K: tl.constexpr, SCHEME: tl.constexpr,
    HAS_BIAS: tl.constexpr, ROUTER_ON_INPUT: tl.constexpr, OUT_BY_TOKEN: tl.constexpr, PRECISION: tl.constexpr,
    DECODE_ASM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    SWAP_AB: tl.constexpr, A_FP8: tl.constexpr, TMA: tl.constexpr, TMA_A: tl.constexpr, PREFETCH: tl.constexpr,
    WHOLE_CHUNK: tl.constexpr = False,
):  # fmt: skip
    """One tile of a persistent GEMM2 walk over ``BLOCK_M`` rows: K loop and epilogue (``live`` false, the
    null segment: no K step, zeros stored only by token)."""
    acc = _gemm2_acc(a_ptr, as_ptr, a_desc, w_ptr, w_desc, s_ptr, expert, pid_m, rows, row_ok, n, n_ok, n0, 0,
                     tl.where(live, K, 0), N, K, stride_am, stride_ak, stride_asm, stride_we, stride_wn, stride_wk,
                     stride_se, stride_sn, stride_sk, SCHEME, PRECISION, DECODE_ASM, BLOCK_M, BLOCK_N, BLOCK_K,
                     SWAP_AB, A_FP8, TMA, TMA_A, PREFETCH, WHOLE_CHUNK)  # fmt: skip
    _gemm2_epilogue(acc, expert, live, pair, row_ok, n, n_ok, mult_ptr, bias_ptr, topk_w_ptr, out_ptr, stride_be,
                    stride_bn, stride_om, stride_on, TOP_K, SCHEME, HAS_BIAS, ROUTER_ON_INPUT,
                    OUT_BY_TOKEN)  # fmt: skip


@triton.jit
def _gemm2(
    a_ptr, as_ptr, w_ptr, s_ptr, mult_ptr, bias_ptr, topk_w_ptr, sorted_ptr, block_expert_ptr, offsets_ptr, out_ptr,
    part_ptr, count_ptr, sum_ptr, slot_count_ptr, num_pairs, num_m, N, K, num_experts,
    stride_am, stride_ak, stride_asm, stride_we, stride_wn, stride_wk, stride_se, stride_sn, stride_sk,
    stride_be, stride_bn, stride_om, stride_on, stride_ps, stride_pm, stride_pn, stride_sm,
    TOP_K: tl.constexpr, SCHEME: tl.constexpr, HAS_BIAS: tl.constexpr, ROUTER_ON_INPUT: tl.constexpr,
    OUT_BY_TOKEN: tl.constexpr, PRECISION: tl.constexpr, SPLIT_K: tl.constexpr, DECODE_ASM: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    SWAP_AB: tl.constexpr = False, A_FP8: tl.constexpr = False, DIRECT: tl.constexpr = False,
    SUM_SLOTS: tl.constexpr = False, PDL: tl.constexpr = False, TMA: tl.constexpr = False,
    TMA_A: tl.constexpr = False, PREFETCH: tl.constexpr = False, PERSISTENT: tl.constexpr = False,
    TAIL_M: tl.constexpr = 0, TAIL_SWAP: tl.constexpr = False,
    WHOLE_CHUNK: tl.constexpr = False,
):  # fmt: skip
    """GEMM2 over the activated intermediate ``[rows, I]``; ``SWAP_AB``, ``SPLIT_K``, ``DIRECT``,
    ``PERSISTENT``, ``TAIL_M`` and ``TAIL_SWAP`` as in ``_gemm1`` (the partials are ``[SPLIT_K, rows, H]``).
    ``A_FP8`` (fp8_block): ``a`` holds the e4m3 codes and ``as`` the scales that GEMM1's ``OUT_FP8``
    epilogue wrote.

    ``SUM_SLOTS`` (``DIRECT`` with k > 1): after storing its pair's row of ``[M*k, H]`` each (pair, N tile)
    program arrives at its token's counter (``slot_count_ptr``, one per (token, N tile), zero at launch),
    and the token's last to arrive sums the k rows into ``sum_ptr`` ``[M, H]`` — ``_slot_sum``, the
    order and arithmetic of ``_sum_slots``, so no separate launch; the flat ids it skips invalid slots by
    are ``block_expert_ptr``'s, as direct routing passes them.

    ``TMA``: the weight tiles through a descriptor over ``[E * H, K]``, as in ``_gemm1``. ``TMA_A``
    (aligned routing: a block's rows are consecutive rows of ``a``): ``a``'s tiles through a descriptor
    too; a block's padding rows then hold whatever ``a`` holds there, which reaches only those rows'
    outputs, never stored."""
    _pdl_start(PDL)
    if PERSISTENT:
        w_desc, a_desc = _gemm2_descs(a_ptr, w_ptr, num_m, N, K, num_experts, stride_am, stride_wn, BLOCK_M, BLOCK_N,
                                      BLOCK_K, TMA, TMA_A)  # fmt: skip
        used, num_n = _persistent_tiles(offsets_ptr, num_experts, N, BLOCK_M, BLOCK_N)
        for t in tl.range(tl.program_id(0), used * num_n, tl.num_programs(0)):
            pid_m, _, expert, live, rows, pair, row_ok, n0, n, n_ok = _walk_tile(
                t, used, num_n, block_expert_ptr, sorted_ptr, num_pairs, num_experts, N, BLOCK_M, BLOCK_N, GROUP_M
            )
            if TAIL_M > 0:
                if _few_rows(row_ok, TAIL_M):  # its rows through plain loads (a_desc's tiles have BLOCK_M rows)
                    rows_t, pair_t, row_ok_t = _head_pairs(sorted_ptr, pid_m, num_pairs, BLOCK_M, TAIL_M)
                    _gemm2_tile(a_ptr, as_ptr, a_desc, w_ptr, w_desc, s_ptr, mult_ptr, bias_ptr, topk_w_ptr, out_ptr,
                                expert, live, pid_m, rows_t, pair_t, row_ok_t, n0, n, n_ok, N, K, stride_am, stride_ak,
                                stride_asm, stride_we, stride_wn, stride_wk, stride_se, stride_sn, stride_sk,
                                stride_be, stride_bn, stride_om, stride_on, TOP_K, SCHEME, HAS_BIAS, ROUTER_ON_INPUT,
                                OUT_BY_TOKEN, PRECISION, DECODE_ASM, TAIL_M, BLOCK_N, BLOCK_K, TAIL_SWAP, A_FP8, TMA,
                                False, PREFETCH, WHOLE_CHUNK)  # fmt: skip
                else:
                    _gemm2_tile(a_ptr, as_ptr, a_desc, w_ptr, w_desc, s_ptr, mult_ptr, bias_ptr, topk_w_ptr, out_ptr,
                                expert, live, pid_m, rows, pair, row_ok, n0, n, n_ok, N, K, stride_am, stride_ak,
                                stride_asm, stride_we, stride_wn, stride_wk, stride_se, stride_sn, stride_sk,
                                stride_be, stride_bn, stride_om, stride_on, TOP_K, SCHEME, HAS_BIAS, ROUTER_ON_INPUT,
                                OUT_BY_TOKEN, PRECISION, DECODE_ASM, BLOCK_M, BLOCK_N, BLOCK_K, SWAP_AB, A_FP8, TMA,
                                TMA_A, PREFETCH, WHOLE_CHUNK)  # fmt: skip
            else:
                _gemm2_tile(a_ptr, as_ptr, a_desc, w_ptr, w_desc, s_ptr, mult_ptr, bias_ptr, topk_w_ptr, out_ptr,
                            expert, live, pid_m, rows, pair, row_ok, n0, n, n_ok, N, K, stride_am, stride_ak,
                            stride_asm, stride_we, stride_wn, stride_wk, stride_se, stride_sn, stride_sk, stride_be,
                            stride_bn, stride_om, stride_on, TOP_K, SCHEME, HAS_BIAS, ROUTER_ON_INPUT, OUT_BY_TOKEN,
                            PRECISION, DECODE_ASM, BLOCK_M, BLOCK_N, BLOCK_K, SWAP_AB, A_FP8, TMA, TMA_A,
                            PREFETCH, WHOLE_CHUNK)  # fmt: skip
    else:
        split, tile, pid_m, pid_n = _program_tile(num_m, N, BLOCK_N, GROUP_M)
        expert = _block_expert(block_expert_ptr, offsets_ptr, pid_m, num_experts, BLOCK_M, DIRECT)
        if expert < 0:  # past the rows in use
            return
        rows, pair, row_ok = _block_pairs(sorted_ptr, pid_m, num_pairs, BLOCK_M, DIRECT)
        n0 = pid_n * BLOCK_N
        n = n0 + tl.arange(0, BLOCK_N)
        n_ok = n < N
        if expert == num_experts:  # null segment: no weight, partial or bias read
            if OUT_BY_TOKEN and split == 0:  # k == 1: the token's output row is this pair's alone, zero it once
                zero = tl.zeros((BLOCK_M, BLOCK_N), dtype=out_ptr.dtype.element_ty)
                tl.store(_out_tile(out_ptr, pair, n, stride_om, stride_on, TOP_K, OUT_BY_TOKEN), zero,
                         mask=row_ok[:, None] & n_ok[None, :])  # fmt: skip
            if SUM_SLOTS and split == 0:  # counted in, its slot left out of the sum
                _slot_sum(out_ptr, sum_ptr, block_expert_ptr, slot_count_ptr, pid_m // TOP_K, pid_n, n, n_ok,
                          tl.cdiv(N, BLOCK_N), stride_om, stride_sm, num_experts, TOP_K, BLOCK_N)  # fmt: skip
            return  # k > 1: the slot sum leaves this pair's slot out
        k_lo, k_hi = _k_slice(K, split, SPLIT_K, BLOCK_K)
        w_desc, a_desc = _gemm2_descs(a_ptr, w_ptr, num_m, N, K, num_experts, stride_am, stride_wn, BLOCK_M, BLOCK_N,
                                      BLOCK_K, TMA, TMA_A)  # fmt: skip
        acc = _gemm2_acc(a_ptr, as_ptr, a_desc, w_ptr, w_desc, s_ptr, expert, pid_m, rows, row_ok, n, n_ok, n0, k_lo,
                         k_hi, N, K, stride_am, stride_ak, stride_asm, stride_we, stride_wn, stride_wk, stride_se,
                         stride_sn, stride_sk, SCHEME, PRECISION, DECODE_ASM, BLOCK_M, BLOCK_N, BLOCK_K, SWAP_AB,
                         A_FP8, TMA, TMA_A, PREFETCH, WHOLE_CHUNK)  # fmt: skip
        if SPLIT_K > 1:  # as in _gemm1
            out_mask = row_ok[:, None] & n_ok[None, :]
            part = part_ptr + rows.to(tl.int64)[:, None] * stride_pm + n[None, :] * stride_pn
            tl.store(part + split * stride_ps, acc, mask=out_mask)
            counter = count_ptr + tile
            if _arrive(counter) < SPLIT_K - 1:
                return
            tl.atomic_xchg(counter, 0)
            acc = _sum_partials(part, out_mask, stride_ps, SPLIT_K, BLOCK_M, BLOCK_N)
        _gemm2_epilogue(acc, expert, True, pair, row_ok, n, n_ok, mult_ptr, bias_ptr, topk_w_ptr,
                        out_ptr, stride_be, stride_bn, stride_om, stride_on, TOP_K, SCHEME, HAS_BIAS, ROUTER_ON_INPUT,
                        OUT_BY_TOKEN)  # fmt: skip
        if SUM_SLOTS:
            _slot_sum(out_ptr, sum_ptr, block_expert_ptr, slot_count_ptr, pid_m // TOP_K, pid_n, n, n_ok,
                      tl.cdiv(N, BLOCK_N), stride_om, stride_sm, num_experts, TOP_K, BLOCK_N)  # fmt: skip


@triton.jit
def _slot_terms(y_ptr, ids_ptr, t, n, n_ok, stride_ym, num_experts, TOP_K: tl.constexpr, BLOCK_N: tl.constexpr,
                CACHE: tl.constexpr):  # fmt: skip
    """Sum over the k slots of token ``t``'s rows ``y[t*k + j]``, in slot order, in fp32; a slot whose id
    lies outside ``[0, E)`` is left out (GEMM2 never wrote its row). ``CACHE``: the loads' cache modifier."""
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for j in tl.static_range(TOP_K):
        e = tl.load(ids_ptr + t * TOP_K + j + tl.zeros((BLOCK_N,), dtype=tl.int32))  # the slot's id, per lane
        ok = n_ok & (e >= 0) & (e < num_experts)
        acc += tl.load(y_ptr + (t * TOP_K + j) * stride_ym + n, mask=ok, other=0.0, cache_modifier=CACHE).to(tl.float32)
    return acc


@triton.jit
def _slot_sum(y_ptr, sum_ptr, ids_ptr, count_ptr, t, pid_n, n, n_ok, num_n, stride_ym, stride_sm, num_experts,
              TOP_K: tl.constexpr, BLOCK_N: tl.constexpr):  # fmt: skip
    """Count this (pair, N tile) in at token ``t``'s counter; the k-th to arrive sums the token's rows
    (``_slot_terms``, read past L1 as split-K's partials are: ``kernels.split``) into ``sum_ptr[t]`` and
    zeroes the counter again."""
    counter = count_ptr + t * num_n + pid_n
    if _arrive(counter) == TOP_K - 1:
        tl.atomic_xchg(counter, 0)
        acc = _slot_terms(y_ptr, ids_ptr, t.to(tl.int64), n, n_ok, stride_ym, num_experts, TOP_K, BLOCK_N, ".cg")
        tl.store(sum_ptr + t.to(tl.int64) * stride_sm + n, acc.to(sum_ptr.dtype.element_ty), mask=n_ok)


@triton.jit
def _quant_fp8_groups(
    x_ptr, q_ptr, s_ptr, M, K, stride_xm, stride_xk, stride_qm, stride_sm, ROWS: tl.constexpr, PDL: tl.constexpr = False
):  # fmt: skip
    """Per-token, per-128-column e4m3 quantization of ``x`` (``_quant_fp8_rows``'s formula), once per forward
    for GEMM1's ``A_FP8`` path: program (row block, column group)."""
    _pdl_start(PDL)
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    group = tl.program_id(1)
    kk = group * 128 + tl.arange(0, 128)
    row_ok = rows < M
    a = _rows_tile(x_ptr, rows, row_ok, kk, K, stride_xm, stride_xk)
    q, scale = _quant_fp8_rows(a)
    mask = row_ok[:, None] & (kk[None, :] < K)
    tl.store(q_ptr + rows.to(tl.int64)[:, None] * stride_qm + kk[None, :], q, mask=mask)
    tl.store(s_ptr + rows.to(tl.int64) * stride_sm + group, scale, mask=row_ok)


@triton.jit
def _sum_slots(
    y_ptr, out_ptr, ids_ptr, N, stride_ym, stride_om, num_experts, TOP_K: tl.constexpr, BLOCK_N: tl.constexpr,
    PDL: tl.constexpr = False,
):  # fmt: skip
    """out[t] = sum over the k slots of y[t*k + j], in a fixed order (deterministic); a slot whose expert id
    lies outside ``[0, E)`` is left out (GEMM2 never wrote its row)."""
    _pdl_start(PDL)
    t = tl.program_id(0).to(tl.int64)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = n < N
    acc = _slot_terms(y_ptr, ids_ptr, t, n, mask, stride_ym, num_experts, TOP_K, BLOCK_N, "")
    tl.store(out_ptr + t * stride_om + n, acc.to(out_ptr.dtype.element_ty), mask=mask)
