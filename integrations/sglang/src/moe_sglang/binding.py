"""Per SGLang MoE layer: does moe serve it, through which backend and why — or what happens instead.

Two moments, both at start-up:

1. ``plan`` (the quantization method's ``create_moe_runner``; weights created, not loaded): the layer's
   ``MoeConfig`` is read and moe's selection is asked whether the requested backend supports it on the layer's
   device (``moe_core.select``: the same support check a runner makes, before minutes of weight loading). A
   layer is planned, declined to SGLang's own path, or refused with a sentence (the rules below).
2. ``bind`` (``process_weights_after_loading``, before SGLang re-lays the weights out): the loaded weights are
   converted to the canonical form and one ``moe_core.MoeRunner`` is built and attached to the layer's runner
   core; one log line says which backend the layer bound and why.

The rules (README: "What it cannot serve"):

- ``--moe-a2a-backend`` other than ``none``: refused (its dispatch formats carry tokens moe cannot read).
- a layer whose numerics moe cannot express (an activation it lacks, uncombined outputs, ...): with ``moe``
  (auto) an unquantized layer runs on SGLang's own path and the log says so; every other case is refused,
  because an explicit ``moe:<backend>`` either runs or fails (moe's rule), and the quantized methods have no
  own path for a runner-backend name they do not know.
- a quantization method moe-sglang does not convert: refused by ``check_constructed`` (same reason).
- the requested moe backend does not support the layer here: moe's own error, naming every backend's reason.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from moe_sglang import choices, convert

logger = logging.getLogger("moe_sglang")

#: the attribute a planned or declined layer carries
ATTR = "_moe_sglang"


class BridgeError(RuntimeError):
    """A layer ``--moe-runner-backend moe...`` was asked to run but cannot; the message says why."""


@dataclass
class Binding:
    choice: str
    #: moe's backend request: "auto" or a backend name
    backend: str
    shape: convert.LayerShape | None
    #: why the layer runs on SGLang's own path instead (None: moe serves it)
    declined: str | None = None
    core: object | None = None  # the layer's MoeBridgeRunnerCore
    runner: object | None = None  # the bound moe_core.MoeRunner

    @property
    def served(self) -> bool:
        return self.declined is None


def requested() -> tuple[str, str] | None:
    """``(choice, moe backend)`` when ``--moe-runner-backend`` is one of moe-sglang's, else None."""
    from sglang.srt.layers.moe.utils import get_moe_runner_backend

    choice = get_moe_runner_backend().value
    backend = choices.moe_backend(choice)
    return None if backend is None else (choice, backend)


def _name(layer) -> str:
    prefix = getattr(layer, "layer_name", "") or type(layer).__name__
    return f"MoE layer {getattr(layer, 'layer_id', '?')} ({prefix})"


def _refuse(layer, choice: str, reason: str) -> BridgeError:
    return BridgeError(f"--moe-runner-backend {choice} cannot run {_name(layer)}: {reason}.")


def plan(method, layer) -> Binding | None:
    """The binding of a layer whose quantization method is building its runner; None when the runner backend is
    not moe-sglang's (SGLang's own path, untouched). Raises ``BridgeError`` or moe's ``BackendError``."""
    asked = requested()
    if asked is None:
        return None
    choice, backend = asked
    from sglang.srt.layers.moe.utils import get_moe_a2a_backend

    a2a = get_moe_a2a_backend().value
    if a2a != "none":
        raise _refuse(
            layer,
            choice,
            f"--moe-a2a-backend {a2a} dispatches tokens in its own format, and moe-sglang reads SGLang's "
            "standard dispatch only (use --moe-a2a-backend none: pure TP, or EP with -1 for other ranks' experts)",
        )
    try:
        shape = convert.layer_shape(layer, method)
    except convert.Unservable as exc:
        if backend == "auto" and type(method).__name__ == "UnquantizedFusedMoEMethod":
            binding = Binding(choice, backend, None, declined=str(exc))
            setattr(layer, ATTR, binding)
            logger.info("moe-sglang: %s runs on SGLang's own path, not moe: %s", _name(layer), exc)
            return binding
        raise _refuse(layer, choice, str(exc)) from None
    _check_support(layer, choice, backend, shape)
    binding = Binding(choice, backend, shape)
    setattr(layer, ATTR, binding)
    return binding


def _check_support(layer, choice: str, backend: str, shape: convert.LayerShape) -> None:
    """moe's support check for the layer on its device, before its weights are loaded."""
    from moe_core import MoeProblem, select
    from moe_core.errors import MoeError

    try:
        select(MoeProblem(shape.config, layer.w13_weight.device), backend)
    except MoeError as exc:
        raise type(exc)(f"--moe-runner-backend {choice}, {_name(layer)}: {exc}") from exc


def bind(layer, binding: Binding) -> None:
    """Convert the loaded weights and bind the layer's moe runner; log which backend and why."""
    from moe_core import MoeRunner
    from moe_core.errors import MoeError

    core = binding.core
    weights = convert.canonical_weights(layer, binding.shape)
    try:
        runner = MoeRunner(binding.shape.config, weights, backend=binding.backend)
    except MoeError as exc:
        raise type(exc)(f"--moe-runner-backend {binding.choice}, {_name(layer)}: {exc}") from exc
    rc = layer.moe_runner_config
    scale = rc.routed_scaling_factor
    fused = getattr(layer, "should_fuse_routed_scaling_factor_in_topk", False)
    core.output_scale = None if scale in (None, 1.0) or fused else float(scale)
    core.runner = runner
    binding.runner = runner
    logger.info(
        "moe-sglang: %s %s",
        _name(layer),
        runner.describe_binding(f"requested by --moe-runner-backend {binding.choice}"),
    )


def check_constructed(layer) -> None:
    """After a ``FusedMoE`` is built: under a moe runner backend every layer is planned or declined; one that is
    neither has a quantization method moe-sglang does not hook, which has no path for our backend name."""
    asked = requested()
    if asked is None or getattr(layer, ATTR, None) is not None:
        return
    method = getattr(layer, "quant_method", None)
    try:
        convert.scheme_of(method)
        reason = f"its quantization method {type(method).__name__} never built a runner"
    except convert.Unservable as exc:
        reason = str(exc)
    raise _refuse(layer, asked[0], reason)
