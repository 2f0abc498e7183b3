"""One scenario in a fresh interpreter (the tests run ``python scenario.py NAME [ARG]`` and read its JSON line).

- ``layer ORDER``: vLLM's plugins loaded, an unquantized bf16 layer built with ``moe_vllm_backend=auto`` and run;
  ORDER says what is imported before vLLM loads its plugins. Prints the method, the bound backend and the error
  against moe's reference.
- ``built-before``: one layer built before vLLM loads its plugins and one after.
- ``stock BACKEND``: vLLM as it is, with or without moe-vllm loaded (``VLLM_PLUGINS`` decides), a layer built with
  the switch at BACKEND (``-``: left out): its method, vLLM's op name and what vLLM's own processing of the
  loaded weights does on this CPU.
"""

from __future__ import annotations

import json
import sys

import torch
import vllm_setup


def _layer(backend, layer_id=0):
    cfg = vllm_setup.config(backend)
    return cfg, vllm_setup.fused_moe(cfg, 4, 32, 64, 2, torch.bfloat16, layer_id=layer_id)


def layer(order: str) -> dict:
    if order == "moe-first":
        import moe_core
        import moe_core.backends.torch.fused_op

        moe_core.default_registry().entries()
    elif order == "vllm-first":
        import vllm.model_executor.layers.fused_moe.layer
        import vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method  # noqa: F401
    vllm_setup.load_plugins()
    from moe_core.config import MoeConfig
    from moe_core.reference import reference_for
    from moe_core.synthetic import random_weights
    from moe_core.tolerances import relative_l2, tolerance

    cfg, moe = _layer("auto")
    w = random_weights(MoeConfig(4, 2, 32, 64, quant_scheme="bf16"), seed=1)
    vllm_setup.fill(moe, {"w13_weight": w.w13, "w2_weight": w.w2})
    g = torch.Generator().manual_seed(2)
    x, logits = torch.randn(6, 32, generator=g).bfloat16(), torch.randn(6, 4, generator=g)
    out = vllm_setup.forward(moe, cfg, x, logits)
    ids, weights = vllm_setup.routing(logits, 2)
    err = relative_l2(out, reference_for(MoeConfig(4, 2, 32, 64, quant_scheme="bf16"), w, x, ids, weights))
    method = moe.routed_experts.quant_method
    return {
        "method": type(method).__name__,
        "backend": method.moe_binding.runner.backend,
        "within_tolerance": err <= tolerance("bf16", torch.bfloat16),
    }


def built_before() -> dict:
    _, before = _layer("auto")
    vllm_setup.load_plugins()
    _, after = _layer("auto", layer_id=1)
    return {
        "before": type(before.routed_experts.quant_method).__name__,
        "after": type(after.routed_experts.quant_method).__name__,
    }


def stock(backend: str) -> dict:
    vllm_setup.load_plugins()
    _, moe = _layer(None if backend == "-" else backend)
    experts = moe.routed_experts
    method = experts.quant_method
    with torch.no_grad():
        experts.w13_weight.normal_()
        experts.w2_weight.normal_()
    try:
        method.process_weights_after_loading(experts)
        raised = None
    except Exception as exc:  # the scenario reports whatever vLLM's own path raised
        raised = f"{type(exc).__name__}: {exc}"
    return {
        "method": type(method).__name__,
        "op_name": type(method).name,
        "vllm_backend": method.unquantized_backend.value,
        "raised": raised,
        "bound": getattr(getattr(method, "moe_binding", None), "runner", None) is not None,
    }


if __name__ == "__main__":
    name, *rest = sys.argv[1:]
    result = {"layer": layer, "built-before": built_before, "stock": stock}[name](*rest)
    print("RESULT " + json.dumps(result))
