"""Every covered transformers MoE family, whole block: routed experts + shared experts vs the block's forward.

A tiny model per family is built in code (``AutoConfig.for_model`` + ``AutoModelForCausalLM.from_config``,
fp32, eval, no download); its first MoE block (``find_moe_blocks``) gets seeded random parameters (a
correction bias non-zero), is converted with ``from_hf_block``, and
``MoeRunner(config, weights, backend="torch")(x, *router(x))`` plus the shared MLP computed from
``shared`` (float64, below) must equal the block's own output to 1e-5.
"""

from __future__ import annotations

import importlib

import pytest

transformers = pytest.importorskip("transformers")

import torch  # noqa: E402
from hf_tiny_models import FAMILY_CASES, TINY  # noqa: E402

from moe_core import MoeRunner  # noqa: E402
from moe_core.activations import apply_activation  # noqa: E402
from moe_core.integrations.transformers import find_moe_blocks, from_hf_block  # noqa: E402
from moe_core.weights import SharedExperts  # noqa: E402

TOL = 1e-5
BASE = dict(TINY, num_hidden_layers=1)
#: built as the block alone from the config (no model class of its own, or layers too heavy to configure)
_BLOCK_ONLY = {"qwen4_exp_text", "dots3_note_vision_encoder"}
#: extra constructor arguments of such a block (the layer index)
_BLOCK_ARGS = {"dots3_note_vision_encoder": (0,)}

#: model_type -> (config overrides, expected block class, has shared experts)
CASES = FAMILY_CASES


def _model(case: str, seed: int = 0):
    overrides, _, _ = CASES[case]
    model_type = case.removesuffix("_greedy")
    torch.manual_seed(seed)
    cfg = transformers.AutoConfig.for_model(model_type, **{**BASE, **overrides})
    if case not in _BLOCK_ONLY and type(cfg) in transformers.MODEL_FOR_CAUSAL_LM_MAPPING:
        return transformers.AutoModelForCausalLM.from_config(cfg).eval()
    if case not in _BLOCK_ONLY and type(cfg) in transformers.MODEL_MAPPING:  # a multimodal model's text config
        return transformers.AutoModel.from_config(cfg).eval()
    # Qwen3-Omni's thinker / talker text have no model of their own: the block alone, from the config
    # (the Dots3Note vision tower would need a whole vision config)
    modeling = importlib.import_module(type(cfg).__module__.replace(".configuration_", ".modeling_"))
    return torch.nn.Sequential(getattr(modeling, CASES[case][1])(cfg, *_BLOCK_ARGS.get(case, ()))).eval()


def _fill_block(block: torch.nn.Module, hidden: int, seed: int) -> None:
    """Seeded weights ~ 1/sqrt(fan_in) (routers 2/sqrt(H): clear routing margins), 1-D buffers 1 + N(0, 0.2^2)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in block.named_parameters():
            leaf = name.rsplit(".", 1)[-1]
            if p.dim() == 3:  # fused experts: gate_up fan-in is H, down fan-in is I (the dim that is not H)
                fan_in = hidden if leaf == "gate_up_proj" else next(d for d in p.shape[1:] if d != hidden)
                std = 1 / fan_in**0.5
            elif p.dim() == 2 and p.shape[1] == hidden and p.shape[0] <= 8 and "shared" not in name:
                std = 2 / hidden**0.5  # router weight [E, H]
            elif p.dim() == 2:
                std = 1 / p.shape[1] ** 0.5
            else:
                raise AssertionError(f"test does not know how to initialise {name} {list(p.shape)}")
            p.copy_(torch.randn(p.shape, generator=gen) * std)
        for _, b in block.named_buffers():
            b.copy_(1 + 0.2 * torch.randn(b.shape, generator=gen))


def _shared_output(shared: SharedExperts, x: torch.Tensor) -> torch.Tensor:
    """The shared MLP in float64: act(x W_gate^T) * (x W_up^T) W_2^T, times sigmoid(x gate^T) if gated."""
    x = x.double()
    out = apply_activation(shared.activation, x @ shared.w13.double().T, alpha=1.702, limit=7.0) @ shared.w2.double().T
    if shared.gate is not None:
        out = out * torch.sigmoid(x @ shared.gate.double().T)
    return out


def _layer_of(model, block_name: str):
    return model.get_submodule(block_name.rsplit(".", 1)[0])


@pytest.mark.parametrize("case", list(CASES))
def test_whole_block_matches_transformers(case):
    _, block_class, has_shared = CASES[case]
    model = _model(case)
    [(name, block)] = list(find_moe_blocks(model))
    assert type(block).__name__ == block_class
    hidden = BASE["hidden_size"]
    _fill_block(block, hidden, seed=1)
    x = torch.randn(3, 7, hidden, generator=torch.Generator().manual_seed(2))
    x2d = x.reshape(-1, hidden)

    extra = {}
    layer_shared = None
    if case in (
        "granitemoeshared",
        "granitemoehybrid",
    ):  # the shared MLP is the decoder layer's, added to the block's output there
        layer_shared = _layer_of(model, name).shared_mlp
        for p in layer_shared.parameters():
            p.data.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(3)) / p.shape[1] ** 0.5)
        extra["shared_mlp"] = layer_shared
    moe = from_hf_block(block, **extra)
    assert (moe.shared is not None) == has_shared
    assert moe.config.apply_router_weight_on_input == (case == "llama4_text")

    with torch.no_grad():
        expected = block(x)
        if isinstance(expected, tuple):  # Llama 4: (hidden, router_logits)
            expected = expected[0]
        expected = expected.reshape(-1, hidden)
        if layer_shared is not None:
            expected = expected + layer_shared(x2d)
    ours = MoeRunner(moe.config, moe.weights, backend="torch")(x2d, *moe.router(x2d)).double()
    if moe.shared is not None:
        ours = ours + _shared_output(moe.shared, x2d)
    err = (ours - expected.double()).abs().max().item()
    print(f"{case}: max abs error {err:.3e} (max |y| {expected.abs().max().item():.3f})")
    assert err < TOL
    assert expected.abs().max() > 0.1


@pytest.mark.parametrize("case", ["qwen2_moe", "deepseek_v3", "llama4_text"])
def test_shared_experts_are_float32_copies_with_a_probed_activation(case):
    model = _model(case)
    [(_, block)] = list(find_moe_blocks(model))
    shared = from_hf_block(block).shared
    assert shared.activation == "silu"
    assert (shared.gate is not None) == (case == "qwen2_moe")
    storage = {t.untyped_storage().data_ptr() for t in block.parameters()}
    for t in (shared.w13, shared.w2, *([shared.gate] if shared.gate is not None else [])):
        assert t.dtype == torch.float32 and t.is_contiguous()
        assert t.untyped_storage().data_ptr() not in storage
    bf16 = from_hf_block(block, dtype=torch.bfloat16).shared
    assert bf16.w13.dtype == bf16.w2.dtype == torch.bfloat16


def test_find_moe_blocks_finds_every_layer():
    overrides = {**CASES["qwen2_moe"][0], "num_hidden_layers": 2}
    cfg = transformers.AutoConfig.for_model("qwen2_moe", **{**BASE, **overrides})
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    assert [n for n, _ in find_moe_blocks(model)] == ["model.layers.0.mlp", "model.layers.1.mlp"]
