"""``MoeLayer``'s CUDA graphs (``moe_core.graphs``): when a forward is replayed, when it stays eager, and that a
replay computes what the eager forward computes.

A sync-free dense backend (``dense_op.DenseOp``) stands in for a GPU kernel
family: the torch reference reads expert counts on the host and is not capturable.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from dense_op import DenseOp
from test_layer import LinearRouter, make_config, make_shared

from moe_core import MoeLayer
from moe_core.errors import InvalidInputError
from moe_core.graphs import MAX_GRAPHS
from moe_core.synthetic import random_weights


def on_gpu(test):
    return pytest.mark.gpu(
        pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")(test)
    )


class SyncingRouter(LinearRouter):
    """A router that reads a value on the host: its forward cannot be captured."""

    def forward(self, x):
        ids, weights = super().forward(x)
        if float(weights.sum()) < 0:  # a host synchronisation
            raise AssertionError
        return ids, weights


def layers(device, router_cls=LinearRouter, shared=True, **kw):
    """The same block twice: with graphs (``kw``) and with every forward eager."""
    config = make_config(e=4, h=32, i=16)
    weights = random_weights(config, device=device, seed=3)
    router = router_cls(config).to(device)
    s = make_shared(gated=True, h=32, i_s=8) if shared else None
    if s is not None:
        s = type(s)(s.w13.to(device), s.w2.to(device), gate=s.gate.to(device))
    built = [
        MoeLayer(config, weights, router, shared=s, backend=DenseOp, **k) for k in (kw, {"cuda_graph_max_tokens": 0})
    ]
    return built[0], built[1]


def x_of(m: int, device, seed: int) -> torch.Tensor:
    return torch.randn(m, 32, generator=torch.Generator().manual_seed(seed)).to(device)


# --- everywhere -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [-1, 1.5, True, "256"])
def test_limit_must_be_a_non_negative_int(bad):
    config = make_config(e=4, h=32, i=16)
    with pytest.raises(InvalidInputError, match="cuda_graph_max_tokens"):
        MoeLayer(config, random_weights(config), LinearRouter(config), backend=DenseOp, cuda_graph_max_tokens=bad)


def test_torch_backend_is_not_captured():
    config = make_config(e=4, h=32, i=16)
    layer = MoeLayer(config, random_weights(config), LinearRouter(config), backend="torch")
    assert "torch" in layer.graphs.disabled and "capturable" in layer.graphs.disabled


def test_cpu_forwards_stay_eager():
    graphed, eager = layers("cpu")
    with torch.no_grad():
        for seed in range(3):
            torch.testing.assert_close(graphed(x_of(2, "cpu", seed)), eager(x_of(2, "cpu", seed)))
    assert graphed.graphs.graphs == {} and graphed.graphs.disabled is None


# --- on a GPU ---------------------------------------------------------------------------------------------------


@on_gpu
@pytest.mark.parametrize("m", [1, 3, 64])
@pytest.mark.parametrize("shared", [True, False])
def test_replay_matches_eager(m, shared):
    graphed, eager = layers("cuda", shared=shared)
    with torch.no_grad():
        for seed in range(4):  # eager, capture + replay, replay, replay: a new input every time
            x = x_of(m, "cuda", seed)
            torch.testing.assert_close(graphed(x), eager(x), rtol=1e-5, atol=1e-6)
    assert list(graphed.graphs.graphs) == [m]


@on_gpu
@pytest.mark.parametrize("case", ["too_many_tokens", "grad", "limit_zero"])
def test_eager_when_a_graph_does_not_apply(case):
    graphed, eager = layers("cuda", cuda_graph_max_tokens=0 if case == "limit_zero" else 8)
    m = 9 if case == "too_many_tokens" else 2
    context = torch.enable_grad() if case == "grad" else torch.no_grad()  # the router's weight requires grad
    with context:
        for seed in range(3):
            out = graphed(x_of(m, "cuda", seed))
            torch.testing.assert_close(out.detach(), eager(x_of(m, "cuda", seed)).detach())
    assert graphed.graphs.graphs == {}


@on_gpu
def test_failed_capture_warns_once_and_stays_eager():
    graphed, eager = layers("cuda", router_cls=SyncingRouter)
    with torch.no_grad():
        graphed(x_of(2, "cuda", 0))
        with pytest.warns(RuntimeWarning, match="capturing a CUDA graph of 2 token"):
            out = graphed(x_of(2, "cuda", 1))
        torch.testing.assert_close(out, eager(x_of(2, "cuda", 1)))
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            for seed in range(2, 4):
                torch.testing.assert_close(graphed(x_of(2, "cuda", seed)), eager(x_of(2, "cuda", seed)))
    assert graphed.graphs.graphs == {} and "failed" in graphed.graphs.disabled
    # the device is fine afterwards: another layer captures
    other, _ = layers("cuda")
    with torch.no_grad():
        for seed in range(3):
            other(x_of(2, "cuda", seed))
    assert list(other.graphs.graphs) == [2]


@on_gpu
def test_replaced_parameter_drops_the_graphs():
    graphed, eager = layers("cuda")
    with torch.no_grad():
        for seed in range(3):
            graphed(x_of(2, "cuda", seed))
        assert list(graphed.graphs.graphs) == [2]
        new = torch.randn_like(graphed.router.gate.weight)
        graphed.router.gate.weight = torch.nn.Parameter(new)  # replaced, not updated in place
        eager.router.gate.weight.copy_(new)
        torch.testing.assert_close(graphed(x_of(2, "cuda", 5)), eager(x_of(2, "cuda", 5)))
        assert graphed.graphs.graphs == {}
        in_place = torch.randn_like(new)
        for seed in range(6, 9):  # updated in place: graphs again, reading the new values
            graphed.router.gate.weight.copy_(in_place)
            eager.router.gate.weight.copy_(in_place)
            torch.testing.assert_close(
                graphed(x_of(2, "cuda", seed)), eager(x_of(2, "cuda", seed)), rtol=1e-5, atol=1e-6
            )
            in_place = torch.randn_like(new)
        assert list(graphed.graphs.graphs) == [2]


@on_gpu
def test_graph_outlives_the_shared_buffers_it_read():
    """A forward past the shared experts' reserved rows reallocates them; an earlier graph keeps the old ones."""
    graphed, eager = layers("cuda", cuda_graph_max_tokens=1024)
    with torch.no_grad():
        for seed in range(2):
            graphed(x_of(2, "cuda", seed))
        before = graphed._shared_ids
        graphed(x_of(300, "cuda", 9))  # > INITIAL_TOKENS: new buffers
        assert graphed._shared_ids is not before
        del before
        torch.cuda.empty_cache()
        torch.empty(1 << 20, device="cuda").fill_(7)  # reuse freed memory if the old buffers were freed
        torch.testing.assert_close(graphed(x_of(2, "cuda", 3)), eager(x_of(2, "cuda", 3)), rtol=1e-5, atol=1e-6)


@on_gpu
def test_inside_a_callers_graph_the_layer_is_captured_plainly():
    graphed, eager = layers("cuda")
    with torch.no_grad():
        for seed in range(2):  # graphed has a graph of 2 tokens by now
            graphed(x_of(2, "cuda", seed))
        static_x = x_of(2, "cuda", 0)
        outer = torch.cuda.CUDAGraph()
        with torch.cuda.graph(outer):
            static_out = graphed(static_x)
        for seed in range(3, 5):
            static_x.copy_(x_of(2, "cuda", seed))
            outer.replay()
            torch.testing.assert_close(static_out, eager(x_of(2, "cuda", seed)), rtol=1e-5, atol=1e-6)


@on_gpu
def test_at_most_max_graphs_token_counts():
    graphed, _ = layers("cuda", shared=False)
    with torch.no_grad():
        for m in range(1, MAX_GRAPHS + 3):
            for seed in range(2):
                graphed(x_of(m, "cuda", seed))
    assert len(graphed.graphs.graphs) == MAX_GRAPHS


@on_gpu
@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_a_compiled_layer_replays_its_graphs(mode, tmp_path, monkeypatch):
    """Under ``torch.compile`` the layer is one op (``moe::layer``) that runs as eager code does: its own graphs
    in default mode; inside the caller's graphs (``reduce-overhead``) captured plainly. Both equal eager."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    torch._dynamo.reset()
    graphed, eager = layers("cuda")
    compiled = torch.compile(graphed, mode=mode, fullgraph=True, dynamic=False)
    with torch.no_grad():
        for seed in range(5):
            got = compiled(x_of(2, "cuda", seed)).clone()
            torch.testing.assert_close(got, eager(x_of(2, "cuda", seed)), rtol=1e-5, atol=1e-6)
    if mode == "default":
        assert set(graphed.graphs.graphs) == {2}
    torch._dynamo.reset()
