"""A layer's small forwards replayed from CUDA graphs: ``ForwardGraphs``.

Why: an eager MoE forward at decode is bound by the host — the router's few ops, the runner's checks and a
backend's kernel launches cost hundreds of µs of Python and launch work around tens of µs of GPU work, and
transformers users rarely capture graphs of their own. One graph per token count replays the whole forward
(router, routed and shared experts) as one launch: copy the input into the graph's static input, replay,
copy the static output out.

A graph of ``M`` tokens is captured the *second* time a forward of ``M`` tokens runs: the first runs eagerly,
so kernels compile and tune, tables load and any lazily built state of the router or backend exists before
a capture (where allocations come from the graph's pool and kernels do not run). The forward runs eagerly,
without a graph, when:

- the input is not on a CUDA device, or has more than ``max_tokens`` tokens, or ``max_tokens`` is 0;
- autograd would record (grad mode on and the input or a parameter of the layer requires grad);
- the caller is capturing a CUDA graph (its graph takes the kernels directly) or ``torch.compile`` traces the
  forward (only one that autograd records: otherwise the layer is one op, ``moe_core.compile_ops``);
- ``MAX_GRAPHS`` token counts already have a graph (later counts stay eager: prompts of many lengths must not
  each cost a capture);
- a parameter or buffer of the layer was replaced by another tensor since a graph was captured (updated in
  place, as ``load_state_dict`` does, is fine): the layer's graphs are dropped and captured anew;
- a backend of the layer is not ``FusedOp.capturable``, or a capture failed before (a router or backend that
  synchronises with the host, for example: warned once, the layer is eager from then on).

Memory: a layer's graphs share one private memory pool. That is safe because a graph's output is copied out
right after its replay, on the same stream, before any other graph of the layer runs, so what a later capture
reuses of an earlier graph's memory is never read across a replay; static inputs are ordinary allocations,
outside the pool. Calls of one layer on several streams at once are therefore not supported (ordered calls on
any stream are). A graph keeps references to every buffer it reads that the layer might replace later (the
shared experts' constant routing grows by reallocation).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch

#: token counts per layer that get a graph; later counts run eagerly
MAX_GRAPHS = 32

Forward = Callable[[torch.Tensor], torch.Tensor]


class ForwardGraphs:
    """Per-token-count CUDA graphs of one layer's flat forward ``[M, H] -> [M, H]`` (see the module docstring).

        ``run(x, forward, tensors, keep)`` returns ``forward(x)``, replayed from a graph where one applies;
        ``tensors()`` yields the layer's parameters and buffers (autograd check; a graph is dropped when one of
        them was replaced rather than updated in place); ``keep()`` returns the other objects a graph captured
        now reads and must keep alive. Attributes: ``max_tokens`` (may be changed at any time: graphs of more
    tokens are then neither replayed nor captured); ``graphs`` (token count -> its graph, read-only for
        callers); ``disabled`` (why the layer's forwards stay eager — a backend that is not ``capturable``, a failed
        capture — else None).
    """

    def __init__(self, max_tokens: int, label: str) -> None:
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 0:
            raise ValueError(f"the CUDA graph token limit must be an int >= 0, got {max_tokens!r}")
        self.max_tokens = max_tokens
        self.label = label
        self.graphs: dict[int, _Graph] = {}
        self.disabled: str | None = None
        self._seen: set[int] = set()
        self._pool = None

    def run(self, x: torch.Tensor, forward: Forward, tensors: Callable, keep: Callable) -> torch.Tensor:
        if torch.compiler.is_compiling():
            return forward(x)
        m = x.shape[0]
        if not (self.disabled is None and 0 < m <= self.max_tokens and x.is_cuda):
            return forward(x)
        graph = self.graphs.get(m)
        state = list(tensors())
        if not self._replayable(x, state):
            return forward(x)
        where = tuple(t.data_ptr() for t in state)
        if graph is not None:
            if graph.where == where:
                return graph.replay(x)
            self.graphs.clear()  # a parameter or buffer was replaced (not updated in place): capture anew
            self._seen.clear()
            self._pool = None  # freed with its last graph: a capture into its handle trips the allocator
        if m not in self._seen or len(self.graphs) >= MAX_GRAPHS:
            self._seen.add(m)
            return forward(x)
        graph = self._capture(m, x, forward, (state, keep()), where)
        return forward(x) if graph is None else graph.replay(x)

    @staticmethod
    def _replayable(x: torch.Tensor, state: list[torch.Tensor]) -> bool:
        if torch.cuda.is_current_stream_capturing():
            return False
        return not (torch.is_grad_enabled() and (x.requires_grad or any(t.requires_grad for t in state)))

    def _capture(self, m: int, x: torch.Tensor, forward: Forward, kept, where: tuple) -> _Graph | None:
        """A graph of ``forward`` on a static copy of ``x``, or None after a failed capture (warned; graphs off).

        The capture runs on a side stream ordered after the current one (CUDA cannot capture the legacy
        default stream) and does not synchronise the device, collect garbage or empty the allocator's cache,
        which ``torch.cuda.graph`` does on entry: a model captures one graph per layer and token count."""
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        static_x = x.detach().clone()  # an ordinary allocation: outside the pool
        graph = torch.cuda.CUDAGraph()
        current = torch.cuda.current_stream(x.device)
        side = torch.cuda.Stream(x.device)
        side.wait_stream(current)
        try:
            with torch.cuda.stream(side):
                graph.capture_begin(pool=self._pool, capture_error_mode="thread_local")
                try:
                    static_out = forward(static_x)
                finally:
                    graph.capture_end()  # raises when the capture was invalidated (a host sync, say)
        except Exception as exc:  # any failure turns graphs off for this layer, with its reason
            current.wait_stream(side)
            self.disabled = f"capturing a CUDA graph of {m} token(s) failed: {type(exc).__name__}: {exc}"
            warnings.warn(f"{self.label}: {self.disabled}; this layer runs eagerly from now on", RuntimeWarning, 3)
            return None
        current.wait_stream(side)
        entry = _Graph(graph, static_x, static_out, kept, where)
        self.graphs[m] = entry
        return entry


class _Graph:
    """One captured forward: its static input and output and what it must keep alive."""

    __slots__ = ("graph", "kept", "static_out", "static_x", "where")

    def __init__(self, graph, static_x: torch.Tensor, static_out: torch.Tensor, kept, where: tuple) -> None:
        self.graph, self.static_x, self.static_out = graph, static_x, static_out
        self.kept = kept  # the parameters, buffers and other tensors the graph reads: alive while it is
        self.where = where  # their addresses at capture: a replaced one makes this graph stale

    def replay(self, x: torch.Tensor) -> torch.Tensor:
        self.static_x.copy_(x)
        self.graph.replay()
        return self.static_out.clone()  # before any other graph of the layer runs: the pool is shared
