"""``patch_model``: whole tiny transformers models with every MoE block replaced by a ``MoeLayer``.

Every supported family (``SUPPORTED_BLOCKS``) whose causal LM can be built from a tiny config is built in code
(``AutoConfig.for_model`` + ``AutoModelForCausalLM.from_config``, or for a text sub-config the family's
``ForConditionalGeneration`` with a one-layer vision tower, fed text only: hidden 64, two layers, 4-8 experts,
vocab 128, fp32, eval, seeded; no download), a deep copy is patched, and the patched model must give the
unpatched model's logits to 1e-5 and the same 32 greedy tokens; ``E2E_LEFT_OUT`` says why the others are not.
transformers' default initialisation (std ``initializer_range``) is raised to 0.1 so that the experts move the
logits clearly and the routing has margins (at 0.02, zeroing the experts moves the logits by only 1e-2 to 2e-1).

Longer than 400 lines on purpose: one table of families and the assertions every family must pass, in one
place.
"""

from __future__ import annotations

import copy
import gc
import importlib
import importlib.util
import json
import subprocess
import sys
import weakref

import pytest

transformers = pytest.importorskip("transformers")

import torch  # noqa: E402
from hf_tiny_models import FAMILY_CASES, NEW_CASES, TINY_MODEL  # noqa: E402
from interpreted_triton import run_with_triton  # noqa: E402

from moe_core.errors import InvalidInputError  # noqa: E402
from moe_core.integrations.transformers import SUPPORTED_BLOCKS, find_moe_blocks  # noqa: E402
from moe_core.integrations.transformers.patch import (  # noqa: E402
    FoldedSharedMlp,
    PatchedMoeBlock,
    PatchReport,
    patch_model,
)
from moe_core.tolerances import relative_l2, tolerance  # noqa: E402

TOL = 1e-5
NEW_TOKENS = 32
BASE = TINY_MODEL
#: case -> (model_type, config overrides, the block class patched); filled from hf_tiny_models below
CASES = {}


#: blocks no whole tiny causal LM runs (each is checked block by block in test_transformers_families)
E2E_LEFT_OUT = {
    # Qwen3-Omni's talker: a speech-codec decoder fed the thinker's hidden states, not a text causal LM (its
    # generate needs the thinker and the code predictor)
    "Qwen3OmniMoeTalkerTextSparseMoeBlock": "Qwen3-Omni talker: a codec decoder driven by the thinker, no text LM",
    # dots3-note's vision tower: it runs on image patches only, a text prompt never reaches it
    "Dots3NoteVisionMoE": "dots3-note vision tower: runs on image patches only, never on a text prompt",
}

#: what a whole model needs on top of the families' one-layer block configs (hf_tiny_models)
_E2E_EXTRA = {
    # full attention in both layers and 4 KV heads: its other attention variants fail in transformers' own
    # cache and attention code, which is not the MoE's business
    "bailing_hybrid": dict(num_key_value_heads=4, layer_types=["full_attention"]),
    # one attention layer: with mamba layers only, generate fails in transformers (the cache has no attention
    # layer to read the sequence length from)
    "jamba": dict(attn_layer_period=2, attn_layer_offset=1),
    # its indexed attention layers need the QSA indexer's sizes
    "qwen4_exp_text": dict(
        indexer_n_heads=2, indexer_kv_heads=1, indexer_head_dim=16, indexer_budget=8, indexer_compress_ratio=4
    ),
    # the multimodal rope's sections must add up to head_dim 16 x partial_rotary_factor 0.5 / 2
    "glm4v_moe_text": dict(
        rope_parameters=dict(rope_type="default", rope_theta=1e4, partial_rotary_factor=0.5, mrope_section=[2, 1, 1])
    ),
}
#: whole-model cases with no block case in hf_tiny_models: DeepSeek-OCR-2's text model is UnlimitedOcr's
#: (from_deepseek_v2); gpt-oss's block (biases, swiglu_oai) is checked in test_transformers_crosscheck
_EXTRA_CASES = {
    "gpt_oss": (
        dict(intermediate_size=32, num_local_experts=4, num_experts_per_tok=2, head_dim=16),
        "GptOssMLP",
        False,
    ),
    "deepseek_ocr2_text": (
        dict(NEW_CASES["unlimited_ocr_text"][0], mlp_layer_types=["sparse"]),
        "DeepseekOcr2TextMoe",
        True,
    ),
}
_VISION = dict(depth=1, hidden_size=32, intermediate_size=32, num_heads=2, out_hidden_size=BASE["hidden_size"])
_OCR_VISION = dict(
    sam_config=dict(
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        mlp_dim=32,
        global_attn_indexes=[0],
        downsample_channels=[16, 32],
        output_channels=16,
        image_size=64,
        window_size=2,
    ),
    encoder_config=dict(
        hidden_size=32, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=28
    ),
)
#: text sub-configs without a causal LM of their own -> (the full model's type, its other sub-configs): built as
#: the family's ForConditionalGeneration with a one-layer vision (and audio) tower, fed text only
MULTIMODAL = {
    "qwen3_vl_moe_text": ("qwen3_vl_moe", dict(vision_config=dict(_VISION, deepstack_visual_indexes=[]))),
    "glm4v_moe_text": ("glm4v_moe", dict(vision_config=_VISION)),
    "mistral_large4_text": (
        "mistral_large4",
        dict(
            vision_config=dict(
                model_type="pixtral",
                hidden_size=32,
                intermediate_size=32,
                num_hidden_layers=1,
                num_attention_heads=2,
                head_dim=16,
            )
        ),
    ),
    "unlimited_ocr_text": ("unlimited_ocr", dict(vision_config=_OCR_VISION)),
    "deepseek_ocr2_text": ("deepseek_ocr2", dict(vision_config=_OCR_VISION)),
    # the thinker: its config lacks vision_start_token_id, which generate's rope index reads; its own
    # initializer_range (not the text config's) initialises the whole model
    "qwen3_omni_moe_text": (
        "qwen3_omni_moe_thinker",
        dict(
            vision_config=dict(_VISION, deepstack_visual_indexes=[]),
            audio_config=dict(
                encoder_layers=1,
                encoder_attention_heads=2,
                encoder_ffn_dim=32,
                d_model=32,
                output_dim=BASE["hidden_size"],
                downsample_hidden_size=16,
                num_mel_bins=16,
            ),
            vision_start_token_id=151652,
            initializer_range=BASE["initializer_range"],
        ),
    ),
}


def _whole_model(overrides: dict) -> dict:
    """A one-layer block config for BASE's layers: one-element per-layer lists repeated."""
    layers = BASE["num_hidden_layers"]
    return {k: v * layers if isinstance(v, list) and len(v) == 1 else v for k, v in overrides.items()}


CASES.update(
    {
        case: (case.removesuffix("_greedy"), _whole_model({**overrides, **_E2E_EXTRA.get(case, {})}), block_class)
        for case, (overrides, block_class, _) in {**FAMILY_CASES, **_EXTRA_CASES}.items()
        if block_class not in E2E_LEFT_OUT
    }
)


def _causal_lm(cfg):
    """``AutoModelForCausalLM`` where the config has one, else the modeling module's ``<Stem>ForCausalLM``
    (Mistral 4's is not in the auto map) or ``<Stem>ForConditionalGeneration``."""
    if type(cfg) in transformers.MODEL_FOR_CAUSAL_LM_MAPPING:
        return transformers.AutoModelForCausalLM.from_config(cfg)
    modeling = importlib.import_module(type(cfg).__module__.replace(".configuration_", ".modeling_"))
    stem = type(cfg).__name__.removesuffix("Config")
    model_class = getattr(modeling, f"{stem}ForCausalLM", None) or getattr(modeling, f"{stem}ForConditionalGeneration")
    return model_class(cfg)


def build(case: str, dtype: torch.dtype = torch.float32, **overrides):
    model_type, config_overrides, _ = CASES[case]
    torch.manual_seed(0)
    text = {**BASE, **config_overrides, **overrides}
    if case in MULTIMODAL:
        full_type, sub_configs = MULTIMODAL[case]
        cfg = transformers.AutoConfig.for_model(full_type, text_config=text, **sub_configs)
    else:
        cfg = transformers.AutoConfig.for_model(model_type, **text)
    model = _causal_lm(cfg).to(dtype).eval()
    model.generation_config.eos_token_id = None  # random weights: no early stop, always NEW_TOKENS tokens
    return model


def input_ids(batch: int = 2, seq: int = 7) -> torch.Tensor:
    return torch.randint(0, BASE["vocab_size"], (batch, seq), generator=torch.Generator().manual_seed(1))


def logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids).logits.float()


def patched_copy(model, **kwargs):
    patched = copy.deepcopy(model)
    return patched, patch_model(patched, **kwargs)


# --- every family, fp32: logits and greedy tokens -------------------------------------------------------------


def test_every_supported_block_is_run_end_to_end_or_left_out_with_a_reason():
    covered = {block_class for _, _, block_class in CASES.values()}
    assert not covered & set(E2E_LEFT_OUT)
    assert covered | set(E2E_LEFT_OUT) == set(SUPPORTED_BLOCKS), set(SUPPORTED_BLOCKS) - covered - set(E2E_LEFT_OUT)


@pytest.mark.parametrize("case", list(CASES))
def test_patched_model_matches_transformers(case):
    model = build(case)
    names = [name for name, _ in find_moe_blocks(model)]
    assert len(names) == BASE["num_hidden_layers"]
    patched, report = patched_copy(model, backend="torch")
    assert [r.name for r in report.replaced] == names and not report.skipped
    assert {r.block_class for r in report.replaced} == {CASES[case][2]}
    assert all(isinstance(patched.get_submodule(n), PatchedMoeBlock) for n in names)
    assert not list(find_moe_blocks(patched))

    ids = input_ids()
    ref, ours = logits(model, ids), logits(patched, ids)
    err = (ours - ref).abs().max().item()
    print(f"{case}: max abs logit error {err:.2e} (max |logit| {ref.abs().max().item():.2f})")
    assert err < TOL

    prompt = ids[:1]
    expected = model.generate(prompt, max_new_tokens=NEW_TOKENS, do_sample=False)
    got = patched.generate(prompt, max_new_tokens=NEW_TOKENS, do_sample=False)
    assert got.shape == expected.shape == (1, prompt.shape[1] + NEW_TOKENS)
    assert torch.equal(got, expected)


# --- bf16 ------------------------------------------------------------------------------------------------------

#: bf16 logits, relative to the largest |logit|: transformers rounds every GEMM output (the experts' gate_up,
#: the activation, down, each weighted expert output) to bf16 — half an ulp is 2^-8 ~ 3.9e-3 per rounding — while
#: the torch backend keeps float32 intermediates and rounds its output once; both differ from exact by a few
#: roundings per MoE layer, those differences go through the following attention/norm layers, and a near-tie in
#: the routing may pick another expert for a token. Measured 6e-3 (qwen2_moe) to 8.5e-3 (deepseek_v3, gpt_oss);
#: 5e-2 leaves room for another machine's summation order.
BF16_REL = 5e-2


@pytest.mark.parametrize("case", ["qwen2_moe", "deepseek_v3", "gpt_oss"])
def test_patched_model_bf16_within_tolerance(case):
    model = build(case, torch.bfloat16)
    patched, report = patched_copy(model, backend="torch")
    assert len(report.replaced) == 2
    assert all(patched.get_submodule(r.name).config.dtype == torch.bfloat16 for r in report.replaced)
    ids = input_ids()
    ref, ours = logits(model, ids), logits(patched, ids)
    rel = ((ours - ref).abs().max() / ref.abs().max()).item()
    print(f"{case} bf16: max logit error / max |logit| = {rel:.2e}")
    assert rel < BF16_REL
    # the generated tokens are not compared: a near-tie between two logits may round either way in bf16


# --- the report, the return forms, shared MLPs in the decoder layer ------------------------------------------------


def test_report_lists_backends_and_return_forms():
    model = build("gpt_oss", num_hidden_layers=1)
    report = patch_model(model, backend="torch")
    [entry] = report.replaced
    assert (entry.name, entry.block_class, entry.backend, entry.shared_backend) == (
        "model.layers.0.mlp",
        "GptOssMLP",
        "torch",
        None,
    )
    assert entry.returns == "tuple of 2" and entry.detected_by == "probe"
    assert entry.routing == "torch"  # the torch reference offers no fused router
    layer = model.model.layers[0].mlp
    out = layer(torch.zeros(2, 3, 64))
    assert isinstance(out, tuple) and out[0].shape == (2, 3, 64) and out[1] is None
    text = str(report)
    assert "model.layers.0.mlp" in text and "GptOssMLP" in text and "torch" in text and "routing" in text
    data = json.loads(json.dumps(report.to_dict()))
    assert data["replaced"][0]["name"] == "model.layers.0.mlp" and data["skipped"] == []


def test_llama4_returns_a_flat_tuple_and_shared_backend_is_reported():
    model = build("llama4_text", num_hidden_layers=1)
    report = patch_model(model, backend="torch")
    [entry] = report.replaced
    assert entry.shared_backend == "torch" and entry.returns == "tuple of 2 (flat [M, H])"
    out, second = model.model.layers[0].feed_forward(torch.zeros(2, 3, 64))
    assert out.shape == (6, 64) and second is None


def test_probe_failure_falls_back_to_the_class_table():
    model = build("gpt_oss", num_hidden_layers=1)
    reference = copy.deepcopy(model)
    block = model.model.layers[0].mlp

    def no_probe(*args, **kwargs):
        raise RuntimeError("cannot run here")

    block.forward = no_probe
    [entry] = patch_model(model, backend="torch").replaced
    assert entry.returns == "tuple of 2" and entry.detected_by.startswith("class table")
    ids = input_ids()
    assert (logits(model, ids) - logits(reference, ids)).abs().max() < TOL


@pytest.mark.parametrize("case", ["granitemoeshared", "granitemoehybrid"])
def test_layer_level_shared_mlp_is_folded_in(case):
    model = build(case, num_hidden_layers=1, **({"layer_types": ["attention"]} if case == "granitemoehybrid" else {}))
    decoder = model.model.layers[0]
    gone = weakref.ref(decoder.shared_mlp)
    [entry] = patch_model(model, backend="torch").replaced
    assert entry.shared_backend == "torch"
    gc.collect()
    assert gone() is None
    assert isinstance(decoder.shared_mlp, FoldedSharedMlp)  # folded: adds nothing, whichever way it is called
    assert decoder.block_sparse_moe.shared_runner is not None


# --- memory: nothing keeps the original blocks --------------------------------------------------------------------


def test_original_blocks_and_expert_weights_are_freed():
    model = build("qwen2_moe")
    blocks = [weakref.ref(b) for _, b in find_moe_blocks(model)]
    experts = [weakref.ref(b().experts.gate_up_proj) for b in blocks]
    shared = [weakref.ref(b().shared_expert.gate_proj.weight) for b in blocks]
    patch_model(model, backend="torch")
    gc.collect()
    assert all(ref() is None for ref in blocks + experts + shared)
    # the layers' expert tensors share nothing with what is left of the model (the router keeps its gate weight)
    kept = {p.untyped_storage().data_ptr() for p in model.parameters()}
    layers = [m for m in model.modules() if isinstance(m, PatchedMoeBlock)]
    assert len(layers) == 2
    for layer in layers:
        for runner in (layer.runner, layer.shared_runner):
            assert all(t.untyped_storage().data_ptr() not in kept for t in runner.prepared.tensors().values())


# --- strict: modules that look like MoE blocks but have no converter ---------------------------------------------


class FakeMoeBlock(torch.nn.Module):
    """A made-up MoE block: an ``experts`` submodule, a class no converter knows."""

    def __init__(self) -> None:
        super().__init__()
        self.experts = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.experts(x)


def test_strict_raises_on_an_unsupported_block_naming_it():
    model = torch.nn.Module()
    model.layers = torch.nn.ModuleList([torch.nn.ModuleDict({"mlp": FakeMoeBlock()})])
    with pytest.raises(InvalidInputError) as info:
        patch_model(model)
    message = str(info.value)
    assert "layers.0.mlp" in message and "FakeMoeBlock" in message and "MixtralSparseMoeBlock" in message
    report = patch_model(model, strict=False)
    assert report.replaced == [] and [(s.name, s.block_class) for s in report.skipped] == [
        ("layers.0.mlp", "FakeMoeBlock")
    ]
    assert "layers.0.mlp" in str(report)


def test_strict_raises_before_replacing_anything_and_non_strict_patches_the_rest():
    model = build("mixtral")
    model.model.layers[1].extra = FakeMoeBlock()
    with pytest.raises(InvalidInputError, match=r"model\.layers\.1\.extra \(FakeMoeBlock\)"):
        patch_model(model, backend="torch")
    assert not any(isinstance(m, PatchedMoeBlock) for m in model.modules())
    report = patch_model(model, backend="torch", strict=False)
    assert [r.name for r in report.replaced] == ["model.layers.0.mlp", "model.layers.1.mlp"]
    assert [s.name for s in report.skipped] == ["model.layers.1.extra"]


def test_unknown_quant_scheme_is_refused():
    with pytest.raises(InvalidInputError, match="quant_scheme"):
        patch_model(torch.nn.Module(), quant_scheme="bf16")


# --- quantized routed experts ---------------------------------------------------------------------------------


def test_fp8_block_runs_and_stays_close():
    """Block level: ``tolerances`` for fp8_block is 3e-2 relative L2 against a reference that quantizes the
    activations the same way; here the reference is the *unquantized* block, so the weights' own rounding
    (e4m3, 3-bit mantissa: ~2-3% per GEMM in L2 over random weights) counts too: 1e-1. Logits: the experts are a
    share of each logit, so the same rounding moves them by less, relative to the largest: 5e-2. Measured: 5.9e-2
    (block) and 1.4e-2 (logits)."""
    model = build("qwen3_moe")
    patched, report = patched_copy(model, backend="torch", quant_scheme="fp8_block")
    assert {r.quant_scheme for r in report.replaced} == {"fp8_block"}
    layer = patched.get_submodule(report.replaced[0].name)
    assert layer.config.quant_scheme == "fp8_block" and layer.runner.prepared.w13.dtype == torch.float8_e4m3fn
    x = torch.randn(3, 5, 64, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        block_err = relative_l2(layer(x), model.get_submodule(report.replaced[0].name)(x))
    ids = input_ids()
    ref, ours = logits(model, ids), logits(patched, ids)
    rel = ((ours - ref).abs().max() / ref.abs().max()).item()
    print(f"fp8_block: block relative L2 {block_err:.2e}, logits {rel:.2e}")
    assert 0 < block_err < 1e-1 and rel < 5e-2


def test_mxfp4_of_mxfp4_representable_weights_is_lossless():
    """A gpt-oss MXFP4 checkpoint loaded without its kernels is dequantized by transformers (to bf16): its
    values are MXFP4-representable, and re-quantizing them (block of 32 along H, the same axis as the
    checkpoint's blocks) gives them back exactly (measured: bit for bit). Here on Mixtral's layout (K last), fp32."""
    from moe_core.quant import dequantize_mxfp4, dequantize_weights, quantize_mxfp4

    model = build("mixtral", num_hidden_layers=1)
    experts = model.model.layers[0].mlp.experts
    with torch.no_grad():
        for p in (experts.gate_up_proj, experts.down_proj):
            p.copy_(dequantize_mxfp4(*quantize_mxfp4(p)))
    reference = copy.deepcopy(model)
    want = (experts.gate_up_proj.detach().clone(), experts.down_proj.detach().clone())
    report = patch_model(model, backend="torch", quant_scheme="mxfp4")
    layer = model.model.layers[0].mlp
    assert report.replaced[0].quant_scheme == "mxfp4" and layer.runner.prepared.w13.dtype == torch.uint8
    w13, w2 = dequantize_weights(layer.runner.prepared, "mxfp4")
    assert torch.equal(w13, want[0]) and torch.equal(w2, want[1])
    ids = input_ids()
    assert (logits(model, ids) - logits(reference, ids)).abs().max() < TOL


# --- torch.compile ---------------------------------------------------------------------------------------------


def test_torch_compile_of_a_patched_model_runs():
    """One case (the slowest test here: dynamo traces the whole model; ``aot_eager`` skips inductor's codegen).
    The torch backend reads expert ids on the host, yet the model compiles as one graph: each patched block
    is one ``moe::layer`` op (``moe_core.compile_ops``)."""
    torch._dynamo.reset()
    model = build("qwen2_moe", num_hidden_layers=2)
    patched, _ = patched_copy(model, backend="torch")
    ids = input_ids()
    with torch.no_grad():
        explained = torch._dynamo.explain(patched)(input_ids=ids)
    assert explained.graph_break_count == 0
    ops = [str(n.target) for n in explained.graphs[0].graph.nodes if n.op == "call_function"]
    assert ops.count("moe.layer.default") == 2
    compiled = torch.compile(patched, backend="aot_eager", fullgraph=True)
    assert (logits(compiled, ids) - logits(model, ids)).abs().max() < TOL
    torch._dynamo.reset()


# --- triton under its CPU interpreter, in a fresh interpreter ------------------------------------------------------

TRITON_CASES = ("mixtral", "qwen2_moe", "deepseek_v3")


def triton_against_unpatched() -> dict:
    """Run by the test below in a fresh interpreter with ``TRITON_INTERPRET=1``."""
    out = {}
    for case in TRITON_CASES:
        model = build(case, num_hidden_layers=1)
        patched, report = patched_copy(model, backend="triton")
        ids = input_ids(1, 4)
        out[case] = {
            "backends": [report.replaced[0].backend, report.replaced[0].shared_backend],
            "routing": report.replaced[0].routing,
            "gate": [m.fused_router.takes_gate for m in patched.modules() if isinstance(m, PatchedMoeBlock)],
            "error": relative_l2(logits(patched, ids), logits(model, ids)),
        }
    return out


def test_triton_backend_matches_unpatched(tmp_path):
    """In a fresh interpreter with triton interpreted (``interpreted_triton``)."""
    result = run_with_triton("test_transformers_patch", "triton_against_unpatched", tmp_path)
    for case in TRITON_CASES:
        shared = None if case == "mixtral" else "triton"
        assert result[case]["backends"] == ["triton", shared], result
        assert result[case]["routing"] == "triton", result  # softmax / grouped top-k in moe-triton's one kernel
        # softmax top-k takes the gate GEMM into that kernel too; DeepSeek-V3's float32 logits stay apart
        assert result[case]["gate"] == [case != "deepseek_v3"], result
        # fp32 end to end: the layers' own tolerance (1e-4 relative L2) bounds the logits' too
        assert result[case]["error"] <= tolerance("fp32", torch.float32), result


# --- transformers stays optional ---------------------------------------------------------------------------------


def test_importing_the_integration_does_not_import_transformers():
    code = (
        "import sys, moe_core, moe_core.integrations.transformers as t; "
        "import moe_core.integrations.transformers.patch, moe_core.integrations.transformers.experts_interface; "
        "assert 'transformers' not in sys.modules, 'transformers was imported'"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_report_is_a_dataclass_with_a_readable_empty_form():
    assert str(PatchReport()).startswith("replaced 0 MoE block(s), skipped 0")


# --- the layers' own CUDA graphs (moe_core.graphs): the option reaches every layer ------------------------------


def test_cuda_graph_option_reaches_every_layer():
    model = build("qwen2_moe", num_hidden_layers=2)
    default, _ = patched_copy(model, backend="torch")
    off, _ = patched_copy(model, backend="torch", cuda_graph_max_tokens=0)
    layers = lambda m: [x for x in m.modules() if isinstance(x, PatchedMoeBlock)]
    assert len(layers(default)) == 2 and {x.graphs.max_tokens for x in layers(default)} == {256}
    assert {x.graphs.max_tokens for x in layers(off)} == {0}
    fresh = copy.deepcopy(model)
    with pytest.raises(InvalidInputError, match="cuda_graph_max_tokens"):
        patch_model(fresh, backend="torch", cuda_graph_max_tokens=-4)
    assert not layers(fresh)  # refused before anything was replaced
