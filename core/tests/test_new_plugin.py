"""``moe new-plugin``: names, files, refusals, and a skeleton that installs and is found at once."""

from __future__ import annotations

import ast
import json
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from fresh_venv import FreshVenv

from moe_core import BackendUnavailableError, InvalidInputError, MoeConfig, MoeProblem
from moe_core.cli import COMMANDS, main
from moe_core.cli.new_plugin import core_requirement, plugin_names, render, write_plugin
from moe_core.selection import select
from moe_core.testing.distributions import write_distribution

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

NOT_IMPLEMENTED = "its kernel is not implemented yet"
PROBLEM = MoeProblem(MoeConfig(8, 2, 256, 128, quant_scheme="bf16", dtype=torch.bfloat16), "cpu")


def run_cli(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


# ---- names --------------------------------------------------------------------


def test_command_is_listed_and_explains_itself(capsys):
    assert "new-plugin" in COMMANDS
    with pytest.raises(SystemExit) as exit_info:
        main(["new-plugin", "--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    for words in ("NAME", "--dir", "--force", "--distribution", "fails", "moe backends --check", "conformance"):
        assert words in " ".join(text.split()), words


@pytest.mark.parametrize(
    ("name", "distribution", "package", "class_name"),
    [
        ("my_kernels", "moe-my-kernels", "moe_my_kernels", "MyKernelsFusedOp"),
        ("k2", "moe-k2", "moe_k2", "K2FusedOp"),
    ],
)
def test_default_names(name, distribution, package, class_name):
    names = plugin_names(name)
    assert (names.backend, names.distribution, names.package, names.class_name) == (
        name,
        distribution,
        package,
        class_name,
    )


def test_given_distribution_is_sanitized_into_a_package_name():
    names = plugin_names("fast", "Acme.Fast-Kernels")
    assert names.distribution == "Acme.Fast-Kernels" and names.package == "acme_fast_kernels"
    assert plugin_names("fast", "3d-kernels").package == "moe_3d_kernels"


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("My-Kernels", "lower-case Python identifier"),
        ("1fast", "lower-case Python identifier"),
        ("", "lower-case Python identifier"),
        ("moe-triton:triton", "lower-case Python identifier"),
        ("class", "Python keyword"),
        ("auto", "reserved"),
    ],
)
def test_bad_names_are_refused_with_a_reason(tmp_path, capsys, name, message):
    with pytest.raises(InvalidInputError, match=message):
        plugin_names(name)
    code, _, err = run_cli(capsys, "new-plugin", name, "--dir", str(tmp_path / "x"))
    assert code == 2 and message in err and err.startswith("moe new-plugin: error:")
    assert not (tmp_path / "x").exists()


def test_bad_distribution_is_refused(tmp_path):
    with pytest.raises(InvalidInputError, match="distribution name"):
        write_plugin("fast", tmp_path / "x", distribution="-bad-")


@pytest.mark.parametrize("taken", ["torch", "triton", "flashinfer_mxfp4"])
def test_names_already_provided_are_refused(tmp_path, capsys, taken):
    code, _, err = run_cli(capsys, "new-plugin", taken, "--dir", str(tmp_path / "x"))
    assert code == 2 and "already provided by" in err and "duplicate" in err
    assert not (tmp_path / "x").exists()


def test_core_requirement_is_this_minor_series():
    from moe_core import __version__

    major, minor = (int(p) for p in __version__.split(".")[:2])
    req = core_requirement()
    assert req.startswith(f"moe-core>={major}.{minor},<")
    from packaging.requirements import Requirement

    assert Requirement(req).specifier.contains(__version__)


# ---- files --------------------------------------------------------------------


def test_writes_the_skeleton(tmp_path, capsys):
    folder = tmp_path / "my_kernels"
    code, out, _ = run_cli(capsys, "new-plugin", "my_kernels", "--dir", str(folder))
    assert code == 0
    files = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
    assert files == [
        "README.md",
        "pyproject.toml",
        "src/moe_my_kernels/__init__.py",
        "src/moe_my_kernels/fused_op.py",
        "src/moe_my_kernels/plugin.py",
        "tests/test_conformance.py",
    ]
    assert "pip install" in out and "moe backends --check" in out
    meta = tomllib.loads((folder / "pyproject.toml").read_text())
    assert meta["project"]["name"] == "moe-my-kernels"
    assert meta["project"]["dependencies"] == [core_requirement()]
    assert meta["project"]["entry-points"]["moe.fused_ops"] == {"my_kernels": "moe_my_kernels.plugin"}
    assert meta["build-system"]["build-backend"] == "setuptools.build_meta"
    for path in folder.rglob("*.py"):
        ast.parse(path.read_text(), filename=str(path))
    ops = (folder / "src/moe_my_kernels/fused_op.py").read_text()
    assert 'name = "my_kernels"' in ops and "class MyKernelsFusedOp(FusedOp)" in ops
    assert "class TestMyKernelsFusedOp(BackendConformance)" in (folder / "tests/test_conformance.py").read_text()


def test_default_folder_is_the_name_in_the_working_directory(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert run_cli(capsys, "new-plugin", "here")[0] == 0
    assert (tmp_path / "here" / "pyproject.toml").is_file()


def test_existing_folder_needs_force(tmp_path, capsys):
    folder = tmp_path / "fast"
    folder.mkdir()
    (folder / "NOTES.txt").write_text("mine")
    code, _, err = run_cli(capsys, "new-plugin", "fast", "--dir", str(folder))
    assert code == 2 and "already exists" in err and "--force" in err
    assert [p.name for p in folder.iterdir()] == ["NOTES.txt"]
    (folder / "pyproject.toml").write_text("old")
    assert run_cli(capsys, "new-plugin", "fast", "--dir", str(folder), "--force")[0] == 0
    assert (folder / "NOTES.txt").read_text() == "mine"  # other files are left alone
    assert 'name = "moe-fast"' in (folder / "pyproject.toml").read_text()  # skeleton files overwritten


def test_an_empty_existing_folder_is_fine_and_a_file_is_not(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert run_cli(capsys, "new-plugin", "fast", "--dir", str(tmp_path / "empty"))[0] == 0
    (tmp_path / "file").write_text("")
    code, _, err = run_cli(capsys, "new-plugin", "fast", "--dir", str(tmp_path / "file"), "--force")
    assert code == 2 and "not a folder" in err


# ---- the skeleton, discovered in-process ---------------------------------------------


def _put_on_path(site, folder: Path, names) -> None:
    """Make the written skeleton an installed distribution: a dist-info plus its src/ on sys.path."""
    meta = tomllib.loads((folder / "pyproject.toml").read_text())
    write_distribution(
        site.root / "dist",
        meta["project"]["name"],
        meta["project"]["version"],
        meta["project"]["entry-points"]["moe.fused_ops"],
    )
    for path in (site.root / "dist", folder / "src"):
        sys.path.insert(0, str(path))
        site._paths.append(str(path))


def test_skeleton_is_discovered_and_fails_closed(site, tmp_path, capsys):
    names, folder, _ = write_plugin("my_kernels", tmp_path / "my_kernels")
    _put_on_path(site, folder, names)
    code, out, _ = run_cli(capsys, "backends", "--json")
    row = next(r for r in json.loads(out) if r["name"] == "my_kernels")
    assert code == 0 and row["status"] == "discovered" and row["distribution"] == "moe-my-kernels"
    code, out, _ = run_cli(capsys, "backends", "--check", "--json")
    row = next(r for r in json.loads(out) if r["name"] == "my_kernels")
    assert row["status"] == "unavailable" and NOT_IMPLEMENTED in row["reason"]
    registry = site.registry()
    # never selected: auto picks another backend, an explicit request says why not
    assert select(PROBLEM, "auto", registry).name != "my_kernels"
    with pytest.raises(BackendUnavailableError, match=NOT_IMPLEMENTED):
        select(PROBLEM, "my_kernels", registry)


def test_skeleton_conformance_tests_skip_with_the_reason(site, tmp_path):
    names, folder, _ = write_plugin("my_kernels", tmp_path / "my_kernels")
    _put_on_path(site, folder, names)
    proc = site.python(
        f"""
        import sys, pytest
        sys.exit(pytest.main([{str(folder / "tests")!r}, "-q", "-rs", "-p", "no:cacheprovider"]))
        """,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert NOT_IMPLEMENTED in proc.stdout
    assert "1 passed" in proc.stdout and "failed" not in proc.stdout


# ---- the skeleton, pip-installed into a fresh virtualenv ---------------------------------


def test_skeleton_pip_installs_into_a_fresh_venv_and_is_found_at_once(tmp_path):
    venv = FreshVenv(tmp_path / "venv")
    folder = tmp_path / "my_kernels"
    venv.run("-m", "moe_core.cli", "new-plugin", "my_kernels", "--dir", str(folder))
    venv.run("-m", "pip", "install", "--quiet", str(folder))
    listing = json.loads(venv.run("-m", "moe_core.cli", "backends", "--json").stdout)
    row = next(r for r in listing if r["name"] == "my_kernels")
    assert row["distribution"] == "moe-my-kernels" and row["version"] == "0.1.0"
    checked = json.loads(venv.run("-m", "moe_core.cli", "backends", "--check", "--json").stdout)
    row = next(r for r in checked if r["name"] == "my_kernels")
    assert row["status"] == "unavailable" and NOT_IMPLEMENTED in row["reason"]
    # installed from the wheel pip built, not from the source folder
    where = venv.run("-c", "import moe_my_kernels; print(moe_my_kernels.__file__)", cwd=tmp_path).stdout
    assert str(tmp_path / "venv") in where
    tests = venv.run("-m", "pytest", str(folder / "tests"), "-q", "-rs", "-p", "no:cacheprovider", cwd=tmp_path)
    assert NOT_IMPLEMENTED in tests.stdout and "1 passed" in tests.stdout
    script = textwrap.dedent(
        """
        import torch
        from moe_core import BackendUnavailableError, MoeConfig, MoeRunner
        from moe_core.synthetic import random_weights
        cfg = MoeConfig(8, 2, 64, 32, quant_scheme="bf16", dtype=torch.bfloat16)
        assert MoeRunner(cfg, random_weights(cfg)).backend != "my_kernels"
        try:
            MoeRunner(cfg, random_weights(cfg), backend="my_kernels")
        except BackendUnavailableError as exc:
            print("refused:", exc)
        """
    )
    assert NOT_IMPLEMENTED in venv.run("-c", script, cwd=tmp_path).stdout


def test_render_substitutes_every_placeholder():
    for path, text in render(plugin_names("my_kernels")).items():
        assert "${" not in text and "$backend" not in text, path
