"""Fixtures: a pretend CUDA device of a chosen compute capability; no JIT source generation in tests.

Helpers shared by the test modules live in ``mxfp4_testing`` (a uniquely named module, so these tests
can run in one pytest session with other packages' tests).
"""

from __future__ import annotations

import pytest
import torch

from moe_core.filters import ALLOW_VAR, BLOCK_VAR, STRICT_VAR


@pytest.fixture(autouse=True)
def _clean_plugin_env(monkeypatch):
    for var in (ALLOW_VAR, BLOCK_VAR, STRICT_VAR):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture
def fake_gpu(monkeypatch):
    """``fake_gpu((9, 0))``: torch.cuda reports one device of that capability (no tensor can go there)."""

    def install(cap: tuple[int, int], count: int = 1):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: cap)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)

    return install


@pytest.fixture(autouse=True)
def _no_jit_spec_generation(request, monkeypatch):
    """Binding on a pretend GPU must not make FlashInfer generate JIT sources into ~/.cache (the notice does)."""
    if request.node.get_closest_marker("engine_choice"):
        return
    monkeypatch.setattr("moe_flashinfer_mxfp4.warmup.cold_build_notice", lambda fi, path, engine=None: None)


@pytest.fixture(autouse=True)
def _full_module_engine(request, monkeypatch):
    """Bind with FlashInfer's full module, built, and let the support check expect it (no flashinfer import, no
    dependence on this machine's FlashInfer cache), unless a test is about the choice (marker ``engine_choice``)."""
    if request.node.get_closest_marker("engine_choice"):
        return
    from moe_flashinfer_mxfp4 import sm90_engine

    built = sm90_engine.Engine(sm90_engine.FULL, True, "test")
    monkeypatch.setattr(sm90_engine, "choose", lambda fi: built)
    monkeypatch.setattr(sm90_engine, "expected", lambda: built)


def pytest_configure(config):
    config.addinivalue_line("markers", "engine_choice: the test exercises the SM90 slim/full module choice itself")
