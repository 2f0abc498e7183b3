"""vLLM MoE layers built on a CPU after vLLM loaded its plugins, run with ``moe_vllm_backend=auto`` (moe's torch
backend here), against moe's canonical float64 reference within moe's tolerance for the scheme.

The reference is not vLLM's own forward: on a CPU, the index's vLLM wheel (a CUDA build) has no CPU kernels
(``torch.ops._C.prepack_moe_weight`` is missing), so its unquantized path cannot run here (test_policy shows it
fail). So each test writes *canonical* weights in vLLM's checkpoint layout into the layer, routes with vLLM's
default routing written out (``vllm_setup.routing``), and the bridge's reading of vLLM's layout is what is judged.
The torch backend's ``apply`` is counted, so a test fails if vLLM's path ran instead of moe's.
"""

from __future__ import annotations

import logging

import pytest
import torch
import vllm_setup

from moe_core.config import MoeConfig
from moe_core.reference import reference_for
from moe_core.synthetic import random_weights
from moe_core.tolerances import relative_l2, tolerance
from moe_core.weights import MoeWeights

pytestmark = pytest.mark.usefixtures("vllm_with_moe")

SCHEME = {torch.bfloat16: "bf16", torch.float32: "fp32"}


def _canonical(e, h, i, k, dtype, activation="silu", seed=3):
    cfg = MoeConfig(e, k, h, i, quant_scheme=SCHEME[dtype], activation=activation, dtype=dtype)
    w = random_weights(MoeConfig(e, k, h, i, quant_scheme="fp32", dtype=torch.float32), seed=seed)
    return cfg, MoeWeights(w13=w.w13.to(dtype), w2=w.w2.to(dtype))


def _inputs(m, h, e, dtype, seed=5):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(m, h, generator=g).to(dtype), torch.randn(m, e, generator=g)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_unquantized_layer_runs_through_moe_and_matches_the_reference(dtype, torch_calls, moe_log):
    e, h, i, k, m = 8, 64, 96, 2, 13
    cfg = vllm_setup.config("auto")
    layer = vllm_setup.fused_moe(cfg, e, h, i, k, dtype)
    assert type(layer.routed_experts.quant_method).__name__ == "MoeUnquantizedFusedMoEMethod"
    canon_cfg, w = _canonical(e, h, i, k, dtype)
    vllm_setup.fill(layer, {"w13_weight": w.w13, "w2_weight": w.w2})
    lines = [r.getMessage() for r in moe_log if r.levelno == logging.INFO]
    assert any(
        "MoE layer model.layers.0.mlp.experts bound moe backend 'torch' (moe-core) for "
        f"{SCHEME[dtype]} E=8 top_k=2 H=64 I=96 silu on cpu" in line
        for line in lines
    ), lines
    x, logits = _inputs(m, h, e, dtype)
    out = vllm_setup.forward(layer, cfg, x, logits)
    assert torch_calls == [SCHEME[dtype]]
    assert out.dtype == dtype and out.shape == (m, h)
    ids, weights = vllm_setup.routing(logits, k)
    ref = reference_for(canon_cfg, w, x, ids, weights)
    err = relative_l2(out, ref)
    assert err <= tolerance(SCHEME[dtype], dtype), err


def test_vllm_weights_are_read_not_copied_into_vllms_kernel_format(torch_calls):
    """A bound layer keeps its parameters as loaded (vLLM's conversion to its kernel's format was skipped) and
    has no vLLM kernel; a second layer binds its own runner."""
    cfg = vllm_setup.config("auto")
    first = vllm_setup.fused_moe(cfg, 4, 32, 64, 2, torch.float32, layer_id=1)
    second = vllm_setup.fused_moe(cfg, 4, 32, 64, 2, torch.float32, layer_id=2)
    _, w = _canonical(4, 32, 64, 2, torch.float32)
    _, w_other = _canonical(4, 32, 64, 2, torch.float32, seed=8)
    vllm_setup.fill(first, {"w13_weight": w.w13, "w2_weight": w.w2})
    vllm_setup.fill(second, {"w13_weight": w_other.w13, "w2_weight": w_other.w2})
    experts = first.routed_experts
    assert torch.equal(experts.w13_weight, w.w13) and torch.equal(experts.w2_weight, w.w2)
    assert experts.quant_method.moe_kernel is None and not experts.quant_method.is_monolithic
    x, logits = _inputs(3, 32, 4, torch.float32)
    a, b = vllm_setup.forward(first, cfg, x, logits), vllm_setup.forward(second, cfg, x, logits)
    assert len(torch_calls) == 2 and not torch.allclose(a, b)
    assert experts.quant_method.moe_binding.runner is not second.routed_experts.quant_method.moe_binding.runner


def test_gelu_layer(torch_calls):
    e, h, i, k, m = 4, 32, 64, 2, 6
    cfg = vllm_setup.config("torch")
    layer = vllm_setup.fused_moe(cfg, e, h, i, k, torch.float32, activation="gelu", layer_id=3)
    canon_cfg, w = _canonical(e, h, i, k, torch.float32, activation="gelu")
    vllm_setup.fill(layer, {"w13_weight": w.w13, "w2_weight": w.w2})
    x, logits = _inputs(m, h, e, torch.float32)
    out = vllm_setup.forward(layer, cfg, x, logits)
    ids, weights = vllm_setup.routing(logits, k)
    assert relative_l2(out, reference_for(canon_cfg, w, x, ids, weights)) <= tolerance("fp32", torch.float32)
    assert torch_calls == ["fp32"]


def test_gpt_oss_swigluoai_layer_with_biases_is_deinterleaved(torch_calls):
    """vLLM's ``swigluoai`` reads w13 rows interleaved (``g0, u0, g1, u1, ...``, as gpt-oss checkpoints are); the
    bridge hands moe ``[gate; up]`` halves, and biases the same way."""
    e, h, i, k, m = 4, 32, 64, 2, 7
    cfg = vllm_setup.config("auto")
    layer = vllm_setup.fused_moe(cfg, e, h, i, k, torch.bfloat16, activation="swigluoai", has_bias=True, layer_id=4)
    _, w = _canonical(e, h, i, k, torch.bfloat16, activation="swiglu_oai")
    g = torch.Generator().manual_seed(9)
    b13, b2 = torch.randn(e, 2 * i, generator=g).bfloat16(), torch.randn(e, h, generator=g).bfloat16()
    canon_cfg = MoeConfig(e, k, h, i, quant_scheme="bf16", activation="swiglu_oai", has_bias=True)
    order = torch.stack([torch.arange(i), torch.arange(i) + i], dim=1).reshape(-1)  # [g0, u0, g1, u1, ...]
    vllm_setup.fill(layer, {"w13_weight": w.w13[:, order], "w2_weight": w.w2, "w13_bias": b13[:, order], "w2_bias": b2})
    x, logits = _inputs(m, h, e, torch.bfloat16)
    out = vllm_setup.forward(layer, cfg, x, logits)
    assert torch_calls == ["bf16"]
    ids, weights = vllm_setup.routing(logits, k)
    ref = reference_for(canon_cfg, MoeWeights(w13=w.w13, w2=w.w2, b13=b13, b2=b2), x, ids, weights)
    assert relative_l2(out, ref) <= tolerance("bf16", torch.bfloat16)


def test_routed_scaling_factor_applied_by_vllms_runner_on_moes_output(torch_calls):
    """vLLM applies a model's routed scaling factor outside the method (in its router's weights where that router
    can, else on the runner's output: ``apply_routed_scale_to_output``), so moe's output is scaled as vLLM's is."""
    e, h, i, k, m = 4, 32, 64, 2, 5
    cfg = vllm_setup.config("auto")
    layer = vllm_setup.fused_moe(
        cfg, e, h, i, k, torch.float32, routed_scaling_factor=2.5, apply_routed_scale_to_output=True, layer_id=5
    )
    canon_cfg, w = _canonical(e, h, i, k, torch.float32)
    vllm_setup.fill(layer, {"w13_weight": w.w13, "w2_weight": w.w2})
    x, logits = _inputs(m, h, e, torch.float32)
    out = vllm_setup.forward(layer, cfg, x, logits)
    ids, weights = vllm_setup.routing(logits, k)
    ref = 2.5 * reference_for(canon_cfg, w, x, ids, weights)
    assert relative_l2(out, ref) <= tolerance("fp32", torch.float32)
    assert len(torch_calls) == 1


def test_expert_map_turns_global_ids_into_local_ones_and_other_ranks_experts_into_minus_one():
    """Expert parallelism without all-to-all kernels: vLLM's runner hands global ids and the layer's
    ``expert_map``; moe gets this rank's ids, ``-1`` (zero contribution) for another rank's expert."""
    from moe_vllm import routing

    class Layer:
        expert_map = torch.tensor([-1, -1, 0, 1])  # this rank holds global experts 2 and 3

    ids, weights = routing.explicit_topk(Layer(), torch.tensor([[0, 2], [3, 1]]), torch.ones(2, 2).bfloat16())
    assert ids.dtype == torch.int32 and weights.dtype == torch.float32
    assert ids.tolist() == [[-1, 0], [1, -1]]
    Layer.expert_map = None
    assert routing.explicit_topk(Layer(), torch.tensor([[0, 2]]), torch.ones(1, 2))[0].tolist() == [[0, 2]]
