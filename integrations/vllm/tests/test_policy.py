"""The switch, what moe-vllm leaves on vLLM's path (and says so), its errors, and the vLLM version guard
(README: "What stays on vLLM's path")."""

from __future__ import annotations

import logging

import pytest
import torch
import vllm_setup

from moe_vllm import binding, choices, plugin, versions


def _messages(records, level=None):
    return [r.getMessage() for r in records if level is None or r.levelno == level]


def test_the_switch_reads_additional_config_before_the_environment(monkeypatch):
    monkeypatch.setenv("MOE_VLLM_BACKEND", "triton")
    assert choices.requested({}) == choices.Request("triton", "MOE_VLLM_BACKEND")
    assert choices.requested({"moe_vllm_backend": "AUTO"}) == choices.Request(
        "auto", "additional_config['moe_vllm_backend']"
    )
    assert choices.requested({"moe_vllm_backend": "off"}) is None  # the configuration turns it off for this engine
    for off in ("", "off", "none", "0"):
        monkeypatch.setenv("MOE_VLLM_BACKEND", off)
        assert choices.requested({}) is None
    monkeypatch.delenv("MOE_VLLM_BACKEND")
    assert choices.requested({}) is None
    assert "torch" in choices.backends()


def test_other_vllm_versions_are_left_alone_with_one_log_line(monkeypatch, moe_log):
    from vllm.model_executor.custom_op import op_registry_oot

    assert versions.refusal("0.33.0") is None
    message = versions.refusal("0.34.0")
    assert "tested against vllm 0.33.0 only; vllm 0.34.0 is installed" in message
    assert "stays on vLLM's own path" in message
    before = dict(op_registry_oot)
    monkeypatch.setattr(versions, "installed", lambda: "0.34.0")
    monkeypatch.setattr(plugin, "_registered", False)
    plugin.register()  # must not raise: vLLM calls general plugins without catching
    assert dict(op_registry_oot) == before
    assert _messages(moe_log, logging.WARNING) == [f"moe-vllm: {message}"]


def test_a_method_another_plugin_replaced_is_left_to_it(monkeypatch, moe_log):
    from vllm.model_executor.custom_op import op_registry_oot

    class Theirs:
        pass

    monkeypatch.setitem(op_registry_oot, "UnquantizedFusedMoEMethod", Theirs)
    monkeypatch.setattr(plugin, "_registered", False)
    plugin.register()
    assert op_registry_oot["UnquantizedFusedMoEMethod"] is Theirs
    (line,) = _messages(moe_log, logging.WARNING)
    assert "already replaced by" in line and "Theirs" in line and "registers nothing" in line


@pytest.mark.usefixtures("vllm_with_moe")
def test_auto_leaves_a_layer_moe_cannot_express_on_vllms_path_and_says_why(torch_calls, moe_log):
    """A SiLU clamped at swiglu_limit (no gpt-oss alpha) has no moe activation: under ``auto`` the layer keeps
    vLLM's path (here vLLM's CPU processing, which fails on this wheel: the proof that it is vLLM's code)."""
    cfg = vllm_setup.config("auto")
    layer = vllm_setup.fused_moe(cfg, 4, 32, 64, 2, torch.float32, swiglu_limit=7.0, layer_id=10)
    (line,) = _messages(moe_log, logging.INFO)
    assert line == (
        "moe-vllm: MoE layer model.layers.10.mlp.experts stays on vLLM's own path "
        "(additional_config['moe_vllm_backend']=auto): its silu activation is clamped or scaled "
        "(swiglu_limit=7.0, swiglu_alpha=None), which moe has no activation for."
    )
    method = layer.routed_experts.quant_method
    assert method.moe_binding.declined and getattr(layer.routed_experts, binding.ATTR) is method.moe_binding
    with pytest.raises(AttributeError, match="prepack_moe_weight"):
        vllm_setup.fill(layer, {})
    assert torch_calls == []


@pytest.mark.usefixtures("vllm_with_moe")
def test_a_named_backend_logs_its_fallback_as_a_warning(moe_log):
    cfg = vllm_setup.config("torch")
    vllm_setup.fused_moe(cfg, 4, 32, 64, 2, torch.float32, activation="gelu_tanh", layer_id=11)
    (line,) = _messages(moe_log, logging.WARNING)
    assert "MoE layer model.layers.11.mlp.experts stays on vLLM's own path" in line
    assert "its activation 'gelu_tanh' is not one of moe's" in line


@pytest.mark.usefixtures("vllm_with_moe")
def test_a_named_backend_that_is_not_installed_fails_at_layer_construction():
    from moe_core.errors import BackendNotInstalledError

    cfg = vllm_setup.config("triton")
    with pytest.raises(BackendNotInstalledError) as raised:
        vllm_setup.fused_moe(cfg, 4, 32, 64, 2, torch.float32, layer_id=12)
    message = str(raised.value)
    assert message.startswith("moe-vllm (additional_config['moe_vllm_backend']=triton), MoE layer model.layers.12")
    assert "moe-triton" in message


@pytest.mark.usefixtures("vllm_with_moe")
@pytest.mark.parametrize(
    "attribute, reason",
    [
        ("use_all2all_kernels", "its all-to-all backend"),
        ("enable_eplb", "EPLB moves experts between ranks"),
    ],
)
def test_all_to_all_and_eplb_deployments_stay_on_vllms_path(monkeypatch, moe_log, attribute, reason):
    from vllm.model_executor.layers.fused_moe.config import FusedMoEParallelConfig

    layer = vllm_setup.fused_moe(vllm_setup.config(None), 4, 32, 64, 2, torch.float32, layer_id=13)
    experts = layer.routed_experts
    assert experts.quant_method.moe_binding is None  # switch off: nothing planned
    if attribute == "use_all2all_kernels":
        monkeypatch.setattr(FusedMoEParallelConfig, attribute, property(lambda self: True))
    else:
        monkeypatch.setattr(experts.moe_config.moe_parallel_config, attribute, True)
    planned = binding.plan(experts, choices.Request("auto", "test"))
    assert not planned.served and planned.declined.startswith(reason)
    assert reason in _messages(moe_log, logging.INFO)[0]


@pytest.mark.usefixtures("vllm_with_moe")
def test_a_layer_vllm_padded_for_its_own_kernel_stays_on_vllms_path(monkeypatch, moe_log):
    layer = vllm_setup.fused_moe(vllm_setup.config(None), 4, 32, 64, 2, torch.float32, layer_id=14)
    experts = layer.routed_experts
    monkeypatch.setattr(experts.moe_config, "intermediate_size_per_partition_unpadded", 60)
    planned = binding.plan(experts, choices.Request("auto", "test"))
    assert planned.declined == (
        "vLLM padded its sizes for its own kernel (H=32->32, I=60->64), and the padding is not part of the checkpoint"
    )
