"""Per vLLM MoE layer: does moe serve it, through which backend and why — or why it stays on vLLM's path.

Two moments, both at start-up:

1. ``plan`` (the method's ``create_weights``; weights created, not loaded): the switch is read (``choices``), the
   layer's ``MoeConfig`` is read and moe's selection is asked whether the requested backend supports it on the
   layer's device (``moe_core.select``: the same support check a runner makes, before minutes of weight loading).
2. ``bind`` (``process_weights_after_loading``, before vLLM re-lays the weights out for its kernel): the loaded
   weights are converted to the canonical form and one ``moe_core.MoeRunner`` is built; one log line says which
   backend the layer bound and why.

The rules (README: "What stays on vLLM's path"): a layer moe-vllm cannot serve — an all-to-all or EPLB or LoRA
deployment, data/context parallel MoE, numerics moe cannot express, vLLM's own padding — stays on vLLM's path,
with one log line saying why (a warning when a backend was named, since the operator asked for it). A named moe
backend that does not support the layer on its device is an error: moe's own, naming every backend's reason
(moe's rule: an explicit backend runs or fails; ``auto`` falls back).

Logged under ``vllm.moe_vllm``: inside vLLM's logger tree, so vLLM's handler, format and ``VLLM_LOGGING_LEVEL``
apply and the lines appear in vLLM's start-up log.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from moe_vllm import choices, convert

logger = logging.getLogger("vllm.moe_vllm")

#: the attribute a planned or declined layer carries
ATTR = "_moe_vllm"


@dataclass
class Binding:
    request: choices.Request
    shape: convert.LayerShape | None
    #: why the layer runs on vLLM's own path instead (None: moe serves it)
    declined: str | None = None
    runner: object | None = None  # the bound moe_core.MoeRunner

    @property
    def served(self) -> bool:
        return self.declined is None

    @property
    def bound(self) -> bool:
        return self.served and self.runner is not None


def _name(layer) -> str:
    return f"MoE layer {getattr(layer, 'layer_name', '') or type(layer).__name__}"


def _context(request: choices.Request, layer) -> str:
    return f"moe-vllm ({request}), {_name(layer)}"


def _deployment_reason(layer) -> str | None:
    """Why the layer's parallel deployment is not one moe-vllm serves (None: it is)."""
    moe = layer.moe_config
    par = moe.moe_parallel_config
    if par.use_all2all_kernels:
        return (
            f"its all-to-all backend {par.all2all_backend!r} dispatches tokens in its own format inside vLLM's "
            "modular kernel, which moe-vllm does not replace"
        )
    if par.enable_eplb:
        return "EPLB moves experts between ranks at run time, and the bound runner holds its own copy of the weights"
    if moe.is_lora_enabled:
        return "LoRA adapters on MoE layers run inside vLLM's own experts kernels"
    if par.dp_size > 1 or par.pcp_size > 1 or par.is_sequence_parallel:
        return f"data/context/sequence parallel MoE (dp={par.dp_size}, pcp={par.pcp_size}) was not tested with moe-vllm"
    layer_cls = type(layer).__name__
    if layer_cls != "RoutedExperts":
        return f"its experts module is {layer_cls} (expert substitution or a model's own), not vLLM's RoutedExperts"
    return None


def _decline(layer, request: choices.Request, reason: str) -> Binding:
    binding = Binding(request, None, declined=reason)
    setattr(layer, ATTR, binding)
    level = logging.INFO if request.backend == choices.AUTO else logging.WARNING
    logger.log(level, "moe-vllm: %s stays on vLLM's own path (%s): %s.", _name(layer), request, reason)
    return binding


def plan(layer, request: choices.Request | None = None) -> Binding | None:
    """The binding of a layer whose unquantized method has created its weights; None when the switch is off
    (vLLM's own path, untouched). Raises moe's ``BackendError`` for a named backend that cannot run the layer."""
    request = request or choices.requested()
    if request is None:
        return None
    reason = _deployment_reason(layer)
    if reason is not None:
        return _decline(layer, request, reason)
    try:
        shape = convert.layer_shape(layer)
    except convert.Unservable as exc:
        return _decline(layer, request, str(exc))
    from moe_core import MoeProblem, select
    from moe_core.errors import MoeError

    try:
        select(MoeProblem(shape.config, layer.w13_weight.device), request.backend)
    except MoeError as exc:
        if request.backend == choices.AUTO:
            return _decline(layer, request, f"no moe backend supports it here: {exc}")
        raise type(exc)(f"{_context(request, layer)}: {exc}") from exc
    binding = Binding(request, shape)
    setattr(layer, ATTR, binding)
    return binding


def bind(layer, binding: Binding) -> bool:
    """Convert the loaded weights and bind the layer's moe runner; log which backend and why. False when ``auto``
    found no backend that binds (declined, logged: the caller runs vLLM's own processing instead)."""
    from moe_core import MoeRunner
    from moe_core.errors import MoeError

    request = binding.request
    weights = convert.canonical_weights(layer, binding.shape)
    try:
        runner = MoeRunner(binding.shape.config, weights, backend=request.backend)
    except MoeError as exc:
        if request.backend == choices.AUTO:
            declined = _decline(layer, request, f"no moe backend bound it: {exc}")
            binding.declined = declined.declined
            return False
        raise type(exc)(f"{_context(request, layer)}: {exc}") from exc
    binding.runner = runner
    logger.info("moe-vllm: %s %s", _name(layer), runner.describe_binding(f"requested by {request}"))
    return True
