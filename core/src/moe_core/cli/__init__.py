"""The ``moe`` command.

Each subcommand lives in its own module exposing ``register(subparsers)``; a
module imports torch (or anything heavy) only inside its handler, so
``moe backends`` answers without importing torch kernels or any plugin.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys

#: subcommands, in the order ``moe --help`` lists them; each lives in the module
#: of the same name with '-' written '_' (``new-plugin`` -> ``moe_core.cli.new_plugin``)
COMMANDS = ("backends", "run", "check", "bench", "select", "tune", "warmup", "new-plugin")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="moe",
        description=(
            "Run mixture-of-experts layers through installable kernel backends. "
            "Backends are plugins found through the entry-point group 'moe.fused_ops', token dispatchers "
            "through 'moe.a2a'."
        ),
        epilog=(
            "Each plugin option has an environment variable that means the same: MOE_PLUGINS, "
            "MOE_DISABLE_PLUGINS, MOE_STRICT_PLUGINS=1 (the option wins for this command)."
        ),
    )
    plugins = parser.add_argument_group("plugins (before the command: moe --plugins triton run ...)")
    plugins.add_argument(
        "--plugins",
        metavar="A,B",
        help="allow-list of backend or distribution names; '' = no plugin but moe-core's own (MOE_PLUGINS)",
    )
    plugins.add_argument(
        "--disable-plugins", metavar="A,B", help="block-list of backend or distribution names (MOE_DISABLE_PLUGINS)"
    )
    plugins.add_argument(
        "--strict-plugins",
        action="store_true",
        help="a plugin that fails to load or raises is an error, not a warning (MOE_STRICT_PLUGINS=1)",
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
        with _plugin_environment(args):
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


@contextlib.contextmanager
def _plugin_environment(args):
    """The plugin options as their environment variables (read at each use) for this command only."""
    from moe_core.filters import ALLOW_VAR, BLOCK_VAR, STRICT_VAR

    wanted = {
        ALLOW_VAR: args.plugins,
        BLOCK_VAR: args.disable_plugins,
        STRICT_VAR: "1" if args.strict_plugins else None,
    }
    saved = {var: os.environ.get(var) for var in wanted}
    os.environ.update({var: value for var, value in wanted.items() if value is not None})
    try:
        yield
    finally:
        for var, value in saved.items():
            if value is None:
                os.environ.pop(var, None)
            else:
                os.environ[var] = value


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
