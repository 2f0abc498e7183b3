"""``moe backends``: what runner backends are installed, and can they run here."""

from __future__ import annotations

import json
import sys

from moe_core.cli._console import stdout_console


def register(sub) -> None:
    p = sub.add_parser(
        "backends",
        help="list installed runner backends",
        description=(
            "List every runner backend found through the entry-point group 'moe.fused_ops'. "
            "Without --check nothing is imported (status 'discovered' or 'disabled'). With --check "
            "each plugin is loaded and asked whether it can run on this machine: status is "
            "'available', 'unavailable' (reason says why), 'error' (failed to load), "
            "'incompatible' (plugin API version) or 'disabled' (MOE_PLUGINS / MOE_DISABLE_PLUGINS)."
        ),
    )
    p.add_argument("--check", action="store_true", help="load each plugin and check it can run here")
    p.add_argument("--json", action="store_true", help="print a JSON array instead of a table")
    p.add_argument("--traceback", action="store_true", help="with --check, print load tracebacks")
    p.set_defaults(handler=run)


def run(args) -> int:
    from moe_core.filters import PluginFilters
    from moe_core.plugins import default_registry

    registry = default_registry()
    rows = registry.describe(check=args.check)
    failed = [r for r in rows if r.status in ("error", "incompatible")]
    if args.json:
        print(json.dumps([r.as_dict() for r in rows], indent=2))
    else:
        _print_table(rows, args.check)
    if args.traceback and args.check:
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


def _print_table(rows, checked: bool) -> None:
    from rich.table import Table

    table = Table(title="moe runner backends" + ("" if checked else " (not loaded; use --check)"))
    for col in ("name", "distribution", "version", "status", "reason"):
        table.add_column(col, overflow="fold")
    for r in rows:
        style = _STYLE.get(r.status, "")
        table.add_row(r.name, r.distribution, r.version, f"[{style}]{r.status}[/]" if style else r.status, r.reason)
    console = stdout_console()
    if not rows:
        console.print("no moe runner backends are installed (not even moe-core's torch backend?)")
        return
    console.print(table)
