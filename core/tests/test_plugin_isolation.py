"""A misbehaving plugin never takes down core, other plugins or the caller.

Each fault is planted in a real throwaway distribution (dist-info metadata +
module on a temporary sys.path folder, the ``site`` fixture); the ``moe``
command runs in a fresh interpreter that sees them. Every faulty backend has
priority 100, so ``auto`` would take it if the fault were not contained.
"""

from __future__ import annotations

import json
import threading
import time
import warnings

import pytest
import torch

from moe_core import MoeConfig, MoeProblem, MoeRunner
from moe_core.errors import BackendError, BackendUnavailableError, PluginError, PluginLoadError, PluginWarning
from moe_core.selection import select
from moe_core.synthetic import random_inputs, random_weights

CFG = MoeConfig(num_experts=4, top_k=2, hidden_size=32, intermediate_size=16, quant_scheme="fp32", dtype=torch.float32)
PROBLEM = MoeProblem(CFG, "cpu")


def _method(signature: str, statement: str, classmethod_: bool = False) -> str:
    return ("@classmethod\n" if classmethod_ else "") + f"def {signature}:\n    {statement}\n"


#: backend -> (what is wrong, site.add keyword arguments)
FAULTS = {
    "exits": ("SystemExit at import", dict(source="raise SystemExit(3)\n")),
    "baseexc": (
        "a BaseException subclass at import",
        dict(source="class Boom(BaseException):\n    pass\nraise Boom('custom base exception')\n"),
    ),
    "probing": ("probe raises", dict(body=_method("probe(cls, problem)", "raise RuntimeError('probe blew up')", True))),
    "checking": ("check raises", dict(body=_method("check(cls, problem)", "raise KeyError('check blew up')", True))),
    "checkexit": ("check exits", dict(body=_method("check(cls, problem)", "raise SystemExit('check exits')", True))),
    "yesman": ("check answers True, not a Support", dict(body=_method("check(cls, problem)", "return True", True))),
    "wordy": ("priority is not a number", dict(priority="'high'")),
    "initfail": ("__init__ raises", dict(body=_method("__init__(self, problem)", "raise RuntimeError('no init')"))),
    "prepexit": ("prepare exits", dict(body=_method("prepare(self, weights)", "raise SystemExit('prepare exits')"))),
}
#: what the faulty backend's row or error must quote
CAUSES = {
    "exits": "SystemExit: 3",
    "baseexc": "Boom: custom base exception",
    "probing": "probe blew up",
    "checking": "check blew up",
    "checkexit": "SystemExit: check exits",
    "yesman": "returned True, not a moe_core.Support",
    "wordy": "is 'high', not a number",
    "initfail": "__init__ raised RuntimeError: no init",
    "prepexit": "prepare raised SystemExit: prepare exits",
}
#: faults ``moe backends --check`` sees (the others surface only when a problem is checked or bound)
LISTED_AS_ERROR = {"exits", "baseexc", "probing", "wordy"}


@pytest.fixture
def faulty(site):
    for name, (_, kwargs) in FAULTS.items():
        site.add(f"moe-{name}", name, **{"priority": 100, **kwargs})
    return site


def test_backends_check_lists_every_faulty_plugin(faulty):
    proc = faulty.moe("backends", "--check", "--json")
    assert proc.returncode == 0, proc.stderr
    rows = {r["name"]: r for r in json.loads(proc.stdout)}
    assert rows["torch"]["status"] == "available"
    for name in FAULTS:
        row = rows[name]
        assert row["distribution"] == f"moe-{name}" and row["version"] == "1.0"
        if name in LISTED_AS_ERROR:
            assert row["status"] == "error", row
            assert f"moe-{name} 1.0" in row["reason"] and CAUSES[name] in row["reason"], row
        else:
            assert row["status"] == "available", row
    strict = faulty.moe("backends", "--check", "--json", env={"MOE_STRICT_PLUGINS": "1"})
    assert strict.returncode == 1 and "exits" in strict.stderr


def test_auto_still_runs_and_verifies_on_torch(faulty):
    proc = faulty.moe("run", "--verify", "--json", "--dtype", "fp32")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["backend"] == "torch" and report["verified"] is True
    for name in FAULTS:  # each skipped backend is named in a warning
        assert f"moe-{name}:{name}" in proc.stderr, name
    strict = faulty.moe("run", "--dtype", "fp32", env={"MOE_STRICT_PLUGINS": "1"})
    assert strict.returncode == 2 and "MOE_STRICT_PLUGINS" in strict.stderr


@pytest.mark.parametrize("name", sorted(FAULTS))
def test_explicit_request_for_a_faulty_backend_exits_with_the_cause(faulty, name):
    proc = faulty.moe("run", "--backend", name, "--dtype", "fp32")
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert CAUSES[name] in proc.stderr and f"moe-{name} 1.0" in proc.stderr


def test_auto_in_process_warns_once_per_faulty_backend_and_picks_torch(faulty):
    registry = faulty.registry()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        runner = MoeRunner(CFG, random_weights(CFG), registry=registry)
    assert runner.backend == "torch"
    messages = [str(w.message) for w in caught if issubclass(w.category, PluginWarning)]
    for name in FAULTS:
        named = [m for m in messages if f"'moe-{name}:{name}'" in m]
        assert len(named) == 1 and CAUSES[name] in named[0], (name, messages)


def test_explicit_requests_raise_typed_errors_with_the_cause_chained(faulty):
    registry = faulty.registry()
    with pytest.raises(PluginLoadError, match="SystemExit: 3") as info:
        select(PROBLEM, "exits", registry)
    assert isinstance(info.value.__cause__, SystemExit)
    with pytest.raises(BackendUnavailableError, match="failed its support check.*check blew up") as info:
        select(PROBLEM, "checking", registry)
    assert isinstance(info.value.__cause__, PluginError) and isinstance(info.value.__cause__.__cause__, KeyError)
    with pytest.raises(PluginError, match="prepare raised SystemExit") as info:
        MoeRunner(CFG, random_weights(CFG), backend="prepexit", registry=registry)
    assert info.value.step == "prepare" and "SystemExit" in info.value.traceback


def test_explaining_another_backend_lists_faulty_ones_readably(faulty):
    faulty.add("moe-gpu-only", "gpuonly", device_types=("cuda",))
    with pytest.raises(BackendUnavailableError) as info:
        select(PROBLEM, "gpuonly", faulty.registry())
    text = str(info.value)
    assert "device type 'cpu' not supported" in text and "moe-core:torch: usable" in text
    assert "moe-checking:checking: error: moe-checking 1.0: check raised KeyError: 'check blew up'" in text
    assert "moe-exits:exits: failed to load: moe-exits 1.0" in text


APPLY_FAULTS = {
    "shape": ("return super().apply(hidden_states, topk_ids, topk_weights, prepared)[:, :-1]", "[5, 31]"),
    "dtype": ("return super().apply(hidden_states, topk_ids, topk_weights, prepared).double()", "float64"),
    "device": ("return super().apply(hidden_states, topk_ids, topk_weights, prepared).to('meta')", "on meta"),
    "none": ("return None", "a NoneType"),
}


@pytest.mark.parametrize("fault", sorted(APPLY_FAULTS))
def test_apply_result_is_checked_at_the_door(site, fault):
    statement, quoted = APPLY_FAULTS[fault]
    site.add("moe-bad-apply", "badapply", body=_method("apply(self, hidden_states, topk_ids, topk_weights, "
                                                       "prepared, out=None)", statement))  # fmt: skip
    runner = MoeRunner(CFG, random_weights(CFG), backend="badapply", registry=site.registry())
    with pytest.raises(BackendError, match=f"backend 'badapply': apply returned .*{quoted}"):
        runner(*random_inputs(CFG, 5))


def test_apply_that_ignores_out_or_exits_is_caught(site):
    ignores = _method("apply(self, hidden_states, topk_ids, topk_weights, prepared, out=None)",
                      "return super().apply(hidden_states, topk_ids, topk_weights, prepared, None)")  # fmt: skip
    site.add("moe-no-out", "noout", body=ignores)
    exits = _method("apply(self, hidden_states, topk_ids, topk_weights, prepared, out=None)", "raise SystemExit(9)")
    site.add("moe-exit-apply", "exitapply", body=exits)
    registry = site.registry()
    x, ids, tw = random_inputs(CFG, 5)
    runner = MoeRunner(CFG, random_weights(CFG), backend="noout", registry=registry)
    assert runner(x, ids, tw).shape == (5, 32)  # without out= the fresh tensor is fine
    with pytest.raises(BackendError, match="apply was given out= and returned a \\[5, 32\\] float32"):
        runner(x, ids, tw, out=torch.empty(5, 32))
    runner = MoeRunner(CFG, random_weights(CFG), backend="exitapply", registry=registry)
    with pytest.raises(PluginError, match="moe-exit-apply 1.0: apply raised SystemExit: 9"):
        runner(x, ids, tw)


def test_slow_plugin_import_does_not_block_another_backend(site):
    site.add("moe-slow", "slow", source="import time\ntime.sleep(6)\n" + _plugin_tail("slow"))
    registry = site.registry()
    slow_done = threading.Event()

    def load_slow():
        select(PROBLEM, "slow", registry)
        slow_done.set()

    thread = threading.Thread(target=load_slow)
    thread.start()
    time.sleep(0.5)  # the slow import is under way
    started = time.monotonic()
    runner = MoeRunner(CFG, random_weights(CFG), backend="torch", registry=registry)
    waited = time.monotonic() - started
    assert runner.backend == "torch" and not slow_done.is_set()
    assert waited < 3, f"an explicit torch runner waited {waited:.1f} s for another plugin's import"
    thread.join()
    assert slow_done.is_set()


def _plugin_tail(name: str) -> str:
    from moe_core.testing.distributions import plugin_source

    return plugin_source(name)


def test_warmup_that_exits_is_reported_not_fatal(site):
    site.add("moe-warm", "warm", body=_method("warmup(cls, progress=None)", "raise SystemExit('warm exits')", True))
    proc = site.moe("warmup", "warm", "--json")
    assert proc.returncode == 1, proc.stderr
    report = json.loads(proc.stdout)
    assert report["ok"] is False and "warmup raised SystemExit: warm exits" in report["ops"][0]["reason"]


def test_tune_that_exits_is_an_error_not_an_exit(site):
    site.add("moe-tuner", "tuner", body=_method("tune(cls, **kwargs)", "raise SystemExit(0)", True))
    proc = site.moe("tune", "tuner", "--device", "cpu", "--preset", "tiny", "--tokens", "1")
    assert proc.returncode == 2 and "moe-tuner 1.0: tune raised SystemExit: 0" in proc.stderr
