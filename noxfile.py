"""Test sessions: core alone, each plugin with core, lint.

Every session builds the packages from the working tree and installs them
into a fresh virtualenv, with ``constraints/cpu.txt`` pinning torch to the
CPU wheel (an unpinned torch would pull a multi-GB CUDA build).
Run everything with ``nox``; one session with ``nox -s core``.
"""

from __future__ import annotations

from pathlib import Path

import nox

ROOT = Path(__file__).parent
CONSTRAINTS = ("-c", str(ROOT / "constraints" / "cpu.txt"))

nox.options.reuse_existing_virtualenvs = False
nox.options.error_on_missing_interpreters = True

#: session name -> plugin folder
PLUGINS = {
    "triton": "plugins/triton-moe",
    "flashinfer_mxfp4": "plugins/flashinfer-mxfp4",
    "cutlass_fp4": "plugins/cutlass-fp4",
}


def _pytest(session: nox.Session, tests: str, *extra: str) -> None:
    session.run("python", "-m", "pytest", tests, "-q", "-rs", *extra, *session.posargs)


@nox.session
def core(session: nox.Session) -> None:
    """moe-core's own tests (plugin machinery, runner, CLI, numerics)."""
    session.install(*CONSTRAINTS, "./core[test]")
    _pytest(session, "core/tests")


@nox.session
def transformers(session: nox.Session) -> None:
    """Cross-check against Hugging Face transformers' MoE blocks (random weights, no download)."""
    session.install(*CONSTRAINTS, "./core[test,transformers]")
    _pytest(session, "core/tests/test_transformers_crosscheck.py")


def _plugin_session(name: str, folder: str):
    @nox.session(name=name)
    def plugin(session: nox.Session) -> None:
        session.install(*CONSTRAINTS, "./core[test]", f"./{folder}[test]")
        _pytest(session, f"{folder}/tests")

    plugin.__doc__ = f"{folder} installed with core into a fresh environment, its tests against core."
    return plugin


for _name, _folder in PLUGINS.items():
    globals()[f"plugin_{_name}"] = _plugin_session(_name, _folder)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff over every package."""
    session.install("ruff")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
