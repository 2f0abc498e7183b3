"""The rows of ``moe bench``: a measurement (``moe_core.timing``) with its bytes, flops, roofline and rank.

Method (docs/design.md, "Performance method"): count the bytes the forward must move (the weights of the
experts actually hit, plus input and output) and the flops (2*M*k*3*H*I), turn each into a floor time with the
device's *measured* copy bandwidth and matmul rate, and report the measured time against the larger floor.
Rows of one preset, M and weights are ranked by one statistic per device type (``rank_by``), which
``moe select`` uses too.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch

from moe_core.config import MoeConfig
from moe_core.timing import RunnerTimer, Timing
from moe_core.weights import MoeWeights


@dataclass(frozen=True)
class DeviceCeilings:
    """Measured peak rates of the device, the denominators of every roofline."""

    name: str
    copy_bytes_per_s: float
    matmul_flops_per_s: float


@dataclass
class BenchRow:
    """One row of ``moe bench``; ``time_us`` is the median. ``floor_us`` / ``roofline_fraction`` are None
    without ceilings (a CPU); ``vs_fastest`` / ``within_noise`` compare the row with the fastest backend of
    the same preset, M and weights (``mark_fastest``, by the statistic ``rank_by`` names)."""

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
    floor_us: float | None
    roofline_fraction: float | None
    min_us: float = 0.0
    p90_us: float = 0.0
    samples: int = 0
    calls_per_sample: int = 1
    weights: str = "hot"
    weight_copies: int = 1
    reuse_bytes: int | None = None
    distribution: str | None = None
    vs_fastest: float | None = None
    within_noise: bool | None = None
    note: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_ceilings(device: torch.device) -> DeviceCeilings | None:
    """Copy bandwidth (bytes read + written) and bf16 matmul rate of a CUDA device, measured now; None on a CPU.

    Why no CPU roofline: what ``moe bench`` runs on a CPU is the toy presets through the torch reference (and
    plugins' stand-ins), a few hundred kB of weights per call, bound by Python and op dispatch (µs per op),
    neither by memory nor by arithmetic, so a "fraction of the roofline" would be a fraction of a percent that
    says nothing. A CPU's peak also depends on the dtype (bf16 matmul without AMX is emulated, hundreds of
    times below fp32 on some parts), the thread count and which cache level a size lands in, so no single
    measured matmul is *the* ceiling (the 1024-wide fp32 one once printed as "0.0 TFLOP/s"). ``moe bench``
    therefore reports the CPU's times, spread and achieved bandwidth, and null ceilings and roofline.
    """
    device = torch.device(device)
    if device.type != "cuda":
        return None
    with torch.cuda.device(device):
        name = torch.cuda.get_device_name(device)
        n_bytes, dim = 2 << 30, 8192
        src = torch.empty(n_bytes, dtype=torch.uint8, device=device).fill_(1)
        dst = torch.empty_like(src)
        copy_s = _best_seconds(lambda: dst.copy_(src), device, 5)
        a = torch.randn(dim, dim, device=device, dtype=torch.bfloat16)
        b = torch.randn(dim, dim, device=device, dtype=torch.bfloat16)
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


def make_row(
    preset: str,
    backend: str,
    config: MoeConfig,
    timer: RunnerTimer,
    timing: Timing,
    ceilings: DeviceCeilings | None,
    distribution: str | None = None,
) -> BenchRow:
    """A bench row from a timer's work counts and its ``Timing``; no roofline without ``ceilings``."""
    t_us = timing.median_us
    floor_us = None
    if ceilings is not None:
        floor_us = 1e6 * max(timer.bytes_moved / ceilings.copy_bytes_per_s, timer.flops / ceilings.matmul_flops_per_s)
    return BenchRow(
        preset=preset,
        backend=backend,
        scheme=config.quant_scheme,
        tokens=timer.tokens,
        time_us=t_us,
        timing=timing.how,
        experts_hit=timer.experts_hit,
        bytes_moved=timer.bytes_moved,
        flops=timer.flops,
        achieved_gb_s=timer.bytes_moved / (t_us * 1e-6) / 1e9,
        floor_us=floor_us,
        roofline_fraction=None if floor_us is None else floor_us / t_us,
        min_us=timing.min_us,
        p90_us=timing.p90_us,
        samples=timing.samples,
        calls_per_sample=timing.calls_per_sample,
        weights=timing.weights,
        weight_copies=timing.copies,
        reuse_bytes=timing.reuse_bytes,
        distribution=distribution,
        note=timing.note,
    )


#: the statistic rows are ranked by, per device type (``mark_fastest``): see ``rank_by``
RANK_BY = {"cuda": "time_us", "cpu": "min_us"}
#: a row is within noise of the fastest when its ranking statistic is at most the fastest row's next one up
_NOISE_BOUND = {"min_us": "time_us", "time_us": "p90_us"}


def rank_by(device) -> str:
    """The row field backends are ranked by on ``device``: the median (``time_us``) on a GPU, where graph
    replays are steady; the fastest sample (``min_us``) on a CPU, where noise (another process, an interrupt, a
    descheduled thread) only ever adds time, so the fastest of many samples is the steadiest estimate of what
    a call costs (the argument of Python's ``timeit``) — a busy CPU moves medians far more than minima."""
    return RANK_BY.get(torch.device(device).type, "time_us")


#: the ``Timing`` field behind each row statistic of ``RANK_BY``
_TIMING_FIELD = {"time_us": "median_us", "min_us": "min_us"}


def rank_field(device) -> str:
    """``rank_by(device)`` as the ``Timing`` field that holds it (``median_us`` / ``min_us``)."""
    return _TIMING_FIELD[rank_by(device)]


def mark_fastest(rows: Sequence[BenchRow], by: str = "time_us") -> None:
    """Set ``vs_fastest`` (the row's ``by`` statistic over the fastest row's) and ``within_noise`` on every row,
    per (preset, scheme, M, weights). Within noise: the row's ``by`` is at most the fastest row's next statistic
    up (its median when ranking by the min, its p90 when ranking by the median), i.e. inside its spread."""
    bound = _NOISE_BOUND[by]
    groups: dict[tuple, list[BenchRow]] = {}
    for row in rows:
        groups.setdefault((row.preset, row.scheme, row.tokens, row.weights), []).append(row)
    for group in groups.values():
        best = min(group, key=lambda r: getattr(r, by))
        for row in group:
            row.vs_fastest = getattr(row, by) / getattr(best, by)
            row.within_noise = row is best or getattr(row, by) <= getattr(best, bound)


def bench_row(
    preset: str,
    backend: str,
    config: MoeConfig,
    weights: MoeWeights,
    runner,
    tokens: int,
    ceilings: DeviceCeilings | None,
    device: torch.device,
    repeat: int = 20,
    seed: int = 1,
    *,
    cold: bool = False,
    use_graph: bool = True,
) -> BenchRow:
    """One runner at one token count as a bench row (``time_runner`` and ``make_row``)."""
    with RunnerTimer(config, weights, runner, tokens, device, cold=cold, use_graph=use_graph, seed=seed) as timer:
        for _ in range(repeat):
            timer.sample()
        return make_row(preset, backend, config, timer, timer.timing(), ceilings, getattr(runner, "distribution", None))
