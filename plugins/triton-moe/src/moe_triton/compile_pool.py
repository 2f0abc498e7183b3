"""Compile tuning candidates in worker processes before the tuner times them.

Timing one candidate takes tens of milliseconds; compiling it (Triton's frontend, MLIR passes and ptxas,
one core) takes about a second, so a tuning run is mostly compiling. Each worker process (spawned: a CUDA
context does not survive a fork) builds a layer of the tuner's weight layout filled with zeros
(``TritonWeights.shapes`` / ``zeros``: the values do not reach compilation, and drawing random weights
would cost a worker several times their size) and the same inputs and buffers as the tuner
(``tune._inputs``, ``tune._launches``: seeded, so the same shapes, strides and alignment) and launches each
candidate it is given once; Triton's on-disk cache then holds the kernel, and the tuner's own first launch loads it
instead of compiling. Timing stays in the tuner's process, after a batch's compiles have finished, so no
worker shares the GPU with a measurement.

A candidate that fails in a worker (does not compile, does not fit) is only reported back: the tuner meets
it again itself and handles it as it always has. A pool that breaks (a worker died) is shut down with one
warning and the tuner goes on compiling in its own process.

GPU memory: every worker holds its own copy of the layer (zeros), and a candidate's split-K scratch can take
gigabytes at prefill sizes, so unbounded workers can starve the tuner of the memory its timing needs. The
workers together may hold ``WORKERS_SHARE`` of the GPU (``torch.cuda.set_per_process_memory_fraction``,
split evenly), and each returns its allocator's cache after every launch; a worker out of its share ends
the pool (one warning) rather than the tuning run.
"""

from __future__ import annotations

import multiprocessing
import os
import warnings
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

import torch

#: worker processes of ``moe tune triton``: 0 or 1 = none (compile in the tuner's process)
JOBS_VAR = "MOE_TRITON_TUNE_JOBS"
#: most workers chosen by default: each holds a CUDA context and a copy of the layer's weights
MAX_DEFAULT_JOBS = 8
#: the fraction of the GPU's memory all workers together may hold; the rest is the tuner's
WORKERS_SHARE = 0.5


def default_jobs(device) -> int:
    """``$MOE_TRITON_TUNE_JOBS`` when set, else on CUDA one worker per CPU core but one (the tuner's), at
    most ``MAX_DEFAULT_JOBS``; none elsewhere (the interpreter compiles nothing)."""
    value = os.environ.get(JOBS_VAR, "").strip()
    if value:
        try:
            jobs = int(value)
        except ValueError:
            raise ValueError(f"{JOBS_VAR}={value!r} is not a number of worker processes") from None
        if jobs < 0:
            raise ValueError(f"{JOBS_VAR}={value!r}: the number of worker processes cannot be negative")
        return jobs
    if torch.device(device).type != "cuda":
        return 0
    return min(MAX_DEFAULT_JOBS, max(0, (os.cpu_count() or 1) - 1))


class Compiler:
    """A pool of compile workers for one tuning run (a context manager; ``jobs`` <= 1: ``warm`` does
    nothing). ``warm(config, m, block_m, kind, pairs)`` returns when every (GemmConfig, split) pair of
    that GEMM kind has been launched once in some worker; the failures' messages, one per failed pair."""

    def __init__(self, jobs: int, device, log=print):
        self.device = str(torch.device(device))
        self.pool = None
        if jobs > 1:
            ctx = multiprocessing.get_context("spawn")
            share = WORKERS_SHARE / jobs
            self.pool = ProcessPoolExecutor(max_workers=jobs, mp_context=ctx, initializer=_start_worker,
                                            initargs=(self.device, share))  # fmt: skip
            log(f"compiling candidates in {jobs} worker processes, each within {share:.0%} of the GPU's memory "
                f"({JOBS_VAR}=0 compiles in this one)")  # fmt: skip

    def warm(self, config, shapes: tuple, m: int, block_m: int, kind: str, pairs) -> list[str]:
        """``shapes``: the tuner's ``TritonWeights.shapes()``."""
        if self.pool is None or not pairs:
            return []
        jobs = [(config, shapes, m, block_m, kind, g, split, self.device) for g, split in pairs]
        try:
            return [err for err in self.pool.map(warm_one, jobs) if err]
        except BrokenProcessPool as exc:
            return self._give_up(f"the pool broke ({exc})")
        except torch.OutOfMemoryError as exc:  # raised in a worker, re-raised here by the pool
            first = (str(exc).strip().splitlines() or [""])[0][:200]
            return self._give_up(f"a worker ran out of its share of GPU memory (fewer workers, {JOBS_VAR}, "
                                 f"get larger shares): {first}")  # fmt: skip

    def _give_up(self, why: str) -> list[str]:
        warnings.warn(f"tuning goes on without compile workers: {why}", RuntimeWarning, stacklevel=3)
        self.close()
        return []

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(cancel_futures=True)
            self.pool = None

    def __enter__(self) -> Compiler:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


#: a worker's layer (zero weights by config and layout) and launches (by M, BLOCK_M), the latest of each only
_STATE: dict = {}


def _start_worker(device: str, share: float) -> None:
    """A worker's initializer: bound its GPU memory to ``share`` of the device's."""
    device = torch.device(device)
    if device.type == "cuda":  # torch takes an index here, not a bare "cuda"
        index = device.index if device.index is not None else torch.cuda.current_device()
        torch.cuda.set_per_process_memory_fraction(share, index)


def _release(device: str) -> None:
    """Give the allocator's cached blocks back: the next candidate's scratch differs in size."""
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()


def warm_one(job) -> str | None:
    """Launch one candidate once (in a worker; callable in-process too): None, or why it failed. Running out
    of memory is the worker's failure, not the candidate's: ``torch.OutOfMemoryError`` is raised."""
    from moe_triton import tune
    from moe_triton.layout import TritonWeights

    config, shapes, m, block_m, kind, g, split, device = job
    try:
        if _STATE.get("layer") != (config, shapes):
            _STATE.clear()  # the previous layer's tensors go before the next one's are made
            _release(device)
            _STATE.update(layer=(config, shapes), weights=TritonWeights.zeros(shapes, device))
        if _STATE.get("key") != (m, block_m):
            _STATE.pop("makes", None)
            inputs = tune._inputs(config, m, device)
            _STATE.update(key=(m, block_m), makes=tune._launches(config, _STATE["weights"], inputs, block_m, device))
        _STATE["makes"][kind](g, split)()
        if torch.device(device).type == "cuda":
            torch.cuda.synchronize(device)
    except torch.OutOfMemoryError:
        raise
    except Exception as exc:  # reported; the tuner meets the same candidate itself
        lines = str(exc).strip().splitlines() or [""]
        return f"{kind} {g} split {split}: {type(exc).__name__}: {lines[-1][:200]}"
    finally:
        _release(device)
    return None
