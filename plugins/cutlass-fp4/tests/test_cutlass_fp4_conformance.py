"""moe-core's conformance suite for ``cutlass_fp4`` (skips with the support reason wherever it cannot run)."""

from __future__ import annotations

from moe_core.testing.conformance import BackendConformance


class TestCutlassFp4(BackendConformance):
    backend = "cutlass_fp4"
