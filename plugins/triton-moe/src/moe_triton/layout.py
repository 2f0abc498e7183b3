"""The triton backend's prepared weights: what ``TritonFusedOp.prepare`` builds once per layer.

bf16/fp16/fp32 and fp8_block keep the canonical layout (made contiguous). MXFP4
is re-laid out so the GEMM main loop needs no nibble interleave (join/reshape):

- **packed** ``[E, N, Kp/2]`` uint8, ``Kp`` = K rounded up to ``MXFP4_CHUNK`` (64;
  the padding is code 0 = 0.0). Inside each 64-wide chunk of K, chunk byte ``j`` (0..31)
  holds k = ``j`` in its low nibble and k = ``32 + j`` in its high nibble. A
  chunk's low nibbles are therefore the chunk's first 32 K rows and its high
  nibbles the last 32, so the kernel decodes both halves of a byte tile in place
  and issues two dots (``x[:, first half] @ lo`` and ``x[:, second half] @ hi``).
  The 32 chunk bytes are stored in **fragment order** (``FRAGMENT_ORDER``): position
  ``16s + 4c + 2h + e`` holds chunk byte ``16s + 8h + 2c + e``. An MMA lane ``c`` (of 4 per row)
  holds k = ``2c, 2c+1, 2c+8, 2c+9`` of each 16 of K as a register operand, so its 4 bytes of each
  16-byte half are adjacent: the swapped GEMMs (and any tile that feeds Hopper's warp-group MMA)
  read them with wide shared-memory loads and put K back in order in registers, where in chunk
  order each lane read 2 bytes at a time; the smaller tiles' MMA, which takes K in any order,
  decodes the bytes as stored and reads its activations in the same order
  (``kernels.gemm._rows_chunk``).
  Every low nibble of a chunk belongs to one MX scale group (the chunk's even
  group), every high nibble to the next one, so each half tile is scaled by one
  ``[N]`` row: no reshape of the scales either.
- **scale** ``[E, Kp/64, N]`` int32: per chunk and weight row, the folded bf16
  scales of the chunk's two groups as one 32-bit word (the even group, the low
  nibbles', in its low half). One 4-byte load per row and chunk is what lets
  Triton's pipeliner stage the scales through shared memory with the weight
  bytes (it leaves loads narrower than 32 bits in the loop, where every
  iteration waits for them). Folded value ``2**(s - 1 - D_e)`` for UE8M0 byte ``s``. The kernel
  decodes E2M1 with bit ops only: ``(sign << 15) | (mag << 6)`` read as bf16 is
  ``value * 2**-126`` for all 16 codes (the subnormal 0.5 included), so the
  ``2**126`` is folded into the scale here.
- **mult** ``[E]`` fp32 ``2**D_e``, applied to the accumulator. ``D_e`` is 0
  unless expert ``e`` has a scale byte above 128 (a group amax above 12), whose
  folded value ``2**(s-1)`` would overflow; then the expert's folded scales are
  shifted down by ``D_e`` and the shift is undone after the dot (exact: powers
  of two).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from moe_core import MoeWeights
from moe_core.quant.fp4 import pack_fp4, unpack_fp4
from moe_core.quant.mxfp4 import UE8M0_BIAS, UE8M0_NAN, pow2_float32
from moe_triton.launch_args import GemmWeights

#: K values per re-laid-out MXFP4 chunk; every MXFP4 BLOCK_K is a multiple of it.
MXFP4_CHUNK = 64
#: stored position p of a chunk's 32 bytes -> the chunk byte it holds (see the module docstring)
FRAGMENT_ORDER = tuple((p & 16) | ((p & 2) << 2) | ((p & 12) >> 1) | (p & 1) for p in range(MXFP4_CHUNK // 2))
#: Largest UE8M0 byte whose folded scale 2**(s-1) is a finite float (2**127).
_MAX_FOLDED_BYTE = 128
#: The E2M1 bit trick yields value * 2**-E2M1_BITS_SHIFT.
E2M1_BITS_SHIFT = 126


@dataclass
class TritonWeights:
    """Weights in the kernels' layout (see the module docstring); biases stay canonical."""

    scheme: str
    w13: torch.Tensor
    w2: torch.Tensor
    w13_scale: torch.Tensor | None = None
    w2_scale: torch.Tensor | None = None
    b13: torch.Tensor | None = None
    b2: torch.Tensor | None = None
    #: MXFP4 only: per-expert fp32 multiplier 2**D_e of the folded scales
    w13_mult: torch.Tensor | None = None
    w2_mult: torch.Tensor | None = None

    def gemm1(self) -> GemmWeights:
        """GEMM1's weight side (gate and up projections) as the launches take it."""
        return GemmWeights(self.scheme, self.w13, self.w13_scale, self.w13_mult, self.b13)

    def gemm2(self) -> GemmWeights:
        """GEMM2's weight side (down projection) as the launches take it."""
        return GemmWeights(self.scheme, self.w2, self.w2_scale, self.w2_mult, self.b2)

    def shapes(self) -> tuple:
        """(scheme, ((field, shape, stride, dtype) or (field, None), ...)): all a kernel's compilation reads
        of these weights, without their values (small, picklable: what the tuner's compile workers get)."""
        tensors = tuple(
            (f.name, None) if (t := getattr(self, f.name)) is None else (f.name, tuple(t.shape), t.stride(), t.dtype)
            for f in fields(self)
            if f.name != "scheme"
        )
        return self.scheme, tensors

    @classmethod
    def zeros(cls, shapes: tuple, device) -> TritonWeights:
        """Zero-filled weights of ``shapes()``'s layout: the same launches compile the same kernels, and
        building them costs their own size (random weights are drawn in float32 and quantized first)."""
        scheme, tensors = shapes
        made = {}
        for name, *layout in tensors:
            if layout[0] is not None:
                shape, stride, dtype = layout
                made[name] = torch.empty_strided(shape, stride, dtype=dtype, device=device).zero_()
        return cls(scheme, **made)


def e2m1_bits_bf16(codes: torch.Tensor) -> torch.Tensor:
    """E2M1 codes (uint8, low nibble) as the bf16 the kernel builds: ``value * 2**-126``."""
    c = codes.to(torch.int32)
    bits = ((c & 8) << 12) | ((c & 7) << 6)
    return bits.to(torch.int16).view(torch.bfloat16)


def permute_mxfp4_packed(packed: torch.Tensor) -> torch.Tensor:
    """Canonical ``[E, N, K/2]`` (even k low) -> chunked ``[E, N, Kp/2]`` (first half low, second high),
    each chunk's bytes in fragment order."""
    e, n, half = packed.shape
    k = 2 * half
    kp = -(-k // MXFP4_CHUNK) * MXFP4_CHUNK
    order = torch.tensor(FRAGMENT_ORDER, device=packed.device)
    out = torch.empty(e, n, kp // 2, dtype=torch.uint8, device=packed.device)
    for i in range(e):  # one expert at a time: the unpacked codes are 2x the packed bytes
        codes = torch.nn.functional.pad(unpack_fp4(packed[i]), (0, kp - k))
        chunks = codes.view(n, kp // MXFP4_CHUNK, 2, MXFP4_CHUNK // 2)
        out[i] = (chunks[:, :, 0] | (chunks[:, :, 1] << 4))[..., order].reshape(n, kp // 2)
    return out


def unpermute_mxfp4_packed(packed: torch.Tensor, k: int) -> torch.Tensor:
    """Inverse of ``permute_mxfp4_packed`` (drops the K padding)."""
    e, n, kp_half = packed.shape
    inverse = torch.argsort(torch.tensor(FRAGMENT_ORDER, device=packed.device))
    packed = packed.view(e, n, -1, MXFP4_CHUNK // 2)[..., inverse]
    lo, hi = packed & 0xF, packed >> 4
    chunks = torch.stack((lo, hi), dim=3)
    codes = chunks.reshape(e, n, 2 * kp_half)[..., :k]
    return pack_fp4(codes.contiguous())


def fold_mxfp4_scale(scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """UE8M0 ``[E, N, K/32]`` -> (folded pairs int32 ``[E, Kp/64, N]``, per-expert fp32 ``2**D_e`` ``[E]``)."""
    groups = scale.shape[2]
    kp_groups = -(-groups * 32 // MXFP4_CHUNK) * MXFP4_CHUNK // 32
    s = scale.to(torch.int32)
    finite = scale != UE8M0_NAN
    top = torch.where(finite, s, torch.zeros_like(s)).amax(dim=(1, 2))
    shift = (top - _MAX_FOLDED_BYTE).clamp(min=0)  # D_e
    exponent = s - UE8M0_BIAS + E2M1_BITS_SHIFT - shift[:, None, None]
    folded = pow2_float32(exponent)
    folded = torch.where(finite, folded, torch.full_like(folded, float("nan"))).to(torch.bfloat16)
    folded = torch.nn.functional.pad(folded, (0, kp_groups - groups))
    e, n, _ = folded.shape
    pairs = folded.reshape(e, n, kp_groups // 2, 2).transpose(1, 2).contiguous()  # [E, Kp/64, N, 2]
    return pairs.view(torch.int32).reshape(e, kp_groups // 2, n), pow2_float32(shift).contiguous()


def scale_groups(folded: torch.Tensor) -> torch.Tensor:
    """The folded bf16 scales ``[E, N, Kp/32]`` (group order) of ``fold_mxfp4_scale``'s paired words."""
    e, chunks, n = folded.shape
    pairs = folded.contiguous().view(torch.bfloat16).reshape(e, chunks, n, 2)
    return pairs.transpose(1, 2).reshape(e, n, 2 * chunks)


def unfold_mxfp4_scale(folded: torch.Tensor, mult: torch.Tensor, groups: int) -> torch.Tensor:
    """Inverse of ``fold_mxfp4_scale`` for finite scales: UE8M0 bytes ``[E, N, groups]``."""
    _, exp = torch.frexp(scale_groups(folded).float()[..., :groups])  # 2**x has frexp exponent x + 1
    _, shift = torch.frexp(mult)
    s = exp - 1 + UE8M0_BIAS - E2M1_BITS_SHIFT + (shift - 1)[:, None, None]
    return s.to(torch.uint8)


def prepare_weights(scheme: str, weights: MoeWeights) -> TritonWeights:
    """Canonical ``MoeWeights`` -> ``TritonWeights`` (copies; the canonical weights are untouched)."""
    w = {k: v.contiguous() for k, v in weights.tensors().items()}
    out = TritonWeights(scheme, w["w13"], w["w2"], w.get("w13_scale"), w.get("w2_scale"), w.get("b13"), w.get("b2"))
    if scheme == "mxfp4":
        out.w13 = permute_mxfp4_packed(out.w13)
        out.w2 = permute_mxfp4_packed(out.w2)
        out.w13_scale, out.w13_mult = fold_mxfp4_scale(out.w13_scale)
        out.w2_scale, out.w2_mult = fold_mxfp4_scale(out.w2_scale)
    return out
