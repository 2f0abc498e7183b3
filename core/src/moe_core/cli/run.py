"""``moe run``: build a layer, run it through a backend, report checksum and time."""

from __future__ import annotations

import json

from moe_core.cli._console import stdout_console
from moe_core.cli._options import add_device, add_dtype, add_tokens, resolve_device
from moe_core.dtypes import float_dtype
from moe_core.presets import PRESETS


def register(sub) -> None:
    p = sub.add_parser(
        "run",
        help="run one MoE forward through a backend",
        description=(
            "Build a MoE layer with random weights (a shape preset or explicit sizes), run a forward "
            "of --tokens tokens with random routing through --backend, and report the output checksum "
            "and the median time. --verify also compares with an independent float64 reference."
        ),
    )
    p.add_argument("--preset", choices=sorted(PRESETS), default="tiny", help="layer shape (default: tiny)")
    p.add_argument("--experts", type=int, help="number of experts E (overrides the preset)")
    p.add_argument("--top-k", type=int, help="experts per token k")
    p.add_argument("--hidden", type=int, help="hidden size H")
    p.add_argument("--intermediate", type=int, help="expert intermediate size I")
    p.add_argument("--activation", choices=("silu", "gelu", "swiglu_oai"), help="gated activation")
    p.add_argument(
        "--bias",
        action=__import__("argparse").BooleanOptionalAction,
        default=None,
        help="expert biases b13/b2 (default: the preset's)",
    )
    add_tokens(p, "16", "tokens in the batch M, one count (default 16)")
    add_dtype(p)
    p.add_argument(
        "--scheme", help="weight quant scheme of moe_core.schemes (default: same as --dtype; a wrong name lists them)"
    )
    p.add_argument("--backend", default="auto", help="runner backend name, or 'auto' (default)")
    add_device(p)
    p.add_argument("--repeat", type=int, default=5, help="timed repetitions; the median is reported")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--verify", action="store_true", help="compare with the float64 reference")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=run)


def build_config(args):

    from moe_core.config import MoeConfig

    preset = PRESETS[args.preset]
    dtype = float_dtype(args.dtype)
    return MoeConfig(
        num_experts=args.experts or preset.num_experts,
        top_k=args.top_k or preset.top_k,
        hidden_size=args.hidden or preset.hidden_size,
        intermediate_size=args.intermediate or preset.intermediate_size,
        quant_scheme=args.scheme or args.dtype,
        activation=args.activation or preset.activation,
        has_bias=preset.has_bias if args.bias is None else args.bias,
        dtype=dtype,
    )


def run(args) -> int:

    from moe_core.errors import InvalidInputError
    from moe_core.runner import MoeRunner
    from moe_core.synthetic import random_inputs, random_weights
    from moe_core.timing import time_forward

    if len(args.tokens) != 1 or args.repeat < 1:
        raise InvalidInputError("moe run takes one token count (--tokens 16) and --repeat >= 1")
    (tokens,) = args.tokens
    device = resolve_device(args)
    config = build_config(args)
    weights = random_weights(config, device, seed=args.seed)
    runner = MoeRunner(config, weights, backend=args.backend)
    x, ids, tw = random_inputs(config, tokens, device, seed=args.seed + 1)
    out = runner(x, ids, tw)
    us, _ = time_forward(lambda: runner(x, ids, tw), device, repeat=args.repeat, use_graph=False)
    ms = us / 1e3
    report = {
        "backend": runner.backend,
        "distribution": runner.distribution,
        "device": str(device),
        "experts": config.num_experts,
        "top_k": config.top_k,
        "hidden": config.hidden_size,
        "intermediate": config.intermediate_size,
        "scheme": config.quant_scheme,
        "activation": config.activation,
        "bias": config.has_bias,
        "dtype": args.dtype,
        "tokens": tokens,
        "checksum": float(out.double().sum()),
        "time_ms": ms,
    }
    ok = True
    if args.verify:
        from moe_core.reference import reference_for
        from moe_core.tolerances import relative_l2, tolerance

        ref = reference_for(config, weights, x, ids, tw)
        err = relative_l2(out, ref)
        tol = tolerance(config.quant_scheme, config.dtype)
        ok = err <= tol
        report.update(rel_l2_error=err, tolerance=tol, verified=ok)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        _print(report)
    return 0 if ok else 1


def _print(report: dict) -> None:
    from rich.table import Table

    table = Table(show_header=False, title="moe run")
    for key, value in report.items():
        if isinstance(value, float):
            value = f"{value:.6g}"
        if key == "verified":
            value = "[green]yes[/]" if value else "[red]NO[/]"
        table.add_row(key, str(value))
    stdout_console().print(table)
