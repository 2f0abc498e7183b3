"""Listing finds cutlass_fp4 without importing it; loading it (``--check``) still imports no flashinfer."""

from __future__ import annotations

import json
import subprocess
import sys

from moe_core.plugins import PluginRegistry

PROBE = r"""
import contextlib, io, json, sys
from moe_core.cli import main
out = io.StringIO()
with contextlib.redirect_stdout(out):
    main(["backends", *sys.argv[1:], "--json"])
row = next(r for r in json.loads(out.getvalue()) if r["name"] == "cutlass_fp4")
mods = [m for m in sys.modules if m.split(".")[0] in ("flashinfer", "moe_cutlass_fp4")]
print(json.dumps([row, sorted(mods)]))
"""


def backends(*flags):
    proc = subprocess.run([sys.executable, "-c", PROBE, *flags], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


def test_listed_from_metadata_alone():
    row, modules = backends()
    assert (row["distribution"], row["status"], row["entry_point"]) == (
        "moe-cutlass-fp4",
        "discovered",
        "moe_cutlass_fp4.plugin",
    )
    assert modules == []


def test_check_loads_the_plugin_not_flashinfer():
    row, modules = backends("--check")
    assert row["status"] == "unavailable"  # no CUDA here; on a GPU without the opt-in: the fc2 scale reason
    assert "CUDA" in row["reason"] or "MOE_CUTLASS_FP4_FC2_INPUT_SCALE" in row["reason"] or "SM" in row["reason"]
    assert "moe_cutlass_fp4.plugin" in modules and not any(m.startswith("flashinfer") for m in modules)


def test_loads_through_pluggy():
    registry = PluginRegistry()
    result = registry.load(next(e for e in registry.entries() if e.name == "cutlass_fp4"), strict=True)
    assert [op.name for op in result.fused_ops] == ["cutlass_fp4"]
