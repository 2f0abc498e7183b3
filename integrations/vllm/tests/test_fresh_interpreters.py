"""vLLM with moe-vllm in fresh interpreters (subprocesses), so no state of this pytest process (plugins loaded,
the out-of-tree registry, vLLM's configuration) reaches them: several import orders, a layer built before the
plugin loaded, and vLLM without the plugin or with the switch off."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCENARIO = str(Path(__file__).parent / "scenario.py")


def run(*args: str, plugins: str | None = None) -> dict:
    env = dict(os.environ)
    env.pop("VLLM_PLUGINS", None)
    env.pop("MOE_VLLM_BACKEND", None)
    if plugins is not None:
        env["VLLM_PLUGINS"] = plugins  # vLLM's own allow-list of general plugins by entry-point name
    proc = subprocess.run(
        [sys.executable, SCENARIO, *args], capture_output=True, text=True, env=env, timeout=300, check=False
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"scenario {args} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return json.loads(lines[-1][len("RESULT ") :])


@pytest.mark.parametrize("order", ["plugins-first", "moe-first", "vllm-first"])
def test_a_layer_built_after_the_plugin_loaded_runs_through_moe_in_any_import_order(order):
    result = run("layer", order)
    assert result == {"method": "MoeUnquantizedFusedMoEMethod", "backend": "torch", "within_tolerance": True}


def test_a_layer_built_before_the_plugin_loaded_keeps_vllms_method():
    assert run("built-before") == {"before": "UnquantizedFusedMoEMethod", "after": "MoeUnquantizedFusedMoEMethod"}


def test_vllm_without_moe_vllm_or_with_the_switch_off_is_untouched():
    """The "before": vLLM's own unquantized path on this CPU (the index's CUDA wheel has no CPU kernels) fails in
    its weight processing. Without the plugin (VLLM_PLUGINS names another), even with the switch set, and with the
    plugin loaded but the switch left out, vLLM picks the same backend, keeps its op name and fails the same way;
    only the switch makes the layer run through moe."""
    without = run("stock", "auto", plugins="not-moe")
    off = run("stock", "-")
    on = run("stock", "auto")
    assert without["method"] == "UnquantizedFusedMoEMethod" and off["method"] == "MoeUnquantizedFusedMoEMethod"
    assert without["raised"] and "prepack_moe_weight" in without["raised"]
    assert off["raised"] == without["raised"]
    assert off["op_name"] == without["op_name"] == "unquantized_fused_moe"
    assert off["vllm_backend"] == without["vllm_backend"] == "CPU"
    assert not without["bound"] and not off["bound"]
    assert on["raised"] is None and on["bound"]
