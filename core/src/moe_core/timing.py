"""Timing a MoE forward, and the rows of ``moe bench``: bytes, flops, spread, roofline.

Method (docs/design.md, "Performance method"): count the bytes the forward must move (the weights of the
experts actually hit, plus input and output) and the flops (2*M*k*3*H*I), turn each into a floor time with the
device's *measured* copy bandwidth and matmul rate, and report the measured time against the larger floor.

**One measurement** is one runner at one token count: ``time_runner(config, weights, runner, tokens, device,
repeat, cold)`` returns a ``Timing`` (median, min and p90 of ``samples`` samples, and how they were taken).
``RunnerTimer`` is the same measurement set up once and sampled on demand, so several runners can be sampled
in turn (``time_interleaved``): a drift of the machine (clock, another process, heat) then lands on every
backend alike instead of on whichever was timed last. ``moe bench`` interleaves its backends per token count.

What a sample is:

- **CUDA**: the forward is captured in a CUDA graph and replayed (eager launch overhead dominates small MoE
  calls); a backend that declares ``FusedOp.capturable = False`` (the torch reference reads expert counts on
  the host) or whose capture fails is timed eagerly, and ``how`` says ``cuda-events`` instead of
  ``cuda-graph``. A sample is a group of calls lasting about a millisecond between two CUDA events, divided
  by the group's size (``calls_per_sample``), so event overhead vanishes.
- **CPU**: the same group of calls (>= ~1 ms) on the wall clock, Python's garbage collector paused; warm-up
  is at least ``warmup`` calls and ~20 ms. The thread count is torch's (``torch.set_num_threads``), left as
  the caller set it.
- A sample taken right after another ``RunnerTimer``'s starts with one untimed call, so interleaving does
  not charge one backend for the caches another one left behind.

**Hot and cold weights.** Replaying one layer's forward re-reads the same weights: at decode they can sit in
the GPU's L2 (gpt-oss-120b's four MXFP4 experts of one token are ~50 MB; an H200's L2 is 60 MB), which is not
how a model of many layers runs — each layer's weights are evicted by the others' before they are read again.
``cold=True`` rotates through copies of the layer's weights, one ``MoeRunner`` per copy built from a clone of
``weights`` with the runner's fused op, enough of them that the weight bytes read between two reads of the
same copy (``reuse_bytes``) are at least ``COLD_FACTOR`` (2) times the cache (``cache_size``: the device's
L2 from ``torch.cuda.get_device_properties(device).L2_cache_size``; on a CPU ``CPU_CACHE_BYTES``, 64 MiB, a
last-level-cache-sized default since torch cannot read a CPU's). The copies are capped by ``max_copies`` and
by half the free memory (the first copy's measured size on CUDA), and ``Timing.note`` says so when a cap
left the reuse distance short. On CUDA each copy gets its own graph (one shared memory pool; they run one at
a time on one stream), and the timed group replays the graphs in turn: one sample is ``calls_per_sample``
calls spread over the copies, divided by that count, so a cold row times exactly the same call as a hot row,
only with its weights out of cache. The inputs, routing and output buffer are shared by the copies (in a
model they come from the previous layer, in cache).
"""

from __future__ import annotations

import gc
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import torch

from moe_core.config import MoeConfig
from moe_core.weights import MoeWeights

#: cold mode's cache size on a CPU, whose size torch cannot read (a last level cache of this order)
CPU_CACHE_BYTES = 64 << 20
#: cold mode seeks a reuse distance of at least this many times the cache
COLD_FACTOR = 2
#: at most this many weight copies in cold mode (default of ``max_copies``)
MAX_COPIES = 64
#: cold copies may take at most this fraction of the device's free memory
COPY_MEMORY_FRACTION = 0.5
#: a sample is a group of calls lasting at least this long
SAMPLE_TARGET_US = 1000.0
#: largest group of calls in one sample, per device type
MAX_GROUP = {"cuda": 200, "cpu": 1000}
#: CPU warm-up lasts at least this long (and at least ``warmup`` calls)
CPU_WARMUP_S = 0.02


@dataclass(frozen=True)
class Timing:
    """One runner at one token count: the spread of ``samples`` samples, in µs per call.

    ``how``: ``cuda-graph``, ``cuda-events`` (eager calls between CUDA events) or ``cpu`` (wall clock);
    ``calls_per_sample``: calls timed together in one sample; ``weights``: ``hot`` (the same weights every
    call) or ``cold`` (rotating over ``copies`` copies); ``reuse_bytes``: weight bytes read between two reads
    of the same weights (one call's when hot); ``note``: why a cold measurement is less cold than asked for,
    else empty."""

    median_us: float
    min_us: float
    p90_us: float
    samples: int
    how: str
    calls_per_sample: int = 1
    weights: str = "hot"
    copies: int = 1
    reuse_bytes: int | None = None
    note: str = ""

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def of(cls, samples_us: Sequence[float], how: str, **fields) -> Timing:
        if not samples_us:
            raise ValueError("a Timing needs at least one sample")
        ordered = sorted(samples_us)
        return cls(
            median_us=_quantile(ordered, 0.5),
            min_us=ordered[0],
            p90_us=_quantile(ordered, 0.9),
            samples=len(ordered),
            how=how,
            **fields,
        )


def _quantile(ordered: Sequence[float], q: float) -> float:
    """Linear interpolation between the closest ranks of sorted ``ordered`` (numpy's default)."""
    pos = q * (len(ordered) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


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


def cache_size(device: torch.device) -> tuple[int, str]:
    """(bytes, where the number comes from) of the cache cold mode must defeat: a CUDA device's L2, else
    ``CPU_CACHE_BYTES``."""
    device = torch.device(device)
    if device.type == "cuda":
        size = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0)
        if size:
            return int(size), "L2 (torch.cuda.get_device_properties)"
        return 64 << 20, "64 MiB (this torch does not report the L2 size)"
    return CPU_CACHE_BYTES, f"{CPU_CACHE_BYTES >> 20} MiB (CPU default: torch cannot read a CPU's cache size)"


def free_bytes(device: torch.device) -> int | None:
    """Free memory of a CUDA device, or the host's available memory (Linux), else None (unknown)."""
    device = torch.device(device)
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


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


def cold_copies(weight_bytes: int, cache_bytes: int) -> int:
    """Weight copies to rotate through so that ``copies * weight_bytes >= COLD_FACTOR * cache_bytes``."""
    if weight_bytes <= 0:
        return 1
    return max(1, math.ceil(COLD_FACTOR * cache_bytes / weight_bytes))


# ---- sampling ----------------------------------------------------------------------------------------------

_last_sampled: object | None = None  # the _Sampler that took the latest sample (interleaving re-warms)


class _Sampler:
    """Samples of a rotating sequence of calls: the i-th call of the whole run is ``calls[i % len(calls)]``."""

    def __init__(self, calls: Sequence[Callable[[], object]], device, *, warmup: int = 3, use_graph: bool = True):
        if not calls:
            raise ValueError("nothing to time")
        self.device = torch.device(device)
        self.samples: list[float] = []
        self.graph_error = ""
        self._cursor = 0
        self._graphs: list = []
        if self.device.type == "cuda":
            with torch.cuda.device(self.device):
                self._calls, self.how = self._cuda_setup(list(calls), max(warmup, 1), use_graph)
                self.group = self._cuda_group()
        else:
            self._calls, self.how = list(calls), "cpu"
            self.group = self._cpu_setup(max(warmup, 1))

    def _cuda_setup(self, calls, warmup: int, use_graph: bool):
        device = self.device
        stream = torch.cuda.Stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):
            for _ in range(warmup):
                for call in calls:
                    call()
        torch.cuda.current_stream(device).wait_stream(stream)
        torch.cuda.synchronize(device)
        if not use_graph:
            return calls, "cuda-events"
        graphs = []
        try:
            pool = None
            for call in calls:
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    call()
                if pool is None:
                    pool = graph.pool()  # every copy's graph in one pool: they replay one at a time
                graphs.append(graph)
            for graph in graphs:
                graph.replay()
            torch.cuda.synchronize(device)
        except Exception as exc:  # a backend that cannot be captured after all: time it eagerly
            torch.cuda.synchronize(device)
            self.graph_error = f"{type(exc).__name__}: {exc}"
            return calls, "cuda-events"
        self._graphs = graphs
        return [g.replay for g in graphs], "cuda-graph"

    def _cuda_group(self) -> int:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for call in self._calls:
            call()
        end.record()
        end.synchronize()
        per_call_us = max(start.elapsed_time(end) * 1e3 / len(self._calls), 1e-3)
        return max(1, min(MAX_GROUP["cuda"], math.ceil(SAMPLE_TARGET_US / per_call_us)))

    def _cpu_setup(self, warmup: int) -> int:
        began = time.perf_counter()
        rounds, fastest = 0, float("inf")
        while True:
            t0 = time.perf_counter()
            for call in self._calls:
                call()
            fastest = min(fastest, time.perf_counter() - t0)  # the fastest round sizes the group: noise-proof
            rounds += 1
            if rounds * len(self._calls) >= warmup and (time.perf_counter() - began >= CPU_WARMUP_S or rounds >= 100):
                break
        per_call_us = max(fastest * 1e6 / len(self._calls), 1e-3)
        return max(1, min(MAX_GROUP["cpu"], math.ceil(SAMPLE_TARGET_US / per_call_us)))

    def _next(self) -> Callable[[], object]:
        call = self._calls[self._cursor % len(self._calls)]
        self._cursor += 1
        return call

    def sample(self) -> float:
        """Take one sample; µs per call."""
        global _last_sampled
        if _last_sampled is not None and _last_sampled is not self:
            self._next()()  # untimed: another timer ran since our last sample
        _last_sampled = self
        calls, n, group = self._calls, len(self._calls), self.group
        first = self._cursor
        gc_was_on = gc.isenabled()
        gc.disable()
        try:
            if self.device.type == "cuda":
                with torch.cuda.device(self.device):
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                    _run_group(calls, n, first, group)
                    end.record()
                    end.synchronize()
                    us = start.elapsed_time(end) * 1e3 / group
            else:
                t0 = time.perf_counter_ns()
                _run_group(calls, n, first, group)
                us = (time.perf_counter_ns() - t0) / 1e3 / group
        finally:
            if gc_was_on:
                gc.enable()
        self._cursor = first + group
        self.samples.append(us)
        return us

    def close(self) -> None:
        global _last_sampled
        if _last_sampled is self:
            _last_sampled = None
        self._graphs = []
        self._calls = []


def _run_group(calls, n: int, first: int, group: int) -> None:
    if n == 1:
        call = calls[0]
        for _ in range(group):
            call()
    else:
        for i in range(first, first + group):
            calls[i % n]()


def time_forward(fn, device: torch.device, repeat: int = 20, warmup: int = 3, use_graph: bool = True):
    """(median µs per call of ``fn``, how it was timed), as ``Timing.median_us`` / ``Timing.how`` of a
    single callable (see the module docstring). For a runner, ``time_runner`` gives the whole spread."""
    sampler = _Sampler([fn], device, warmup=warmup, use_graph=use_graph)
    try:
        for _ in range(repeat):
            sampler.sample()
        timing = Timing.of(sampler.samples, sampler.how)
    finally:
        sampler.close()
    return timing.median_us, timing.how


# ---- one runner at one token count -------------------------------------------------------------------------


class RunnerTimer:
    """One runner at one token count, set up to be sampled (``sample()``), then summarised (``timing()``).

    Set-up: random inputs and routing of ``tokens`` tokens (``moe_core.synthetic.random_inputs``, ``seed``),
    one output buffer, in cold mode the weight copies, then warm-up, CUDA-graph capture where it applies and
    the size of a sample's group of calls. Attributes for a report: ``topk_ids``, ``experts_hit``,
    ``bytes_moved``, ``flops``, ``copies``, ``reuse_bytes``, ``cache_bytes``, ``note``. ``close()`` (or
    leaving a ``with`` block) drops the copies and graphs.
    """

    def __init__(
        self,
        config: MoeConfig,
        weights: MoeWeights,
        runner,
        tokens: int,
        device: torch.device | str | None = None,
        *,
        cold: bool = False,
        use_graph: bool = True,
        seed: int = 1,
        warmup: int = 3,
        cache_bytes: int | None = None,
        max_copies: int = MAX_COPIES,
    ) -> None:
        from moe_core.synthetic import random_inputs

        device = torch.device(device) if device is not None else torch.device(runner.device)
        self.tokens = tokens
        self.cold = cold
        x, ids, tw = random_inputs(config, tokens, device, seed=seed)
        out = torch.empty(tokens, config.hidden_size, dtype=config.dtype, device=device)
        self.topk_ids = ids
        self.experts_hit, self.bytes_moved, self.flops = work(config, weights, ids)
        weight_bytes = self.experts_hit * expert_bytes(config, weights)
        self.cache_bytes = cache_bytes if cache_bytes is not None else cache_size(device)[0]
        self.note = ""
        runners = [runner]
        if cold:
            runners, self.note = _cold_runners(config, weights, runner, weight_bytes, self.cache_bytes, max_copies)
        self._copies = runners[1:]
        self.copies = len(runners)
        self.reuse_bytes = weight_bytes * self.copies
        capturable = all(getattr(getattr(r, "fused_op", None), "capturable", True) for r in runners)
        calls = [_bound(r, x, ids, tw, out) for r in runners]
        self._sampler = _Sampler(calls, device, warmup=warmup, use_graph=use_graph and capturable)

    @property
    def how(self) -> str:
        return self._sampler.how

    def sample(self) -> float:
        """One sample (µs per call)."""
        return self._sampler.sample()

    def timing(self) -> Timing:
        """The spread of the samples taken so far."""
        return Timing.of(
            self._sampler.samples,
            self._sampler.how,
            calls_per_sample=self._sampler.group,
            weights="cold" if self.cold else "hot",
            copies=self.copies,
            reuse_bytes=self.reuse_bytes,
            note=self.note,
        )

    def close(self) -> None:
        self._sampler.close()
        self._copies = []

    def __enter__(self) -> RunnerTimer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _bound(runner, x, ids, tw, out) -> Callable[[], object]:
    return lambda: runner(x, ids, tw, out=out)


def _cold_runners(config, weights, runner, weight_bytes: int, cache_bytes: int, max_copies: int):
    """``[runner, copies...]`` and a note when a cap kept the copies below what cold mode wants."""
    want = cold_copies(weight_bytes, cache_bytes)
    if want <= 1:
        return [runner], ""
    if not hasattr(runner, "selection"):
        raise TypeError(f"cold mode builds weight copies with a MoeRunner's fused op; got {type(runner).__name__}")
    device = torch.device(runner.device)
    layer_bytes = sum(t.numel() * t.element_size() for t in weights.tensors().values())
    free = free_bytes(device)
    budget = None if free is None else COPY_MEMORY_FRACTION * free
    per_copy, used = layer_bytes, 0
    runners = [runner]
    limit = min(want, max(1, max_copies))
    while len(runners) < limit:
        if budget is not None and used + per_copy > budget:
            break
        before = torch.cuda.memory_allocated(device) if device.type == "cuda" else None
        runners.append(_runner_copy(config, weights, runner))
        if before is not None:  # what a copy really keeps (a backend's layout may be larger than canonical)
            per_copy = max(torch.cuda.memory_allocated(device) - before, 1)
        used += per_copy
    if len(runners) == want:
        return runners, ""
    why = (
        f"max_copies={max_copies}"
        if len(runners) == limit and limit < want
        else f"memory: a copy takes {per_copy / 1e6:.0f} MB, {COPY_MEMORY_FRACTION:.0%} of the free "
        f"{(free or 0) / 1e6:.0f} MB allowed"
    )
    reuse = weight_bytes * len(runners)
    return runners, (
        f"cold: {len(runners)} weight copies of the {want} wanted ({why}); {reuse / 1e6:.1f} MB read between "
        f"two reads of the same weights, against a {cache_bytes / 1e6:.1f} MB cache"
    )


def _runner_copy(config, weights: MoeWeights, runner):
    """A runner of the same fused op over a clone of ``weights``."""
    from moe_core.runner import MoeRunner

    clone = MoeWeights(**{name: t.clone() for name, t in weights.tensors().items()})
    return MoeRunner(config, clone, backend=runner.selection.op, check_expert_ids=runner.check_expert_ids)


def time_runner(
    config: MoeConfig,
    weights: MoeWeights,
    runner,
    tokens: int,
    device: torch.device | str | None = None,
    repeat: int = 20,
    cold: bool = False,
    *,
    use_graph: bool = True,
    seed: int = 1,
    warmup: int = 3,
    cache_bytes: int | None = None,
    max_copies: int = MAX_COPIES,
) -> Timing:
    """Time ``runner`` (a ``MoeRunner`` over ``weights``) on ``tokens`` random tokens: ``repeat`` samples after
    warm-up, hot or ``cold`` weights, CUDA graphs where the backend allows and ``use_graph``. ``device``
    defaults to the runner's. See the module docstring for what a sample is."""
    with RunnerTimer(
        config,
        weights,
        runner,
        tokens,
        device,
        cold=cold,
        use_graph=use_graph,
        seed=seed,
        warmup=warmup,
        cache_bytes=cache_bytes,
        max_copies=max_copies,
    ) as timer:
        for _ in range(repeat):
            timer.sample()
        return timer.timing()


def time_interleaved(timers: Sequence[RunnerTimer], repeat: int) -> list[Timing]:
    """``repeat`` rounds, each taking one sample of every timer, starting one timer later each round (so no
    timer always follows the same other); the ``Timing`` of each, in order."""
    n = len(timers)
    for r in range(repeat):
        k = r % n if n else 0
        for timer in (*timers[k:], *timers[:k]):
            timer.sample()
    return [t.timing() for t in timers]


# ---- rows of moe bench -------------------------------------------------------------------------------------


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
