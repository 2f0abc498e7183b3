"""``moe bench``: time backends on shape presets, with their spread, against the device's roofline.

What is timed (``moe_core.timing``): per preset, every backend's runner is built once; per token count the
backends are sampled in turn (``time_interleaved``), ``--repeat`` samples each, each sample a group of calls
of about a millisecond (CUDA-graph replays where the backend can be captured). ``--cold`` rotates through
copies of the weights so they are read from memory, not the GPU's L2.

The JSON document (``--json``, ``--output``) is stable: fields are added, not renamed. (Longer than 400 lines on
purpose: that document's field list, below, stays beside the code that writes it.)

- top level: ``date``; ``device`` (the GPU's name, or ``cpu``); ``processor`` (a CPU's model name, else
  null); ``torch``, ``cuda``, ``triton`` (version or null), ``python``; ``threads``
  (``torch.get_num_threads()``); ``versions`` (the first-party distributions, triton and flashinfer-python
  installed); ``backends`` (each row's ``backend`` -> ``{"name", "distribution", "version"}`` of the runner
  that ran it); ``copy_bandwidth_gb_s`` and ``matmul_tflops`` (measured ceilings, null on a CPU);
  ``roofline`` (how the floor is computed, or why there is none); ``rank_by`` (the row field ``vs_fastest``
  compares: ``time_us``, the median, on a GPU, ``min_us`` on a CPU: ``moe_core.bench_rows.rank_by``);
  ``cache_bytes`` and ``cache`` (what cold mode must defeat, and where that number comes from); ``options``
  (what was asked for); ``rows``.
- a row (``moe_core.bench_rows.BenchRow``): ``preset``, ``backend``, ``distribution``, ``scheme``, ``tokens``,
  ``weights`` (``hot``/``cold``), ``weight_copies``, ``time_us`` (the median), ``min_us``, ``p90_us``,
  ``samples``, ``calls_per_sample``, ``timing`` (``cuda-graph``, ``cuda-events``, ``cpu``), ``experts_hit``,
  ``bytes_moved``, ``reuse_bytes``, ``flops``, ``achieved_gb_s``, ``floor_us`` and ``roofline_fraction``
  (null on a CPU), ``vs_fastest`` and ``within_noise`` (against the fastest backend of the same preset, M and
  weights, by ``rank_by``), ``note`` (why a cold row is less cold than asked, else empty).
"""

from __future__ import annotations

import datetime
import json
import platform

from moe_core.cli._console import stdout_console
from moe_core.cli._options import add_device, add_dtype, add_parallel, add_tokens, resolve_device, token_counts
from moe_core.dtypes import float_dtype
from moe_core.presets import MODEL_PRESETS, PRESETS, TOY_PRESETS

#: default samples per row
REPEAT = {"cuda": 20, "cpu": 50}

NO_CPU_ROOFLINE = (
    "none on a CPU: the toy presets there are bound by Python and op dispatch, and a CPU has no single "
    "matmul peak (dtype, threads, cache level), so a roofline fraction would mean nothing"
)
GPU_ROOFLINE = (
    "floor = max(bytes_moved / copy bandwidth, flops / bf16 matmul rate), both measured at the start of this run"
)


def register(sub) -> None:
    p = sub.add_parser(
        "bench",
        help="time backends on shape presets",
        description=(
            "Time one MoE forward per (preset, tokens, backend) with random weights and routing. Per token count "
            "the backends are sampled in turn, each sample a group of calls of about a millisecond after a "
            "warm-up (CUDA-graph replays on a GPU when the backend can be captured, CUDA events otherwise; the "
            "wall clock on a CPU). Each row reports the median, min and p90 of the samples, the ratio to the "
            "fastest backend (by the median on a GPU, by the min on a CPU, where noise only adds time; '~' where "
            "the gap is inside the fastest one's spread: within noise), the bytes of the experts actually "
            "hit plus input/output, achieved bandwidth and, on a GPU, the fraction of the roofline (the larger "
            "of bytes / measured copy bandwidth and flops / measured matmul rate; none on a CPU, where it would "
            "mean nothing). --cold reads the weights from memory instead of the GPU's L2. On a CPU the toy "
            "presets are the default so it finishes in seconds."
        ),
    )
    p.add_argument(
        "--preset",
        action="append",
        choices=sorted(PRESETS),
        help="shape preset, repeatable (default: the four model presets on GPU, tiny+small on CPU)",
    )
    add_tokens(p, None, "comma-separated token counts (default: 1,8,64,512,4096 on GPU; 1,16,64 on CPU)")
    p.add_argument(
        "--backend",
        action="append",
        help="backend to time, repeatable (default: every installed backend that supports the problem)",
    )
    p.add_argument("--scheme", default=None, help="quant scheme (default: same as --dtype)")
    add_dtype(p)
    add_device(p)
    p.add_argument(
        "--repeat",
        type=int,
        default=None,
        help=f"timed samples per row (default {REPEAT['cuda']} on GPU, {REPEAT['cpu']} on CPU); "
        "median, min and p90 are reported",
    )
    p.add_argument("--no-graph", action="store_true", help="time eager calls even where a CUDA graph would work")
    p.add_argument(
        "--cold",
        action="store_true",
        help="cold weights: rotate through copies of the layer's weights (one runner and, on a GPU, one CUDA "
        "graph per copy) so that at least twice the L2 (64 MiB assumed on a CPU) is read between two reads of "
        "the same weights; copies are capped by --max-copies and half the free memory",
    )
    p.add_argument(
        "--max-copies", type=int, default=None, help="most weight copies --cold may make (default 64)", metavar="N"
    )
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        metavar="N",
        help="torch CPU threads for this run (torch.set_num_threads; default: torch's own)",
    )
    p.add_argument("--json", action="store_true", help="print the result document as JSON")
    p.add_argument("--output", "-o", help="also write the result document (JSON) to this file")
    p.add_argument(
        "--plot",
        help="write a PNG plot of time vs tokens per preset: median with a min-p90 band, log-2 tokens axis, "
        "log µs axis (needs matplotlib: pip install 'moe-core[plot]')",
    )
    add_parallel(
        p,
        "Each row is then the sharded layer's time per forward (the slowest rank's median; every rank's too) "
        "against the single-process layer of the same backend, for each --a2a dispatcher (default replicate), "
        "with the relative L2 error between the two outputs; eager forwards on the wall clock, samples started "
        "at a barrier (--cold and --plot do not apply; default --repeat 10 on a CPU).",
        many_dispatchers=True,
    )
    p.set_defaults(handler=run)


def _backends_for(config, device, requested):
    from moe_core.config import MoeProblem
    from moe_core.selection import explain

    if requested:
        return requested
    return sorted(name.partition(":")[2] for name, reason in explain(MoeProblem(config, device)) if reason is None)


def run(args) -> int:
    import torch

    from moe_core.errors import InvalidInputError
    from moe_core.timing import MAX_COPIES

    device = resolve_device(args)
    if args.repeat is not None and args.repeat < 1:
        raise InvalidInputError("--repeat must be >= 1")
    if args.threads is not None and args.threads < 1:
        raise InvalidInputError("--threads must be >= 1")
    if args.max_copies is not None and args.max_copies < 1:
        raise InvalidInputError("--max-copies must be >= 1")
    if args.tokens and any(t < 1 for t in args.tokens):
        raise InvalidInputError("--tokens values must be >= 1")
    if args.tp * args.ep > 1 or args.a2a:
        return _run_sharded(args)
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise InvalidInputError("--plot needs matplotlib: pip install 'moe-core[plot]'") from None
    threads = torch.get_num_threads()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    try:
        document, rows = bench(
            device,
            presets=args.preset,
            tokens=args.tokens,
            backends=args.backend,
            scheme=args.scheme,
            dtype=args.dtype,
            repeat=args.repeat,
            use_graph=not args.no_graph,
            cold=args.cold,
            max_copies=args.max_copies or MAX_COPIES,
        )
    finally:
        torch.set_num_threads(threads)
    if args.output:
        with open(args.output, "w") as f:
            json.dump(document, f, indent=2)
    if args.plot:
        _plot(rows, args.plot, document)
    if args.json:
        print(json.dumps(document, indent=2))
    else:
        _print(document, rows)
    return 0


def _run_sharded(args) -> int:
    """``moe bench --tp/--ep``: ``moe_core.cli._bench_ranks`` on the ranks, the document printed here."""
    from moe_core.cli._bench_ranks import bench_ranks
    from moe_core.cli._ranks import run_ranks
    from moe_core.cli._sharded import check_parallel
    from moe_core.errors import InvalidInputError

    if args.cold or args.plot:
        raise InvalidInputError("--cold and --plot time one process: they do not apply with --tp/--ep")
    args.preset = args.preset or list(MODEL_PRESETS if resolve_device(args).type == "cuda" else TOY_PRESETS)
    for name in args.preset:
        check_parallel(args, PRESETS[name].config(args.scheme or args.dtype, float_dtype(args.dtype)))
    document = run_ranks(bench_ranks, args, args.tp * args.ep, args.timeout)
    if document is None:  # a rank other than 0 under torchrun: rank 0 reports
        return 0
    if args.output:
        with open(args.output, "w") as f:
            json.dump(document, f, indent=2)
    if args.json:
        print(json.dumps(document, indent=2))
    else:
        _print_sharded(document)
    return 0


def _print_sharded(document) -> None:
    from rich.table import Table

    where = document["processor"] or document["device"]
    title = f"moe bench over {document['ranks']} ranks (tp={document['tp']}, ep={document['ep']}) on {where}"
    link = document["link"]
    caption = (
        f"µs per forward; {document['timing']}; comm = dispatch + combine share of the synchronised steps; link "
        f"peak all_reduce {link['all_reduce_bus_gbps']:.1f} / all_to_all {link['all_to_all_gbps']:.1f} GB/s"
    )
    table = Table(title=title, caption=caption)
    columns = ("preset", "scheme", "M", "backend", "dispatcher", "median µs", "per rank µs", "single µs", "vs single")
    for col in (*columns, "comm", "GB/s (of peak)", "rel. L2"):
        table.add_column(col, justify="left" if col in ("preset", "scheme", "backend", "dispatcher") else "right")
    for r in document["rows"]:
        wire = "-" if r["wire_gbps"] is None else f"{r['wire_gbps']:.3g} ({r['of_link_peak']:.0%})"
        table.add_row(
            r["preset"], r["scheme"], str(r["tokens"]), r["backend"], r["dispatcher"], f"{r['time_us']:.1f}",
            " ".join(f"{t:.0f}" for t in r["rank_time_us"]), f"{r['single_us']:.1f}", f"{r['vs_single']:.2f}x",
            f"{r['comm_share']:.0%}", wire, f"{r['rel_l2_error']:.1e}",
        )  # fmt: skip
    stdout_console().print(table)


def bench(
    device,
    *,
    presets=None,
    tokens=None,
    backends=None,
    scheme=None,
    dtype="bf16",
    repeat=None,
    use_graph=True,
    cold=False,
    max_copies=None,
    console=None,
):
    """(document, rows) of one ``moe bench`` run on ``device``; the defaults are the command's."""
    import torch
    from rich.console import Console
    from rich.progress import Progress

    from moe_core.bench_rows import make_row, mark_fastest, measure_ceilings, rank_by
    from moe_core.runner import MoeRunner
    from moe_core.synthetic import random_weights
    from moe_core.timing import MAX_COPIES, RunnerTimer, cache_size, time_interleaved

    on_gpu = device.type == "cuda"
    presets = presets or list(MODEL_PRESETS if on_gpu else TOY_PRESETS)
    tokens = tokens or token_counts("1,8,64,512,4096" if on_gpu else "1,16,64")
    repeat = repeat or REPEAT["cuda" if on_gpu else "cpu"]
    max_copies = max_copies or MAX_COPIES
    torch_dtype = float_dtype(dtype)
    console = console or Console(stderr=True)
    if on_gpu:
        console.print(f"measuring {device} ceilings (copy bandwidth, matmul rate)...")
    ceilings = measure_ceilings(device)
    cache_bytes, cache_source = cache_size(device)
    rows, identities = [], {}
    notes: set[str] = set()
    with Progress(console=console, transient=True) as progress:
        for name in presets:
            config = PRESETS[name].config(scheme or dtype, torch_dtype)
            weights = random_weights(config, device)
            names = _backends_for(config, device, backends)
            runners = {b: MoeRunner(config, weights, backend=b) for b in names}
            for label, runner in runners.items():
                identities.setdefault(label, _identity(runner))
            task = progress.add_task(name, total=len(tokens))
            for m in tokens:
                timers = []
                try:
                    for runner in runners.values():
                        timers.append(
                            RunnerTimer(
                                config,
                                weights,
                                runner,
                                m,
                                device,
                                cold=cold,
                                use_graph=use_graph,
                                cache_bytes=cache_bytes,
                                max_copies=max_copies,
                            )
                        )
                    timings = time_interleaved(timers, repeat)
                    for (label, runner), timer, timing in zip(runners.items(), timers, timings):
                        rows.append(make_row(name, label, config, timer, timing, ceilings, runner.distribution))
                        if timing.note and timing.note not in notes:
                            notes.add(timing.note)
                            console.print(f"{name} M={m} {label}: {timing.note}")
                finally:
                    for timer in timers:
                        timer.close()
                progress.advance(task)
            del runners, weights
            if on_gpu:
                torch.cuda.empty_cache()
    ranked_by = rank_by(device)
    mark_fastest(rows, ranked_by)
    document = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": ceilings.name if ceilings else str(device.type),
        "processor": None if on_gpu else _processor(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": _version("triton"),
        "python": platform.python_version(),
        "threads": torch.get_num_threads(),
        "versions": _versions(),
        "backends": identities,
        "copy_bandwidth_gb_s": ceilings.copy_bytes_per_s / 1e9 if ceilings else None,
        "matmul_tflops": ceilings.matmul_flops_per_s / 1e12 if ceilings else None,
        "roofline": GPU_ROOFLINE if ceilings else NO_CPU_ROOFLINE,
        "rank_by": ranked_by,
        "cache_bytes": cache_bytes,
        "cache": cache_source,
        "options": {
            "presets": presets,
            "tokens": tokens,
            "backends": backends,
            "scheme": scheme or dtype,
            "dtype": dtype,
            "repeat": repeat,
            "graphs": use_graph,
            "cold": cold,
            "max_copies": max_copies,
        },
        "rows": [r.as_dict() for r in rows],
    }
    return document, rows


def _identity(runner) -> dict:
    """What the document says of a runner: its backend, distribution and that distribution's version."""
    version = _version(runner.distribution) or getattr(runner.selection.entry, "version", None)
    return {"name": runner.backend, "distribution": runner.distribution, "version": version}


def _version(dist: str) -> str | None:
    import importlib.metadata as md

    try:
        return md.version(dist)
    except (md.PackageNotFoundError, ValueError):
        return None


def _versions() -> dict:
    from moe_core.known_backends import FIRST_PARTY

    out = {}
    for dist in (*sorted(set(FIRST_PARTY.values())), "triton", "flashinfer-python"):
        version = _version(dist)
        if version is not None:
            out[dist] = version
    return out


def _processor() -> str | None:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or None


def _title(document) -> str:
    device = document["device"]
    if document["copy_bandwidth_gb_s"] is None:
        what = document["processor"] or "cpu"
        return f"moe bench on {what} ({document['threads']} threads; no roofline on a CPU)"
    return (
        f"moe bench on {device} (copy {document['copy_bandwidth_gb_s']:.0f} GB/s, "
        f"matmul {document['matmul_tflops']:.0f} TFLOP/s)"
    )


def _print(document, rows) -> None:
    from rich.table import Table

    roofline = document["copy_bandwidth_gb_s"] is not None
    statistic = {"time_us": "median", "min_us": "min"}[document["rank_by"]]
    caption = f"µs per forward; 'vs fastest' compares the {statistic} ('~': within the fastest one's noise)"
    table = Table(title=_title(document), caption=caption)
    columns = ["preset", "scheme", "M", "backend", "weights", "median µs", "min µs", "p90 µs", "vs fastest"]
    columns += ["timing", "experts", "MB moved", "GB/s"] + (["roofline"] if roofline else [])
    left = ("preset", "backend", "timing", "scheme", "weights")
    for col in columns:
        table.add_column(col, justify="left" if col in left else "right")
    for r in rows:
        weights = r.weights if r.weight_copies == 1 else f"{r.weights} x{r.weight_copies}"
        cells = [r.preset, r.scheme, str(r.tokens), r.backend, weights, f"{r.time_us:.1f}"]
        cells += [f"{r.min_us:.1f}", f"{r.p90_us:.1f}", _vs(r), r.timing, str(r.experts_hit)]
        cells += [
            f"{r.bytes_moved / 1e6:.1f}",
            f"{r.achieved_gb_s:.0f}" if r.achieved_gb_s >= 10 else f"{r.achieved_gb_s:.2f}",
        ]
        if roofline:
            cells.append(f"{r.roofline_fraction:.1%}")
        table.add_row(*cells)
    stdout_console().print(table)


def _vs(row) -> str:
    if row.vs_fastest is None:
        return ""
    if row.vs_fastest == 1.0:
        return "fastest"
    return f"{'~' if row.within_noise else ''}{row.vs_fastest:.2f}x"


def plot_series(rows) -> dict:
    """What ``--plot`` draws, per preset (in the rows' order): ``{"title", "tokens", "lines": [{"label",
    "tokens", "median", "min", "p90", "cold"}], "roofline": [(M, floor µs)] or []}``."""
    presets = list(dict.fromkeys(r.preset for r in rows))
    out = {}
    for preset in presets:
        sel = [r for r in rows if r.preset == preset]
        lines = []
        for backend, weights in dict.fromkeys((r.backend, r.weights) for r in sel):
            pts = sorted((r for r in sel if r.backend == backend and r.weights == weights), key=lambda r: r.tokens)
            lines.append(
                {
                    "label": f"{backend} ({weights} weights)",
                    "tokens": [r.tokens for r in pts],
                    "median": [r.time_us for r in pts],
                    "min": [r.min_us for r in pts],
                    "p90": [r.p90_us for r in pts],
                    "cold": weights == "cold",
                }
            )
        xs = sorted({r.tokens for r in sel})
        floors = [(x, min(r.floor_us for r in sel if r.tokens == x)) for x in xs if sel[0].floor_us is not None]
        out[preset] = {"title": f"{preset} ({sel[0].scheme})", "tokens": xs, "lines": lines, "roofline": floors}
    return out


def _plot(rows, path, document) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = plot(rows, document)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot(rows, document):
    """The ``--plot`` figure (``plot_series``): one panel per preset, median per backend and weights with a
    min-p90 band, the roofline floor where there is one, log-2 tokens axis labelled with the token counts,
    log µs axis."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullLocator

    series = plot_series(rows)
    fig, axes = plt.subplots(1, len(series), figsize=(5 * len(series), 4.2), squeeze=False)
    for ax, spec in zip(axes[0], series.values()):
        for line in spec["lines"]:
            (drawn,) = ax.plot(
                line["tokens"], line["median"], marker="o", linestyle="--" if line["cold"] else "-", label=line["label"]
            )
            ax.fill_between(line["tokens"], line["min"], line["p90"], color=drawn.get_color(), alpha=0.2)
        if spec["roofline"]:
            xs, floors = zip(*spec["roofline"])
            ax.plot(xs, floors, "k:", label="roofline floor")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(spec["tokens"], [str(m) for m in spec["tokens"]])
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set(title=f"{spec['title']} on {document['device']}", xlabel="tokens M", ylabel="µs per forward")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize="small")
    fig.suptitle(
        f"moe bench — {document['device']}, torch {document['torch']}, {document['date'][:10]} (median; band: min–p90)"
    )
    fig.tight_layout()
    return fig
