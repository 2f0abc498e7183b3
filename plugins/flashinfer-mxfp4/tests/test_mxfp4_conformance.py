"""moe-core's conformance suite for ``flashinfer_mxfp4``.

On a machine without a supported GPU every case skips with the backend's
support reason; on an H200 (SM90) or B200 (SM100) with flashinfer installed
the mxfp4/bf16 cases run against the float64 oracle (see tools/gpu_check.sh).
"""

from __future__ import annotations

from moe_core.testing.conformance import BackendConformance


class TestFlashInferMxfp4(BackendConformance):
    backend = "flashinfer_mxfp4"
