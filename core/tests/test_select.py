"""Measured selection: ``backend="auto"`` from the selection table (``moe_core.selection_table``), the plugins'
``Support.explicit_only`` and ``priority_for``, and the ``moe select`` / ``moe backends --explain`` commands.

Synthetic tables pin the edge cases (ties, stale versions, a corrupt file, missing token counts, a backend
uninstalled since the recording); the commands at the end time real stand-in backends on the CPU.
"""

from __future__ import annotations

import json
import warnings
from importlib.metadata import version

import pytest
import torch

from moe_core import MoeConfig, MoeProblem, MoeRunner
from moe_core.errors import BackendUnavailableError, InvalidInputError
from moe_core.selection import explain, explain_auto, select
from moe_core.selection_table import (
    DIR_VAR,
    RULE_VAR,
    Measurement,
    SelectionTableWarning,
    load,
    rank,
    record,
    table_path,
    torch_version,
)
from moe_core.synthetic import random_weights

CFG = MoeConfig(num_experts=4, top_k=2, hidden_size=32, intermediate_size=16, quant_scheme="fp32", dtype=torch.float32)
PROBLEM = MoeProblem(CFG, "cpu")


@pytest.fixture(autouse=True)
def table_dir(tmp_path, monkeypatch):
    monkeypatch.setenv(DIR_VAR, str(tmp_path / "selection"))
    monkeypatch.delenv(RULE_VAR, raising=False)
    return tmp_path / "selection"


def two_backends(site, fast_priority=0, slow_priority=50):
    site.add("moe-fast", "fast", priority=fast_priority)
    site.add("moe-slow", "slow", priority=slow_priority)
    return site.registry()


def times(name, dist, hot, cold=None, version="1.0"):
    return Measurement(name, dist, version, hot, cold or {})


def order(registry, problem=PROBLEM):
    """auto's order, leaving out moe-core's torch (always installed, priority 0, never measured here)."""
    return [s.name for s in explain_auto(problem, registry)[1] if s.name != "torch"]


# --- the table decides ------------------------------------------------------------------------------------------


def test_without_a_table_priority_decides(site):
    registry = two_backends(site)
    chosen = select(PROBLEM, "auto", registry)
    assert chosen.name == "slow" and "priority 50" in chosen.why and "moe select record" in chosen.why


def test_measured_faster_beats_higher_priority(site):
    registry = two_backends(site)
    record(PROBLEM, [times("fast", "moe-fast", {1: 10.0, 64: 50.0}), times("slow", "moe-slow", {1: 30.0, 64: 90.0})])
    chosen = select(PROBLEM, "auto", registry)
    assert chosen.name == "fast" and "measured fastest" in chosen.why and "next slow" in chosen.why
    by_name = {c.name: c for c in chosen.candidates}
    assert by_name["moe-fast:fast"].rank == 0 and by_name["moe-slow:slow"].rank == 1
    assert by_name["moe-fast:fast"].score == pytest.approx(1.0)
    assert by_name["moe-slow:slow"].times_us == {1: 30.0, 64: 90.0}


def test_a_tie_goes_to_priority(site):
    registry = two_backends(site)
    record(PROBLEM, [times("fast", "moe-fast", {1: 10.0}), times("slow", "moe-slow", {1: 10.05})])  # within 1 %
    chosen = select(PROBLEM, "auto", registry)
    assert chosen.name == "slow" and "priority 50 decides" in chosen.why


def test_the_rule_weighs_decode_or_prefill(site, monkeypatch):
    registry = two_backends(site)
    decode_fast = {1: 10.0, 8: 10.0, 4096: 3000.0}
    prefill_fast = {1: 14.0, 8: 14.0, 4096: 1000.0}
    record(PROBLEM, [times("fast", "moe-fast", decode_fast), times("slow", "moe-slow", prefill_fast)])
    assert order(registry) == ["fast", "slow"]  # decode (default): 4 x (1 + 1) + 3 vs 4 x (1.4 + 1.4) + 1
    monkeypatch.setenv(RULE_VAR, "prefill")
    assert order(registry) == ["slow", "fast"]
    monkeypatch.setenv(RULE_VAR, "fastest-ever")
    with pytest.raises(InvalidInputError, match="unknown selection rule"):
        select(PROBLEM, "auto", registry)


def test_cold_times_are_compared_when_every_backend_has_them(site):
    registry = two_backends(site)
    record(
        PROBLEM,
        [
            times("fast", "moe-fast", {1: 10.0}, cold={1: 40.0}),
            times("slow", "moe-slow", {1: 20.0}, cold={1: 25.0}),
        ],
    )
    chosen = select(PROBLEM, "auto", registry)
    assert chosen.name == "slow" and "cold weights" in chosen.why


@pytest.mark.parametrize("what", ["backend", "torch"])
def test_a_stale_record_is_ignored_with_a_warning(site, what, table_dir):
    registry = two_backends(site)
    record(PROBLEM, [times("fast", "moe-fast", {1: 1.0}, version="0.9" if what == "backend" else "1.0")])
    if what == "torch":
        data = json.loads(table_path().read_text())
        data["records"][0]["torch"] = "1.0.0"
        table_path().write_text(json.dumps(data))
    with pytest.warns(SelectionTableWarning, match="stale"):
        chosen = select(PROBLEM, "auto", registry)
    assert chosen.name == "slow"  # priority again
    [fast] = [c for c in chosen.candidates if c.name == "moe-fast:fast"]
    assert "stale record ignored" in fast.reason and ("0.9" in fast.reason or "torch 1.0.0" in fast.reason)


def test_recording_again_replaces_the_stale_record(site):
    registry = two_backends(site)
    record(PROBLEM, [times("fast", "moe-fast", {1: 1.0}, version="0.9")])
    record(PROBLEM, [times("fast", "moe-fast", {1: 1.0}), times("slow", "moe-slow", {1: 2.0})])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert select(PROBLEM, "auto", registry).name == "fast"
    [rec] = load()
    assert sorted(b["backend"] for b in rec["backends"]) == ["fast", "slow"] and rec["torch"] == torch_version()


@pytest.mark.parametrize("content", ["{not json", '{"format": 99, "records": []}', '{"format": 1, "records": [{}]}'])
def test_a_corrupt_table_is_ignored_with_a_warning(site, content, table_dir):
    registry = two_backends(site)
    table_dir.mkdir(parents=True)
    table_path().write_text(content)
    with pytest.warns(SelectionTableWarning, match="not a readable selection table"):
        assert select(PROBLEM, "auto", registry).name == "slow"


def test_only_the_token_counts_every_backend_has_are_compared(site):
    registry = two_backends(site)
    # fast is slower at the one count both have; its extra, faster count does not count
    record(PROBLEM, [times("fast", "moe-fast", {1: 20.0, 16: 1.0}), times("slow", "moe-slow", {1: 10.0})])
    chosen = select(PROBLEM, "auto", registry)
    assert chosen.name == "slow" and "tokens 1;" in chosen.why


def test_no_shared_token_count_falls_back_to_priority(site):
    registry = two_backends(site, fast_priority=60)
    record(PROBLEM, [times("fast", "moe-fast", {16: 1.0}), times("slow", "moe-slow", {1: 10.0})])
    chosen = select(PROBLEM, "auto", registry)
    assert chosen.name == "fast" and "no backend was measured" in chosen.why
    assert all("no token count" in c.reason for c in chosen.candidates if c.name in ("moe-fast:fast", "moe-slow:slow"))


def test_a_backend_uninstalled_since_the_recording_is_not_a_candidate(site):
    registry = two_backends(site)
    record(
        PROBLEM,
        [
            times("gone", "moe-gone", {1: 1.0}),
            times("fast", "moe-fast", {1: 30.0}),
            times("slow", "moe-slow", {1: 20.0}),
        ],
    )
    assert order(registry) == ["slow", "fast"]


def test_unmeasured_backends_rank_after_measured_ones(site):
    site.add("moe-new", "new", priority=100)
    registry = two_backends(site)
    record(PROBLEM, [times("fast", "moe-fast", {1: 10.0})])
    assert order(registry) == ["fast", "new", "slow"]
    [new] = [s for s in explain_auto(PROBLEM, registry)[1] if s.name == "new"]
    assert "not measured, priority 100" in new.why


def test_a_record_of_another_problem_does_not_apply(site):
    registry = two_backends(site)
    other = MoeProblem(MoeConfig(4, 2, 64, 16, quant_scheme="fp32", dtype=torch.float32), "cpu")
    record(other, [times("fast", "moe-fast", {1: 1.0}), times("slow", "moe-slow", {1: 9.0})])
    assert select(PROBLEM, "auto", registry).name == "slow"
    assert select(other, "auto", registry).name == "fast"
    installed = {"fast": ("moe-fast", "1.0"), "slow": ("moe-slow", "1.0")}
    assert rank(PROBLEM, installed, {"fast": 0, "slow": 50}).scores == {}


# --- what plugins say -------------------------------------------------------------------------------------------

EXPLICIT_ONLY = """
@classmethod
def check(cls, problem):
    from moe_core import Support
    answer = super().check(problem)
    return Support.explicit_only("would build for ~7 min; run `moe warmup`") if answer else answer
"""

BY_PROBLEM = """
@classmethod
def priority_for(cls, problem):
    return 90 if problem.config.hidden_size >= 64 else 1
"""


def test_explicit_only_is_passed_over_by_auto_but_binds_by_name(site):
    site.add("moe-slowbuild", "slowbuild", priority=100, body=EXPLICIT_ONLY)
    registry = site.registry()
    record(
        PROBLEM,
        [
            times("slowbuild", "moe-slowbuild", {1: 1.0}),
            times("torch", "moe-core", {1: 50.0}, version=version("moe-core")),
        ],
    )
    candidates, auto = explain_auto(PROBLEM, registry)
    assert "slowbuild" not in [s.name for s in auto]
    [row] = [c for c in candidates if c.name == "moe-slowbuild:slowbuild"]
    assert row.usable and not row.automatic and row.rank is None and "moe warmup" in row.reason
    assert ("moe-slowbuild:slowbuild", None) in explain(PROBLEM, registry)  # usable when named
    runner = MoeRunner(CFG, random_weights(CFG), backend="slowbuild", registry=registry)
    assert runner.backend == "slowbuild" and "by name" in runner.selection.why


def test_only_explicit_only_backends_left_is_an_error_that_says_so(site, monkeypatch):
    monkeypatch.setenv("MOE_PLUGINS", "moe-slowbuild")  # moe-core's torch is always there; block it
    monkeypatch.setenv("MOE_DISABLE_PLUGINS", "moe-core")
    site.add("moe-slowbuild", "slowbuild", priority=100, body=EXPLICIT_ONLY)
    with pytest.raises(BackendUnavailableError, match="usable when named; auto passes over it"):
        select(PROBLEM, "auto", site.registry())


def test_priority_may_depend_on_the_problem(site):
    site.add("moe-wide", "wide", priority=1, body=BY_PROBLEM)
    site.add("moe-mid", "mid", priority=50)
    registry = site.registry()
    wide = MoeProblem(MoeConfig(4, 2, 64, 16, quant_scheme="fp32", dtype=torch.float32), "cpu")
    assert select(PROBLEM, "auto", registry).name == "mid"
    assert select(wide, "auto", registry).name == "wide"


def test_a_priority_that_raises_is_skipped_with_a_warning(site):
    site.add(
        "moe-bad", "bad", priority=100, body="@classmethod\ndef priority_for(cls, problem):\n    raise OSError('x')\n"
    )
    registry = site.registry()
    with pytest.warns(Warning, match="moe-bad:bad' skipped"):
        assert select(PROBLEM, "auto", registry).name == "torch"


def test_the_runner_says_why(site):
    registry = two_backends(site)
    record(PROBLEM, [times("fast", "moe-fast", {1: 10.0}), times("slow", "moe-slow", {1: 30.0})])
    runner = MoeRunner(CFG, random_weights(CFG), registry=registry)
    assert runner.backend == "fast" and "measured fastest" in runner.selection.why
    assert {c.name for c in runner.selection.candidates} >= {"moe-fast:fast", "moe-slow:slow", "moe-core:torch"}


# --- the commands, with real timings of stand-in backends on the CPU ------------------------------------------

SLOW_APPLY = """
def apply(self, hidden_states, topk_ids, topk_weights, prepared, out=None):
    for _ in range(30):  # the same result, thirty times the work
        result = super().apply(hidden_states, topk_ids, topk_weights, prepared, None)
    return result if out is None else out.copy_(result)
"""

SHAPE = ("--dtype", "fp32", "--experts", "4", "--top-k", "2", "--hidden", "32", "--intermediate", "16")


def test_record_then_run_binds_the_measured_faster_backend(site, table_dir):
    site.add("moe-slowpoke", "slowpoke", priority=100, body=SLOW_APPLY)
    env = {DIR_VAR: str(table_dir)}
    before = json.loads(site.moe("run", *SHAPE, "--json", env=env).stdout)
    assert before["backend"] == "slowpoke" and "priority 100" in before["selected_because"]

    proc = site.moe("select", "record", *SHAPE, "--tokens", "1,4", "--repeat", "5", "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    recorded = json.loads(proc.stdout)
    hot = {m["backend"]: m["hot_us"] for m in recorded["measurements"]}
    assert set(hot) == {"slowpoke", "torch"} and all(hot["slowpoke"][c] > hot["torch"][c] for c in ("1", "4"))
    assert recorded["auto"]["backend"] == "torch"

    after = json.loads(site.moe("run", *SHAPE, "--json", env=env).stdout)
    assert after["backend"] == "torch" and "measured fastest" in after["selected_because"]

    explained = json.loads(site.moe("backends", "--explain", *SHAPE, "--json", env=env).stdout)
    assert explained["auto"]["backend"] == "torch" and "measured fastest" in explained["auto"]["why"]
    rows = {b["name"]: b for b in explained["backends"]}
    assert rows["moe-slowpoke:slowpoke"]["rank"] == 1 and rows["moe-slowpoke:slowpoke"]["score"] > 1.5
    assert rows["moe-core:torch"]["times_us"].keys() == {"1", "4"}

    shown = json.loads(site.moe("select", "show", "--json", env=env).stdout)
    assert len(shown["records"]) == 1 and shown["records"][0]["problem"]["hidden"] == 32
    assert "removed" in site.moe("select", "clear", env=env).stdout
    again = json.loads(site.moe("run", *SHAPE, "--json", env=env).stdout)
    assert again["backend"] == "slowpoke"


def test_explain_lists_every_backend_and_why_not(site, table_dir):
    site.add("moe-gpuonly", "gpuonly", priority=100, device_types=("cuda",))
    proc = site.moe("backends", "--explain", *SHAPE, "--device", "cpu", env={DIR_VAR: str(table_dir)})
    assert proc.returncode == 0, proc.stderr
    assert "moe-gpuonly:gpuonly" in proc.stdout and "device type 'cpu' not supported" in proc.stdout
    assert "backend='auto' binds torch" in proc.stdout


def test_select_help_states_the_rule(site):
    out = site.moe("select", "--help").stdout
    assert "MOE_SELECTION_RULE" in out and "stale" in out


def test_record_cold_stores_cold_times_and_auto_compares_them(site, table_dir):
    site.add("moe-slowpoke", "slowpoke", priority=100, body=SLOW_APPLY)
    env = {DIR_VAR: str(table_dir)}
    proc = site.moe("select", "record", *SHAPE, "--tokens", "1", "--repeat", "3", "--cold", "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    recorded = json.loads(proc.stdout)
    assert recorded["statistic"] == "min_us"  # the CPU keeps the fastest sample
    assert all(m["cold_us"].keys() == {"1"} and m["hot_us"].keys() == {"1"} for m in recorded["measurements"])
    assert recorded["auto"]["backend"] == "torch" and "cold weights" in recorded["auto"]["why"]
