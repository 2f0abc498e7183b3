"""A MoE layer sharded over a ``torch.distributed`` process group: ``ShardedRunner`` (replicate and mask) and
``AllToAllRunner`` (tokens sent to the ranks of their experts).

Every rank of the group holds one shard (``moe_core.sharding``) of a TP x EP grid — rank ``r`` is TP rank
``r % tp`` of EP rank ``r // tp`` — and every rank sees all tokens: it runs its shard on them with the ids of
experts held elsewhere set to ``-1`` (which contribute zero on every backend), and the partial outputs are
summed over the group (one ``all_reduce``, accumulated in float32 whatever the activation dtype, so the sum
is not rounded per rank). The simplest dispatch there is: no token moves, so skewed routing or a rank with no
tokens for its experts needs nothing special; it costs every rank the routing of all tokens, which the
all-to-all dispatcher avoids. Each EP rank must hold at least ``top_k`` experts (its shard keeps the layer's
``top_k``). Works with gloo on CPUs and NCCL on GPUs.

``AllToAllRunner`` is expert parallelism without replication: each rank brings its *own* tokens, every
(token, slot) pair travels to the rank holding its expert (``all_to_all_single`` of only those rows, the
counts exchanged first), runs there as a top-1 pair on that rank's experts, comes back and is summed into
its token's output (float32). A rank may bring zero tokens, or receive none. The split sizes are read on the
host (one synchronisation per forward), so it cannot be captured in a CUDA graph.

Construction checks that every rank was given the same problem and grid (an ``all_gather`` of a short
description): different configs across ranks are an ``InvalidInputError`` naming the ranks that differ,
on every rank, instead of a hang or a silently wrong sum. A rank that dies is the process group's timeout
(``init_process_group(timeout=...)``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch
import torch.distributed as dist

from moe_core.config import MoeConfig
from moe_core.errors import InvalidInputError
from moe_core.runner import MoeRunner
from moe_core.sharding import Shard, local_id_table, local_ids, shard_weights
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
        world, rank = _group("ShardedRunner", group)
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
        self._table = local_id_table(self.shard.experts, config.num_experts, weights.w13.device)

    def __call__(self, hidden_states: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor):
        ids = local_ids(topk_ids, self._table)
        partial = self.runner(hidden_states, ids, topk_weights).float()
        dist.all_reduce(partial, group=self.group)
        return partial.to(self.config.dtype)


class AllToAllRunner:
    """Expert parallelism over ``group`` with an all-to-all of the (token, slot) pairs (module docstring).

    ``runner(x [m, H], topk_ids [m, k] global ids, topk_weights [m, k])`` on every rank with that rank's own
    tokens returns the layer's output for them. ``ep_size`` is the group's size; ``placement`` as in
    ``moe_core.sharding``. Attributes: ``shard``, ``runner`` (this rank's top-1 ``MoeRunner``), ``group``.
    """

    def __init__(
        self,
        config: MoeConfig,
        weights: MoeWeights,
        *,
        placement: Sequence[Sequence[int]] | None = None,
        backend: str | type = "auto",
        group=None,
    ) -> None:
        world, rank = _group("AllToAllRunner", group)
        self.group, self.config, self.world = group, config, world
        _same_everywhere(f"{config!r} a2a ep={world} placement={placement}", rank, world, group)
        # a received pair is one token routed to one local expert: top-1 on this rank's experts
        top1 = dataclasses.replace(config, top_k=1)
        self.shard = shard_weights(top1, weights, ep_rank=rank, ep_size=world, placement=placement)
        self.runner = MoeRunner(self.shard.config, self.shard.weights, backend=backend)
        owner = torch.full((config.num_experts + 1,), -1, dtype=torch.long)
        local = torch.full((config.num_experts + 1,), -1, dtype=torch.int32)
        for r, experts in enumerate(_placement(config.num_experts, world, placement)):
            owner[list(experts)] = r
            local[list(experts)] = torch.arange(len(experts), dtype=torch.int32)
        device = weights.w13.device
        self._owner, self._local = owner.to(device), local.to(device)

    def __call__(self, hidden_states: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor):
        m, k = topk_ids.shape
        h = self.config.hidden_size
        device = hidden_states.device
        experts = topk_ids.reshape(-1).long()
        experts = torch.where(experts < 0, self.config.num_experts, experts)  # -1: on no rank, dropped
        token = torch.arange(m, device=device).repeat_interleave(k)
        dest = self._owner[experts]
        keep = dest >= 0
        dest, token, experts = dest[keep], token[keep], experts[keep]
        weight = topk_weights.reshape(-1)[keep].float()
        order = torch.argsort(dest, stable=True)
        dest, token, experts, weight = dest[order], token[order], experts[order], weight[order]
        send = torch.bincount(dest, minlength=self.world)
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send, group=self.group)
        send_splits, recv_splits = send.tolist(), recv.tolist()  # the host synchronisation
        n_in = sum(recv_splits)

        def exchange(t: torch.Tensor, rows: int, out_splits, in_splits) -> torch.Tensor:
            out = torch.empty((rows, *t.shape[1:]), dtype=t.dtype, device=device)
            dist.all_to_all_single(out, t.contiguous(), out_splits, in_splits, group=self.group)
            return out

        x_in = exchange(hidden_states[token], n_in, recv_splits, send_splits)
        ids_in = exchange(self._local[experts], n_in, recv_splits, send_splits)
        w_in = exchange(weight, n_in, recv_splits, send_splits)
        y = self.runner(x_in, ids_in[:, None], w_in[:, None]) if n_in else x_in.new_zeros(0, h)
        back = exchange(y.float(), len(token), send_splits, recv_splits)
        out = torch.zeros(m, h, dtype=torch.float32, device=device).index_add_(0, token, back)
        return out.to(self.config.dtype)


def _placement(num_experts: int, world: int, placement):
    from moe_core.sharding import check_placement, contiguous_placement

    return contiguous_placement(num_experts, world) if placement is None else check_placement(placement, num_experts)


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
