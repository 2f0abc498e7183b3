"""Row-order helpers and metadata-based requirement checks."""

from __future__ import annotations

import pytest
import torch

from moe_core.layout import deinterleave_gate_up, swap_gate_up
from moe_core.requirements import distribution_version, require_distribution


def test_swap_gate_up_elementwise():
    t = torch.arange(2 * 6 * 3).reshape(2, 6, 3)
    s = swap_gate_up(t)
    for e in range(2):
        for r in range(6):
            assert torch.equal(s[e, r], t[e, (r + 3) % 6])
    assert torch.equal(swap_gate_up(s), t)


def test_deinterleave_gate_up_elementwise():
    t = torch.arange(2 * 6 * 3).reshape(2, 6, 3)
    for dim, rows in ((1, lambda x, r: x[:, r]), (2, lambda x, r: x[:, :, r])):
        u = t.transpose(1, 2).contiguous() if dim == 2 else t
        d = deinterleave_gate_up(u, dim)
        for r in range(3):  # gate row r was 2r, up row r was 2r + 1
            assert torch.equal(rows(d, r), rows(u, 2 * r)) and torch.equal(rows(d, 3 + r), rows(u, 2 * r + 1))


def test_odd_halves_rejected():
    with pytest.raises(ValueError, match="odd size"):
        swap_gate_up(torch.zeros(1, 5, 2))
    with pytest.raises(ValueError, match="odd size"):
        deinterleave_gate_up(torch.zeros(1, 5, 2))


def test_require_distribution():
    assert require_distribution("torch")
    assert distribution_version("torch") is not None
    missing = require_distribution("surely-not-installed-dist", ">=1.0", why="kernels")
    assert not missing and "pip install 'surely-not-installed-dist>=1.0'" in missing.reason
    too_new = require_distribution("torch", "<1.0")
    assert not too_new and "supports torch<1.0" in too_new.reason
