"""E2M1 (fp4) elements: encode, decode, and two-per-byte packing.

An E2M1 code is 4 bits: bit 3 is the sign, bits 0..2 index the magnitudes
0, 0.5, 1, 1.5, 2, 3, 4, 6 (code 8 is -0). Packing puts the element at the
even index of K in the LOW nibble and the odd one in the HIGH nibble, the
order of the OCP MX spec, PTX ``cvt.e2m1x2`` and every kernel library.
"""

from __future__ import annotations

import torch

from moe_core.errors import InvalidInputError
from moe_core.quant._common import check_multiple

#: Magnitudes of codes 0..7; codes 8..15 are their negatives.
E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
#: Largest finite E2M1 magnitude; larger inputs saturate to it.
E2M1_MAX = 6.0
# Midpoints between consecutive magnitudes; a tie goes to the even code, so the
# tie at midpoint j rounds down when j is even and up when j is odd.
_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)


def _table(device) -> torch.Tensor:
    mags = torch.tensor(E2M1_MAGNITUDES, dtype=torch.float32, device=device)
    return torch.cat((mags, -mags))


def e2m1_to_float(codes: torch.Tensor) -> torch.Tensor:
    """Decode uint8 E2M1 codes (one per element) to float32.

    Only the low nibble is read, so the caller need not mask; code 8 decodes
    to -0.0.
    """
    if codes.dtype != torch.uint8:
        raise InvalidInputError(f"E2M1 codes must be uint8, got {codes.dtype}")
    return _table(codes.device)[(codes & 0xF).long()]


def float_to_e2m1(x: torch.Tensor) -> torch.Tensor:
    """Round floats to the nearest E2M1 code (uint8, one per element).

    Round to nearest, ties to the even code (the one whose mantissa bit is 0:
    0.25->0, 0.75->1, 1.25->1, 1.75->2, 2.5->2, 3.5->4, 5->4), magnitudes above
    6 saturate to 6, and the sign bit follows ``signbit`` (so -0.1 gives code
    8, -0, as IEEE rounding and PTX ``cvt.rn.satfinite`` do). The input is
    assumed finite: NaN gives an unspecified code, so quantizers check
    ``isfinite`` once up front instead. Works in float32 (float64 inputs stay
    float64, so no double rounding).
    """
    if not x.is_floating_point():
        raise InvalidInputError(f"float_to_e2m1 needs a floating-point tensor, got {x.dtype}")
    work = x if x.dtype == torch.float64 else x.float()
    mid = torch.tensor(_MIDPOINTS, dtype=work.dtype, device=x.device)
    # bucketize(right=False) counts boundaries strictly below |x|. Odd midpoints
    # must count at equality too (ties round up to the even code), so they are
    # moved one ulp down, which makes "> b" the same as ">= midpoint".
    odd = torch.arange(len(_MIDPOINTS), device=x.device) % 2 == 1
    mid = torch.where(odd, torch.nextafter(mid, torch.zeros_like(mid)), mid)
    mag = torch.bucketize(work.abs(), mid, right=False).to(torch.uint8)
    return mag | (torch.signbit(work).to(torch.uint8) << 3)


def pack_fp4(codes: torch.Tensor) -> torch.Tensor:
    """Pack E2M1 codes ``[..., K]`` into bytes ``[..., K//2]``: low nibble = even index."""
    if codes.dtype != torch.uint8:
        raise InvalidInputError(f"E2M1 codes must be uint8, got {codes.dtype}")
    if codes.dim() == 0 or codes.shape[-1] % 2:
        raise InvalidInputError(f"pack_fp4 needs an even last dimension, got shape {tuple(codes.shape)}")
    return (codes[..., 0::2] & 0xF) | ((codes[..., 1::2] & 0xF) << 4)


def unpack_fp4(packed: torch.Tensor) -> torch.Tensor:
    """Unpack bytes ``[..., K/2]`` into E2M1 codes ``[..., K]`` (low nibble first)."""
    if packed.dtype != torch.uint8:
        raise InvalidInputError(f"packed fp4 must be uint8, got {packed.dtype}")
    if packed.dim() == 0:
        raise InvalidInputError("packed fp4 needs at least one dimension")
    return torch.stack((packed & 0xF, packed >> 4), dim=-1).flatten(-2)


def unpack_fp4_blocks(packed: torch.Tensor, scale: torch.Tensor, block: int, scheme: str) -> torch.Tensor:
    """E2M1 values ``[..., K/block, block]`` of ``packed [..., K/2]`` (float32), once ``scale`` is checked to
    hold one entry per ``block`` values along K: what mxfp4 and nvfp4 dequantization share."""
    values = e2m1_to_float(unpack_fp4(packed))
    k = values.shape[-1]
    check_multiple(k, block, scheme)
    expected = (*values.shape[:-1], k // block)
    if tuple(scale.shape) != expected:
        raise InvalidInputError(f"{scheme} scale has shape {tuple(scale.shape)}, expected {expected}")
    return values.reshape(*expected, block)
