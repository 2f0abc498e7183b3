"""``MoeRunner``: one MoE layer bound to one backend's fused op.

Construction does all the thinking: validate the weights against the config,
select the backend (discovering and loading plugins through entry points if
this is the first runner), prepare the weights into the backend's layout once.
A forward then validates tensor metadata and calls the bound ``apply`` — no
registry lookup, no hook call, no plugin discovery per call.
"""

from __future__ import annotations

import torch

from moe_core.config import MoeConfig, MoeProblem
from moe_core.plugins import PluginRegistry
from moe_core.requirements import env_flag
from moe_core.selection import select
from moe_core.validation import validate_expert_ids, validate_forward
from moe_core.weights import MoeWeights, validate_weights


class MoeRunner:
    """Run the routed experts of a MoE layer through one backend.

    >>> runner = MoeRunner(config, weights, backend="auto")   # doctest: +SKIP
    >>> out = runner(hidden_states, topk_ids, topk_weights)    # doctest: +SKIP

    ``backend`` is ``"auto"``, a runner backend name (``"triton"``) or a name
    qualified by its distribution (``"moe-triton:triton"``) to choose between
    two distributions that provide the same name.

    ``check_expert_ids`` validates that ``topk_ids`` lie in ``[0, E)`` on every
    forward (a kernel fed an out-of-range id would read another expert's
    memory). Default: always on CPU (free); on CUDA only when
    ``MOE_CHECK_EXPERT_IDS=1``, because it costs two small launches per forward
    and fires as a device-side assertion.
    """

    def __init__(
        self,
        config: MoeConfig,
        weights: MoeWeights,
        backend: str = "auto",
        *,
        registry: PluginRegistry | None = None,
        check_expert_ids: bool | None = None,
    ) -> None:
        if not isinstance(config, MoeConfig):
            raise TypeError(f"config must be a MoeConfig, got {type(config).__name__}")
        device = validate_weights(config, weights)
        self.config = config
        self.device = device
        self.problem = MoeProblem(config, device)
        self.selection = select(self.problem, backend, registry)
        self.fused_op = self.selection.op(self.problem)
        self.prepared = self.fused_op.prepare(weights)
        self._apply = self.fused_op.apply
        if check_expert_ids is None:
            check_expert_ids = device.type != "cuda" or env_flag("MOE_CHECK_EXPERT_IDS")
        self.check_expert_ids = check_expert_ids

    @property
    def backend(self) -> str:
        """Name of the runner backend this runner is bound to."""
        return self.selection.name

    @property
    def distribution(self) -> str:
        return self.selection.entry.distribution

    def __call__(
        self,
        hidden_states: torch.Tensor,
        topk_ids: torch.Tensor,
        topk_weights: torch.Tensor,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Routed-expert output ``[M, H]`` for ``hidden_states`` ``[M, H]``.

        ``topk_ids`` int32 ``[M, k]`` and ``topk_weights`` float32 ``[M, k]`` as
        produced by ``moe_core.routing``. Writes into ``out`` when given.
        """
        validate_forward(self.config, self.device, hidden_states, topk_ids, topk_weights, out)
        if self.check_expert_ids:
            validate_expert_ids(topk_ids, self.config.num_experts)
        return self._apply(hidden_states, topk_ids, topk_weights, self.prepared, out)

    forward = __call__

    def __repr__(self) -> str:
        c = self.config
        return (
            f"MoeRunner(backend={self.backend!r}, E={c.num_experts}, top_k={c.top_k}, "
            f"H={c.hidden_size}, I={c.intermediate_size}, scheme={c.quant_scheme!r}, device={self.device})"
        )
