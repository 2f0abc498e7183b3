"""The plugin contract: what a backend's fused MoE op declares and provides.

A backend subclasses ``FusedOp``, fills in the class attributes that declare
what it supports, and implements ``prepare`` and ``apply``. The runner asks
``check(problem)`` before constructing it; ``check`` fails closed with a reason
(the model is flashinfer's ``check_support``): every declared capability is
compared with the problem, then the backend's own ``probe`` looks at the
machine (CUDA capability, library version) without importing heavy modules.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch

from moe_core.config import MoeProblem
from moe_core.dtypes import dtype_label
from moe_core.hookspecs import API_VERSION  # noqa: F401  (re-exported)
from moe_core.weights import MoeWeights


@dataclass(frozen=True)
class Support:
    """The answer of a support check: ``ok``, or not with a ``reason``.

    ``automatic`` is False for "supported, but do not pick me automatically" (``explicit_only``): an explicit
    ``backend=`` request binds it, ``backend="auto"`` passes over it and says why (``reason``) — for a
    backend whose first use would start a long build, say."""

    ok: bool
    reason: str = ""
    automatic: bool = True

    @classmethod
    def yes(cls) -> Support:
        return cls(True, "")

    @classmethod
    def no(cls, reason: str) -> Support:
        return cls(False, reason)

    @classmethod
    def explicit_only(cls, reason: str) -> Support:
        """Runs the problem when asked for by name; ``auto`` does not choose it, for ``reason``."""
        return cls(True, reason, automatic=False)

    def __bool__(self) -> bool:
        return self.ok


def _names(values) -> str:
    return ", ".join(sorted(dtype_label(v) if isinstance(v, torch.dtype) else str(v) for v in values)) or "none"


class FusedOp:
    """Base class of every backend's fused MoE op (one per (a2a, runner) key).

    Lifetime: ``check`` (classmethod, cheap) -> ``__init__(problem)`` ->
    ``prepare(weights)`` once -> ``apply(...)`` per forward. ``apply`` must not
    look anything up: it is the hot path. ``warmup`` (classmethod, optional)
    does slow one-time work ahead of all of that (``moe warmup``).
    """

    #: runner backend name, equal to the plugin's entry-point name
    name: ClassVar[str]
    #: a2a backends this op serves ("none" = pure tensor parallel)
    a2a_backends: ClassVar[tuple[str, ...]] = ("none",)
    #: the formats of dispatched tokens ``apply`` accepts (``moe_core.dispatch.FORMATS``): a dispatcher whose
    #: ``format`` is not among them is refused with this op (``moe_core.dispatch.check_formats``)
    dispatch_formats: ClassVar[tuple[str, ...]] = ("token_major_local_ids",)
    #: larger wins in ``backend="auto"`` where nothing was measured (``moe select``); the torch reference uses 0.
    #: ``priority_for`` may make it depend on the problem and device
    priority: ClassVar[int] = 0
    quant_schemes: ClassVar[frozenset[str]] = frozenset()
    activations: ClassVar[frozenset[str]] = frozenset({"silu"})
    #: dtypes of hidden_states / output
    activation_dtypes: ClassVar[frozenset[torch.dtype]] = frozenset({torch.bfloat16})
    device_types: ClassVar[frozenset[str]] = frozenset({"cuda"})
    #: CUDA compute capabilities as (major, minor); None = any
    compute_capabilities: ClassVar[frozenset[tuple[int, int]] | None] = None
    supports_bias: ClassVar[bool] = False
    supports_router_weight_on_input: ClassVar[bool] = False
    #: hidden and intermediate sizes must be multiples of this
    size_alignment: ClassVar[int] = 1
    #: True when ``apply`` gives every (token, slot) pair whose expert id lies outside ``[0, E)`` a zero
    #: contribution and never reads memory for it (the expert-id contract in docs/design.md). When False
    #: the runner masks such pairs itself before ``apply`` (id 0, routing weight 0): two small elementwise
    #: ops per forward that a backend declaring True does not pay.
    handles_invalid_ids: ClassVar[bool] = False
    #: True when ``apply`` on CUDA only enqueues work on the current stream: no host synchronisation, no
    #: host data copied per call, nothing computed on the host from tensor values. ``MoeLayer`` then replays
    #: small forwards from CUDA graphs (``moe_core.graphs``); False keeps its forwards eager. A backend that
    #: claims True wrongly fails its first capture, which is warned about and turns graphs off for that layer.
    capturable: ClassVar[bool] = True

    # ---- support ------------------------------------------------------------
    @classmethod
    def priority_for(cls, problem: MoeProblem) -> float:
        """This op's ``auto`` priority for ``problem`` (a supported one); default ``priority``. Override to rank
        differently by problem or device (a kernel that is only good at some shapes, or on some GPUs)."""
        return cls.priority

    @classmethod
    def check(cls, problem: MoeProblem) -> Support:
        """Whether this op can run ``problem`` here; the first failing fact otherwise."""
        cfg = problem.config
        if cfg.a2a_backend not in cls.a2a_backends:
            return Support.no(f"a2a backend {cfg.a2a_backend!r} not served (serves: {_names(cls.a2a_backends)})")
        if cfg.quant_scheme not in cls.quant_schemes:
            return Support.no(
                f"quant scheme {cfg.quant_scheme!r} not supported (supports: {_names(cls.quant_schemes)})"
            )
        if cfg.activation not in cls.activations:
            return Support.no(f"activation {cfg.activation!r} not supported (supports: {_names(cls.activations)})")
        if cfg.dtype not in cls.activation_dtypes:
            return Support.no(
                f"activation dtype {dtype_label(cfg.dtype)} not supported (supports: {_names(cls.activation_dtypes)})"
            )
        if cfg.has_bias and not cls.supports_bias:
            return Support.no("expert biases (b13/b2) not supported")
        if cfg.apply_router_weight_on_input and not cls.supports_router_weight_on_input:
            return Support.no("router weight applied on the input not supported")
        for attr in ("hidden_size", "intermediate_size"):
            if getattr(cfg, attr) % cls.size_alignment:
                return Support.no(f"{attr}={getattr(cfg, attr)} is not a multiple of {cls.size_alignment}")
        device = problem.device
        if device.type not in cls.device_types:
            return Support.no(f"device type {device.type!r} not supported (supports: {_names(cls.device_types)})")
        if device.type == "cuda":
            if not torch.cuda.is_available():
                return Support.no("no CUDA device is available (torch.cuda.is_available() is False)")
            if cls.compute_capabilities is not None:
                cap = torch.cuda.get_device_capability(device)
                if tuple(cap) not in cls.compute_capabilities:
                    wanted = ", ".join(f"SM{a}{b}" for a, b in sorted(cls.compute_capabilities))
                    return Support.no(f"compute capability SM{cap[0]}{cap[1]} not supported (needs {wanted})")
        return cls.probe(problem)

    @classmethod
    def probe(cls, problem: MoeProblem | None) -> Support:
        """Backend-specific checks (library present, version range, ...).

        Called last by ``check`` with the problem, and by ``available`` with
        ``None`` (the question "can this backend run on this machine at all").
        Must stay cheap: read package metadata, do not import kernels.
        """
        return Support.yes()

    @classmethod
    def available(cls) -> Support:
        """Whether the op can run on this machine at all (``moe backends --check``)."""
        machine = cls._device_present()
        return machine if not machine else cls.probe(None)

    @classmethod
    def _device_present(cls) -> Support:
        if "cpu" in cls.device_types:
            return Support.yes()
        if "cuda" in cls.device_types:
            if not torch.cuda.is_available():
                return Support.no("no CUDA device is available (torch.cuda.is_available() is False)")
            if cls.compute_capabilities is not None:
                caps = {tuple(torch.cuda.get_device_capability(i)) for i in range(torch.cuda.device_count())}
                if not caps & set(cls.compute_capabilities):
                    have = ", ".join(f"SM{a}{b}" for a, b in sorted(caps))
                    wanted = ", ".join(f"SM{a}{b}" for a, b in sorted(cls.compute_capabilities))
                    return Support.no(f"compute capability {have} not supported (needs {wanted})")
            return Support.yes()
        return Support.no(f"no supported device type here (supports: {_names(cls.device_types)})")

    # ---- ahead-of-time work -------------------------------------------------
    @classmethod
    def warmup(cls, progress: Callable[[str], None] | None = None) -> Support:
        """Do this op's slow one-time work now instead of in the first runner.

        What ``moe warmup BACKEND`` calls: building JIT-compiled kernels,
        fetching kernel binaries, filling caches — on this machine, for its
        devices. ``progress`` receives human-readable status lines (may be
        None). Returns ``Support`` that is ok when the op is ready (its
        ``reason`` may say what was done), or not ok with the reason it could
        not be warmed up here. Default: ok, nothing to do.
        """
        return Support(True, "nothing to warm up")

    @classmethod
    def tune(
        cls, presets: list[str], scheme: str, tokens: list[int], output: Path | None = None, device: str = "cuda"
    ) -> Path | None:
        """Time candidate kernel configurations on ``device`` and write a tuned table (``moe tune``).

        ``presets`` name ``moe_core.presets`` shapes, ``tokens`` the token counts to tune for; ``output`` is
        the table to write or merge into (None: the backend's own default place). Returns the path
        written, or None when the backend has nothing to tune (the default).
        """
        return None

    # ---- the op -------------------------------------------------------------
    def __init__(self, problem: MoeProblem) -> None:
        self.problem = problem
        self.config = problem.config

    def prepare(self, weights: MoeWeights) -> Any:
        """Convert canonical weights to this backend's layout, once. Default: as is."""
        return weights

    def router(self, routing) -> Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]] | None:
        """A fused kernel for ``routing`` (a ``moe_core.routing`` bundle: ``SoftmaxTopK``, ``GroupedTopK``,
        ``SigmoidTop1``) on this op's device, or ``None`` (the default): the layer then routes with ``routing``
        itself, in torch ops.

        Why: a router in torch ops is several kernels (top-k, softmax, casts) whose launches and memory
        round trips cost as much as a small GEMM; a backend that has the whole choice in one kernel offers
        it here. The callable takes router logits ``[M, E]`` (the gate's dtype) and returns what
        ``routing(logits)`` returns — int32 ids and float32 weights ``[M, k]`` on the logits' device, the
        same k experts per token in any order, the same weights up to float32 rounding — enqueuing only
        device work (it runs inside the layer's CUDA graphs). Asked once per layer, through the plugin door;
        the layer checks each result's metadata (``moe_core.fused_router``)."""
        return None

    def gated_router(self, routing) -> Callable[..., tuple[torch.Tensor, torch.Tensor]] | None:
        """The gate GEMM and ``routing`` in one kernel, or ``None`` (the default): the layer then computes the
        logits itself and calls ``router(routing)``'s kernel on them. Asked only where ``router(routing)``
        offered a kernel and the layer's router says its logits are a linear gate (``router.gate``).

        Why: at prefill the gate GEMM (N = E, too narrow to fill the GPU) and the choice are two launches
        and a round trip of the logits through memory. The callable takes ``(x [M, H], weight [E, H],
        bias [E] or None)``, all of ``x``'s dtype, and returns what ``routing(F.linear(x, weight, bias))``
        returns (the logits rounded to ``x``'s dtype as ``F.linear`` rounds them), under the same rules as
        ``router``'s kernel; the layer reads ``router.gate`` at each call, so the kernel must not keep it."""
        return None

    def apply(
        self,
        hidden_states: torch.Tensor,
        topk_ids: torch.Tensor,
        topk_weights: torch.Tensor,
        prepared: Any,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Compute the routed-experts output ``[M, H]`` (into ``out`` when given)."""
        raise NotImplementedError(f"{type(self).__name__}.apply is not implemented")
