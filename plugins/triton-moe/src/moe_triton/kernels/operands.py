"""Operand loaders and elementwise helpers shared by the two grouped GEMMs.

Kept apart from ``gemm.py`` so each piece stays small: weight tiles per scheme
(MXFP4 in the prepared chunked layout of ``moe_triton.layout``), activation
tiles and the gated activations.
"""

from __future__ import annotations

import triton
import triton.language as tl

try:  # programmatic dependent launch (SM90+): Triton >= 3.4 ships the grid-dependency intrinsics
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

    HAS_PDL = True
except ImportError:  # pragma: no cover - older Triton: the PDL constexpr is never set
    HAS_PDL = False

    @triton.jit
    def gdc_wait():
        pass

    @triton.jit
    def gdc_launch_dependents():
        pass


FLOAT = tl.constexpr(0)
FP8_BLOCK = tl.constexpr(1)
MXFP4 = tl.constexpr(2)
SILU = tl.constexpr(0)
GELU = tl.constexpr(1)
SWIGLU_OAI = tl.constexpr(2)
#: K values per prepared MXFP4 chunk (``moe_triton.layout.MXFP4_CHUNK``): 32 low nibbles + 32 high nibbles
CHUNK = tl.constexpr(64)
HALF = tl.constexpr(32)


#: PTX for 4 bytes -> 4 scaled bf16 (two bf16x2 registers) of one nibble, the bits of ``_e2m1_half``
#: times the folded scale: prmt spreads bytes 0,1 (2,3) into the 16-bit lanes, the AND keeps the
#: nibble, one multiply by 2**a + 2**b puts mag at bits 6..8 and the sign at bit 15 (the two copies
#: never overlap, so no carries), the AND clears the rest, and a packed bf16x2 FMA with -0 applies
#: the scale (exact: powers of two; bf16 FMA keeps subnormals). 10 ops per 4 values.
_E2M1_ASM = """{{
.reg .b32 t0, t1, nz;
mov.b32 nz, 0x80008000;
prmt.b32 t0, $2, 0, 0x4140;
prmt.b32 t1, $2, 0, 0x4342;
and.b32 t0, t0, {mask};
and.b32 t1, t1, {mask};
mul.lo.u32 t0, t0, {mult};
mul.lo.u32 t1, t1, {mult};
and.b32 t0, t0, 0x81C081C0;
and.b32 t1, t1, 0x81C081C0;
fma.rn.bf16x2 $0, t0, $3, nz;
fma.rn.bf16x2 $1, t1, $4, nz;
}}"""
E2M1_LO_ASM = tl.constexpr(_E2M1_ASM.format(mask="0x000F000F", mult="0x1040"))
E2M1_HI_ASM = tl.constexpr(_E2M1_ASM.format(mask="0x00F000F0", mult="0x0104"))


@triton.jit
def _e2m1_scaled_asm(packed, scale, HIGH: tl.constexpr):
    """CUDA-only, bf16: ``_scaled(_e2m1_half(packed, HIGH), scale)`` in inline PTX, 4 bytes per call;
    ``scale`` broadcasts against ``packed`` (a ``[1, N]`` or ``[N, 1]`` row of folded scales)."""
    s = tl.broadcast_to(scale, packed.shape)
    if HIGH:
        out = tl.inline_asm_elementwise(E2M1_HI_ASM, "=r,=r,r,r,r", [packed, s], dtype=tl.bfloat16, is_pure=True,
                                        pack=4)  # fmt: skip
    else:
        out = tl.inline_asm_elementwise(E2M1_LO_ASM, "=r,=r,r,r,r", [packed, s], dtype=tl.bfloat16, is_pure=True,
                                        pack=4)  # fmt: skip
    return out


@triton.jit
def _e2m1_half(packed, HIGH: tl.constexpr, DTYPE: tl.constexpr):
    """One nibble of each E2M1 byte as ``value * 2**-126``, built with bit ops only.

    ``(sign << 15) | (mag << 6)`` read as bf16 (``mag`` = exponent:mantissa, 3
    bits) is exactly ``value * 2**-126`` for all 16 codes: normals land on
    exponent 1..3, the 0.5 code on the bf16 subnormal 2**-127. For bf16 dots the
    bits are built in 16 bits and multiplied by the folded scale in bf16; for
    fp32/fp16 (Triton's interpreter has no bf16) the same pattern is built as
    fp32 bits ``(sign << 31) | (mag << 22)`` (the same value).
    """
    if DTYPE == tl.bfloat16:
        b = packed.to(tl.uint16)
        if HIGH:
            bits = ((b & 0x80) << 8) | ((b & 0x70) << 2)
        else:
            bits = ((b & 0x8) << 12) | ((b & 0x7) << 6)
        out = bits.to(tl.bfloat16, bitcast=True)
    else:
        b = packed.to(tl.uint32)
        if HIGH:
            bits = ((b & 0x80) << 24) | ((b & 0x70) << 18)
        else:
            bits = ((b & 0x8) << 28) | ((b & 0x7) << 22)
        out = bits.to(tl.float32, bitcast=True)
    return out


@triton.jit
def _scaled(w, scale, DTYPE: tl.constexpr):
    """Decoded half tile times its folded scales (broadcast: ``[1, N]`` or ``[N, 1]``), in the dot's dtype."""
    if DTYPE == tl.bfloat16:
        out = w * scale
    else:
        out = (w * scale.to(tl.float32)).to(DTYPE)
    return out


@triton.jit
def _mxfp4_chunk(
    w_ptr, s_ptr, expert, n, n_ok, kc, K, stride_we, stride_wn, stride_wk, stride_se, stride_sg, stride_sn,
    DTYPE: tl.constexpr, DECODE_ASM: tl.constexpr, N_ROWS: tl.constexpr = False, IN_ORDER: tl.constexpr = True,
):  # fmt: skip
    """Both halves ``[32, BLOCK_N]`` of the prepared MXFP4 chunk starting at K row ``kc`` (a multiple of 64).

    One byte load feeds both halves; each half is scaled by one ``[N]`` row of
    folded scales (group ``kc/32`` for the low half, the next for the high),
    both from one 32-bit word per row (``moe_triton.layout``): bf16 bits shifted
    into the top of a fp32 are the same value, so no bf16 arithmetic is needed.
    ``DECODE_ASM`` (CUDA, bf16 only) decodes with inline PTX instead of Triton bit ops.
    ``N_ROWS`` returns ``[BLOCK_N, 32]`` halves instead (the swapped-operand GEMMs), loaded that way
    round, so the decode runs in whatever register layout the MMA wants for its first operand.
    ``IN_ORDER``: the halves' K in order (the bytes' stored fragment order undone in registers: a
    reshape and permute that stays within each thread's 4-byte runs), for a tile that feeds Hopper's
    warp-group MMA (swapped, or at least 64 rows), whose register operand must hold K in its own order;
    else in the stored order, for the smaller tiles' MMA, which takes K in any order as long as the
    activations are read in that order too (``_rows_chunk(..., STORED_ORDER=True)``); ``_fragment_order``.
    """
    byte = kc // 2 + tl.arange(0, HALF)
    s_ok = n_ok & (kc + 0 * n < K)  # a tensor compare: the interpreter cannot mask with tensor & scalar bool
    pair = tl.load(s_ptr + expert * stride_se + (kc // CHUNK) * stride_sg + n * stride_sn, mask=s_ok, other=0)
    s_lo = (pair << 16).to(tl.float32, bitcast=True)
    s_hi = (pair & -65536).to(tl.float32, bitcast=True)
    if DTYPE == tl.bfloat16:  # exact: the low 16 bits are zero
        s_lo = s_lo.to(tl.bfloat16)
        s_hi = s_hi.to(tl.bfloat16)
    if N_ROWS:  # [N, 32] tiles: everything indexed by n runs down the rows
        n2, byte2, s_ok2, s_lo, s_hi = n[:, None], byte[None, :], s_ok[:, None], s_lo[:, None], s_hi[:, None]
    else:
        n2, byte2, s_ok2, s_lo, s_hi = n[None, :], byte[:, None], s_ok[None, :], s_lo[None, :], s_hi[None, :]
    packed = tl.load(w_ptr + expert * stride_we + n2 * stride_wn + byte2 * stride_wk, mask=s_ok2, other=0)
    if IN_ORDER:
        packed = _fragment_order(packed, False) if N_ROWS else tl.trans(_fragment_order(tl.trans(packed), False))
    if DECODE_ASM and DTYPE == tl.bfloat16:
        lo = _e2m1_scaled_asm(packed, s_lo, False)
        hi = _e2m1_scaled_asm(packed, s_hi, True)
    else:
        lo = _scaled(_e2m1_half(packed, False, DTYPE), s_lo, DTYPE)
        hi = _scaled(_e2m1_half(packed, True, DTYPE), s_hi, DTYPE)
    return lo, hi


@triton.jit
def _fragment_order(t, TO_STORED: tl.constexpr):
    """``[rows, 32]`` between K order and the stored MXFP4 byte order (``moe_triton.layout.FRAGMENT_ORDER``:
    position ``16s + 4c + 2h + e`` holds K ``16s + 8h + 2c + e``); ``TO_STORED``: K order -> stored."""
    rows: tl.constexpr = t.shape[0]
    if TO_STORED:  # [.., s, h, c, e] -> [.., s, c, h, e]
        t = tl.permute(tl.reshape(t, [rows, 2, 2, 4, 2]), [0, 1, 3, 2, 4])
    else:  # [.., s, c, h, e] -> [.., s, h, c, e]
        t = tl.permute(tl.reshape(t, [rows, 2, 4, 2, 2]), [0, 1, 3, 2, 4])
    return tl.reshape(t, [rows, HALF])


@triton.jit
def _dense_tile(
    w_ptr, expert, n, n_ok, k0, K, stride_we, stride_wn, stride_wk, BLOCK_K: tl.constexpr,
    N_ROWS: tl.constexpr = False,
):  # fmt: skip
    """One ``[BLOCK_K, BLOCK_N]`` weight tile (rows ``n`` of ``[N, K]``, transposed); ``N_ROWS`` loads it
    ``[BLOCK_N, BLOCK_K]`` (as stored) for the swapped-operand GEMMs."""
    kk = k0 + tl.arange(0, BLOCK_K)
    if N_ROWS:
        mask = n_ok[:, None] & (kk[None, :] < K)
        ptrs = w_ptr + expert * stride_we + n[:, None] * stride_wn + kk[None, :] * stride_wk
    else:
        mask = n_ok[None, :] & (kk[:, None] < K)
        ptrs = w_ptr + expert * stride_we + n[None, :] * stride_wn + kk[:, None] * stride_wk
    return tl.load(ptrs, mask=mask, other=0.0)


@triton.jit
def _col_scale(s_ptr, expert, n, n_ok, n0, k0, stride_se, stride_sn, stride_sk, ALIGNED: tl.constexpr):
    """fp8_block: the scale of each weight row ``n`` (``n0`` the tile's first) in the 128x128 block holding K
    column ``k0``.

    ``ALIGNED`` (and at most 128 rows): the tile starts on a multiple of its width, so its rows lie in one
    scale block: one scalar load per K block. Otherwise every row's scale is loaded — one load per row a
    thread holds, each waited for in the K loop (Triton stages only the MMA's operands). Wider tiles keep
    the per-row loads: a vector of two blocks' scales (a select per column) stays live across the loop
    and pushes those 255-register tiles into spilling."""
    base = s_ptr + expert * stride_se + (k0 // 128) * stride_sk
    if ALIGNED and n.shape[0] <= 128:
        col_scale = tl.full((n.shape[0],), 1.0, tl.float32) * tl.load(base + (n0 // 128) * stride_sn)
    else:
        col_scale = tl.load(base + (n // 128) * stride_sn, mask=n_ok, other=0.0)
    return col_scale


@triton.jit
def _rows_desc(ptr, rows, K, stride_m, BLOCK_ROWS: tl.constexpr, BLOCK_K: tl.constexpr):
    """A tensor descriptor over ``rows`` rows of a K-contiguous ``[rows, K]`` matrix, in
    ``[BLOCK_ROWS, BLOCK_K]`` tiles: the weights of all experts as one ``[E * N, K]`` matrix, or GEMM2's
    aligned intermediate. Out-of-range rows and columns of a tile read as zero."""
    return tl.make_tensor_descriptor(ptr, shape=[rows, K], strides=[stride_m, 1], block_shape=[BLOCK_ROWS, BLOCK_K])


@triton.jit
def _dense_tile_tma(desc, row0, k0, N_ROWS: tl.constexpr = False):
    """``_dense_tile`` through a weight descriptor (``_rows_desc`` over ``[E * N, K]``): the tile whose first
    row is ``row0``. Rows past the ones wanted hold whatever follows (the up half, the next expert, zeros
    past the last) where plain loads read zeros: the GEMMs mask those columns out of every store, and
    GEMM1 zeroes them before its fp8 epilogue's group maxima."""
    tile = desc.load([row0, k0])
    if not N_ROWS:
        tile = tl.trans(tile)
    return tile


@triton.jit
def _quant_fp8_rows(a):
    """Per-row fp8 e4m3 quantization over the last axis (128 columns: a ``[BM, 128]`` K tile, or the
    ``[BM, groups, 128]`` groups of GEMM1's output tile): (codes, fp32 scale per row or row and group)."""
    last: tl.constexpr = len(a.shape) - 1
    amax = tl.max(tl.abs(a.to(tl.float32)), axis=last)
    scale = tl.maximum(amax, 1e-10) / 448.0
    q = (a.to(tl.float32) / tl.expand_dims(scale, last)).to(tl.float8e4nv)
    return q, scale


@triton.jit
def _pdl_start(PDL: tl.constexpr):
    """First statement of every kernel of the forward. With programmatic dependent launch (``PDL``, the
    kernel launched with ``launch_pdl``) the kernel may start while its predecessor still runs: it waits
    here until the predecessor's writes are visible, then lets its own successor launch early, so each
    launch's latency overlaps the previous kernel's tail. A no-op without PDL."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()


@triton.jit
def _activate(g, u, alpha, limit, ACTIVATION: tl.constexpr):
    """Gated activation of fp32 gate/up tiles."""
    if ACTIVATION == SILU:
        h = g * tl.sigmoid(g) * u
    elif ACTIVATION == GELU:
        h = 0.5 * g * (1.0 + tl.erf(g * 0.7071067811865476)) * u
    else:
        gc = tl.minimum(g, limit)
        uc = tl.minimum(tl.maximum(u, -limit), limit)
        h = gc * tl.sigmoid(alpha * gc) * (uc + 1.0)
    return h


@triton.jit
def _rows_tile(ptr, rows, row_ok, kk, K, stride_m, stride_k):
    """``ptr[rows, kk]`` with rows/columns out of range read as 0."""
    return tl.load(
        ptr + rows.to(tl.int64)[:, None] * stride_m + kk[None, :] * stride_k,
        mask=row_ok[:, None] & (kk[None, :] < K),
        other=0.0,
    )
