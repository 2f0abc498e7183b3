"""torch_grouped against moe-core's conformance suite.

Every case comes from ``moe_core.testing.conformance``: the same cases and
tolerances every first-party backend is held to. Cases outside what the backend
declares (quantized schemes, gelu, biases, ...) are skipped with its reason.
"""

from __future__ import annotations

import pytest
import torch

from moe_core import MoeConfig, MoeProblem
from moe_core.testing.conformance import BackendConformance
from moe_torch_grouped.fused_op import GROUPED_MM, LOOP, PATH_VAR, TorchGroupedFusedOp


class TestTorchGrouped(BackendConformance):
    """The path this machine takes by default (CPU: the per-expert loop)."""

    backend = "torch_grouped"

    @pytest.fixture(autouse=True)
    def _default_path(self, monkeypatch):
        monkeypatch.delenv(PATH_VAR, raising=False)


class TestTorchGroupedForcedGroupedMm(BackendConformance):
    """The ``torch._grouped_mm`` code path, forced, on CPU (torch >= 2.9 implements it there).

    On a CPU-only machine this is the only way to run the code the GPU path
    runs; if this torch has no CPU ``_grouped_mm`` every case skips with that
    reason (the support check fails closed).
    """

    backend = "torch_grouped"
    device = "cpu"

    @pytest.fixture(autouse=True)
    def _forced_path(self, monkeypatch):
        monkeypatch.setenv(PATH_VAR, GROUPED_MM)


def test_support_check_names_the_path(monkeypatch):
    monkeypatch.delenv(PATH_VAR, raising=False)
    cfg = MoeConfig(8, 2, 256, 128, quant_scheme="bf16", dtype=torch.bfloat16)
    support = TorchGroupedFusedOp.check(MoeProblem(cfg, "cpu"))
    assert support.ok and f"path {LOOP}" in support.reason
    machine = TorchGroupedFusedOp.available()
    assert machine.ok and "path " in machine.reason
    if not torch.cuda.is_available():
        assert f"path {LOOP}" in machine.reason and "no CUDA device" in machine.reason
    monkeypatch.setenv(PATH_VAR, "sideways")
    refused = TorchGroupedFusedOp.check(MoeProblem(cfg, "cpu"))
    assert not refused.ok and PATH_VAR in refused.reason
