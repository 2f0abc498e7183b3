"""``all_to_all``: expert parallelism without replication, each (token, slot) pair sent to its expert's rank.

Each rank brings its *own* tokens; every pair travels to the rank holding its expert (``all_to_all_single``
of only those rows, the counts exchanged first), runs there as a top-1 pair on that rank's experts, comes
back and is summed into its token's output (float32). A rank may bring zero tokens, or receive none. The
split sizes are read on the host (one synchronisation per forward), so it cannot be captured in a CUDA
graph. Pure expert parallelism: the grid's ``tp_size`` must be 1.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist

from moe_core.dispatch import TOKEN_MAJOR, Dispatched, Dispatcher
from moe_core.errors import InvalidInputError


class AllToAllDispatcher(Dispatcher):
    """Pairs to their experts' ranks and back over an EP grid (module docstring)."""

    name = "all_to_all"
    format = TOKEN_MAJOR

    def __init__(self, config, grid, group=None) -> None:
        super().__init__(config, grid, group)
        if grid.tp_size != 1:
            raise InvalidInputError(f"the all_to_all dispatcher is pure expert parallelism: tp_size={grid.tp_size}")
        owner = torch.full((config.num_experts + 1,), -1, dtype=torch.long)
        local = torch.full((config.num_experts + 1,), -1, dtype=torch.int32)
        for r, experts in enumerate(grid.placement):
            owner[list(experts)] = r
            local[list(experts)] = torch.arange(len(experts), dtype=torch.int32)
        self._owner, self._local = owner.to(grid.device), local.to(grid.device)

    def local_config(self):
        # a received pair is one token routed to one local expert: top-1 on this rank's experts
        return dataclasses.replace(self.config, top_k=1)

    def dispatch(self, hidden_states: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> Dispatched:
        m, k = topk_ids.shape
        experts = topk_ids.reshape(-1).long()
        experts = torch.where(experts < 0, self.config.num_experts, experts)  # -1: on no rank, dropped
        token = torch.arange(m, device=hidden_states.device).repeat_interleave(k)
        dest = self._owner[experts]
        keep = dest >= 0
        dest, token, experts = dest[keep], token[keep], experts[keep]
        weight = topk_weights.reshape(-1)[keep].float()
        order = torch.argsort(dest, stable=True)
        dest, token, experts, weight = dest[order], token[order], experts[order], weight[order]
        send = torch.bincount(dest, minlength=self.grid.ep_size)
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send, group=self.group)
        send_splits, recv_splits = send.tolist(), recv.tolist()  # the host synchronisation
        rows = sum(recv_splits)
        x_in = self._exchange(hidden_states[token], rows, recv_splits, send_splits)
        ids_in = self._exchange(self._local[experts], rows, recv_splits, send_splits)
        w_in = self._exchange(weight, rows, recv_splits, send_splits)
        return Dispatched(x_in, ids_in[:, None], w_in[:, None], state=(m, token, send_splits, recv_splits))

    def wire_bytes(self, dispatched: Dispatched) -> int:
        # dispatch: the counts, then each pair sent elsewhere as a row, an int32 id and a float32 weight;
        # combine: each pair received from elsewhere back as a float32 row (rows to and from this rank stay here)
        _, _, send_splits, recv_splits = dispatched.state
        me = self.grid.ep_rank
        sent = sum(send_splits) - send_splits[me]
        received = sum(recv_splits) - recv_splits[me]
        h, row = self.config.hidden_size, self.config.hidden_size * self.config.dtype.itemsize
        return 8 * (len(send_splits) - 1) + sent * (row + 8) + received * h * 4

    def combine(self, expert_output: torch.Tensor, dispatched: Dispatched) -> torch.Tensor:
        m, token, send_splits, recv_splits = dispatched.state
        back = self._exchange(expert_output.float(), len(token), send_splits, recv_splits)
        out = torch.zeros(m, self.config.hidden_size, dtype=torch.float32, device=back.device)
        return out.index_add_(0, token, back).to(self.config.dtype)

    def _exchange(self, t: torch.Tensor, rows: int, out_splits: list[int], in_splits: list[int]) -> torch.Tensor:
        out = torch.empty((rows, *t.shape[1:]), dtype=t.dtype, device=t.device)
        dist.all_to_all_single(out, t.contiguous(), out_splits, in_splits, group=self.group)
        return out
