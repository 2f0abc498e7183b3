"""The layout formulas against element-by-element loops and against the installed FlashInfer's CPU helpers."""

from __future__ import annotations

import itertools

import pytest
import torch

from moe_flashinfer_mxfp4 import layout


def rand_bytes(*shape, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, shape, generator=gen, dtype=torch.int32).to(torch.uint8)


@pytest.fixture(scope="module")
def fm():
    from flashinfer import fused_moe

    return fused_moe


# ---- SM90 scale fold --------------------------------------------------------------------------
def test_v2_formula_element_by_element():
    s = rand_bytes(2, 128, 8)
    out = layout.sm90_fold_scales_v2(s)
    assert out.shape == (2, 2, 2, 16, 16)
    for e, r, g in itertools.product(range(2), range(128), range(8)):
        assert out[e, r // 64, g // 4, r % 16, 4 * ((r % 64) // 16) + g % 4] == s[e, r, g]


def test_v1_formula_element_by_element():
    s = rand_bytes(2, 64, 8)
    out = layout.sm90_fold_scales_v1(s)
    assert out.shape == (2, 2, 256)
    for e, r, g in itertools.product(range(2), range(64), range(8)):
        assert out[e, g // 4, 4 * r + g % 4] == s[e, r, g]


@pytest.mark.parametrize("shape", [(1, 64, 4), (3, 256, 8), (2, 128, 32)])
def test_installed_flashinfer_scale_helper_is_the_v2_formula(fm, shape):
    s = rand_bytes(*shape, seed=1)
    assert torch.equal(fm.interleave_moe_scales_for_sm90_mixed_gemm(s, group_size=32), layout.sm90_fold_scales_v2(s))


def test_the_golden_first_row(fm):
    folded = fm.interleave_moe_scales_for_sm90_mixed_gemm(layout._probe_scales(), group_size=32)
    assert folded[0, 0, 0, 0].tolist() == [0, 1, 2, 3, 64, 65, 66, 67, 128, 129, 130, 131, 192, 193, 194, 195]


def test_detect_layout_of_installed_helper_and_of_stand_ins(fm):
    assert layout.detect_sm90_layout(fm.interleave_moe_scales_for_sm90_mixed_gemm) == "v2"
    assert layout.detect_sm90_layout(lambda s, group_size: layout.sm90_fold_scales_v1(s)) == "v1"
    assert layout.detect_sm90_layout(lambda s, group_size: s.clone()).startswith("unknown (a 3-d (1, 64, 4)")
    assert layout.detect_sm90_layout(lambda s, group_size: s.flip(1).reshape(1, 1, 1, 16, 16)).startswith("unknown")

    def refuses(s, group_size):
        raise ValueError("scales must be bf16")

    assert "raised ValueError" in layout.detect_sm90_layout(refuses)


# ---- trtllm-gen rows ---------------------------------------------------------------------------
def test_shuffle_formula_by_hand():
    src = layout.shuffle_rows_source(64)
    # output rows 0..3 come from input rows 0, 4, 8, 12; output row 8 from input row 1
    assert src[:4].tolist() == [0, 4, 8, 12] and src[8].item() == 1 and src[32:36].tolist() == [32, 36, 40, 44]
    assert sorted(src.tolist()) == list(range(64))


def test_gated_formula_element_by_element():
    rows = 128
    src = layout.gated_rows_source(rows)
    for o in range(rows):  # input row o of [up; gate] lands, after the reorder, at 2*(o % I) + (o >= I) ...
        reordered_pos = 2 * (o % (rows // 2)) + (o >= rows // 2)
        dest = (reordered_pos // 32) * 32 + 8 * (reordered_pos % 4) + (reordered_pos % 32) // 4  # ... then shuffles
        assert src[dest] == o


def test_installed_flashinfer_row_helpers_match(fm):
    import flashinfer

    assert layout.check_trtllm_row_shuffle(fm.reorder_rows_for_gated_act_gemm, flashinfer.shuffle_matrix_a) is None
    w = rand_bytes(256, 64)
    got = flashinfer.shuffle_matrix_a(fm.reorder_rows_for_gated_act_gemm(w), 128)
    assert torch.equal(got, w[layout.gated_rows_source(256)])
    assert torch.equal(flashinfer.shuffle_matrix_a(w, 128), w[layout.shuffle_rows_source(256)])


def test_changed_row_helpers_are_detected(fm):
    import flashinfer

    def other_reorder(x):  # gate first: the doc-string variant
        half = x.shape[0] // 2
        return torch.stack([x[half:], x[:half]], dim=1).flatten(0, 1)

    problem = layout.check_trtllm_row_shuffle(other_reorder, flashinfer.shuffle_matrix_a)
    assert problem and "gated row order" in problem
    problem = layout.check_trtllm_row_shuffle(fm.reorder_rows_for_gated_act_gemm, lambda t, m: t)
    assert problem
