"""The gated activations, each formula written once.

Input is the first GEMM's output ``h13`` ``[..., 2I]`` whose first half is the
gate and second half the up projection (canonical ``[gate; up]`` row order);
output is ``[..., I]``. Every backend is judged against these.

- ``silu``: SwiGLU, ``silu(gate) * up``.
- ``gelu``: GeGLU with the exact (erf) GELU, ``gelu(gate) * up``.
- ``swiglu_oai``: gpt-oss: ``gate`` clamped above at ``limit``, ``up`` clamped
  to ``[-limit, limit]``, then ``gate * sigmoid(alpha * gate) * (up + 1)``;
  alpha 1.702 and limit 7.0 by default.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def silu_and_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return F.silu(gate) * up


def gelu_and_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return F.gelu(gate) * up


def swiglu_oai(gate: torch.Tensor, up: torch.Tensor, alpha: float = 1.702, limit: float = 7.0) -> torch.Tensor:
    gate = gate.clamp(max=limit)
    up = up.clamp(min=-limit, max=limit)
    return gate * torch.sigmoid(alpha * gate) * (up + 1)


def apply_activation(name: str, h13: torch.Tensor, *, alpha: float = 1.702, limit: float = 7.0) -> torch.Tensor:
    """Split ``h13`` into ``[gate; up]`` halves and apply the named activation."""
    gate, up = h13.chunk(2, dim=-1)
    if name == "silu":
        return silu_and_mul(gate, up)
    if name == "gelu":
        return gelu_and_mul(gate, up)
    if name == "swiglu_oai":
        return swiglu_oai(gate, up, alpha=alpha, limit=limit)
    raise ValueError(f"unknown activation {name!r}")
