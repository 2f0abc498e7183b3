"""The dispatcher contract: how the tokens of a layer sharded over ranks reach the experts that hold them.

A dispatcher is a plugin of entry-point group ``moe.a2a`` (hook ``moe_dispatchers``), found, loaded, filtered
and listed exactly like a kernel backend of ``moe.fused_ops`` (``moe_core.kinds``). Core ships two through
its own entry points: ``replicate`` (every rank sees every token, masks the experts it lacks, one
all-reduce) and ``all_to_all`` (each (token, slot) pair travels to its expert's rank and back). Splitting
dispatch from the fused op lets a communication library (DeepEP, NVSHMEM, ...) ship as its own distribution
without knowing any kernel, and a kernel without knowing any network.

``format`` names what ``dispatch`` hands the local experts, and a fused op declares the formats its ``apply``
accepts (``FusedOp.dispatch_formats``); a pair that does not match is refused with a sentence
(``check_formats``) rather than computing garbage:

- ``token_major_local_ids``: ``hidden_states [n, H]``, ``topk_ids [n, k']`` int32 *local* expert ids (``-1``
  for an expert held elsewhere, which contributes zero: the expert-id contract), ``topk_weights [n, k']``;
  what ``MoeRunner`` and every backend's ``apply`` take.
- ``expert_major_padded``: ``hidden_states [E_local, C, H]``, each local expert's rows padded to a capacity
  ``C``, ``topk_ids [E_local]`` int32 rows in use per expert, ``topk_weights [E_local, C]`` (DeepEP's
  low-latency layout). Declared so that dispatchers and kernels can agree on it; ``MoeRunner`` does not carry
  it yet, so ``DispatchedRunner`` refuses it.

``dispatch`` and ``combine`` are the hot path and, like ``apply``, are not wrapped by ``moe_core.guard``;
``available`` and ``__init__`` are.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from moe_core.config import MoeConfig
from moe_core.errors import BackendNotInstalledError, BackendUnavailableError
from moe_core.fused_op import Support

TOKEN_MAJOR = "token_major_local_ids"
EXPERT_MAJOR = "expert_major_padded"
#: every format a dispatcher may hand over (the module docstring says what each holds)
FORMATS = (TOKEN_MAJOR, EXPERT_MAJOR)


@dataclass(frozen=True)
class Grid:
    """This rank's place in a TP x EP grid: rank ``r`` is TP rank ``r % tp_size`` of EP rank ``r // tp_size``;
    ``placement[e]`` are the global expert ids EP rank ``e`` holds, in local order; ``device`` is this rank's."""

    tp_size: int
    ep_size: int
    rank: int
    placement: tuple[tuple[int, ...], ...]
    device: torch.device

    @property
    def tp_rank(self) -> int:
        return self.rank % self.tp_size

    @property
    def ep_rank(self) -> int:
        return self.rank // self.tp_size

    @property
    def experts(self) -> tuple[int, ...]:
        """The global ids of the experts this rank holds."""
        return self.placement[self.ep_rank]


@dataclass
class Dispatched:
    """What ``dispatch`` hands the local experts (laid out as the dispatcher's ``format`` says) and ``state``,
    the dispatcher's own bookkeeping that ``combine`` needs to bring the results back."""

    hidden_states: torch.Tensor
    topk_ids: torch.Tensor
    topk_weights: torch.Tensor
    state: Any = None


class Dispatcher:
    """Base class of every token dispatcher (one per entry-point name of group ``moe.a2a``).

    Lifetime: ``available`` (classmethod, cheap) -> ``__init__(config, grid, group)`` once per layer ->
    ``dispatch`` then ``combine`` per forward. ``local_config`` says which problem this rank's fused op is
    built for; the runner builds it on the shard of that config.
    """

    #: dispatcher name, equal to the plugin's entry-point name
    name: ClassVar[str]
    #: what ``dispatch`` hands the local experts: one of ``FORMATS``
    format: ClassVar[str]

    @classmethod
    def available(cls) -> Support:
        """Whether it can run on this machine at all (``moe backends --check``). Default: torch.distributed."""
        if not torch.distributed.is_available():
            return Support.no("torch.distributed is not available in this torch build")
        return Support.yes()

    def __init__(self, config: MoeConfig, grid: Grid, group=None) -> None:
        """``config`` is the whole layer's; ``group`` the process group of the grid (None: the world)."""
        self.config, self.grid, self.group = config, grid, group

    def local_config(self) -> MoeConfig:
        """The config of the problem this rank's experts solve, before sharding: the layer's by default (a
        dispatcher that sends one (token, slot) pair per row returns it with ``top_k=1``)."""
        return self.config

    def dispatch(self, hidden_states: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> Dispatched:
        """This rank's tokens ``[m, H]`` with their *global* routing ``[m, k]`` -> what its experts compute on."""
        raise NotImplementedError(f"{type(self).__name__}.dispatch is not implemented")

    def combine(self, expert_output: torch.Tensor, dispatched: Dispatched) -> torch.Tensor:
        """The local experts' output on ``dispatched`` -> the layer's output ``[m, H]`` for this rank's tokens,
        in ``config.dtype``."""
        raise NotImplementedError(f"{type(self).__name__}.combine is not implemented")


def get_dispatcher(spec: str | type, registry=None) -> type[Dispatcher]:
    """The dispatcher class named ``spec`` (``"all_to_all"``, or ``"moe-core:all_to_all"`` to pick a
    distribution), found and loaded through ``moe.a2a``; a ``Dispatcher`` subclass is returned as it is (tests,
    experiments). An unknown name raises ``BackendNotInstalledError`` listing the installed dispatchers."""
    return resolve(spec, registry)[0]


def resolve(spec: str | type, registry=None):
    """(dispatcher class, its ``PluginEntry``) for ``spec``, as ``get_dispatcher`` (the entry names the plugin
    in errors from its guarded calls)."""
    from moe_core.discovery import PluginEntry
    from moe_core.kinds import A2A_GROUP
    from moe_core.plugins import default_registry
    from moe_core.selection import resolve_backend

    if isinstance(spec, type):
        if not issubclass(spec, Dispatcher):
            raise BackendNotInstalledError(f"dispatcher must be a name or a Dispatcher subclass, got {spec!r}")
        return spec, PluginEntry.direct(spec, A2A_GROUP)
    result = resolve_backend(spec, registry or default_registry(A2A_GROUP))
    return result.provided[0], result.entry


def check_formats(dispatcher: type[Dispatcher], op: type) -> None:
    """Refuse a dispatcher whose format fused op ``op`` does not accept (``BackendUnavailableError``)."""
    accepted = tuple(op.dispatch_formats)
    if dispatcher.format not in accepted:
        raise BackendUnavailableError(
            f"dispatcher {dispatcher.name!r} hands the experts {dispatcher.format!r}, which fused op "
            f"{op.__name__} of backend {op.name!r} does not accept (it accepts: {', '.join(accepted) or 'none'}); "
            f"choose a backend that accepts {dispatcher.format!r} or a dispatcher of another format"
        )
