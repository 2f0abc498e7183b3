"""SGLang MoE layers built on a CPU, run through ``--moe-runner-backend moe`` (moe's torch backend here), against
SGLang's own CPU forward (``moe_forward_native``) on the same layer, within moe's tolerance for the scheme.

One process: SGLang's plugins are loaded (moe-sglang among them) and ``moe`` is published as the runner backend.
The torch backend's ``apply`` is counted, so a test fails if SGLang's native path ran instead of moe's (on CPU,
SGLang's quantization methods never call their runner: the reason ``apply`` is hooked).
"""

from __future__ import annotations

import logging

import pytest
import sgl_setup
import torch

from moe_core.config import MoeConfig
from moe_core.quant.codec import dequantize_weights, quantize_weights
from moe_core.reference import reference_for
from moe_core.synthetic import random_weights
from moe_core.tolerances import relative_l2, tolerance

pytestmark = pytest.mark.usefixtures("sglang_with_moe")


def _native(layer, x, topk):
    from sglang.srt.layers.moe.fused_moe_native import moe_forward_native

    return moe_forward_native(layer, x, topk, layer.moe_runner_config)


def _fill(layer, weights: dict[str, torch.Tensor]) -> None:
    with torch.no_grad():
        for name, value in weights.items():
            getattr(layer, name).data.copy_(value)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_unquantized_layer_equals_sglang_native(dtype, torch_calls, caplog):
    e, h, i, k, m = 8, 64, 96, 2, 13
    layer = sgl_setup.fused_moe(e, h, i, k, dtype)
    w = random_weights(MoeConfig(e, k, h, i, quant_scheme="fp32", dtype=torch.float32), seed=3)
    _fill(layer, {"w13_weight": w.w13, "w2_weight": w.w2})
    with caplog.at_level(logging.INFO, logger="moe_sglang"):
        layer.quant_method.process_weights_after_loading(layer)
    assert "MoE layer 0 (model.layers.0.mlp.experts) bound moe backend 'torch' (moe-core)" in caplog.text
    x = torch.randn(m, h, generator=torch.Generator().manual_seed(5)).to(dtype)
    topk = sgl_setup.routing(m, e, k)
    out = layer(x, topk)
    assert torch_calls == [{torch.bfloat16: "bf16", torch.float32: "fp32"}[dtype]]
    ref = _native(layer, x, topk)
    assert out.dtype == dtype and out.shape == (m, h)
    err = relative_l2(out, ref)
    assert err <= tolerance("bf16" if dtype == torch.bfloat16 else "fp32", dtype), err
    assert err > 0 or dtype == torch.float32  # two implementations: bf16 rounding differs somewhere


def test_other_ranks_experts_contribute_zero_and_routed_scaling_applies(torch_calls):
    """``-1`` ids (SGLang's EP dispatcher: an expert on another rank) add nothing; SGLang's routed scaling factor
    multiplies the output, as its triton runner does."""
    e, h, i, k, m = 4, 32, 64, 2, 6
    layer = sgl_setup.fused_moe(e, h, i, k, torch.float32, routed_scaling_factor=2.5)
    w = random_weights(MoeConfig(e, k, h, i, quant_scheme="fp32", dtype=torch.float32), seed=4)
    _fill(layer, {"w13_weight": w.w13, "w2_weight": w.w2})
    layer.quant_method.process_weights_after_loading(layer)
    topk = sgl_setup.routing(m, e, k, seed=2)
    ids = topk.topk_ids.clone()
    ids[::2, 1] = -1
    x = torch.randn(m, h)
    out = layer(x, topk._replace(topk_ids=ids))
    kept = topk._replace(topk_ids=torch.where(ids < 0, topk.topk_ids, ids), topk_weights=topk.topk_weights * (ids >= 0))
    ref = 2.5 * _native(layer, x, kept)
    assert relative_l2(out, ref) <= tolerance("fp32", torch.float32)
    assert len(torch_calls) == 1


def test_fp8_block_layer_reads_sglang_layout(torch_calls):
    """Block fp8 (e4m3, fp32 scale per 128x128): SGLang's CPU path needs AMX (sgl_kernel), so the reference is
    moe's float64 oracle on the canonical weights written into the layer — which checks that the bridge reads
    SGLang's fp8 layout (weights and ``*_weight_scale_inv``) as the canonical one."""
    from sglang.srt.layers.quantization.fp8 import Fp8Config

    e, h, i, k, m = 4, 256, 128, 2, 5
    quant = Fp8Config(is_checkpoint_fp8_serialized=True, weight_block_size=[128, 128])
    layer = sgl_setup.fused_moe(e, h, i, k, torch.bfloat16, quant_config=quant, layer_id=1)
    cfg = MoeConfig(e, k, h, i, quant_scheme="fp8_block", dtype=torch.bfloat16)
    q = quantize_weights(random_weights(MoeConfig(e, k, h, i, quant_scheme="fp32", dtype=torch.float32)), "fp8_block")
    _fill(layer, {"w13_weight": q.w13, "w2_weight": q.w2, "w13_weight_scale_inv": q.w13_scale})
    _fill(layer, {"w2_weight_scale_inv": q.w2_scale})
    layer.quant_method.process_weights_after_loading(layer)
    x = torch.randn(m, h).bfloat16()
    topk = sgl_setup.routing(m, e, k, seed=7)
    out = layer(x, topk)
    assert torch_calls == ["fp8_block"]
    ref = reference_for(cfg, q, x, topk.topk_ids, topk.topk_weights)
    assert relative_l2(out, ref) <= tolerance("fp8_block", torch.bfloat16)


def test_mxfp4_gpt_oss_layer_equals_sglang_native_on_dequantized_weights(torch_calls):
    """gpt-oss MXFP4: interleaved gate/up rows, biases, SwiGLU with alpha 1.702 and limit 7. SGLang's CPU MXFP4 path
    needs AMX; its native forward on the dequantized (still interleaved) weights is SGLang's own arithmetic for
    the layer (``swiglu_gpt_oss_sigmoid_alpha`` reads interleaved rows), so the bridge's de-interleaving is
    checked against SGLang, not against itself."""
    from sglang.srt.layers.quantization.mxfp4 import Mxfp4Config

    e, h, i, k, m = 4, 64, 64, 2, 7
    quant = Mxfp4Config(is_checkpoint_mxfp4_serialized=True)
    layer = sgl_setup.fused_moe(
        e,
        h,
        i,
        k,
        torch.bfloat16,
        quant_config=quant,
        layer_id=2,
        with_bias=True,
        gemm1_alpha=1.702,
        gemm1_clamp_limit=7.0,
    )
    canon = quantize_weights(random_weights(MoeConfig(e, k, h, i, quant_scheme="fp32", dtype=torch.float32)), "mxfp4")
    order = torch.stack([torch.arange(i), torch.arange(i) + i], dim=1).reshape(-1)  # [g0, u0, g1, u1, ...]
    g = torch.Generator().manual_seed(9)
    b13, b2 = torch.randn(e, 2 * i, generator=g).bfloat16(), torch.randn(e, h, generator=g).bfloat16()
    _fill(
        layer,
        {
            "w13_weight": canon.w13[:, order],
            "w13_weight_scale": canon.w13_scale[:, order],
            "w2_weight": canon.w2,
            "w2_weight_scale": canon.w2_scale,
            "w13_weight_bias": b13[:, order],
            "w2_weight_bias": b2,
        },
    )
    # SGLang's reference layer: the same layer's dequantized weights, in SGLang's (interleaved) layout
    deq13, deq2 = dequantize_weights(canon, "mxfp4", torch.bfloat16)
    reference_layer = torch.nn.Module()
    reference_layer.num_experts = e
    reference_layer.w13_weight, reference_layer.w2_weight = deq13[:, order], deq2
    reference_layer.w13_weight_bias, reference_layer.w2_weight_bias = b13[:, order].float(), b2.float()
    layer.quant_method.process_weights_after_loading(layer)
    x = torch.randn(m, h, generator=g).bfloat16()
    topk = sgl_setup.routing(m, e, k, seed=11)
    out = layer(x, topk)
    assert torch_calls == ["mxfp4"]
    from sglang.srt.layers.moe.fused_moe_native import moe_forward_native

    ref = moe_forward_native(reference_layer, x, topk, layer.moe_runner_config)
    assert relative_l2(out, ref) <= tolerance("mxfp4", torch.bfloat16)
