"""prepare's conversions on CPU: 128x4 scale swizzle, int64/int32 views, [up; gate] rows, global scales."""

from __future__ import annotations

import itertools

import pytest
import torch
from cutlass_fp4_testing import nvfp4_config

from moe_core.layout import swizzle_128x4
from moe_core.quant.nvfp4 import default_global_scale
from moe_core.synthetic import random_weights
from moe_cutlass_fp4 import kernel


def sf_offset(r: int, c: int, cols_padded: int) -> int:
    """Where TensorRT-LLM's computeSFIndex (SWIZZLED_128x4) puts scale (r, c), written out here."""
    return (r // 128) * (128 * cols_padded) + (c // 4) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4


def round_up(x: int, m: int) -> int:
    return (x + m - 1) // m * m


@pytest.fixture(scope="module")
def unswizzle():
    """FlashInfer's own pure-torch inverse of its 128x4 layout (a private trace helper; CPU-capable)."""
    templates = pytest.importorskip("flashinfer.trace.templates.gemm")
    fn = getattr(templates, "_unswizzle_batched_sf_128x4", None)
    if fn is None:
        pytest.skip("this flashinfer has no _unswizzle_batched_sf_128x4 (checked against the element formula only)")
    return fn


@pytest.mark.parametrize("rows,cols", [(256, 16), (128, 8), (200, 9), (384, 36)])
def test_swizzle_against_the_element_formula(rows, cols):
    sf = torch.randint(0, 256, (rows, cols), dtype=torch.int32).to(torch.uint8)
    flat = swizzle_128x4(sf).flatten()
    cp = round_up(cols, 4)
    for r, c in itertools.product(range(0, rows, 3), range(cols)):
        assert flat[sf_offset(r, c, cp)] == sf[r, c]


@pytest.mark.parametrize("experts,rows,cols", [(1, 256, 16), (3, 200, 9), (2, 128, 32)])
def test_swizzle_against_flashinfer_unswizzle(unswizzle, experts, rows, cols):
    sf = torch.randint(0, 256, (experts, rows, cols), dtype=torch.int32).to(torch.uint8)
    assert torch.equal(unswizzle(swizzle_128x4(sf).flatten(), experts, rows, cols), sf)


def test_block_scale_interleave_is_cuda_only_here():
    """Why the swizzle is ours: FlashInfer's block_scale_interleave refuses CPU tensors (JIT module per arch)."""
    import flashinfer

    with pytest.raises(Exception, match="cuda"):
        flashinfer.block_scale_interleave(torch.zeros(128, 4, dtype=torch.uint8))


@pytest.mark.parametrize("bias,activation", [(False, "silu"), (True, "swiglu_oai")])
def test_prepare(unswizzle, bias, activation):
    cfg = nvfp4_config(has_bias=bias, activation=activation)
    e, h, i = cfg.num_experts, cfg.hidden_size, cfg.intermediate_size
    w = random_weights(cfg)
    p = kernel.prepare(cfg, w, fc2_input_scale=0.02)
    up_gate = torch.tensor([i + r if r < i else r - i for r in range(2 * i)])  # canonical row of each fc1 row
    # weights: int64 views of the packed bytes, 16 E2M1 per element
    assert p.w13.dtype == torch.int64 and p.w13.shape == (e, 2 * i, h // 16)
    assert p.w2.dtype == torch.int64 and p.w2.shape == (e, h, i // 16)
    assert torch.equal(p.w13.view(torch.uint8), w.w13[:, up_gate]) and torch.equal(p.w2.view(torch.uint8), w.w2)
    # scales: the shapes FlashInfer's binding checks (alignToSfDim), int32 views of swizzled E4M3 bytes
    assert p.s13.dtype == torch.int32 and p.s13.shape == (e, round_up(2 * i, 128), round_up(h // 16, 4) // 4)
    assert p.s2.dtype == torch.int32 and p.s2.shape == (e, round_up(h, 128), round_up(i // 16, 4) // 4)
    s13 = unswizzle(p.s13.view(torch.uint8).flatten(), e, 2 * i, h // 16)
    s2 = unswizzle(p.s2.view(torch.uint8).flatten(), e, h, i // 16)
    assert torch.equal(s13, w.w13_scale[:, up_gate].view(torch.uint8))
    assert torch.equal(s2, w.w2_scale.view(torch.uint8))
    # global scales: fc2 quantizes with 1/S and dequantizes with w2_gs * S
    assert p.a2.dim() == 0 and p.a2.item() == pytest.approx(50.0)
    assert torch.allclose(p.alpha2, w.w2_global_scale * 0.02)
    assert torch.equal(p.w13_gs, w.w13_global_scale)
    if bias:
        assert p.b13.dtype == cfg.dtype and torch.equal(p.b13, w.b13[:, up_gate]) and torch.equal(p.b2, w.b2)
    alpha, beta, limit = p.swiglu
    if activation == "silu":
        assert alpha is beta is limit is None
    else:
        assert alpha.tolist() == [pytest.approx(1.702)] * e and beta.tolist() == [1.0] * e
        assert limit.tolist() == [7.0] * e


def test_fc1_scales_are_the_reference_dynamic_global_scale():
    cfg = nvfp4_config()
    p = kernel.prepare(cfg, random_weights(cfg), 1.0)
    x = (torch.randn(37, cfg.hidden_size) * 3).to(torch.bfloat16)
    a1, alpha1 = kernel.fc1_scales(x, p)
    gs = default_global_scale(x)  # what moe-core's reference uses for this GEMM input
    assert a1.dim() == 0 and a1.dtype == torch.float32
    assert torch.equal(a1, torch.reciprocal(gs))
    assert torch.equal(alpha1, p.w13_gs * gs)
    zero_a1, _ = kernel.fc1_scales(torch.zeros(3, cfg.hidden_size, dtype=torch.bfloat16), p)
    assert zero_a1.item() == 1.0
