"""The prepared MXFP4 layout: the E2M1 bit identity, the re-layout and scale folding round trips.

These pin the arithmetic the kernels rely on (``moe_triton.layout``): if the
bit trick or the chunk permutation were wrong, every MXFP4 forward would be.
"""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from moe_core.quant.fp4 import e2m1_to_float, unpack_fp4
from moe_core.quant.mxfp4 import dequantize_mxfp4, quantize_mxfp4, ue8m0_to_float
from moe_triton import layout
from moe_triton.kernels.operands import _e2m1_half, _e2m1_scaled_asm

CODES = torch.arange(16, dtype=torch.uint8)


def test_e2m1_bits_are_value_times_2_pow_minus_126_for_all_16_codes():
    value = e2m1_to_float(CODES).double()
    bf16 = layout.e2m1_bits_bf16(CODES).double()
    assert torch.equal(bf16 * 2.0**126, value)
    assert torch.equal(torch.signbit(bf16), torch.signbit(value))  # code 8 is -0.0
    # the fp32 pattern the fp32/fp16 path builds: (sign << 31) | (mag << 22)
    c = CODES.to(torch.int64)
    f32 = (((c & 8) << 28) | ((c & 7) << 22)).to(torch.int32).view(torch.float32).double()
    assert torch.equal(f32 * 2.0**126, value)
    assert torch.equal(torch.signbit(f32), torch.signbit(value))


@pytest.mark.parametrize("k", [64, 96, 192, 2880])
def test_packed_permutation_round_trip_and_chunk_order(k):
    gen = torch.Generator().manual_seed(k)
    packed = torch.randint(0, 256, (3, 5, k // 2), generator=gen, dtype=torch.uint8)
    prepared = layout.permute_mxfp4_packed(packed)
    kp = -(-k // 64) * 64
    assert prepared.shape == (3, 5, kp // 2)
    assert torch.equal(layout.unpermute_mxfp4_packed(prepared, k), packed)
    codes = torch.nn.functional.pad(unpack_fp4(packed), (0, kp - k))  # [E, N, Kp] canonical order
    order = list(layout.FRAGMENT_ORDER)
    for c in range(kp // 64):
        chunk = prepared[..., c * 32 : (c + 1) * 32]
        assert torch.equal(chunk & 0xF, codes[..., c * 64 : c * 64 + 32][..., order])  # low nibbles: first half
        assert torch.equal(chunk >> 4, codes[..., c * 64 + 32 : c * 64 + 64][..., order])  # high: second half


def test_fragment_order_puts_each_mma_lanes_bytes_side_by_side():
    """Lane c of an MMA register operand holds k = 2c, 2c+1, 2c+8, 2c+9 of each 16 of K: stored at 4c..4c+3
    of each 16-byte half."""
    order = layout.FRAGMENT_ORDER
    assert sorted(order) == list(range(32))
    for s in (0, 16):
        for c in range(4):
            assert order[s + 4 * c : s + 4 * c + 4] == (s + 2 * c, s + 2 * c + 1, s + 2 * c + 8, s + 2 * c + 9)


def test_scale_folding_round_trip_with_and_without_shift():
    gen = torch.Generator().manual_seed(0)
    scale = torch.randint(100, 129, (4, 6, 3), generator=gen, dtype=torch.uint8)  # 3 groups: K=96, padded to 128
    scale[1, 2, 0] = 140  # expert 1 needs a shift (2**(140-1) is not a finite float)
    scale[2, 0, 1] = 0  # all-zero block byte
    scale[3, 5, 2] = 254
    folded, mult = layout.fold_mxfp4_scale(scale)
    assert folded.dtype == torch.int32 and folded.shape == (4, 2, 6)  # 4 groups (K padded to 128) in 2 pairs
    groups = layout.scale_groups(folded)
    assert groups.dtype == torch.bfloat16 and groups.shape == (4, 6, 4)
    assert torch.isfinite(groups).all()
    # each word: the chunk's even group in its low 16 bits, the odd group in its high 16 bits
    bits = groups.view(torch.int16).to(torch.int32) & 0xFFFF
    assert torch.equal(folded.transpose(1, 2), bits[..., 0::2] | (bits[..., 1::2] << 16))
    assert mult.tolist() == [1.0, 2.0**12, 1.0, 2.0**126]
    assert torch.equal(layout.unfold_mxfp4_scale(folded, mult, 3), scale)
    # folded * mult * 2**-126 is the UE8M0 value, exactly
    want = ue8m0_to_float(scale).double()
    got = groups.double()[..., :3] * mult.double()[:, None, None] * 2.0**-126
    assert torch.equal(got, want)


def test_nan_scale_stays_nan():
    scale = torch.full((1, 2, 2), 120, dtype=torch.uint8)
    scale[0, 1, 1] = 255
    folded, mult = layout.fold_mxfp4_scale(scale)
    groups = layout.scale_groups(folded)
    assert torch.isnan(groups[0, 1, 1]) and torch.isfinite(groups[0, :, 0]).all() and mult.item() == 1.0


@pytest.mark.parametrize("k", [96, 256])
def test_prepared_weights_decode_to_the_canonical_dequantization(k):
    """Decoding the prepared layout the kernel's way gives exactly ``dequantize_mxfp4``."""
    gen = torch.Generator().manual_seed(1)
    w = torch.randn(3, 8, k, generator=gen) * torch.tensor([1e-3, 1.0, 300.0])[:, None, None]
    packed, scale = quantize_mxfp4(w)
    prepared, folded, mult = (layout.permute_mxfp4_packed(packed), *layout.fold_mxfp4_scale(scale))
    assert mult[2].item() > 1.0  # the 300x expert exercises the shift
    e, n, _ = prepared.shape
    in_order = prepared.view(e, n, -1, 32)[..., torch.argsort(torch.tensor(layout.FRAGMENT_ORDER))]  # chunk order
    lo = layout.e2m1_bits_bf16(in_order & 0xF).double()
    hi = layout.e2m1_bits_bf16(in_order >> 4).double()
    chunks = torch.stack((lo.view(e, n, -1, 32), hi.view(e, n, -1, 32)), dim=3).reshape(e, n, -1)  # canonical k order
    s = layout.scale_groups(folded).double().repeat_interleave(32, dim=2) * mult.double()[:, None, None]
    decoded = (chunks * s)[..., :k]
    assert torch.equal(decoded, dequantize_mxfp4(packed, scale, torch.float64))


@triton.jit
def _decode_all_bytes(b_ptr, lo_ptr, hi_ptr, DTYPE: tl.constexpr):
    i = tl.arange(0, 256)
    b = tl.load(b_ptr + i)
    # scale by 2**126 in two exact steps so the check reads real values
    lo = _e2m1_half(b, False, DTYPE).to(tl.float32) * 9.223372036854775808e18 * 9.223372036854775808e18
    hi = _e2m1_half(b, True, DTYPE).to(tl.float32) * 9.223372036854775808e18 * 9.223372036854775808e18
    tl.store(lo_ptr + i, lo)
    tl.store(hi_ptr + i, hi)


def test_kernel_decode_helper_matches_all_256_bytes():
    """``_e2m1_half`` in a kernel (fp32 path under the interpreter; the bf16 path too on CUDA)."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtypes = [tl.float32, tl.bfloat16] if device == "cuda" else [tl.float32]
    b = torch.arange(256, dtype=torch.uint8, device=device)
    for dt in dtypes:
        lo, hi = torch.empty(256, device=device), torch.empty(256, device=device)
        _decode_all_bytes[(1,)](b, lo, hi, DTYPE=dt)
        assert torch.equal(lo.cpu(), e2m1_to_float(b.cpu() & 0xF)), dt
        assert torch.equal(hi.cpu(), e2m1_to_float(b.cpu() >> 4)), dt


@triton.jit
def _decode_asm_all_bytes(b_ptr, lo_ptr, hi_ptr):
    """[32, 8] bytes (all 256 values) through the inline-PTX decode with the scale 2**126 (undoes the bit shift)."""
    offs = tl.arange(0, 32)[:, None] * 8 + tl.arange(0, 8)[None, :]
    b = tl.load(b_ptr + offs)
    scale = tl.full((8,), 8.507059173023462e37, tl.bfloat16)  # 2**126
    tl.store(lo_ptr + offs, _e2m1_scaled_asm(b, scale[None, :], False).to(tl.float32))
    tl.store(hi_ptr + offs, _e2m1_scaled_asm(b, scale[None, :], True).to(tl.float32))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="inline PTX runs on CUDA only")
def test_inline_ptx_decode_matches_all_256_bytes():
    b = torch.arange(256, dtype=torch.uint8, device="cuda")
    lo, hi = torch.empty(256, device="cuda"), torch.empty(256, device="cuda")
    _decode_asm_all_bytes[(1,)](b, lo, hi)
    assert torch.equal(lo.cpu(), e2m1_to_float(b.cpu() & 0xF))
    assert torch.equal(hi.cpu(), e2m1_to_float(b.cpu() >> 4))
