"""``moe tune BACKEND``: let a backend measure and store its tile configurations."""

from __future__ import annotations

from moe_core.cli._options import add_device, add_tokens, resolve_device
from moe_core.presets import MODEL_PRESETS, PRESETS


def register(sub) -> None:
    p = sub.add_parser(
        "tune",
        help="tune a backend's kernel configurations on this GPU",
        description=(
            "Ask BACKEND to time its candidate kernel configurations for the given presets and token counts "
            "on this device and write a tuned table (backends that tune declare a 'tune' classmethod; "
            "others say they have nothing to tune)."
        ),
    )
    p.add_argument("backend", help="runner backend name")
    p.add_argument(
        "--preset",
        action="append",
        choices=sorted(PRESETS),
        help="preset, repeatable (default: the four model presets)",
    )
    p.add_argument("--scheme", default="bf16", help="quant scheme to tune (default bf16)")
    add_tokens(p, "1,8,64,512,4096", "comma-separated token counts (default 1,8,64,512,4096)")
    p.add_argument(
        "--output", "-o", help="table file to write/merge (default: the backend's table in your cache directory)"
    )
    add_device(p)
    p.set_defaults(handler=run)


def run(args) -> int:
    from pathlib import Path

    from moe_core import guard
    from moe_core.errors import BackendUnavailableError
    from moe_core.selection import resolve_backend

    device = resolve_device(args)
    if args.device is None and device.type != "cuda":
        raise BackendUnavailableError(
            "moe tune times kernels on a GPU, and no CUDA device is available here "
            "(--device cpu asks the backend to tune on the CPU)"
        )
    result = resolve_backend(args.backend)
    path = guard.call(
        result.entry,
        "tune",
        result.fused_ops[0].tune,
        presets=args.preset or list(MODEL_PRESETS),
        scheme=args.scheme,
        tokens=args.tokens,
        output=Path(args.output) if args.output else None,
        device=str(device),
    )
    if path is None:
        raise BackendUnavailableError(f"backend {args.backend!r} has nothing to tune (FusedOp.tune returned None)")
    print(f"wrote {path}")
    return 0
