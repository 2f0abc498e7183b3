"""``MoeRunner``: one MoE layer bound to one backend's fused op.

Construction does all the thinking: validate the weights against the config,
select the backend (discovering and loading plugins through entry points if
this is the first runner), prepare the weights into the backend's layout once.
A forward then validates tensor metadata, calls the bound ``apply`` and checks
the metadata of what it returned (shape, dtype, device, ``out`` itself) — no
registry lookup, no hook call, no plugin discovery, no synchronisation per call.
Under ``torch.compile`` a call is one opaque op, ``moe::runner`` (``moe_core.compile_ops``), so no
backend's code is traced.
"""

from __future__ import annotations

import torch

from moe_core import compile_ops, guard
from moe_core.config import MoeConfig, MoeProblem
from moe_core.dtypes import dtype_label
from moe_core.errors import BackendError, BackendUnavailableError, PluginError
from moe_core.filters import PluginFilters
from moe_core.plugins import PluginRegistry
from moe_core.requirements import env_flag
from moe_core.selection import Selection, candidates, skip
from moe_core.validation import mask_invalid_ids, validate_expert_ids, validate_forward
from moe_core.weights import MoeWeights, validate_weights


class MoeRunner:
    """Run the routed experts of a MoE layer through one backend.

    >>> runner = MoeRunner(config, weights, backend="auto")   # doctest: +SKIP
    >>> out = runner(hidden_states, topk_ids, topk_weights)    # doctest: +SKIP

    ``backend`` is ``"auto"``, a runner backend name (``"triton"``), a name
    qualified by its distribution (``"moe-triton:triton"``) to choose between
    two distributions that provide the same name, or a ``FusedOp`` subclass
    itself (tests and experiments: no entry point needed).

    Expert ids (the contract in docs/design.md): a pair whose id is -1
    (``validation.UNASSIGNED``, "on another rank") contributes zero on every
    backend. ``check_expert_ids`` rejects any other id outside ``[0, E)`` on
    every forward. Default: always on CPU (free); on CUDA only when
    ``MOE_CHECK_EXPERT_IDS=1``, because it costs two small launches per forward
    and fires as a device-side assertion that ends the process. With the check
    off such an id still contributes zero and is never read past the weights:
    the backend handles it (``FusedOp.handles_invalid_ids``) or the runner
    masks it before ``apply``.

    ``dispatcher``: the ``moe_core.dispatch.Dispatcher`` class whose tokens this runner runs (set by
    ``DispatchedRunner``): ``auto`` skips the backends whose fused op cannot read them, an explicit one that
    cannot is refused here, before any weight is prepared.
    """

    def __init__(
        self,
        config: MoeConfig,
        weights: MoeWeights,
        backend: str | type = "auto",
        *,
        registry: PluginRegistry | None = None,
        check_expert_ids: bool | None = None,
        dispatcher: type | None = None,
    ) -> None:
        if not isinstance(config, MoeConfig):
            raise TypeError(f"config must be a MoeConfig, got {type(config).__name__}")
        device = validate_weights(config, weights)
        self.config = config
        self.device = device
        self.problem = MoeProblem(config, device)
        fall_back = isinstance(backend, str) and backend == "auto"
        self._bind_first(candidates(self.problem, backend, registry, dispatcher), weights, fall_back)
        op = self.selection.op
        # ids outside [0, E): the backend gives them zero itself, or the runner masks them before apply
        self._mask_ids = not op.handles_invalid_ids
        # masking zeroes a pair's routing weight, which zeroes its output unless the weight scales the input
        # and a bias still reaches the output: then -1 is refused and every id is checked
        exact_mask = not (config.apply_router_weight_on_input and config.has_bias)
        self._allow_unassigned = not self._mask_ids or exact_mask
        if check_expert_ids is None:
            check_expert_ids = device.type != "cuda" or env_flag("MOE_CHECK_EXPERT_IDS")
        self.check_expert_ids = check_expert_ids or not self._allow_unassigned
        self._op_key = compile_ops.register(self)  # names this runner to moe::runner under torch.compile

    def __setstate__(self, state) -> None:
        """A copy (``copy.deepcopy``, unpickling) is another runner: its own ``moe::runner`` key."""
        self.__dict__.update(state)
        self._op_key = compile_ops.register(self)

    def _bind_first(self, choices: list[Selection], weights: MoeWeights, fall_back: bool) -> None:
        """Construct the first choice and prepare the weights, both through the plugin door; under ``auto``
        a backend that fails here is skipped (one warning) for the next one."""
        failures = []
        for selection in choices:
            entry = selection.entry
            try:
                self.fused_op = guard.call(entry, "__init__", selection.op, self.problem)
                self.prepared = guard.call(entry, "prepare", self.fused_op.prepare, weights)
            except PluginError as exc:
                if not fall_back:
                    raise
                skip(entry, str(exc), PluginFilters.from_environ().strict, exc)
                failures.append(f"  - {entry.qualified_name}: {exc}")
                continue
            self.selection = selection
            self._apply = self.fused_op.apply
            return
        raise BackendUnavailableError(
            "every backend that supports this problem failed to bind:\n" + "\n".join(failures)
        )

    @property
    def backend(self) -> str:
        """Name of the runner backend this runner is bound to."""
        return self.selection.name

    @property
    def distribution(self) -> str:
        return self.selection.entry.distribution

    def __call__(
        self,
        hidden_states: torch.Tensor,
        topk_ids: torch.Tensor,
        topk_weights: torch.Tensor,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Routed-expert output ``[M, H]`` for ``hidden_states`` ``[M, H]``.

        ``topk_ids`` int32 ``[M, k]`` and ``topk_weights`` float32 ``[M, k]`` as
        produced by ``moe_core.routing``. Writes into ``out`` when given.
        """
        if (
            torch.compiler.is_compiling()
            and isinstance(hidden_states, torch.Tensor)
            and isinstance(topk_weights, torch.Tensor)
            and not compile_ops.records_grad(hidden_states, topk_weights)
        ):  # opaque to Dynamo: the backend runs as eager code runs it (moe_core.compile_ops)
            if out is None:
                cfg = self.config
                out = torch.empty(hidden_states.shape[0], cfg.hidden_size, dtype=cfg.dtype, device=hidden_states.device)
            compile_ops.runner(hidden_states, topk_ids, topk_weights, out, self._op_key)
            return out
        return self._run(hidden_states, topk_ids, topk_weights, out)

    forward = __call__

    def _run(self, hidden_states, topk_ids, topk_weights, out):
        """The call as eager code runs it: check the inputs, the ids, call the backend, check its result."""
        config = self.config
        validate_forward(config, self.device, hidden_states, topk_ids, topk_weights, out)
        if self.check_expert_ids:
            validate_expert_ids(topk_ids, config.num_experts, self._allow_unassigned)
        if self._mask_ids:
            topk_ids, topk_weights = mask_invalid_ids(topk_ids, topk_weights, config.num_experts)
        result = guard.forward_call(
            self.selection.entry, "apply", self._apply, hidden_states, topk_ids, topk_weights, self.prepared, out
        )
        return check_result(self.backend, result, out, hidden_states, config)

    def describe_binding(self, requested: str = "") -> str:
        """One line for an engine's start-up log: the backend, its distribution, the problem, why it was chosen
        (``requested`` where the selection gives no reason, e.g. an engine flag naming the backend). One wording
        for every integration, so operators read the same sentence from SGLang, vLLM and transformers."""
        c = self.config
        why = self.selection.why or requested
        return (
            f"bound moe backend {self.backend!r} ({self.distribution}) for {c.quant_scheme} E={c.num_experts} "
            f"top_k={c.top_k} H={c.hidden_size} I={c.intermediate_size} {c.activation} on {self.device}"
            + (f": {why}" if why else "")
        )

    def __repr__(self) -> str:
        c = self.config
        return (
            f"MoeRunner(backend={self.backend!r}, E={c.num_experts}, top_k={c.top_k}, "
            f"H={c.hidden_size}, I={c.intermediate_size}, scheme={c.quant_scheme!r}, device={self.device})"
        )


def check_result(backend: str, result, out, hidden_states: torch.Tensor, config: MoeConfig):
    """``result`` if it is what ``apply`` must return — ``out`` itself when given, else a tensor of shape
    ``[M, H]`` in ``config.dtype`` on the input's device — else ``BackendError`` naming ``backend`` and the
    mismatch. Metadata only: no synchronisation, no kernel, valid under CUDA-graph capture."""
    if result is out and out is not None:
        return result
    m = hidden_states.shape[0]
    if (
        out is not None
        or not isinstance(result, torch.Tensor)
        or result.shape != (m, config.hidden_size)
        or result.dtype != config.dtype
        or result.device != hidden_states.device
    ):
        raise BackendError(f"backend {backend!r}: {_mismatch(result, out, m, config, hidden_states.device)}")
    return result


def _mismatch(result, out, m: int, config: MoeConfig, device: torch.device) -> str:
    """What is wrong with ``apply``'s result (only called when something is)."""
    if out is not None:
        return f"apply was given out= and returned {_describe(result)} instead of that tensor"
    wanted = f"[{m}, {config.hidden_size}] {dtype_label(config.dtype)} tensor on {device}"
    return f"apply returned {_describe(result)}, expected a {wanted}"


def _describe(t) -> str:
    if not isinstance(t, torch.Tensor):
        return f"a {type(t).__name__}"
    return f"a {list(t.shape)} {dtype_label(t.dtype)} tensor on {t.device}"
