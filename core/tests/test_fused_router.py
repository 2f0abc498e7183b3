"""A backend's fused router (``FusedOp.router``, and ``FusedOp.gated_router`` with the gate GEMM): asked once by
``MoeLayer``, used per forward, checked at the door, and routed around when the plugin fails; ``SoftmaxTopK`` is
``softmax_topk`` as data."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from moe_core import MoeConfig, MoeLayer
from moe_core.backends.torch.fused_op import TorchFusedOp
from moe_core.errors import BackendError, InvalidInputError
from moe_core.integrations.transformers.router import HFRouter
from moe_core.routing import SoftmaxTopK, softmax_topk
from moe_core.synthetic import random_weights

E, K, H, INTER = 8, 2, 64, 32


def _config() -> MoeConfig:
    return MoeConfig(
        num_experts=E, top_k=K, hidden_size=H, intermediate_size=INTER, quant_scheme="fp32", dtype=torch.float32
    )


def _router(route=None) -> HFRouter:
    weight = torch.randn(E, H, generator=torch.Generator().manual_seed(3))
    return HFRouter(weight, None, route if route is not None else SoftmaxTopK(K))


def _x(m: int = 13) -> torch.Tensor:
    return torch.randn(m, H, generator=torch.Generator().manual_seed(4))


class CountingRouterOp(TorchFusedOp):
    """The torch reference with a "fused" router: ``routing`` itself, counted, weights flipped in order (a
    kernel may return the k experts in any order)."""

    name = "counting_router"
    calls: list = []

    def router(self, routing):
        if type(routing) is not SoftmaxTopK:
            return None

        def kernel(logits):
            type(self).calls.append(tuple(logits.shape))
            ids, weights = routing(logits)
            return ids.flip(1).contiguous(), weights.flip(1).contiguous()

        return kernel


class GatedRouterOp(CountingRouterOp):
    """``CountingRouterOp`` that also takes the gate: counts ``(M, E, has bias)`` per gated call."""

    name = "gated_router"
    gated_calls: list = []

    def gated_router(self, routing):
        def kernel(x, weight, bias):
            type(self).gated_calls.append((x.shape[0], weight.shape[0], bias is not None))
            return routing(F.linear(x, weight, bias))

        return kernel


class RaisingGateOp(CountingRouterOp):
    name = "raising_gate"

    def gated_router(self, routing):
        raise RuntimeError("no gate today")


class WrongGateOp(GatedRouterOp):
    name = "wrong_gate"

    def gated_router(self, routing):
        return lambda x, weight, bias: tuple(t[:-1] for t in routing(F.linear(x, weight, bias)))


class RaisingRouterOp(TorchFusedOp):
    name = "raising_router"

    def router(self, routing):
        raise RuntimeError("no router today")


class NotCallableRouterOp(TorchFusedOp):
    name = "not_callable_router"

    def router(self, routing):
        return 42


class WrongDtypeRouterOp(TorchFusedOp):
    name = "wrong_dtype_router"

    def router(self, routing):
        return lambda logits: tuple(t.to(torch.int64) for t in routing(logits))


class WrongShapeRouterOp(TorchFusedOp):
    name = "wrong_shape_router"

    def router(self, routing):
        return lambda logits: (routing(logits)[0][:, :1].contiguous(), routing(logits)[1])


def test_softmax_topk_bundle_is_the_function():
    logits = torch.randn(9, E, generator=torch.Generator().manual_seed(1))
    for renormalize in (True, False):
        ids, weights = SoftmaxTopK(3, renormalize)(logits)
        ref_ids, ref_weights = softmax_topk(logits, 3, renormalize)
        assert torch.equal(ids, ref_ids) and torch.equal(weights, ref_weights)
    for bad in (0, -1, 2.0, True):
        with pytest.raises(InvalidInputError, match="top_k"):
            SoftmaxTopK(bad)


def test_layer_routes_through_the_backends_kernel_and_matches_torch_routing():
    config, weights = _config(), random_weights(_config(), seed=2)
    CountingRouterOp.calls.clear()
    fused = MoeLayer(config, weights, _router(), backend=CountingRouterOp)
    plain = MoeLayer(config, weights, _router(), backend=CountingRouterOp, fused_routing=False)
    assert fused.fused_router is not None and fused.fused_router.backend == "counting_router"
    assert plain.fused_router is None
    assert "fused_router='counting_router'" in repr(fused)
    x = _x()
    out, ref = fused(x), plain(x)
    assert CountingRouterOp.calls == [(13, E)]  # the plain layer never called the kernel
    torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-6)


def test_only_routers_that_say_what_they_compute_are_fused():
    config, weights = _config(), random_weights(_config(), seed=2)
    router = _router()
    as_function = MoeLayer(config, weights, lambda x: router(x), backend=CountingRouterOp)
    other_route = MoeLayer(config, weights, _router(lambda logits: softmax_topk(logits, K)), backend=CountingRouterOp)
    assert as_function.fused_router is None and other_route.fused_router is None
    torch.testing.assert_close(as_function(_x()), other_route(_x()))


@pytest.mark.parametrize("op, said", [(RaisingRouterOp, "no router today"), (NotCallableRouterOp, "not a callable")])
def test_a_router_hook_that_fails_is_routed_around_with_a_warning(op, said):
    config, weights = _config(), random_weights(_config(), seed=2)
    with pytest.warns(RuntimeWarning, match=said):
        layer = MoeLayer(config, weights, _router(), backend=op)
    assert layer.fused_router is None
    ref = MoeLayer(config, weights, _router(), backend=TorchFusedOp)
    torch.testing.assert_close(layer(_x()), ref(_x()))


@pytest.mark.parametrize(
    "op, said",
    [(WrongDtypeRouterOp, r"topk_ids as a \[13, 2\] int64 tensor"), (WrongShapeRouterOp, r"topk_ids as a \[13, 1\]")],
)
def test_a_fused_routers_result_is_checked_at_the_door(op, said):
    config, weights = _config(), random_weights(_config(), seed=2)
    layer = MoeLayer(config, weights, _router(), backend=op)
    with pytest.raises(BackendError, match=f"{op.name}.*{said}"):
        layer(_x())


def test_a_linear_gate_goes_to_the_backend_with_the_input_and_matches_the_logits_path():
    config, weights = _config(), random_weights(_config(), seed=2)
    CountingRouterOp.calls.clear()
    GatedRouterOp.gated_calls.clear()
    bias = torch.randn(E, generator=torch.Generator().manual_seed(5))
    router = HFRouter(_router().weight, bias, SoftmaxTopK(K))
    gated = MoeLayer(config, weights, router, backend=GatedRouterOp)
    assert gated.fused_router.takes_gate
    plain = MoeLayer(config, weights, router, backend=TorchFusedOp, fused_routing=False)
    out = gated(_x())
    assert GatedRouterOp.gated_calls == [(13, E, True)] and CountingRouterOp.calls == []
    torch.testing.assert_close(out, plain(_x()), rtol=1e-6, atol=1e-6)
    # a gate of another dtype than the input: the layer computes the logits (the router casts x) instead
    router.weight, router.bias = router.weight.double(), bias.double()
    gated(_x())
    assert GatedRouterOp.gated_calls == [(13, E, True)] and CountingRouterOp.calls == [(13, E)]


def test_float32_logits_are_not_a_gate_the_backend_may_take():
    config, weights = _config(), random_weights(_config(), seed=2)
    router = HFRouter(_router().weight, None, SoftmaxTopK(K), float32_logits=True)
    assert router.gate is None
    layer = MoeLayer(config, weights, router, backend=GatedRouterOp)
    assert layer.fused_router is not None and not layer.fused_router.takes_gate


def test_a_gated_router_hook_that_fails_leaves_the_logits_kernel_in_use():
    config, weights = _config(), random_weights(_config(), seed=2)
    with pytest.warns(RuntimeWarning, match="no gate today.*computing the gate apart"):
        layer = MoeLayer(config, weights, _router(), backend=RaisingGateOp)
    assert layer.fused_router is not None and not layer.fused_router.takes_gate
    ref = MoeLayer(config, weights, _router(), backend=TorchFusedOp, fused_routing=False)
    torch.testing.assert_close(layer(_x()), ref(_x()), rtol=1e-6, atol=1e-6)


def test_a_gated_routers_result_is_checked_at_the_door():
    config, weights = _config(), random_weights(_config(), seed=2)
    layer = MoeLayer(config, weights, _router(), backend=WrongGateOp)
    with pytest.raises(BackendError, match=r"wrong_gate.*gated router returned topk_ids as a \[12, 2\]"):
        layer(_x())
