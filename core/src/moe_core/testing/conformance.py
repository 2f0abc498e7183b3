"""The conformance suite as a pytest base class.

A backend's test module subclasses ``BackendConformance`` and names its
backend; pytest then collects every case (``moe_core.testing.cases``) under
it, exactly like pandas' ``tests/extension/base`` serves third-party array
types::

    from moe_core.testing.conformance import BackendConformance

    class TestMyBackend(BackendConformance):
        backend = "my_backend"
        # optional: device = "cuda", hidden_size = 512, intermediate_size = 256

Cases the backend's support check declines are skipped with its reason; a
case it accepts and gets wrong fails.
"""

from __future__ import annotations

from typing import ClassVar

import pytest

from moe_core.testing.cases import FAILED, SKIPPED, Case, Conformance, cases_of


def _param(kind: str):
    return pytest.mark.parametrize("case", cases_of(kind), ids=lambda c: c.id)


class BackendConformance:
    #: runner backend name (or ``distribution:name``) under test
    backend: ClassVar[str]
    #: device to test on; None = CUDA when available, else CPU
    device: ClassVar[str | None] = None
    num_experts: ClassVar[int] = 8
    top_k: ClassVar[int] = 2
    hidden_size: ClassVar[int] = 256
    intermediate_size: ClassVar[int] = 128
    large_tokens: ClassVar[int] = 259

    @pytest.fixture(scope="class")
    @classmethod
    def conformance(cls) -> Conformance:
        return Conformance(
            cls.backend,
            cls.device,
            num_experts=cls.num_experts,
            top_k=cls.top_k,
            hidden_size=cls.hidden_size,
            intermediate_size=cls.intermediate_size,
            large_tokens=cls.large_tokens,
        )

    def check_case(self, conformance: Conformance, case: Case) -> None:
        result = conformance.run(case)
        if result.status == SKIPPED:
            pytest.skip(result.reason)
        if result.status == FAILED:
            pytest.fail(f"{case.kind}[{case.id}]: {result.reason}", pytrace=False)

    @_param("reference")
    def test_reference(self, conformance, case):
        """Each scheme x activation dtype x activation agrees with the float64 oracle."""
        self.check_case(conformance, case)

    @_param("bias")
    def test_bias(self, conformance, case):
        """Expert biases b13/b2, with every activation."""
        self.check_case(conformance, case)

    @_param("expert_ids")
    def test_expert_ids(self, conformance, case):
        """Id -1 contributes zero; other ids outside [0, E) raise or contribute zero, never read memory."""
        self.check_case(conformance, case)

    @_param("router_weight_on_input")
    def test_router_weight_on_input(self, conformance, case):
        """Llama 4 style: the routing weight scales the expert input."""
        self.check_case(conformance, case)

    @_param("shapes")
    def test_shapes(self, conformance, case):
        """M = 0, M = 1, M beyond a tile, experts with no tokens, zero routing weights."""
        self.check_case(conformance, case)

    @_param("out_buffer")
    def test_out_buffer(self, conformance, case):
        """``out=`` is written in full and returned."""
        self.check_case(conformance, case)

    @_param("deterministic")
    def test_deterministic(self, conformance, case):
        """Two calls on the same input are bitwise equal."""
        self.check_case(conformance, case)

    @_param("non_contiguous")
    def test_non_contiguous(self, conformance, case):
        """Strided hidden_states and topk_ids give the right answer."""
        self.check_case(conformance, case)

    @_param("bad_input")
    def test_bad_input(self, conformance, case):
        """Bad input raises InvalidInputError, never returns garbage."""
        self.check_case(conformance, case)

    @_param("router")
    def test_router(self, conformance, case):
        """The backend's fused router (``FusedOp.router``), where it offers one, chooses what the bundle does."""
        self.check_case(conformance, case)

    @_param("gated_router")
    def test_gated_router(self, conformance, case):
        """The backend's gate-and-route kernel (``FusedOp.gated_router``), where it offers one, chooses what the
        bundle does on ``F.linear``'s logits."""
        self.check_case(conformance, case)
