"""Row-order helpers and metadata-based requirement checks."""

from __future__ import annotations

import pytest
import torch

from moe_core.layout import swap_gate_up
from moe_core.requirements import distribution_version, require_distribution


def test_swap_gate_up_elementwise():
    t = torch.arange(2 * 6 * 3).reshape(2, 6, 3)
    s = swap_gate_up(t)
    for e in range(2):
        for r in range(6):
            assert torch.equal(s[e, r], t[e, (r + 3) % 6])
    assert torch.equal(swap_gate_up(s), t)


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
