"""``MoeLayer``: a MoE block for serving, as a ``torch.nn.Module`` — router, routed experts, shared experts.

>>> layer = MoeLayer(config, weights, router, shared=shared, backend="auto")   # doctest: +SKIP
>>> out = layer(hidden_states)                                                 # [..., H] -> [..., H]

- **Routing**: ``router(x [M, H]) -> (topk_ids int32 [M, k], topk_weights float32 [M, k])``, e.g. an
  ``HFRouter`` or any function built from ``moe_core.routing``. A router that is an ``nn.Module`` is a
  submodule (``.to()``, ``state_dict`` see it); any other callable is a plain attribute. A router that
  says what it computes — ``router.logits(x)`` and a routing bundle ``router.route`` (``HFRouter`` with
  ``moe_core.routing.SoftmaxTopK``, ``GroupedTopK`` or ``SigmoidTop1``) — is run through the routed
  backend's fused kernel of that bundle where the backend offers one (``FusedOp.router``;
  ``layer.fused_router``, checked at the door by ``moe_core.fused_router``): the gate GEMM, then one kernel
  instead of top-k, softmax and casts. A router whose logits are a linear gate says so too —
  ``router.gate``, ``(weight [E, H], bias [E] or None)`` read at each call, or ``None`` — and a backend
  that also computes the gate GEMM in that kernel (``FusedOp.gated_router``) gets the input and the gate
  instead of the logits when the input has the gate's dtype.
  ``fused_routing=False`` keeps the router's own torch ops.
- **Routed experts**: one ``MoeRunner(config, weights, backend)``; ``apply_router_weight_on_input`` (Llama 4)
  is the runner's and backend's business, the layer only passes the routing weights on.
- **Shared experts** (``SharedExperts``): a dense gated MLP is a MoE of one expert with top-1 routing, so a
  second ``MoeRunner`` runs it through a backend: ``E=1, top_k=1``, the unquantized scheme of
  ``config.dtype`` (quantized routed experts keep the shared MLP in the activation dtype), ids all 0 and
  routing weight 1, or ``sigmoid(x @ gate.T)`` when the shared experts have a gate (Qwen2-MoE), added to
  the routed output. The constant ids and ones are slices of buffers allocated once (``reserve``). The shared
  runner's ``a2a_backend`` is ``"none"``: every rank holds the whole shared MLP, nothing is dispatched.

Over ranks (``parallel``, a ``moe_core.distributed.Parallel``): the routed experts are sharded over the
bundle's process group (tensor parallelism splits ``I``, expert parallelism ``E``) and driven by its
dispatcher (``DispatchedRunner``); each rank keeps only its shard of ``weights`` (or is given its ``Shard``).
A forward takes the tokens this rank brings — the whole batch on every rank for ``replicate``, the rank's
own for ``all_to_all`` — and returns their output. The shared experts are not sharded: every rank holds the
whole shared MLP and runs it on its own tokens. Such a layer stays eager (the dispatchers' collectives are
not captured in its CUDA graphs).

Which backend runs the shared MLP (``shared_backend``):

- ``None`` (default): the routed experts' ``backend`` argument. ``"auto"`` selects on its own (the shared
  problem is an unquantized one that may rank backends differently from a quantized routed one); an explicit
  backend (a name or a ``FusedOp`` class) that *cannot run* the shared problem — its support check says no
  (``BackendUnavailableError``), e.g. an MXFP4-only backend — falls back to ``"auto"``, and
  ``layer.shared_fallback`` keeps that backend's reason. Any other failure (a plugin that raises while
  binding) is raised.
- a backend name or class: exactly that backend, or its error (no fallback).

Memory: the layer keeps no reference to the canonical ``MoeWeights`` (nor to the ``SharedExperts``); each
runner keeps only its backend's prepared weights (``runner.prepared``). Whether those share storage with the
canonical tensors is the backend's choice — the torch backend's prepared weights *are* the canonical ones,
triton's unquantized layout is ``.contiguous()`` of them (the same storage when already contiguous), an
MXFP4 re-layout is new storage — so once the caller drops its canonical weights, one copy remains.

Eager speed (``cuda_graph_max_tokens``, default ``CUDA_GRAPH_MAX_TOKENS``): on CUDA a forward of at most that
many tokens is replayed from a CUDA graph of the whole flat forward, one per token count, captured the second
time that count is seen (``moe_core.graphs`` says when it is not, and why that is safe); 0 keeps every forward
eager. A caller capturing graphs itself gets the plain forward. Under ``torch.compile`` the flat forward is one
opaque op, ``moe::layer`` (``moe_core.compile_ops``), so a compiled model runs the layer as eager code does, its
graphs included, and traces nothing of its backends.

State and devices: the experts' weights are in a backend's prepared layout and bound to the device and
dtype the runners were built for, so they are not parameters or buffers and are not in ``state_dict``
(save canonical weights, or the original checkpoint, instead). ``state_dict`` holds the router's state when
the router is an ``nn.Module`` and the shared gate (``shared_gate``, in ``config.dtype``) when there is one.
``.to()`` / ``.cuda()`` / ``.half()`` and friends are refused with ``InvalidInputError`` when they would move
the layer to another device or dtype (build a new layer there); a call that keeps both (``model.to(device)``
of a model already on that device) passes and applies to the router.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import torch
import torch.nn.functional as F

from moe_core import compile_ops
from moe_core.config import ACTIVATIONS, MoeConfig
from moe_core.dtypes import dtype_label, short_name
from moe_core.errors import BackendUnavailableError, InvalidInputError
from moe_core.fused_router import bind as bind_fused_router
from moe_core.graphs import ForwardGraphs
from moe_core.runner import MoeRunner
from moe_core.weights import MoeWeights, SharedExperts

#: rows of the shared experts' constant routing buffers allocated at construction (grown by doubling)
INITIAL_TOKENS = 256
#: forwards of at most this many tokens on CUDA replay a CUDA graph per token count (``moe_core.graphs``)
CUDA_GRAPH_MAX_TOKENS = 256

Router = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


class MoeLayer(torch.nn.Module):
    """A MoE block: ``router`` -> routed experts (one ``MoeRunner``) + shared experts (a second one).

    ``forward(hidden_states [..., H]) -> [..., H]`` in ``config.dtype``; any leading dims, ``M == 0``
    included. Attributes: ``config``, ``router``, ``runner`` / ``backend`` (the routed experts' runner and
    its backend name), ``shared_runner`` / ``shared_backend`` / ``shared_gate`` (``None`` without shared
    experts), ``shared_fallback`` (why the shared MLP left the routed experts' explicit backend, else
    ``None``), ``fused_router`` (the routed backend's routing kernel, else ``None``), ``device``,
    ``dispatched`` (the ``DispatchedRunner`` of a layer over ranks, else ``None``; its ``runner`` is
    ``runner``). See the module docstring for the shared backend rule, memory and ``state_dict``.
    """

    def __init__(
        self,
        config: MoeConfig,
        weights: MoeWeights,
        router: Router,
        *,
        shared: SharedExperts | None = None,
        backend: str | type = "auto",
        shared_backend: str | type | None = None,
        cuda_graph_max_tokens: int = CUDA_GRAPH_MAX_TOKENS,
        parallel=None,
        fused_routing: bool = True,
    ) -> None:
        super().__init__()
        if not isinstance(config, MoeConfig):
            raise InvalidInputError(f"config must be a MoeConfig, got {type(config).__name__}")
        _check_router(router, config)
        try:
            graphs = ForwardGraphs(cuda_graph_max_tokens, "MoeLayer")
        except ValueError as exc:
            raise InvalidInputError(f"cuda_graph_max_tokens: {exc}") from None
        if shared is not None:
            _check_shared(shared, config, weights)
        self.config = config
        self.router = router  # a submodule when it is an nn.Module (nn.Module.__setattr__), else an attribute
        self.dispatched = None
        if parallel is None:
            self.runner = MoeRunner(config, weights, backend=backend)
        else:
            from moe_core.distributed import Parallel

            if not isinstance(parallel, Parallel):
                raise InvalidInputError(f"parallel must be a distributed.Parallel, got {type(parallel).__name__}")
            self.dispatched = parallel.runner(config, weights, backend)
            self.runner = self.dispatched.runner
        self._routed = self.runner if self.dispatched is None else self.dispatched
        #: the routed backend's kernel for ``router.route`` (``moe_core.fused_router``), else None (torch ops)
        self.fused_router = None
        if fused_routing and callable(getattr(router, "logits", None)) and getattr(router, "route", None) is not None:
            has_gate = getattr(router, "gate", None) is not None
            self.fused_router = bind_fused_router(self.runner, router.route, gate=has_gate)
        self.device = self.runner.device
        self.shared_runner: MoeRunner | None = None
        self.shared_fallback: str | None = None
        self.register_buffer("shared_gate", None)
        if shared is not None:
            self._bind_shared(shared, backend, shared_backend)
        # constant top-1 routing of the shared MLP: expert 0, weight 1; forward slices the first M rows
        self._shared_ids = self._shared_ones = None
        if self.shared_runner is not None:
            self.reserve(INITIAL_TOKENS)
        graphs.label = f"MoeLayer on {self.backend!r}"
        if self.dispatched is not None:
            graphs.disabled = "a layer over ranks runs its dispatcher's collectives eagerly"
        for runner in (self.runner, self.shared_runner):
            if runner is not None and not runner.fused_op.capturable and graphs.disabled is None:
                graphs.disabled = f"backend {runner.backend!r} cannot be captured in a CUDA graph (FusedOp.capturable)"
        self.graphs = graphs
        self._op_key = compile_ops.register(self)  # names this layer to moe::layer under torch.compile

    def __setstate__(self, state) -> None:
        """A copy (``copy.deepcopy``, unpickling) is another layer: its own ``moe::layer`` key."""
        super().__setstate__(state)
        self._op_key = compile_ops.register(self)

    def _bind_shared(self, shared: SharedExperts, backend, shared_backend) -> None:
        config = self.config
        shared_config = MoeConfig(
            num_experts=1,
            top_k=1,
            hidden_size=config.hidden_size,
            intermediate_size=shared.intermediate_size,
            quant_scheme=short_name(config.dtype),
            activation=shared.activation or config.activation,
            dtype=config.dtype,
            swiglu_alpha=config.swiglu_alpha,
            swiglu_limit=config.swiglu_limit,
        )
        shared_weights = MoeWeights(w13=shared.w13[None], w2=shared.w2[None])  # views: no copy
        # the ids are built here (all 0), so the per-forward id check would only cost time
        build = lambda b: MoeRunner(shared_config, shared_weights, backend=b, check_expert_ids=False)
        if shared_backend is not None:
            self.shared_runner = build(shared_backend)
        elif isinstance(backend, str) and backend == "auto":
            self.shared_runner = build("auto")
        else:
            try:
                self.shared_runner = build(backend)
            except BackendUnavailableError as exc:
                self.shared_fallback = str(exc)
                self.shared_runner = build("auto")
        if shared.gate is not None:
            self.shared_gate = shared.gate.detach().to(config.dtype)

    @property
    def backend(self) -> str:
        """The routed experts' runner backend."""
        return self.runner.backend

    @property
    def shared_backend(self) -> str | None:
        """The shared experts' runner backend (``None`` without shared experts)."""
        return None if self.shared_runner is None else self.shared_runner.backend

    def reserve(self, num_tokens: int) -> None:
        """Allocate the shared MLP's constant routing for ``num_tokens`` tokens now (a forward with more grows
        it by doubling): call it before capturing a CUDA graph of a larger batch."""
        if self.shared_runner is None or (self._shared_ids is not None and self._shared_ids.shape[0] >= num_tokens):
            return
        self._shared_ids = torch.zeros(num_tokens, 1, dtype=torch.int32, device=self.device)
        self._shared_ones = torch.ones(num_tokens, 1, dtype=torch.float32, device=self.device)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        config = self.config
        h = config.hidden_size
        if not isinstance(hidden_states, torch.Tensor):
            raise InvalidInputError(f"hidden_states must be a torch.Tensor, got {type(hidden_states).__name__}")
        if hidden_states.dim() == 0 or hidden_states.shape[-1] != h:
            raise InvalidInputError(
                f"hidden_states must be [..., {h}] (hidden size {h}), got {list(hidden_states.shape)}"
            )
        if hidden_states.dtype != config.dtype:
            raise InvalidInputError(
                f"hidden_states has dtype {dtype_label(hidden_states.dtype)}, "
                f"the layer computes in {dtype_label(config.dtype)}"
            )
        x = hidden_states.reshape(-1, h).contiguous()
        if torch.compiler.is_compiling() and not compile_ops.records_grad(x, *self.parameters()):
            out = compile_ops.layer(x, self._op_key)  # opaque to Dynamo: run as eager code runs it
        else:
            out = self._flat(x)
        return out.view(hidden_states.shape)

    def _flat(self, x: torch.Tensor) -> torch.Tensor:
        """The flat forward ``[M, H] -> [M, H]`` as eager code runs it: from a graph where one applies."""
        if self.shared_runner is not None and x.shape[0] > self._shared_ids.shape[0]:
            self.reserve(max(x.shape[0], 2 * self._shared_ids.shape[0]))  # never inside a graph capture
        return self.graphs.run(x, self._forward, self._graph_tensors, self._graph_keep)

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        """The flat forward ``[M, H] -> [M, H]``, eager or under capture (``self.graphs``)."""
        fused = self.fused_router
        if fused is not None:
            with torch.no_grad():
                gate = self.router.gate if fused.takes_gate else None
                if gate is not None and gate[0].dtype == x.dtype:
                    topk_ids, topk_weights = fused.gated(x, *gate)
                else:
                    topk_ids, topk_weights = fused(self.router.logits(x))
        else:
            topk_ids, topk_weights = self.router(x)
        out = self._routed(x, topk_ids, topk_weights)
        if self.shared_runner is not None:
            m = x.shape[0]
            if self.shared_gate is None:
                shared_weights = self._shared_ones[:m]
            else:
                shared_weights = torch.sigmoid(F.linear(x, self.shared_gate).float())
            shared_out = self.shared_runner(x, self._shared_ids[:m], shared_weights)
            # in place into the routed output (ours); bound after the call, so that torch.compile resuming
            # after a graph break inside the runner does not hold a bound ``out.add_`` across it
            out = out.add_(shared_out)
        return out

    def _graph_tensors(self):
        return itertools.chain(self.parameters(), self.buffers())

    def _graph_keep(self):
        """What a graph captured now reads besides parameters, buffers and prepared weights."""
        return (self._shared_ids, self._shared_ones)

    def _apply(self, fn, recurse=True):
        """``.to()``, ``.cuda()``, ``.half()``, ...: refused when they would change the device or dtype the
        runners were bound to (their prepared weights cannot follow), else applied (to the router)."""
        probe = fn(torch.empty(0, dtype=self.config.dtype, device=self.device))
        if isinstance(probe, torch.Tensor) and (probe.device != self.device or probe.dtype != self.config.dtype):
            raise InvalidInputError(
                f"MoeLayer is bound to backend {self.backend!r} on {self.device} in "
                f"{dtype_label(self.config.dtype)} (its experts are in that backend's prepared layout); it cannot "
                f"move to {probe.device} in {dtype_label(probe.dtype)}: build a new MoeLayer from canonical "
                f"weights there"
            )
        return super()._apply(fn, recurse)

    def extra_repr(self) -> str:
        c = self.config
        parts = [
            f"backend={self.backend!r}",
            f"E={c.num_experts}, top_k={c.top_k}, H={c.hidden_size}, I={c.intermediate_size}",
            f"scheme={c.quant_scheme!r}, activation={c.activation!r}, dtype={dtype_label(c.dtype)}",
        ]
        if c.apply_router_weight_on_input:
            parts.append("router_weight_on_input=True")
        if self.shared_runner is not None:
            sc = self.shared_runner.config
            gated = "gated" if self.shared_gate is not None else "ungated"
            parts.append(
                f"shared=(I={sc.intermediate_size}, {gated}, activation={sc.activation!r}, "
                f"backend={self.shared_backend!r})"
            )
        if not isinstance(self.router, torch.nn.Module):
            parts.append(f"router={_describe_router(self.router)}")
        if self.fused_router is not None:
            parts.append(f"fused_router={self.fused_router.backend!r}")
        if self.dispatched is not None:
            grid = self.dispatched.grid
            parts.append(f"parallel=(tp={grid.tp_size}, ep={grid.ep_size}, rank={grid.rank}, "
                         f"dispatcher={self.dispatched.dispatcher.name!r})")  # fmt: skip
        parts.append(f"device={self.device}")
        return ", ".join(parts)


def _describe_router(router) -> str:
    """A function by its qualified name, anything else by its repr (``HFRouter(E=8, H=128, ...)``)."""
    return getattr(router, "__qualname__", None) or repr(router)


def _check_router(router, config: MoeConfig) -> None:
    """A callable; where it says its sizes (``HFRouter``: ``num_experts``, ``hidden_size``), the config's."""
    if not callable(router):
        raise InvalidInputError(
            f"router must be a callable hidden_states [M, H] -> (topk_ids, topk_weights), got {type(router).__name__}"
        )
    for attr, wanted in (("num_experts", config.num_experts), ("hidden_size", config.hidden_size)):
        have = getattr(router, attr, None)
        if isinstance(have, int) and not isinstance(have, bool) and have != wanted:
            raise InvalidInputError(f"router has {attr}={have}, but the config has {attr}={wanted}")


def _check_shared(shared: SharedExperts, config: MoeConfig, weights: MoeWeights) -> None:
    """Shared experts that fit the layer: shapes for ``H``, the activation dtype, the routed weights' device."""
    if not isinstance(shared, SharedExperts):
        raise InvalidInputError(f"shared must be a SharedExperts, got {type(shared).__name__}")
    for name in ("w13", "w2"):
        t = getattr(shared, name)
        if not isinstance(t, torch.Tensor):
            raise InvalidInputError(f"shared experts' {name} must be a torch.Tensor, got {type(t).__name__}")
    if shared.gate is not None and not isinstance(shared.gate, torch.Tensor):
        raise InvalidInputError(f"shared experts' gate must be a torch.Tensor, got {type(shared.gate).__name__}")
    shared.validate(config.hidden_size)
    if shared.w13.dtype != config.dtype:
        raise InvalidInputError(
            f"shared experts' weights are {dtype_label(shared.w13.dtype)}, but the layer computes in "
            f"{dtype_label(config.dtype)}: the shared MLP runs unquantized in the activation dtype "
            f"(convert them with .to({config.dtype}))"
        )
    device = getattr(weights, "w13", None)
    if isinstance(device, torch.Tensor) and shared.w13.device != device.device:
        raise InvalidInputError(
            f"shared experts are on {shared.w13.device}, but the routed experts are on {device.device}"
        )
    if shared.activation is not None and shared.activation not in ACTIVATIONS:
        raise InvalidInputError(
            f"shared experts' activation {shared.activation!r} is unknown; known: {', '.join(ACTIVATIONS)}"
        )
