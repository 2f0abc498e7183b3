"""Checks nox runs inside a session's environment against what was installed there (not the source tree).

python tests/installed/checks.py from-wheel PACKAGE        # PACKAGE is imported from site-packages
python tests/installed/checks.py skeleton-listed NAME DIST # moe backends lists a fresh moe new-plugin skeleton
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import sys
import sysconfig


def from_wheel(package: str) -> None:
    module = importlib.import_module(package)
    assert module.__file__.startswith(sysconfig.get_paths()["purelib"]), f"{module.__file__} is not the installed wheel"
    print(package, "imported from the installed wheel:", module.__file__)


def _rows(*args: str) -> dict:
    from moe_core.cli import main

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["backends", "--json", *args]) == 0
    return {r["name"]: r for r in json.loads(buf.getvalue())}


def skeleton_listed(name: str, dist: str) -> None:
    row = _rows()[name]
    assert row["distribution"] == dist and row["status"] == "discovered", row
    row = _rows("--check")[name]
    assert row["status"] == "unavailable" and "not implemented yet" in row["reason"], row
    print("moe backends lists", name, ":", row["status"], "-", row["reason"])


if __name__ == "__main__":
    command, *args = sys.argv[1:]
    {"from-wheel": from_wheel, "skeleton-listed": skeleton_listed}[command](*args)
