"""The fused routers (``TritonFusedOp.router``, ``kernels.route``): the softmax top-k and the grouped top-k of
``moe_core.routing`` in one kernel each, and the softmax top-k with the gate GEMM (``TritonFusedOp.gated_router``),
against the torch routing; offered to layers only for what they compute."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import requires_cuda

from moe_core import MoeConfig, MoeLayer
from moe_core.config import MoeProblem
from moe_core.integrations.transformers.router import HFRouter
from moe_core.routing import GroupedTopK, SigmoidTop1, SoftmaxTopK, grouped_topk, sigmoid_top1, softmax_topk
from moe_core.synthetic import random_weights
from moe_triton import switches
from moe_triton.fused_op import TritonFusedOp

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _kernel(top_k: int, renormalize: bool = True):
    from moe_triton.router import SoftmaxTopKRouter

    return SoftmaxTopKRouter(top_k, renormalize)


def _same_choice(logits, ids, weights, top_k, renormalize, atol=1e-6):
    """Ties between equal logits may resolve to either expert: compare the chosen logits (sorted), that the
    ids are distinct, and the weights sorted by value; then the ids where torch's choice has no tie."""
    ref_ids, ref_weights = softmax_topk(logits, top_k, renormalize)
    assert ids.dtype == torch.int32 and weights.dtype == torch.float32
    assert ids.shape == weights.shape == (logits.shape[0], top_k)
    assert int(ids.min()) >= 0 and int(ids.max()) < logits.shape[1]
    assert all(len(set(row)) == top_k for row in ids.tolist())
    chosen = logits.float().gather(1, ids.long()).sort(1).values
    torch.testing.assert_close(chosen, logits.float().gather(1, ref_ids.long()).sort(1).values, rtol=0, atol=0)
    torch.testing.assert_close(weights.sort(1).values, ref_weights.sort(1).values, rtol=0, atol=atol)
    # where weight and logit order agree, the pairing of ids to weights: weight(id) equals torch's weight(id)
    order = ids.long().sort(1)
    ref_order = ref_ids.long().sort(1)
    untied = (order.values == ref_order.values).all(1)
    torch.testing.assert_close(
        weights.gather(1, order.indices)[untied], ref_weights.gather(1, ref_order.indices)[untied], rtol=0, atol=atol
    )


@pytest.mark.parametrize("num_experts, top_k", [(8, 2), (60, 4), (128, 8), (3, 3), (40, 1)])
@pytest.mark.parametrize("renormalize", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_kernel_matches_torch_routing(num_experts, top_k, renormalize, dtype):
    gen = torch.Generator().manual_seed(num_experts * 10 + top_k)
    for m in (1, 37):  # one token; a partial last block of tokens
        logits = (torch.randn(m, num_experts, generator=gen) * 3).to(DEVICE, dtype)
        ids, weights = _kernel(top_k, renormalize)(logits)
        _same_choice(logits, ids, weights, top_k, renormalize)


def test_kernel_reads_strided_logits_and_handles_no_tokens():
    logits = torch.randn(64, 33, generator=torch.Generator().manual_seed(2)).to(DEVICE)[::2, 1:]  # [32, 32]
    assert not logits.is_contiguous()
    ids, weights = _kernel(4)(logits)
    _same_choice(logits, ids, weights, 4, True)
    ids, weights = _kernel(4)(logits[:0])
    assert ids.shape == weights.shape == (0, 4)


def test_ties_take_the_lowest_numbered_experts_and_nan_keeps_ids_in_range():
    logits = torch.zeros(3, 16, device=DEVICE)
    logits[1, 5] = float("nan")
    ids, weights = _kernel(4)(logits)
    assert ids[0].tolist() == [0, 1, 2, 3] and ids[2].tolist() == [0, 1, 2, 3]
    torch.testing.assert_close(weights[0], torch.full((4,), 0.25, device=DEVICE))
    assert int(ids[1].min()) >= 0 and int(ids[1].max()) < 16  # the NaN row's weights are NaN, its ids valid
    _, all_weights = _kernel(4, renormalize=False)(logits[:1])
    torch.testing.assert_close(all_weights[0], torch.full((4,), 1 / 16, device=DEVICE))


def _op(num_experts: int) -> TritonFusedOp:
    cfg = MoeConfig(num_experts, 2, 64, 32, quant_scheme="fp32", dtype=torch.float32)
    return TritonFusedOp(MoeProblem(cfg, torch.device(DEVICE)))


def test_offered_for_softmax_topk_only_and_only_when_switched_on():
    op = _op(8)
    assert op.router(SoftmaxTopK(2, False)).renormalize is False
    assert op.router(lambda logits: softmax_topk(logits, 2)) is None
    assert op.router(grouped_topk) is None  # a function, not a bundle: nothing says what it computes
    assert _op(2048).router(SoftmaxTopK(2)) is None  # more experts than one row of registers holds
    with switches.override(fused_router=False):
        assert op.router(SoftmaxTopK(2)) is None


def test_layer_routes_through_the_kernel_and_matches_torch_routing():
    cfg = MoeConfig(8, 2, 64, 32, quant_scheme="fp32", dtype=torch.float32)
    weights = random_weights(cfg, DEVICE, seed=3)
    gate = torch.randn(8, 64, generator=torch.Generator().manual_seed(4)).to(DEVICE)
    fused = MoeLayer(cfg, weights, HFRouter(gate, None, SoftmaxTopK(2)), backend="triton", cuda_graph_max_tokens=0)
    plain = MoeLayer(cfg, weights, HFRouter(gate, None, SoftmaxTopK(2)), backend="triton", fused_routing=False,
                     cuda_graph_max_tokens=0)  # fmt: skip
    assert fused.fused_router is not None and fused.fused_router.backend == "triton" and plain.fused_router is None
    x = torch.randn(19, 64, generator=torch.Generator().manual_seed(5)).to(DEVICE)
    torch.testing.assert_close(fused(x), plain(x), rtol=1e-5, atol=1e-5)


# --- grouped top-k (DeepSeek and its clones, Mistral 4, the one-group sigmoid routers) -----------------------------


def _same_grouped_choice(logits, ids, weights, routing: GroupedTopK, atol=1e-6):
    """Near-ties of the biased scores may resolve to either expert (the kernel's sigmoid / exp round apart
    from torch's by an ulp): compare the chosen biased scores and the weights, each sorted, then the ids."""
    ref_ids, ref_weights = routing(logits)
    m, e = logits.shape
    assert ids.dtype == torch.int32 and weights.dtype == torch.float32
    assert ids.shape == weights.shape == (m, routing.top_k)
    assert int(ids.min()) >= 0 and int(ids.max()) < e
    assert all(len(set(row)) == routing.top_k for row in ids.tolist())
    x = logits.float()
    scores = x.sigmoid() if routing.scoring == "sigmoid" else torch.softmax(x, dim=-1)
    choice = scores if routing.correction_bias is None else scores + routing.correction_bias.to(x.device).float()
    torch.testing.assert_close(choice.gather(1, ids.long()).sort(1).values,
                               choice.gather(1, ref_ids.long()).sort(1).values, rtol=0, atol=atol)  # fmt: skip
    scale = atol * max(1.0, routing.routed_scaling_factor)
    torch.testing.assert_close(weights.sort(1).values, ref_weights.sort(1).values, rtol=1e-6, atol=scale)
    return (ids.long().sort(1).values == ref_ids.long().sort(1).values).all(1)  # rows with the same ids


GROUPED = {  # name: (E, bundle parameters)
    "deepseek-v3": (64, dict(top_k=6, n_group=8, topk_group=3, routed_scaling_factor=2.5, bias=True)),
    "deepseek-v2": (
        48,
        dict(
            top_k=4,
            n_group=6,
            topk_group=2,
            scoring="softmax",
            renormalize=False,
            group_scoring="max",
            routed_scaling_factor=16.0,
        ),
    ),
    "mistral4": (20, dict(top_k=4, n_group=4, topk_group=2, scoring="softmax")),
    "deepseek-v2-greedy": (40, dict(top_k=6, scoring="softmax", renormalize=False)),
    "lfm2": (32, dict(top_k=4, renormalize_eps=1e-6, bias=True)),
    "ernie": (24, dict(top_k=3, scoring="softmax", renormalize_min=0.5, bias=True)),
}


def _grouped(name: str, gen: torch.Generator, device=DEVICE) -> tuple[int, GroupedTopK]:
    e, params = GROUPED[name]
    params = dict(params)
    bias = torch.randn(e, generator=gen).to(device) * 0.5 if params.pop("bias", False) else None
    return e, GroupedTopK(correction_bias=bias, **params)


@pytest.mark.parametrize("name", sorted(GROUPED))
def test_grouped_kernel_matches_torch_routing(name):
    from moe_triton.router import GroupedTopKRouter

    gen = torch.Generator().manual_seed(len(name))
    e, routing = _grouped(name, gen)
    kernel = GroupedTopKRouter(routing)
    for m in (1, 37):
        logits = (torch.randn(m, e, generator=gen) * 2).to(DEVICE)
        ids, weights = kernel(logits)
        assert bool(_same_grouped_choice(logits, ids, weights, routing).all())  # fp32: no near-ties here
    if routing.n_group > 1:  # the groups decide: without them torch chooses otherwise in some rows
        ungrouped = GroupedTopK(routing.top_k, scoring=routing.scoring, correction_bias=routing.correction_bias)
        assert not torch.equal(ids.sort(1).values, ungrouped(logits)[0].sort(1).values)


def test_grouped_kernel_reads_the_bias_at_each_call_and_handles_no_tokens():
    from moe_triton.router import GroupedTopKRouter

    bias = torch.zeros(8, device=DEVICE)
    kernel = GroupedTopKRouter(GroupedTopK(1, correction_bias=bias, renormalize=False))
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, -2.0, -3.0, -4.0, -5.0]], device=DEVICE)
    assert kernel(logits)[0].tolist() == [[0]]
    bias[3] = 5.0  # the block's tensor changed in place (a checkpoint loaded after patching)
    ids, weights = kernel(logits)
    assert ids.tolist() == [[3]]  # chosen by the bias, weighted by its unbiased score sigmoid(-1)
    torch.testing.assert_close(weights, torch.sigmoid(torch.tensor([[-1.0]], device=DEVICE)))
    ids, weights = kernel(logits[:0])
    assert ids.shape == weights.shape == (0, 1)


def test_grouped_offered_where_torch_would_route_it():
    from moe_triton.router import GroupedTopKRouter

    op = _op(8)
    assert isinstance(op.router(GroupedTopK(2, n_group=4, topk_group=2)), GroupedTopKRouter)
    assert op.router(GroupedTopK(2, n_group=3, topk_group=1)) is None  # 3 groups do not divide 8 experts
    assert op.router(GroupedTopK(4, n_group=4, topk_group=1)) is None  # 4 experts asked of one group of 2
    assert op.router(GroupedTopK(2, correction_bias=torch.zeros(7))) is None  # a bias of another E
    with switches.override(fused_router=False):
        assert op.router(GroupedTopK(2)) is None


def test_layer_routes_deepseek_through_the_grouped_kernel():
    cfg = MoeConfig(16, 4, 64, 32, quant_scheme="fp32", dtype=torch.float32)
    weights = random_weights(cfg, DEVICE, seed=6)
    gen = torch.Generator().manual_seed(7)
    gate = torch.randn(16, 64, generator=gen).to(DEVICE)
    route = GroupedTopK(4, n_group=4, topk_group=2, routed_scaling_factor=2.5,
                        correction_bias=torch.randn(16, generator=gen).to(DEVICE))  # fmt: skip
    fused = MoeLayer(cfg, weights, HFRouter(gate, None, route, float32_logits=True), backend="triton",
                     cuda_graph_max_tokens=0)  # fmt: skip
    plain = MoeLayer(cfg, weights, HFRouter(gate, None, route, float32_logits=True), backend="triton",
                     fused_routing=False, cuda_graph_max_tokens=0)  # fmt: skip
    assert fused.fused_router is not None and "GroupedTopKRouter" in repr(fused.fused_router._kernel)
    assert plain.fused_router is None
    x = torch.randn(19, 64, generator=gen).to(DEVICE)
    torch.testing.assert_close(fused(x), plain(x), rtol=1e-5, atol=1e-5)


# --- sigmoid top-1 (Llama 4) -------------------------------------------------------------------------------------


def test_sigmoid_top1_kernel_chooses_on_the_logits_and_weighs_by_their_sigmoid():
    from moe_triton.router import SoftmaxTopKRouter

    gen = torch.Generator().manual_seed(8)
    kernel = SoftmaxTopKRouter(1, True, sigmoid_weight=True)
    for e, dtype in ((16, torch.float32), (128, torch.float16)):
        logits = (torch.randn(37, e, generator=gen) * 4).to(DEVICE, dtype)
        logits[0, :2] = torch.tensor([20.0, 25.0])  # both sigmoids round to 1: the logit decides
        ids, weights = kernel(logits)
        ref_ids, ref_weights = sigmoid_top1(logits)
        assert ids.dtype == torch.int32 and torch.equal(ids, ref_ids) and int(ids[0]) == 1
        torch.testing.assert_close(weights, ref_weights, rtol=1e-6, atol=1e-7)
    assert isinstance(_op(8).router(SigmoidTop1()), SoftmaxTopKRouter)


def test_layer_routes_llama4_through_the_kernel_with_the_weight_on_the_input():
    cfg = MoeConfig(8, 1, 64, 32, quant_scheme="fp32", dtype=torch.float32, apply_router_weight_on_input=True)
    weights = random_weights(cfg, DEVICE, seed=9)
    gen = torch.Generator().manual_seed(10)
    gate = torch.randn(8, 64, generator=gen).to(DEVICE)
    fused = MoeLayer(cfg, weights, HFRouter(gate, None, SigmoidTop1()), backend="triton", cuda_graph_max_tokens=0)
    plain = MoeLayer(cfg, weights, HFRouter(gate, None, SigmoidTop1()), backend="triton", fused_routing=False,
                     cuda_graph_max_tokens=0)  # fmt: skip
    assert fused.fused_router is not None and plain.fused_router is None
    x = torch.randn(19, 64, generator=gen).to(DEVICE)
    torch.testing.assert_close(fused(x), plain(x), rtol=1e-5, atol=1e-5)


@requires_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 64, 2048])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_grouped_kernel_matches_torch_routing_at_deepseek_v3_shape(m, dtype):
    """DeepSeek-V3's router: 256 experts in 8 groups, 4 kept, k=8, float32 logits (bf16 too: its clones)."""
    from moe_triton.router import GroupedTopKRouter

    gen = torch.Generator().manual_seed(m)
    routing = GroupedTopK(8, n_group=8, topk_group=4, routed_scaling_factor=2.5,
                          correction_bias=(torch.rand(256, generator=gen) * 0.1).cuda())  # fmt: skip
    logits = torch.randn(m, 256, generator=gen).to("cuda", dtype)
    same = _same_grouped_choice(logits, *GroupedTopKRouter(routing)(logits), routing, atol=1e-6)
    assert float(same.float().mean()) > 0.99  # near-ties aside, the same experts


@requires_cuda
@pytest.mark.gpu
def test_grouped_kernel_runs_inside_a_cuda_graph():
    from moe_triton.router import GroupedTopKRouter

    routing = GroupedTopK(8, n_group=8, topk_group=4, correction_bias=torch.rand(256, device="cuda") * 0.1)
    logits = torch.randn(64, 256, device="cuda")
    kernel = GroupedTopKRouter(routing)
    kernel(logits)  # compiled outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ids, weights = kernel(logits)
    logits.copy_(torch.randn(64, 256, device="cuda"))
    graph.replay()
    _same_grouped_choice(logits, ids, weights, routing)


# --- the gate GEMM in the routing kernel (softmax top-k, sigmoid top-1) ---------------------------------------------


def _gated_kernel(top_k: int, renormalize: bool = True, sigmoid_weight: bool = False):
    from moe_triton.router import GatedSoftmaxTopKRouter

    return GatedSoftmaxTopKRouter(top_k, renormalize, sigmoid_weight)


def _same_gated_choice(x, w, b, ids, weights, top_k, renormalize, sigmoid_weight=False):
    """The kernel's logits are its float32 sums rounded to ``x``'s dtype; the reference's are torch's float32
    ``F.linear`` rounded the same way, and the two sums may round apart by one unit of that dtype (their
    order differs). So: the experts chosen hold the top-k logits of the reference up to that unit, and the
    weights match where both chose the same experts."""
    ref_logits = F.linear(x.float(), w.float(), None if b is None else b.float())
    ulp = 0.0 if x.dtype == torch.float32 else float(torch.finfo(x.dtype).eps) * float(ref_logits.abs().max())
    rounded = ref_logits.to(x.dtype)
    if sigmoid_weight:
        ref_ids, ref_weights = sigmoid_top1(rounded)
    else:
        ref_ids, ref_weights = softmax_topk(rounded, top_k, renormalize)
    m, e = ref_logits.shape
    assert ids.dtype == torch.int32 and weights.dtype == torch.float32 and ids.shape == weights.shape == (m, top_k)
    assert int(ids.min()) >= 0 and int(ids.max()) < e
    assert all(len(set(row)) == top_k for row in ids.tolist())
    chosen = ref_logits.gather(1, ids.long()).sort(1).values
    best = ref_logits.gather(1, ref_ids.long()).sort(1).values
    torch.testing.assert_close(chosen, best, rtol=1e-5, atol=1e-5 + ulp)
    same = (ids.long().sort(1).values == ref_ids.long().sort(1).values).all(1)
    assert float(same.float().mean()) >= 0.9  # near-ties of the rounded logits are rare
    order, ref_order = ids.long().sort(1).indices, ref_ids.long().sort(1).indices
    atol = 1e-5 if x.dtype == torch.float32 else 4 * float(torch.finfo(x.dtype).eps)
    torch.testing.assert_close(weights.gather(1, order)[same], ref_weights.gather(1, ref_order)[same], rtol=0,
                               atol=atol)  # fmt: skip
    return same


@pytest.mark.parametrize(
    "m, num_experts, hidden, top_k",
    [(13, 8, 64, 2), (40, 128, 200, 8), (5, 60, 256, 4), (70, 32, 96, 1), (1, 128, 512, 8), (300, 16, 64, 2)],
)  # one row block with K split over the interpreter's two "SMs", several row blocks unsplit, K not a step
# multiple, and past the gate_max_tokens switch's 256 (cuBLAS's logits and the logits kernel)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_gated_kernel_matches_torch_routing_of_the_gate_logits(m, num_experts, hidden, top_k, dtype):
    gen = torch.Generator().manual_seed(m + num_experts)
    x = torch.randn(m, hidden, generator=gen).to(DEVICE, dtype)
    w = (torch.randn(num_experts, hidden, generator=gen) / hidden**0.5).to(DEVICE, dtype)
    b = torch.randn(num_experts, generator=gen).to(DEVICE, dtype)
    for bias in (None, b):
        for renormalize in (True, False):
            kernel = _gated_kernel(top_k, renormalize)
            ids, weights = kernel(x, w, bias)
            _same_gated_choice(x, w, bias, ids, weights, top_k, renormalize)
            # the K split's arrival counters are left zero for the next launch
            assert all(int(c.abs().sum()) == 0 for c in kernel._counters.values())


@pytest.mark.parametrize("num_experts", [2, 8, 16, 60, 128, 256])
def test_gated_tiles_fit_an_sm90_in_shared_memory_at_every_size(num_experts):
    """The interpreter has no shared-memory limit: the tiles' pipelined K stages (x rows and gate rows, 2 bytes
    each) must fit the 227 KiB of an H100/H200 SM on their own, with room for the reduction's scratch."""
    from moe_triton.router import GATE_BLOCK_K, GATE_BLOCK_M, gate_chunk, gate_tiles

    for m in (1, 16, 17, 200, 256, 4096):
        for h in (64, 2048, 2880, 7168):
            t = gate_tiles(m, num_experts, h, 132)
            assert (t.split - 1) * gate_chunk(h, t.split) < h <= t.split * gate_chunk(h, t.split), (m, h, t)
            assert t.num_stages * (GATE_BLOCK_M + t.block_e) * GATE_BLOCK_K * 2 <= 200 * 1024, (m, t)
            assert t.block_e >= max(16, num_experts) and 1 <= t.split <= -(-h // GATE_BLOCK_K), (m, h, t)
            assert t.split == 1 or -(-m // GATE_BLOCK_M) * t.split <= 132  # counters: one per SM at most


def test_gate_max_tokens_switch_sends_larger_batches_to_the_logits_path(monkeypatch):
    from moe_triton import router

    calls, linear = [], F.linear
    monkeypatch.setattr(router.F, "linear", lambda *a: calls.append(a[0].shape[0]) or linear(*a))
    gen = torch.Generator().manual_seed(13)
    x = torch.randn(20, 64, generator=gen).to(DEVICE)
    w = torch.randn(8, 64, generator=gen).to(DEVICE)
    kernel = _gated_kernel(2)
    for limit, logits_path in ((256, False), (19, True), (20, False), (0, True)):
        calls.clear()
        with switches.override(gate_max_tokens=limit):
            ids, weights = kernel(x, w, None)
        assert calls == ([20] if logits_path else []), limit
        _same_gated_choice(x, w, None, ids, weights, 2, True)


def test_gated_kernel_splits_k_over_several_row_blocks(monkeypatch):
    """Each row block has its own arrival counter: 40 tokens in three 16-row blocks, K split in two or more
    (on the CPU, as if the interpreter had 8 SMs)."""
    from moe_triton import router

    monkeypatch.setattr(router, "INTERPRETER_SMS", 8)
    gen = torch.Generator().manual_seed(12)
    x = torch.randn(40, 384, generator=gen).to(DEVICE)
    w = (torch.randn(32, 384, generator=gen) / 20).to(DEVICE)
    kernel = _gated_kernel(4)
    for _ in range(2):
        ids, weights = kernel(x, w, None)
        _same_gated_choice(x, w, None, ids, weights, 4, True)
    assert kernel._counters and all(int(c.abs().sum()) == 0 for c in kernel._counters.values())  # split, reset


def test_gated_kernel_reads_strided_operands_weighs_sigmoid_top1_and_handles_no_tokens():
    gen = torch.Generator().manual_seed(11)
    x = torch.randn(64, 24, generator=gen).to(DEVICE).t()  # [24, 64], a column-major view
    w = torch.randn(64, 16, generator=gen).to(DEVICE).t()  # [16, 64]
    ids, weights = _gated_kernel(3)(x, w, None)
    _same_gated_choice(x, w, None, ids, weights, 3, True)
    ids, weights = _gated_kernel(1, True, sigmoid_weight=True)(x, w, None)
    _same_gated_choice(x, w, None, ids, weights, 1, True, sigmoid_weight=True)
    ids, weights = _gated_kernel(2)(x[:0], w, None)
    assert ids.shape == weights.shape == (0, 2)


def test_gated_kernel_offered_for_softmax_and_sigmoid_top1_when_both_switches_are_on():
    from moe_triton.router import GatedSoftmaxTopKRouter

    op = _op(8)
    assert isinstance(op.gated_router(SoftmaxTopK(2, False)), GatedSoftmaxTopKRouter)
    assert op.gated_router(SigmoidTop1()).sigmoid_weight
    assert op.gated_router(GroupedTopK(top_k=2, n_group=1, topk_group=1)) is None
    assert _op(512).gated_router(SoftmaxTopK(2)) is None  # wider than the kernel's accumulator
    for off in ({"fused_gate": False}, {"fused_router": False}):
        with switches.override(**off):
            assert op.gated_router(SoftmaxTopK(2)) is None


def test_layer_takes_the_gate_into_the_kernel_and_matches_torch_routing():
    cfg = MoeConfig(8, 2, 64, 32, quant_scheme="fp32", dtype=torch.float32)
    weights = random_weights(cfg, DEVICE, seed=3)
    gen = torch.Generator().manual_seed(4)
    gate, bias = torch.randn(8, 64, generator=gen).to(DEVICE), torch.randn(8, generator=gen).to(DEVICE)
    gated = MoeLayer(cfg, weights, HFRouter(gate, bias, SoftmaxTopK(2)), backend="triton", cuda_graph_max_tokens=0)
    with switches.override(fused_gate=False):
        logits_only = MoeLayer(cfg, weights, HFRouter(gate, bias, SoftmaxTopK(2)), backend="triton",
                               cuda_graph_max_tokens=0)  # fmt: skip
    plain = MoeLayer(cfg, weights, HFRouter(gate, bias, SoftmaxTopK(2)), backend="triton", fused_routing=False,
                     cuda_graph_max_tokens=0)  # fmt: skip
    assert gated.fused_router.takes_gate and not logits_only.fused_router.takes_gate
    x = torch.randn(19, 64, generator=gen).to(DEVICE)
    torch.testing.assert_close(gated(x), plain(x), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(logits_only(x), plain(x), rtol=1e-5, atol=1e-5)


@requires_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("m, num_experts, top_k", [(1, 128, 8), (64, 128, 4), (2048, 128, 8), (2048, 8, 2)])
def test_kernel_matches_torch_routing_on_bf16_logits(m, num_experts, top_k):
    """bf16 logits: ties between experts are common (8 bits of mantissa), hence the tie-tolerant comparison."""
    logits = torch.randn(m, num_experts, generator=torch.Generator().manual_seed(m)).to("cuda", torch.bfloat16)
    for renormalize in (True, False):
        ids, weights = _kernel(top_k, renormalize)(logits)
        _same_choice(logits, ids, weights, top_k, renormalize)


@requires_cuda
@pytest.mark.gpu
def test_kernel_runs_inside_a_cuda_graph():
    logits = torch.randn(64, 128, device="cuda", dtype=torch.bfloat16)
    kernel = _kernel(8)
    kernel(logits)  # compiled outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ids, weights = kernel(logits)
    logits.copy_(torch.randn(64, 128, device="cuda", dtype=torch.bfloat16))
    graph.replay()
    _same_choice(logits, ids, weights, 8, True)


@requires_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 64, 2048])
@pytest.mark.parametrize("num_experts, hidden, top_k, bias", [(128, 2048, 8, False), (128, 2880, 4, True)])
def test_gated_kernel_matches_torch_routing_at_real_gate_shapes(m, num_experts, hidden, top_k, bias):
    """Qwen3-30B-A3B's and gpt-oss-120b's gates in bf16, at decode (K split) and prefill."""
    gen = torch.Generator().manual_seed(m)
    x = torch.randn(m, hidden, generator=gen).to("cuda", torch.bfloat16)
    w = (torch.randn(num_experts, hidden, generator=gen) / hidden**0.5).to("cuda", torch.bfloat16)
    b = torch.randn(num_experts, generator=gen).to("cuda", torch.bfloat16) if bias else None
    kernel = _gated_kernel(top_k)
    for _ in range(2):  # the second launch finds the counters the first left
        ids, weights = kernel(x, w, b)
        _same_gated_choice(x, w, b, ids, weights, top_k, True)


@requires_cuda
@pytest.mark.gpu
def test_gated_kernel_runs_inside_a_cuda_graph():
    x = torch.randn(4, 2048, device="cuda", dtype=torch.bfloat16)  # one row block: the K split
    w = torch.randn(128, 2048, device="cuda", dtype=torch.bfloat16) / 45
    kernel = _gated_kernel(8)
    kernel(x, w, None)  # compiled, and its counters allocated, outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ids, weights = kernel(x, w, None)
    for seed in range(3):
        x.copy_(torch.randn(4, 2048, generator=torch.Generator().manual_seed(seed)).to("cuda", torch.bfloat16))
        graph.replay()
        _same_gated_choice(x, w, None, ids, weights, 8, True)
