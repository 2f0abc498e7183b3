"""``DenseOp``: a stand-in backend with no host synchronisation anywhere, so a CUDA graph can capture it (the
torch reference reads expert counts on the host). Every expert runs on every token; the routing weights,
scattered to ``[M, E]``, combine them. Used by the CUDA-graph and timing tests."""

from __future__ import annotations

import torch

from moe_core import FusedOp


class DenseOp(FusedOp):
    name = "dense_test"
    quant_schemes = frozenset({"fp32"})
    activation_dtypes = frozenset({torch.float32})
    device_types = frozenset({"cpu", "cuda"})

    def apply(self, hidden_states, topk_ids, topk_weights, prepared, out=None):
        m, e = hidden_states.shape[0], self.config.num_experts
        combine = torch.zeros(m, e, device=hidden_states.device).scatter_add_(1, topk_ids.long(), topk_weights)
        gate, up = torch.einsum("mh,enh->men", hidden_states, prepared.w13).chunk(2, dim=-1)
        y = torch.einsum("men,ehn->meh", torch.nn.functional.silu(gate) * up, prepared.w2)
        result = (combine[..., None] * y).sum(1)
        return result if out is None else out.copy_(result)
