"""OCP MX FP4: E2M1 elements with one UE8M0 (power-of-two) scale per 32 along K.

Scale byte ``b`` means ``2**(b - 127)``; 255 is NaN in the spec, never produced
here, and decodes to NaN. The exponent of a block is the smallest ``e`` with
``amax <= 6 * 2**e``, i.e. ``ceil(log2(amax / 6))`` computed exactly (as
FlashInfer and Triton's ``downcast_to_mxfp`` round the scale up), so no element
clips; it is clamped to [-127, 127]. An all-zero block gets byte 0 (2**-127),
the limit of that formula at amax -> 0 and what Triton's reference produces;
any scale decodes zeros exactly.
"""

from __future__ import annotations

import torch

from moe_core.quant._common import check_dtype, check_float_input, check_multiple
from moe_core.quant.fp4 import float_to_e2m1, pack_fp4, unpack_fp4_blocks
from moe_core.schemes import SCHEMES

#: Elements per scale along K.
MXFP4_BLOCK = SCHEMES["mxfp4"].scale_block[1]
#: Exponent bias of the UE8M0 scale byte.
UE8M0_BIAS = 127
#: Scale byte that encodes NaN.
UE8M0_NAN = 255


def pow2_float32(e: torch.Tensor) -> torch.Tensor:
    """``2.0**e`` as exact float32 for integer ``e`` in [-149, 127], built from bits.

    Avoids relying on ``pow``/``exp2``/``ldexp`` being exact at the subnormal end
    (``2**-127`` is a float32 subnormal) on every device.
    """
    e = e.to(torch.int32)
    normal = (e + 127).clamp(min=1) << 23
    subnormal = torch.ones_like(e) << (e + 149).clamp(0, 22)
    return torch.where(e >= -126, normal, subnormal).view(torch.float32)


def _block_exponent(amax: torch.Tensor) -> torch.Tensor:
    """Smallest integer ``e`` with ``amax <= 6 * 2**e`` (int32), from frexp, no log2.

    With ``amax = m * 2**p`` and ``m`` in [0.5, 1): ``6 * 2**e = 0.75 * 2**(e+3)``,
    so ``e = p - 3`` when ``m <= 0.75`` and ``p - 2`` otherwise. Zero gives -127.
    """
    mantissa, exponent = torch.frexp(amax)
    e = exponent - 3 + (mantissa > 0.75).to(exponent.dtype)
    e = torch.where(amax > 0, e, torch.full_like(e, -UE8M0_BIAS))
    return e.clamp(-UE8M0_BIAS, UE8M0_BIAS)


def quantize_mxfp4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize ``w [..., K]`` to ``(packed uint8 [..., K/2], scale uint8 [..., K/32])``.

    Elements are ``x / 2**e`` rounded with ``float_to_e2m1`` (ties to even).
    K must be a multiple of 32; non-finite input raises ``InvalidInputError``.
    """
    check_float_input(w, "mxfp4 input")
    k = w.shape[-1]
    check_multiple(k, MXFP4_BLOCK, "mxfp4")
    blocks = w.float().reshape(*w.shape[:-1], k // MXFP4_BLOCK, MXFP4_BLOCK)
    e = _block_exponent(blocks.abs().amax(dim=-1))
    # Multiplying by a power of two is exact (the quotient is at most 6).
    codes = float_to_e2m1(blocks * pow2_float32(-e).unsqueeze(-1))
    scale = (e + UE8M0_BIAS).to(torch.uint8)
    return pack_fp4(codes.reshape(w.shape)), scale


def ue8m0_to_float(scale: torch.Tensor) -> torch.Tensor:
    """Decode UE8M0 scale bytes to float32 ``2**(b-127)``; byte 255 gives NaN."""
    check_dtype(scale, torch.uint8, "mxfp4 scale")
    value = pow2_float32(scale.to(torch.int32) - UE8M0_BIAS)
    return torch.where(scale == UE8M0_NAN, torch.full_like(value, float("nan")), value)


def dequantize_mxfp4(packed: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Decode ``packed [..., K/2]`` and ``scale [..., K/32]`` to ``dtype [..., K]``.

    Products are formed in float32 (exact: 2-bit mantissa times a power of two)
    and cast to ``dtype`` once.
    """
    check_dtype(packed, torch.uint8, "mxfp4 packed weight")
    values = unpack_fp4_blocks(packed, scale, MXFP4_BLOCK, "mxfp4")
    blocks = values * ue8m0_to_float(scale).unsqueeze(-1)
    return blocks.flatten(-2).to(dtype)
