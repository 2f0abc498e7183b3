"""A backend's fused router (``FusedOp.router``), asked for through the plugin door and checked at it.

``bind(runner, routing, gate=...)`` asks the runner's bound fused op for a kernel of ``routing`` (a
``moe_core.routing`` bundle) once, at layer construction, and — with ``gate`` (the layer's router computes
its logits with a linear gate) — for one that computes the gate GEMM too (``FusedOp.gated_router``); it
returns a ``FusedRouter`` or ``None``. ``None`` means "route in
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
    """``(ids int32 [M, k], weights float32 [M, k]) = fused(logits [M, E])`` through ``backend``'s kernel, and
    ``fused.gated(x, weight, bias)`` through its gate-and-choice kernel where it has one (``takes_gate``)."""

    def __init__(self, backend: str, entry, kernel: Callable, routing, gate_kernel: Callable | None = None) -> None:
        self.backend = backend
        self.routing = routing
        self._entry = entry
        self._kernel = kernel
        self._gate_kernel = gate_kernel
        #: whether ``gated`` may be called: the backend computes the gate GEMM too
        self.takes_gate = gate_kernel is not None

    def __call__(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        result = guard.forward_call(self._entry, "router", self._kernel, logits)
        problem = _mismatch(result, logits, self.routing.top_k)
        if problem:
            raise BackendError(f"backend {self.backend!r}: its fused router returned {problem}")
        return result

    def gated(
        self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``routing(F.linear(x, weight, bias))`` in the backend's one kernel (only where ``takes_gate``)."""
        result = guard.forward_call(self._entry, "gated_router", self._gate_kernel, x, weight, bias)
        problem = _mismatch(result, x, self.routing.top_k)
        if problem:
            raise BackendError(f"backend {self.backend!r}: its gated router returned {problem}")
        return result

    def __repr__(self) -> str:
        return f"FusedRouter({self.backend!r}, {self.routing!r})"


def bind(runner, routing, *, gate: bool = False) -> FusedRouter | None:
    """``runner``'s backend's kernel for ``routing`` (``FusedOp.router``), or ``None`` to route in torch; with
    ``gate``, also its kernel of the gate GEMM and ``routing`` (``FusedOp.gated_router``) where it has one."""
    entry = runner.selection.entry
    kernel = _ask(entry, "router", runner.fused_op.router, routing, "routing in torch ops instead")
    if kernel is None:
        return None
    gate_kernel = None
    if gate:
        gate_kernel = _ask(entry, "gated_router", runner.fused_op.gated_router, routing, "computing the gate apart")
    return FusedRouter(runner.backend, entry, kernel, routing, gate_kernel)


def _ask(entry, hook: str, method, routing, instead: str) -> Callable | None:
    """The plugin's kernel from ``method(routing)``, or ``None`` (none offered, or a failure warned about)."""
    try:
        kernel = guard.call(entry, hook, method, routing)
    except PluginError as exc:
        warnings.warn(f"{exc}; {instead}", RuntimeWarning, stacklevel=4)
        return None
    if kernel is not None and not callable(kernel):
        warnings.warn(
            f"{guard.where(entry)}: {hook} returned {type(kernel).__name__}, not a callable; {instead}",
            RuntimeWarning,
            stacklevel=4,
        )
        return None
    return kernel


def _mismatch(result, logits: torch.Tensor, top_k: int) -> str:
    """What is wrong with a fused router's result for ``logits`` (or the gated router's ``x``: the same rows
    and device), or ``""``."""
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
