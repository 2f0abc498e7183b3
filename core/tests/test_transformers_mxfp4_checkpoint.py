"""``patch_model`` on gpt-oss blocks that hold their MXFP4 checkpoint tensors: the bytes are read, not requantized.

A tiny gpt-oss causal LM (``test_transformers_patch.build("gpt_oss")``: ``hf_tiny_models.TINY_MODEL``, two layers,
4 experts, seeded; expert biases filled with seeded non-zero values, zeros would hide a bias bug) is quantized
with ``quantize_weights(from_hf_block(block, dtype=model dtype).weights, "mxfp4")``; those bytes, re-interleaved
into gpt-oss's checkpoint layout (``gate_up_proj_blocks [E, 2I, H/32, 16]`` with rows ``[g0, u0, g1, u1, ...]``,
``*_scales [E, N, K/32]`` — checked against transformers' own ``convert_moe_packed_tensors``), are put into
transformers' ``Mxfp4GptOssExperts`` the way transformers holds them:

- **loaded** (transformers 5.24): the block becomes ``Mxfp4GptOssMLP(router, Mxfp4GptOssExperts(config))`` and
  transformers' own loading op ``Mxfp4Deserialize`` (-> ``swizzle_mxfp4_convertops``) turns each
  projection's blocks and scales into triton_kernels tensors. triton_kernels (a Hub kernel) cannot be had on
  CPU here, so the op gets ``fake_triton_kernels()``: the part of triton_kernels' API the op calls (``Storage``,
  ``Tensor``, ``wrap_torch_tensor``, ``convert_layout``, layouts with ``swizzle_data`` / ``unswizzle_data``,
  ``PrecisionConfig``), with triton_kernels' ``StridedLayout`` semantics (what CPU gets) or a layout that
  really moves the bytes (standing in for Hopper's swizzle, so that a reader ignoring the layout fails);
  transformers' own ``Mxfp4ReverseDeserialize`` must read the checkpoint back from that state.
- **checkpoint tensors** (transformers 4.55-4.57 before swizzling): a ``GptOssMLP`` whose experts are an
  ``Mxfp4GptOssExperts`` with ``gate_up_proj_blocks`` / ``_scales`` parameters.

Then: (a) the patched layer's prepared weights (the torch backend keeps canonical ones) equal
``quantize_weights`` of the float experts bit for bit; (b) the patched model's logits match the float model
whose experts hold transformers' dequantization (``convert_moe_packed_tensors``) of the same checkpoint;
(c) any other ``quant_scheme`` raises ``InvalidInputError`` naming the blocks, before anything is replaced.
"""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest

transformers = pytest.importorskip("transformers")

import torch  # noqa: E402
from test_transformers_patch import BF16_REL, TOL, build, input_ids, logits  # noqa: E402
from transformers.integrations import mxfp4 as hf_mxfp4  # noqa: E402

from moe_core.errors import InvalidInputError  # noqa: E402
from moe_core.integrations.transformers import find_moe_blocks, from_hf_block, patch_model  # noqa: E402
from moe_core.integrations.transformers.mxfp4_checkpoint import read_mxfp4_experts  # noqa: E402
from moe_core.integrations.transformers.patch import PatchedMoeBlock  # noqa: E402
from moe_core.quant import dequantize_mxfp4, quantize_weights  # noqa: E402
from moe_core.weights import MoeWeights  # noqa: E402

LAYERS = ("model.layers.0.mlp", "model.layers.1.mlp")
FIELDS = ("w13", "w13_scale", "w2", "w2_scale", "b13", "b2")


# --- a stand-in for the triton_kernels API transformers' loading op calls --------------------------------------


class Storage:
    def __init__(self, data: torch.Tensor, layout) -> None:
        self.data, self.layout = data, layout


class Tensor:
    def __init__(self, storage: Storage, dtype, shape) -> None:
        self.storage, self.dtype, self.shape = storage, dtype, list(shape)


class StridedLayout:
    """triton_kernels' ``StridedLayout``: the data as it is."""

    def __init__(self, shape, **kwargs) -> None:
        self.initial_shape = list(shape)

    def swizzle_data(self, data):
        return data

    def unswizzle_data(self, data):
        return data


class MovedLayout(StridedLayout):
    """Stands in for a real swizzle (Hopper's): the stored bytes are a permutation of another shape."""

    def swizzle_data(self, data):
        return data.flip(-2).mT.contiguous()

    def unswizzle_data(self, data):
        return data.mT.flip(-2)


def fake_triton_kernels(value_layout) -> SimpleNamespace:
    fp4 = SimpleNamespace(bitwidth=4)

    def wrap_torch_tensor(t, dtype=None):
        shape = list(t.shape)
        if dtype is fp4:  # two fp4 values a byte along the contiguous dim
            shape[t.stride().index(1)] *= 2
        return Tensor(Storage(t, StridedLayout(t.shape)), dtype or t.dtype, shape)

    def convert_layout(tensor, layout_cls, **kwargs):
        data = tensor.storage.layout.unswizzle_data(tensor.storage.data)
        layout = layout_cls(data.shape, **kwargs)
        return Tensor(Storage(layout.swizzle_data(data), layout), tensor.dtype, tensor.shape)

    layout = SimpleNamespace(
        StridedLayout=StridedLayout, make_default_matmul_mxfp4_w_layout=lambda mx_axis: (value_layout, {})
    )
    return SimpleNamespace(
        tensor=SimpleNamespace(FP4=fp4, wrap_torch_tensor=wrap_torch_tensor, convert_layout=convert_layout),
        tensor_details=SimpleNamespace(layout=layout),
        matmul_ogs=SimpleNamespace(
            PrecisionConfig=lambda weight_scale, flex_ctx: SimpleNamespace(weight_scale=weight_scale),
            FlexCtx=lambda rhs_data: None,
            InFlexData=lambda: None,
        ),
    )


# --- the checkpoint --------------------------------------------------------------------------------------------


def gpt_oss(dtype: torch.dtype):
    """The tiny gpt-oss LM with seeded non-zero expert biases."""
    model = build("gpt_oss", dtype)
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name in LAYERS:
            experts = model.get_submodule(name).experts
            for bias in (experts.gate_up_proj_bias, experts.down_proj_bias):
                bias.copy_(torch.randn(bias.shape, generator=gen) * 0.5)
    return model


def interleave(intermediate: int) -> torch.Tensor:
    """Canonical ``[gate; up]`` row -> gpt-oss's interleaved order: ``canonical[index]`` is the checkpoint."""
    j = torch.arange(intermediate)
    return torch.argsort(torch.cat([2 * j, 2 * j + 1]))


def checkpoint_of(q: MoeWeights) -> dict[str, torch.Tensor]:
    """Canonical mxfp4 weights -> gpt-oss's MXFP4 checkpoint tensors of one block's experts."""
    two_i = q.w13.shape[1]
    rows = interleave(two_i // 2)
    ckpt = {
        "gate_up_proj_blocks": q.w13[:, rows].unflatten(-1, (-1, 16)),
        "gate_up_proj_scales": q.w13_scale[:, rows],
        "down_proj_blocks": q.w2.unflatten(-1, (-1, 16)),
        "down_proj_scales": q.w2_scale,
        "gate_up_proj_bias": q.b13[:, rows],
        "down_proj_bias": q.b2,
    }
    # the layout is gpt-oss's: transformers' dequantization gives GptOssExperts' [E, H, 2I] interleaved columns
    w13, w2 = (dequantize_mxfp4(w, s) for w, s in ((q.w13, q.w13_scale), (q.w2, q.w2_scale)))
    theirs = hf_mxfp4.convert_moe_packed_tensors(
        ckpt["gate_up_proj_blocks"], ckpt["gate_up_proj_scales"], dtype=torch.float32
    )
    assert torch.equal(theirs, w13[:, rows].transpose(1, 2))
    theirs = hf_mxfp4.convert_moe_packed_tensors(
        ckpt["down_proj_blocks"], ckpt["down_proj_scales"], dtype=torch.float32
    )
    assert torch.equal(theirs, w2.transpose(1, 2))
    return ckpt


def quantized_blocks(model) -> dict[str, MoeWeights]:
    """``quantize_weights`` of each block's float experts (copied in the model's dtype, as ``patch_model`` copies
    them): what a reader must return."""
    dtype = model.dtype
    return {
        name: quantize_weights(from_hf_block(model.get_submodule(name), dtype=dtype).weights, "mxfp4")
        for name in LAYERS
    }


def dequantized_reference(model, quantized: dict[str, MoeWeights]):
    """The float model whose experts hold transformers' own dequantization of the checkpoint."""
    reference = copy.deepcopy(model)
    with torch.no_grad():
        for name, q in quantized.items():
            ckpt = checkpoint_of(q)
            experts = reference.get_submodule(name).experts
            for proj in ("gate_up_proj", "down_proj"):
                deq = hf_mxfp4.convert_moe_packed_tensors(
                    ckpt[f"{proj}_blocks"], ckpt[f"{proj}_scales"], dtype=experts.gate_up_proj.dtype
                )
                getattr(experts, proj).copy_(deq)
    return reference


def loaded_model(model, quantized: dict[str, MoeWeights], monkeypatch, value_layout=StridedLayout):
    """transformers 5.24 after ``from_pretrained(..., quantization_config=Mxfp4Config(dequantize=False))``: every
    ``GptOssMLP`` an ``Mxfp4GptOssMLP`` whose experts were filled by transformers' ``Mxfp4Deserialize`` op."""
    monkeypatch.setattr(hf_mxfp4, "triton_kernels_hub", fake_triton_kernels(value_layout), raising=False)
    # loaded on CPU as on a machine without an accelerator (with one, the op moves CPU tensors onto it)
    monkeypatch.setattr(hf_mxfp4, "get_current_accelerator", lambda: None)
    loaded = copy.deepcopy(model)
    for name, q in quantized.items():
        parent_name, _, attr = name.rpartition(".")
        block = loaded.get_submodule(name)
        experts = hf_mxfp4.Mxfp4GptOssExperts(loaded.config)
        setattr(loaded.get_submodule(parent_name), attr, hf_mxfp4.Mxfp4GptOssMLP(block.router, experts))
        ckpt = checkpoint_of(q)
        for proj in ("gate_up_proj", "down_proj"):
            names = (f"{proj}_blocks", f"{proj}_scales")
            missing = {f"{name}.experts.{proj}"}
            hf_mxfp4.Mxfp4Deserialize(None).convert(
                {n: [ckpt[n]] for n in names},
                model=loaded,
                full_layer_name=f"{name}.experts.{proj}",
                missing_keys=missing,
            )
            assert not missing and not isinstance(getattr(experts, proj), torch.Tensor)  # swizzled, not a parameter
            with torch.no_grad():  # biases are plain parameters, loaded as they are
                getattr(experts, f"{proj}_bias").copy_(ckpt[f"{proj}_bias"])
        # what transformers would save from this state is the checkpoint again (the stand-in is consistent)
        for proj in ("gate_up_proj", "down_proj"):
            saved = hf_mxfp4.Mxfp4ReverseDeserialize(None).convert(
                {}, model=loaded, full_layer_name=f"{name}.experts.{proj}_blocks"
            )
            assert torch.equal(saved[f"{name}.experts.{proj}_blocks"], ckpt[f"{proj}_blocks"])
            assert torch.equal(saved[f"{name}.experts.{proj}_scales"], ckpt[f"{proj}_scales"])
    return loaded


def checkpoint_tensor_model(model, quantized: dict[str, MoeWeights]):
    """transformers 4.55-4.57's form: ``GptOssMLP`` kept, its experts an ``Mxfp4GptOssExperts`` holding the
    checkpoint's ``*_blocks`` / ``*_scales`` as parameters."""
    held = copy.deepcopy(model)
    for name, q in quantized.items():
        experts = hf_mxfp4.Mxfp4GptOssExperts(held.config)
        del experts.gate_up_proj, experts.down_proj  # 5.24's placeholders; 4.5x had *_blocks / *_scales instead
        for key, value in checkpoint_of(q).items():
            setattr(experts, key, torch.nn.Parameter(value.clone(), requires_grad=False))
        held.get_submodule(name).experts = experts
    return held


# --- (a) the bytes read are the checkpoint's, bit for bit ------------------------------------------------------


def _assert_prepared_is(model, quantized: dict[str, MoeWeights], dtype: torch.dtype) -> None:
    for name, q in quantized.items():
        layer = model.get_submodule(name)
        assert isinstance(layer, PatchedMoeBlock)
        assert layer.config.quant_scheme == "mxfp4" and layer.config.dtype == dtype
        prepared = layer.runner.prepared  # the torch backend's prepared weights are the canonical ones
        for f in FIELDS:
            ours, expected = getattr(prepared, f), getattr(q, f)
            assert ours.dtype == expected.dtype and torch.equal(ours, expected), (name, f)


@pytest.mark.parametrize("layout", [StridedLayout, MovedLayout], ids=["strided", "swizzled"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_loaded_checkpoint_bytes_are_read_as_they_are(dtype, layout, monkeypatch):
    model = gpt_oss(dtype)
    quantized = quantized_blocks(model)
    loaded = loaded_model(model, quantized, monkeypatch, layout)
    assert [name for name, _ in find_moe_blocks(loaded)] == list(LAYERS)
    report = patch_model(loaded, backend="torch")
    assert [r.name for r in report.replaced] == list(LAYERS) and not report.skipped
    for entry in report.replaced:
        assert (entry.block_class, entry.quant_scheme, entry.weights) == ("Mxfp4GptOssMLP", "mxfp4", "checkpoint")
        # the fused triton forward cannot run here: the return form comes from the class table
        assert entry.returns == "tuple of 2" and entry.detected_by.startswith("class table")
    assert "checkpoint" in str(report) and report.to_dict()["replaced"][0]["weights"] == "checkpoint"
    _assert_prepared_is(loaded, quantized, dtype)


def test_checkpoint_tensors_held_by_gpt_oss_mlp_are_read_as_they_are():
    model = gpt_oss(torch.bfloat16)
    quantized = quantized_blocks(model)
    held = checkpoint_tensor_model(model, quantized)
    report = patch_model(held, backend="torch", quant_scheme="mxfp4")
    assert [(r.block_class, r.weights) for r in report.replaced] == [("GptOssMLP", "checkpoint")] * 2
    _assert_prepared_is(held, quantized, torch.bfloat16)


def test_reader_refuses_a_module_whose_weights_are_not_loaded():
    model = gpt_oss(torch.float32)
    experts = hf_mxfp4.Mxfp4GptOssExperts(model.config)  # as transformers builds it, before loading
    with pytest.raises(InvalidInputError, match="no scales"):
        read_mxfp4_experts(experts, torch.float32)
    model.model.layers[0].mlp = hf_mxfp4.Mxfp4GptOssMLP(model.model.layers[0].mlp.router, experts)
    with pytest.raises(InvalidInputError, match=r"model\.layers\.0\.mlp \(Mxfp4GptOssMLP\) could not be converted"):
        patch_model(model, backend="torch")


def test_reader_refuses_a_layout_it_cannot_read_back(monkeypatch):
    model = gpt_oss(torch.float32)
    loaded = loaded_model(model, quantized_blocks(model), monkeypatch)
    experts = loaded.model.layers[0].mlp.experts
    experts.down_proj.storage.layout = object()  # e.g. a triton_kernels version whose layouts do not unswizzle
    with pytest.raises(InvalidInputError, match="no unswizzle_data"):
        read_mxfp4_experts(experts, torch.float32)


# --- (b) the logits are those of transformers' dequantization --------------------------------------------------

#: fp32: both sides compute with the same exactly dequantized weights (E2M1 x 2^e is exact in fp32 and bf16)
#: and differ only by summation order, as every fp32 whole-model test (``test_transformers_patch.TOL``); bf16:
#: transformers rounds every GEMM output to bf16, the torch backend keeps float32 intermediates
#: (``test_transformers_patch.BF16_REL``, relative to the largest |logit|).
BOUNDS = {torch.float32: TOL, torch.bfloat16: BF16_REL}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("form", ["loaded", "checkpoint tensors"])
def test_logits_match_transformers_dequantized_checkpoint(dtype, form, monkeypatch):
    model = gpt_oss(dtype)
    quantized = quantized_blocks(model)
    reference = dequantized_reference(model, quantized)
    if form == "loaded":
        patched = loaded_model(model, quantized, monkeypatch, MovedLayout)
    else:
        patched = checkpoint_tensor_model(model, quantized)
    patch_model(patched, backend="torch")
    ids = input_ids()
    ref, ours = logits(reference, ids), logits(patched, ids)
    err = ((ours - ref).abs().max() / (1.0 if dtype == torch.float32 else ref.abs().max())).item()
    print(f"{form} {dtype}: logit error {err:.2e}")
    assert err < BOUNDS[dtype]
    if dtype == torch.float32:
        # the bound tells weights apart: the unquantized experts' logits are far outside it
        assert (logits(model, ids) - ref).abs().max().item() > 100 * TOL
        prompt = ids[:1]
        expected = reference.generate(prompt, max_new_tokens=16, do_sample=False)
        assert torch.equal(patched.generate(prompt, max_new_tokens=16, do_sample=False), expected)


# --- (c) another quant_scheme is refused --------------------------------------------------------------------------


@pytest.mark.parametrize("scheme", ["fp8_block", "nvfp4"])
@pytest.mark.parametrize("strict", [True, False])
def test_another_quant_scheme_is_refused_before_anything_is_replaced(scheme, strict, monkeypatch):
    model = gpt_oss(torch.bfloat16)
    loaded = loaded_model(model, quantized_blocks(model), monkeypatch)
    with pytest.raises(InvalidInputError) as info:
        patch_model(loaded, backend="torch", quant_scheme=scheme, strict=strict)
    message = str(info.value)
    assert f"quant_scheme={scheme!r}" in message and "mxfp4 checkpoint" in message
    assert all(f"{name} (Mxfp4GptOssMLP" in message for name in LAYERS)
    assert all(isinstance(loaded.get_submodule(name), hf_mxfp4.Mxfp4GptOssMLP) for name in LAYERS)


def test_float_gpt_oss_is_still_copied_and_quantized():
    model = gpt_oss(torch.float32)
    report = patch_model(copy.deepcopy(model), backend="torch", quant_scheme="mxfp4")
    assert [(r.block_class, r.weights) for r in report.replaced] == [("GptOssMLP", "quantized")] * 2
    report = patch_model(model, backend="torch")
    assert [(r.quant_scheme, r.weights) for r in report.replaced] == [("fp32", "copied")] * 2
