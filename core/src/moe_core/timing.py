"""Benchmark runner behind ``moe bench``: bytes, flops, timing, roofline.

Method (DESIGN.md, "Performance method"): count the bytes the forward must
move (the weights of the experts actually hit, plus input and output) and the
flops (2*M*k*3*H*I), turn each into a floor time with the device's *measured*
copy bandwidth and matmul rate, and report the measured time against the
larger floor. On CUDA a forward is captured in a CUDA graph and replayed
(eager launch overhead dominates small MoE calls); a backend whose forward
cannot be captured (the torch reference synchronises with the host) is timed
eagerly with CUDA events, and the row says so.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass

import torch

from moe_core.config import MoeConfig
from moe_core.weights import MoeWeights


@dataclass(frozen=True)
class DeviceCeilings:
    """Measured peak rates of the device, the denominators of every roofline."""

    name: str
    copy_bytes_per_s: float
    matmul_flops_per_s: float


@dataclass
class BenchRow:
    preset: str
    backend: str
    scheme: str
    tokens: int
    time_us: float
    timing: str  # "cuda-graph", "cuda-events", "cpu"
    experts_hit: int
    bytes_moved: int
    flops: int
    achieved_gb_s: float
    floor_us: float
    roofline_fraction: float

    def as_dict(self) -> dict:
        return asdict(self)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_ceilings(device: torch.device) -> DeviceCeilings:
    """Copy bandwidth (bytes read + written) and matmul rate, measured now."""
    device = torch.device(device)
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        n_bytes, dim, dtype = 2 << 30, 8192, torch.bfloat16
    else:
        name = "cpu"
        n_bytes, dim, dtype = 256 << 20, 1024, torch.float32
    src = torch.empty(n_bytes, dtype=torch.uint8, device=device).fill_(1)
    dst = torch.empty_like(src)
    copy_s = _best_seconds(lambda: dst.copy_(src), device, 5)
    a = torch.randn(dim, dim, device=device).to(dtype)
    b = torch.randn(dim, dim, device=device).to(dtype)
    mm_s = _best_seconds(lambda: a @ b, device, 5)
    return DeviceCeilings(name, 2 * n_bytes / copy_s, 2 * dim**3 / mm_s)


def _best_seconds(fn, device, repeat: int) -> float:
    fn()
    _sync(device)
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        _sync(device)
        best = min(best, time.perf_counter() - t0)
    return best


def expert_bytes(config: MoeConfig, weights: MoeWeights) -> int:
    """Bytes of one expert's stored weights, scales and biases."""
    return sum(t.numel() * t.element_size() for t in weights.tensors().values()) // config.num_experts


def work(config: MoeConfig, weights: MoeWeights, topk_ids: torch.Tensor) -> tuple[int, int, int]:
    """(experts hit, bytes that must move, flops) for one forward."""
    m = topk_ids.shape[0]
    hit = int(torch.unique(topk_ids).numel()) if m else 0
    act_bytes = 2 * m * config.hidden_size * torch.tensor([], dtype=config.dtype).element_size()
    flops = 2 * m * config.top_k * 3 * config.hidden_size * config.intermediate_size
    return hit, hit * expert_bytes(config, weights) + act_bytes, flops


def time_forward(fn, device: torch.device, repeat: int = 20, warmup: int = 3, use_graph: bool = True):
    """Median microseconds per call of ``fn`` and how it was timed.

    CUDA: graph replays when capture works, in groups long enough (>= ~1 ms)
    that event overhead vanishes; else events around eager calls. CPU: wall clock.
    """
    device = torch.device(device)
    if device.type != "cuda":
        for _ in range(warmup):
            fn()
        samples = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - t0) * 1e6)
        return statistics.median(samples), "cpu"
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream(device).wait_stream(stream)
    torch.cuda.synchronize(device)
    call, how = fn, "cuda-events"
    if use_graph:
        try:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                fn()
            graph.replay()
            torch.cuda.synchronize(device)
            call, how = graph.replay, "cuda-graph"
        except Exception:
            torch.cuda.synchronize(device)
    # size a group of calls to about a millisecond
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    call()
    end.record()
    end.synchronize()
    one_ms = max(start.elapsed_time(end), 1e-3)
    group = max(1, min(200, int(1.0 / one_ms)))
    samples = []
    for _ in range(repeat):
        start.record()
        for _ in range(group):
            call()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3 / group)
    return statistics.median(samples), how


def bench_row(
    preset: str,
    backend: str,
    config: MoeConfig,
    weights: MoeWeights,
    runner,
    tokens: int,
    ceilings: DeviceCeilings,
    device: torch.device,
    repeat: int = 20,
    seed: int = 1,
) -> BenchRow:
    from moe_core.synthetic import random_inputs

    x, ids, tw = random_inputs(config, tokens, device, seed=seed)
    out = torch.empty(tokens, config.hidden_size, dtype=config.dtype, device=device)
    t_us, how = time_forward(lambda: runner(x, ids, tw, out=out), device, repeat=repeat)
    hit, nbytes, flops = work(config, weights, ids)
    floor_s = max(nbytes / ceilings.copy_bytes_per_s, flops / ceilings.matmul_flops_per_s)
    return BenchRow(
        preset=preset,
        backend=backend,
        scheme=config.quant_scheme,
        tokens=tokens,
        time_us=t_us,
        timing=how,
        experts_hit=hit,
        bytes_moved=nbytes,
        flops=flops,
        achieved_gb_s=nbytes / (t_us * 1e-6) / 1e9,
        floor_us=floor_s * 1e6,
        roofline_fraction=floor_s * 1e6 / t_us,
    )
