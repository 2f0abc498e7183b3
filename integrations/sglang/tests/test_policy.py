"""What moe-sglang does with what it cannot serve, and the SGLang version guard (README: "What it cannot serve")."""

from __future__ import annotations

import logging

import pytest
import sgl_setup
import torch

from moe_sglang import binding, choices, plugin, versions


def test_choices_name_every_installed_backend_without_importing_plugins():
    import sys

    names = choices.choices()
    assert names[0] == "moe" and "moe:torch" in names and "moe:flashinfer_mxfp4" in names
    assert choices.moe_backend("moe") == "auto" and choices.moe_backend("moe:triton") == "triton"
    assert choices.moe_backend("triton") is None and choices.moe_backend("moe:") is None
    assert "moe_flashinfer_mxfp4.fused_op" not in sys.modules or "flashinfer" not in sys.modules


def test_other_sglang_versions_are_refused_before_anything_is_registered(monkeypatch):
    assert versions.refusal("0.5.23") is None
    message = versions.refusal("0.5.24")
    assert "tested against sglang 0.5.23 only; sglang 0.5.24 is installed" in message
    assert "not offered" in message
    from sglang.srt.arg_groups.choices import MOE_RUNNER_BACKEND_CHOICES
    from sglang.srt.plugins.hook_registry import HookRegistry

    before, hooks = list(MOE_RUNNER_BACKEND_CHOICES), {k: list(v) for k, v in HookRegistry._hooks.items()}
    monkeypatch.setattr(versions, "installed", lambda: "0.5.24")
    monkeypatch.setattr(plugin, "_registered", False)
    with pytest.raises(RuntimeError, match="tested against sglang 0.5.23 only"):
        plugin.register()
    assert MOE_RUNNER_BACKEND_CHOICES == before
    assert {k: list(v) for k, v in HookRegistry._hooks.items()} == hooks


@pytest.mark.usefixtures("sglang_with_moe")
def test_a2a_backend_other_than_none_is_refused(monkeypatch):
    from sglang.srt.layers.moe import utils
    from sglang.srt.layers.moe.utils import MoeA2ABackend

    monkeypatch.setattr(utils, "get_moe_a2a_backend", lambda: MoeA2ABackend.DEEPEP)
    with pytest.raises(binding.BridgeError, match="--moe-a2a-backend deepep dispatches tokens in its own format"):
        sgl_setup.fused_moe(4, 32, 64, 2, torch.bfloat16, layer_id=5)


@pytest.mark.usefixtures("sglang_with_moe")
def test_auto_leaves_an_unservable_unquantized_layer_to_sglang_and_says_so(torch_calls, caplog):
    """A SiLU clamped without gpt-oss's alpha has no moe activation: under ``moe`` (auto) the layer runs on SGLang's
    own path (its runner and its native CPU forward), and the log line says why."""
    with caplog.at_level(logging.INFO, logger="moe_sglang"):
        layer = sgl_setup.fused_moe(4, 32, 64, 2, torch.float32, layer_id=6, gemm1_clamp_limit=7.0)
    assert "MoE layer 6 (model.layers.6.mlp.experts) runs on SGLang's own path, not moe" in caplog.text
    assert layer.runner_backend.value == "triton" and getattr(layer, binding.ATTR).declined
    layer.quant_method.process_weights_after_loading(layer)
    layer(torch.randn(3, 32), sgl_setup.routing(3, 4, 2))
    assert torch_calls == []


@pytest.mark.usefixtures("sglang_with_moe")
def test_explicit_backend_refuses_what_it_cannot_serve(monkeypatch):
    monkeypatch.setattr(binding, "requested", lambda: ("moe:torch", "torch"))
    with pytest.raises(binding.BridgeError, match=r"moe:torch cannot run MoE layer 7 .*: its activation 'silu'"):
        sgl_setup.fused_moe(4, 32, 64, 2, torch.float32, layer_id=7, gemm1_clamp_limit=7.0)


@pytest.mark.usefixtures("sglang_with_moe")
def test_a_quantization_method_it_does_not_convert_is_refused():
    from sglang.srt.layers.quantization.mxfp4 import Mxfp4Config

    with pytest.raises(binding.BridgeError, match="Mxfp4DynamicQuantMoEMethod is not one moe-sglang converts"):
        sgl_setup.fused_moe(4, 64, 64, 2, torch.bfloat16, layer_id=8, quant_config=Mxfp4Config())
