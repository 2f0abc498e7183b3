"""Fixtures: pretend GPUs, the fc2-input-scale opt-in (helpers: ``cutlass_fp4_testing``)."""

from __future__ import annotations

import pytest
import torch

from moe_core.filters import ALLOW_VAR, BLOCK_VAR, STRICT_VAR
from moe_cutlass_fp4 import requirements


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for var in (ALLOW_VAR, BLOCK_VAR, STRICT_VAR, requirements.FC2_SCALE_VAR):
        monkeypatch.delenv(var, raising=False)
    for var in requirements.four_over_six_switches():
        monkeypatch.delenv(var, raising=False)


@pytest.fixture
def gpu(monkeypatch):
    """``gpu(10, 0)``: torch.cuda claims one device of that capability."""

    def pretend(major: int, minor: int, count: int = 1):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (major, minor))

    return pretend


@pytest.fixture
def opt_in(monkeypatch):
    def set_scale(value="0.01"):
        monkeypatch.setenv(requirements.FC2_SCALE_VAR, value)
        return value

    return set_scale
