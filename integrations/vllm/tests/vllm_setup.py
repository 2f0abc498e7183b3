"""Building vLLM MoE layers on a CPU as vLLM's own layer tests do, with nothing faked.

``FusedMoEFactory`` (vLLM 0.33 has no ``FusedMoE`` class) reads the current ``VllmConfig``, so a layer is built
inside ``set_current_vllm_config``; single-process widths (``tp_size=1, dp_size=1, pcp_size=1``) need no process
group. A forward runs inside ``set_forward_context`` (vLLM's runner reads it). The moe switch goes through
``additional_config``, as an operator's ``--additional-config`` would.
"""

from __future__ import annotations

import torch


def load_plugins() -> None:
    """vLLM's own plugin loading (entry-point group ``vllm.general_plugins``), as every vLLM process does."""
    from vllm.plugins import load_general_plugins

    load_general_plugins()


def config(backend: str | None = None):
    """A ``VllmConfig`` asking for moe ``backend`` (None: the switch left out, vLLM's own path)."""
    from vllm.config import VllmConfig

    return VllmConfig(additional_config={} if backend is None else {"moe_vllm_backend": backend})


def fused_moe(cfg, e: int, h: int, i: int, top_k: int, dtype: torch.dtype, layer_id: int = 0, **kwargs):
    """vLLM's MoE runner (router + ``RoutedExperts``) for one layer, built under ``cfg``."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.layers.fused_moe.layer import FusedMoEFactory

    with set_current_vllm_config(cfg):
        return FusedMoEFactory(
            num_experts=e,
            top_k=top_k,
            hidden_size=h,
            intermediate_size=i,
            params_dtype=dtype,
            tp_size=1,
            dp_size=1,
            pcp_size=1,
            prefix=f"model.layers.{layer_id}.mlp.experts",
            **kwargs,
        )


def fill(layer, weights: dict[str, torch.Tensor]) -> None:
    """Write tensors into the layer's experts as vLLM's weight loader leaves them, then process them."""
    experts = layer.routed_experts
    with torch.no_grad():
        for name, value in weights.items():
            getattr(experts, name).data.copy_(value)
    experts.quant_method.process_weights_after_loading(experts)


def forward(layer, cfg, x: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    from vllm.config import set_current_vllm_config
    from vllm.forward_context import set_forward_context

    with set_current_vllm_config(cfg), set_forward_context(None, cfg, num_tokens=x.shape[0]):
        return layer(x, logits)


def routing(logits: torch.Tensor, top_k: int, scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM's default routing, written out: softmax, top-k, renormalised (``renormalize=True``), scaled."""
    weights, ids = torch.topk(logits.float().softmax(-1), top_k)
    return ids.to(torch.int32), scale * weights / weights.sum(-1, keepdim=True)
