"""A MoE layer sharded over a ``torch.distributed`` process group, its tokens moved by a dispatcher:
``DispatchedRunner`` (any dispatcher of group ``moe.a2a`` by name), ``ShardedRunner`` (``replicate``) and
``AllToAllRunner`` (``all_to_all``).

Every rank of the group holds one shard (``moe_core.sharding``) of a TP x EP grid — rank ``r`` is TP rank
``r % tp`` of EP rank ``r // tp`` — built for the problem its dispatcher hands it
(``Dispatcher.local_config``), and runs it through a ``MoeRunner``; the dispatcher moves the tokens to it
(``dispatch``) and the results back (``combine``): ``moe_core.dispatchers.replicate`` (every rank sees all
tokens, experts held elsewhere masked, one float32 all-reduce) and ``moe_core.dispatchers.all_to_all`` (each
(token, slot) pair sent to its expert's rank and back). Works with gloo on CPUs and NCCL on GPUs.

Construction checks that every rank was given the same problem, grid and dispatcher (an ``all_gather`` of a
short description): different configs across ranks are an ``InvalidInputError`` naming the ranks that
differ, on every rank, instead of a hang or a silently wrong sum; and that the bound fused op accepts the
dispatcher's format (``moe_core.dispatch.check_formats``). A rank that dies is the process group's timeout
(``init_process_group(timeout=...)``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist

from moe_core import guard
from moe_core.config import MoeConfig
from moe_core.dispatch import TOKEN_MAJOR, Dispatcher, Grid, check_formats, resolve
from moe_core.errors import InvalidInputError
from moe_core.runner import MoeRunner
from moe_core.sharding import Shard, check_placement, contiguous_placement, shard_weights
from moe_core.weights import MoeWeights


class DispatchedRunner:
    """The routed experts of one layer over ``group`` (default: the world), tokens moved by ``dispatcher`` (a
    name of group ``moe.a2a``, ``"dist:name"``, or a ``Dispatcher`` subclass): ``runner(x, topk_ids,
    topk_weights)`` with the *global* ids returns the layer's output for the tokens this rank brought (which
    tokens a rank brings is the dispatcher's to say: all of them for ``replicate``, its own for ``all_to_all``).

    ``weights`` are the full canonical weights (each rank keeps only its shard) and ``tp_size * ep_size`` must
    be the group's size. Attributes: ``dispatcher``, ``shard``, ``runner`` (this rank's ``MoeRunner``),
    ``group``, ``config``.
    """

    def __init__(
        self,
        config: MoeConfig,
        weights: MoeWeights,
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
        if cls.format != TOKEN_MAJOR:
            raise InvalidInputError(
                f"dispatcher {cls.name!r} hands the experts {cls.format!r}; MoeRunner carries only {TOKEN_MAJOR!r}"
            )
        self.group, self.config, self.world = group, config, world
        _same_everywhere(f"{config!r} dispatcher={entry.qualified_name} tp={tp_size} ep={ep_size} "
                         f"placement={placement}", rank, world, group)  # fmt: skip
        experts = contiguous_placement(config.num_experts, ep_size) if placement is None else placement
        grid = Grid(tp_size, ep_size, rank, tuple(check_placement(experts, config.num_experts)), weights.w13.device)
        self.dispatcher: Dispatcher = guard.call(entry, "__init__", cls, config, grid, group)
        local = guard.call(entry, "local_config", self.dispatcher.local_config)
        self.shard: Shard = shard_weights(
            local, weights, tp_rank=grid.tp_rank, tp_size=tp_size, ep_rank=grid.ep_rank, ep_size=ep_size,
            placement=grid.placement,
        )  # fmt: skip
        self.runner = MoeRunner(self.shard.config, self.shard.weights, backend=backend)
        check_formats(cls, self.runner.selection.op)

    def __call__(self, hidden_states: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor):
        d = self.dispatcher.dispatch(hidden_states, topk_ids, topk_weights)
        if d.hidden_states.shape[0]:
            y = self.runner(d.hidden_states, d.topk_ids, d.topk_weights)
        else:  # this rank's experts received no token
            y = d.hidden_states.new_zeros(0, self.config.hidden_size)
        return self.dispatcher.combine(y, d)


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
