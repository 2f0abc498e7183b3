"""Dispatchers as plugins of group ``moe.a2a``: discovered, loaded, filtered and listed like kernel backends.

Third-party dispatchers are real throwaway distributions on a temporary ``sys.path`` folder (the ``site``
fixture); the ones that need ranks run on gloo like ``test_distributed.py``.
"""

from __future__ import annotations

import json
import sys

import pytest
import torch

from moe_core import MoeConfig
from moe_core.dispatch import Dispatched, Dispatcher, check_formats, get_dispatcher
from moe_core.dispatchers.replicate import ReplicateDispatcher
from moe_core.errors import BackendDisabledError, BackendNotInstalledError, BackendUnavailableError, PluginLoadError
from moe_core.sharding import local_ids
from moe_core.testing.distributions import dispatcher_source

A2A = "moe.a2a"


def _add(site, dist: str, name: str, **kwargs) -> str:
    source = kwargs.pop("source", None) or dispatcher_source(name, **kwargs)
    return site.add(dist, name, source=source, group=A2A)


def test_core_registers_its_two_dispatchers(site):
    registry = site.registry(A2A)
    assert {e.qualified_name for e in registry.entries()} == {"moe-core:replicate", "moe-core:all_to_all"}
    rows = {r.name: r for r in registry.describe(check=True)}
    for name in ("replicate", "all_to_all"):
        row = rows[name]
        assert row.kind == "dispatcher" and row.status == "available" and row.distribution == "moe-core"
        assert row.formats == ("token_major_local_ids",)
    assert get_dispatcher("all_to_all").name == "all_to_all"
    assert get_dispatcher("moe-core:replicate").name == "replicate"


def test_a_third_party_dispatcher_is_discovered_without_import_and_listed(site):
    module = _add(site, "moe-fancy-a2a", "fancy")
    registry = site.registry(A2A)
    assert "moe-fancy-a2a:fancy" in {e.qualified_name for e in registry.entries()}
    assert module not in sys.modules
    rows = {r.name: r for r in registry.describe(check=False)}
    assert rows["fancy"].status == "discovered" and module not in sys.modules
    rows = {r.name: r for r in registry.describe(check=True)}
    assert rows["fancy"].status == "available" and rows["fancy"].version == "1.0"
    assert get_dispatcher("fancy", registry).__module__ == module


def test_broken_dispatchers_are_error_rows_not_a_crash(site, capsys):
    from moe_core.cli import main

    _add(site, "moe-a2a-raises", "raises", source="raise RuntimeError('a2a kaboom')\n")
    _add(site, "moe-a2a-exits", "exits", source="raise SystemExit(4)\n")
    _add(site, "moe-a2a-format", "badformat", format="sideways")
    garbage = (
        "from moe_core import API_VERSION, hookimpl\n\n@hookimpl\ndef moe_api_version():\n    return API_VERSION\n"
    )
    garbage += "\n@hookimpl\ndef moe_dispatchers():\n    return ['not a class']\n"
    _add(site, "moe-a2a-garbage", "garbage", source=garbage)
    _add(site, "moe-a2a-good", "good")
    causes = {
        "raises": "a2a kaboom",
        "exits": "SystemExit: 4",
        "badformat": "format is 'sideways', not one of",
        "garbage": "moe_dispatchers returned non-Dispatcher objects",
    }
    assert main(["backends", "--check", "--json"]) == 0
    rows = {(r["kind"], r["name"]): r for r in json.loads(capsys.readouterr().out)}
    assert rows[("fused_op", "torch")]["status"] == "available"
    assert rows[("dispatcher", "good")]["status"] == "available"
    assert rows[("dispatcher", "replicate")]["status"] == "available"
    for name, cause in causes.items():
        row = rows[("dispatcher", name)]
        assert row["status"] == "error" and cause in row["reason"] and " 1.0" in row["reason"], row
    with pytest.raises(PluginLoadError, match="a2a kaboom"):
        get_dispatcher("raises", site.registry(A2A))


def test_strict_mode_fails_the_listing_of_a_broken_dispatcher(site, capsys, monkeypatch):
    from moe_core.cli import main

    _add(site, "moe-a2a-raises", "raises", source="raise RuntimeError('a2a kaboom')\n")
    monkeypatch.setenv("MOE_STRICT_PLUGINS", "1")
    assert main(["backends", "--check", "--json"]) == 1
    assert "moe-a2a-raises:raises" in capsys.readouterr().err
    registry = site.registry(A2A)
    with pytest.raises(PluginLoadError, match="MOE_STRICT_PLUGINS"):
        registry.load(next(e for e in registry.entries() if e.name == "raises"))


def test_filters_hide_a_dispatcher_like_a_backend(site, monkeypatch):
    _add(site, "moe-fancy-a2a", "fancy")
    _add(site, "moe-other-a2a", "other")
    monkeypatch.setenv("MOE_DISABLE_PLUGINS", "moe-fancy-a2a")
    rows = {r.name: r for r in site.registry(A2A).describe()}
    assert rows["fancy"].status == "disabled" and "MOE_DISABLE_PLUGINS" in rows["fancy"].reason
    with pytest.raises(BackendDisabledError, match="dispatcher 'fancy' is installed but"):
        get_dispatcher("fancy", site.registry(A2A))
    monkeypatch.delenv("MOE_DISABLE_PLUGINS")
    monkeypatch.setenv("MOE_PLUGINS", "other")  # an allow-list: core's own stay, the others go
    rows = {r.name: r.status for r in site.registry(A2A).describe()}
    assert rows == {"fancy": "disabled", "other": "discovered", "replicate": "discovered", "all_to_all": "discovered"}


def test_a_filter_naming_a_dispatcher_is_no_unmatched_warning_for_backends(site, monkeypatch, recwarn):
    _add(site, "moe-fancy-a2a", "fancy")
    monkeypatch.setenv("MOE_DISABLE_PLUGINS", "fancy")
    site.registry().filters()
    site.registry(A2A).filters()
    assert not [w for w in recwarn if "matches no installed" in str(w.message)]


def test_an_unknown_dispatcher_lists_the_installed_ones(site):
    _add(site, "moe-fancy-a2a", "fancy")
    with pytest.raises(BackendNotInstalledError) as info:
        get_dispatcher("nosuch", site.registry(A2A))
    text = str(info.value)
    assert "dispatcher 'nosuch' is not installed" in text
    for name in ("moe-core:replicate", "moe-core:all_to_all", "moe-fancy-a2a:fancy"):
        assert name in text


def test_a_class_is_taken_as_it_is_and_a_non_dispatcher_refused():
    class Mine(Dispatcher):
        name = "mine"
        format = "token_major_local_ids"

    assert get_dispatcher(Mine) is Mine
    with pytest.raises(BackendNotInstalledError, match="Dispatcher subclass"):
        get_dispatcher(int)


class ExpertOnly:
    """Declarations of a fused op that reads only expert-major blocks (nothing else of it is used)."""

    name = "expertonly"
    dispatch_formats = ("expert_major_padded",)


class Padded(Dispatcher):
    name = "padded"
    format = "expert_major_padded"


def test_an_expert_major_dispatcher_is_converted_for_a_token_major_op_and_the_rest_refused():
    from moe_core.backends.torch.fused_op import TorchFusedOp

    assert TorchFusedOp.dispatch_formats == ("token_major_local_ids",)
    check_formats(get_dispatcher("replicate"), TorchFusedOp)  # accepted: nothing raised
    check_formats(Padded, TorchFusedOp)  # accepted: the runner converts the blocks to token-major rows
    with pytest.raises(BackendUnavailableError, match="hands the experts 'token_major_local_ids'; fused op Exp"):
        check_formats(get_dispatcher("replicate"), ExpertOnly)
    with pytest.raises(BackendUnavailableError, match="which the runner converts to 'token_major_local_ids' rows"):
        check_formats(Padded, ExpertOnly)


def test_expert_major_blocks_become_top1_rows_and_back():
    from moe_core.dispatch import Dispatched, ExpertMajorRows

    x = torch.arange(3 * 2 * 4, dtype=torch.float32).reshape(3, 2, 4)
    d = Dispatched(x, torch.tensor([2, 0, 1], dtype=torch.int32), torch.tensor([[0.5, 0.25], [0.0, 0.0], [1.0, 0.0]]))
    rows, ids, weights = ExpertMajorRows.to_rows(d)
    assert rows.shape == (6, 4) and torch.equal(rows[4], x[2, 0])
    assert ids.dtype == torch.int32 and ids.flatten().tolist() == [0, 0, -1, -1, 2, -1]
    assert weights.flatten().tolist() == [0.5, 0.25, 0.0, 0.0, 1.0, 0.0]
    assert torch.equal(ExpertMajorRows.from_rows(rows * 2, d), x * 2)
    cfg = MoeConfig(8, 2, 64, 128, quant_scheme="fp32", dtype=torch.float32)
    assert ExpertMajorRows.local_config(cfg).top_k == 1


def test_auto_skips_a_backend_that_cannot_read_the_dispatchers_tokens(site, capsys):
    from moe_core import MoeRunner
    from moe_core.cli import main
    from moe_core.dispatchers.replicate import ReplicateDispatcher
    from moe_core.synthetic import random_weights

    site.add("moe-expert-only", "expertonly", priority=100, body="dispatch_formats = ('expert_major_padded',)\n")
    cfg = MoeConfig(8, 2, 128, 256, quant_scheme="bf16", dtype=torch.bfloat16)
    weights = random_weights(cfg)
    assert MoeRunner(cfg, weights, registry=site.registry()).backend == "expertonly"  # no dispatcher: priority wins
    runner = MoeRunner(cfg, weights, registry=site.registry(), dispatcher=ReplicateDispatcher)
    assert runner.backend == "torch"
    with pytest.raises(BackendUnavailableError, match="does not accept 'token_major_local_ids'"):
        MoeRunner(cfg, weights, backend="expertonly", registry=site.registry(), dispatcher=Padded)
    assert main(["backends", "--explain", "--a2a", "replicate", "--json", "--device", "cpu"]) == 0
    doc = json.loads(capsys.readouterr().out)
    rows = {r["name"]: r for r in doc["backends"]}
    assert doc["dispatcher"] == {"name": "replicate", "format": "token_major_local_ids"}
    assert rows["moe-expert-only:expertonly"]["usable"] is False and doc["auto"]["backend"] == "torch"
    assert "does not accept 'token_major_local_ids'" in rows["moe-expert-only:expertonly"]["reason"]
    assert main(["backends", "--explain", "--json", "--device", "cpu"]) == 0
    assert json.loads(capsys.readouterr().out)["auto"]["backend"] == "expertonly"


# ---- with ranks ---------------------------------------------------------------------------------------------


def _third_party_dispatcher(rank: int, case: dict) -> None:
    """A third-party dispatcher chosen by name drives a layer over 2 gloo ranks to the single-process result."""
    from moe_core import MoeRunner
    from moe_core.distributed import DispatchedRunner
    from moe_core.synthetic import random_inputs, random_weights
    from moe_core.tolerances import relative_l2

    sys.path.insert(0, case["path"])
    cfg = MoeConfig(8, 2, 64, 128, quant_scheme="fp32", dtype=torch.float32)
    weights = random_weights(cfg, seed=3)
    x, ids, tw = random_inputs(cfg, 10, seed=4)
    layer = DispatchedRunner(cfg, weights, dispatcher="fancy", tp_size=1, ep_size=2, backend="torch")
    assert type(layer.dispatcher).__name__ == "StandInDispatcher"
    full = MoeRunner(cfg, weights, backend="torch")(x, ids, tw)
    assert relative_l2(layer(x, ids, tw), full) < 1e-5


class PaddedReplicate(ReplicateDispatcher):
    """Replicate and mask, but handing the local experts expert-major blocks padded to the batch (the layout of
    DeepEP's low-latency mode): each local expert's (token, weight) pairs in its own rows."""

    name = "padded_replicate"
    format = "expert_major_padded"

    def dispatch(self, hidden_states, topk_ids, topk_weights):
        m, k = topk_ids.shape
        local = local_ids(topk_ids, self._table).reshape(-1).long()
        token = torch.arange(m).repeat_interleave(k)
        keep = local >= 0
        expert, token, weight = local[keep], token[keep], topk_weights.reshape(-1)[keep]
        order = torch.argsort(expert, stable=True)
        expert, token, weight = expert[order], token[order], weight[order]
        counts = torch.bincount(expert, minlength=len(self.grid.experts))
        slot = torch.arange(len(expert)) - (torch.cumsum(counts, 0) - counts)[expert]
        blocks = hidden_states.new_zeros(len(self.grid.experts), max(m, 1), hidden_states.shape[1])
        blocks[expert, slot] = hidden_states[token]
        weights = torch.zeros(blocks.shape[:2])
        weights[expert, slot] = weight.float()
        return Dispatched(blocks, counts.int(), weights, state=(m, token, expert, slot))

    def combine(self, expert_output, dispatched):
        m, token, expert, slot = dispatched.state
        out = torch.zeros(m, self.config.hidden_size).index_add_(0, token, expert_output[expert, slot].float())
        return super().combine(out, dispatched)


def _expert_major(rank: int, case: dict) -> None:
    """An expert-major dispatcher through DispatchedRunner (converted to token-major rows) equals one process."""
    from moe_core import MoeRunner
    from moe_core.distributed import DispatchedRunner
    from moe_core.synthetic import random_inputs, random_weights
    from moe_core.tolerances import relative_l2

    cfg = MoeConfig(8, 2, 64, 128, quant_scheme="fp32", dtype=torch.float32, has_bias=True)
    weights = random_weights(cfg, seed=3)
    x, ids, tw = random_inputs(cfg, 10, seed=4)
    ids[:6] = torch.tensor([1, 2], dtype=torch.int32)  # skewed to rank 0's experts
    ids[7, 0] = -1
    layer = DispatchedRunner(cfg, weights, dispatcher=PaddedReplicate, ep_size=2, backend="torch")
    assert layer.runner.config.top_k == 1 and layer.runner.config.num_experts == 4
    full = MoeRunner(cfg, weights, backend="torch")(x, ids, tw)
    assert relative_l2(layer(x, ids, tw), full) < 1e-5


@pytest.mark.skipif(not torch.distributed.is_available() or sys.platform == "win32", reason="needs gloo")
def test_a_third_party_dispatcher_runs_a_layer_on_gloo(site):
    from test_distributed import _spawn

    _add(site, "moe-fancy-a2a", "fancy")
    _spawn(dict(path=site._paths[-1]), 2, _third_party_dispatcher)


@pytest.mark.skipif(not torch.distributed.is_available() or sys.platform == "win32", reason="needs gloo")
def test_an_expert_major_dispatcher_runs_a_layer_on_gloo():
    from test_distributed import _spawn

    _spawn({}, 2, _expert_major)


# counts each rank's forwards in a file; rank 1 returns late from its first forward, so the ranks' clocks
# disagree when timing starts (a timer that sized its warm-up by the clock would make rank 0 stop early)
COUNTING = """
def dispatch(self, hidden_states, topk_ids, topk_weights):
    import os
    with open(os.path.join(os.environ["MOE_TEST_COUNTS"], str(self.grid.rank)), "a") as f:
        f.write("x")
    return super().dispatch(hidden_states, topk_ids, topk_weights)

def combine(self, expert_output, dispatched):
    import time
    out = super().combine(expert_output, dispatched)
    if self.grid.rank == 1 and not getattr(self, "_late", False):
        self._late = True
        time.sleep(0.2)
    return out
"""


@pytest.mark.skipif(not torch.distributed.is_available() or sys.platform == "win32", reason="needs gloo")
def test_moe_run_uses_a_third_party_dispatcher_by_its_qualified_name(site, tmp_path):
    _add(site, "moe-fancy-a2a", "fancy", body=COUNTING)
    proc = site.moe("run", "--ep", "2", "--a2a", "moe-fancy-a2a:fancy", "--dtype", "fp32", "--tokens", "5", "--verify",
                    "--json", "--device", "cpu", "--timeout", "20", env={"MOE_TEST_COUNTS": str(tmp_path)})  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["verified"] is True and report["rel_l2_error"] < 1e-5
    assert (report["dispatcher"], report["dispatcher_distribution"]) == ("fancy", "moe-fancy-a2a")
    # every forward pairs the ranks' collectives: both ranks made the same number of them (timing included)
    counts = [len((tmp_path / str(r)).read_text()) for r in range(2)]
    assert counts[0] == counts[1] > 5, counts


class WrongShape(ReplicateDispatcher):
    name = "wrong_shape"

    def combine(self, expert_output, dispatched):
        return super().combine(expert_output, dispatched)[:, :-1]


class Exits(ReplicateDispatcher):
    name = "exits"

    def dispatch(self, hidden_states, topk_ids, topk_weights):
        raise SystemExit(3)


def _bad_dispatchers(rank: int, case: dict) -> None:
    """A dispatcher's per-forward calls go through the door: a wrong result and a SystemExit are PluginErrors
    naming the dispatcher, and the process goes on."""
    from moe_core.distributed import DispatchedRunner
    from moe_core.errors import PluginError
    from moe_core.synthetic import random_inputs, random_weights

    cfg = MoeConfig(8, 2, 64, 128, quant_scheme="fp32", dtype=torch.float32)
    weights = random_weights(cfg, seed=3)
    x, ids, tw = random_inputs(cfg, 5, seed=4)
    import re

    for cls, said in ((WrongShape, "combine returned (5, 63) torch.float32"), (Exits, "dispatch raised SystemExit")):
        layer = DispatchedRunner(cfg, weights, dispatcher=cls, backend="torch")
        with pytest.raises(PluginError, match=re.escape(said)) as caught:
            layer(x, ids, tw)
        assert f"test_dispatchers:{cls.__name__}" in str(caught.value)


@pytest.mark.skipif(not torch.distributed.is_available() or sys.platform == "win32", reason="needs gloo")
def test_a_dispatchers_wrong_result_or_exit_is_a_plugin_error():
    from test_distributed import _spawn

    _spawn({}, 1, _bad_dispatchers)
