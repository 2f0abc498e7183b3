"""Every FlashInfer call this backend makes, bound against the installed FlashInfer's real signatures.

``inspect.signature(fn).bind(**kwargs)`` raises TypeError for a renamed,
removed or newly required parameter, so an API change fails here, on CPU.
"""

from __future__ import annotations

import inspect

import pytest
import torch
from mxfp4_testing import config

from moe_flashinfer_mxfp4 import kernel


@pytest.fixture(scope="module")
def fi():
    return kernel.load()


def t(*shape, dtype=torch.uint8):
    return torch.zeros(*shape, dtype=dtype)


def test_load_finds_every_symbol(fi):
    for name in (
        "cutlass_fused_moe",
        "trtllm_fp4_block_scale_routed_moe",
        "interleave_moe_weights_for_sm90_mixed_gemm",
        "interleave_moe_scales_for_sm90_mixed_gemm",
        "reorder_rows_for_gated_act_gemm",
        "shuffle_matrix_a",
        "shuffle_matrix_sf_a",
        "gen_cutlass_fused_moe_sm90_module",
        "gen_trtllm_gen_fused_moe_sm100_module",
    ):
        assert callable(getattr(fi, name)), name
    assert fi.ActivationType.Swiglu is not None and fi.RoutingMethodType.TopK is not None
    assert fi.SfLayout.layout_linear is not None


@pytest.mark.parametrize("bias,activation", [(False, "silu"), (True, "swiglu_oai")])
def test_cutlass_fused_moe_call_binds(fi, bias, activation):
    cfg = config(has_bias=bias, activation=activation)
    e, h, i = cfg.num_experts, cfg.hidden_size, cfg.intermediate_size
    alpha, beta, limit = kernel.activation_params(cfg, "cpu")
    p = kernel.Sm90Weights(
        w13=t(e, 2 * i, h // 2),
        w2=t(e, h, i // 2),
        quant_scales=[t(e, 2 * i // 64, h // 128, 16, 4, dtype=torch.int32), t(e, h // 64, i // 128, 16, 4)],
        b13=t(e, 2 * i, dtype=torch.bfloat16) if bias else None,
        b2=t(e, h, dtype=torch.bfloat16) if bias else None,
        swiglu_alpha=alpha,
        swiglu_beta=beta,
        swiglu_limit=limit,
    )
    x, ids, w, out = t(3, h, dtype=torch.bfloat16), t(3, 2, dtype=torch.int32), t(3, 2, dtype=torch.float32), None
    kwargs = kernel.sm90_kwargs(fi, p, x, ids, w, out)
    bound = inspect.signature(fi.cutlass_fused_moe).bind(**kwargs)
    assert bound.arguments["use_w4_group_scaling"] is True
    assert bound.arguments["use_fused_finalize"] is False


def test_trtllm_routed_call_binds(fi):
    cfg = config(has_bias=True, activation="swiglu_oai")
    e, h, i = cfg.num_experts, cfg.hidden_size, cfg.intermediate_size
    alpha, beta, limit = kernel.activation_params(cfg, "cpu")
    f8 = torch.float8_e4m3fn
    p = kernel.Sm100Weights(
        w13=t(e, 2 * i, h // 2),
        s13=t(e, 2 * i, h // 32).view(f8),
        b13=t(e, 2 * i, dtype=torch.float32),
        w2=t(e, h, i // 2),
        s2=t(e, h, i // 32).view(f8),
        b2=t(e, h, dtype=torch.float32),
        alpha=alpha,
        beta=beta,
        limit=limit,
        ones=torch.ones(e),
    )
    x, ids, w = t(3, h, dtype=torch.bfloat16), t(3, 2, dtype=torch.int32), t(3, 2, dtype=torch.float32)
    kwargs = kernel.sm100_kwargs(fi, p, cfg, x, ids, w, None)
    inspect.signature(fi.trtllm_fp4_block_scale_routed_moe).bind(**kwargs)
    assert fi.routed_takes_sf_layout == ("hidden_states_scale_layout" in kwargs)


def test_prepare_helper_calls_bind(fi):
    sig = inspect.signature
    sig(fi.interleave_moe_weights_for_sm90_mixed_gemm).bind(t(2, 256, 128), "fp4")
    sig(fi.interleave_moe_scales_for_sm90_mixed_gemm).bind(t(2, 256, 8), group_size=32)
    sig(fi.reorder_rows_for_gated_act_gemm).bind(t(256, 128))
    sig(fi.shuffle_matrix_a).bind(t(256, 128), 128)
    sig(fi.shuffle_matrix_sf_a).bind(t(256, 8), 128)
    sig(fi.gen_cutlass_fused_moe_sm90_module).bind()
    sig(fi.gen_trtllm_gen_fused_moe_sm100_module).bind()


def test_jit_spec_api_used_by_warmup():
    from flashinfer.jit.core import JitSpec, JitSpecNvcc

    for attr in ("build_and_load", "get_object_paths", "is_aot", "is_compiled", "build_dir"):
        assert hasattr(JitSpecNvcc, attr), attr
    assert "build_and_load" in vars(JitSpec)
