"""Activation quantization that a scheme implies, simulated in float.

Two schemes quantize the *inputs* of both GEMMs, not only the weights:
``fp8_block`` (per token, per 128-element group, E4M3 — DeepSeek-V3's w8a8)
and ``nvfp4`` (W4A4: E2M1 with an E4M3 scale per 16 elements and one dynamic
fp32 global scale per tensor from its amax). The reference backend and the
float64 oracle apply the same quantize-then-dequantize round trip here, so a
backend is compared with what its arithmetic should give, not with an
unquantized ideal it cannot reach.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from moe_core.quant.fp8 import dequantize_fp8_per_token_group, quantize_fp8_per_token_group
from moe_core.quant.nvfp4 import dequantize_nvfp4, quantize_nvfp4


def _fp8_token_group(x: torch.Tensor) -> torch.Tensor:
    q, scale = quantize_fp8_per_token_group(x, group=128)
    return dequantize_fp8_per_token_group(q, scale, group=128, dtype=x.dtype)


def _nvfp4_dynamic(x: torch.Tensor) -> torch.Tensor:
    if x.numel() == 0:
        return x
    packed, scale, global_scale = quantize_nvfp4(x)
    return dequantize_nvfp4(packed, scale, global_scale, dtype=x.dtype)


_ACT_QUANT: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "fp8_block": _fp8_token_group,
    "nvfp4": _nvfp4_dynamic,
}


def activation_fake_quant(scheme: str) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """The round trip applied to each GEMM's input for ``scheme``, or None."""
    return _ACT_QUANT.get(scheme)
