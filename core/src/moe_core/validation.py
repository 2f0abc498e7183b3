"""Checks on a forward's inputs, run before any kernel.

Metadata only (shape, dtype, device, strides): nothing here reads tensor
values, so the checks cost no device synchronisation and stay valid inside
CUDA-graph capture and ``torch.compile``.
"""

from __future__ import annotations

import torch

from moe_core.config import MoeConfig
from moe_core.dtypes import dtype_label
from moe_core.errors import InvalidInputError


def validate_forward(
    config: MoeConfig,
    device: torch.device,
    hidden_states: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    out: torch.Tensor | None,
) -> None:
    for name, t in (("hidden_states", hidden_states), ("topk_ids", topk_ids), ("topk_weights", topk_weights)):
        if not isinstance(t, torch.Tensor):
            raise InvalidInputError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if hidden_states.dim() != 2 or hidden_states.shape[1] != config.hidden_size:
        raise InvalidInputError(f"hidden_states must be [M, {config.hidden_size}], got {list(hidden_states.shape)}")
    m = hidden_states.shape[0]
    if hidden_states.dtype != config.dtype:
        raise InvalidInputError(
            f"hidden_states has dtype {dtype_label(hidden_states.dtype)}, "
            f"the layer computes in {dtype_label(config.dtype)}"
        )
    expected = [m, config.top_k]
    if list(topk_ids.shape) != expected:
        raise InvalidInputError(f"topk_ids must be {expected} ([M, top_k]), got {list(topk_ids.shape)}")
    if list(topk_weights.shape) != expected:
        raise InvalidInputError(f"topk_weights must be {expected} ([M, top_k]), got {list(topk_weights.shape)}")
    if topk_ids.dtype != torch.int32:
        raise InvalidInputError(
            f"topk_ids must be int32, got {dtype_label(topk_ids.dtype)} (convert with .to(torch.int32))"
        )
    if topk_weights.dtype != torch.float32:
        raise InvalidInputError(
            f"topk_weights must be float32, got {dtype_label(topk_weights.dtype)} (convert with .float())"
        )
    for name, t in (("hidden_states", hidden_states), ("topk_ids", topk_ids), ("topk_weights", topk_weights)):
        if t.device != device:
            raise InvalidInputError(f"{name} is on {t.device}, but the layer's weights are on {device}")
    if out is not None:
        if not isinstance(out, torch.Tensor):
            raise InvalidInputError(f"out must be a torch.Tensor, got {type(out).__name__}")
        if out.shape != (m, config.hidden_size) or out.dtype != config.dtype or out.device != device:
            raise InvalidInputError(
                f"out must be a [{m}, {config.hidden_size}] {dtype_label(config.dtype)} tensor on {device}, got "
                f"{list(out.shape)} {dtype_label(out.dtype)} on {out.device}"
            )
        if not out.is_contiguous():
            raise InvalidInputError("out must be contiguous")
        if m:  # every tensor is non-empty and on one device here
            lo, hi = _span(out)
            for name, t in (("hidden_states", hidden_states), ("topk_ids", topk_ids), ("topk_weights", topk_weights)):
                start, end = _span(t)
                if start < hi and lo < end:
                    raise InvalidInputError(f"out must not share memory with {name}")


def _span(t: torch.Tensor) -> tuple[int, int]:
    """The bytes ``[start, end)`` that ``t`` can touch: a range check catches a view that starts elsewhere in
    the same buffer, which an identity check misses (strides are never negative in torch)."""
    start = t.data_ptr()
    if t.is_contiguous():
        return start, start + t.numel() * t.element_size()
    extent = 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True))
    return start, start + extent * t.element_size()


#: the expert id that marks a (token, slot) pair as "not assigned here" (expert parallelism's
#: marker for an expert on another rank): it contributes zero on every backend
UNASSIGNED = -1


def validate_expert_ids(topk_ids: torch.Tensor, num_experts: int, allow_unassigned: bool = True) -> None:
    """Expert ids must lie in ``[0, num_experts)``, or be ``UNASSIGNED`` (-1) when allowed.

    This reads values, so it is not free: on CPU it raises ``InvalidInputError``;
    on CUDA it queues a device-side assertion (``torch._assert_async``) that
    does not synchronise and can be captured in a CUDA graph, but aborts the
    process when it fires.
    """
    if topk_ids.numel() == 0:
        return
    floor = UNASSIGNED if allow_unassigned else 0
    lo, hi = topk_ids.aminmax()
    allowed = f"[0, {num_experts})" + (f" or {UNASSIGNED}" if allow_unassigned else "")
    if topk_ids.device.type == "cuda":
        torch._assert_async((lo >= floor) & (hi < num_experts), f"topk_ids must lie in {allowed}")
        return
    lo, hi = int(lo), int(hi)
    if lo < floor or hi >= num_experts:
        raise InvalidInputError(f"topk_ids must lie in {allowed}, found values in [{lo}, {hi}]")


def mask_invalid_ids(
    topk_ids: torch.Tensor, topk_weights: torch.Tensor, num_experts: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pairs with ids outside ``[0, num_experts)`` get an id inside it and routing weight 0: a zero
    contribution for a backend that does not handle such ids itself, without reading any value on the host."""
    # three elementwise kernels (clamp, compare, fill): each launch costs more than its work at decode
    safe = topk_ids.clamp(0, num_experts - 1)
    return safe, topk_weights.masked_fill(safe != topk_ids, 0.0)
