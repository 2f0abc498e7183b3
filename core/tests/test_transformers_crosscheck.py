"""Cross-check against Hugging Face transformers' MoE blocks (random weights, no download).

For each family a tiny config is built in code, only the MoE block is
instantiated, every parameter is filled with seeded random values (biases and
DeepSeek's correction bias non-zero: zeros would hide a bias bug), and
``MoeRunner(config, weights, backend="torch")(x, *router(x))`` must reproduce the
block's routed-expert output to 1e-5 in float32, with the same expert choices
the block fed to its experts. Runs in its own nox session (``nox -s
transformers``); core's normal session has no transformers and skips this file.
"""

from __future__ import annotations

import pytest

transformers = pytest.importorskip("transformers")

import torch  # noqa: E402

from moe_core import MoeRunner  # noqa: E402
from moe_core.errors import InvalidInputError  # noqa: E402
from moe_core.integrations.transformers.families import (  # noqa: E402
    SUPPORTED_BLOCKS,
    from_deepseek_v3,
    from_gpt_oss,
    from_hf_block,
    from_mixtral,
    from_qwen3_moe,
)
from moe_core.weights import MoeWeights  # noqa: E402

TOL = 1e-5
#: smallest gap we accept between the k-th and (k+1)-th routing score (no near-ties)
MIN_MARGIN = 1e-4

ATTENTION = dict(num_attention_heads=4, num_key_value_heads=2, vocab_size=128, num_hidden_layers=1)


def _fill(t: torch.Tensor, gen: torch.Generator, std: float) -> None:
    t.copy_(torch.randn(t.shape, generator=gen) * std)


def _mixtral(seed: int = 0):
    from transformers import MixtralConfig
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

    cfg = MixtralConfig(hidden_size=64, intermediate_size=32, num_local_experts=8, num_experts_per_tok=2, **ATTENTION)
    return _init(MixtralSparseMoeBlock, cfg, seed, router_std=2.0)


def _qwen3(seed: int = 0):
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

    cfg = Qwen3MoeConfig(
        hidden_size=64,
        intermediate_size=96,
        moe_intermediate_size=48,
        num_experts=8,
        num_experts_per_tok=2,
        norm_topk_prob=True,
        **ATTENTION,
    )
    return _init(Qwen3MoeSparseMoeBlock, cfg, seed, router_std=2.0)


def _gpt_oss(seed: int = 0):
    from transformers import GptOssConfig
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssMLP

    cfg = GptOssConfig(
        hidden_size=64, intermediate_size=40, num_local_experts=8, num_experts_per_tok=2, head_dim=16, **ATTENTION
    )
    # gate/up pre-activations ~ N(0, 6^2) so the swiglu clamps at +-7 are exercised; a small down_proj keeps
    # the output O(1) (the activation reaches ~60), so 1e-5 absolute stays a float32-rounding-sized bound
    return _init(GptOssMLP, cfg, seed, router_std=2.0, gate_up_std=6.0, down_std=0.1, bias_std=0.5)


def _deepseek_v3(seed: int = 0):
    from transformers import DeepseekV3Config
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MoE

    cfg = DeepseekV3Config(
        hidden_size=64,
        intermediate_size=96,
        moe_intermediate_size=24,
        n_routed_experts=16,
        num_experts_per_tok=4,
        n_group=4,
        topk_group=2,
        n_shared_experts=1,
        routed_scaling_factor=2.5,
        norm_topk_prob=True,
        q_lora_rank=32,
        kv_lora_rank=16,
        qk_rope_head_dim=8,
        qk_nope_head_dim=8,
        v_head_dim=8,
        first_k_dense_replace=0,
        **{**ATTENTION, "num_key_value_heads": 4},
    )
    # correction bias 1 + N(0, 0.2^2): random and non-zero, positive like real DeepSeek-V3 biases (min ~ +2), so
    # transformers versions that mask dropped groups with 0.0 instead of -inf route the same (see from_deepseek_v3)
    return _init(DeepseekV3MoE, cfg, seed, router_std=2.0, bias_std=0.2, correction_bias_mean=1.0)


def _init(
    block_cls,
    cfg,
    seed: int,
    *,
    router_std: float,
    gate_up_std: float = 1.0,
    down_std: float = 1.0,
    bias_std: float = 0.1,
    correction_bias_mean: float = 0.0,
):
    """The block with every parameter/buffer seeded: weights ~ std/sqrt(fan_in), biases ~ bias_std."""
    cfg._experts_implementation = "eager"  # standalone block: no model to pick one
    torch.manual_seed(seed)
    block = block_cls(cfg).eval()
    gen = torch.Generator().manual_seed(seed)
    h = cfg.hidden_size
    with torch.no_grad():
        for name, p in block.named_parameters():
            leaf = name.rsplit(".", 1)[-1]
            if name in ("gate.weight", "router.weight"):
                _fill(p, gen, router_std / h**0.5)
            elif leaf.endswith("bias"):
                _fill(p, gen, bias_std)
            elif leaf == "gate_up_proj":
                # 5.x fused; gpt-oss is [E, H, 2I], the others [E, 2I, H]: the fan-in is H either way
                _fill(p, gen, gate_up_std / h**0.5)
            elif leaf == "down_proj":
                fan_in = min(p.shape[1:])  # I (I < H in every config here)
                _fill(p, gen, down_std / fan_in**0.5)
            elif p.dim() == 2:  # shared-expert / per-expert nn.Linear [out, in]
                _fill(p, gen, 1 / p.shape[1] ** 0.5)
            else:
                raise AssertionError(f"test does not know how to initialise {name} {list(p.shape)}")
        for name, b in block.named_buffers():
            if name.endswith("e_score_correction_bias"):
                _fill(b, gen, bias_std)  # DeepSeek: zero-initialised by transformers
                b += correction_bias_mean
    for name, t in [*block.named_parameters(), *block.named_buffers()]:
        assert t.dtype == torch.float32, name
        if "bias" in name:
            assert t.abs().min() > 0, f"{name} has zeros; a bias bug could hide"
    return block


FAMILIES = {
    "mixtral": (_mixtral, from_mixtral),
    "qwen3_moe": (_qwen3, from_qwen3_moe),
    "gpt_oss": (_gpt_oss, from_gpt_oss),
    "deepseek_v3": (_deepseek_v3, from_deepseek_v3),
}


def _hidden(hidden_size: int, seed: int = 1, batch: int = 3, seq: int = 7) -> torch.Tensor:
    return torch.randn(batch, seq, hidden_size, generator=torch.Generator().manual_seed(seed))


def _block_routed_output(family: str, block, x: torch.Tensor):
    """(routed-expert output [M, H], (top_k_index, top_k_weights) the block gave its experts or None)."""
    seen = {}

    def capture(module, args, kwargs):
        values = [*args, *kwargs.values()]
        seen["ids"], seen["weights"] = values[1], values[2]  # (hidden, top_k_index, top_k_weights)

    experts = block.experts
    handle = None
    if not isinstance(experts, torch.nn.ModuleList):  # 5.x fused experts are called once per forward
        handle = experts.register_forward_pre_hook(capture, with_kwargs=True)
    try:
        with torch.no_grad():
            out = block(x)
            if isinstance(out, tuple):  # gpt-oss: (hidden, router_scores); 4.x Mixtral/Qwen3: (hidden, logits)
                out = out[0]
            if family == "deepseek_v3":
                out = out - block.shared_experts(x)  # routed experts only
    finally:
        if handle is not None:
            handle.remove()
    routing = (seen["ids"], seen["weights"]) if seen else None
    return out.reshape(-1, x.shape[-1]), routing


def _deepseek_groups(block) -> tuple[int, int, float]:
    """(n_group, topk_group, routed_scaling_factor): on the router (4.x, 5.24) or on the block (5.0)."""

    def get(*names):
        return next(getattr(o, n) for n in names for o in (block.gate, block) if getattr(o, n, None) is not None)

    return get("num_group", "n_group"), get("topk_group"), get("routed_scaling_factor")


def _routing_margin(family: str, block, router, top_k: int, x2d: torch.Tensor) -> float:
    """Smallest gap between the k-th and (k+1)-th routing score (DeepSeek: also between groups)."""
    logits = router.logits(x2d).float()
    if family != "deepseek_v3":  # softmax is monotone: the gap in logits decides
        s = logits.sort(dim=-1, descending=True).values
        return (s[:, top_k - 1] - s[:, top_k]).min().item()
    n_group, topk_group, _ = _deepseek_groups(block)
    scores = logits.sigmoid() + block.gate.e_score_correction_bias
    m, e = scores.shape
    group_score = scores.view(m, n_group, -1).topk(2, dim=-1).values.sum(-1)
    gs = group_score.sort(dim=-1, descending=True).values
    group_margin = (gs[:, topk_group - 1] - gs[:, topk_group]).min().item()
    keep = torch.zeros_like(group_score, dtype=torch.bool).scatter_(1, group_score.topk(topk_group).indices, True)
    s = scores.masked_fill(~keep.repeat_interleave(e // n_group, dim=1), float("-inf"))
    s = s.sort(dim=-1, descending=True).values
    return min(group_margin, (s[:, top_k - 1] - s[:, top_k]).min().item())


@pytest.mark.parametrize("family", list(FAMILIES))
def test_routed_output_matches_transformers_block(family):
    make, convert = FAMILIES[family]
    block = make()
    config, weights, router, _ = convert(block)
    x = _hidden(config.hidden_size)
    x2d = x.reshape(-1, config.hidden_size)

    margin = _routing_margin(family, block, router, config.top_k, x2d)
    assert margin > MIN_MARGIN, f"near-tie in routing (margin {margin:.2e}); pick another seed"

    expected, hf_routing = _block_routed_output(family, block, x)
    topk_ids, topk_weights = router(x2d)
    assert topk_ids.dtype == torch.int32 and topk_weights.dtype == torch.float32
    assert tuple(topk_ids.shape) == (x2d.shape[0], config.top_k)

    # the same expert choices (and weights) the block handed its experts; DeepSeek's top-k is unsorted.
    # Observable when the experts are one module (transformers 5.x fused form, and gpt-oss in any version);
    # the 4.x per-expert ModuleList form is checked through the output only.
    if not isinstance(block.experts, torch.nn.ModuleList):
        assert hf_routing is not None, "could not observe the block's routing"
        hf_ids, hf_weights = hf_routing
        if hf_weights.shape != hf_ids.shape:  # gpt-oss 4.x hands its experts dense [M, E] scores
            hf_weights = hf_weights.gather(1, hf_ids)
        hf_order, our_order = hf_ids.argsort(dim=-1), topk_ids.long().argsort(dim=-1)
        assert torch.equal(hf_ids.gather(1, hf_order), topk_ids.long().gather(1, our_order))
        torch.testing.assert_close(hf_weights.float().gather(1, hf_order), topk_weights.gather(1, our_order))

    ours = MoeRunner(config, weights, backend="torch")(x2d, topk_ids, topk_weights)
    err = (ours - expected).abs().max().item()
    print(f"{family}: max abs error {err:.3e} (output max |y| {expected.abs().max().item():.3f})")
    assert err < TOL, f"{family}: max abs error {err:.3e} >= {TOL}"
    assert expected.abs().max() > 0.1  # the comparison is not between two near-zero tensors


@pytest.mark.parametrize("family", list(FAMILIES))
def test_conversion_gives_float32_contiguous_copies(family):
    make, convert = FAMILIES[family]
    block = make()
    config, weights, _, _ = convert(block)
    assert config.dtype == torch.float32 and config.quant_scheme == "fp32"
    block_storage = {t.untyped_storage().data_ptr() for t in block.parameters()}
    for name, t in weights.tensors().items():
        assert t.dtype == torch.float32 and t.is_contiguous(), name
        assert t.untyped_storage().data_ptr() not in block_storage, f"{name} aliases a block parameter"
    expected = {"mixtral": "silu", "qwen3_moe": "silu", "gpt_oss": "swiglu_oai", "deepseek_v3": "silu"}
    assert config.activation == expected[family]
    assert config.has_bias == (family == "gpt_oss")
    if family == "gpt_oss":
        assert (config.swiglu_alpha, config.swiglu_limit) == (1.702, 7.0)
    # the dispatcher picks the same converter
    again = from_hf_block(block)
    assert again.config == config
    for name, t in weights.tensors().items():
        assert torch.equal(t, again.weights.tensors()[name]), name


def test_dtype_argument_converts_to_bf16():
    config, weights, _, _ = from_qwen3_moe(_qwen3(), dtype=torch.bfloat16)
    assert config.dtype == torch.bfloat16 and config.quant_scheme == "bf16"
    assert all(t.dtype == torch.bfloat16 and t.is_contiguous() for t in weights.tensors().values())
    with pytest.raises(InvalidInputError, match="dtype"):
        from_qwen3_moe(_qwen3(), dtype=torch.float64)


def test_from_hf_block_rejects_unsupported_blocks_listing_the_supported_ones():
    with pytest.raises(InvalidInputError) as info:
        from_hf_block(torch.nn.Linear(4, 4))
    for name in SUPPORTED_BLOCKS:
        assert name in str(info.value)
    assert {"MixtralSparseMoeBlock", "Qwen3MoeSparseMoeBlock", "GptOssMLP", "DeepseekV3MoE"} <= set(SUPPORTED_BLOCKS)


def test_gpt_oss_inputs_cross_the_swiglu_clamps():
    """The 1e-5 match above would not test the clamps if no pre-activation reached the limit."""
    block = _gpt_oss()
    config, weights, router, _ = from_gpt_oss(block)
    x2d = _hidden(config.hidden_size).reshape(-1, config.hidden_size)
    ids, _ = router(x2d)
    h13 = torch.einsum("mh,mkih->mki", x2d, weights.w13[ids.long()]) + weights.b13[ids.long()]
    gate, up = h13.chunk(2, dim=-1)
    limit = config.swiglu_limit
    assert (gate > limit).any() and (up > limit).any() and (up < -limit).any()


def test_gpt_oss_activation_mismatch_is_refused():
    """If transformers' gpt-oss activation stops matching moe_core's swiglu_oai, conversion fails loudly."""
    block = _gpt_oss()

    def no_plus_one(gate_up):  # the formula without the "+ 1" on up
        gate, up = gate_up[..., ::2].clamp(max=7.0), gate_up[..., 1::2].clamp(-7.0, 7.0)
        return up * gate * torch.sigmoid(1.702 * gate)

    block.experts._apply_gate = no_plus_one
    with pytest.raises(InvalidInputError, match="swiglu_oai"):
        from_gpt_oss(block)


# ---------------------------------------------------------------- the comparison can fail


def _max_err(family, block, config, weights, router) -> float:
    x = _hidden(config.hidden_size)
    x2d = x.reshape(-1, config.hidden_size)
    expected, _ = _block_routed_output(family, block, x)
    return (MoeRunner(config, weights, backend="torch")(x2d, *router(x2d)) - expected).abs().max().item()


def test_mixtral_with_gate_and_up_swapped_does_not_match():
    block = _mixtral()
    config, weights, router, _ = from_mixtral(block)
    gate, up = weights.w13.chunk(2, dim=1)
    swapped = MoeWeights(w13=torch.cat([up, gate], dim=1).contiguous(), w2=weights.w2)
    assert _max_err("mixtral", block, config, weights, router) < TOL
    assert _max_err("mixtral", block, config, swapped, router) > 1e-3


def test_gpt_oss_without_deinterleaving_does_not_match():
    block = _gpt_oss()
    config, weights, router, _ = from_gpt_oss(block)
    raw = block.experts  # [E, H, 2I] interleaved, taken as if it were [gate; up] halves
    naive = MoeWeights(
        w13=raw.gate_up_proj.detach().transpose(1, 2).contiguous(),
        w2=weights.w2,
        b13=raw.gate_up_proj_bias.detach().clone(),
        b2=weights.b2,
    )
    assert _max_err("gpt_oss", block, config, naive, router) > 1e-3


def test_deepseek_v3_correction_bias_and_shared_experts_matter():
    block = _deepseek_v3()
    config, weights, router, _ = from_deepseek_v3(block)
    x = _hidden(config.hidden_size)
    x2d = x.reshape(-1, config.hidden_size)
    runner = MoeRunner(config, weights, backend="torch")
    routed, _ = _block_routed_output("deepseek_v3", block, x)

    # routing without e_score_correction_bias picks other experts
    from moe_core import routing

    n_group, topk_group, scale = _deepseek_groups(block)
    unbiased = routing.grouped_topk(
        router.logits(x2d), config.top_k, n_group=n_group, topk_group=topk_group, routed_scaling_factor=scale
    )
    assert not torch.equal(unbiased[0].sort(dim=-1).values, router(x2d)[0].sort(dim=-1).values)
    assert (runner(x2d, *unbiased) - routed).abs().max() > 1e-3

    # the whole block (shared experts included) is not what the routed runner computes
    with torch.no_grad():
        whole = block(x).reshape(-1, config.hidden_size)
    assert (runner(x2d, *router(x2d)) - whole).abs().max() > 1e-3
