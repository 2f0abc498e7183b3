"""DeepSeek-style FP8 (float8_e4m3fn): 2-D block scales for weights, per-token groups for activations.

Both use ``value = q * scale`` with ``scale = amax / 448`` (448 = E4M3 max), so
the largest element of a block maps to +-448. Dimensions need not be multiples
of the block: edge blocks are partial (padded with zeros internally, which
does not change their amax) and still get one scale each.

Zero handling differs on purpose, following the references:
* weights: a block whose scale is 0 (all zeros, or amax so small that
  ``amax / 448`` underflows) gets scale 1.0, which decodes its zeros exactly;
* activations: amax is clamped below by ``eps`` (1e-10, as vLLM/SGLang's
  ``per_token_group_quant_fp8``), so a zero row gets scale ``eps / 448``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from moe_core.errors import InvalidInputError
from moe_core.quant._common import check_dtype, check_float_input, div_const
from moe_core.schemes import SCHEMES

#: Largest finite float8_e4m3fn value.
FP8_MAX = float(torch.finfo(torch.float8_e4m3fn).max)
#: Default weight scale block (rows along N, columns along K).
FP8_WEIGHT_BLOCK: tuple[int, int] = SCHEMES["fp8_block"].scale_block
#: Default activation group along K.
FP8_ACT_GROUP = 128
#: Lower clamp of an activation group's amax.
FP8_ACT_EPS = 1e-10


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _to_fp8(x: torch.Tensor) -> torch.Tensor:
    """Saturate to +-448 (quotients can exceed it by an ulp) and round to nearest even."""
    return x.clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)


def _check_block(block, what: str) -> tuple[int, int]:
    bn, bk = (int(b) for b in block)
    if bn <= 0 or bk <= 0:
        raise InvalidInputError(f"{what}: block sizes must be positive, got {tuple(block)}")
    return bn, bk


def quantize_fp8_block(w: torch.Tensor, block: tuple[int, int] = FP8_WEIGHT_BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize ``w [..., N, K]`` to ``(q e4m3 [..., N, K], scale fp32 [..., ceil(N/bn), ceil(K/bk)])``."""
    check_float_input(w, "fp8_block input", min_dim=2)
    bn, bk = _check_block(block, "fp8_block")
    n, k = w.shape[-2:]
    nb, kb = _ceil_div(n, bn), _ceil_div(k, bk)
    padded = F.pad(w.float(), (0, kb * bk - k, 0, nb * bn - n))
    blocks = padded.reshape(*w.shape[:-2], nb, bn, kb, bk)
    scale = div_const(blocks.abs().amax(dim=(-3, -1)), FP8_MAX)
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = _to_fp8(blocks / scale[..., :, None, :, None])
    return q.reshape(padded.shape)[..., :n, :k].contiguous(), scale


def dequantize_fp8_block(
    q: torch.Tensor,
    scale: torch.Tensor,
    block: tuple[int, int] = FP8_WEIGHT_BLOCK,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Decode ``q [..., N, K]`` with ``scale [..., ceil(N/bn), ceil(K/bk)]`` to ``dtype``."""
    check_dtype(q, torch.float8_e4m3fn, "fp8_block weight")
    check_dtype(scale, torch.float32, "fp8_block scale")
    bn, bk = _check_block(block, "fp8_block")
    if q.dim() < 2:
        raise InvalidInputError(f"fp8_block weight needs shape [..., N, K], got {tuple(q.shape)}")
    n, k = q.shape[-2:]
    expected = (*q.shape[:-2], _ceil_div(n, bn), _ceil_div(k, bk))
    if tuple(scale.shape) != expected:
        raise InvalidInputError(f"fp8_block scale has shape {tuple(scale.shape)}, expected {expected}")
    full = scale.repeat_interleave(bn, dim=-2)[..., :n, :].repeat_interleave(bk, dim=-1)[..., :k]
    return (q.float() * full).to(dtype)


def quantize_fp8_per_token_group(
    x: torch.Tensor, group: int = FP8_ACT_GROUP, eps: float = FP8_ACT_EPS
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize activations ``x [..., K]`` to ``(q e4m3 [..., K], scale fp32 [..., ceil(K/group)])``.

    ``scale = max(group_amax, eps) / 448``; the last group may be partial.
    """
    check_float_input(x, "fp8 activation")
    _, group = _check_block((1, group), "fp8 per-token-group")
    k = x.shape[-1]
    kb = _ceil_div(k, group)
    padded = F.pad(x.float(), (0, kb * group - k))
    groups = padded.reshape(*x.shape[:-1], kb, group)
    scale = div_const(groups.abs().amax(dim=-1).clamp(min=eps), FP8_MAX)
    q = _to_fp8(groups / scale.unsqueeze(-1))
    return q.reshape(padded.shape)[..., :k].contiguous(), scale


def dequantize_fp8_per_token_group(
    q: torch.Tensor, scale: torch.Tensor, group: int = FP8_ACT_GROUP, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """Decode ``q [..., K]`` with ``scale [..., ceil(K/group)]`` to ``dtype``."""
    check_dtype(q, torch.float8_e4m3fn, "fp8 activation")
    check_dtype(scale, torch.float32, "fp8 activation scale")
    _, group = _check_block((1, group), "fp8 per-token-group")
    if q.dim() == 0:
        raise InvalidInputError("fp8 activation needs at least one dimension")
    k = q.shape[-1]
    expected = (*q.shape[:-1], _ceil_div(k, group))
    if tuple(scale.shape) != expected:
        raise InvalidInputError(f"fp8 activation scale has shape {tuple(scale.shape)}, expected {expected}")
    return (q.float() * scale.repeat_interleave(group, dim=-1)[..., :k]).to(dtype)
