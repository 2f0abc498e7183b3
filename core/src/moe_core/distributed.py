"""A MoE layer sharded over a ``torch.distributed`` process group, its tokens moved by a dispatcher:
``DispatchedRunner`` (any dispatcher of group ``moe.a2a`` by name), ``ShardedRunner`` (``replicate``) and
``AllToAllRunner`` (``all_to_all``); ``Parallel``, the same choices as one bundle for ``MoeLayer``.

Every rank of the group holds one shard (``moe_core.sharding``) of a TP x EP grid — rank ``r`` is TP rank
``r % tp`` of EP rank ``r // tp`` — built for the problem its dispatcher hands it
(``Dispatcher.local_config``), and runs it through a ``MoeRunner``; the dispatcher moves the tokens to it
(``dispatch``) and the results back (``combine``): ``moe_core.dispatchers.replicate`` (every rank sees all
tokens, experts held elsewhere masked, one float32 all-reduce) and ``moe_core.dispatchers.all_to_all`` (each
(token, slot) pair sent to its expert's rank and back). A dispatcher handing ``expert_major_padded`` blocks
has them converted to the runner's token-major rows (``moe_core.dispatch.ExpertMajorRows``). Works with gloo
on CPUs and NCCL on GPUs.

The weights are the layer's full canonical weights (each rank keeps only its shard), or this rank's
``Shard`` (``shard_weights``' result, or what a loader read from a checkpoint for this rank alone).

Construction checks, on every rank at once (an ``all_gather`` of a short description), that every rank was
given the same problem, grid, dispatcher and — for full weights — the same weights (a fingerprint of a
sample of every tensor), and that every rank given a ``Shard`` was given its own: anything else is an
``InvalidInputError`` naming the ranks, raised on every rank, instead of a hang or a silently wrong sum;
and that the bound fused op reads the dispatcher's format (``moe_core.dispatch.check_formats``). A rank that
dies or stops answering is the process group's timeout (``init_process_group(timeout=...)``) or the
spawner's watch (``moe run``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from moe_core import guard
from moe_core.config import MoeConfig
from moe_core.dispatch import EXPERT_MAJOR, Dispatched, Dispatcher, ExpertMajorRows, Grid, resolve
from moe_core.errors import InvalidInputError
from moe_core.runner import MoeRunner
from moe_core.sharding import Shard, check_placement, contiguous_placement, local_intermediate, shard_weights
from moe_core.weights import MoeWeights


class DispatchedRunner:
    """The routed experts of one layer over ``group`` (default: the world), tokens moved by ``dispatcher`` (a
    name of group ``moe.a2a``, ``"dist:name"``, or a ``Dispatcher`` subclass): ``runner(x, topk_ids,
    topk_weights)`` with the *global* ids returns the layer's output for the tokens this rank brought (which
    tokens a rank brings is the dispatcher's to say: all of them for ``replicate``, its own for ``all_to_all``).

    ``weights`` are the full canonical weights (each rank keeps only its shard) or this rank's ``Shard``, and
    ``tp_size * ep_size`` must be the group's size. Attributes: ``dispatcher``, ``shard``, ``runner`` (this
    rank's ``MoeRunner``), ``group``, ``config``, ``grid``, ``dispatcher_entry`` (the ``PluginEntry`` it came from).
    """

    def __init__(
        self,
        config: MoeConfig,
        weights: MoeWeights | Shard,
        *,
        dispatcher: str | type[Dispatcher],
        tp_size: int = 1,
        ep_size: int | None = None,
        placement: Sequence[Sequence[int]] | None = None,
        backend: str | type = "auto",
        group=None,
    ) -> None:
        world, rank = _group(type(self).__name__, group)
        if ep_size is None:
            ep_size = world // tp_size if tp_size and world % tp_size == 0 else 0
        if tp_size * ep_size != world:
            raise InvalidInputError(f"tp_size={tp_size} x ep_size={ep_size} must equal the group's {world} ranks")
        cls, entry = resolve(dispatcher)
        self.group, self.config, self.world, self.dispatcher_entry = group, config, world, entry
        full = not isinstance(weights, Shard)
        held = _fingerprint(weights) if full else "this rank's shard"
        _same_everywhere(f"{config!r} dispatcher={entry.qualified_name} tp={tp_size} ep={ep_size} "
                         f"placement={placement} weights={held}", rank, world, group)  # fmt: skip
        experts = contiguous_placement(config.num_experts, ep_size) if placement is None else placement
        device = (weights.w13 if full else weights.weights.w13).device
        self.grid = grid = Grid(tp_size, ep_size, rank, tuple(check_placement(experts, config.num_experts)), device)
        self.dispatcher: Dispatcher = guard.call(entry, "__init__", cls, config, grid, group)
        local = guard.call(entry, "local_config", self.dispatcher.local_config)
        # an expert-major block reaches the runner as top-1 token-major rows
        self._rows = ExpertMajorRows if cls.format == EXPERT_MAJOR else None
        if self._rows is not None:
            local = self._rows.local_config(local)
        if full:
            shard, wrong = shard_weights(
                local, weights, tp_rank=grid.tp_rank, tp_size=tp_size, ep_rank=grid.ep_rank, ep_size=ep_size,
                placement=grid.placement,
            ), ""  # fmt: skip
        else:
            shard, wrong = _own_shard(weights, local, grid)
        _no_error_anywhere(wrong, rank, world, group)
        self.shard: Shard = shard
        # the runner refuses (or, under auto, skips) a fused op that cannot read the dispatcher's tokens
        self.runner = MoeRunner(self.shard.config, self.shard.weights, backend=backend, dispatcher=cls)

    def token_slice(self, num_tokens: int) -> slice:
        """The rows of a batch of ``num_tokens`` that this rank brings (``Dispatcher.token_slice``)."""
        return self.dispatcher.token_slice(num_tokens)

    def __call__(self, hidden_states: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor):
        d = self.dispatch(hidden_states, topk_ids, topk_weights)
        return self.combine(self.local_forward(d), d, hidden_states.shape[0])

    def dispatch(self, hidden_states: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> Dispatched:
        """The dispatcher's ``dispatch`` through the door (``guard.forward_call``)."""
        return guard.forward_call(
            self.dispatcher_entry, "dispatch", self.dispatcher.dispatch, hidden_states, topk_ids, topk_weights
        )

    def combine(self, expert_output: torch.Tensor, d: Dispatched, num_tokens: int) -> torch.Tensor:
        """The dispatcher's ``combine`` through the door, its result checked at it: ``[num_tokens, H]`` (the
        tokens this rank brought) in the layer's dtype on this rank's device."""
        out = guard.forward_call(self.dispatcher_entry, "combine", self.dispatcher.combine, expert_output, d)
        want, device = (num_tokens, self.config.hidden_size), d.hidden_states.device
        if (
            not isinstance(out, torch.Tensor)
            or tuple(out.shape) != want
            or out.dtype != self.config.dtype
            or out.device != device
        ):
            got = f"{tuple(out.shape)} {out.dtype} on {out.device}" if isinstance(out, torch.Tensor) else repr(out)
            raise guard.failure(
                self.dispatcher_entry,
                "combine",
                f"returned {got}; the layer's output is {want} {self.config.dtype} on {device}",
            )
        return out

    def local_forward(self, d: Dispatched) -> torch.Tensor:
        """This rank's experts on what ``dispatch`` handed them, laid out as the dispatcher's format."""
        x, ids, weights = (d.hidden_states, d.topk_ids, d.topk_weights) if self._rows is None else self._rows.to_rows(d)
        if x.shape[0]:
            y = self.runner(x, ids, weights)
        else:  # this rank's experts received no token
            y = x.new_zeros(0, self.config.hidden_size)
        return y if self._rows is None else self._rows.from_rows(y, d)


class ShardedRunner(DispatchedRunner):
    """Replicate and mask (dispatcher ``replicate``): ``runner(x, topk_ids, topk_weights)`` with the *global*
    ids and all tokens on every rank returns the whole layer's output on every rank. Each EP rank must hold at
    least ``top_k`` experts."""

    def __init__(self, config: MoeConfig, weights: MoeWeights, **options) -> None:
        """``options``: ``DispatchedRunner``'s ``tp_size``, ``ep_size``, ``placement``, ``backend``, ``group``."""
        super().__init__(config, weights, dispatcher="replicate", **options)


class AllToAllRunner(DispatchedRunner):
    """Expert parallelism over ``group`` with an all-to-all of the (token, slot) pairs (dispatcher
    ``all_to_all``): ``runner(x [m, H], topk_ids [m, k] global ids, topk_weights [m, k])`` on every rank with
    that rank's own tokens returns the layer's output for them. ``ep_size`` is the group's size;
    ``placement`` as in ``moe_core.sharding``. ``runner`` is this rank's top-1 ``MoeRunner``."""

    def __init__(
        self,
        config: MoeConfig,
        weights: MoeWeights,
        *,
        placement: Sequence[Sequence[int]] | None = None,
        backend: str | type = "auto",
        group=None,
    ) -> None:
        super().__init__(config, weights, dispatcher="all_to_all", tp_size=1, placement=placement,
                         backend=backend, group=group)  # fmt: skip


@dataclass(frozen=True)
class Parallel:
    """How ``MoeLayer`` spreads its routed experts over ranks (``MoeLayer(..., parallel=Parallel(...))``):
    ``DispatchedRunner``'s choices as one bundle. ``group``: the process group of the whole TP x EP grid
    (None: the world; rank ``r`` of it is TP rank ``r % tp_size`` of EP rank ``r // tp_size``); ``ep_size``
    None: the group's size over ``tp_size``; ``placement``: experts per EP rank (default contiguous);
    ``dispatcher``: a name of group ``moe.a2a`` or a ``Dispatcher`` subclass."""

    group: object = None
    tp_size: int = 1
    ep_size: int | None = None
    placement: tuple[tuple[int, ...], ...] | None = None
    dispatcher: str | type = "replicate"

    def runner(self, config: MoeConfig, weights: MoeWeights | Shard, backend: str | type = "auto"):
        """This rank's ``DispatchedRunner`` of the layer."""
        return DispatchedRunner(
            config, weights, dispatcher=self.dispatcher, tp_size=self.tp_size, ep_size=self.ep_size,
            placement=self.placement, backend=backend, group=self.group,
        )  # fmt: skip


def _group(who: str, group) -> tuple[int, int]:
    """(size, this rank) of ``group``, which must be initialised."""
    if not dist.is_available() or not dist.is_initialized():
        raise InvalidInputError(f"{who} needs an initialised torch.distributed process group")
    return dist.get_world_size(group), dist.get_rank(group)


def _same_everywhere(description: str, rank: int, world: int, group) -> None:
    gathered: list[str | None] = [None] * world
    dist.all_gather_object(gathered, description, group=group)
    differ = [r for r, d in enumerate(gathered) if d != gathered[0]]
    if differ:
        raise InvalidInputError(
            f"ranks {differ} were given another layer or grid than rank 0 (this is rank {rank}):\n"
            f"  rank 0: {gathered[0]}\n  rank {differ[0]}: {gathered[differ[0]]}"
        )


def _no_error_anywhere(error: str, rank: int, world: int, group) -> None:
    """Raise on every rank when any rank found ``error`` in what it was given (one ``all_gather``)."""
    gathered: list[str | None] = [None] * world
    dist.all_gather_object(gathered, error, group=group)
    wrong = [r for r, e in enumerate(gathered) if e]
    if wrong:
        lines = "\n".join(f"  rank {r}: {gathered[r]}" for r in wrong)
        raise InvalidInputError(f"ranks {wrong} were given weights that are not their shard (this is rank {rank}):\n"
                                f"{lines}")  # fmt: skip


def _own_shard(shard: Shard, local: MoeConfig, grid: Grid) -> tuple[Shard | None, str]:
    """(``shard`` with the config this rank's runner solves, "") when it is this rank's, else (None, whose shard
    it is): every rank raises the latter together (``_no_error_anywhere``)."""
    wanted = (grid.tp_rank, grid.tp_size, grid.ep_rank, grid.ep_size, grid.experts)
    have = (shard.tp_rank, shard.tp_size, shard.ep_rank, shard.ep_size, shard.experts)
    if have != wanted:
        return None, (
            f"the shard of tp_rank {have[0]}/{have[1]}, ep_rank {have[2]}/{have[3]} (experts {list(have[4])}); this "
            f"rank is tp_rank {wanted[0]}/{wanted[1]}, ep_rank {wanted[2]}/{wanted[3]} (experts {list(wanted[4])})"
        )
    inter = local_intermediate(local, grid.tp_size)
    config = dataclasses.replace(local, num_experts=len(grid.experts), intermediate_size=inter)
    if dataclasses.replace(shard.config, top_k=config.top_k) != config:
        return None, f"a shard of another layer: {shard.config!r}, this rank's is {config!r}"
    return dataclasses.replace(shard, config=config), ""


def _fingerprint(weights: MoeWeights) -> str:
    """Shapes, dtypes and an exact integer checksum of a strided sample (at most 4096 elements) of every
    tensor: the same on every rank given the same weights, different for another seed or checkpoint."""
    parts = []
    for name, t in weights.tensors().items():
        flat = t.detach().reshape(-1)
        sample = flat[:: max(1, flat.numel() // 4096)].contiguous().view(torch.uint8).to(torch.int64)
        weight = torch.arange(1, sample.numel() + 1, dtype=torch.int64, device=sample.device)
        parts.append(f"{name}{list(t.shape)}:{str(t.dtype).removeprefix('torch.')}:{int((sample * weight).sum())}")
    return " ".join(parts)
