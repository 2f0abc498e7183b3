"""Row-order conversions between canonical ``[gate; up]`` and backends' layouts.

Canonical ``w13`` ``[E, 2I, H]`` (and ``b13`` ``[E, 2I]``) put the gate rows
first. FlashInfer's CUTLASS and trtllm kernels want ``[up; gate]``; gpt-oss
checkpoints and some kernels interleave them (gate, up, gate, up, ...). These
helpers do the conversions once, in a backend's ``prepare``; each is tested
against its inverse and against an element-by-element definition.
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


def interleave_gate_up(t: torch.Tensor, dim: int = 1) -> torch.Tensor:
    """``[gate; up]`` -> rows ``gate0, up0, gate1, up1, ...`` along ``dim``."""
    half = _check(t, dim)
    gate, up = t.split(half, dim=dim)
    return torch.stack([gate, up], dim=dim + 1).flatten(dim, dim + 1).contiguous()


def deinterleave_gate_up(t: torch.Tensor, dim: int = 1) -> torch.Tensor:
    """Rows ``gate0, up0, gate1, up1, ...`` -> ``[gate; up]`` along ``dim``."""
    half = _check(t, dim)
    pairs = t.unflatten(dim, (half, 2))
    return torch.cat([pairs.select(dim + 1, 0), pairs.select(dim + 1, 1)], dim=dim).contiguous()
