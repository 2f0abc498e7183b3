"""``moe_core.timing``: one runner at one token count (``time_runner``), interleaving, cold weights, spread."""

from __future__ import annotations

import collections

import pytest
import torch
from dense_op import DenseOp

from moe_core import MoeConfig, MoeRunner, bench_rows, timing
from moe_core.backends.torch.fused_op import TorchFusedOp
from moe_core.bench_rows import BenchRow, mark_fastest, measure_ceilings
from moe_core.synthetic import random_weights
from moe_core.timing import (
    CPU_CACHE_BYTES,
    RunnerTimer,
    Timing,
    cache_size,
    cold_copies,
    expert_bytes,
    time_forward,
    time_interleaved,
    time_runner,
)


def tiny_config(dtype=torch.float32) -> MoeConfig:
    return MoeConfig(num_experts=8, top_k=2, hidden_size=64, intermediate_size=32, quant_scheme="fp32", dtype=dtype)


class TripleTorch(TorchFusedOp):
    """The torch reference doing its whole forward three times: clearly slower, same result."""

    name = "triple_torch"

    def apply(self, hidden_states, topk_ids, topk_weights, prepared, out=None):
        for _ in range(3):
            result = super().apply(hidden_states, topk_ids, topk_weights, prepared, out)
        return result


#: apply calls per prepared weights object (which copy a call read)
CALLS: collections.Counter = collections.Counter()


class CountingTorch(TorchFusedOp):
    name = "counting_torch"

    def apply(self, hidden_states, topk_ids, topk_weights, prepared, out=None):
        CALLS[id(prepared.w13)] += 1
        return super().apply(hidden_states, topk_ids, topk_weights, prepared, out)


def test_timing_spread_is_min_median_p90():
    t = Timing.of([10.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0], "cpu")
    assert (t.min_us, t.median_us, t.samples) == (1.0, 5.5, 10)
    assert t.p90_us == pytest.approx(9.1)  # linear interpolation between ranks, as numpy
    one = Timing.of([3.0], "cpu")
    assert one.min_us == one.median_us == one.p90_us == 3.0
    with pytest.raises(ValueError):
        Timing.of([], "cpu")


def test_time_runner_on_cpu():
    config = tiny_config()
    weights = random_weights(config)
    runner = MoeRunner(config, weights, backend="torch")
    t = time_runner(config, weights, runner, 4, "cpu", repeat=7)
    assert t.samples == 7 and t.how == "cpu" and t.weights == "hot" and t.copies == 1 and t.note == ""
    assert 0 < t.min_us <= t.median_us <= t.p90_us
    timer = RunnerTimer(config, weights, runner, 4, "cpu")
    assert t.reuse_bytes == timer.experts_hit * expert_bytes(config, weights) > 0
    timer.close()


def test_two_backends_of_clearly_different_cost_rank_the_same_in_two_runs():
    config = tiny_config()
    weights = random_weights(config)
    fast = MoeRunner(config, weights, backend="torch")
    slow = MoeRunner(config, weights, backend=TripleTorch)
    assert bench_rows.rank_by("cpu") == "min_us" and bench_rows.rank_by("cuda") == "time_us"
    for _ in range(2):
        timers = [RunnerTimer(config, weights, r, 16, "cpu") for r in (slow, fast)]
        slow_t, fast_t = time_interleaved(timers, 15)
        for t in timers:
            t.close()
        assert slow_t.samples == fast_t.samples == 15
        # three times the work: ranked by the fastest sample (what a CPU's one-sided noise leaves alone)
        assert slow_t.min_us > 1.5 * fast_t.min_us


def test_a_sample_is_a_group_of_calls_of_about_a_millisecond():
    import time

    sampler = timing._Sampler([lambda: None], "cpu")  # a no-op: the largest group
    assert sampler.group == timing.MAX_GROUP["cpu"]
    sampler = timing._Sampler([lambda: time.sleep(3e-4)], "cpu")  # >= 0.3 ms a call: at most 4 to a sample
    assert 1 <= sampler.group <= 4
    assert sampler.sample() >= 300


def test_interleaving_rotates_the_first_timer_each_round():
    order = []

    class Fake:
        def __init__(self, name):
            self.name = name

        def sample(self):
            order.append(self.name)

        def timing(self):
            return self.name

    assert time_interleaved([Fake("a"), Fake("b"), Fake("c")], 4) == ["a", "b", "c"]
    assert "".join(order) == "abc" + "bca" + "cab" + "abc"


def test_fastest_and_within_noise():
    def row(backend, median, lo, p90, tokens=1):
        return BenchRow("tiny", backend, "bf16", tokens, median, "cpu", 2, 1, 1, 1.0, None, None, lo, p90, 10)

    rows = [row("a", 100, 90, 120), row("b", 110, 105, 130), row("c", 300, 250, 350), row("a", 5, 4, 6, tokens=8)]
    mark_fastest(rows, "time_us")  # a GPU's: medians, within noise up to the fastest one's p90
    assert [(r.vs_fastest, r.within_noise) for r in rows] == [(1.0, True), (1.1, True), (3.0, False), (1.0, True)]
    mark_fastest(rows, "min_us")  # a CPU's: minima, within noise up to the fastest one's median
    assert [(r.vs_fastest, r.within_noise) for r in rows] == [
        (1.0, True),
        (pytest.approx(105 / 90), False),
        (pytest.approx(250 / 90), False),
        (1.0, True),
    ]
    rows[1].min_us = 99
    mark_fastest(rows, "min_us")
    assert rows[1].within_noise is True


def test_cold_rotates_through_copies_that_exceed_the_cache():
    config = tiny_config()
    weights = random_weights(config)
    runner = MoeRunner(config, weights, backend=CountingTorch)
    weight_bytes = config.top_k * expert_bytes(config, weights)  # one token reads its top_k experts
    cache = 2 * weight_bytes  # so four copies put twice the cache between two reads of one copy
    with RunnerTimer(config, weights, runner, 1, "cpu", cold=True, cache_bytes=cache) as timer:
        assert timer.experts_hit == config.top_k
        assert timer.copies == cold_copies(weight_bytes, cache) == 4
        assert timer.reuse_bytes == 4 * weight_bytes >= timing.COLD_FACTOR * cache and timer.note == ""
        copies = [runner, *timer._copies]
        # every copy its own storage, the same values, the same fused op
        assert len({r.prepared.w13.data_ptr() for r in copies}) == timer.copies
        assert all(type(r.fused_op) is CountingTorch for r in copies)
        assert all(torch.equal(r.prepared.w13, weights.w13) for r in copies)
        CALLS.clear()
        for _ in range(6):
            timer.sample()
        t = timer.timing()
    assert t.weights == "cold" and t.copies == 4 and t.reuse_bytes == timer.reuse_bytes
    # every copy was read, and evenly: the rotation continues across samples (+1: the untimed call a sample
    # takes when another timer sampled last)
    counts = [CALLS[id(r.prepared.w13)] for r in copies]
    assert min(counts) >= 1 and max(counts) - min(counts) <= 1
    assert sum(counts) - 6 * t.calls_per_sample in (0, 1)


def test_cold_copies_are_capped_by_max_copies_and_memory(monkeypatch):
    config = tiny_config()
    weights = random_weights(config)
    runner = MoeRunner(config, weights, backend="torch")
    t = time_runner(config, weights, runner, 1, "cpu", repeat=2, cold=True, cache_bytes=1 << 20, max_copies=3)
    assert t.copies == 3 and "max_copies=3" in t.note and "MB cache" in t.note
    layer = sum(x.numel() * x.element_size() for x in weights.tensors().values())
    monkeypatch.setattr(timing, "free_bytes", lambda device: int(4.5 * layer / timing.COPY_MEMORY_FRACTION))
    t = time_runner(config, weights, runner, 1, "cpu", repeat=2, cold=True, cache_bytes=1 << 20)
    assert t.copies == 5 and "memory" in t.note  # the original and four copies of the layer fit


def test_cold_copy_count():
    assert cold_copies(0, 1 << 20) == 1
    assert cold_copies(10 << 20, 1 << 20) == 1  # one call already reads twice the cache
    assert cold_copies(1 << 20, 1 << 20) == timing.COLD_FACTOR
    assert cold_copies(3 << 20, 10 << 20) == 7  # 7 x 3 MB >= 2 x 10 MB


def test_cold_with_weights_bigger_than_the_cache_uses_the_runner_alone():
    config = tiny_config()
    weights = random_weights(config)
    runner = MoeRunner(config, weights, backend="torch")
    t = time_runner(config, weights, runner, 8, "cpu", repeat=2, cold=True, cache_bytes=1024)
    assert t.copies == 1 and t.weights == "cold" and t.note == ""


def test_cpu_has_no_ceilings_and_a_default_cache():
    assert measure_ceilings(torch.device("cpu")) is None
    size, source = cache_size(torch.device("cpu"))
    assert size == CPU_CACHE_BYTES and "CPU default" in source


def test_time_forward_keeps_its_shape():
    calls = []
    us, how = time_forward(lambda: calls.append(1), "cpu", repeat=3, warmup=2)
    assert how == "cpu" and us > 0 and len(calls) >= 2 + 3


on_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.gpu
@on_gpu
def test_cuda_graph_hot_and_cold():
    config = MoeConfig(num_experts=8, top_k=2, hidden_size=256, intermediate_size=512, quant_scheme="fp32",
                       dtype=torch.float32)  # fmt: skip
    weights = random_weights(config, "cuda")
    runner = MoeRunner(config, weights, backend=DenseOp)
    hot = time_runner(config, weights, runner, 4, "cuda", repeat=5)
    assert hot.how == "cuda-graph" and hot.copies == 1 and 0 < hot.min_us <= hot.median_us <= hot.p90_us
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    assert cache_size(torch.device("cuda"))[0] == l2 > 0
    with RunnerTimer(config, weights, runner, 4, "cuda", cold=True) as timer:
        assert timer.how == "cuda-graph" and timer.copies == len(timer._sampler._graphs) > 1
        assert timer.reuse_bytes >= timing.COLD_FACTOR * l2 or timer.note
        for _ in range(5):
            timer.sample()
        cold = timer.timing()
    assert cold.weights == "cold" and cold.samples == 5
    # the torch reference reads expert counts on the host: eager, between CUDA events
    ref = MoeRunner(config, weights, backend="torch")
    assert time_runner(config, weights, ref, 4, "cuda", repeat=3).how == "cuda-events"
    ceilings = measure_ceilings(torch.device("cuda"))
    assert ceilings.copy_bytes_per_s > 1e11 and ceilings.matmul_flops_per_s > 1e12
