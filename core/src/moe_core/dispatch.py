"""The dispatcher contract: how the tokens of a layer sharded over ranks reach the experts that hold them.

A dispatcher is a plugin of entry-point group ``moe.a2a`` (hook ``moe_dispatchers``), found, loaded, filtered
and listed exactly like a kernel backend of ``moe.fused_ops`` (``moe_core.kinds``). Core ships two through
its own entry points: ``replicate`` (every rank sees every token, masks the experts it lacks, one
all-reduce) and ``all_to_all`` (each (token, slot) pair travels to its expert's rank and back). Splitting
dispatch from the fused op lets a communication library (DeepEP, NVSHMEM, ...) ship as its own distribution
without knowing any kernel, and a kernel without knowing any network.

``format`` names what ``dispatch`` hands the local experts, and a fused op declares the formats its ``apply``
accepts (``FusedOp.dispatch_formats``):

- ``token_major_local_ids``: ``hidden_states [n, H]``, ``topk_ids [n, k']`` int32 *local* expert ids (``-1``
  for an expert held elsewhere, which contributes zero: the expert-id contract), ``topk_weights [n, k']``;
  what ``MoeRunner`` and every backend's ``apply`` take.
- ``expert_major_padded``: ``hidden_states [E_local, C, H]``, each local expert's rows padded to a capacity
  ``C``, ``topk_ids [E_local]`` int32 rows in use per expert, ``topk_weights [E_local, C]`` (DeepEP's
  low-latency layout). ``MoeRunner`` carries token-major rows only, so the runner converts such a block
  (``ExpertMajorRows``): row ``(e, c)`` becomes one top-1 pair of local expert ``e``, a padding row (``c`` at
  or past expert ``e``'s count) the id ``-1``; the output goes back as ``[E_local, C, H]``.

What reaches ``apply`` is therefore always token-major: a fused op that does not accept
``token_major_local_ids`` cannot be driven by any dispatcher, and is refused with a sentence at construction
(``check_formats``), skipped by ``backend="auto"`` with that sentence as its reason (``moe backends --explain
--a2a NAME``), never run on a layout it does not read.

Which tokens a rank brings is the dispatcher's to say (``Dispatcher.token_slice``): the whole batch on every
rank for ``replicate``, each rank its own share for ``all_to_all`` and any dispatcher that moves tokens.

``dispatch`` and ``combine`` are the hot path and, like ``apply``, are not wrapped by ``moe_core.guard``;
``available`` and ``__init__`` are.
"""

from __future__ import annotations

import dataclasses
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

    def token_slice(self, num_tokens: int) -> slice:
        """Which rows of a batch of ``num_tokens`` tokens this rank brings to ``dispatch`` when one batch is
        spread over the grid (``moe run``, ``moe bench``, tests): by default each rank its own contiguous share,
        the first ``num_tokens % ranks`` ranks one more; a dispatcher whose ranks all bring every token
        (``replicate``) returns the whole batch."""
        ranks = self.grid.tp_size * self.grid.ep_size
        base, extra = divmod(num_tokens, ranks)
        start = self.grid.rank * base + min(self.grid.rank, extra)
        return slice(start, start + base + (self.grid.rank < extra))

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

    def wire_bytes(self, dispatched: Dispatched) -> int | None:
        """Bytes this rank sends to the other ranks in one forward's ``dispatch`` and ``combine`` (None: not
        said). Only read by ``moe bench --tp/--ep``, which divides it by the time of those two steps for the
        achieved bandwidth, compared with the link's measured peak."""
        return None


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


def format_refusal(dispatcher: type[Dispatcher], op: type) -> str:
    """Why fused op ``op`` cannot run what ``dispatcher`` hands its experts, or ``""`` when it can (directly, or
    after ``ExpertMajorRows`` turns an expert-major block into the token-major rows ``MoeRunner`` carries)."""
    accepted = tuple(op.dispatch_formats)
    if TOKEN_MAJOR in accepted:
        return ""
    converted = "" if dispatcher.format == TOKEN_MAJOR else f", which the runner converts to {TOKEN_MAJOR!r} rows"
    return (
        f"dispatcher {dispatcher.name!r} hands the experts {dispatcher.format!r}{converted}; fused op "
        f"{op.__name__} of backend {op.name!r} does not accept {TOKEN_MAJOR!r} (it accepts: "
        f"{', '.join(accepted) or 'none'}), and MoeRunner hands apply nothing else; choose a backend that "
        f"accepts {TOKEN_MAJOR!r}"
    )


def check_formats(dispatcher: type[Dispatcher], op: type) -> None:
    """Refuse a dispatcher whose tokens fused op ``op`` cannot read (``BackendUnavailableError``,
    ``format_refusal``'s sentence)."""
    refusal = format_refusal(dispatcher, op)
    if refusal:
        raise BackendUnavailableError(refusal)


class ExpertMajorRows:
    """An ``expert_major_padded`` block as the token-major rows ``MoeRunner`` carries, and the rows' output back
    as the block's ``[E_local, C, H]`` (the module docstring says how). Built once per layer."""

    @staticmethod
    def local_config(config: MoeConfig) -> MoeConfig:
        """Each row is one (token, expert) pair: the rows' problem is top-1."""
        return dataclasses.replace(config, top_k=1)

    @staticmethod
    def to_rows(d: Dispatched) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        experts, capacity, hidden = d.hidden_states.shape
        slot = torch.arange(capacity, device=d.hidden_states.device)
        used = slot[None, :] < d.topk_ids.to(slot.dtype)[:, None]
        local = torch.arange(experts, dtype=torch.int32, device=slot.device)[:, None].expand(experts, capacity)
        ids = torch.where(used, local, torch.full_like(local, -1))
        return d.hidden_states.reshape(-1, hidden), ids.reshape(-1, 1), d.topk_weights.reshape(-1, 1).float()

    @staticmethod
    def from_rows(y: torch.Tensor, d: Dispatched) -> torch.Tensor:
        return y.view(d.hidden_states.shape)
