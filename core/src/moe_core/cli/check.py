"""``moe check BACKEND``: run the conformance cases for one backend here."""

from __future__ import annotations

import itertools
import json
import sys
import time

from moe_core.cli._console import stdout_console
from moe_core.cli._options import add_device


def register(sub) -> None:
    p = sub.add_parser(
        "check",
        help="run the conformance suite for one backend on this machine",
        description=(
            "Run every conformance case (moe_core.testing.cases) against BACKEND and compare with the "
            "float64 reference. Cases the backend's support check declines are skipped with its reason. "
            "Exit code 1 when any case failed."
        ),
    )
    p.add_argument("backend", help="runner backend name (or distribution:name)")
    add_device(p)
    p.add_argument("-k", "--filter", default="", help="only cases whose 'kind[id]' contains this text")
    p.add_argument("--hidden", type=int, default=256, help="hidden size H of the test layer (default 256)")
    p.add_argument("--intermediate", type=int, default=128, help="intermediate size I (default 128)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--verbose", "-v", action="store_true", help="list every case, not only failures")
    p.set_defaults(handler=run)


def run(args) -> int:
    from rich.console import Console
    from rich.progress import Progress

    from moe_core.testing.cases import Conformance, all_cases, summarize

    conf = Conformance(args.backend, args.device, hidden_size=args.hidden, intermediate_size=args.intermediate)
    conf.fused_op()  # a missing / disabled / broken backend is an error, not 100 failures
    cases = [c for c in all_cases() if args.filter in f"{c.kind}[{c.id}]"]
    console = Console(stderr=True)
    results = []
    if console.is_terminal:
        with Progress(console=console, transient=True) as progress:
            task = progress.add_task(f"checking {args.backend} on {conf.device}", total=len(cases))
            for case in cases:
                results.append(conf.run(case))
                progress.advance(task)
    else:  # a log (CI): one line per kind of case as it finishes, so a slow backend shows it is alive
        print(f"checking {args.backend} on {conf.device}: {len(cases)} cases", file=sys.stderr, flush=True)
        started = time.monotonic()
        for kind, group in itertools.groupby(cases, key=lambda c: c.kind):
            done = [conf.run(case) for case in group]
            results += done
            c = summarize(done)
            print(
                f"  {kind}: {c['passed']} passed, {c['failed']} failed, {c['skipped']} skipped "
                f"[{time.monotonic() - started:.0f} s]",
                file=sys.stderr,
                flush=True,
            )
    counts = summarize(results)
    if args.json:
        print(
            json.dumps(
                {
                    "backend": args.backend,
                    "device": str(conf.device),
                    **counts,
                    "cases": [r.as_dict() for r in results],
                },
                indent=2,
            )
        )
    else:
        _print(args, conf, results, counts)
    return 1 if counts["failed"] else 0


def _print(args, conf, results, counts) -> None:
    from rich.table import Table

    from moe_core.testing.cases import FAILED, PASSED

    console = stdout_console()
    shown = results if args.verbose else [r for r in results if r.status == FAILED]
    if shown:
        table = Table(title=f"moe check {args.backend}")
        for col in ("kind", "case", "status", "detail"):
            table.add_column(col, overflow="fold")
        for r in shown:
            style = {"passed": "green", "failed": "red"}.get(r.status, "yellow")
            detail = r.reason or (
                f"rel L2 {r.error:.2e} <= {r.tolerance:.1e}" if r.status == PASSED and r.error is not None else ""
            )
            table.add_row(r.case.kind, r.case.id, f"[{style}]{r.status}[/]", detail)
        console.print(table)
    color = "red" if counts["failed"] else "green"
    console.print(
        f"[{color}]{args.backend} on {conf.device}: {counts['passed']} passed, {counts['failed']} failed, "
        f"{counts['skipped']} skipped[/]"
    )
