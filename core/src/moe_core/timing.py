"""Timing a MoE forward: samples and their spread, hot and cold weights, several runners in turn.

The rows of ``moe bench`` built from these measurements (bytes, flops, roofline, ranking) are
``moe_core.bench_rows``. Longer than 400 lines on purpose: the sampler, the cold weight copies and the
runner timer are one mechanism (a cold row is a hot row whose sampler rotates over copies), read together.

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
    **options,
) -> Timing:
    """Time ``runner`` (a ``MoeRunner`` over ``weights``) on ``tokens`` random tokens: ``repeat`` samples after
    warm-up, hot or ``cold`` weights; ``options`` are ``RunnerTimer``'s (``use_graph``, ``seed``, ``warmup``,
    ``cache_bytes``, ``max_copies``). ``device`` defaults to the runner's. See the module docstring for what a
    sample is."""
    with RunnerTimer(config, weights, runner, tokens, device, cold=cold, **options) as timer:
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
