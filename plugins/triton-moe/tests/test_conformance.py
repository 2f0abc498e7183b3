"""The triton backend through moe-core's conformance suite.

On CPU (Triton interpreter) bf16 and fp8_block cases skip with the support
check's reason; on a GPU every declared case runs.
"""

from moe_core.testing.conformance import BackendConformance


class TestTritonBackend(BackendConformance):
    backend = "triton"
