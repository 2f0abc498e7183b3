import pytest
import torch

from moe_core.synthetic import balanced_routing, random_routing


@pytest.mark.parametrize("m,e,k", [(2048, 128, 8), (2048, 128, 4), (100, 8, 2), (37, 6, 4), (5, 3, 3)])
def test_balanced_routing_gives_distinct_experts_and_even_loads(m, e, k):
    """Every token gets ``k`` distinct experts in ``[0, E)``; every expert's pair count is within ``k`` of the
    mean, exactly the mean where it is whole; the weights are a softmax per token, as ``random_routing``'s."""
    ids, w = balanced_routing(m, e, k)
    assert ids.dtype == torch.int32 and ids.shape == (m, k) and w.dtype == torch.float32 and w.shape == (m, k)
    assert all(len(set(row)) == k for row in ids.tolist())
    assert int(ids.min()) >= 0 and int(ids.max()) < e
    counts = torch.bincount(ids.flatten().long(), minlength=e)
    assert int(counts.sum()) == m * k and int(counts.max() - counts.min()) <= k
    if m % e == 0:
        assert counts.unique().tolist() == [m * k // e]
    torch.testing.assert_close(w.sum(dim=1), torch.ones(m))


def test_random_routing_is_uneven_where_balanced_is_not():
    """The contrast the two exist for: at the same size uniform random routing leaves the loads uneven."""
    counts = torch.bincount(random_routing(2048, 128, 8)[0].flatten().long(), minlength=128)
    assert int(counts.max() - counts.min()) > 8


def test_balanced_routing_refuses_a_top_k_it_cannot_give():
    with pytest.raises(ValueError, match="top_k"):
        balanced_routing(4, 2, 3)
