"""Run a test function in a fresh interpreter with triton interpreted on the CPU, and return its JSON result.

``TRITON_INTERPRET`` must be set before triton itself is imported (triton's own ``tl`` helpers are
``@triton.jit`` functions), which the test process may already have done (inductor imports triton), and
setting it for the whole session would make ``auto`` pick triton in every other test.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from moe_core.filters import ALLOW_VAR, BLOCK_VAR, STRICT_VAR


def run_with_triton(module: str, function: str, cache_dir: Path):
    """``module.function()`` (a test module of this folder) in a fresh interpreter; skips without triton."""
    for name, why in (("triton", "triton is not installed"), ("moe_triton", "moe-triton is not installed")):
        if importlib.util.find_spec(name) is None:
            pytest.skip(f"{why} (pip install -e plugins/triton-moe)")
    env = {k: v for k, v in os.environ.items() if k not in (ALLOW_VAR, BLOCK_VAR, STRICT_VAR)}
    env["MOE_CACHE_DIR"] = str(cache_dir)  # no user-tuned tiles
    if not torch.cuda.is_available():
        env["TRITON_INTERPRET"] = "1"  # Triton's CPU interpreter: fp32, toy shapes
    code = (
        f"import json, sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import {module}; "
        f"print(json.dumps({module}.{function}()))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])
