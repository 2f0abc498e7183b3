"""Counting a fused op's forwards in a test: proof that a layer an engine built really ran through moe.

An integration's tests (moe-sglang, moe-vllm) compare the engine's layer with moe's reference; equal numbers
alone do not show which code computed them, so they also count the forwards of the backend they asked for.
"""

from __future__ import annotations


def count_forwards(monkeypatch, op_class=None) -> list[str]:
    """Patch ``op_class.apply`` (default: core's torch backend) through pytest's ``monkeypatch`` so that each
    forward appends its quant scheme to the returned list; patched on the class, so runners bound afterwards
    count too, and undone with the test."""
    if op_class is None:
        from moe_core.backends.torch.fused_op import TorchFusedOp as op_class

    calls: list[str] = []
    original = op_class.apply

    def counted(self, *args, **kwargs):
        calls.append(self.config.quant_scheme)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(op_class, "apply", counted)
    return calls
