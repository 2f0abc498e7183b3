"""The seed scenario (SGLang PR #30426) in a fresh virtual environment.

``pip install ./core ./plugins/flashinfer-mxfp4`` into a new venv, then, in a
fresh interpreter, ``MoeRunner(mxfp4 config, weights, backend="flashinfer_mxfp4")``
must fail ONLY because this machine cannot run it (the support reason), never
because the backend is "not installed" or "not registered"; and
``moe backends --json`` must list it. To avoid re-downloading torch and
flashinfer, the new venv sees this environment's third-party packages (every
site-packages entry except moe's own distributions) through a ``.pth`` file;
moe-core and the plugin are built and installed from the working tree, offline.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
CONSTRAINTS = ROOT / "constraints" / "cpu.txt"


def _is_moe_own(name: str) -> bool:
    lowered = name.lower().replace("-", "_")
    return lowered.startswith(("moe_", "__editable__")) or "moe_core" in lowered or "moe_flashinfer" in lowered


def _shared_site(tmp: Path) -> Path:
    """A folder of links to this environment's site-packages entries, moe's own excluded."""
    shared = tmp / "shared-site"
    shared.mkdir()
    purelib = Path(sysconfig.get_paths()["purelib"])
    for entry in purelib.iterdir():
        if _is_moe_own(entry.name) or entry.name in ("__pycache__",):
            continue
        if entry.suffix == ".pth" and _is_moe_own(entry.read_text(errors="ignore")):
            continue
        (shared / entry.name).symlink_to(entry)
    return shared


def _offline_build_flags() -> list[str]:
    """Build offline with this environment's setuptools when it is new enough (PEP 639 license), else fetch one."""
    try:
        import setuptools
        from packaging.version import Version

        if Version(setuptools.__version__) >= Version("77"):
            return ["--no-index", "--no-build-isolation"]
    except ImportError:
        pass
    return []


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("seed")
    root = tmp / "venv"
    base = getattr(sys, "_base_executable", sys.executable)
    # no pip/setuptools of its own: the shared site's (this environment's) are used, offline
    subprocess.run([base, "-m", "venv", "--without-pip", str(root)], check=True, timeout=300)
    python = root / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    Path(purelib, "_moe_test_shared_site.pth").write_text(f"import site; site.addsitedir({str(_shared_site(tmp))!r})\n")
    proc = subprocess.run(
        [
            str(python),
            "-m",
            "pip",
            "install",
            *_offline_build_flags(),
            "-c",
            str(CONSTRAINTS),
            str(ROOT / "core"),
            str(ROOT / "plugins" / "flashinfer-mxfp4"),
        ],
        capture_output=True,
        text=True,
        timeout=900,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return root


def run(venv: Path, *argv: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MOE_") and k != "PYTHONPATH"}
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=300, env=env, cwd=venv)


SEED = """
import sys, torch
from moe_core import MoeConfig, MoeRunner, BackendUnavailableError
from moe_core.synthetic import random_weights
import moe_core, moe_flashinfer_mxfp4
print("core from", moe_core.__file__)
print("plugin from", moe_flashinfer_mxfp4.__file__)
cfg = MoeConfig(8, 2, 256, 128, quant_scheme="mxfp4", activation="swiglu_oai", dtype=torch.bfloat16, has_bias=True)
try:
    MoeRunner(cfg, random_weights(cfg), backend="flashinfer_mxfp4")
except BackendUnavailableError as exc:
    print("REASON", str(exc).replace(chr(10), " | "))
else:
    print("BOUND")
"""


def test_installed_into_a_fresh_venv_from_the_working_tree(venv):
    proc = run(venv, str(venv / "bin" / "python"), "-c", textwrap.dedent(SEED))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert str(venv) in lines[0] and str(venv) in lines[1]  # not this environment's (editable) copies


def test_explicit_backend_fails_only_with_the_support_reason(venv):
    proc = run(venv, str(venv / "bin" / "python"), "-c", textwrap.dedent(SEED))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (reason,) = [line for line in proc.stdout.splitlines() if line.startswith(("REASON", "BOUND"))]
    assert reason.startswith("REASON runner backend 'flashinfer_mxfp4' cannot run this problem")
    assert "CUDA" in reason
    assert "not installed" not in reason and "not registered" not in reason and "failed to load" not in reason


def test_moe_backends_json_lists_it(venv):
    proc = run(venv, str(venv / "bin" / "moe"), "backends", "--json")
    assert proc.returncode == 0, proc.stderr
    rows = {r["name"]: r for r in json.loads(proc.stdout)}
    assert rows["flashinfer_mxfp4"]["distribution"] == "moe-flashinfer-mxfp4"
    assert rows["flashinfer_mxfp4"]["status"] == "discovered"
    assert rows["torch"]["distribution"] == "moe-core"
    checked = run(venv, str(venv / "bin" / "moe"), "backends", "--check", "--json")
    rows = {r["name"]: r for r in json.loads(checked.stdout)}
    assert rows["flashinfer_mxfp4"]["status"] in ("available", "unavailable")  # loaded: neither "error" nor missing
    if rows["flashinfer_mxfp4"]["status"] == "unavailable":
        assert "CUDA" in rows["flashinfer_mxfp4"]["reason"]
