"""``moe bench --tp N --ep M``: the sharded layer's time per forward on every rank, against the single-process
layer, for each ``--a2a`` dispatcher.

The ranks run what ``moe run``'s do (``moe_core.cli._sharded``: the same weights and batch on every rank,
each rank its shard and the rows its dispatcher says). Per (preset, backend, dispatcher, M): three warm-up
forwards; one timed forward on every rank decides, from the slowest, how many forwards one sample groups
(about a millisecond, the same count on every rank, since each forward's collectives pair the ranks' calls);
each of ``--repeat`` samples starts at a barrier and is timed on each rank's wall clock (after a device
synchronisation on CUDA), eagerly: the dispatchers' collectives are not captured in CUDA graphs. The row's
``time_us`` is the slowest rank's median (what the layer costs a model step); ``rank_time_us`` every rank's.
The single-process layer is rank 0's ``MoeRunner`` of the same backend on the whole batch, timed the same way
while the other ranks wait, and ``rel_l2_error`` compares the ranks' gathered output with its output.

Where the time goes: ``--repeat`` more forwards on every rank with a device synchronisation between the
three steps (``dispatch``, the local experts, ``combine``: these syncs make the steps' sum a little above the
plain forward) give each rank's median per step; ``phase_us`` is the slowest rank's, ``comm_share`` the part
of it in ``dispatch`` and ``combine`` (the collectives and the indexing around them), and, where the
dispatcher says how many bytes it sent (``Dispatcher.wire_bytes``), ``wire_gbps`` is that over those two
steps' time on the slowest rank, and ``of_link_peak`` its ratio to the link's measured peak. The peak is
measured once per run in the same world (``link``): ``all_reduce`` of a float32 buffer (bus bandwidth, as
nccl-tests counts it: 2 (n - 1) / n of the buffer per rank) and ``all_to_all_single`` (the (n - 1) / n of the
buffer each rank sends), median of five, in GB/s; ``of_link_peak`` divides by the larger of the two.

The document (``--json``, ``--output``): ``date``, ``device``, ``processor``, ``torch``, ``python``,
``threads``, ``versions``, ``tp``, ``ep``, ``ranks``, ``timing`` (the method above, in a sentence),
``link``, ``options``, ``rows``; a row: ``preset``, ``scheme``, ``tokens``, ``backend``, ``distribution``,
``dispatcher``, ``dispatcher_distribution``, ``dispatch_format``, ``rank_tokens`` (rows each rank brought),
``time_us``, ``min_us``, ``rank_time_us``, ``samples``, ``calls_per_sample``, ``single_us``, ``vs_single``
(``time_us / single_us``), ``rel_l2_error``, ``phase_us`` (``dispatch``, ``experts``, ``combine``),
``comm_share``, ``wire_bytes`` (every rank's, or None), ``wire_gbps``, ``of_link_peak``.
"""

from __future__ import annotations

import datetime
import functools
import platform
import time

TIMING = (
    "eager forwards; a sample starts at a barrier, groups the same number of forwards on every rank and is "
    "timed on each rank's wall clock; time_us is the slowest rank's median"
)


def bench_ranks(args, rank: int, device) -> dict | None:
    """``run_ranks``' function: this rank's part of the benchmark; the document on rank 0, else None."""
    import torch

    from moe_core.cli._sharded import (
        dispatcher_names,
        gather_from_ranks,
        median_us,
        sample_forwards,
        sharded_runner,
        whole_output,
    )
    from moe_core.dtypes import float_dtype
    from moe_core.presets import PRESETS
    from moe_core.runner import MoeRunner
    from moe_core.synthetic import random_inputs, random_weights
    from moe_core.tolerances import relative_l2

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    on_gpu = device.type == "cuda"
    presets = args.preset  # the command's defaults, chosen before the ranks started
    tokens = args.tokens or ([1, 8, 64, 512, 4096] if on_gpu else [1, 16, 64])
    repeat = args.repeat or (20 if on_gpu else 10)
    rows = []
    link = _link_peak(device)
    for preset in presets:
        config = PRESETS[preset].config(args.scheme or args.dtype, float_dtype(args.dtype))
        weights = random_weights(config, device)  # the same full weights on every rank
        for backend in args.backend or ["auto"]:
            single = MoeRunner(config, weights, backend=backend) if rank == 0 else None
            alone: dict[int, tuple[float, torch.Tensor]] = {}
            for name in dispatcher_names(args):
                layer = sharded_runner(args, config, weights, name, backend)
                for m in tokens:
                    x, ids, tw = random_inputs(config, m, device, seed=1)  # the same batch on every rank
                    mine = layer.token_slice(m)
                    xs, idss, tws = x[mine], ids[mine], tw[mine]
                    forward = functools.partial(layer, xs, idss, tws)
                    out = whole_output(layer, forward(), m)
                    samples, calls = sample_forwards(forward, device, repeat, layer)
                    phases, wire = _phases(layer, (xs, idss, tws), device, repeat)
                    medians = gather_from_ranks(
                        layer, (median_us(samples), min(samples), mine.stop - mine.start, phases, wire)
                    )
                    if rank == 0 and m not in alone:
                        once = functools.partial(single, x, ids, tw)
                        alone[m] = (median_us(sample_forwards(once, device, repeat)[0]), once())
                    torch.distributed.barrier(group=layer.group)  # the others wait for the single-process timing
                    if rank != 0:
                        continue
                    slowest = max(range(len(medians)), key=lambda r: medians[r][0])
                    single_us, reference = alone[m]
                    split = max((r[3] for r in medians), key=lambda p: sum(p.values()))  # the slowest rank's steps
                    comm_us = split["dispatch"] + split["combine"]
                    wires = [r[4] for r in medians]
                    gbps = (max(wires) / (comm_us * 1e3)) if None not in wires and comm_us > 0 else None
                    rows.append(
                        {
                            "preset": preset,
                            "scheme": config.quant_scheme,
                            "tokens": m,
                            "backend": layer.runner.backend,
                            "distribution": layer.runner.distribution,
                            "dispatcher": layer.dispatcher.name,
                            "dispatcher_distribution": layer.dispatcher_entry.distribution,
                            "dispatch_format": layer.dispatcher.format,
                            "rank_tokens": [r[2] for r in medians],
                            "time_us": medians[slowest][0],
                            "min_us": medians[slowest][1],
                            "rank_time_us": [r[0] for r in medians],
                            "samples": len(samples),
                            "calls_per_sample": calls,
                            "single_us": single_us,
                            "vs_single": medians[slowest][0] / single_us,
                            "rel_l2_error": relative_l2(out, reference) if m else 0.0,
                            "phase_us": split,
                            "comm_share": comm_us / sum(split.values()),
                            "wire_bytes": wires,
                            "wire_gbps": gbps,
                            "of_link_peak": None if gbps is None else gbps / max(link.values()),
                        }
                    )
    if rank != 0:
        return None
    from moe_core.cli.bench import _processor, _versions

    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name(device) if on_gpu else "cpu",
        "processor": None if on_gpu else _processor(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "threads": torch.get_num_threads(),
        "versions": _versions(),
        "tp": args.tp,
        "ep": args.ep,
        "ranks": args.tp * args.ep,
        "timing": TIMING,
        "link": {"buffer_bytes": _link_bytes(device), **{f"{k}_gbps": v for k, v in link.items()}},
        "options": {
            "presets": presets,
            "tokens": tokens,
            "backends": args.backend,
            "dispatchers": dispatcher_names(args),
            "scheme": args.scheme or args.dtype,
            "dtype": args.dtype,
            "repeat": repeat,
        },
        "rows": rows,
    }


def _phases(layer, inputs, device, repeat: int) -> tuple[dict, int | None]:
    """This rank's median µs of ``dispatch``, the local experts and ``combine`` (a device synchronisation
    between them; every rank makes the same calls), and the bytes its dispatcher says one forward sent."""
    import torch
    import torch.distributed as dist

    from moe_core import guard
    from moe_core.cli._sharded import median_us

    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    steps: dict[str, list[float]] = {"dispatch": [], "experts": [], "combine": []}
    m = inputs[0].shape[0]
    for _ in range(repeat):
        dist.barrier(group=layer.group)
        sync()
        t0 = time.perf_counter()
        d = layer.dispatch(*inputs)
        sync()
        t1 = time.perf_counter()
        y = layer.local_forward(d)
        sync()
        t2 = time.perf_counter()
        layer.combine(y, d, m)
        sync()
        t3 = time.perf_counter()
        for name, seconds in zip(steps, (t1 - t0, t2 - t1, t3 - t2), strict=True):
            steps[name].append(seconds * 1e6)
    # the same inputs every time: the last forward's count stands for all (asked once, through the door)
    wire = guard.call(layer.dispatcher_entry, "wire_bytes", layer.dispatcher.wire_bytes, d)
    if wire is not None and (isinstance(wire, bool) or not isinstance(wire, int) or wire < 0):
        raise guard.failure(layer.dispatcher_entry, "wire_bytes", f"returned {wire!r}, not a byte count or None")
    return {name: median_us(values) for name, values in steps.items()}, wire


def _link_bytes(device) -> int:
    return (256 if device.type == "cuda" else 8) * 2**20


def _link_peak(device) -> dict[str, float]:
    """GB/s of the world's links, by the module docstring's method (every rank calls it)."""
    import torch
    import torch.distributed as dist

    n, size = dist.get_world_size(), _link_bytes(device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    buf = torch.ones(size // 4, dtype=torch.float32, device=device)
    out = torch.empty_like(buf)
    rates = {}
    for name, op, moved in (
        ("all_reduce_bus", lambda: dist.all_reduce(buf), 2 * (n - 1) * size / n),
        ("all_to_all", lambda: dist.all_to_all_single(out, buf), (n - 1) * size / n),
    ):
        op()  # warm-up: the first call sets the connections up
        times = []
        for _ in range(5):
            dist.barrier()
            sync()
            start = time.perf_counter()
            op()
            sync()
            times.append(time.perf_counter() - start)
        rates[name] = moved / sorted(times)[2] / 1e9
    return rates
