"""The runner: binding, numerics against the float64 oracle, and bad input."""

from __future__ import annotations

import pytest
import torch

from moe_core import MoeConfig, MoeRunner, MoeWeights
from moe_core.errors import BackendError, InvalidInputError
from moe_core.reference import reference_for
from moe_core.synthetic import random_inputs, random_weights
from moe_core.tolerances import relative_l2, tolerance


def make(scheme="fp32", dtype=torch.float32, **kw):
    cfg = MoeConfig(
        num_experts=kw.pop("e", 6),
        top_k=kw.pop("k", 2),
        hidden_size=kw.pop("h", 32),
        intermediate_size=kw.pop("i", 16),
        quant_scheme=scheme,
        dtype=dtype,
        **kw,
    )
    return cfg, random_weights(cfg, seed=3)


@pytest.mark.parametrize("scheme,dtype", [("fp32", torch.float32), ("bf16", torch.bfloat16), ("fp16", torch.float16)])
@pytest.mark.parametrize("m", [0, 1, 7, 64])
def test_torch_backend_matches_oracle(scheme, dtype, m):
    cfg, w = make(scheme, dtype)
    runner = MoeRunner(cfg, w, backend="torch")
    x, ids, tw = random_inputs(cfg, m)
    out = runner(x, ids, tw)
    assert out.shape == (m, 32) and out.dtype == dtype
    ref = reference_for(cfg, w, x, ids, tw)
    assert relative_l2(out, ref) <= tolerance(scheme, dtype)


def test_out_buffer_is_written_and_returned():
    cfg, w = make()
    runner = MoeRunner(cfg, w)
    x, ids, tw = random_inputs(cfg, 9)
    out = torch.full((9, 32), float("nan"))
    got = runner(x, ids, tw, out=out)
    assert got is out and torch.isfinite(out).all()
    torch.testing.assert_close(out, runner(x, ids, tw))


def test_oracle_disagrees_with_a_wrong_layer():
    """The comparison can fail: swapping the gate/up halves is caught."""
    cfg, w = make()
    x, ids, tw = random_inputs(cfg, 16)
    out = MoeRunner(cfg, w)(x, ids, tw)
    i = cfg.intermediate_size
    swapped = MoeWeights(torch.cat([w.w13[:, i:], w.w13[:, :i]], dim=1), w.w2)
    assert relative_l2(out, reference_for(cfg, swapped, x, ids, tw)) > 0.1


@pytest.mark.parametrize(
    "mutate,match",
    [
        (lambda x, i, t: (x.to(torch.float64), i, t), "hidden_states has dtype float64"),
        (lambda x, i, t: (x[:, :-1], i, t), r"hidden_states must be \[M, 32\]"),
        (lambda x, i, t: (x, i.long(), t), "topk_ids must be int32"),
        (lambda x, i, t: (x, i, t.half()), "topk_weights must be float32"),
        (lambda x, i, t: (x, i[:-1], t), r"topk_ids must be \[5, 2\]"),
        (lambda x, i, t: (x, i, t[:, :1]), r"topk_weights must be \[5, 2\]"),
        (lambda x, i, t: (x[0], i, t), r"hidden_states must be \[M, 32\]"),
        (lambda x, i, t: (x, i.tolist(), t), "topk_ids must be a torch.Tensor"),
        (lambda x, i, t: (x, i, t.to("meta")), "topk_weights is on meta"),
    ],
)
def test_bad_forward_input_raises_before_any_kernel(mutate, match):
    cfg, w = make()
    runner = MoeRunner(cfg, w)
    calls = []
    runner._apply = lambda *a: calls.append(a)
    x, ids, tw = random_inputs(cfg, 5)
    with pytest.raises(InvalidInputError, match=match):
        runner(*mutate(x, ids, tw))
    assert calls == []


def test_bad_out_buffer():
    cfg, w = make()
    runner = MoeRunner(cfg, w)
    x, ids, tw = random_inputs(cfg, 5)
    with pytest.raises(InvalidInputError, match="out must be"):
        runner(x, ids, tw, out=torch.empty(5, 32, dtype=torch.float16))
    with pytest.raises(InvalidInputError, match="contiguous"):
        runner(x, ids, tw, out=torch.empty(32, 5).T)
    with pytest.raises(InvalidInputError, match="share memory with hidden_states"):
        runner(x, ids, tw, out=x)


def test_expert_ids_out_of_range_are_rejected():
    cfg, w = make()
    runner = MoeRunner(cfg, w)
    x, ids, tw = random_inputs(cfg, 5)
    for bad in (cfg.num_experts, 10**6, -2):
        ids[2, 1] = bad
        with pytest.raises(InvalidInputError, match=r"\[0, 6\) or -1"):
            runner(x, ids, tw)


@pytest.mark.parametrize("check", [True, False])
def test_unassigned_id_contributes_zero(check):
    """-1 marks a pair as "not on this rank": the result equals the layer without that pair."""
    cfg, w = make()
    runner = MoeRunner(cfg, w, check_expert_ids=check)
    x, ids, tw = random_inputs(cfg, 5)
    ids[2, 1] = -1
    ids[4, :] = -1  # a token with no expert here at all
    dropped = tw.clone()
    dropped[2, 1] = 0.0
    dropped[4, :] = 0.0
    valid = ids.clamp(min=0)
    expected = reference_for(cfg, w, x, valid, dropped)
    out = runner(x, ids, tw)
    assert torch.equal(out[4], torch.zeros_like(out[4]))
    assert relative_l2(out, expected) <= tolerance(cfg.quant_scheme, cfg.dtype)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(num_experts=4, top_k=5, hidden_size=8, intermediate_size=8), "top_k=5 is larger than num_experts=4"),
        (dict(num_experts=0, top_k=1, hidden_size=8, intermediate_size=8), "num_experts must be a positive int"),
        (dict(num_experts=4, top_k=1, hidden_size=8, intermediate_size=8, activation="relu"), "unknown activation"),
        (dict(num_experts=4, top_k=1, hidden_size=8, intermediate_size=8, quant_scheme="int3"), "unknown quant"),
        (
            dict(num_experts=4, top_k=1, hidden_size=8, intermediate_size=8, dtype=torch.float16),
            "computes in torch.bfloat16",
        ),
        (
            dict(num_experts=4, top_k=2, hidden_size=8, intermediate_size=8, apply_router_weight_on_input=True),
            "top_k == 1",
        ),
        (
            dict(num_experts=4, top_k=1, hidden_size=40, intermediate_size=64, quant_scheme="mxfp4"),
            "multiple of the scale block 32",
        ),
    ],
)
def test_bad_config(kwargs, match):
    with pytest.raises(InvalidInputError, match=match):
        MoeConfig(**kwargs)


def test_bad_weights():
    cfg, w = make()
    with pytest.raises(InvalidInputError, match=r"w13 has shape \(6, 16, 32\), expected \(6, 32, 32\)"):
        MoeRunner(cfg, MoeWeights(w.w13[:, :16], w.w2))
    with pytest.raises(InvalidInputError, match="w2 has dtype torch.float16"):
        MoeRunner(cfg, MoeWeights(w.w13, w.w2.half()))
    with pytest.raises(InvalidInputError, match="w2 is on meta but w13 is on cpu"):
        MoeRunner(cfg, MoeWeights(w.w13, w.w2.to("meta")))
    with pytest.raises(InvalidInputError, match="b13 given but config.has_bias is False"):
        MoeRunner(cfg, MoeWeights(w.w13, w.w2, b13=torch.zeros(6, 32), b2=torch.zeros(6, 32)))
    cfg_b, _ = make(has_bias=True)
    with pytest.raises(InvalidInputError, match="b13 is missing"):
        MoeRunner(cfg_b, MoeWeights(w.w13, w.w2))
    with pytest.raises(InvalidInputError, match="w13_scale given"):
        MoeRunner(cfg, MoeWeights(w.w13, w.w2, w13_scale=torch.ones(1)))


def test_weights_on_another_device_than_inputs():
    cfg, w = make()
    runner = MoeRunner(cfg, w)
    x, ids, tw = random_inputs(cfg, 5)
    with pytest.raises(InvalidInputError, match="hidden_states is on meta, but the layer's weights are on cpu"):
        runner(x.to("meta"), ids, tw)


def test_non_contiguous_input():
    cfg, w = make()
    runner = MoeRunner(cfg, w)
    x, ids, tw = random_inputs(cfg, 8)
    wide = torch.randn(8, 64)
    wide[:, ::2] = x
    strided = wide[:, ::2]
    assert not strided.is_contiguous()
    torch.testing.assert_close(runner(strided, ids, tw), runner(x, ids, tw))


def test_out_overlapping_any_input_is_refused():
    """A range check, not identity: a view that starts elsewhere in the same buffer is refused too."""
    cfg, w = make()
    runner = MoeRunner(cfg, w)
    x, ids, tw = random_inputs(cfg, 4)
    big = torch.zeros(8, 32)
    x_view, out_view = big[:4], big[3:7]  # rows 3 overlap
    with pytest.raises(InvalidInputError, match="share memory with hidden_states"):
        runner(x_view, ids, tw, out=out_view)
    assert runner(big[:4], ids, tw, out=big[4:]) is not None  # adjacent, not overlapping: fine
    pool = torch.zeros(4 * 32 + 8)
    tw_in_pool, out_in_pool = pool[:8].view(4, 2), pool[4:].narrow(0, 0, 4 * 32).view(4, 32)
    tw_in_pool.copy_(tw)
    with pytest.raises(InvalidInputError, match="share memory with topk_weights"):
        runner(x, ids, tw_in_pool, out=out_in_pool)
    raw = torch.zeros(4 * 32, dtype=torch.float32)
    ids_in_raw = raw[:8].view(torch.int32).view(4, 2)
    ids_in_raw.copy_(ids)
    with pytest.raises(InvalidInputError, match="share memory with topk_ids"):
        runner(x, ids_in_raw, tw, out=raw.view(4, 32))


def test_a_fused_op_class_can_be_passed_directly():
    """No distribution, no entry point: the class itself, its support check still asked."""
    from moe_core.backends.torch.fused_op import TorchFusedOp
    from moe_core.errors import BackendUnavailableError

    class Doubling(TorchFusedOp):
        name = "doubling"

        def apply(self, hidden_states, topk_ids, topk_weights, prepared, out=None):
            return super().apply(hidden_states, topk_ids, topk_weights, prepared, out).mul_(2)

    cfg, w = make()
    x, ids, tw = random_inputs(cfg, 3)
    runner = MoeRunner(cfg, w, backend=Doubling)
    assert runner.backend == "doubling" and runner.distribution.endswith(".Doubling")
    assert torch.allclose(runner(x, ids, tw), 2 * MoeRunner(cfg, w, backend="torch")(x, ids, tw))

    class GpuOnly(TorchFusedOp):
        name = "gpuonly"
        device_types = frozenset({"cuda"})

    with pytest.raises(BackendUnavailableError, match="GpuOnly cannot run this problem.*device type 'cpu'"):
        MoeRunner(cfg, w, backend=GpuOnly)
    with pytest.raises(BackendError, match="FusedOp subclass"):
        MoeRunner(cfg, w, backend=int)


@pytest.mark.parametrize("check", [True, False])
def test_runner_masks_invalid_ids_for_a_backend_that_does_not_handle_them(check):
    """The backend sees only ids in [0, E) (it asserts so) and the pairs the runner masked contribute zero."""
    from moe_core.backends.torch.fused_op import TorchFusedOp

    seen = []

    class Strict(TorchFusedOp):
        name = "strict"
        handles_invalid_ids = False

        def apply(self, hidden_states, topk_ids, topk_weights, prepared, out=None):
            assert int(topk_ids.min()) >= 0 and int(topk_ids.max()) < self.config.num_experts
            seen.append(topk_ids)
            return super().apply(hidden_states, topk_ids, topk_weights, prepared, out)

    cfg, w = make()
    runner = MoeRunner(cfg, w, backend=Strict, check_expert_ids=check)
    x, ids, tw = random_inputs(cfg, 5)
    ids[1, 0], ids[3, :] = -1, -1
    if not check:
        ids[2, 1], ids[4, 0] = cfg.num_experts, 10**6
    out = runner(x, ids, tw)
    assert seen and torch.equal(out[3], torch.zeros_like(out[3]))
    assert relative_l2(out, reference_for(cfg, w, x, ids, tw)) <= tolerance(cfg.quant_scheme, cfg.dtype)


def test_describe_binding_names_backend_problem_and_why():
    cfg, w = make()
    named = MoeRunner(cfg, w, backend="torch").describe_binding("requested by --flag")
    assert named.startswith("bound moe backend 'torch' (moe-core) for fp32 E=6 top_k=2 H=32 I=16 silu on cpu: ")
    assert named.endswith("asked for by name ('torch')")  # the selection's own reason wins over the fallback
    auto = MoeRunner(cfg, w, backend="auto").describe_binding()
    assert ": " in auto and auto.split(": ", 1)[1]  # auto always says why it chose


def test_count_forwards_sees_runners_bound_after_it(monkeypatch):
    from moe_core.testing.counting import count_forwards

    calls = count_forwards(monkeypatch)
    cfg, w = make()
    runner = MoeRunner(cfg, w, backend="torch")
    x, ids, tw = random_inputs(cfg, 3)
    runner(x, ids, tw)
    runner(x, ids, tw)
    assert calls == ["fp32", "fp32"]


# --- torch.compile: one opaque op, moe::runner (moe_core.compile_ops) ------------------------------------------


def graph_ops(fn, *args) -> tuple[int, list[str]]:
    """Graph breaks and the ops of every graph Dynamo makes of ``fn(*args)``."""
    explained = torch._dynamo.explain(fn)(*args)
    ops = [str(n.target) for g in explained.graphs for n in g.graph.nodes if n.op == "call_function"]
    return explained.graph_break_count, ops


def test_a_compiled_call_is_one_op_and_reads_nothing_on_the_host():
    """The torch backend reads expert ids and counts on the host (graph breaks when traced): as ``moe::runner``
    the call compiles with ``fullgraph=True`` and equals eager, ``out=`` included."""
    torch._dynamo.reset()
    cfg, w = make()
    runner = MoeRunner(cfg, w, backend="torch")
    x, ids, tw = random_inputs(cfg, 7)
    breaks, ops = graph_ops(lambda a, b, c: runner(a, b, c), x, ids, tw)
    assert breaks == 0 and ops.count("moe.runner.default") == 1, ops
    compiled = torch.compile(lambda a, b, c: runner(a, b, c) * 2, backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(compiled(x, ids, tw), runner(x, ids, tw) * 2)
    out = torch.full((7, 32), float("nan"))
    into = torch.compile(lambda a, b, c, o: runner(a, b, c, out=o), backend="aot_eager", fullgraph=True)
    into(x, ids, tw, out)
    torch.testing.assert_close(out, runner(x, ids, tw))
    torch._dynamo.reset()


def test_a_compiled_call_keeps_the_runners_checks():
    """The checks run inside the op on the real tensors: a bad id is refused as in eager code. An ``out`` that
    is the input, refused eagerly (the backend would read what it writes), is safe compiled: functionalization
    gives the op a buffer of its own and copies it into ``out`` afterwards."""
    torch._dynamo.reset()
    cfg, w = make()
    runner = MoeRunner(cfg, w, backend="torch")
    x, ids, tw = random_inputs(cfg, 4)
    compiled = torch.compile(lambda a, b, c: runner(a, b, c), backend="aot_eager", fullgraph=True)
    with pytest.raises(InvalidInputError, match="topk_ids must lie in"):
        compiled(x, torch.full_like(ids, 6), tw)
    into = torch.compile(lambda a, b, c, o: runner(a, b, c, out=o), backend="aot_eager", fullgraph=True)
    want, same = runner(x, ids, tw), x.clone()
    into(same, ids, tw, same)
    torch.testing.assert_close(same, want)
    torch._dynamo.reset()


def test_a_compiled_call_that_records_grad_is_traced():
    torch._dynamo.reset()
    cfg, w = make()
    runner = MoeRunner(cfg, w, backend="torch")
    x, ids, tw = random_inputs(cfg, 4)
    _, ops = graph_ops(lambda a, b, c: runner(a, b, c), x.requires_grad_(), ids, tw)
    assert "moe.runner.default" not in ops
    torch._dynamo.reset()
