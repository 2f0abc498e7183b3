"""Routing against hand-computed cases and independent loop formulations."""

from __future__ import annotations

import math

import pytest
import torch

from moe_core.errors import InvalidInputError
from moe_core.routing import GroupedTopK, SigmoidTop1, grouped_topk, sigmoid_top1, softmax_topk, topk_softmax


def test_softmax_topk_hand_computed():
    logits = torch.tensor([[0.0, math.log(3.0), math.log(2.0), math.log(4.0)]])  # probs 1:3:2:4 / 10
    ids, w = softmax_topk(logits, 2, renormalize=False)
    assert ids.dtype == torch.int32 and w.dtype == torch.float32
    order = w.argsort(dim=-1, descending=True)  # the k slots come in no particular order
    assert ids.gather(1, order).tolist() == [[3, 1]]
    torch.testing.assert_close(w.gather(1, order), torch.tensor([[0.4, 0.3]]))
    ids, w = softmax_topk(logits, 2, renormalize=True)
    torch.testing.assert_close(w.gather(1, w.argsort(dim=-1, descending=True)), torch.tensor([[4 / 7, 3 / 7]]))


def test_mixtral_topk_then_softmax_equals_renormalised_softmax():
    logits = torch.randn(64, 8, generator=torch.Generator().manual_seed(0), dtype=torch.float64).to(torch.bfloat16)
    ids_a, w_a = topk_softmax(logits, 2)
    ids_b, w_b = softmax_topk(logits, 2, renormalize=True)
    assert torch.equal(ids_a, ids_b)
    torch.testing.assert_close(w_a, w_b, rtol=1e-6, atol=1e-7)


def _deepseek_loop(logits, bias, k, n_group, topk_group, scale):
    """Token by token, group by group: an independent formulation."""
    ids_out, w_out = [], []
    for row in logits.double():
        scores = row.sigmoid()
        choice = scores + bias.double()
        per = len(row) // n_group
        group_scores = [sorted(choice[g * per : (g + 1) * per].tolist(), reverse=True)[:2] for g in range(n_group)]
        group_scores = [sum(s) for s in group_scores]
        best_groups = sorted(range(n_group), key=lambda g: -group_scores[g])[:topk_group]
        allowed = [i for g in best_groups for i in range(g * per, (g + 1) * per)]
        chosen = sorted(allowed, key=lambda i: -float(choice[i]))[:k]
        w = torch.tensor([float(scores[i]) for i in chosen], dtype=torch.float64)
        ids_out.append(chosen)
        w_out.append((w / w.sum() * scale).tolist())
    return ids_out, w_out


def test_deepseek_v3_grouped_topk_matches_loop():
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(16, 32, generator=gen)
    bias = torch.randn(32, generator=gen) * 0.5
    ids, w = grouped_topk(
        logits, 4, n_group=8, topk_group=3, correction_bias=bias, routed_scaling_factor=2.5, renormalize=True
    )
    ref_ids, ref_w = _deepseek_loop(logits, bias, 4, 8, 3, 2.5)
    assert ids.tolist() == ref_ids
    torch.testing.assert_close(w.double(), torch.tensor(ref_w, dtype=torch.float64), rtol=1e-6, atol=1e-6)


def test_bias_changes_choice_but_not_weights():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    bias = torch.tensor([0.0, 0.0, 5.0, 0.0])
    ids, w = grouped_topk(logits, 1, correction_bias=bias, renormalize=False)
    assert ids.tolist() == [[2]]  # chosen because of the bias...
    torch.testing.assert_close(w, torch.tensor([[0.5]]))  # ...weighted by its unbiased score sigmoid(0)


def test_group_limit_excludes_experts_outside_best_groups():
    # group 0 = experts 0..1, group 1 = experts 2..3; expert 0 is the best single expert,
    # but group 1's two experts together score higher, so with topk_group=1 expert 0 is excluded
    logits = torch.tensor([[3.0, -5.0, 2.0, 2.0]])
    ids, _ = grouped_topk(logits, 2, n_group=2, topk_group=1)
    assert sorted(ids.tolist()[0]) == [2, 3]


def test_grouped_topk_bundle_is_the_function_with_its_parameters():
    gen = torch.Generator().manual_seed(3)
    logits, bias = torch.randn(9, 32, generator=gen), torch.randn(32, generator=gen)
    params = dict(n_group=4, topk_group=2, correction_bias=bias, scoring="softmax", renormalize=True)
    params.update(routed_scaling_factor=1.5, group_scoring="max", renormalize_eps=1e-6, renormalize_min=0.25)
    bundle = GroupedTopK(3, **params)
    for got, want in zip(bundle(logits), grouped_topk(logits, 3, **params), strict=True):
        assert torch.equal(got, want)
    shown = repr(bundle)
    assert "n_group=4" in shown and "correction_bias=yes" in shown and "tensor" not in shown
    # the bias is the caller's tensor, read at each call: bundles compare by identity
    assert bundle != GroupedTopK(3, **params) and bundle == bundle
    # what grouped_topk would refuse for a number of experts, said before any call
    assert bundle.problem(32) == ""
    assert bundle.problem(30) == "n_group=4 must divide the number of experts 30"
    assert bundle.problem(64).startswith("correction_bias must be [64]")
    assert GroupedTopK(9, n_group=4, topk_group=2).problem(16) == "top_k=9 exceeds the 8 experts in the chosen groups"


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(top_k=0), "top_k must be a positive int"),
        (dict(top_k=2, n_group=2, topk_group=3), "topk_group=3 must be in"),
        (dict(top_k=2, scoring="relu"), "scoring must be"),
        (dict(top_k=2, group_scoring="min"), "group_scoring must be"),
        (dict(top_k=2, correction_bias=torch.zeros(2, 4)), "correction_bias must be a 1-D tensor"),
    ],
)
def test_grouped_topk_bundle_rejects_bad_parameters(kwargs, match):
    with pytest.raises(InvalidInputError, match=match):
        GroupedTopK(**kwargs)


def test_sigmoid_top1_bundle_chooses_on_the_logits():
    logits = torch.tensor([[20.0, 25.0, -1.0], [0.5, -2.0, 0.25]])  # sigmoid(20) == sigmoid(25) == 1 in float32
    ids, weights = SigmoidTop1()(logits)
    assert ids.tolist() == [[1], [0]] and SigmoidTop1().top_k == 1
    assert torch.equal(weights, sigmoid_top1(logits)[1])
    with pytest.raises(TypeError):
        SigmoidTop1(top_k=2)


def test_llama4_sigmoid_top1():
    logits = torch.tensor([[0.5, -1.0, 2.0]])
    ids, w = sigmoid_top1(logits)
    assert ids.tolist() == [[2]]
    torch.testing.assert_close(w, torch.tensor([[1 / (1 + math.exp(-2.0))]]))


def test_router_errors():
    logits = torch.randn(3, 8)
    with pytest.raises(InvalidInputError, match="top_k=9"):
        softmax_topk(logits, 9)
    with pytest.raises(InvalidInputError, match="n_group=3 must divide"):
        grouped_topk(logits, 2, n_group=3)
    with pytest.raises(InvalidInputError, match="floating point"):
        softmax_topk(torch.ones(2, 4, dtype=torch.int64), 1)
