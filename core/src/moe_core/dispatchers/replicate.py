"""``replicate``: every rank sees every token and runs its shard on them, the partial outputs are all-reduced.

No token moves, so skewed routing or a rank with no tokens for its experts needs nothing special; it costs
every rank the routing of all tokens, which ``all_to_all`` avoids. The ids of experts held elsewhere become
``-1`` (which contribute zero on every backend), and the partial outputs are summed over the group in
float32 whatever the activation dtype, so the sum is not rounded per rank. Each EP rank must hold at least
``top_k`` experts (its shard keeps the layer's ``top_k``).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from moe_core.dispatch import TOKEN_MAJOR, Dispatched, Dispatcher
from moe_core.sharding import local_id_table, local_ids


class ReplicateDispatcher(Dispatcher):
    """Replicate and mask over a TP x EP grid (module docstring); all tokens on every rank, global ids."""

    name = "replicate"
    format = TOKEN_MAJOR

    def __init__(self, config, grid, group=None) -> None:
        super().__init__(config, grid, group)
        self._table = local_id_table(grid.experts, config.num_experts, grid.device)

    def token_slice(self, num_tokens: int) -> slice:
        return slice(0, num_tokens)  # every rank brings the whole batch

    def dispatch(self, hidden_states: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> Dispatched:
        return Dispatched(hidden_states, local_ids(topk_ids, self._table), topk_weights)

    def wire_bytes(self, dispatched: Dispatched) -> int:
        # a ring all-reduce of the float32 partial output: each rank sends 2 (n - 1) / n of it
        n = dist.get_world_size(self.group)
        return 2 * (n - 1) * dispatched.hidden_states.shape[0] * self.config.hidden_size * 4 // n

    def combine(self, expert_output: torch.Tensor, dispatched: Dispatched) -> torch.Tensor:
        partial = expert_output.float()
        dist.all_reduce(partial, group=self.group)
        return partial.to(self.config.dtype)
