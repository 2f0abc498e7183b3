"""Found through its entry point without importing it; loading it imports no flashinfer."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import torch

from moe_core.plugins import PluginRegistry


def fresh(code: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MOE_")}
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env, timeout=300
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


IMPORTED = "sorted(m for m in sys.modules if m.split('.')[0] in ('flashinfer', 'moe_flashinfer_mxfp4'))"


def test_entry_point_is_declared():
    entries = {e.name: e for e in PluginRegistry().entries()}
    entry = entries["flashinfer_mxfp4"]
    assert entry.distribution == "moe-flashinfer-mxfp4"
    assert entry.value == "moe_flashinfer_mxfp4.plugin"


def test_moe_backends_lists_it_without_importing_it_or_flashinfer():
    proc = fresh(
        f"""
        import io, contextlib, json, sys
        from moe_core.cli import main
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            code = main(["backends", "--json"])
        rows = {{r["name"]: r for r in json.loads(buf.getvalue())}}
        print(json.dumps({{"code": code, "row": rows["flashinfer_mxfp4"], "imported": {IMPORTED}}}))
        """
    )
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["code"] == 0
    assert result["row"]["status"] == "discovered"
    assert result["row"]["distribution"] == "moe-flashinfer-mxfp4"
    assert result["imported"] == []


def test_backends_check_loads_the_plugin_but_not_flashinfer():
    proc = fresh(
        f"""
        import io, contextlib, json, sys
        from moe_core.cli import main
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            main(["backends", "--check", "--json"])
        rows = {{r["name"]: r for r in json.loads(buf.getvalue())}}
        print(json.dumps({{"row": rows["flashinfer_mxfp4"], "imported": {IMPORTED}}}))
        """
    )
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    row = result["row"]
    if not torch.cuda.is_available():
        assert row["status"] == "unavailable" and "CUDA" in row["reason"]
    assert row["priority"] == 100 and row["a2a_backends"] == ["none"]
    assert "flashinfer" not in result["imported"], result["imported"]
    assert "moe_flashinfer_mxfp4.plugin" in result["imported"]


def test_plugin_registers_with_pluggy_and_api_version():
    registry = PluginRegistry()
    entry = next(e for e in registry.entries() if e.name == "flashinfer_mxfp4")
    result = registry.load(entry, strict=True)
    assert result.ok
    (op,) = result.fused_ops
    assert op.name == "flashinfer_mxfp4" and op.a2a_backends == ("none",)
