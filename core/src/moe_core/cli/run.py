"""``moe run``: build a layer, run it through a backend, report checksum and time."""

from __future__ import annotations

import json

from moe_core.cli._console import stdout_console
from moe_core.cli._options import add_device, add_problem, add_tokens, problem_config, resolve_device


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
    add_problem(p)
    add_tokens(p, "16", "tokens in the batch M, one count (default 16)")
    p.add_argument("--backend", default="auto", help="runner backend name, or 'auto' (default)")
    add_device(p)
    p.add_argument("--repeat", type=int, default=5, help="timed repetitions; the median is reported")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--verify", action="store_true", help="compare with the float64 reference")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=run)


def run(args) -> int:

    from moe_core.errors import InvalidInputError
    from moe_core.runner import MoeRunner
    from moe_core.synthetic import random_inputs, random_weights
    from moe_core.timing import time_forward

    if len(args.tokens) != 1 or args.repeat < 1:
        raise InvalidInputError("moe run takes one token count (--tokens 16) and --repeat >= 1")
    (tokens,) = args.tokens
    device = resolve_device(args)
    config = problem_config(args)
    weights = random_weights(config, device, seed=args.seed)
    runner = MoeRunner(config, weights, backend=args.backend)
    x, ids, tw = random_inputs(config, tokens, device, seed=args.seed + 1)
    out = runner(x, ids, tw)
    us, _ = time_forward(lambda: runner(x, ids, tw), device, repeat=args.repeat, use_graph=False)
    ms = us / 1e3
    report = {
        "backend": runner.backend,
        "distribution": runner.distribution,
        "selected_because": runner.selection.why,
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
