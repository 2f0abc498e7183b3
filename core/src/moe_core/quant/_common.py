"""Helpers shared by the quantizers: input checks (one place for the messages) and exact division."""

from __future__ import annotations

import torch

from moe_core.errors import InvalidInputError


def check_float_input(w, what: str, min_dim: int = 1) -> None:
    """Raise ``InvalidInputError`` unless ``w`` is a finite floating-point tensor.

    Done once per quantizer call (one device sync) so the element encoders can
    assume finite input.
    """
    if not isinstance(w, torch.Tensor):
        raise InvalidInputError(f"{what} must be a torch.Tensor, got {type(w).__name__}")
    if not w.is_floating_point():
        raise InvalidInputError(f"{what} must be a floating-point tensor, got {w.dtype}")
    if w.dim() < min_dim:
        raise InvalidInputError(f"{what} needs at least {min_dim} dimension(s), got shape {tuple(w.shape)}")
    if not bool(torch.isfinite(w).all()):
        raise InvalidInputError(f"{what} contains NaN or Inf; only finite values can be quantized")


def check_multiple(k: int, block: int, what: str) -> None:
    """Raise unless the last dimension ``k`` is a multiple of the scale block."""
    if k % block:
        raise InvalidInputError(f"{what}: last dimension K={k} must be a multiple of {block}")


def check_dtype(t, dtype: torch.dtype, what: str) -> None:
    """Raise unless ``t`` is a tensor of exactly ``dtype``."""
    if not isinstance(t, torch.Tensor):
        raise InvalidInputError(f"{what} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != dtype:
        raise InvalidInputError(f"{what} must have dtype {dtype}, got {t.dtype}")


def div_const(x: torch.Tensor, c: float) -> torch.Tensor:
    """``x / c`` correctly rounded on every device.

    On CUDA, dividing by a Python scalar multiplies by its rounded reciprocal,
    which can differ from true division by an ulp (and from the CPU result);
    dividing by a 0-dim tensor on ``x``'s device divides for real.
    """
    return x / torch.tensor(c, dtype=x.dtype, device=x.device)
