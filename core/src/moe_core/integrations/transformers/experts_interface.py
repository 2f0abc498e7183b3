"""``register_experts_implementation``: moe_core backends as a transformers ``experts_implementation``.

>>> register_experts_implementation("moe", backend="auto")                                   # doctest: +SKIP
>>> model = AutoModelForCausalLM.from_pretrained(path, experts_implementation="moe")         # doctest: +SKIP

transformers 5.x dispatches the forward of every experts module decorated with
``@use_experts_implementation`` (``MixtralExperts``, ``Qwen3MoeExperts``, ``GptOssExperts``, DeepSeek's, ...)
through ``transformers.integrations.moe.ExpertsInterface`` by ``config._experts_implementation``; the
registered function is called as ``fn(experts, hidden_states [T, H], top_k_index [T, k], top_k_weights
[T, k]) -> [T, H]``. The one registered here:

- on the first call for an experts module (per ``top_k``, dtype and device), reads the module's fused
  weights into canonical ``MoeWeights`` (``experts.fused_experts``: the layout from the module's
  ``is_transposed`` / ``is_concatenated`` / ``has_bias`` flags), probes its activation against
  moe_core's (``match_activation``: silu, gelu, or ``swiglu_oai`` with the module's ``alpha`` / ``limit``
  — gpt-oss), builds a ``MoeRunner`` on ``backend`` and caches it on the module (``_moe_core_runners``);
  a later in-place change of the parameters (``load_state_dict``, weights loaded after the first call)
  is seen through the parameters' version counter and rebuilds the runner;
- runs ``runner(hidden_states, top_k_index.to(torch.int32), top_k_weights.float())``.

What it covers: **only the routed experts**. The router (top-k choice and weights), shared experts, the
layer-level shared MLPs and everything else stay transformers' own code, so ``output_router_logits`` and
training-mode router behaviour keep working; for the whole block on a backend (shared MLP included) use
``patch_model``. Experts modules not behind the decorator (Llama 4's ``Llama4TextExperts``, 4.x
``ModuleList`` experts) are never dispatched here. Expert parallelism (``_is_expert_parallel``) is refused.

Memory: the HF parameters stay in the model (transformers owns them: ``state_dict``, saving, ``.to()``). The
canonical weights are a view of them where the HF layout already is canonical (``[E, 2I, H]`` rows
``[gate; up]``, not transposed: Mixtral, Qwen-MoE, DeepSeek), else a copy (gpt-oss: transposed,
interleaved); a backend whose ``prepare`` makes its own layout (triton ``.contiguous()`` of a view is the
same storage; MXFP4 re-layouts, other plugins) then holds a second copy beside the HF parameters. The
torch backend on a canonical layout adds nothing. A runner is bound to the device and dtype it was
built for: moving the model builds a new one at the next call (the old one is dropped).

transformers is imported only inside ``register_experts_implementation``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from moe_core.config import MoeConfig
from moe_core.errors import InvalidInputError
from moe_core.integrations.transformers.experts import experts_config, fused_experts, match_activation
from moe_core.runner import MoeRunner
from moe_core.weights import MoeWeights

__all__ = ["experts_forward", "register_experts_implementation"]

#: attribute of an experts module holding its runners: {(top_k, dtype, device): (stamp, MoeRunner)}
CACHE_ATTR = "_moe_core_runners"


def register_experts_implementation(name: str = "moe", backend: str | type = "auto") -> Callable:
    """Register ``name`` with transformers' ``ExpertsInterface`` so that ``from_pretrained`` /
    ``from_config(..., experts_implementation=name)`` (or ``model.set_experts_implementation(name)``) run
    the routed experts through a ``MoeRunner`` on ``backend``. Returns the registered function.
    Registering the same name again replaces it (e.g. with another backend)."""
    if not isinstance(name, str) or not name or name == "eager":
        raise InvalidInputError(f"name must be a non-empty string other than 'eager', got {name!r}")
    from transformers.integrations.moe import ExpertsInterface

    fn = experts_forward(backend, name)
    ExpertsInterface.register(name, fn)
    return fn


def experts_forward(backend: str | type = "auto", name: str = "moe") -> Callable:
    """The experts function itself: ``fn(experts, hidden_states, top_k_index, top_k_weights) -> [T, H]``."""

    def moe_core_experts_forward(
        self: torch.nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
    ) -> torch.Tensor:
        runner = _runner(self, backend, name, top_k_index.shape[-1], hidden_states.dtype, hidden_states.device)
        return runner(hidden_states, top_k_index.to(torch.int32), top_k_weights.float())

    moe_core_experts_forward.backend = backend
    return moe_core_experts_forward


def _stamp(experts: torch.nn.Module) -> tuple:
    """Identity and version of the module's parameters: changes when they are replaced or written in place."""
    return tuple((p.data_ptr(), p._version) for p in experts.parameters(recurse=False))


def _runner(experts, backend, name: str, top_k: int, dtype: torch.dtype, device: torch.device) -> MoeRunner:
    cache = experts.__dict__.setdefault(CACHE_ATTR, {})
    key = (name, top_k, dtype, device)
    stamp = _stamp(experts)
    hit = cache.get(key)
    if hit is not None and hit[0] == stamp:
        return hit[1]
    cache.pop(key, None)  # drop a stale runner before building its successor
    if getattr(experts, "_is_expert_parallel", False):
        raise InvalidInputError(
            f"{type(experts).__name__} is expert-parallel; experts_implementation={name!r} runs unsharded experts"
        )
    runner = MoeRunner(*_canonical(experts, top_k, dtype, device), backend=backend)
    cache[key] = (stamp, runner)
    return runner


def _canonical(experts, top_k: int, dtype: torch.dtype, device: torch.device) -> tuple[MoeConfig, MoeWeights]:
    cls = type(experts).__name__
    ex = fused_experts(experts, transposed=False, concatenated=True, has_bias=False)
    alpha = float(getattr(experts, "alpha", None) or 1.702)
    limit = float(getattr(experts, "limit", None) or 7.0)
    activation = match_activation(ex, ("silu", "gelu", "swiglu_oai"), alpha=alpha, limit=limit, family=cls)
    w13, w2 = ex.w13, ex.w2
    canonical = not getattr(experts, "is_transposed", False) and getattr(experts, "is_concatenated", True)
    if canonical:  # the HF layout is the canonical one: a view of the parameters, not the gathered copy
        w13 = experts.gate_up_proj.detach()
        w2 = experts.down_proj.detach()
    cast = lambda t: None if t is None else t.to(device=device, dtype=dtype).contiguous()
    config = experts_config(ex, activation, top_k, dtype, swiglu_alpha=alpha, swiglu_limit=limit)
    return config, MoeWeights(w13=cast(w13), w2=cast(w2), b13=cast(ex.b13), b2=cast(ex.b2))
