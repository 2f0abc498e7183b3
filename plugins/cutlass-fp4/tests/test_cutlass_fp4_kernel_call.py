"""The cutlass_fused_moe call: bound against the installed signature; the op bound on a pretend SM100."""

from __future__ import annotations

import inspect

import pytest
import torch
from cutlass_fp4_testing import nvfp4_config, on_cuda

from moe_core.synthetic import random_weights
from moe_cutlass_fp4 import devices, kernel
from moe_cutlass_fp4.fused_op import CutlassFp4FusedOp as Op


@pytest.fixture
def bound_op(gpu, opt_in):
    gpu(10, 0)
    opt_in("0.02")

    def make(**kw):
        op = Op(on_cuda(**kw))
        real = inspect.signature(op._fi.cutlass_fused_moe)
        calls = []

        def kernel_stand_in(**kwargs):
            calls.append(real.bind(**kwargs).arguments)  # the exact kwargs, against the real parameters
            kwargs["output"].fill_(5)
            return [kwargs["output"], None, None, None]

        op._kernel = kernel_stand_in
        return op, calls

    return make


def test_load_finds_the_kernel_and_every_jit_module_generator():
    fi = kernel.load()
    assert callable(fi.cutlass_fused_moe) and fi.ActivationType.Swiglu is not None
    assert set(fi.modules) == set(devices.MODULES.values())
    for gen in fi.modules.values():
        inspect.signature(gen).bind()
    from flashinfer.jit.core import JitSpecNvcc

    assert hasattr(JitSpecNvcc, "build_and_load")


@pytest.mark.parametrize(
    "activation,bias,dtype", [("silu", False, torch.bfloat16), ("swiglu_oai", True, torch.float16)]
)
def test_call_kwargs_bind_to_the_installed_signature(activation, bias, dtype):
    fi = kernel.load()
    cfg = nvfp4_config(activation=activation, has_bias=bias, dtype=dtype)
    p = kernel.prepare(cfg, random_weights(cfg), 0.02)
    x = torch.randn(3, cfg.hidden_size).to(dtype)
    kwargs = kernel.call_kwargs(fi, cfg, p, x, torch.zeros(3, 2, dtype=torch.int32), torch.ones(3, 2), None)
    args = inspect.signature(fi.cutlass_fused_moe).bind(**kwargs).arguments
    assert len(args["quant_scales"]) == 6 and args["input_sf"] is None
    assert args["use_fused_finalize"] is False and args["output_dtype"] == dtype
    assert ("nvfp4_4over6" in args) == fi.takes_4over6
    if fi.takes_4over6:
        assert args["nvfp4_4over6"] is None


def test_apply(bound_op):
    op, calls = bound_op(activation="swiglu_oai", has_bias=True)
    cfg = op.config
    assert op.fc2_input_scale == 0.02
    p = op.prepare(random_weights(cfg))
    x = torch.randn(6, 2 * cfg.hidden_size).to(torch.bfloat16)[:, 1::2]
    ids, tw = torch.tensor([[0, 3]] * 6, dtype=torch.int32), torch.full((6, 2), 0.5)
    out = torch.empty(6, cfg.hidden_size, dtype=torch.bfloat16)
    assert op.apply(x, ids, tw, p, out=out) is out and bool((out == 5).all())
    (args,) = calls
    a1, s13, alpha1, a2, s2, alpha2 = args["quant_scales"]
    assert s13 is p.s13 and s2 is p.s2 and a2 is p.a2 and alpha2 is p.alpha2
    assert a1.dim() == 0 and alpha1.shape == (cfg.num_experts,)
    assert args["input"].is_contiguous() and torch.equal(args["input"], x)
    assert args["fc1_expert_weights"] is p.w13 and args["fc1_expert_biases"] is p.b13
    assert args["swiglu_beta"] is p.swiglu[1]


def test_apply_without_tokens_and_without_out(bound_op):
    op, calls = bound_op()
    p = op.prepare(random_weights(op.config))
    h = op.config.hidden_size
    empty = op.apply(torch.empty(0, h).bfloat16(), torch.empty(0, 2, dtype=torch.int32), torch.empty(0, 2), p)
    assert empty.shape == (0, h) and calls == []
    out = op.apply(torch.randn(2, h).bfloat16(), torch.zeros(2, 2, dtype=torch.int32), torch.ones(2, 2), p)
    assert out.dtype == torch.bfloat16 and bool((out == 5).all())
