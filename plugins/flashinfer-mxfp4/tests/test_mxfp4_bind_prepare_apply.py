"""Binding on a pretend SM90 / SM100 device, prepare's layouts element by element, apply's kernel calls.

The op is bound for real (flashinfer imported, its helpers probed); only the
CUDA-only pieces are replaced, by stand-ins that first bind their arguments
to the installed FlashInfer's real signatures (``conftest.bound``):
``interleave_moe_weights_for_sm90_mixed_gemm`` (identity: its bytes are the
kernel's business, checked on the GPU), ``shuffle_matrix_sf_a`` (row shuffle
+ moe-core's 128x4 swizzle, itself checked against FlashInfer's unswizzle),
and the two fused-MoE kernels (write a marker into ``output``).
"""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest
import torch
from mxfp4_testing import bound, cuda_problem, weights

from moe_core.errors import BackendUnavailableError
from moe_core.layout import swizzle_128x4, unswizzle_128x4
from moe_flashinfer_mxfp4 import devices, kernel, layout
from moe_flashinfer_mxfp4.fused_op import FlashInferMxfp4FusedOp as Op


def bind_op(fake_gpu, cap, **kw):
    fake_gpu(cap)
    op = Op(cuda_problem(**kw))
    real = op._fi
    calls = {"weights": [], "kernel": []}

    def fake_kernel(**kwargs):
        kwargs["output"].fill_(7)
        return [kwargs["output"], None, None, None]

    def sf_stand_in(t, epilogue_tile_m, num_elts_per_sf=16):
        return swizzle_128x4(t[layout.shuffle_rows_source(t.shape[0])]).flatten()

    op._fi = SimpleNamespace(
        **{
            **vars(real),
            "interleave_moe_weights_for_sm90_mixed_gemm": bound(
                real.interleave_moe_weights_for_sm90_mixed_gemm, lambda w, q="fp4": w.clone(), calls["weights"]
            ),
            "interleave_moe_scales_for_sm90_mixed_gemm": bound(real.interleave_moe_scales_for_sm90_mixed_gemm),
            "shuffle_matrix_a": bound(real.shuffle_matrix_a),
            "reorder_rows_for_gated_act_gemm": bound(real.reorder_rows_for_gated_act_gemm),
            "shuffle_matrix_sf_a": bound(real.shuffle_matrix_sf_a, sf_stand_in),
            "cutlass_fused_moe": bound(real.cutlass_fused_moe, fake_kernel, calls["kernel"]),
            "trtllm_fp4_block_scale_routed_moe": bound(
                real.trtllm_fp4_block_scale_routed_moe, fake_kernel, calls["kernel"]
            ),
        }
    )
    return op, calls


def up_gate_source(i: int) -> torch.Tensor:
    """Canonical row of each [up; gate] row, written without moe_core.layout."""
    return torch.tensor([i + r if r < i else r - i for r in range(2 * i)])


# ---- bind ------------------------------------------------------------------------------------------
def test_bind_on_sm90_verifies_the_v2_layout(fake_gpu):
    op, _ = bind_op(fake_gpu, (9, 0))
    assert op.kernel_path == devices.SM90_CUTLASS and op.layout == "v2"


def test_bind_on_sm100_verifies_the_row_shuffle(fake_gpu):
    op, _ = bind_op(fake_gpu, (10, 0))
    assert op.kernel_path == devices.SM100_TRTLLM and "trtllm-gen" in op.layout


def test_bind_refuses_when_the_probe_disagrees_with_the_version(fake_gpu, monkeypatch):
    fake_gpu((9, 0))
    real_load = kernel.load

    def v1_helper():
        fi = real_load()
        fi.interleave_moe_scales_for_sm90_mixed_gemm = lambda s, group_size=32: layout.sm90_fold_scales_v1(s)
        return fi

    monkeypatch.setattr(kernel, "load", v1_helper)
    with pytest.raises(BackendUnavailableError, match=r"layout 'v2' by its version.*produces layout 'v1'"):
        Op(cuda_problem())


def test_bind_refuses_when_the_version_disagrees_with_the_probe(fake_gpu, monkeypatch):
    from packaging.version import Version

    fake_gpu((9, 0))
    real_load = kernel.load

    def older():
        fi = real_load()
        fi.version = Version("0.6.17")
        return fi

    monkeypatch.setattr(kernel, "load", older)
    with pytest.raises(BackendUnavailableError, match=r"layout 'v1' by its version.*produces layout 'v2'"):
        Op(cuda_problem())


def test_bind_refuses_an_imported_flashinfer_that_is_not_the_installed_one(fake_gpu, monkeypatch):
    import flashinfer

    fake_gpu((9, 0))
    monkeypatch.setattr(flashinfer, "__version__", "0.7.2")
    with pytest.raises(BackendUnavailableError, match="reports version 0.7.2 but the installed"):
        Op(cuda_problem())


def test_bind_refuses_when_the_check_fails(fake_gpu):
    fake_gpu((8, 0))
    with pytest.raises(BackendUnavailableError, match="SM80 not supported"):
        Op(cuda_problem())


# ---- SM90 prepare -----------------------------------------------------------------------------------
@pytest.mark.parametrize("activation,bias", [("silu", False), ("swiglu_oai", True)])
def test_sm90_prepare(fake_gpu, activation, bias):
    op, calls = bind_op(fake_gpu, (9, 0), activation=activation, has_bias=bias)
    cfg = op.config
    e, h, i = cfg.num_experts, cfg.hidden_size, cfg.intermediate_size
    w = weights(cfg)
    p = op.prepare(w)
    src = up_gate_source(i)
    # weights handed to FlashInfer's interleave: [up; gate] rows, contiguous uint8, "fp4"
    w13_arg, w2_arg = (c["weight"] for c in calls["weights"])
    assert [c["quant_type"] for c in calls["weights"]] == ["fp4", "fp4"]
    assert w13_arg.is_contiguous() and torch.equal(w13_arg, w.w13[:, src])
    assert torch.equal(w2_arg, w.w2)
    # scales: folded by FlashInfer's helper = the v2 formula applied to the [up; gate] scales
    s13, s2 = (q.view(torch.uint8) for q in p.quant_scales)
    assert p.quant_scales[0].dtype == torch.int32
    assert s13.shape == (e, 2 * i // 64, h // 128, 16, 16) and s2.shape == (e, h // 64, i // 128, 16, 16)
    for x, r, g in itertools.product(range(e), range(0, 2 * i, 7), range(h // 32)):
        assert s13[x, r // 64, g // 4, r % 16, 4 * ((r % 64) // 16) + g % 4] == w.w13_scale[x, src[r], g]
    for x, r, g in itertools.product(range(e), range(0, h, 5), range(i // 32)):
        assert s2[x, r // 64, g // 4, r % 16, 4 * ((r % 64) // 16) + g % 4] == w.w2_scale[x, r, g]
    if bias:
        assert p.b13.dtype == torch.bfloat16 and torch.equal(p.b13, w.b13[:, src])
        assert torch.equal(p.b2, w.b2)
    else:
        assert p.b13 is None and p.b2 is None
    if activation == "swiglu_oai":
        assert p.swiglu_alpha.tolist() == [pytest.approx(1.702)] * e
        assert p.swiglu_beta.tolist() == [1.0] * e and p.swiglu_limit.tolist() == [7.0] * e
        assert p.swiglu_alpha.dtype == torch.float32
    else:
        assert p.swiglu_alpha is None and p.swiglu_beta is None and p.swiglu_limit is None


def test_sm90_prepare_refuses_an_unexpected_helper_result(fake_gpu):
    op, _ = bind_op(fake_gpu, (9, 0))
    op._fi.interleave_moe_scales_for_sm90_mixed_gemm = lambda s, group_size=32: layout.sm90_fold_scales_v1(s)
    with pytest.raises(BackendUnavailableError, match="expected uint8"):
        op.prepare(weights(op.config))


def test_sm90_apply_calls_cutlass_with_deterministic_finalize(fake_gpu):
    op, calls = bind_op(fake_gpu, (9, 0), activation="swiglu_oai", has_bias=True)
    p = op.prepare(weights(op.config))
    x = torch.randn(5, 2 * op.config.hidden_size, dtype=torch.bfloat16)[:, ::2]  # non-contiguous
    ids = torch.tensor([[0, 1]] * 5, dtype=torch.int32)
    tw = torch.full((5, 2), 0.5)
    out = torch.zeros(5, op.config.hidden_size, dtype=torch.bfloat16)
    got = op.apply(x, ids, tw, p, out=out)
    assert got is out and bool((out == 7).all())
    (kw,) = calls["kernel"]
    assert kw["use_w4_group_scaling"] is True and kw["use_fused_finalize"] is False
    assert kw["output"] is out and kw["output_dtype"] == torch.bfloat16
    assert kw["input"].is_contiguous() and torch.equal(kw["input"], x)
    assert kw["token_selected_experts"].dtype == torch.int32 and kw["token_final_scales"].dtype == torch.float32
    assert kw["quant_scales"] is p.quant_scales and kw["fc1_expert_biases"] is p.b13
    assert kw["swiglu_beta"] is p.swiglu_beta
    assert int(kw["activation_type"]) == int(op._fi.ActivationType.Swiglu)


def test_apply_allocates_out_and_skips_the_kernel_for_no_tokens(fake_gpu):
    op, calls = bind_op(fake_gpu, (9, 0))
    p = op.prepare(weights(op.config))
    h = op.config.hidden_size
    empty = op.apply(
        torch.empty(0, h, dtype=torch.bfloat16), torch.empty(0, 2, dtype=torch.int32), torch.empty(0, 2), p
    )
    assert empty.shape == (0, h) and calls["kernel"] == []
    got = op.apply(torch.randn(3, h).bfloat16(), torch.zeros(3, 2, dtype=torch.int32), torch.ones(3, 2), p)
    assert got.shape == (3, h) and got.dtype == torch.bfloat16 and bool((got == 7).all())


def test_a_kernel_that_returns_a_fresh_tensor_is_copied_into_out(fake_gpu):
    op, _ = bind_op(fake_gpu, (9, 0))
    p = op.prepare(weights(op.config))
    h = op.config.hidden_size
    op._fi.cutlass_fused_moe = lambda **kw: torch.full((3, h), 3.0, dtype=torch.bfloat16)
    out = torch.zeros(3, h, dtype=torch.bfloat16)
    assert op.apply(torch.randn(3, h).bfloat16(), torch.zeros(3, 2, dtype=torch.int32), torch.ones(3, 2), p, out) is out
    assert bool((out == 3).all())


# ---- SM100 prepare ----------------------------------------------------------------------------------
def test_sm100_stand_in_for_shuffle_matrix_sf_a_is_flashinfer_layout():
    """The stand-in = row shuffle + moe-core swizzle; FlashInfer's own CPU unswizzle inverts the swizzle."""
    from flashinfer.trace.templates.gemm import _unswizzle_sf_128x4

    s = torch.randint(0, 256, (256, 8), dtype=torch.int32).to(torch.uint8)
    flat = swizzle_128x4(s).flatten()
    assert torch.equal(_unswizzle_sf_128x4(flat, 256, 8), s)


@pytest.mark.parametrize("activation,bias", [("silu", False), ("swiglu_oai", True)])
def test_sm100_prepare(fake_gpu, activation, bias):
    op, _ = bind_op(fake_gpu, (10, 0), activation=activation, has_bias=bias)
    cfg = op.config
    e, h, i = cfg.num_experts, cfg.hidden_size, cfg.intermediate_size
    w = weights(cfg)
    p = op.prepare(w)
    src13 = up_gate_source(i)[layout.gated_rows_source(2 * i)]  # canonical row of every prepared w13 row
    src2 = layout.shuffle_rows_source(h)
    assert p.w13.dtype == torch.uint8 and p.w13.shape == (e, 2 * i, h // 2)
    assert torch.equal(p.w13, w.w13[:, src13]) and torch.equal(p.w2, w.w2[:, src2])
    assert p.s13.dtype == torch.float8_e4m3fn and p.s13.shape == (e, 2 * i, h // 32)
    assert p.s2.dtype == torch.float8_e4m3fn and p.s2.shape == (e, h, i // 32)
    for x in range(e):
        assert torch.equal(unswizzle_128x4(p.s13[x].view(torch.uint8), 2 * i, h // 32), w.w13_scale[x, src13])
        assert torch.equal(unswizzle_128x4(p.s2[x].view(torch.uint8), h, i // 32), w.w2_scale[x, src2])
    if bias:
        assert p.b13.dtype == torch.float32 and torch.equal(p.b13, w.b13[:, src13].float())
        assert p.b2.dtype == torch.float32 and torch.equal(p.b2, w.b2.float())
    assert p.ones.tolist() == [1.0] * e
    assert (p.alpha is None) == (activation == "silu")


def test_sm100_apply_passes_our_routing_unpacked(fake_gpu):
    op, calls = bind_op(fake_gpu, (10, 0), activation="swiglu_oai", has_bias=True)
    p = op.prepare(weights(op.config))
    h = op.config.hidden_size
    ids = torch.tensor([[3, 1], [0, 2]], dtype=torch.int32)
    tw = torch.tensor([[0.75, 0.25], [0.5, 0.5]])
    out = op.apply(torch.randn(2, h).bfloat16(), ids, tw, p)
    assert bool((out == 7).all())
    (kw,) = calls["kernel"]
    assert kw["topk_ids"][0] is ids and kw["topk_ids"][1] is tw  # int32 ids, float32 weights, not re-rounded
    assert kw["routing_method_type"] == int(op._fi.RoutingMethodType.TopK)
    assert kw["do_finalize"] is True and kw["hidden_states_scale"] is None
    assert kw["num_experts"] == kw["local_num_experts"] == op.config.num_experts and kw["local_expert_offset"] == 0
    assert kw["intermediate_size"] == op.config.intermediate_size and kw["top_k"] == 2
    assert kw["gemm1_bias"] is p.b13 and kw["gemm1_beta"] is p.beta
    if op._fi.routed_takes_sf_layout:
        assert kw["hidden_states_scale_layout"] == op._fi.SfLayout.layout_linear
