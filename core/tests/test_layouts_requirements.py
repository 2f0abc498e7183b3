"""Row-order helpers and metadata-based requirement checks."""

from __future__ import annotations

import pytest
import torch

from moe_core.layouts import deinterleave_gate_up, interleave_gate_up, swap_gate_up
from moe_core.requirements import distribution_version, require_distribution


def test_swap_gate_up_elementwise():
    t = torch.arange(2 * 6 * 3).reshape(2, 6, 3)
    s = swap_gate_up(t)
    for e in range(2):
        for r in range(6):
            assert torch.equal(s[e, r], t[e, (r + 3) % 6])
    assert torch.equal(swap_gate_up(s), t)


def test_interleave_elementwise_and_inverse():
    t = torch.arange(2 * 8 * 3).reshape(2, 8, 3)
    il = interleave_gate_up(t)
    for e in range(2):
        for j in range(4):
            assert torch.equal(il[e, 2 * j], t[e, j]) and torch.equal(il[e, 2 * j + 1], t[e, 4 + j])
    assert torch.equal(deinterleave_gate_up(il), t)
    b = torch.arange(2 * 8).reshape(2, 8)  # biases [E, 2I]
    assert torch.equal(deinterleave_gate_up(interleave_gate_up(b)), b)


def test_odd_halves_rejected():
    with pytest.raises(ValueError, match="odd size"):
        swap_gate_up(torch.zeros(1, 5, 2))


def test_require_distribution():
    assert require_distribution("torch")
    assert distribution_version("torch") is not None
    missing = require_distribution("surely-not-installed-dist", ">=1.0", why="kernels")
    assert not missing and "pip install 'surely-not-installed-dist>=1.0'" in missing.reason
    too_new = require_distribution("torch", "<1.0")
    assert not too_new and "supports torch<1.0" in too_new.reason
