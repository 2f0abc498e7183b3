"""The 128x4 block-scale swizzle: element formula, inverse, padding, dtypes, leading dims."""

from __future__ import annotations

import itertools

import pytest
import torch

from moe_core.layout import swizzle_128x4, swizzled_128x4_shape, unswizzle_128x4

SHAPES = [(1, 1), (100, 7), (128, 4), (128, 8), (256, 16), (300, 13), (129, 5)]


def offset(r: int, c: int, cp: int) -> int:
    """Flat position of scale (r, c) in the 128x4 layout, written out term by term."""
    return (r // 128) * 128 * cp + (c // 4) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + (c % 4)


def swizzle_by_formula(sf: torch.Tensor) -> torch.Tensor:
    rows, cols = sf.shape
    rp, cp = swizzled_128x4_shape(rows, cols)
    flat = [0] * (rp * cp)
    for r, c in itertools.product(range(rows), range(cols)):
        flat[offset(r, c, cp)] = int(sf[r, c])
    return torch.tensor(flat, dtype=sf.dtype).reshape(rp, cp)


def codes(rows: int, cols: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(1, 256, (rows, cols), generator=gen, dtype=torch.int32).to(torch.uint8)


@pytest.mark.parametrize("rows,cols", SHAPES)
def test_swizzle_matches_the_element_formula(rows, cols):
    sf = codes(rows, cols)
    assert torch.equal(swizzle_128x4(sf), swizzle_by_formula(sf))


@pytest.mark.parametrize("rows,cols", SHAPES)
def test_unswizzle_inverts_swizzle(rows, cols):
    sf = codes(rows, cols, seed=1)
    assert torch.equal(unswizzle_128x4(swizzle_128x4(sf), rows, cols), sf)


def test_padding_is_zero_and_shape_is_rounded_up():
    sf = codes(100, 7)
    out = swizzle_128x4(sf)
    assert out.shape == (128, 8) and out.is_contiguous()
    # every non-zero input byte appears once; the 128*8 - 100*7 padding bytes are zero
    assert int((out != 0).sum()) == 100 * 7
    assert sorted(out[out != 0].tolist()) == sorted(sf.flatten().tolist())


def test_first_block_by_hand():
    # rows 0, 32, 64, 96 of column 0..3 fill the first 16 bytes (row 0's 4 columns, then row 32's, ...)
    sf = torch.arange(128 * 4, dtype=torch.int32).reshape(128, 4)
    flat = swizzle_128x4(sf).flatten()
    assert flat[:16].tolist() == [0, 1, 2, 3, 128, 129, 130, 131, 256, 257, 258, 259, 384, 385, 386, 387]
    assert flat[16:20].tolist() == [4, 5, 6, 7]  # row 1


def test_leading_dims_are_independent():
    sf = torch.stack([codes(100, 7, seed=s) for s in range(3)])
    out = swizzle_128x4(sf)
    assert out.shape == (3, 128, 8)
    for e in range(3):
        assert torch.equal(out[e], swizzle_128x4(sf[e]))
    assert torch.equal(unswizzle_128x4(out, 100, 7), sf)


def test_float8_scales_keep_their_bytes():
    sf = torch.rand(130, 6).mul(400).to(torch.float8_e4m3fn)
    out = swizzle_128x4(sf)
    assert out.dtype == torch.float8_e4m3fn
    assert torch.equal(out.view(torch.uint8), swizzle_128x4(sf.view(torch.uint8)))
    assert torch.equal(unswizzle_128x4(out, 130, 6).view(torch.uint8), sf.view(torch.uint8))


def test_flat_buffer_round_trip():
    sf = codes(300, 13)
    flat = swizzle_128x4(sf).flatten()
    assert torch.equal(unswizzle_128x4(flat.reshape(*swizzled_128x4_shape(300, 13)), 300, 13), sf)


def test_bad_shapes_are_refused():
    with pytest.raises(ValueError, match="rows, cols"):
        swizzle_128x4(torch.zeros(4, dtype=torch.uint8))
    with pytest.raises(ValueError, match=r"\[\.\.\., 128, 8\]"):
        unswizzle_128x4(torch.zeros(128, 4, dtype=torch.uint8), 100, 7)
