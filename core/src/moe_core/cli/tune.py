"""``moe tune BACKEND``: let a backend measure and store its tile configurations."""

from __future__ import annotations

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
    p.add_argument("--tokens", default="1,8,64,512,4096", help="comma-separated token counts")
    p.add_argument("--output", "-o", help="table file to write/merge (default: the backend's packaged table)")
    p.add_argument("--device", default="cuda", help="device (default cuda)")
    p.set_defaults(handler=run)


def run(args) -> int:
    from pathlib import Path

    import torch

    from moe_core import guard
    from moe_core.errors import BackendUnavailableError, InvalidInputError
    from moe_core.selection import resolve_backend

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise BackendUnavailableError("moe tune times kernels on a GPU, and no CUDA device is available here")
    result = resolve_backend(args.backend)
    try:
        tokens = [int(t) for t in args.tokens.split(",")]
    except ValueError:
        raise InvalidInputError(f"--tokens must be comma-separated integers, got {args.tokens!r}") from None
    path = guard.call(
        result.entry,
        "tune",
        result.fused_ops[0].tune,
        presets=args.preset or list(MODEL_PRESETS),
        scheme=args.scheme,
        tokens=tokens,
        output=Path(args.output) if args.output else None,
        device=args.device,
    )
    if path is None:
        raise BackendUnavailableError(f"backend {args.backend!r} has nothing to tune (FusedOp.tune returned None)")
    print(f"wrote {path}")
    return 0
