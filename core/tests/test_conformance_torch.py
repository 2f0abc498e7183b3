"""Core's own torch backend through the same conformance suite every plugin uses."""

from moe_core.testing.conformance import BackendConformance


class TestTorchBackend(BackendConformance):
    backend = "torch"
