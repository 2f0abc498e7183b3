"""``MoeLayer``: a whole block (router, routed experts, shared experts) against an independent float64 loop.

Longer than 400 lines on purpose: the float64 reference loop and the layer's fixtures are shared by every
case, from numerics to memory and compile.
"""

from __future__ import annotations

import functools
import gc
import math
import weakref

import pytest
import torch
from interpreted_triton import run_with_triton

import moe_core
from moe_core import MoeConfig, MoeLayer, MoeRunner, MoeWeights, SharedExperts
from moe_core.backends.torch.fused_op import TorchFusedOp
from moe_core.errors import BackendUnavailableError, InvalidInputError
from moe_core.integrations.transformers.router import HFRouter
from moe_core.quant import dequantize_weights
from moe_core.routing import sigmoid_top1, softmax_topk
from moe_core.synthetic import random_weights
from moe_core.tolerances import relative_l2, tolerance

H, INTER, I_S, E, K = 32, 16, 24, 6, 2


# --- the oracle: a per-token loop in float64, written apart from the backends and moe_core.reference -------


def _act64(name: str, h13: torch.Tensor, alpha: float = 1.702, limit: float = 7.0) -> torch.Tensor:
    half = h13.shape[-1] // 2
    gate, up = h13[..., :half], h13[..., half:]
    if name == "silu":
        return gate / (1 + torch.exp(-gate)) * up
    if name == "gelu":
        return 0.5 * gate * (1 + torch.erf(gate / math.sqrt(2))) * up
    if name == "swiglu_oai":
        gate, up = gate.clamp(max=limit), up.clamp(-limit, limit)
        return gate / (1 + torch.exp(-alpha * gate)) * (up + 1)
    raise AssertionError(name)


def reference_layer(config, w13, w2, router, x, shared=None):
    """The block's output ``[M, H]`` in float64 for ``x`` ``[M, H]``: route with ``router``, then every
    (token, slot) pair through its expert one at a time, plus the shared MLP (times its sigmoid gate)."""
    ids, tw = router(x)
    x64 = x.double()
    out = torch.zeros(x.shape[0], config.hidden_size, dtype=torch.float64)
    for t in range(x.shape[0]):
        for j in range(config.top_k):
            e, wt = int(ids[t, j]), float(tw[t, j])
            xin = x64[t] * wt if config.apply_router_weight_on_input else x64[t]
            y = w2[e].double() @ _act64(config.activation, w13[e].double() @ xin)
            out[t] += y if config.apply_router_weight_on_input else wt * y
    if shared is not None:
        act = shared.activation or config.activation
        y = _act64(act, x64 @ shared.w13.double().T) @ shared.w2.double().T
        if shared.gate is not None:
            y = y * torch.sigmoid(x64 @ shared.gate.double().T)
        out += y
    return out


# --- building blocks ------------------------------------------------------------------------------------------


def make_config(scheme="fp32", dtype=torch.float32, **kw) -> MoeConfig:
    return MoeConfig(
        num_experts=kw.pop("e", E),
        top_k=kw.pop("k", K),
        hidden_size=kw.pop("h", H),
        intermediate_size=kw.pop("i", INTER),
        quant_scheme=scheme,
        dtype=dtype,
        **kw,
    )


def make_shared(dtype=torch.float32, *, gated=False, activation=None, h=H, i_s=I_S, seed=7) -> SharedExperts:
    gen = torch.Generator().manual_seed(seed)
    w13 = (torch.randn(2 * i_s, h, generator=gen) * h**-0.5).to(dtype)
    w2 = (torch.randn(h, i_s, generator=gen) * i_s**-0.5).to(dtype)
    gate = (torch.randn(1, h, generator=gen) * h**-0.5).to(dtype) if gated else None
    return SharedExperts(w13, w2, gate=gate, activation=activation)


class LinearRouter(torch.nn.Module):
    """A router that is an ``nn.Module``: a gate linear and ``softmax_topk``."""

    def __init__(self, config: MoeConfig, seed: int = 5) -> None:
        super().__init__()
        self.top_k = config.top_k
        self.gate = torch.nn.Linear(config.hidden_size, config.num_experts, bias=False, dtype=config.dtype)
        with torch.no_grad():
            gen = torch.Generator().manual_seed(seed)
            self.gate.weight.copy_(torch.randn(self.gate.weight.shape, generator=gen))

    @torch.no_grad()
    def forward(self, x):
        return softmax_topk(self.gate(x), self.top_k)


def function_router(config: MoeConfig, route=None, seed: int = 5, device="cpu"):
    """A router that is a plain function of ``moe_core.routing`` over fixed logits weights."""
    gen = torch.Generator().manual_seed(seed)
    weight = torch.randn(config.num_experts, config.hidden_size, generator=gen).to(device, config.dtype)
    route = route or functools.partial(softmax_topk, top_k=config.top_k)

    def router(x):
        return route(x @ weight.T)

    return router


def inputs(m: int, dtype=torch.float32, h=H, seed=1) -> torch.Tensor:
    return torch.randn(m, h, generator=torch.Generator().manual_seed(seed)).to(dtype)


def check(layer, config, weights, router, x, shared=None, tol=None):
    out = layer(x)
    assert out.shape == x.shape and out.dtype == config.dtype
    ref = reference_layer(config, weights.w13, weights.w2, router, x.reshape(-1, config.hidden_size), shared)
    err = relative_l2(out.reshape(-1, config.hidden_size), ref)
    assert err <= (tol if tol is not None else tolerance(config.quant_scheme, config.dtype)), err
    return out


# --- numerics ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("m", [1, 9])
@pytest.mark.parametrize("router_kind", ["module", "function"])
def test_routed_only_matches_reference(m, router_kind):
    config = make_config()
    weights = random_weights(config, seed=3)
    router = LinearRouter(config) if router_kind == "module" else function_router(config)
    layer = MoeLayer(config, weights, router, backend="torch")
    assert layer.shared_runner is None and layer.shared_backend is None and layer.shared_gate is None
    check(layer, config, weights, router, inputs(m))


@pytest.mark.parametrize("gated", [False, True], ids=["ungated", "gated"])
@pytest.mark.parametrize("activation", [None, "gelu"], ids=["routed-activation", "own-activation"])
def test_shared_experts_are_added(gated, activation):
    config = make_config()
    weights = random_weights(config, seed=3)
    router = LinearRouter(config)
    shared = make_shared(gated=gated, activation=activation)
    layer = MoeLayer(config, weights, router, shared=shared, backend="torch")
    assert layer.shared_backend == "torch"
    assert layer.shared_runner.config.activation == (activation or config.activation)
    assert (layer.shared_gate is not None) == gated
    out = check(layer, config, weights, router, inputs(11), shared)
    # the shared part is really there: without it the output differs
    routed = MoeLayer(config, weights, router, backend="torch")(inputs(11))
    assert relative_l2(out, routed) > 0.05


def test_router_weight_on_input_top1_with_shared_expert():
    """Llama 4: top-1 sigmoid routing applied to the expert input, an ungated shared expert added."""
    config = make_config(k=1, apply_router_weight_on_input=True)
    weights = random_weights(config, seed=3)
    router = function_router(config, route=sigmoid_top1)
    shared = make_shared()
    layer = MoeLayer(config, weights, router, shared=shared, backend="torch")
    out = check(layer, config, weights, router, inputs(10), shared)
    # on the input is not on the output: the activation is not linear, so the two differ
    off = make_config(k=1)
    assert relative_l2(out, reference_layer(off, weights.w13, weights.w2, router, inputs(10), shared)) > 1e-3


@pytest.mark.parametrize("shape", [(2, 3, H), (H,), (0, H), (2, 0, H), (1, 1, 4, H)])
def test_leading_dims_and_empty(shape):
    config = make_config()
    weights = random_weights(config, seed=3)
    router = LinearRouter(config)
    shared = make_shared(gated=True)
    layer = MoeLayer(config, weights, router, shared=shared, backend="torch")
    x = torch.randn(shape)
    out = layer(x)
    assert out.shape == x.shape and out.dtype == torch.float32
    flat = layer(x.reshape(-1, H))
    torch.testing.assert_close(out.reshape(-1, H), flat, rtol=0, atol=0)
    if x.numel():
        check(layer, config, weights, router, x, shared)


def test_non_contiguous_input():
    config = make_config()
    weights = random_weights(config, seed=3)
    layer = MoeLayer(config, weights, LinearRouter(config), shared=make_shared(), backend="torch")
    x = inputs(2 * 8).reshape(2, 8, H).transpose(0, 1)  # [8, 2, H], not contiguous
    torch.testing.assert_close(layer(x), layer(x.contiguous()), rtol=0, atol=0)


def test_bf16_within_tolerance():
    config = make_config("bf16", torch.bfloat16)
    weights = random_weights(config, seed=3)
    router = LinearRouter(config)
    shared = make_shared(torch.bfloat16, gated=True)
    layer = MoeLayer(config, weights, router, shared=shared, backend="torch")
    check(layer, config, weights, router, inputs(13, torch.bfloat16), shared)


def test_quantized_routed_experts_keep_shared_mlp_in_activation_dtype():
    config = make_config("mxfp4", torch.bfloat16, h=64, i=32)
    weights = random_weights(config, seed=3)
    router = function_router(config)
    shared = make_shared(torch.bfloat16, gated=True, h=64)
    layer = MoeLayer(config, weights, router, shared=shared, backend="torch")
    assert layer.shared_runner.config.quant_scheme == "bf16"
    assert layer.shared_runner.config.dtype == torch.bfloat16
    x = inputs(7, torch.bfloat16, h=64)
    w13, w2 = dequantize_weights(weights, "mxfp4", torch.float64)
    ref = reference_layer(config, w13, w2, router, x, shared)
    assert relative_l2(layer(x), ref) <= tolerance("mxfp4", torch.bfloat16)


def test_many_tokens_grow_the_constant_routing_once():
    config = make_config()
    weights = random_weights(config, seed=3)
    router = function_router(config)
    shared = make_shared()
    layer = MoeLayer(config, weights, router, shared=shared, backend="torch")
    ids = layer._shared_ids
    layer(inputs(3))
    assert layer._shared_ids is ids  # no allocation per forward
    m = ids.shape[0] + 5
    check(layer, config, weights, router, inputs(m), shared)
    assert layer._shared_ids.shape[0] >= m
    layer.reserve(4 * m)
    assert layer._shared_ids.shape[0] == 4 * m and layer._shared_ones.shape[0] == 4 * m
    assert bool((layer._shared_ids == 0).all()) and bool((layer._shared_ones == 1).all())


def test_auto_picks_what_a_runner_picks():
    config = make_config()
    weights = random_weights(config, seed=3)
    layer = MoeLayer(config, weights, LinearRouter(config), shared=make_shared())
    assert layer.backend == MoeRunner(config, weights).backend
    assert layer.shared_fallback is None


# --- the shared experts' backend ------------------------------------------------------------------------------


class Mxfp4Only(TorchFusedOp):
    """A backend that runs MXFP4 only (as flashinfer_mxfp4 does): it cannot run the unquantized shared MLP."""

    name = "mxfp4_only"
    quant_schemes = frozenset({"mxfp4"})


def test_explicit_backend_that_cannot_run_the_shared_mlp_falls_back_to_auto():
    config = make_config("mxfp4", torch.bfloat16, h=64, i=32)
    weights = random_weights(config, seed=3)
    layer = MoeLayer(
        config, weights, function_router(config), shared=make_shared(torch.bfloat16, h=64), backend=Mxfp4Only
    )
    assert layer.backend == "mxfp4_only"
    shared = make_shared(torch.bfloat16, h=64)
    auto = MoeRunner(layer.shared_runner.config, MoeWeights(shared.w13[None], shared.w2[None]))
    assert layer.shared_backend == auto.backend
    assert "Mxfp4Only cannot run" in layer.shared_fallback and "bf16" in layer.shared_fallback


def test_explicit_shared_backend_is_used_or_raises():
    config = make_config("mxfp4", torch.bfloat16, h=64, i=32)
    weights = random_weights(config, seed=3)
    shared = make_shared(torch.bfloat16, h=64)
    with pytest.raises(BackendUnavailableError, match="bf16"):
        MoeLayer(config, weights, function_router(config), shared=shared, backend=Mxfp4Only, shared_backend=Mxfp4Only)
    layer = MoeLayer(config, weights, function_router(config), shared=shared, backend=Mxfp4Only, shared_backend="torch")
    assert (layer.backend, layer.shared_backend, layer.shared_fallback) == ("mxfp4_only", "torch", None)


def test_explicit_backend_that_can_run_both_runs_both():
    config = make_config()
    weights = random_weights(config, seed=3)
    layer = MoeLayer(config, weights, function_router(config), shared=make_shared(), backend="torch")
    assert (layer.backend, layer.shared_backend, layer.shared_fallback) == ("torch", "torch", None)


# --- bad input --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "x,match",
    [
        (torch.randn(5, H + 1), rf"hidden_states must be \[\.\.\., {H}\] \(hidden size {H}\), got \[5, {H + 1}\]"),
        (torch.randn(5, H).double(), "hidden_states has dtype float64, the layer computes in float32"),
        (torch.tensor(1.0), r"hidden_states must be \[\.\.\., 32\]"),
        ([[0.0] * H], "hidden_states must be a torch.Tensor, got list"),
    ],
)
def test_bad_forward_input_raises(x, match):
    config = make_config()
    calls = []

    def router(t):
        calls.append(t)
        return softmax_topk(torch.zeros(t.shape[0], E), K)

    layer = MoeLayer(config, random_weights(config, seed=3), router, shared=make_shared(), backend="torch")
    with pytest.raises(InvalidInputError, match=match):
        layer(x)
    assert not calls  # refused before routing


@pytest.mark.parametrize(
    "shared,match",
    [
        (make_shared(h=H + 8), rf"shared experts' w13 has shape \({2 * I_S}, {H + 8}\), expected \[2I, {H}\]"),
        (SharedExperts(torch.randn(2 * I_S, H), torch.randn(H, I_S + 1)), "shared experts' w2 has shape"),
        (SharedExperts(torch.randn(2 * I_S + 1, H), torch.randn(H, I_S)), r"expected \[2I, 32\]"),
        (SharedExperts(torch.randn(2 * I_S, H), torch.randn(H, I_S), gate=torch.randn(H)), "shared experts' gate"),
        (make_shared(torch.bfloat16), "shared experts' weights are bfloat16, but the layer computes in float32"),
        (make_shared(activation="relu"), "shared experts' activation 'relu' is unknown"),
        (SharedExperts(torch.randn(2 * I_S, H), None), "shared experts' w2 must be a torch.Tensor"),
        ((torch.randn(2 * I_S, H), torch.randn(H, I_S)), "shared must be a SharedExperts, got tuple"),
        (
            SharedExperts(torch.randn(2 * I_S, H, device="meta"), torch.randn(H, I_S, device="meta")),
            "shared experts are on meta, but the routed experts are on cpu",
        ),
    ],
)
def test_bad_shared_experts_raise(shared, match):
    config = make_config()
    with pytest.raises(InvalidInputError, match=match):
        MoeLayer(config, random_weights(config, seed=3), function_router(config), shared=shared, backend="torch")


def test_bad_router_raises():
    config = make_config()
    weights = random_weights(config, seed=3)
    with pytest.raises(InvalidInputError, match="router must be a callable"):
        MoeLayer(config, weights, "softmax", backend="torch")
    wrong = HFRouter(torch.randn(E + 1, H), None, functools.partial(softmax_topk, top_k=K))
    with pytest.raises(InvalidInputError, match=f"router has num_experts={E + 1}, but the config has num_experts={E}"):
        MoeLayer(config, weights, wrong, backend="torch")
    wrong = HFRouter(torch.randn(E, H + 1), None, functools.partial(softmax_topk, top_k=K))
    with pytest.raises(InvalidInputError, match=f"router has hidden_size={H + 1}"):
        MoeLayer(config, weights, wrong, backend="torch")


def test_router_output_is_checked_by_the_runner():
    config = make_config()
    layer = MoeLayer(config, random_weights(config, seed=3), lambda x: softmax_topk(x[:, :E], 1), backend="torch")
    with pytest.raises(InvalidInputError, match=r"topk_ids must be \[4, 2\]"):
        layer(inputs(4))


def test_hf_router_is_a_plain_attribute():
    config = make_config()
    weights = random_weights(config, seed=3)
    router = HFRouter(torch.randn(E, H), None, functools.partial(softmax_topk, top_k=K), description="test")
    layer = MoeLayer(config, weights, router, backend="torch")
    assert layer.router is router and not list(layer.children())
    check(layer, config, weights, router, inputs(6))
    assert "router=HFRouter(E=6, H=32, test)" in repr(layer)


# --- memory -----------------------------------------------------------------------------------------------------


class CopyingTorch(TorchFusedOp):
    """The torch backend with a prepared layout of its own (a copy), as a kernel backend's would be."""

    name = "copying_torch"

    def prepare(self, weights):
        return MoeWeights(**{k: v.clone() for k, v in weights.tensors().items()})


def test_layer_keeps_no_canonical_weights_after_prepare():
    config = make_config()
    weights = random_weights(config, seed=3)
    shared = make_shared(gated=True)
    router = function_router(config)
    x = inputs(5)
    expected = MoeLayer(config, weights, router, shared=shared, backend="torch")(x)
    layer = MoeLayer(config, weights, router, shared=shared, backend=CopyingTorch)
    refs = [weakref.ref(t) for t in (weights.w13, weights.w2)]
    del weights
    gc.collect()
    assert all(r() is None for r in refs), "the layer still holds the canonical routed weights"
    torch.testing.assert_close(layer(x), expected, rtol=0, atol=0)


def test_torch_backend_holds_one_copy():
    """The torch backend's prepared weights are the canonical tensors (and the shared runner's are views of
    the shared MLP's): the layer adds no copy of its own."""
    config = make_config()
    weights = random_weights(config, seed=3)
    shared = make_shared()
    layer = MoeLayer(config, weights, function_router(config), shared=shared, backend="torch")
    assert layer.runner.prepared.w13 is weights.w13 and layer.runner.prepared.w2 is weights.w2
    prepared = layer.shared_runner.prepared
    assert prepared.w13.untyped_storage().data_ptr() == shared.w13.untyped_storage().data_ptr()
    assert prepared.w2.untyped_storage().data_ptr() == shared.w2.untyped_storage().data_ptr()
    assert not any(isinstance(v, SharedExperts | MoeWeights) for v in vars(layer).values())


# --- nn.Module behaviour: state_dict, .to(), repr ---------------------------------------------------------------


def test_state_dict_holds_the_router_module_and_the_shared_gate():
    config = make_config()
    weights = random_weights(config, seed=3)
    router = LinearRouter(config)
    layer = MoeLayer(config, weights, router, shared=make_shared(gated=True), backend="torch")
    assert set(layer.state_dict()) == {"router.gate.weight", "shared_gate"}
    assert dict(layer.named_children()) == {"router": router}
    x = inputs(4)
    before = layer(x)
    state = {k: v.clone() for k, v in layer.state_dict().items()}
    state["shared_gate"] = -state["shared_gate"]
    layer.load_state_dict(state)
    assert relative_l2(layer(x), before) > 1e-3  # forward reads the loaded gate
    state["shared_gate"] = -state["shared_gate"]
    layer.load_state_dict(state)
    torch.testing.assert_close(layer(x), before, rtol=0, atol=0)
    # no module router, no gate: nothing to save (the experts live in the backend's prepared layout)
    plain = MoeLayer(config, weights, function_router(config), shared=make_shared(), backend="torch")
    assert plain.state_dict() == {}


def test_to_same_device_and_dtype_passes_anything_else_is_refused():
    config = make_config()
    layer = MoeLayer(config, random_weights(config, seed=3), LinearRouter(config), shared=make_shared(gated=True))
    assert layer.to("cpu") is layer and layer.to(torch.float32) is layer and layer.float() is layer
    for move in (lambda m: m.double(), lambda m: m.half(), lambda m: m.to(torch.bfloat16), lambda m: m.to("meta")):
        with pytest.raises(InvalidInputError, match="build a new MoeLayer from canonical weights there"):
            move(layer)
    assert layer.router.gate.weight.dtype == torch.float32 and layer.shared_gate.device.type == "cpu"
    layer(inputs(3))


def test_repr():
    config = make_config()
    layer = MoeLayer(config, random_weights(config, seed=3), LinearRouter(config), shared=make_shared(gated=True))
    text = repr(layer)
    assert text.startswith("MoeLayer(\n")
    for part in (f"backend={layer.backend!r}", "E=6, top_k=2, H=32, I=16", "scheme='fp32'", "dtype=float32"):
        assert part in text
    assert f"shared=(I={I_S}, gated, activation='silu', backend={layer.shared_backend!r})" in text
    assert "(router): LinearRouter(" in text
    plain = MoeLayer(config, random_weights(config, seed=3), function_router(config), backend="torch")
    assert "router=function_router.<locals>.router" in repr(plain) and "shared=" not in repr(plain)


def test_exported_lazily():
    assert "MoeLayer" in moe_core.__all__ and "SharedExperts" in moe_core.__all__
    from moe_core import layer, weights

    assert moe_core.MoeLayer is layer.MoeLayer and moe_core.SharedExperts is weights.SharedExperts


# --- torch.compile ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("compiler", ["eager", "inductor"])
def test_torch_compile_matches_eager(compiler, tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))  # inductor's generated C++ is not left in /tmp
    torch._dynamo.reset()
    config = make_config(e=4, h=16, i=8)
    weights = random_weights(config, seed=3)
    layer = MoeLayer(
        config, weights, LinearRouter(config), shared=make_shared(gated=True, h=16, i_s=8), backend="torch"
    )
    compiled = torch.compile(layer, backend=compiler)
    for shape in ((5, 16), (2, 3, 16)):
        x = torch.randn(shape)
        torch.testing.assert_close(compiled(x), layer(x))
    torch._dynamo.reset()


def ops_in(gm) -> list[str]:
    return [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]


def test_compiled_layer_is_one_opaque_op_and_compiles_fullgraph():
    """The torch backend reads expert ids on the host (a graph break when traced); as ``moe::layer`` nothing of
    it is traced, so ``fullgraph=True`` holds and the graph calls the op once."""
    torch._dynamo.reset()
    config = make_config(e=4, h=16, i=8)
    layer = MoeLayer(config, random_weights(config, seed=3), LinearRouter(config),
                     shared=make_shared(gated=True, h=16, i_s=8), backend="torch")  # fmt: skip
    x = torch.randn(2, 3, 16)
    with torch.no_grad():
        explained = torch._dynamo.explain(layer)(x)
        assert explained.graph_break_count == 0 and explained.graph_count == 1
        assert ops_in(explained.graphs[0]).count("moe.layer.default") == 1
        compiled = torch.compile(layer, backend="aot_eager", fullgraph=True)
        torch.testing.assert_close(compiled(x), layer(x))
    torch._dynamo.reset()


def test_compiled_forward_that_records_grad_is_traced():
    """``moe::layer`` has no backward: a forward autograd records is traced through the layer, not the op."""
    torch._dynamo.reset()
    config = make_config(e=4, h=16, i=8)
    layer = MoeLayer(config, random_weights(config, seed=3), LinearRouter(config), backend="torch")
    x = torch.randn(5, 16, requires_grad=True)
    explained = torch._dynamo.explain(layer)(x)
    assert all("moe.layer.default" not in ops_in(g) for g in explained.graphs)
    torch.testing.assert_close(torch.compile(layer, backend="eager")(x), layer(x))
    torch._dynamo.reset()


def test_a_copy_of_a_layer_is_its_own_op_key():
    import copy

    from moe_core import compile_ops

    config = make_config(e=4, h=16, i=8)
    layer = MoeLayer(config, random_weights(config, seed=3), LinearRouter(config), backend="torch")
    twin = copy.deepcopy(layer)
    assert twin._op_key != layer._op_key
    with torch.no_grad():
        twin.router.gate.weight.mul_(-1)  # the copy routes differently: the op must run the copy, not the original
        x = torch.randn(4, 16)
        torch.testing.assert_close(compile_ops.layer(x, twin._op_key), twin(x))
        torch.testing.assert_close(compile_ops.layer(x, layer._op_key), layer(x))
        assert not torch.allclose(twin(x), layer(x))


def test_the_op_of_a_collected_layer_says_why_it_cannot_run():
    import gc

    from moe_core import compile_ops

    config = make_config(e=4, h=16, i=8)
    layer = MoeLayer(config, random_weights(config, seed=3), LinearRouter(config), backend="torch")
    key = layer._op_key
    del layer
    gc.collect()
    with pytest.raises(RuntimeError, match=f"moe::layer: no object with key {key} in this process"):
        compile_ops.layer(torch.randn(2, 16), key)


# --- triton (the plugin under its CPU interpreter on a machine without CUDA) -------------------------------------


def triton_against_torch() -> dict:
    """One gated-shared layer on triton and on torch; run in a fresh interpreter by the test below."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    config = make_config(e=4, h=32, i=16)
    weights = random_weights(config, device=device, seed=3)
    shared = make_shared(gated=True)
    shared = SharedExperts(shared.w13.to(device), shared.w2.to(device), gate=shared.gate.to(device))
    router = function_router(config, device=device)
    triton_layer = MoeLayer(config, weights, router, shared=shared, backend="triton")
    torch_layer = MoeLayer(config, weights, router, shared=shared, backend="torch")
    x = inputs(6).to(device)
    return {
        "backends": [triton_layer.backend, triton_layer.shared_backend],
        "error": relative_l2(triton_layer(x), torch_layer(x)),
    }


def test_layer_under_triton_matches_torch(tmp_path):
    """In a fresh interpreter with triton interpreted (``interpreted_triton``)."""
    result = run_with_triton("test_layer", "triton_against_torch", tmp_path)
    assert result["backends"] == ["triton", "triton"]
    assert result["error"] <= tolerance("fp32", torch.float32), result


# --- over ranks (gloo) ----------------------------------------------------------------------------------------


def _parallel_layers(rank: int, case: dict) -> None:
    """Two ranks: a TP=2 layer (replicate: every rank brings the batch) and an EP=2 layer (all_to_all: each rank
    its own tokens), router and shared experts included, each equal to the unsharded layer on those tokens."""
    from moe_core.distributed import Parallel

    cfg = make_config(e=4, has_bias=True)
    weights = random_weights(cfg, seed=3)
    shared = make_shared(gated=True)
    router = LinearRouter(cfg)
    x = inputs(7)
    whole = MoeLayer(cfg, weights, router, shared=shared, backend="torch")(x)
    tp = MoeLayer(cfg, weights, router, shared=shared, backend="torch", parallel=Parallel(tp_size=2))
    assert tp.runner.config.intermediate_size == INTER // 2 and "parallel=(tp=2, ep=1, rank=" in repr(tp)
    assert tp.graphs.disabled and relative_l2(tp(x), whole) < 1e-5
    ep = MoeLayer(cfg, weights, router, shared=shared, backend="torch",
                  parallel=Parallel(ep_size=2, dispatcher="all_to_all"))  # fmt: skip
    mine = ep.dispatched.token_slice(7)
    assert ep.runner.config.num_experts == 2 and (mine.stop - mine.start) == (4 if rank == 0 else 3)
    assert relative_l2(ep(x[mine]), whole[mine]) < 1e-5


@pytest.mark.skipif(not torch.distributed.is_available(), reason="needs torch.distributed with gloo")
def test_a_sharded_layer_equals_the_unsharded_one_on_gloo():
    from test_distributed import _spawn

    _spawn({}, 2, _parallel_layers)


def test_parallel_must_be_the_bundle():
    cfg = make_config()
    with pytest.raises(InvalidInputError, match="parallel must be a distributed.Parallel, got dict"):
        MoeLayer(cfg, random_weights(cfg), LinearRouter(cfg), parallel={"tp_size": 2})
