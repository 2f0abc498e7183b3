"""Timing one callable: warm-up, repeats, median; CUDA events on a GPU."""

from __future__ import annotations

import statistics
import time

import torch


def median_time_ms(fn, device: torch.device, repeat: int = 10, warmup: int = 2) -> float:
    """Median wall time of ``fn()`` in milliseconds.

    On CUDA each call is bracketed by events and the stream synchronised, so
    the number is device time; on CPU ``perf_counter`` is used.
    """
    device = torch.device(device)
    for _ in range(warmup):
        fn()
    samples = []
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        for _ in range(repeat):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end))
    else:
        for _ in range(repeat):
            t0 = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(samples)
