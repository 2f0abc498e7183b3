"""``moe backends``: what runner backends and dispatchers are installed, and can they run here."""

from __future__ import annotations

import json
import sys

from moe_core.cli._console import stdout_console
from moe_core.cli._options import add_device, add_problem, problem_config, resolve_device


def register(sub) -> None:
    p = sub.add_parser(
        "backends",
        help="list installed runner backends and dispatchers",
        description=(
            "List every runner backend found through the entry-point group 'moe.fused_ops' and every token "
            "dispatcher found through 'moe.a2a' (a second table; with --json, rows of kind 'dispatcher'). "
            "Without --check nothing is imported (status 'discovered' or 'disabled'). With --check "
            "each plugin is loaded and asked whether it can run on this machine: status is "
            "'available', 'unavailable' (reason says why), 'error' (failed to load), "
            "'incompatible' (plugin API version) or 'disabled' (MOE_PLUGINS / MOE_DISABLE_PLUGINS)."
        ),
    )
    p.add_argument("--check", action="store_true", help="load each plugin and check it can run here")
    p.add_argument(
        "--explain",
        action="store_true",
        help=(
            "for one problem (the shape options below, as in moe run): every backend, whether it can run it and "
            "why not, its priority, its measured times (moe select), and which one backend='auto' binds and why"
        ),
    )
    p.add_argument("--json", action="store_true", help="print a JSON array instead of a table")
    p.add_argument("--traceback", action="store_true", help="with --check, print load tracebacks")
    shape = p.add_argument_group("the problem of --explain")
    add_problem(shape)
    add_device(shape)
    shape.add_argument(
        "--a2a",
        metavar="NAME",
        help="the token dispatcher the layer runs under (moe.a2a): backends whose fused op cannot read the format "
        "it hands the experts are not usable, with that reason",
    )
    p.set_defaults(handler=run)


def run(args) -> int:
    if args.explain:
        return explain(args)
    from moe_core.filters import PluginFilters
    from moe_core.kinds import KINDS
    from moe_core.plugins import default_registry

    registries = [default_registry(kind.group) for kind in KINDS]
    tables = [(registry.kind, registry.describe(check=args.check)) for registry in registries]
    rows = [r for _, kind_rows in tables for r in kind_rows]
    failed = [r for r in rows if r.status in ("error", "incompatible")]
    if args.json:
        print(json.dumps([r.as_dict() for r in rows], indent=2))
    else:
        for kind, kind_rows in tables:
            _print_table(kind, kind_rows, args.check)
    if args.traceback and args.check:
        for registry in registries:
            for e in registry.entries():
                result = registry.load(e, strict=False)
                if result.traceback:
                    print(f"\n--- {e.qualified_name} ---\n{result.traceback}", file=sys.stderr)
    if failed and PluginFilters.from_environ().strict:
        names = ", ".join(f"{r.distribution}:{r.name}" for r in failed)
        print(f"moe backends: MOE_STRICT_PLUGINS is set and these plugins failed: {names}", file=sys.stderr)
        return 1
    return 0


_STYLE = {
    "available": "green",
    "discovered": "cyan",
    "unavailable": "yellow",
    "disabled": "dim",
    "error": "red",
    "incompatible": "red",
}


def _print_table(kind, rows, checked: bool) -> None:
    """One kind's table; a dispatcher's shows the format it hands the experts (known once loaded)."""
    from rich.table import Table

    formats = kind.key == "dispatcher"
    table = Table(title=f"moe {kind.noun}s ({kind.group})" + ("" if checked else " (not loaded; use --check)"))
    for col in ("name", "distribution", "version", *(("format",) if formats else ()), "status", "reason"):
        table.add_column(col, overflow="fold")
    for r in rows:
        style = _STYLE.get(r.status, "")
        status = f"[{style}]{r.status}[/]" if style else r.status
        table.add_row(r.name, r.distribution, r.version, *((", ".join(r.formats),) if formats else ()), status,
                      r.reason)  # fmt: skip
    console = stdout_console()
    if not rows:
        console.print(f"no moe {kind.noun}s are installed (not even moe-core's own?)")
        return
    console.print(table)


def explain(args) -> int:
    from moe_core.config import MoeProblem
    from moe_core.selection import explain_auto
    from moe_core.selection_table import problem_key, rule_name, table_path

    config = problem_config(args)
    device = resolve_device(args)
    dispatcher = None
    if args.a2a:
        from moe_core.dispatch import get_dispatcher

        dispatcher = get_dispatcher(args.a2a)
    candidates, order = explain_auto(MoeProblem(config, device), dispatcher=dispatcher)
    chosen = order[0] if order else None
    document = {
        "device": str(device),
        "problem": problem_key(config),
        "selection_table": str(table_path()),
        "rule": rule_name(),
        "dispatcher": None if dispatcher is None else {"name": dispatcher.name, "format": dispatcher.format},
        "backends": [c.as_dict() for c in candidates],
        "auto": {"backend": chosen.name, "distribution": chosen.entry.distribution, "why": chosen.why}
        if chosen
        else None,
    }
    if args.json:
        print(json.dumps(document, indent=2))
        return 0
    from rich.table import Table

    counts = sorted({m for c in candidates for m in (c.times_us or {})})
    table = Table(title=f"backends for {config.quant_scheme} E={config.num_experts} k={config.top_k} "
                  f"H={config.hidden_size} I={config.intermediate_size} on {device}")  # fmt: skip
    for col in ("auto rank", "backend", "usable", "priority", *(f"µs M={m}" for m in counts), "score", "reason"):
        table.add_column(col, overflow="fold")
    ranked = sorted(candidates, key=lambda c: (c.rank is None, c.rank if c.rank is not None else 0, c.name))
    for c in ranked:
        times = [f"{c.times_us[m]:.1f}" if c.times_us and m in c.times_us else "-" for m in counts]
        usable = "yes" if c.automatic else "when named" if c.usable else "[yellow]no[/]"
        table.add_row(
            "-" if c.rank is None else str(c.rank),
            c.name,
            usable,
            "-" if c.priority is None else f"{c.priority:g}",
            *times,
            "-" if c.score is None else f"{c.score:.2f}",
            c.reason,
        )
    console = stdout_console()
    console.print(table)
    if chosen:
        console.print(f"backend='auto' binds [bold]{chosen.name}[/] ({chosen.entry.distribution}): {chosen.why}")
    else:
        console.print("[yellow]backend='auto' can bind no backend for this problem here[/]")
    return 0
