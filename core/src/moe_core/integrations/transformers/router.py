"""The routing of a converted block (``HFRouter``) and the converted block itself (``HFMoe``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F

from moe_core.config import MoeConfig
from moe_core.errors import InvalidInputError
from moe_core.weights import MoeWeights, SharedExperts


class HFRouter:
    """The routing of a transformers MoE block, reproduced with ``moe_core.routing``.

    ``router(hidden_states)`` takes ``[M, H]`` (any leading dims are flattened)
    and returns ``(topk_ids int32 [M, k], topk_weights float32 [M, k])``.
    Logits come from the block's own gate parameters (referenced, not copied, so
    they follow the block), computed in the gate weight's dtype as the block
    does, or in float32 where the block does that (DeepSeek-V3). ``route`` is a routing bundle
    (``moe_core.routing.SoftmaxTopK``, ``GroupedTopK``, ``SigmoidTop1``: a layer's backend may run it as one kernel, and
    its repr names the router) or any function of the logits, then named by ``description``.
    """

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        route: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
        *,
        float32_logits: bool = False,
        description: str = "",
    ) -> None:
        self.weight = weight.detach()
        self.bias = None if bias is None else bias.detach()
        self.route = route
        self.float32_logits = float32_logits
        self.description = description

    @property
    def num_experts(self) -> int:
        return self.weight.shape[0]

    @property
    def hidden_size(self) -> int:
        return self.weight.shape[1]

    @property
    def gate(self) -> tuple[torch.Tensor, torch.Tensor | None] | None:
        """``(weight, bias)`` when the logits are ``F.linear(x, weight, bias)`` in the gate's dtype (a layer's
        backend may then compute them in its routing kernel: ``FusedOp.gated_router``); ``None`` for float32
        logits."""
        return None if self.float32_logits else (self.weight, self.bias)

    def logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """Router logits ``[M, E]`` exactly as the block's gate computes them."""
        if hidden_states.shape[-1] != self.hidden_size:
            raise InvalidInputError(
                f"hidden_states last dim is {hidden_states.shape[-1]}, the router expects {self.hidden_size}"
            )
        x = hidden_states.reshape(-1, self.hidden_size)
        w, b = self.weight, self.bias
        if self.float32_logits:
            x, w = x.float(), w.float()
            b = None if b is None else b.float()
        else:
            x = x.to(w.dtype)
        return F.linear(x, w, b)

    @torch.no_grad()
    def __call__(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.route(self.logits(hidden_states))

    def __repr__(self) -> str:
        return f"HFRouter(E={self.num_experts}, H={self.hidden_size}, {self.description or repr(self.route)})"


class HFMoe(NamedTuple):
    """A converted block: ``config, weights, router, shared = from_hf_block(block)`` (or by attribute).

    ``shared`` is the block's dense shared-expert MLP (``SharedExperts``, its output added to the routed
    output) or ``None`` when the block has none. Four fields since shared experts were added: code that
    unpacked three (``config, weights, router = ...``) must unpack four or use the attributes.
    """

    config: MoeConfig
    weights: MoeWeights
    router: HFRouter
    shared: SharedExperts | None = None
