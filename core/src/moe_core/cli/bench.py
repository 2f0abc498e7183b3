"""``moe bench``: time backends on shape presets, against the device's roofline."""

from __future__ import annotations

import datetime
import json
import platform

from moe_core.cli._console import stdout_console
from moe_core.cli._options import add_device, add_dtype, add_tokens, resolve_device, token_counts
from moe_core.dtypes import float_dtype
from moe_core.presets import MODEL_PRESETS, PRESETS, TOY_PRESETS


def register(sub) -> None:
    p = sub.add_parser(
        "bench",
        help="time backends on shape presets",
        description=(
            "Time one MoE forward per (preset, tokens, backend) with random weights and routing: warm-up, "
            "then the median of repeated runs (CUDA-graph replays on a GPU when the backend can be "
            "captured, CUDA events otherwise). Each row reports time, the bytes of the experts actually "
            "hit plus input/output, achieved bandwidth and the fraction of the roofline (the larger of "
            "bytes / measured copy bandwidth and flops / measured matmul rate). On a CPU the toy presets "
            "are the default so it finishes in seconds."
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
    p.add_argument("--repeat", type=int, default=20, help="timed samples per row; the median is reported")
    p.add_argument("--no-graph", action="store_true", help="time eager calls even where a CUDA graph would work")
    p.add_argument("--json", action="store_true", help="print the result document as JSON")
    p.add_argument("--output", "-o", help="also write the result document (JSON) to this file")
    p.add_argument("--plot", help="write a PNG plot of time vs tokens (needs matplotlib: pip install moe-core[plot])")
    p.set_defaults(handler=run)


def _backends_for(config, device, requested):
    from moe_core.config import MoeProblem
    from moe_core.selection import explain

    if requested:
        return requested
    return sorted(name.partition(":")[2] for name, reason in explain(MoeProblem(config, device)) if reason is None)


def run(args) -> int:
    import torch
    from rich.console import Console
    from rich.progress import Progress

    from moe_core.errors import InvalidInputError
    from moe_core.runner import MoeRunner
    from moe_core.synthetic import random_weights
    from moe_core.timing import bench_row, measure_ceilings

    device = resolve_device(args)
    on_gpu = device.type == "cuda"
    presets = args.preset or list(MODEL_PRESETS if on_gpu else TOY_PRESETS)
    tokens = args.tokens or token_counts("1,8,64,512,4096" if on_gpu else "1,16,64")
    if any(t < 1 for t in tokens) or args.repeat < 1:
        raise InvalidInputError("--tokens values and --repeat must be >= 1")
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise InvalidInputError("--plot needs matplotlib: pip install 'moe-core[plot]'") from None
    dtype = float_dtype(args.dtype)
    console = Console(stderr=True)
    console.print(f"measuring {device} ceilings (copy bandwidth, matmul rate)...")
    ceilings = measure_ceilings(device)
    rows = []
    with Progress(console=console, transient=True) as progress:
        for name in presets:
            config = PRESETS[name].config(args.scheme or args.dtype, dtype)
            weights = random_weights(config, device)
            backends = _backends_for(config, device, args.backend)
            task = progress.add_task(f"{name}", total=len(backends) * len(tokens))
            for backend in backends:
                runner = MoeRunner(config, weights, backend=backend)
                for m in tokens:
                    rows.append(
                        bench_row(name, backend, config, weights, runner, m, ceilings, device, repeat=args.repeat)
                    )
                    progress.advance(task)
                del runner
            del weights
            if on_gpu:
                torch.cuda.empty_cache()
    document = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": ceilings.name,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "versions": _versions(),
        "copy_bandwidth_gb_s": ceilings.copy_bytes_per_s / 1e9,
        "matmul_tflops": ceilings.matmul_flops_per_s / 1e12,
        "rows": [r.as_dict() for r in rows],
    }
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


def _versions() -> dict:
    import importlib.metadata as md

    from moe_core.known_backends import FIRST_PARTY

    out = {}
    for dist in (*sorted(set(FIRST_PARTY.values())), "triton", "flashinfer-python"):
        try:
            out[dist] = md.version(dist)
        except md.PackageNotFoundError:
            pass
    return out


def _print(document, rows) -> None:
    from rich.table import Table

    table = Table(
        title=f"moe bench on {document['device']} (copy {document['copy_bandwidth_gb_s']:.0f} GB/s, "
        f"matmul {document['matmul_tflops']:.1f} TFLOP/s)"
    )
    for col in ("preset", "scheme", "M", "backend", "time µs", "timing", "experts", "MB moved", "GB/s", "roofline"):
        table.add_column(col, justify="right" if col not in ("preset", "backend", "timing", "scheme") else "left")
    for r in rows:
        table.add_row(
            r.preset,
            r.scheme,
            str(r.tokens),
            r.backend,
            f"{r.time_us:.1f}",
            r.timing,
            str(r.experts_hit),
            f"{r.bytes_moved / 1e6:.1f}",
            f"{r.achieved_gb_s:.0f}",
            f"{r.roofline_fraction:.1%}",
        )
    stdout_console().print(table)


def _plot(rows, path, document) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    presets = sorted({r.preset for r in rows}, key=[r.preset for r in rows].index)
    fig, axes = plt.subplots(1, len(presets), figsize=(4.5 * len(presets), 4), squeeze=False)
    for ax, preset in zip(axes[0], presets):
        for backend in sorted({r.backend for r in rows if r.preset == preset}):
            sel = [r for r in rows if r.preset == preset and r.backend == backend]
            ax.plot([r.tokens for r in sel], [r.time_us for r in sel], marker="o", label=backend)
        floor = [r for r in rows if r.preset == preset]
        xs = sorted({r.tokens for r in floor})
        ax.plot(xs, [min(r.floor_us for r in floor if r.tokens == x) for x in xs], "k--", label="roofline")
        ax.set(xscale="log", yscale="log", title=preset, xlabel="tokens M", ylabel="µs")
        ax.legend()
    fig.suptitle(f"moe bench — {document['device']}, torch {document['torch']}, {document['date'][:10]}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
