"""Options that mean the same in every ``moe`` command, defined once.

``--tokens`` is always a comma-separated list of token counts (``moe run``
takes a list of one); ``--device`` always defaults to CUDA when it is
available, else the CPU; ``--dtype`` offers the short float names. Parsing
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
