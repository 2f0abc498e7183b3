"""The two grouped GEMMs of the fused MoE forward, with their epilogues fused.

Both walk the block-padded, expert-sorted rows built by ``align``: program
``(pid_m, pid_n)`` computes a BLOCK_M x BLOCK_N tile of one expert.

- ``_gemm1``: rows of ``hidden_states`` (gathered by token) times the expert's
  ``w13``; the gate and up tiles of the same output columns are accumulated
  side by side, so the epilogue applies bias, the routing weight (when it
  scales the input) and the gated activation, and writes the intermediate
  ``[rows, I]`` once — no ``[rows, 2I]`` round trip through memory.
- ``_gemm2``: the intermediate times ``w2``; the epilogue adds the bias,
  multiplies by the routing weight and writes each (token, slot) pair to its
  own row of ``[M*k, H]`` (a deterministic place; the k slots are summed by
  ``reduce``) — or straight into the output when k == 1.

Weights are read in their storage format and dequantized in the main loop:
``SCHEME`` 0 = bf16/fp16/fp32 as stored; 1 = fp8_block (float8_e4m3fn with a
fp32 scale per 128x128 block; the activation tile is quantized to fp8 per
token per 128 columns on the fly, BLOCK_K = 128); 2 = mxfp4 W4A16 (E2M1 pairs
in a byte, low nibble first, UE8M0 scale per 32 columns; decoded to the
activation dtype before the dot).
"""

from __future__ import annotations

import triton
import triton.language as tl

FLOAT = tl.constexpr(0)
FP8_BLOCK = tl.constexpr(1)
MXFP4 = tl.constexpr(2)
SILU = tl.constexpr(0)
GELU = tl.constexpr(1)
SWIGLU_OAI = tl.constexpr(2)


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
def _e2m1_to_f32(code):
    """E2M1 codes (0..15, uint8/int32) to float32: sign bit 3, magnitudes 0,.5,1,1.5,2,3,4,6."""
    c = code.to(tl.int32)
    mag = c & 7
    # normal values (mag >= 2): exponent e = mag>>1 -> 126+e, mantissa bit = mag&1 -> bit 22
    bits = tl.where(mag >= 2, (mag + 252) << 22, tl.where(mag == 1, 0x3F000000, 0))
    bits = bits | ((c & 8) << 28)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _ue8m0_to_f32(s):
    """UE8M0 scale bytes to float32 2^(s-127) (0 -> 0.0, which only all-zero blocks use)."""
    return (s.to(tl.int32) << 23).to(tl.float32, bitcast=True)


@triton.jit
def _quant_fp8_rows(a):
    """Per-row fp8 e4m3 quantization of a [BM, 128] tile: (codes, fp32 scale per row)."""
    amax = tl.max(tl.abs(a.to(tl.float32)), axis=1)
    scale = tl.maximum(amax, 1e-10) / 448.0
    q = (a.to(tl.float32) / scale[:, None]).to(tl.float8e4nv)
    return q, scale


@triton.jit
def _load_b(
    w_ptr, s_ptr, expert, n, n_ok, k0, K,
    stride_we, stride_wn, stride_wk, stride_se, stride_sn, stride_sk,
    SCHEME: tl.constexpr, BLOCK_K: tl.constexpr, OUT_DTYPE: tl.constexpr,
):  # fmt: skip
    """One [BLOCK_K, BLOCK_N] tile of an expert's weight (rows ``n`` of ``[N, K]``), transposed.

    Returns the tile in the dtype the dot consumes and, for fp8, the per-column scale.
    """
    if SCHEME == MXFP4:
        kk = k0 // 2 + tl.arange(0, BLOCK_K // 2)
        mask = n_ok[None, :] & (kk[:, None] < K // 2)
        packed = tl.load(
            w_ptr + expert * stride_we + n[None, :] * stride_wn + kk[:, None] * stride_wk, mask=mask, other=0
        )
        lo = _e2m1_to_f32(packed & 0xF)
        hi = _e2m1_to_f32(packed >> 4)
        w = tl.reshape(tl.permute(tl.join(lo, hi), (0, 2, 1)), (BLOCK_K, n.shape[0]))
        kg = k0 // 32 + tl.arange(0, BLOCK_K // 32)
        smask = n_ok[None, :] & (kg[:, None] < K // 32)
        sb = tl.load(s_ptr + expert * stride_se + n[None, :] * stride_sn + kg[:, None] * stride_sk, mask=smask, other=0)
        scale = _ue8m0_to_f32(sb)
        scale = tl.reshape(tl.broadcast_to(scale[:, None, :], (BLOCK_K // 32, 32, n.shape[0])), (BLOCK_K, n.shape[0]))
        tile = (w * scale).to(OUT_DTYPE)
        col_scale = tl.full((n.shape[0],), 1.0, tl.float32)
    else:
        kk = k0 + tl.arange(0, BLOCK_K)
        mask = n_ok[None, :] & (kk[:, None] < K)
        tile = tl.load(
            w_ptr + expert * stride_we + n[None, :] * stride_wn + kk[:, None] * stride_wk, mask=mask, other=0.0
        )
        if SCHEME == FP8_BLOCK:
            col_scale = tl.load(
                s_ptr + expert * stride_se + (n // 128) * stride_sn + (k0 // 128) * stride_sk, mask=n_ok, other=0.0
            )
        else:
            col_scale = tl.full((n.shape[0],), 1.0, tl.float32)
    return tile, col_scale


@triton.jit
def _gemm1(
    x_ptr, w_ptr, s_ptr, bias_ptr, topk_w_ptr, sorted_ptr, block_expert_ptr, offsets_ptr, out_ptr,
    num_pairs, num_m, N_HALF, K, num_experts, alpha, limit,
    stride_xm, stride_xk, stride_we, stride_wn, stride_wk, stride_se, stride_sn, stride_sk,
    stride_be, stride_bn, stride_om, stride_on,
    TOP_K: tl.constexpr, SCHEME: tl.constexpr, ACTIVATION: tl.constexpr, HAS_BIAS: tl.constexpr,
    ROUTER_ON_INPUT: tl.constexpr, PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):  # fmt: skip
    num_n = tl.cdiv(N_HALF, BLOCK_N)
    pid_m, pid_n = _tile_ids(tl.program_id(0), num_m, num_n, GROUP_M)
    if pid_m * BLOCK_M >= tl.load(offsets_ptr + num_experts):
        return
    expert = tl.load(block_expert_ptr + pid_m).to(tl.int64)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    pair = tl.load(sorted_ptr + rows)
    row_ok = pair < num_pairs
    token = (pair // TOP_K).to(tl.int64)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < N_HALF
    dot_dtype = x_ptr.dtype.element_ty
    acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + tl.arange(0, BLOCK_K)
        a = tl.load(
            x_ptr + token[:, None] * stride_xm + kk[None, :] * stride_xk,
            mask=row_ok[:, None] & (kk[None, :] < K),
            other=0.0,
        )
        bg, sg = _load_b(w_ptr, s_ptr, expert, n, n_ok, k0, K, stride_we, stride_wn, stride_wk,
                         stride_se, stride_sn, stride_sk, SCHEME, BLOCK_K, dot_dtype)  # fmt: skip
        bu, su = _load_b(w_ptr, s_ptr, expert, n + N_HALF, n_ok, k0, K, stride_we, stride_wn, stride_wk,
                         stride_se, stride_sn, stride_sk, SCHEME, BLOCK_K, dot_dtype)  # fmt: skip
        if SCHEME == FP8_BLOCK:
            aq, a_scale = _quant_fp8_rows(a)
            acc_g += tl.dot(aq, bg) * a_scale[:, None] * sg[None, :]
            acc_u += tl.dot(aq, bu) * a_scale[:, None] * su[None, :]
        else:
            acc_g = tl.dot(a, bg, acc_g, input_precision=PRECISION)
            acc_u = tl.dot(a, bu, acc_u, input_precision=PRECISION)
    if ROUTER_ON_INPUT:
        w = tl.load(topk_w_ptr + pair, mask=row_ok, other=0.0)
        acc_g = acc_g * w[:, None]
        acc_u = acc_u * w[:, None]
    if HAS_BIAS:
        acc_g += tl.load(bias_ptr + expert * stride_be + n * stride_bn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
        acc_u += tl.load(bias_ptr + expert * stride_be + (n + N_HALF) * stride_bn, mask=n_ok, other=0.0).to(tl.float32)[
            None, :
        ]
    if ACTIVATION == SILU:
        h = acc_g * tl.sigmoid(acc_g) * acc_u
    elif ACTIVATION == GELU:
        h = 0.5 * acc_g * (1.0 + tl.erf(acc_g * 0.7071067811865476)) * acc_u
    else:
        g = tl.minimum(acc_g, limit)
        u = tl.minimum(tl.maximum(acc_u, -limit), limit)
        h = g * tl.sigmoid(alpha * g) * (u + 1.0)
    tl.store(
        out_ptr + rows.to(tl.int64)[:, None] * stride_om + n[None, :] * stride_on,
        h.to(out_ptr.dtype.element_ty),
        mask=row_ok[:, None] & n_ok[None, :],
    )


@triton.jit
def _gemm2(
    a_ptr, w_ptr, s_ptr, bias_ptr, topk_w_ptr, sorted_ptr, block_expert_ptr, offsets_ptr, out_ptr,
    num_pairs, num_m, N, K, num_experts,
    stride_am, stride_ak, stride_we, stride_wn, stride_wk, stride_se, stride_sn, stride_sk,
    stride_be, stride_bn, stride_om, stride_on,
    TOP_K: tl.constexpr, SCHEME: tl.constexpr, HAS_BIAS: tl.constexpr, ROUTER_ON_INPUT: tl.constexpr,
    OUT_BY_TOKEN: tl.constexpr, PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):  # fmt: skip
    num_n = tl.cdiv(N, BLOCK_N)
    pid_m, pid_n = _tile_ids(tl.program_id(0), num_m, num_n, GROUP_M)
    if pid_m * BLOCK_M >= tl.load(offsets_ptr + num_experts):
        return
    expert = tl.load(block_expert_ptr + pid_m).to(tl.int64)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    pair = tl.load(sorted_ptr + rows)
    row_ok = pair < num_pairs
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < N
    dot_dtype = a_ptr.dtype.element_ty
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + tl.arange(0, BLOCK_K)
        a = tl.load(
            a_ptr + rows.to(tl.int64)[:, None] * stride_am + kk[None, :] * stride_ak,
            mask=row_ok[:, None] & (kk[None, :] < K),
            other=0.0,
        )
        b, sb = _load_b(w_ptr, s_ptr, expert, n, n_ok, k0, K, stride_we, stride_wn, stride_wk,
                        stride_se, stride_sn, stride_sk, SCHEME, BLOCK_K, dot_dtype)  # fmt: skip
        if SCHEME == FP8_BLOCK:
            aq, a_scale = _quant_fp8_rows(a)
            acc += tl.dot(aq, b) * a_scale[:, None] * sb[None, :]
        else:
            acc = tl.dot(a, b, acc, input_precision=PRECISION)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + expert * stride_be + n * stride_bn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    if not ROUTER_ON_INPUT:
        acc = acc * tl.load(topk_w_ptr + pair, mask=row_ok, other=0.0)[:, None]
    dest = pair // TOP_K if OUT_BY_TOKEN else pair
    tl.store(
        out_ptr + dest.to(tl.int64)[:, None] * stride_om + n[None, :] * stride_on,
        acc.to(out_ptr.dtype.element_ty),
        mask=row_ok[:, None] & n_ok[None, :],
    )


@triton.jit
def _sum_slots(y_ptr, out_ptr, N, stride_ym, stride_om, TOP_K: tl.constexpr, BLOCK_N: tl.constexpr):
    """out[t] = sum over the k slots of y[t*k + j], in a fixed order (deterministic)."""
    t = tl.program_id(0).to(tl.int64)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = n < N
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for j in tl.static_range(TOP_K):
        acc += tl.load(y_ptr + (t * TOP_K + j) * stride_ym + n, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + t * stride_om + n, acc.to(out_ptr.dtype.element_ty), mask=mask)
