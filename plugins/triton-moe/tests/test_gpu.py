"""CUDA-only properties: graph capture and torch.compile match eager. Run on the H200."""

from __future__ import annotations

import pytest
import torch

from moe_core import MoeConfig, MoeRunner
from moe_core.synthetic import random_inputs, random_weights

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (runs on the H200)"),
]

CASES = [
    ("bf16", "silu", False, 33),
    ("fp8_block", "silu", False, 33),
    ("mxfp4", "swiglu_oai", True, 33),
    # M=1 on this shape makes GEMM1 too small for the SMs: the automatic split-K path runs
    ("bf16", "silu", False, 1),
    ("fp8_block", "silu", False, 1),
    ("mxfp4", "swiglu_oai", True, 1),
]


def _runner(scheme, activation, bias, m=33):
    cfg = MoeConfig(16, 4, 512, 256, quant_scheme=scheme, activation=activation, has_bias=bias, dtype=torch.bfloat16)
    runner = MoeRunner(cfg, random_weights(cfg, "cuda"), backend="triton")
    return runner, random_inputs(cfg, m, "cuda")


def _captured(runner, x, ids, tw):
    """(CUDA graph of one forward into ``out``, ``out`` zeroed): warmed up on a side stream, then captured."""
    out = torch.empty(x.shape[0], runner.config.hidden_size, dtype=x.dtype, device=x.device)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        runner(x, ids, tw, out=out)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        runner(x, ids, tw, out=out)
    out.zero_()
    return graph, out


def test_decode_shape_uses_split_k_when_automatic_split_is_on():
    from moe_triton import kernel_configs, switches

    cfg = kernel_configs.select_config("bf16", 16, 512, 256, 4, 1, "cuda")
    with switches.override(auto_split_k=True):
        assert kernel_configs.resolve_split_k("bf16", 16, 512, 256, 4, 1, cfg, "cuda") > 1


@pytest.mark.parametrize("scheme,activation,bias,m", CASES)
def test_cuda_graph_replay_matches_eager(scheme, activation, bias, m):
    runner, (x, ids, tw) = _runner(scheme, activation, bias, m)
    eager = runner(x, ids, tw).clone()
    graph, out = _captured(runner, x, ids, tw)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager)
    # new routing written into the captured buffers is honoured by the replay
    ids.copy_(torch.flip(ids, dims=[0]))
    x.copy_(torch.flip(x, dims=[0]))
    tw.copy_(torch.flip(tw, dims=[0]))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, torch.flip(eager, dims=[0]))


@pytest.mark.parametrize("scheme,activation,bias,m", CASES)
def test_torch_compile_fullgraph_matches_eager(scheme, activation, bias, m):
    runner, (x, ids, tw) = _runner(scheme, activation, bias, m)
    eager = runner(x, ids, tw)

    @torch.compile(fullgraph=True)
    def forward(x, ids, tw):
        return runner(x * 1.0, ids, tw) + 0.0

    compiled = forward(x, ids, tw)
    torch.testing.assert_close(compiled, eager, rtol=0, atol=0)


@pytest.mark.parametrize("scheme,activation,bias,m", [*CASES, ("bf16", "silu", False, 700)])  # 700: two-kernel align
def test_programmatic_dependent_launch_matches_plain_launches(scheme, activation, bias, m):
    """The pdl switch (every kernel waits for its predecessor in its first statement): bitwise the same
    output, eager and in a CUDA graph (with fp8_block also through the once-per-forward quantization)."""
    from moe_triton import launch, switches
    from moe_triton.kernel_configs import KernelConfig

    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("programmatic dependent launch needs SM90+")
    with switches.override(fp8_prequant=scheme == "fp8_block", pdl=False):
        runner, (x, ids, tw) = _runner(scheme, activation, bias, m)
        plain = runner(x, ids, tw).clone()
        tuned = KernelConfig(pdl=True)  # a table entry's choice applies where the switch is unset
        assert launch.pdl_kwargs(x.device, switches.Switches(), tuned) == {"PDL": True, "launch_pdl": True}
        assert launch.pdl_kwargs(x.device, switches.Switches(pdl=False), tuned) == {}
        with switches.override(pdl=True):
            assert launch.pdl_kwargs(x.device) == {"PDL": True, "launch_pdl": True}
            assert torch.equal(runner(x, ids, tw), plain)
            graph, out = _captured(runner, x, ids, tw)
        for _ in range(3):
            graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, plain)


# expert ids outside [0, E) on a qwen3-30b-a3b-like layer (E=128, k=8): M=8 aligns in one program, M=4096 in two
QWEN3_CASES = [
    (s, a, m) for s, a in (("bf16", "silu"), ("fp8_block", "silu"), ("mxfp4", "swiglu_oai")) for m in (8, 4096)
]


def _qwen3_like(scheme, activation, m):
    """(runner without the id check, weights, inputs, ids with -1 / E / 10**6 in some pairs, every slot of
    every 11th token among them)."""
    cfg = MoeConfig(128, 8, 2048, 768, quant_scheme=scheme, activation=activation, has_bias=scheme == "mxfp4",
                    dtype=torch.bfloat16)  # fmt: skip
    weights = random_weights(cfg, "cuda")
    runner = MoeRunner(cfg, weights, backend="triton", check_expert_ids=False)
    x, ids, tw = random_inputs(cfg, m, "cuda")
    bad = ids.clone()
    bad[::3, 0] = -1
    bad[1::5, 7] = 128
    bad[2::7, 3] = 10**6
    bad[4::11] = -1
    return runner, weights, (x, bad, tw)


@pytest.mark.parametrize("scheme,activation,m", QWEN3_CASES)
def test_invalid_expert_ids_contribute_zero(scheme, activation, m):
    from moe_core.reference import reference_for
    from moe_core.tolerances import relative_l2, tolerance

    runner, weights, (x, bad, tw) = _qwen3_like(scheme, activation, m)
    out = runner(x, bad, tw)
    assert torch.isfinite(out).all()
    valid = (bad >= 0) & (bad < 128)
    dropped = reference_for(runner.config, weights, x, torch.where(valid, bad, 0), torch.where(valid, tw, 0.0))
    assert relative_l2(out, dropped) <= tolerance(scheme, torch.bfloat16)
    assert not out[4::11].any()
    assert not runner(x, torch.full_like(bad, -1), tw).any()


@pytest.mark.parametrize("scheme,activation,m", QWEN3_CASES)
def test_cuda_graph_replay_with_invalid_expert_ids(scheme, activation, m):
    runner, _, (x, bad, tw) = _qwen3_like(scheme, activation, m)
    eager = runner(x, bad, tw).clone()
    graph, out = _captured(runner, x, bad, tw)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager)
    flipped = torch.flip(bad, dims=[0])
    flipped[:, 1] = 10**6  # other invalid pairs written into the captured buffer
    expected = runner(x, flipped, tw).clone()
    bad.copy_(flipped)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, expected) and torch.isfinite(out).all()
    bad.fill_(-1)
    graph.replay()
    torch.cuda.synchronize()
    assert not out.any()


@pytest.mark.parametrize("scheme,activation,bias,m", CASES)
def test_moe_layer_graph_replay_equals_its_eager_forward(scheme, activation, bias, m):
    """``MoeLayer`` replays forwards of few tokens from its own CUDA graphs (``moe_core.graphs``): bit for bit
    what the same layer computes with graphs off, shared experts (on triton too) included."""
    from moe_core import MoeLayer, SharedExperts
    from moe_core.routing import softmax_topk

    cfg = MoeConfig(16, 4, 512, 256, quant_scheme=scheme, activation=activation, has_bias=bias, dtype=torch.bfloat16)
    weights = random_weights(cfg, "cuda")
    gen = torch.Generator(device="cuda").manual_seed(0)
    gate = torch.randn(16, 512, device="cuda", dtype=torch.bfloat16, generator=gen) * 512**-0.5
    shared = SharedExperts(
        torch.randn(2 * 128, 512, device="cuda", dtype=torch.bfloat16, generator=gen) * 512**-0.5,
        torch.randn(512, 128, device="cuda", dtype=torch.bfloat16, generator=gen) * 128**-0.5,
        gate=torch.randn(1, 512, device="cuda", dtype=torch.bfloat16, generator=gen) * 512**-0.5,
    )

    def router(x):
        return softmax_topk(x @ gate.T, 4)

    graphed, eager = (
        MoeLayer(cfg, weights, router, shared=shared, backend="triton", cuda_graph_max_tokens=n) for n in (256, 0)
    )
    assert graphed.shared_backend == "triton"
    with torch.no_grad():
        for seed in range(4):  # eager, capture + replay, replay, replay
            x = torch.randn(m, 512, device="cuda", dtype=torch.bfloat16, generator=gen)
            assert torch.equal(graphed(x), eager(x)), seed
    assert list(graphed.graphs.graphs) == [m] and graphed.graphs.disabled is None
