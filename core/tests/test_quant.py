"""Tests of moe_core.quant: E2M1, MXFP4, NVFP4, block FP8 and the MoeWeights bridge.

Expected codes, bytes and scales are written out by hand where the point is a
convention (nibble order, tie rounding, scale rounding), and checked against
per-element error bounds on random data elsewhere.

Longer than 400 lines on purpose: every format's hand-written codes sit beside its round-trip checks, so a
convention and its test are read together.
"""

from __future__ import annotations

import pytest
import torch

import moe_core.quant.codec as codec_module
from moe_core.config import MoeConfig
from moe_core.errors import InvalidInputError
from moe_core.quant import (
    dequantize_expert,
    dequantize_fp8_block,
    dequantize_fp8_per_token_group,
    dequantize_mxfp4,
    dequantize_nvfp4,
    dequantize_weights,
    e2m1_to_float,
    float_to_e2m1,
    pack_fp4,
    quantize_fp8_block,
    quantize_fp8_per_token_group,
    quantize_mxfp4,
    quantize_nvfp4,
    quantize_weights,
    unpack_fp4,
)
from moe_core.synthetic import random_canonical_weights, random_weights
from moe_core.weights import MoeWeights, validate_weights

E2M1_TABLE = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
F32 = torch.float32
U8 = torch.uint8


def u8(*values) -> torch.Tensor:
    return torch.tensor(values, dtype=U8)


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def half_grid_step(y: torch.Tensor) -> torch.Tensor:
    """Half the E2M1 grid spacing around magnitude ``y`` (the worst rounding error in [0, 6])."""
    return torch.where(y <= 2, 0.25, torch.where(y <= 4, 0.5, 1.0))


# --------------------------------------------------------------------------- E2M1


def test_e2m1_decodes_all_16_codes():
    got = e2m1_to_float(torch.arange(16, dtype=U8))
    expected = torch.tensor(E2M1_TABLE + [-v for v in E2M1_TABLE])
    assert torch.equal(got, expected)
    assert got.dtype == F32
    assert torch.signbit(got[8])  # code 8 is -0


def test_e2m1_decode_reads_low_nibble_only():
    assert torch.equal(e2m1_to_float(u8(0x17, 0xF2)), torch.tensor([6.0, 1.0]))


@pytest.mark.parametrize(
    "x, code",
    [
        (0.25, 0),
        (0.75, 2),
        (1.25, 2),
        (1.75, 4),
        (2.5, 4),
        (3.5, 6),
        (5.0, 6),
        (-0.75, 10),
        (-1.25, 10),
        (-1.75, 12),
        (-2.5, 12),
        (-3.5, 14),
        (-5.0, 14),
    ],
)
def test_e2m1_ties_go_to_even_code(x, code):
    assert float_to_e2m1(torch.tensor([x])).item() == code


@pytest.mark.parametrize(
    "x, value",
    [
        (0.2499, 0.0),
        (0.2501, 0.5),
        (0.74, 0.5),
        (1.26, 1.5),
        (2.49, 2.0),
        (2.51, 3.0),
        (4.99, 4.0),
        (5.01, 6.0),
        (-0.6, -0.5),
        (-4.4, -4.0),
    ],
)
def test_e2m1_rounds_to_nearest(x, value):
    assert e2m1_to_float(float_to_e2m1(torch.tensor([x]))).item() == value


def test_e2m1_saturates_to_six():
    x = torch.tensor([6.0, 6.5, 7.0, 100.0, 1e30, -6.5, -1e30, float("inf")])
    assert float_to_e2m1(x).tolist() == [7, 7, 7, 7, 7, 15, 15, 7]


def test_e2m1_round_trips_every_code():
    codes = torch.arange(16, dtype=U8)
    assert torch.equal(float_to_e2m1(e2m1_to_float(codes)), codes)


def test_e2m1_small_negative_keeps_sign_bit():
    assert float_to_e2m1(torch.tensor([-0.1, -0.0, 0.1])).tolist() == [8, 8, 0]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
def test_e2m1_other_float_dtypes_match_float32(dtype):
    x = (torch.randn(4096, generator=gen()) * 3).to(dtype)
    assert torch.equal(float_to_e2m1(x), float_to_e2m1(x.float()))


def test_e2m1_float64_tie_neighbour_is_not_double_rounded():
    # Just above the 0.25 tie in float64 but 0.25 once rounded to float32.
    assert float_to_e2m1(torch.tensor([0.25 + 1e-12], dtype=torch.float64)).item() == 1


def test_float_to_e2m1_rejects_integer_tensor():
    with pytest.raises(InvalidInputError, match="floating-point"):
        float_to_e2m1(torch.tensor([1, 2]))


def test_pack_fp4_nibble_order():
    assert pack_fp4(u8(1, 2)).tolist() == [0x21]
    assert pack_fp4(u8(0xF, 0x0, 0x3, 0xA, 7, 8)).tolist() == [0x0F, 0xA3, 0x87]
    assert unpack_fp4(u8(0x21, 0xF7)).tolist() == [1, 2, 7, 15]


def test_pack_unpack_round_trip_all_bytes_with_leading_dims():
    packed = torch.arange(256, dtype=U8).reshape(2, 4, 32)
    codes = unpack_fp4(packed)
    assert codes.shape == (2, 4, 64)
    assert int(codes.max()) <= 15
    assert torch.equal(pack_fp4(codes), packed)


def test_pack_fp4_rejects_odd_k_and_wrong_dtype():
    with pytest.raises(InvalidInputError, match="even"):
        pack_fp4(u8(1, 2, 3))
    with pytest.raises(InvalidInputError, match="uint8"):
        pack_fp4(torch.tensor([1, 2]))
    with pytest.raises(InvalidInputError, match="uint8"):
        unpack_fp4(torch.tensor([1, 2], dtype=torch.int32))


# --------------------------------------------------------------------------- MXFP4


def test_mxfp4_hand_computed_block():
    # amax 3.0 -> exponent ceil(log2(3/6)) = -1 -> byte 126; elements are x / 0.5.
    x = torch.zeros(32)
    x[:8] = torch.tensor([3.0, -3.0, 1.0, 0.5, 0.25, 0.3, 0.7, -2.2])
    packed, scale = quantize_mxfp4(x)
    assert scale.tolist() == [126]
    # x/0.5 = 6, -6, 2, 1, 0.5, 0.6, 1.4, -4.4 -> codes 7, 15, 4, 2, 1, 1, 3, 14
    assert packed[:4].tolist() == [0xF7, 0x24, 0x11, 0xE3]
    assert packed[4:].tolist() == [0] * 12
    expected = torch.zeros(32)
    expected[:8] = torch.tensor([3.0, -3.0, 1.0, 0.5, 0.25, 0.25, 0.75, -2.0])
    assert torch.equal(dequantize_mxfp4(packed, scale), expected)


@pytest.mark.parametrize("n", [-126, -20, -1, 0, 1, 5, 100, 125])
def test_mxfp4_exponent_at_exact_power_boundary(n):
    edge = torch.tensor(6.0 * 2.0**n)
    just_above = torch.nextafter(edge, torch.tensor(float("inf")))
    x = torch.zeros(3, 32)
    x[0, 5] = edge
    x[1, 7] = -just_above  # / 2**(n+1) is just above 3 -> code 5, negative
    x[2, 0] = edge * 0.75  # 4.5 * 2**n: still exponent n
    packed, scale = quantize_mxfp4(x)
    assert scale.tolist() == [[127 + n], [128 + n], [127 + n]]
    codes = unpack_fp4(packed)
    assert codes[0, 5].item() == 7 and codes[1, 7].item() == 5 + 8 and codes[2, 0].item() == 6


def test_mxfp4_exponent_clamps_at_both_ends():
    x = torch.zeros(2, 32)
    x[0, 0] = 1e-42  # float32 subnormal: exponent would be < -127
    x[1, 0] = 3e38  # ceil(log2(3e38 / 6)) = 126
    _, scale = quantize_mxfp4(x)
    assert scale.tolist() == [[0], [126 + 127]]


def test_mxfp4_zero_block_gets_byte_zero_and_decodes_to_zero():
    x = torch.zeros(2, 64)
    x[1, 40] = 1.5
    packed, scale = quantize_mxfp4(x)
    assert scale.tolist() == [[0, 0], [0, 127 - 2]]
    assert int(packed[0].max()) == 0
    assert torch.equal(dequantize_mxfp4(packed, scale), x)


def test_mxfp4_grid_values_round_trip_exactly():
    g = gen(1)
    codes = torch.randint(0, 16, (4, 6, 128), generator=g, dtype=U8)
    exponents = torch.randint(-30, 30, (4, 6, 4, 1), generator=g)
    x = (e2m1_to_float(codes).reshape(4, 6, 4, 32) * 2.0**exponents).reshape(4, 6, 128)
    packed, scale = quantize_mxfp4(x)
    assert torch.equal(dequantize_mxfp4(packed, scale), x)


def test_mxfp4_error_bound_on_random_data():
    x = torch.randn(8, 16, 256, generator=gen(2)) * torch.logspace(-3, 3, 256)
    packed, scale = quantize_mxfp4(x)
    got = dequantize_mxfp4(packed, scale)
    block_scale = (2.0 ** (scale.double() - 127)).float().repeat_interleave(32, dim=-1)
    y = x.abs() / block_scale
    assert float(y.max()) <= 6.0  # the scale rounds up, nothing clips
    assert bool(((got - x).abs() <= half_grid_step(y) * block_scale).all())
    assert bool((y.reshape(8, 16, 8, 32).amax(-1) > 3.0).all())  # and it is the smallest such scale


def test_mxfp4_bf16_input_and_output_dtype():
    x = torch.randn(4, 64, generator=gen(3))
    p32, s32 = quantize_mxfp4(x.bfloat16().float())
    p16, s16 = quantize_mxfp4(x.bfloat16())
    assert torch.equal(p32, p16) and torch.equal(s32, s16)
    assert dequantize_mxfp4(p16, s16, torch.bfloat16).dtype == torch.bfloat16


def test_mxfp4_byte_255_decodes_to_nan():
    out = dequantize_mxfp4(torch.full((2, 16), 0x21, dtype=U8), u8(255, 127).reshape(2, 1))
    assert bool(out[0].isnan().all())
    assert out[1, :2].tolist() == [0.5, 1.0]


def test_mxfp4_rejects_bad_input():
    with pytest.raises(InvalidInputError, match="multiple of 32"):
        quantize_mxfp4(torch.randn(2, 48))
    with pytest.raises(InvalidInputError, match="floating-point"):
        quantize_mxfp4(torch.ones(2, 32, dtype=torch.int64))
    bad = torch.randn(2, 32)
    bad[1, 3] = float("nan")
    with pytest.raises(InvalidInputError, match="NaN or Inf"):
        quantize_mxfp4(bad)
    bad[1, 3] = float("-inf")
    with pytest.raises(InvalidInputError, match="NaN or Inf"):
        quantize_mxfp4(bad)
    with pytest.raises(InvalidInputError, match="scale has shape"):
        dequantize_mxfp4(torch.zeros(2, 16, dtype=U8), torch.zeros(2, 2, dtype=U8))


# --------------------------------------------------------------------------- NVFP4


def test_nvfp4_hand_computed_scales():
    # Expert 0: amax 2688 = 448 * 6 -> global scale 1.0.
    # Expert 1: amax 672 -> global scale 0.25; its block scale 672 / 6 / 0.25 = 448.
    w = torch.zeros(2, 1, 48)
    w[0, 0, :3] = torch.tensor([2688.0, 448.0, -1344.0])  # block scale 448 -> 6, 1, -3
    w[0, 0, 16:19] = torch.tensor([12.0, 3.0, -1.0])  # block scale 2 -> 6, 1.5, -0.5
    w[0, 0, 32] = 6.375  # block scale 1.0625: an E4M3 tie between 1.0 and 1.125 -> 1.0
    w[1, 0, 0] = -672.0
    packed, scale, gs = quantize_nvfp4(w)
    assert gs.dtype == F32 and gs.tolist() == [1.0, 0.25]
    assert scale.dtype == torch.float8_e4m3fn
    assert scale.float().tolist() == [[[448.0, 2.0, 1.0]], [[448.0, 0.0, 0.0]]]
    codes = unpack_fp4(packed)
    assert codes[0, 0, :3].tolist() == [7, 2, 13]
    assert codes[0, 0, 16:19].tolist() == [7, 3, 9]
    assert codes[0, 0, 32].item() == 7  # 6.375 / 1.0 saturates to 6
    assert codes[1, 0, 0].item() == 15
    out = dequantize_nvfp4(packed, scale, gs)
    assert out[0, 0, :3].tolist() == [2688.0, 448.0, -1344.0]
    assert out[0, 0, 16:19].tolist() == [12.0, 3.0, -1.0]
    assert out[0, 0, 32].item() == 6.0
    assert out[1, 0, 0].item() == -672.0


def test_nvfp4_global_scale_shapes_and_zero_expert():
    w = torch.randn(5, 8, 32, generator=gen(4))
    w[3] = 0
    packed, scale, gs = quantize_nvfp4(w)
    assert packed.shape == (5, 8, 16) and packed.dtype == U8
    assert scale.shape == (5, 8, 2)
    assert gs.shape == (5,)
    assert gs[3].item() == 1.0
    assert torch.equal(gs[:3], w[:3].abs().amax(dim=(1, 2)) / 2688)
    assert scale[:3].float().amax(dim=(1, 2)).tolist() == [448.0] * 3
    assert int(packed[3].max()) == 0 and float(scale[3].float().abs().max()) == 0.0
    _, scale2d, gs2d = quantize_nvfp4(w[0])
    assert gs2d.shape == () and gs2d.item() == gs[0].item()
    assert torch.equal(scale2d.float(), scale[0].float())


def test_nvfp4_grid_values_round_trip_exactly():
    g = gen(5)
    codes = torch.randint(0, 16, (3, 4, 64), generator=g, dtype=U8)
    codes[..., ::16] = 7  # every block holds a 6 so its scale is recovered exactly
    e4m3_values = torch.tensor([0.015625, 0.125, 0.625, 1.0, 1.75, 3.25, 20.0, 240.0, 448.0])
    block = e4m3_values[torch.randint(0, len(e4m3_values), (3, 4, 4), generator=g)]
    gs = torch.tensor([0.125, 2.0**-10, 4.0])
    x = (e2m1_to_float(codes).reshape(3, 4, 4, 16) * block[..., None]).reshape(3, 4, 64) * gs[:, None, None]
    packed, scale, got_gs = quantize_nvfp4(x, global_scale=gs)
    assert torch.equal(got_gs, gs)
    assert torch.equal(scale.float(), block)
    assert torch.equal(dequantize_nvfp4(packed, scale, got_gs), x)


def test_nvfp4_error_bound_on_random_data():
    x = torch.randn(4, 32, 256, generator=gen(6)) * torch.logspace(-2, 2, 256)
    packed, scale, gs = quantize_nvfp4(x)
    got = dequantize_nvfp4(packed, scale, gs)
    denom = scale.float().repeat_interleave(16, dim=-1) * gs[:, None, None]
    assert bool((denom > 0).all())
    y = x.abs() / denom
    # Rounding the block scale to E4M3 (3 mantissa bits) may push y past 6 by 1/16; then it saturates.
    assert float(y.max()) <= 6.0 * (1 + 2**-4) * (1 + 1e-6)
    bound = torch.where(y > 6, y - 6 + 1e-5, half_grid_step(y) * (1 + 1e-6)) * denom
    assert bool(((got - x).abs() <= bound).all())
    rel = (got - x).norm() / x.norm()
    assert float(rel) < 0.15


def test_nvfp4_block_scale_underflow_gives_zero_codes_not_nan():
    x = torch.zeros(1, 32)
    x[0, 0] = 1.0
    x[0, 16] = 1e-6  # block scale (1e-6 / 6) / (1 / 2688) rounds to 0 in E4M3
    packed, scale, gs = quantize_nvfp4(x)
    assert scale.float()[0, 1].item() == 0.0
    out = dequantize_nvfp4(packed, scale, gs)
    assert not bool(out.isnan().any())
    assert out[0, 0].item() == 1.0 and out[0, 16].item() == 0.0


def test_nvfp4_caller_global_scale_saturates():
    x = torch.full((1, 16), 100.0)
    packed, scale, gs = quantize_nvfp4(x, global_scale=0.01)
    assert gs.item() == pytest.approx(0.01)
    assert scale.float().item() == 448.0  # 100 / 6 / 0.01 = 1667 clamps to 448
    assert dequantize_nvfp4(packed, scale, gs)[0, 0].item() == pytest.approx(6 * 448 * 0.01)


def test_nvfp4_rejects_bad_input():
    with pytest.raises(InvalidInputError, match="multiple of 16"):
        quantize_nvfp4(torch.randn(2, 24))
    with pytest.raises(InvalidInputError, match="at least 2"):
        quantize_nvfp4(torch.randn(32))
    with pytest.raises(InvalidInputError, match="floating-point"):
        quantize_nvfp4(torch.ones(2, 16, dtype=torch.int32))
    with pytest.raises(InvalidInputError, match="NaN or Inf"):
        quantize_nvfp4(torch.full((2, 16), float("nan")))
    with pytest.raises(InvalidInputError, match="positive"):
        quantize_nvfp4(torch.randn(2, 2, 16), global_scale=torch.tensor([1.0, -1.0]))
    with pytest.raises(InvalidInputError, match="leading dims"):
        quantize_nvfp4(torch.randn(2, 2, 16), global_scale=torch.ones(3))
    with pytest.raises(InvalidInputError, match="float8_e4m3fn"):
        dequantize_nvfp4(torch.zeros(2, 8, dtype=U8), torch.zeros(2, 1), 1.0)


# --------------------------------------------------------------------------- FP8


def test_fp8_block_hand_computed_scale():
    w = torch.zeros(128, 256)
    w[0, 0], w[5, 7], w[9, 9] = 896.0, 1.0, -224.0  # block (0, 0): amax 896 -> scale 2
    w[3, 200] = 0.5  # block (0, 1): scale 0.5 / 448
    q, scale = quantize_fp8_block(w)
    assert scale.shape == (1, 2) and scale.dtype == F32
    assert scale[0, 0].item() == 2.0
    assert scale[0, 1].item() == pytest.approx(0.5 / 448, rel=1e-7)
    assert q.dtype == torch.float8_e4m3fn and q.shape == w.shape
    assert q.float()[0, 0].item() == 448.0 and q.float()[5, 7].item() == 0.5
    assert q.float()[9, 9].item() == -112.0 and q.float()[3, 200].item() == 448.0
    assert torch.equal(dequantize_fp8_block(q, scale)[:10, :10], w[:10, :10])


def test_fp8_block_partial_edge_blocks():
    w = torch.randn(3, 200, 300, generator=gen(7))
    w[:, 128:, 256:] *= 10  # the corner edge block has its own, larger scale
    q, scale = quantize_fp8_block(w)
    assert q.shape == (3, 200, 300) and scale.shape == (3, 2, 3)
    assert torch.equal(scale[:, 1, 2], w[:, 128:, 256:].abs().amax(dim=(1, 2)) / 448)
    assert torch.equal(scale[:, 0, 2], w[:, :128, 256:].abs().amax(dim=(1, 2)) / 448)
    assert torch.equal(scale[:, 1, 0], w[:, 128:, :128].abs().amax(dim=(1, 2)) / 448)
    assert torch.equal(q.float().abs().amax(dim=(1, 2)), torch.full((3,), 448.0))


@pytest.mark.parametrize("shape, block", [((2, 256, 384), (128, 128)), ((130, 70), (128, 128)), ((64, 96), (32, 16))])
def test_fp8_block_error_bound_on_random_data(shape, block):
    w = torch.randn(*shape, generator=gen(8)) * torch.logspace(-2, 2, shape[-1])
    q, scale = quantize_fp8_block(w, block)
    got = dequantize_fp8_block(q, scale, block)
    n, k = shape[-2:]
    full = scale.repeat_interleave(block[0], -2)[..., :n, :].repeat_interleave(block[1], -1)[..., :k]
    # E4M3: half an ulp is 2**-4 relative for normals, 2**-10 absolute (times scale) below 2**-6.
    assert bool(((got - w).abs() <= 2**-4 * w.abs() + 2**-10 * full).all())


def test_fp8_block_zero_block_scale_is_one():
    w = torch.zeros(256, 128)
    w[200, 3] = 4.0
    q, scale = quantize_fp8_block(w)
    assert scale[0, 0].item() == 1.0
    assert scale[1, 0].item() == pytest.approx(4.0 / 448)
    assert torch.equal(dequantize_fp8_block(q, scale), w)


def test_fp8_block_bf16_in_bf16_out():
    w = torch.randn(2, 130, 140, generator=gen(9)).bfloat16()
    q, scale = quantize_fp8_block(w)
    out = dequantize_fp8_block(q, scale, dtype=torch.bfloat16)
    assert out.dtype == torch.bfloat16
    assert float(((out.float() - w.float()).abs() / w.float().abs().clamp(min=1e-2)).max()) < 0.07


def test_fp8_per_token_group_hand_computed_and_zero_row():
    x = torch.zeros(3, 300)
    x[0, 0], x[0, 1] = 44.8, -4.48  # group 0 of row 0: scale 0.1
    x[2] = torch.randn(300, generator=gen(10))
    q, scale = quantize_fp8_per_token_group(x)
    assert q.shape == (3, 300) and scale.shape == (3, 3)
    assert scale[0, 0].item() == pytest.approx(0.1, rel=1e-7)
    # -4.48 / 0.1 = -44.8 rounds to the E4M3 grid, whose step in [32, 64) is 32 / 8 = 4
    assert q.float()[0, :2].tolist() == [448.0, -44.0]
    assert scale[1].tolist() == [pytest.approx(1e-10 / 448)] * 3
    assert int(q.float()[1].abs().max()) == 0
    out = dequantize_fp8_per_token_group(q, scale)
    assert torch.equal(out[1], x[1])
    assert bool(((out - x).abs() <= 2**-4 * x.abs() + 2**-10 * scale.repeat_interleave(128, -1)[:, :300]).all())
    assert torch.equal(scale[2, 2], x[2, 256:].abs().amax() / 448)


def test_fp8_per_token_group_error_bound_other_group():
    x = torch.randn(16, 4, 192, generator=gen(11)) * torch.logspace(-3, 1, 192)
    q, scale = quantize_fp8_per_token_group(x, group=64)
    assert scale.shape == (16, 4, 3)
    got = dequantize_fp8_per_token_group(q, scale, group=64, dtype=torch.float32)
    assert bool(((got - x).abs() <= 2**-4 * x.abs() + 2**-10 * scale.repeat_interleave(64, -1)).all())


def test_fp8_rejects_bad_input():
    with pytest.raises(InvalidInputError, match="floating-point"):
        quantize_fp8_block(torch.ones(4, 4, dtype=torch.int8))
    with pytest.raises(InvalidInputError, match="NaN or Inf"):
        quantize_fp8_per_token_group(torch.tensor([[1.0, float("inf")]]))
    with pytest.raises(InvalidInputError, match="scale has shape"):
        dequantize_fp8_block(torch.zeros(130, 10, dtype=torch.float8_e4m3fn), torch.ones(1, 1))
    with pytest.raises(InvalidInputError, match="float8_e4m3fn"):
        dequantize_fp8_per_token_group(torch.zeros(2, 4), torch.ones(2, 1))


# --------------------------------------------------------------------------- MoeWeights bridge

ALL_SCHEMES = ["mxfp4", "nvfp4", "fp8_block", "bf16", "fp16", "fp32"]
#: relative Frobenius error of dequantize(quantize(w)) for N(0, 1/fan_in) weights
REL_TOL = {"mxfp4": 0.15, "nvfp4": 0.13, "fp8_block": 0.04, "bf16": 0.0, "fp16": 1e-3, "fp32": 0.0}
ACT_DTYPE = {"fp32": torch.float32, "fp16": torch.float16}


def _config(scheme: str, has_bias: bool, hidden: int = 64, inter: int = 96) -> MoeConfig:
    return MoeConfig(
        num_experts=4,
        top_k=2,
        hidden_size=hidden,
        intermediate_size=inter,
        quant_scheme=scheme,
        dtype=ACT_DTYPE.get(scheme, torch.bfloat16),
        has_bias=has_bias,
    )


@pytest.mark.parametrize("has_bias", [False, True])
@pytest.mark.parametrize("scheme", ALL_SCHEMES)
def test_quantize_weights_validates_and_round_trips(scheme, has_bias):
    config = _config(scheme, has_bias)
    dense = random_canonical_weights(config, dtype=torch.bfloat16)
    quantized = quantize_weights(dense, scheme)
    assert validate_weights(config, quantized) == torch.device("cpu")
    if config.scheme.quantized and has_bias:
        assert quantized.b13 is dense.b13 and quantized.b2 is dense.b2
    w13, w2 = dequantize_weights(quantized, scheme)
    assert w13.dtype == F32 and w13.shape == dense.w13.shape and w2.shape == dense.w2.shape
    for got, ref in ((w13, dense.w13.float()), (w2, dense.w2.float())):
        assert float((got - ref).norm() / ref.norm()) <= REL_TOL[scheme]
    for e in (0, 3):
        e13, e2 = dequantize_expert(quantized, scheme, e)
        assert e13.dtype == F32 and e2.dtype == F32
        assert torch.equal(e13, w13[e]) and torch.equal(e2, w2[e])


@pytest.mark.parametrize("scheme", ["mxfp4", "nvfp4", "fp8_block"])
def test_quantize_weights_in_steps_of_experts_gives_the_same_bytes(scheme, monkeypatch):
    """Large projections are quantized a few experts at a time (memory); the steps, an uneven last one
    included, must not change a byte, nvfp4's per-expert global scales included."""
    config = _config(scheme, False)
    dense = random_canonical_weights(config, dtype=torch.bfloat16)
    dense.w13[1] *= 40  # experts of different ranges: a global scale taken over a step would differ
    whole = quantize_weights(dense, scheme)
    monkeypatch.setattr(codec_module, "QUANT_STEP_ELEMENTS", 3 * dense.w13[0].numel())
    stepped = quantize_weights(dense, scheme)
    assert dense.w13.shape[0] % 3, "the test needs an uneven last step"
    for name in ("w13", "w2"):
        for field in (name, f"{name}_scale", f"{name}_global_scale"):
            a, b = getattr(whole, field), getattr(stepped, field)
            assert (a is None) == (b is None), field
            if a is not None:
                assert a.dtype == b.dtype and torch.equal(a.view(torch.uint8), b.view(torch.uint8)), field


@pytest.mark.parametrize("scheme", ["mxfp4", "nvfp4", "fp8_block"])
def test_quantize_weights_fills_the_scheme_fields(scheme):
    config = _config(scheme, False, hidden=256, inter=32)
    q = quantize_weights(random_canonical_weights(config, dtype=torch.bfloat16), scheme)
    spec = config.scheme
    assert q.w13.dtype == spec.storage_dtype and q.w13_scale.dtype == spec.scale_dtype
    assert (q.w13_global_scale is not None) == spec.global_scale
    assert (q.w2_global_scale is not None) == spec.global_scale
    w13, w2 = dequantize_weights(q, scheme, dtype=torch.bfloat16)
    assert w13.dtype == torch.bfloat16 and w2.dtype == torch.bfloat16


@pytest.mark.parametrize("scheme", ["mxfp4", "nvfp4", "fp8_block"])
def test_random_weights_for_quantized_configs_validate(scheme):
    config = _config(scheme, True)
    validate_weights(config, random_weights(config))


def test_quantize_weights_rejects_bad_input():
    w = MoeWeights(w13=torch.randn(2, 8, 32), w2=torch.randn(2, 32, 4))
    with pytest.raises(InvalidInputError, match="unknown quant scheme"):
        quantize_weights(w, "int4")
    with pytest.raises(InvalidInputError, match="multiple of 32"):
        quantize_weights(w, "mxfp4")  # w2 has K = I = 4
    with pytest.raises(InvalidInputError, match="floating-point"):
        quantize_weights(MoeWeights(w13=torch.ones(2, 8, 32, dtype=torch.int32), w2=w.w2), "fp8_block")
    with pytest.raises(InvalidInputError, match="out of range"):
        dequantize_expert(quantize_weights(w, "fp8_block"), "fp8_block", 2)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_matches_cpu_bit_for_bit():
    x = torch.randn(3, 64, 256, generator=gen(12)) * torch.logspace(-3, 3, 256)
    for quantize, dequantize in (
        (quantize_mxfp4, dequantize_mxfp4),
        (quantize_nvfp4, dequantize_nvfp4),
        (quantize_fp8_block, dequantize_fp8_block),
        (quantize_fp8_per_token_group, dequantize_fp8_per_token_group),
    ):
        cpu, cuda = quantize(x), quantize(x.cuda())
        for a, b in zip(cpu, cuda):
            assert b.device.type == "cuda"
            assert torch.equal(
                a.view(torch.uint8) if a.dtype == torch.float8_e4m3fn else a,
                b.cpu().view(torch.uint8) if b.dtype == torch.float8_e4m3fn else b.cpu(),
            )
        assert torch.equal(dequantize(*cpu), dequantize(*cuda).cpu())
    codes = torch.randint(0, 16, (1000,), dtype=U8)
    assert torch.equal(e2m1_to_float(codes.cuda()).cpu(), e2m1_to_float(codes))
    assert torch.equal(unpack_fp4(pack_fp4(codes.cuda())).cpu(), codes)


def test_every_quantized_scheme_has_a_codec():
    from moe_core.quant.codec import CODECS
    from moe_core.schemes import SCHEMES

    assert {name for name, spec in SCHEMES.items() if spec.quantized} == set(CODECS)
