"""``moe warmup BACKEND``: do a backend's slow one-time work (JIT builds, kernel downloads) now."""

from __future__ import annotations

import json
import sys
import time


def register(sub) -> None:
    p = sub.add_parser(
        "warmup",
        help="build / fetch what a backend needs before its first use (e.g. JIT kernels)",
        description=(
            "Load BACKEND's plugin and call each of its fused ops' warmup hook (FusedOp.warmup), which does "
            "the backend's slow one-time work on this machine ahead of the first runner: building JIT-compiled "
            "kernels, fetching kernel binaries. Progress goes to stderr. Backends with nothing to do say so. "
            "Exit code 0 when every op is ready, 1 when an op could not be warmed up here (the reason is "
            "printed), 2 when the backend is not installed, disabled or fails to load."
        ),
    )
    p.add_argument("backend", help="runner backend name (or distribution:name)")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.set_defaults(handler=run)


def _progress(started: float):
    def report(message: str) -> None:
        elapsed = time.monotonic() - started
        print(f"[{int(elapsed) // 60:02d}:{int(elapsed) % 60:02d}] {message}", file=sys.stderr, flush=True)

    return report


def run(args) -> int:
    from moe_core import guard
    from moe_core.errors import PluginError
    from moe_core.fused_op import Support
    from moe_core.selection import resolve_backend

    result = resolve_backend(args.backend)  # not installed / disabled / broken: MoeError -> exit 2
    started = time.monotonic()
    report = _progress(started)
    rows = []
    for op in result.fused_ops:
        label = f"{result.entry.name} (a2a {', '.join(op.a2a_backends)})"
        report(f"warming up {label} from {result.entry.distribution} {result.entry.version}")
        try:
            support = guard.support(result.entry, "warmup", op.warmup, report)
        except PluginError as exc:  # a plugin's failure is reported, never a traceback from moe
            support = Support.no(str(exc))
        rows.append(
            {"op": op.__name__, "a2a_backends": list(op.a2a_backends), "ok": support.ok, "reason": support.reason}
        )
    seconds = round(time.monotonic() - started, 1)
    ok = all(r["ok"] for r in rows)
    if args.json:
        print(json.dumps({"backend": result.entry.name, "ok": ok, "seconds": seconds, "ops": rows}, indent=2))
    else:
        for r in rows:
            status = "ready" if r["ok"] else "not warmed up"
            print(f"{result.entry.name}: {r['op']}: {status}" + (f": {r['reason']}" if r["reason"] else ""))
    return 0 if ok else 1
