"""A MoE layer sharded over a ``torch.distributed`` process group: ``ShardedRunner`` (replicate and mask).

Every rank of the group holds one shard (``moe_core.sharding``) of a TP x EP grid — rank ``r`` is TP rank
``r % tp`` of EP rank ``r // tp`` — and every rank sees all tokens: it runs its shard on them with the ids of
experts held elsewhere set to ``-1`` (which contribute zero on every backend), and the partial outputs are
summed over the group (one ``all_reduce``, accumulated in float32 whatever the activation dtype, so the sum
is not rounded per rank). The simplest dispatch there is: no token moves, so skewed routing or a rank with no
tokens for its experts needs nothing special; it costs every rank the routing of all tokens, which the
all-to-all dispatchers avoid. Works with gloo on CPUs and NCCL on GPUs.

Construction checks that every rank was given the same problem and grid (an ``all_gather`` of a short
description): different configs across ranks are an ``InvalidInputError`` naming the ranks that differ,
on every rank, instead of a hang or a silently wrong sum. A rank that dies is the process group's timeout
(``init_process_group(timeout=...)``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist

from moe_core.config import MoeConfig
from moe_core.errors import InvalidInputError
from moe_core.runner import MoeRunner
from moe_core.sharding import Shard, local_ids, shard_weights
from moe_core.weights import MoeWeights


class ShardedRunner:
    """The routed experts of one layer over ``group`` (default: the world): ``runner(x, topk_ids, topk_weights)``
    with the *global* ids and all tokens on every rank returns the whole layer's output on every rank.

    ``weights`` are the full canonical weights (each rank keeps only its shard) and ``tp_size * ep_size`` must
    be the group's size. Attributes: ``shard``, ``runner`` (this rank's ``MoeRunner``), ``group``.
    """

    def __init__(
        self,
        config: MoeConfig,
        weights: MoeWeights,
        *,
        tp_size: int = 1,
        ep_size: int | None = None,
        placement: Sequence[Sequence[int]] | None = None,
        backend: str | type = "auto",
        group=None,
    ) -> None:
        if not dist.is_available() or not dist.is_initialized():
            raise InvalidInputError("ShardedRunner needs an initialised torch.distributed process group")
        world = dist.get_world_size(group)
        rank = dist.get_rank(group)
        if ep_size is None:
            ep_size = world // tp_size if tp_size and world % tp_size == 0 else 0
        if tp_size * ep_size != world:
            raise InvalidInputError(f"tp_size={tp_size} x ep_size={ep_size} must equal the group's {world} ranks")
        self.group = group
        _same_everywhere(f"{config!r} tp={tp_size} ep={ep_size} placement={placement}", rank, world, group)
        self.shard: Shard = shard_weights(
            config, weights, tp_rank=rank % tp_size, tp_size=tp_size, ep_rank=rank // tp_size, ep_size=ep_size,
            placement=placement,
        )  # fmt: skip
        self.config = config
        self.runner = MoeRunner(self.shard.config, self.shard.weights, backend=backend)

    def __call__(self, hidden_states: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor):
        ids = local_ids(topk_ids, self.shard.experts, self.config.num_experts)
        partial = self.runner(hidden_states, ids, topk_weights).float()
        dist.all_reduce(partial, group=self.group)
        return partial.to(self.config.dtype)


def _same_everywhere(description: str, rank: int, world: int, group) -> None:
    gathered: list[str | None] = [None] * world
    dist.all_gather_object(gathered, description, group=group)
    differ = [r for r, d in enumerate(gathered) if d != gathered[0]]
    if differ:
        raise InvalidInputError(
            f"ranks {differ} were given another layer or grid than rank 0 (this is rank {rank}):\n"
            f"  rank 0: {gathered[0]}\n  rank {differ[0]}: {gathered[differ[0]]}"
        )
