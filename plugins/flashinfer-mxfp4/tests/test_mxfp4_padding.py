"""Zero padding to 128 multiples (gpt-oss's 2880): the padded layer computes the same function.

Checked with moe-core's float64 reference on the canonical weights, so it
holds for whichever kernel then runs the padded layer; and the op's apply
hands the kernel padded buffers and returns the unpadded output.
"""

from __future__ import annotations

import pytest
import torch
from mxfp4_testing import bound, cuda_problem

from moe_core.config import MoeConfig
from moe_core.reference import reference_for
from moe_core.synthetic import random_inputs, random_weights
from moe_flashinfer_mxfp4 import padding


@pytest.mark.parametrize("activation,bias", [("silu", False), ("swiglu_oai", True)])
@pytest.mark.parametrize("hidden,inter", [(160, 96), (128, 224), (96, 128)])
def test_the_padded_layer_is_the_same_function(activation, bias, hidden, inter):
    cfg = MoeConfig(6, 2, hidden, inter, quant_scheme="mxfp4", activation=activation, has_bias=bias)
    w = random_weights(cfg, seed=3)
    x, ids, tw = random_inputs(cfg, 5, seed=4)
    cfg_p = padding.padded_config(cfg)
    assert (cfg_p.hidden_size, cfg_p.intermediate_size) == (padding.padded(hidden), padding.padded(inter))
    assert cfg_p.hidden_size % 128 == 0 and cfg_p.intermediate_size % 128 == 0
    w_p = padding.pad_weights(cfg, w)
    assert w_p.w13.shape == (6, 2 * cfg_p.intermediate_size, cfg_p.hidden_size // 2)
    assert w_p.w2_scale.shape == (6, cfg_p.hidden_size, cfg_p.intermediate_size // 32)
    want = reference_for(cfg, w, x, ids, tw)
    got = reference_for(cfg_p, w_p, padding.pad_input(x, cfg_p.hidden_size), ids, tw)
    assert got.shape == (5, cfg_p.hidden_size)
    torch.testing.assert_close(got[:, :hidden], want, rtol=0, atol=0)
    assert bool((got[:, hidden:] == 0).all())


def test_aligned_layers_are_not_copied():
    cfg = MoeConfig(4, 2, 256, 128, quant_scheme="mxfp4")
    w = random_weights(cfg)
    assert padding.pad_weights(cfg, w) is w and not padding.needs_padding(cfg)
    x = torch.randn(3, 256)
    assert padding.pad_input(x, 256) is x


def test_apply_runs_the_kernel_on_padded_buffers_and_returns_the_layer_size(fake_gpu):
    from moe_flashinfer_mxfp4.fused_op import FlashInferMxfp4FusedOp as Op

    fake_gpu((9, 0))
    op = Op(cuda_problem(hidden_size=160, intermediate_size=96, activation="swiglu_oai", has_bias=True))
    real = op._fi
    seen = []

    def kernel(**kw):
        seen.append(kw)
        kw["output"].copy_(torch.arange(kw["output"].shape[1], dtype=torch.bfloat16).expand_as(kw["output"]))
        return [kw["output"]]

    from types import SimpleNamespace

    op._fi = SimpleNamespace(
        **{
            **vars(real),
            "interleave_moe_weights_for_sm90_mixed_gemm": lambda w, q="fp4": w.clone(),
            "cutlass_fused_moe": bound(real.cutlass_fused_moe, kernel),
        }
    )
    p = op.prepare(random_weights(op.config))
    assert p.w13.shape == (op.config.num_experts, 2 * 128, 256 // 2) and p.b2.shape == (op.config.num_experts, 256)
    x = torch.randn(3, 160, dtype=torch.bfloat16)
    out = op.apply(x, torch.zeros(3, 2, dtype=torch.int32), torch.ones(3, 2), p)
    (kw,) = seen
    assert (
        kw["input"].shape == (3, 256)
        and torch.equal(kw["input"][:, :160], x)
        and bool((kw["input"][:, 160:] == 0).all())
    )
    assert kw["output"].shape == (3, 256) and out.shape == (3, 160)
    assert torch.equal(out[0], torch.arange(160, dtype=torch.bfloat16))
