"""moe-core's conformance suite for ``flashinfer_mxfp4``.

On a machine without a supported GPU every case skips with the backend's
support reason; on an H200 (SM90) or B200 (SM100) with flashinfer installed
the mxfp4/bf16 cases run against the float64 oracle (``bash tools/gpu.sh flashinfer:conformance``).
"""

from __future__ import annotations

import pytest

from moe_core.testing.conformance import BackendConformance

#: the real SM90 module choice (slim or full, MOE_FLASHINFER_MXFP4_SM90_MODULE), not the unit tests' stand-in
pytestmark = pytest.mark.engine_choice


class TestFlashInferMxfp4(BackendConformance):
    backend = "flashinfer_mxfp4"
