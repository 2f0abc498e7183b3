"""The seed scenario, SGLang without moe-sglang, each in fresh interpreters (subprocesses), so no state of this
pytest process (plugins loaded, hooks applied, the runtime context) reaches them."""

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
    env.pop("SGLANG_PLUGINS", None)
    if plugins is not None:
        env["SGLANG_PLUGINS"] = plugins  # SGLang's own allow-list of general plugins by entry-point name
    proc = subprocess.run(
        [sys.executable, SCENARIO, *args], capture_output=True, text=True, env=env, timeout=300, check=False
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"scenario {args} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return json.loads(lines[-1][len("RESULT ") :])


@pytest.mark.parametrize("order", ["plugins-first", "moe-first", "sglang-first"])
def test_seed_scenario_fails_only_with_the_support_reason(order):
    """Pure TP, ``--moe-runner-backend moe:flashinfer_mxfp4``, moe-flashinfer-mxfp4 installed, a CPU: the argument
    parses, and the gpt-oss layer fails at construction with moe's support reason (no CUDA device), never with
    "not registered" or ``NotImplementedError``."""
    result = run("seed", order)
    assert result["parsed"] == "moe:flashinfer_mxfp4"
    raised = result["raised"]
    assert raised["type"] == "BackendUnavailableError" and raised["module"] == "moe_core.errors", raised
    message = raised["message"]
    assert "--moe-runner-backend moe:flashinfer_mxfp4, MoE layer 0" in message
    assert "flashinfer_mxfp4" in message and "need a CUDA GPU" in message, message
    assert "not registered" not in message and "NotImplementedError" not in message


def test_stock_sglang_seed_raises_not_implemented():
    """The "before": SGLang's own flashinfer_mxfp4 on this CPU (moe-sglang installed but not involved)."""
    raised = run("stock-seed")["raised"]
    assert raised["type"] == "NotImplementedError"
    assert "requires SM90, SM100, or SM120" in raised["message"]


def test_sglang_without_moe_sglang_is_unchanged():
    """SGLang with moe-sglang left out (SGLANG_PLUGINS names another plugin) and with it loaded: the same SGLang
    choices before ours, no method wrapped without it, and the same forward of a layer under SGLang's own
    ``auto`` (moe-sglang's hooks pass it to SGLang's code unchanged)."""
    without = run("stock", plugins="not-moe")
    loaded = run("stock")
    assert not without["wrapped"] and loaded["wrapped"]
    assert not any(c == "moe" or c.startswith("moe:") for c in without["choices"])
    ours = [c for c in loaded["choices"] if c not in without["choices"]]
    assert loaded["choices"] == without["choices"] + ours
    assert ours[0] == "moe" and "moe:torch" in ours and "moe:flashinfer_mxfp4" in ours
    assert without["runner_backend"] == loaded["runner_backend"] == "triton"
    assert without["forward_equal"] and loaded["forward_equal"]
    assert without["out"] == loaded["out"]
