"""NVFP4: E2M1 elements, an E4M3 scale per 16 along K, an fp32 global scale.

Convention (ModelOpt's ``weight_scale_2``, also ``MoeWeights.w*_global_scale``):
``value = e2m1 * float(scale_e4m3) * global_scale``, so the global scale is a
DEQUANTIZATION multiplier. There is one per index of the leading dims (all
but the last two): ``[E]`` for ``[E, N, K]`` weights, 0-dim for ``[N, K]``.
By default it is ``amax / (448 * 6)`` so the largest block scale lands at 448,
the E4M3 maximum; an all-zero weight gets 1.0 (any value decodes zeros).
"""

from __future__ import annotations

import torch

from moe_core.errors import InvalidInputError
from moe_core.quant._common import check_dtype, check_float_input, check_multiple, div_const
from moe_core.quant.fp4 import E2M1_MAX, float_to_e2m1, pack_fp4, unpack_fp4_blocks
from moe_core.schemes import SCHEMES

#: Elements per E4M3 scale along K.
NVFP4_BLOCK = SCHEMES["nvfp4"].scale_block[1]
#: Largest finite float8_e4m3fn value.
E4M3_MAX = float(torch.finfo(torch.float8_e4m3fn).max)


def default_global_scale(w: torch.Tensor) -> torch.Tensor:
    """``amax / (448 * 6)`` per leading index (float32, shape ``w.shape[:-2]``); 1.0 where amax is 0."""
    amax = w.float().abs().amax(dim=(-2, -1))
    return torch.where(amax > 0, div_const(amax, E4M3_MAX * E2M1_MAX), torch.ones_like(amax))


def _as_global_scale(global_scale, lead: torch.Size, device) -> torch.Tensor:
    gs = torch.as_tensor(global_scale, dtype=torch.float32, device=device)
    try:
        gs = gs.expand(lead).clone()
    except RuntimeError:
        raise InvalidInputError(
            f"nvfp4 global_scale of shape {tuple(gs.shape)} does not fit the leading dims {tuple(lead)}"
        ) from None
    if not bool((torch.isfinite(gs) & (gs > 0)).all()):
        raise InvalidInputError("nvfp4 global_scale must be finite and positive")
    return gs


def quantize_nvfp4(
    w: torch.Tensor, global_scale: torch.Tensor | float | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Quantize ``w [..., N, K]`` to ``(packed uint8 [..., N, K/2], scale e4m3 [..., N, K/16], gs)``.

    Block scale = ``(block_amax / 6) / global_scale`` clamped to 448 and rounded
    to E4M3 by ``.to(torch.float8_e4m3fn)`` (nearest even); elements are
    ``x / (float(scale) * global_scale)`` rounded with ``float_to_e2m1``. A block
    whose scale is (or rounds to) zero gets zero codes. A caller-given
    ``global_scale`` too small for the data saturates (scales at 448, codes at 6).
    K must be a multiple of 16; non-finite input raises ``InvalidInputError``.
    """
    check_float_input(w, "nvfp4 input", min_dim=2)
    k = w.shape[-1]
    check_multiple(k, NVFP4_BLOCK, "nvfp4")
    lead = w.shape[:-2]
    if global_scale is None:
        gs = default_global_scale(w)
    else:
        gs = _as_global_scale(global_scale, lead, w.device)
    gs_b = gs[..., None, None]
    blocks = w.float().reshape(*w.shape[:-1], k // NVFP4_BLOCK, NVFP4_BLOCK)
    block_scale = div_const(blocks.abs().amax(dim=-1), E2M1_MAX) / gs_b
    scale = block_scale.clamp(max=E4M3_MAX).to(torch.float8_e4m3fn)
    denom = (scale.float() * gs_b).unsqueeze(-1)
    scaled = torch.where(denom > 0, blocks / denom, torch.zeros_like(blocks))
    codes = float_to_e2m1(scaled)
    return pack_fp4(codes.reshape(w.shape)), scale, gs


def dequantize_nvfp4(
    packed: torch.Tensor,
    scale: torch.Tensor,
    global_scale: torch.Tensor | float,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Decode to ``dtype [..., N, K]``: ``(e2m1 * float(scale)) * global_scale``, in float32."""
    check_dtype(packed, torch.uint8, "nvfp4 packed weight")
    check_dtype(scale, torch.float8_e4m3fn, "nvfp4 scale")
    if packed.dim() < 2:
        raise InvalidInputError(f"nvfp4 packed weight needs shape [..., N, K/2], got {tuple(packed.shape)}")
    values = unpack_fp4_blocks(packed, scale, NVFP4_BLOCK, "nvfp4")
    gs = torch.as_tensor(global_scale, dtype=torch.float32, device=packed.device)
    if gs.dim() > values.dim() - 3:
        raise InvalidInputError(f"nvfp4 global_scale of shape {tuple(gs.shape)} has too many dims")
    blocks = values * scale.float().unsqueeze(-1)
    return (blocks.flatten(-2) * gs[..., None, None]).to(dtype)
