"""``moe select``: measure which backend is fastest for a problem here, and manage that record.

``record`` times every backend ``auto`` may choose (or the ``--backend`` ones) on one problem at several
token counts — sampled in turn, the median kept on a GPU and the fastest sample on a CPU, as ``moe bench``
ranks them — and stores the times in the selection table (``moe_core.selection_table``), which
``backend="auto"`` then consults before priorities; ``show`` prints the table, ``clear`` removes it.
"""

from __future__ import annotations

import json

from moe_core.cli._console import stdout_console
from moe_core.cli._options import add_device, add_problem, add_tokens, problem_config, resolve_device, token_counts


def register(sub) -> None:
    p = sub.add_parser(
        "select",
        help="measure the fastest backend for a problem; backend='auto' then binds it",
        description=(
            "backend='auto' consults a selection table of measured times before the plugins' priorities. "
            "'record' times the backends on one problem here and stores their times (user cache directory; "
            "MOE_SELECTION_DIR moves it); 'show' prints the table; 'clear' removes it. Records are keyed by the "
            "device, the torch version, the problem and each backend's distribution version: a changed version "
            "makes a record stale (ignored, with a warning). The rule that turns times into a choice is "
            "MOE_SELECTION_RULE: decode (default: token counts <= 64 weigh four times more), prefill or uniform."
        ),
    )
    actions = p.add_subparsers(dest="action", metavar="ACTION")
    actions.required = True

    rec = actions.add_parser("record", help="time backends on a problem and store the result")
    add_problem(rec)
    add_tokens(rec, None, "comma-separated token counts (default: 1,8,64,512,4096 on a GPU; 1,16,64 on the CPU)")
    rec.add_argument(
        "--backend",
        action="append",
        help="backend to time, repeatable (default: every backend auto may choose for this problem)",
    )
    add_device(rec)
    rec.add_argument(
        "--repeat",
        type=int,
        default=None,
        help="timed samples per backend and token count (default 20 on a GPU, 50 on a CPU), backends sampled in "
        "turn; the median is stored on a GPU, the fastest sample on a CPU (moe_core.bench_rows.rank_by)",
    )
    rec.add_argument(
        "--cold",
        action="store_true",
        help="also time with the weights rotated past the GPU's L2, as in a model of many layers (auto then "
        "compares cold times); copies of the layer's weights take memory",
    )
    rec.add_argument("--json", action="store_true", help="print the record and auto's new choice as JSON")
    rec.set_defaults(handler=record)

    show = actions.add_parser("show", help="print the selection table")
    show.add_argument("--json", action="store_true", help="print the table file's records as JSON")
    show.set_defaults(handler=show_table)

    clear = actions.add_parser("clear", help="remove the selection table")
    clear.set_defaults(handler=clear_table)


def record(args) -> int:
    from rich.console import Console
    from rich.progress import Progress

    from moe_core import selection_table
    from moe_core.bench_rows import rank_field
    from moe_core.config import MoeProblem
    from moe_core.errors import InvalidInputError
    from moe_core.runner import MoeRunner
    from moe_core.selection import explain_auto
    from moe_core.selection_table import Measurement, problem_key, rule_name
    from moe_core.synthetic import random_weights
    from moe_core.timing import RunnerTimer, time_interleaved

    device = resolve_device(args)
    tokens = args.tokens or token_counts("1,8,64,512,4096" if device.type == "cuda" else "1,16,64")
    if any(t < 1 for t in tokens) or (args.repeat is not None and args.repeat < 1):
        raise InvalidInputError("--tokens values and --repeat must be >= 1")
    config = problem_config(args)
    problem = MoeProblem(config, device)
    rule_name()  # a bad MOE_SELECTION_RULE is an error before minutes of timing
    names = args.backend or [s.name for s in explain_auto(problem)[1]]
    if not names:
        raise InvalidInputError("no backend that auto may choose can run this problem here (moe backends --explain)")
    console = Console(stderr=True)
    weights = random_weights(config, device, seed=0)
    runners = {name: MoeRunner(config, weights, backend=name) for name in names}
    repeat = args.repeat or (20 if device.type == "cuda" else 50)
    modes = (False, True) if args.cold else (False,)
    times: dict[str, dict[bool, dict[int, float]]] = {name: {cold: {} for cold in modes} for name in names}
    statistic = rank_field(device)  # the Timing field moe bench ranks by here
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("timing", total=len(tokens) * len(modes))
        for cold in modes:
            for m in tokens:  # every backend at one count, sampled in turn: drift and noise hit them alike
                progress.update(task, description=f"{'cold' if cold else 'hot'} M={m}: {', '.join(names)}")
                timers = [RunnerTimer(config, weights, r, m, device, cold=cold) for r in runners.values()]
                try:
                    for name, timing in zip(names, time_interleaved(timers, repeat)):
                        times[name][cold][m] = round(getattr(timing, statistic), 3)
                        if timing.note:
                            console.print(f"{name} M={m}: {timing.note}")
                finally:
                    for timer in timers:
                        timer.close()
                progress.advance(task)
    measurements = [
        Measurement(
            runner.backend,
            runner.distribution,
            runner.selection.entry.version,
            times[name][False],
            times[name].get(True, {}),
        )
        for name, runner in runners.items()
    ]
    del runners, weights
    path = selection_table.record(problem, measurements)
    _, chosen = explain_auto(problem)
    document = {
        "table": str(path),
        "device": str(device),
        "problem": problem_key(config),
        "rule": rule_name(),
        "statistic": statistic,
        "measurements": [m.as_dict() for m in measurements],
        "auto": {"backend": chosen[0].name, "why": chosen[0].why} if chosen else None,
    }
    if args.json:
        print(json.dumps(document, indent=2))
        return 0
    what = "median" if statistic == "median_us" else "fastest sample"
    _print_times(
        measurements, tokens, f"{config.quant_scheme} E={config.num_experts} k={config.top_k} on {device}, {what}"
    )
    console = stdout_console()
    console.print(f"recorded in {path}")
    if chosen:
        console.print(f"backend='auto' now binds [bold]{chosen[0].name}[/]: {chosen[0].why}")
    return 0


def _print_times(measurements, tokens, title: str) -> None:
    from rich.table import Table

    table = Table(title=f"µs per forward ({title})")
    table.add_column("backend")
    table.add_column("distribution")
    for m in tokens:
        table.add_column(f"M={m}", justify="right")
    for meas in measurements:
        cells = [
            (f"{meas.hot_us[m]:.1f}" if m in meas.hot_us else "-")
            + (f" / {meas.cold_us[m]:.1f} cold" if m in meas.cold_us else "")
            for m in tokens
        ]
        table.add_row(meas.backend, f"{meas.distribution} {meas.version}", *cells)
    stdout_console().print(table)


def show_table(args) -> int:
    from moe_core.selection_table import Measurement, load, table_path

    path = table_path()
    records = load(path)
    if args.json:
        print(json.dumps({"table": str(path), "records": records}, indent=2))
        return 0
    console = stdout_console()
    if not records:
        console.print(f"no selection table at {path} (moe select record writes one)")
        return 0
    console.print(f"selection table {path}")
    for r in records:
        p = r["problem"]
        where = f"{r['device']['name']}" + (f" (SM {r['device']['capability']})" if r["device"]["capability"] else "")
        title = (
            f"{p['scheme']} {p['activation']} {p['dtype']} E={p['experts']} k={p['top_k']} H={p['hidden']} "
            f"I={p['intermediate']} bias={p['bias']} on {where}, torch {r['torch']}, {r.get('recorded', '?')}"
        )
        measurements = [Measurement.from_dict(b) for b in r["backends"]]
        tokens = sorted({m for meas in measurements for m in meas.hot_us})
        _print_times(measurements, tokens, title)
    return 0


def clear_table(args) -> int:
    from moe_core.selection_table import clear, table_path

    removed = clear()
    stdout_console().print(f"removed {removed}" if removed else f"no selection table at {table_path()}")
    return 0
