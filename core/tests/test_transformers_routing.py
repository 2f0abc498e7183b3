"""moe_core.routing against transformers' own router code, on random fp32 logits (exact or 1e-6)."""

from __future__ import annotations

import pytest

transformers = pytest.importorskip("transformers")

import torch  # noqa: E402

from moe_core import routing  # noqa: E402

H, E, M = 16, 8, 64


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _same(ids, weights, hf_ids, hf_weights, sort: bool = False) -> None:
    hf_ids = hf_ids.long()
    if sort:  # a top-k with sorted=False on either side: compare as sets
        order, hf_order = ids.long().argsort(dim=-1), hf_ids.argsort(dim=-1)
        ids, weights = ids.long().gather(1, order), weights.gather(1, order)
        hf_ids, hf_weights = hf_ids.gather(1, hf_order), hf_weights.gather(1, hf_order)
    assert torch.equal(ids.long(), hf_ids)
    torch.testing.assert_close(weights, hf_weights.float(), rtol=1e-6, atol=1e-6)


def _router(cls, cfg, *, weight_attr: str = "weight"):
    """A transformers router module with a seeded random [E, H] weight, and random hidden states."""
    torch.manual_seed(0)
    module = cls(cfg).eval()
    with torch.no_grad():
        getattr(module, weight_attr).copy_(torch.randn(E, H, generator=_gen(1)))
    return module, torch.randn(M, H, generator=_gen(2))


@pytest.mark.parametrize("jitter_eps", [0.01, 0.3])
def test_sparsemixer_matches_phimoe_eval(jitter_eps):
    from transformers.models.phimoe.modeling_phimoe import sparsemixer

    logits = torch.randn(M, E, generator=_gen(3)) * 2
    hf_weights, hf_ids = sparsemixer(logits, jitter_eps=jitter_eps, training=False, top_k=2)
    _same(*routing.sparsemixer(logits, jitter_eps), hf_ids, hf_weights)
    # the threshold matters: some tokens' weights differ from a plain softmax over all experts
    plain = torch.softmax(logits, dim=-1).gather(1, hf_ids)
    assert not torch.allclose(plain, hf_weights)


@pytest.mark.parametrize("norm", [True, False])
def test_softmax_topk_matches_qwen2_moe_and_olmoe_routers(norm):
    from transformers import OlmoeConfig, Qwen2MoeConfig
    from transformers.models.olmoe.modeling_olmoe import OlmoeTopKRouter
    from transformers.models.qwen2_moe.modeling_qwen2_moe import Qwen2MoeTopKRouter

    for cls, cfg in (
        (Qwen2MoeTopKRouter, Qwen2MoeConfig(hidden_size=H, num_experts=E, num_experts_per_tok=2, norm_topk_prob=norm)),
        (OlmoeTopKRouter, OlmoeConfig(hidden_size=H, num_experts=E, num_experts_per_tok=2, norm_topk_prob=norm)),
    ):
        router, x = _router(cls, cfg)
        logits, hf_weights, hf_ids = router(x)
        _same(*routing.softmax_topk(logits, 2, renormalize=norm), hf_ids, hf_weights, sort=True)


def test_topk_softmax_matches_granite_router():
    from transformers import GraniteMoeConfig
    from transformers.models.granitemoe.modeling_granitemoe import GraniteMoeTopKRouter

    router, x = _router(
        GraniteMoeTopKRouter, GraniteMoeConfig(hidden_size=H, num_local_experts=E, num_experts_per_tok=3)
    )
    logits, hf_weights, hf_ids = router(x)
    _same(*routing.topk_softmax(logits, 3), hf_ids, hf_weights, sort=True)


def test_sigmoid_top1_matches_llama4_router():
    from transformers import Llama4TextConfig
    from transformers.models.llama4.modeling_llama4 import Llama4Router

    cfg = Llama4TextConfig(hidden_size=H, num_local_experts=E, num_experts_per_tok=1)
    router, x = _router(Llama4Router, cfg)
    scores, logits = router(x)  # dense [M, E]: sigmoid of the kept logit, 0 elsewhere
    ids, weights = routing.sigmoid_top1(logits)
    dense = torch.zeros_like(scores).scatter_(1, ids.long(), weights)
    torch.testing.assert_close(dense, scores, rtol=1e-6, atol=1e-6)
    assert torch.equal((scores > 0).sum(dim=-1), torch.ones(M, dtype=torch.long))


@pytest.mark.parametrize("method", ["greedy", "group_limited_greedy"])
def test_grouped_topk_matches_deepseek_v2_router(method):
    from transformers import DeepseekV2Config
    from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2TopkRouter

    cfg = DeepseekV2Config(
        hidden_size=H,
        num_attention_heads=4,
        num_key_value_heads=4,
        n_routed_experts=E,
        num_experts_per_tok=3,
        topk_method=method,
        n_group=4,
        topk_group=2,
        routed_scaling_factor=1.5,
    )
    router, x = _router(DeepseekV2TopkRouter, cfg)
    logits, hf_weights, hf_ids = router(x)
    groups = dict(n_group=4, topk_group=2) if method == "group_limited_greedy" else {}
    ours = routing.grouped_topk(
        logits, 3, scoring="softmax", renormalize=False, routed_scaling_factor=1.5, group_scoring="max", **groups
    )
    _same(*ours, hf_ids, hf_weights, sort=True)


def test_grouped_topk_matches_mistral4_router():
    """Softmax scores, groups scored by their two best experts (dropped ones masked with 0.0 there), renormalised."""
    from transformers import Mistral4Config
    from transformers.models.mistral4.modeling_mistral4 import Mistral4TopkRouter

    cfg = Mistral4Config(
        hidden_size=H, n_routed_experts=E, num_experts_per_tok=3, n_group=4, topk_group=2, routed_scaling_factor=1.5
    )
    router, x = _router(Mistral4TopkRouter, cfg)
    logits, hf_weights, hf_ids = router(x)
    ours = routing.grouped_topk(logits, 3, n_group=4, topk_group=2, scoring="softmax", routed_scaling_factor=1.5)
    _same(*ours, hf_ids, hf_weights, sort=True)


def _bias(shape) -> torch.Tensor:
    return torch.randn(shape, generator=_gen(4)) * 0.3


@pytest.mark.parametrize("use_bias", [True, False])
def test_one_group_sigmoid_topk_matches_lfm2_moe_router(use_bias):
    """Optionally biased choice, renormalised by ``sum + 1e-6``, scaled."""
    from transformers import Lfm2MoeConfig
    from transformers.models.lfm2_moe.modeling_lfm2_moe import Lfm2MoeTopKRouter

    cfg = Lfm2MoeConfig(
        hidden_size=H, num_experts=E, num_experts_per_tok=3, use_expert_bias=use_bias, routed_scaling_factor=2.0
    )
    router, x = _router(Lfm2MoeTopKRouter, cfg)
    bias = _bias(E) if use_bias else None
    logits, hf_weights, hf_ids = router(x, bias)
    ours = routing.grouped_topk(logits, 3, correction_bias=bias, renormalize_eps=1e-6, routed_scaling_factor=2.0)
    _same(*ours, hf_ids, hf_weights, sort=True)


def test_one_group_sigmoid_topk_matches_minimax_m2_router():
    from transformers import MiniMaxM2Config
    from transformers.models.minimax_m2.modeling_minimax_m2 import MiniMaxM2TopKRouter

    router, x = _router(MiniMaxM2TopKRouter, MiniMaxM2Config(hidden_size=H, num_local_experts=E, num_experts_per_tok=3))
    bias = _bias(E)
    logits, hf_weights, hf_ids = router(x, bias)
    _same(*routing.grouped_topk(logits, 3, correction_bias=bias, renormalize_eps=0.0), hf_ids, hf_weights, sort=True)


@pytest.mark.parametrize("norm_min", [1e-12, 0.9])
def test_one_group_softmax_topk_matches_ernie4_5_moe_router(norm_min):
    """Softmax probabilities, biased choice, weights divided by ``clamp(sum, min=norm_min)`` (0.9: the floor bites)."""
    from transformers import Ernie4_5_MoeConfig
    from transformers.models.ernie4_5_moe.modeling_ernie4_5_moe import Ernie4_5_MoeTopKRouter

    cfg = Ernie4_5_MoeConfig(hidden_size=H, moe_num_experts=E, moe_k=3, moe_norm_min=norm_min)
    router, x = _router(Ernie4_5_MoeTopKRouter, cfg)
    bias = _bias((1, E))
    with torch.no_grad():
        router.moe_statics.e_score_correction_bias.copy_(bias)
    logits, hf_weights, hf_ids = router(x)
    ours = routing.grouped_topk(
        logits, 3, correction_bias=bias.reshape(-1), scoring="softmax", renormalize_eps=0.0, renormalize_min=norm_min
    )
    _same(*ours, hf_ids, hf_weights, sort=True)
