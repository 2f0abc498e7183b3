"""On a machine without CUDA the tests run under Triton's CPU interpreter.

``TRITON_INTERPRET`` must be set before any kernel module is imported (triton
reads it when a ``@triton.jit`` function is created); the plugin imports its
kernels only when a runner binds, so setting it here is early enough.

Every test sees an empty user table directory (``MOE_CACHE_DIR`` in its own
temporary folder), so a table tuned on the developer's machine cannot change
which tiles a test runs.
"""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (runs on the H200)")


@pytest.fixture(autouse=True)
def _no_user_tables(tmp_path_factory, monkeypatch):
    from moe_triton import kernel_configs  # imports neither triton nor the kernels

    monkeypatch.setenv("MOE_CACHE_DIR", str(tmp_path_factory.mktemp("moe-cache")))
    monkeypatch.delenv("MOE_TRITON_TABLE_DIR", raising=False)
    kernel_configs.clear_cache()
    yield
    kernel_configs.clear_cache()
