"""``moe run``: build a layer, run it through a backend, report checksum and time."""

from __future__ import annotations

import json

from moe_core.cli._console import stdout_console
from moe_core.cli._options import add_device, add_parallel, add_problem, add_tokens, problem_config, resolve_device


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
    add_parallel(
        p,
        "Every rank builds the same weights and batch and keeps its shard; the dispatcher (--a2a) says which "
        "tokens each rank brings. Rank 0 reports the whole batch's checksum and its own time; --verify compares "
        "the whole batch's output, gathered from the ranks, with the single-process float64 reference.",
    )
    p.set_defaults(handler=run)


def run(args) -> int:
    from moe_core.errors import InvalidInputError

    if len(args.tokens) != 1 or args.repeat < 1:
        raise InvalidInputError("moe run takes one token count (--tokens 16) and --repeat >= 1")
    from moe_core.cli._sharded import check_parallel

    check_parallel(args, problem_config(args))
    if args.tp * args.ep > 1:
        from moe_core.cli._ranks import run_ranks

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
    x, ids, tw = random_inputs(config, tokens, device, seed=args.seed + 1)  # the same batch on every rank
    sharded = None
    if args.tp * args.ep > 1:
        from moe_core.cli._sharded import dispatcher_names, sharded_runner, whole_output

        sharded = sharded_runner(args, config, weights, dispatcher_names(args)[0], args.backend)
        runner, mine = sharded.runner, sharded.token_slice(tokens)
        x, ids, tw = x[mine], ids[mine], tw[mine]  # the rows this rank brings
        call = sharded
    else:
        runner = call = MoeRunner(config, weights, backend=args.backend)
    out = call(x, ids, tw)
    if sharded is None:
        us, _ = time_forward(lambda: call(x, ids, tw), device, repeat=args.repeat, use_graph=False)
    else:  # time_forward sizes its warm-up and groups by this process's clock: the ranks must agree on the count
        from moe_core.cli._sharded import median_us, sample_forwards

        us = median_us(sample_forwards(lambda: call(x, ids, tw), device, args.repeat, sharded)[0])
    if sharded is not None:
        out = whole_output(sharded, out, tokens)
        x, ids, tw = random_inputs(config, tokens, device, seed=args.seed + 1)
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
    if sharded is not None:
        d = sharded.dispatcher
        report.update(
            tp=args.tp,
            ep=args.ep,
            ranks=args.tp * args.ep,
            dispatcher=d.name,
            dispatcher_distribution=sharded.dispatcher_entry.distribution,
            dispatch_format=d.format,
            rank0_tokens=mine.stop - mine.start,
        )
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
