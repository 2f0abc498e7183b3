"""The ``moe`` command.

Each subcommand lives in its own module exposing ``register(subparsers)``; a
module imports torch (or anything heavy) only inside its handler, so
``moe backends`` answers without importing torch kernels or any plugin.
"""

from __future__ import annotations

import argparse
import importlib
import sys

#: subcommands, in the order ``moe --help`` lists them; each lives in the module
#: of the same name with '-' written '_' (``new-plugin`` -> ``moe_core.cli.new_plugin``)
COMMANDS = ("backends", "run", "check", "bench", "tune", "warmup", "new-plugin")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="moe",
        description=(
            "Run mixture-of-experts layers through installable kernel backends. "
            "Backends are plugins found through the entry-point group 'moe.fused_ops'."
        ),
        epilog=(
            "Environment: MOE_PLUGINS (allow-list, empty = only core's torch backend), "
            "MOE_DISABLE_PLUGINS (block-list), MOE_STRICT_PLUGINS=1 (plugin load failures are fatal)."
        ),
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in COMMANDS:
        importlib.import_module(f"moe_core.cli.{name.replace('-', '_')}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        from moe_core.errors import MoeError

        if isinstance(exc, MoeError):
            print(f"moe {args.command}: error: {exc}", file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
