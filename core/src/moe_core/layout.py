"""Layout conversions between the canonical forms and backends' layouts.

Row order: canonical ``w13`` ``[E, 2I, H]`` (and ``b13`` ``[E, 2I]``) put the
gate rows first. FlashInfer's CUTLASS and trtllm kernels want ``[up; gate]``;
gpt-oss checkpoints and some kernels interleave them (gate, up, gate, up, ...).

Block scales: canonical scales are linear (row-major ``[..., N, K/block]``);
NVIDIA's block-scaled GEMMs read them in the 128x4 tiled order
(``swizzle_128x4`` / ``unswizzle_128x4``).

These helpers do the conversions once, in a backend's ``prepare``; each is
tested against its inverse and against an element-by-element definition.
"""

from __future__ import annotations

import torch


def _check(t: torch.Tensor, dim: int) -> int:
    size = t.shape[dim]
    if size % 2:
        raise ValueError(f"dimension {dim} has odd size {size}; it must hold gate and up halves")
    return size // 2


def swap_gate_up(t: torch.Tensor, dim: int = 1) -> torch.Tensor:
    """``[gate; up]`` <-> ``[up; gate]`` along ``dim`` (its own inverse)."""
    half = _check(t, dim)
    gate, up = t.split(half, dim=dim)
    return torch.cat([up, gate], dim=dim).contiguous()


def deinterleave_gate_up(t: torch.Tensor, dim: int = 1) -> torch.Tensor:
    """Interleaved rows (gate, up, gate, up, ...: gpt-oss checkpoints, SGLang's and vLLM's swiglu layers) ->
    canonical ``[gate; up]`` along ``dim``."""
    _check(t, dim)
    rows = t.movedim(dim, 0)
    return torch.cat([rows[0::2], rows[1::2]]).movedim(0, dim).contiguous()


# ---- 128x4 block-scale swizzle ------------------------------------------------
#
# NVIDIA's block-scaled tensor-core GEMMs (SM100+ ``tcgen05`` block-scaled MMA,
# CUTLASS's ``Sm1xxBlockScaledConfig``, TensorRT-LLM, FlashInfer, vLLM's
# ``cutlass_scaled_fp4_mm``) read per-block scale factors in a "128x4" tiled
# order rather than row-major. For a linear scale matrix ``[R, C]`` (rows = the
# GEMM's N or M dimension, C = K / block) padded with zeros to
# ``Rp = ceil(R/128)*128`` and ``Cp = ceil(C/4)*4``, element ``(r, c)`` is stored
# at flat offset
#
#     (r // 128) * 128 * Cp       # 128-row tile
#   + (c // 4) * 512              # 4-column group inside the tile (128 * 4 bytes)
#   + (r % 32) * 16
#   + ((r % 128) // 32) * 4
#   + (c % 4)
#
# so each 512-byte block holds 32 rows x 4 sub-tiles x 4 columns. This is a
# hardware layout, not any one library's; it lives here because more than one
# backend needs it. Leading dimensions (experts) are swizzled independently.


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def swizzled_128x4_shape(rows: int, cols: int) -> tuple[int, int]:
    """``(Rp, Cp)``: the padded shape of a ``[rows, cols]`` scale matrix in the 128x4 layout."""
    return _round_up(rows, 128), _round_up(cols, 4)


def swizzle_128x4(sf: torch.Tensor) -> torch.Tensor:
    """Linear scales ``[..., R, C]`` -> 128x4-swizzled ``[..., Rp, Cp]`` (zero padded, contiguous).

    The result's memory, flattened per leading index, is the byte order a
    128x4 consumer reads; its ``[Rp, Cp]`` shape is only a container (row
    ``i`` of it is not scale row ``i``). Any dtype (uint8, float8_e4m3fn,
    ...) and device.
    """
    if sf.dim() < 2:
        raise ValueError(f"swizzle_128x4 needs [..., rows, cols], got shape {tuple(sf.shape)}")
    *lead, rows, cols = sf.shape
    rp, cp = swizzled_128x4_shape(rows, cols)
    padded = sf.new_zeros(*lead, rp, cp)
    padded[..., :rows, :cols] = sf
    n = len(lead)
    # (tile, sub = (r%128)//32, r%32, column group, c%4) -> (tile, column group, r%32, sub, c%4)
    tiles = padded.reshape(*lead, rp // 128, 4, 32, cp // 4, 4)
    order = [*range(n), n, n + 3, n + 2, n + 1, n + 4]
    return tiles.permute(order).reshape(*lead, rp, cp).contiguous()


def unswizzle_128x4(swizzled: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """Inverse of ``swizzle_128x4``: ``[..., Rp, Cp]`` swizzled -> linear ``[..., rows, cols]``.

    A flat per-expert buffer (``[..., Rp * Cp]``, as kernels often return it)
    can be passed after ``.reshape(..., Rp, Cp)``.
    """
    rp, cp = swizzled_128x4_shape(rows, cols)
    if swizzled.dim() < 2 or tuple(swizzled.shape[-2:]) != (rp, cp):
        raise ValueError(
            f"a 128x4-swizzled [{rows}, {cols}] scale matrix has shape [..., {rp}, {cp}], got {tuple(swizzled.shape)}"
        )
    lead = swizzled.shape[:-2]
    n = len(lead)
    tiles = swizzled.reshape(*lead, rp // 128, cp // 4, 32, 4, 4)
    order = [*range(n), n, n + 3, n + 2, n + 1, n + 4]
    return tiles.permute(order).reshape(*lead, rp, cp)[..., :rows, :cols].contiguous()
