"""Llama 4: top-1 sigmoid routing, the weight applied to the expert input (``sigmoid_top1``)."""

from __future__ import annotations

import torch

from moe_core import routing
from moe_core.errors import InvalidInputError
from moe_core.integrations.transformers.experts import first_attr, gated_moe, require_attr, shared_of
from moe_core.integrations.transformers.router import HFMoe


def from_llama4(block, dtype: torch.dtype = torch.float32) -> HFMoe:
    """``Llama4TextMoe`` -> ``HFMoe`` with ``shared`` and ``config.apply_router_weight_on_input``.

    Form: ``Llama4TextExperts`` (not behind transformers' experts hook) with ``gate_up_proj``
    ``[E, H, 2I]`` columns ``[gate; up]`` and ``down_proj`` ``[E, I, H]``, transposed here; activation
    ``act_fn`` probed. Router ``Llama4Router`` (an ``nn.Linear``, ``top_k``): transformers keeps the
    top-k logits and scales each expert's *input* by their sigmoid (the other experts get 0);
    ``top_k`` must be 1 (every Llama 4; ``MoeConfig`` allows the weight on the input only then).
    ``shared`` is ``shared_expert`` (a gated MLP), added to the routed output.
    """
    router_module = require_attr(block, "router", what="router")
    top_k = int(first_attr((router_module, block), "top_k", "experts per token"))
    if top_k != 1:
        raise InvalidInputError(f"Llama 4: top_k={top_k}; the router weight on the input needs top_k == 1")
    return gated_moe(
        block,
        dtype,
        "Llama 4",
        router_module=router_module,
        top_k=1,
        route=routing.sigmoid_top1,
        description="sigmoid_top1 (weight on the input)",
        transposed=True,
        shared=shared_of(block, dtype, "Llama 4", "shared_expert"),
        apply_router_weight_on_input=True,
    )
