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
    par = p.add_argument_group(
        "parallel (moe_core.distributed: replicate and mask)",
        "With --tp/--ep above 1 the layer is sharded over TP x EP ranks: spawned on this machine (gloo on the "
        "CPU, NCCL with one GPU per rank), or, under torchrun, the ranks torchrun started (env:// initialisation). "
        "Rank 0 reports; --verify compares the combined output with the single-process float64 reference.",
    )
    par.add_argument("--tp", type=int, default=1, help="tensor-parallel ranks (split I)")
    par.add_argument("--ep", type=int, default=1, help="expert-parallel ranks (split E)")
    par.add_argument("--timeout", type=float, default=120.0, help="seconds a collective may wait for a rank")
    p.set_defaults(handler=run)


def run(args) -> int:
    from moe_core.errors import InvalidInputError

    if len(args.tokens) != 1 or args.repeat < 1:
        raise InvalidInputError("moe run takes one token count (--tokens 16) and --repeat >= 1")
    if args.tp < 1 or args.ep < 1:
        raise InvalidInputError("--tp and --ep must be >= 1")
    if args.tp * args.ep > 1:
        from moe_core.cli._ranks import run_ranks
        from moe_core.sharding import check_grid

        check_grid(problem_config(args), args.tp, args.ep)

        report = run_ranks(_forward_report, args, args.tp * args.ep, args.timeout)
        return _finish(args, report)
    return _finish(args, _forward_report(args))


def _forward_report(args, rank: int = 0, device=None) -> dict | None:
    """One forward (sharded when a process group is up) and its report; None on ranks other than 0."""
    from moe_core.runner import MoeRunner
    from moe_core.synthetic import random_inputs, random_weights
    from moe_core.timing import time_forward

    (tokens,) = args.tokens
    device = device or resolve_device(args)
    config = problem_config(args)
    weights = random_weights(config, device, seed=args.seed)  # the same full weights on every rank
    if args.tp * args.ep > 1:
        from moe_core.distributed import ShardedRunner

        sharded = ShardedRunner(config, weights, tp_size=args.tp, ep_size=args.ep, backend=args.backend)
        runner, call = sharded.runner, sharded
    else:
        runner = call = MoeRunner(config, weights, backend=args.backend)
    x, ids, tw = random_inputs(config, tokens, device, seed=args.seed + 1)
    out = call(x, ids, tw)
    us, _ = time_forward(lambda: call(x, ids, tw), device, repeat=args.repeat, use_graph=False)
    if rank != 0:
        return None
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
    if args.tp * args.ep > 1:
        report.update(tp=args.tp, ep=args.ep, ranks=args.tp * args.ep, dispatch="replicate-and-mask")
    if args.verify:
        from moe_core.reference import reference_for
        from moe_core.tolerances import relative_l2, tolerance

        ref = reference_for(config, weights, x, ids, tw)
        err = relative_l2(out, ref)
        tol = tolerance(config.quant_scheme, config.dtype)
        report.update(rel_l2_error=err, tolerance=tol, verified=err <= tol)
    return report


def _finish(args, report: dict | None) -> int:
    if report is None:  # a rank other than 0 under torchrun: rank 0 reports
        return 0
    ok = report.get("verified", True)
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
