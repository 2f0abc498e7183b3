"""Every first-party plugin and the example plugin installed together (``nox -s all_plugins``).

What is expected is read from the repository's ``pyproject.toml`` files, not
written down here: every backend a distribution declares in the entry-point
group ``moe.fused_ops`` must be listed by ``moe backends`` with that
distribution, load cleanly, report a status that matches what it can actually
run here, and take part in ``backend="auto"`` by its declared priority.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from moe_core import (
    DuplicateBackendError,
    MoeConfig,
    MoeProblem,
    MoeRunner,
    PluginRegistry,
    PluginWarning,
    explain,
    select,
)
from moe_core.filters import ALLOW_VAR, BLOCK_VAR, STRICT_VAR, normalize_distribution
from moe_core.testing.cases import PASSED, SKIPPED, Conformance, cases_of
from moe_core.testing.distributions import plugin_source, write_distribution

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[2]
PYPROJECTS = [ROOT / "core" / "pyproject.toml", *sorted(ROOT.glob("plugins/*/pyproject.toml"))]
PYPROJECTS += sorted(ROOT.glob("examples/*/pyproject.toml"))
GROUP = "moe.fused_ops"


def _declared() -> dict[str, tuple[str, str]]:
    """backend name -> (distribution, version), from every pyproject's entry points."""
    out: dict[str, tuple[str, str]] = {}
    for path in PYPROJECTS:
        project = tomllib.loads(path.read_text())["project"]
        for name in project.get("entry-points", {}).get(GROUP, {}):
            assert name not in out, f"backend {name!r} is declared by {out[name][0]} and {project['name']}"
            out[name] = (project["name"], project["version"])
    return out


DECLARED = _declared()
DISTRIBUTIONS = {
    tomllib.loads(p.read_text())["project"]["name"]: tomllib.loads(p.read_text())["project"]["version"]
    for p in PYPROJECTS
}
SILU_BF16 = MoeConfig(8, 2, 256, 128, quant_scheme="bf16", activation="silu", dtype=torch.bfloat16)
GELU_FP32 = MoeConfig(8, 2, 256, 128, quant_scheme="fp32", activation="gelu", dtype=torch.float32)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch, tmp_path):
    for var in (ALLOW_VAR, BLOCK_VAR, STRICT_VAR):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr("moe_core.plugins._default", None)
    monkeypatch.setenv("MOE_SELECTION_DIR", str(tmp_path / "selection"))  # no measured table of this machine's user


def _moe(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k not in (ALLOW_VAR, BLOCK_VAR, STRICT_VAR)}
    full.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "moe_core.cli", *args], capture_output=True, text=True, env=full, timeout=600
    )


def _rows(*args: str, env: dict[str, str] | None = None) -> list[dict]:
    proc = _moe("backends", "--json", *args, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return [r for r in json.loads(proc.stdout) if r["kind"] == "fused_op"]  # the runner backends, not dispatchers


def test_every_repository_distribution_is_installed():
    for dist, version in DISTRIBUTIONS.items():
        assert md.version(dist) == version, f"{dist} {version} is not installed in this environment"


def test_every_declared_backend_is_listed_with_its_distribution():
    rows = _rows()
    by_name: dict[str, list[dict]] = {}
    for row in rows:
        by_name.setdefault(row["name"], []).append(row)
    for name, (dist, version) in DECLARED.items():
        assert name in by_name, f"{dist} declares backend {name!r}, but moe backends does not list it"
        (row,) = by_name[name]  # exactly one distribution provides it
        assert normalize_distribution(row["distribution"]) == normalize_distribution(dist)
        assert row["version"] == version and row["status"] == "discovered"
    # and nothing that the repository does not declare sneaks in from these distributions
    ours = {normalize_distribution(d) for d in DISTRIBUTIONS}
    extra = [r["name"] for r in rows if normalize_distribution(r["distribution"]) in ours and r["name"] not in DECLARED]
    assert not extra, f"backends registered but not declared in a pyproject: {extra}"


def test_no_two_distributions_provide_one_backend():
    assert PluginRegistry().duplicates() == {}


def test_check_loads_every_plugin_in_strict_mode():
    proc = _moe("backends", "--check", "--json", env={STRICT_VAR: "1"})
    assert proc.returncode == 0, f"a plugin failed to load:\n{proc.stdout}\n{proc.stderr}"
    rows = {r["name"]: r for r in json.loads(proc.stdout)}
    for name in DECLARED:
        row = rows[name]
        assert row["status"] in ("available", "unavailable"), row
        if row["status"] == "unavailable":
            assert row["reason"], f"{name} is unavailable without saying why"
    assert rows["torch"]["status"] == "available"


@pytest.mark.parametrize("name", sorted(DECLARED))
def test_status_is_truthful(name):
    """available <=> at least one reference case runs (and passes) here; unavailable => none does."""
    row = next(r for r in PluginRegistry().describe(check=True) if r.name == name)
    conformance = Conformance(name, DEVICE)
    passed = 0
    for case in cases_of("reference"):
        result = conformance.run(case)
        assert result.status in (PASSED, SKIPPED), f"{name} accepted {case.id} and got it wrong: {result.reason}"
        passed += result.status == PASSED
        if passed and row.status == "available":
            break
    if row.status == "available":
        assert passed, f"{name} says it is available here, but declines every reference case"
    else:
        assert not passed, f"{name} says it is unavailable ({row.reason}), but ran a reference case"


def _usable(problem: MoeProblem, registry: PluginRegistry) -> dict[str, int]:
    """backend name -> priority, for every backend whose support check passes."""
    out = {}
    for qualified, reason in explain(problem, registry):
        if reason is None:
            dist, _, name = qualified.rpartition(":")
            entry = next(e for e in registry.entries() if e.name == name and e.distribution == dist)
            out[name] = max(op.priority for op in registry.load(entry).fused_ops)
    return out


@pytest.mark.parametrize("config", [SILU_BF16, GELU_FP32], ids=["silu-bf16", "gelu-fp32"])
def test_auto_picks_the_highest_priority_usable_backend(config):
    problem = MoeProblem(config, DEVICE)
    registry = PluginRegistry()
    usable = _usable(problem, registry)
    assert "torch" in usable
    best = min(usable, key=lambda n: (-usable[n], n))
    assert select(problem, "auto", registry).name == best


def test_auto_prefers_torch_grouped_over_torch_on_this_problem():
    registry = PluginRegistry()
    problem = MoeProblem(SILU_BF16, DEVICE)
    usable = _usable(problem, registry)
    assert usable["torch_grouped"] > usable["torch"]
    chosen = select(problem, "auto", registry).name
    assert chosen != "torch"
    if not torch.cuda.is_available():
        # on a CPU no first-party GPU kernel can run, so the example plugin wins
        assert chosen == "torch_grouped", usable
    # torch_grouped declines gelu: auto falls through to another backend
    assert select(MoeProblem(GELU_FP32, DEVICE), "auto", registry).name != "torch_grouped"


def test_filters_change_the_auto_choice(monkeypatch):
    problem = MoeProblem(SILU_BF16, DEVICE)
    monkeypatch.setenv(ALLOW_VAR, "")
    assert select(problem, "auto", PluginRegistry()).name == "torch"  # only core's own backend
    monkeypatch.setenv(ALLOW_VAR, "moe-torch-grouped")
    assert select(problem, "auto", PluginRegistry()).name == "torch_grouped"
    monkeypatch.delenv(ALLOW_VAR)
    monkeypatch.setenv(BLOCK_VAR, "torch_grouped")
    assert select(problem, "auto", PluginRegistry()).name != "torch_grouped"


def test_auto_runner_computes_the_reference_answer():
    from moe_core.reference import reference_for
    from moe_core.synthetic import random_inputs, random_weights
    from moe_core.tolerances import relative_l2, tolerance

    weights = random_weights(SILU_BF16, DEVICE)
    runner = MoeRunner(SILU_BF16, weights)
    x, ids, tw = random_inputs(SILU_BF16, 33, DEVICE)
    err = relative_l2(runner(x, ids, tw), reference_for(SILU_BF16, weights, x, ids, tw))
    assert err <= tolerance("bf16", torch.bfloat16), (runner.backend, err)


@pytest.fixture
def fork_of(tmp_path, monkeypatch):
    """Install a stand-in distribution that provides an existing backend name a second time."""

    def install(backend: str, dist: str, priority: int = 0) -> None:
        module = f"fork_{backend}_plugin"
        write_distribution(
            tmp_path,
            dist,
            "9.9",
            {backend: module},
            {module: plugin_source(backend, priority=priority, device_types=("cpu", "cuda"))},
        )
        monkeypatch.syspath_prepend(str(tmp_path))

    return install


@pytest.mark.parametrize(
    ("backend", "dist"), [("torch_grouped", "moe-torch-grouped"), ("torch", "moe-core")], ids=["example", "core"]
)
def test_a_duplicate_key_is_reported_and_resolvable(fork_of, monkeypatch, backend, dist):
    fork_of(backend, "acme-moe-fork", priority=1000)
    problem = MoeProblem(SILU_BF16, DEVICE)
    registry = PluginRegistry()
    assert set(registry.duplicates()) == {backend}
    with pytest.raises(DuplicateBackendError) as info:
        select(problem, backend, registry)
    assert dist in str(info.value) and "acme-moe-fork" in str(info.value)
    # auto leaves the ambiguous pair out (one warning naming both) and chooses among the others
    with pytest.warns(PluginWarning, match=f"{dist}.*acme-moe-fork|acme-moe-fork.*{dist}"):
        assert select(problem, "auto", registry).name != backend
    rows = [r for r in registry.describe(check=True) if r.name == backend]
    assert {r.distribution for r in rows} == {dist, "acme-moe-fork"}
    assert all(r.status == "error" and "duplicate" in r.reason for r in rows)
    # the user picks one: a qualified name...
    assert select(problem, f"{dist}:{backend}", registry).entry.distribution == dist
    assert select(problem, f"acme-moe-fork:{backend}", registry).entry.distribution == "acme-moe-fork"
    # ...or blocks one distribution, after which auto works again
    monkeypatch.setenv(BLOCK_VAR, "acme-moe-fork")
    assert select(problem, backend, registry).entry.distribution == dist
    select(problem, "auto", registry)
    monkeypatch.setenv(BLOCK_VAR, dist)
    assert select(problem, "auto", registry).name == backend  # the fork's priority 1000 wins


def test_every_plugin_declares_the_literal_api_version_it_was_written_for(monkeypatch):
    """Under a future moe-core (API version 2) every plugin written for version 1 is refused: its hook
    returns a literal, not ``moe_core.API_VERSION`` (which would claim compatibility with any core)."""
    import moe_core
    from moe_core import hookspecs, loading

    for module in (moe_core, hookspecs, loading):
        monkeypatch.setattr(module, "API_VERSION", 2)
    registry = PluginRegistry()
    plugins = [e for e in registry.entries() if normalize_distribution(e.distribution) != "moe-core"]
    assert {e.name for e in plugins} >= set(DECLARED) - {"torch"}
    for entry in plugins:
        result = registry.load(entry, strict=False)
        assert result.status == "incompatible" and "API version 1" in result.reason, (entry, result.reason)


SILU_BF16_SHAPE = ("--dtype", "bf16", "--experts", "8", "--top-k", "2", "--hidden", "256", "--intermediate", "128")


def test_measured_selection_between_torch_and_the_example(tmp_path):
    """``moe select record`` really times torch and torch_grouped here; auto then binds the one the record
    ranks first, whatever the priorities say, and ``moe run`` / ``moe backends --explain`` agree."""
    env = {"MOE_SELECTION_DIR": str(tmp_path / "table"), "MOE_PLUGINS": "moe-core,moe-torch-grouped"}
    proc = _moe("select", "record", *SILU_BF16_SHAPE, "--device", "cpu", "--tokens", "1,16", "--repeat", "5",
                "--json", env=env)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    recorded = json.loads(proc.stdout)
    hot = {m["backend"]: m["hot_us"] for m in recorded["measurements"]}
    assert set(hot) == {"torch", "torch_grouped"} and all(t > 0 for ts in hot.values() for t in ts.values())
    explained = json.loads(_moe("backends", "--explain", *SILU_BF16_SHAPE, "--device", "cpu", "--json", env=env).stdout)
    scores = {b["name"].partition(":")[2]: b["score"] for b in explained["backends"] if b["score"] is not None}
    assert set(scores) == {"torch", "torch_grouped"}
    best = min(scores, key=lambda n: (scores[n], n))
    if abs(scores["torch"] - scores["torch_grouped"]) > 0.01 * min(scores.values()):  # else priority breaks a tie
        assert explained["auto"]["backend"] == best and "measured fastest" in explained["auto"]["why"]
    ran = json.loads(_moe("run", *SILU_BF16_SHAPE, "--device", "cpu", "--json", env=env).stdout)
    assert ran["backend"] == explained["auto"]["backend"] and "measured" in ran["selected_because"]
