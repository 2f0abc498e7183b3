"""Options that mean the same in every ``moe`` command, defined once.

``--tokens`` is always a comma-separated list of token counts (``moe run``
takes a list of one); ``--device`` always defaults to CUDA when it is
available, else the CPU; ``--dtype`` offers the short float names; the
problem's shape (``--preset`` and the sizes that override it) is the same in
``moe run``, ``moe select record`` and ``moe backends --explain``. Parsing
happens at the command line (argparse ``type=``), so a bad value is a usage
error naming the option; torch is imported only when a device is resolved.
"""

from __future__ import annotations

import argparse

from moe_core.dtypes import FLOAT_DTYPE_NAMES


def token_counts(text: str) -> list[int]:
    """``"1,8,64"`` -> ``[1, 8, 64]``; every count a non-negative integer."""
    try:
        counts = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not counts or any(c < 0 for c in counts):
        raise argparse.ArgumentTypeError(f"expected token counts >= 0, got {text!r}")
    return counts


def add_tokens(parser: argparse.ArgumentParser, default: str | None, what: str) -> None:
    parser.add_argument(
        "--tokens", "-m", type=token_counts, default=None if default is None else token_counts(default), help=what
    )


def add_device(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", help="cpu or cuda[:N] (default: cuda if available, else cpu)")


def resolve_device(args):
    """The ``torch.device`` of ``--device``, or the default."""
    import torch

    return torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))


def add_dtype(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dtype", choices=sorted(FLOAT_DTYPE_NAMES), default="bf16", help="activation dtype (default bf16)"
    )


def add_problem(parser: argparse.ArgumentParser, default_preset: str | None = "tiny") -> None:
    """A layer shape: ``--preset`` and the sizes, activation, bias, dtype and scheme that override it."""
    from moe_core.presets import PRESETS

    parser.add_argument(
        "--preset", choices=sorted(PRESETS), default=default_preset, help=f"layer shape (default: {default_preset})"
    )
    parser.add_argument("--experts", type=int, help="number of experts E (overrides the preset)")
    parser.add_argument("--top-k", type=int, help="experts per token k")
    parser.add_argument("--hidden", type=int, help="hidden size H")
    parser.add_argument("--intermediate", type=int, help="expert intermediate size I")
    parser.add_argument("--activation", choices=("silu", "gelu", "swiglu_oai"), help="gated activation")
    parser.add_argument(
        "--bias",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="expert biases b13/b2 (default: the preset's)",
    )
    add_dtype(parser)
    parser.add_argument(
        "--scheme", help="weight quant scheme of moe_core.schemes (default: same as --dtype; a wrong name lists them)"
    )


def problem_config(args):
    """The ``MoeConfig`` of ``add_problem``'s options."""
    from moe_core.config import MoeConfig
    from moe_core.dtypes import float_dtype
    from moe_core.presets import PRESETS

    preset = PRESETS[args.preset]
    return MoeConfig(
        num_experts=args.experts or preset.num_experts,
        top_k=args.top_k or preset.top_k,
        hidden_size=args.hidden or preset.hidden_size,
        intermediate_size=args.intermediate or preset.intermediate_size,
        quant_scheme=args.scheme or args.dtype,
        activation=args.activation or preset.activation,
        has_bias=preset.has_bias if args.bias is None else args.bias,
        dtype=float_dtype(args.dtype),
    )


def add_parallel(parser: argparse.ArgumentParser, what: str, *, many_dispatchers: bool = False) -> None:
    """``--tp``, ``--ep``, ``--a2a`` and ``--timeout``: the layer sharded over TP x EP ranks (``what`` says
    what a command does with them); ``many_dispatchers``: ``--a2a`` repeatable (``moe bench`` times each)."""
    group = parser.add_argument_group(
        "parallel (moe_core.distributed)",
        "With --tp/--ep above 1 the layer is sharded over TP x EP ranks: spawned on this machine (gloo on the "
        "CPU, NCCL with one GPU per rank), or, under torchrun, the ranks torchrun started (env:// "
        f"initialisation). {what}",
    )
    group.add_argument("--tp", type=int, default=1, help="tensor-parallel ranks (split I)")
    group.add_argument("--ep", type=int, default=1, help="expert-parallel ranks (split E)")
    group.add_argument(
        "--a2a",
        metavar="NAME",
        action="append" if many_dispatchers else "store",
        default=None,
        help="token dispatcher of group moe.a2a (moe backends lists them): 'replicate' (default: every rank "
        "brings every token, experts held elsewhere masked, one all-reduce) or 'all_to_all' (each rank brings "
        "its share of the batch, each (token, expert) pair sent to its expert's rank and back; --tp 1), or an "
        "installed plugin's; 'dist:NAME' picks a distribution" + ("; repeatable: each is timed" * many_dispatchers),
    )
    group.add_argument(
        "--timeout",
        type=float,
        default=120.0,
        help="seconds a collective waits for a rank before the run fails (a rank that dies ends it at once)",
    )
