"""A backend's fused router (``FusedOp.router``), asked for through the plugin door and checked at it.

``bind(runner, routing)`` asks the runner's bound fused op for a kernel of ``routing`` (a ``moe_core.routing``
bundle) once, at layer construction, and returns a ``FusedRouter`` or ``None``. ``None`` means "route in
torch": the backend offers no kernel for this routing, or asking it failed — a plugin that raises there is
warned about and routed around, never a reason for a layer not to be built. Each call of a ``FusedRouter``
checks the result's metadata (shapes, dtypes, device: no values, no synchronisation, valid under CUDA-graph
capture) and raises ``BackendError`` naming the backend when it is not what ``routing(logits)`` returns.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch

from moe_core import guard
from moe_core.dtypes import dtype_label
from moe_core.errors import BackendError, PluginError


class FusedRouter:
    """``(ids int32 [M, k], weights float32 [M, k]) = fused(logits [M, E])`` through ``backend``'s kernel."""

    def __init__(self, backend: str, entry, kernel: Callable, routing) -> None:
        self.backend = backend
        self.routing = routing
        self._entry = entry
        self._kernel = kernel

    def __call__(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        result = guard.forward_call(self._entry, "router", self._kernel, logits)
        problem = _mismatch(result, logits, self.routing.top_k)
        if problem:
            raise BackendError(f"backend {self.backend!r}: its fused router returned {problem}")
        return result

    def __repr__(self) -> str:
        return f"FusedRouter({self.backend!r}, {self.routing!r})"


def bind(runner, routing) -> FusedRouter | None:
    """``runner``'s backend's kernel for ``routing`` (``FusedOp.router``), or ``None`` to route in torch."""
    entry = runner.selection.entry
    try:
        kernel = guard.call(entry, "router", runner.fused_op.router, routing)
    except PluginError as exc:
        warnings.warn(f"{exc}; routing in torch ops instead", RuntimeWarning, stacklevel=3)
        return None
    if kernel is None:
        return None
    if not callable(kernel):
        warnings.warn(
            f"{guard.where(entry)}: router returned {type(kernel).__name__}, not a callable; routing in torch ops "
            "instead",
            RuntimeWarning,
            stacklevel=3,
        )
        return None
    return FusedRouter(runner.backend, entry, kernel, routing)


def _mismatch(result, logits: torch.Tensor, top_k: int) -> str:
    """What is wrong with a fused router's result, or ``""``."""
    if not isinstance(result, tuple) or len(result) != 2:
        return f"a {type(result).__name__}, not a pair (topk_ids, topk_weights)"
    shape = (logits.shape[0], top_k)
    for what, t, dtype in (("topk_ids", result[0], torch.int32), ("topk_weights", result[1], torch.float32)):
        if not isinstance(t, torch.Tensor):
            return f"{what} as a {type(t).__name__}, not a tensor"
        if tuple(t.shape) != shape or t.dtype != dtype or t.device != logits.device:
            return (
                f"{what} as a {list(t.shape)} {dtype_label(t.dtype)} tensor on {t.device}, expected "
                f"{list(shape)} {dtype_label(dtype)} on {logits.device}"
            )
    return ""
