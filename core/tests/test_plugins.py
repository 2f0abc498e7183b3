"""Discovery, loading and selection of plugins through real (stand-in) distributions."""

from __future__ import annotations

import sys
import warnings

import pytest
import torch

from moe_core import MoeConfig, MoeProblem, MoeRunner
from moe_core.errors import (
    BackendDisabledError,
    BackendNotInstalledError,
    BackendUnavailableError,
    DuplicateBackendError,
    IncompatiblePluginError,
    PluginLoadError,
    PluginWarning,
)
from moe_core.selection import select
from moe_core.synthetic import random_inputs, random_weights

CFG = MoeConfig(num_experts=4, top_k=2, hidden_size=32, intermediate_size=16, quant_scheme="fp32", dtype=torch.float32)
PROBLEM = MoeProblem(CFG, "cpu")


def names(registry):
    return {e.qualified_name for e in registry.entries()}


def test_discovery_lists_without_importing(site):
    module = site.add("moe-fast", "fast")
    registry = site.registry()
    assert "moe-fast:fast" in names(registry)
    assert "moe-core:torch" in names(registry)
    assert module not in sys.modules
    rows = {r.name: r for r in registry.describe(check=False)}
    assert rows["fast"].status == "discovered" and rows["fast"].distribution == "moe-fast"
    assert module not in sys.modules


def test_discovery_is_cached_until_refresh(site):
    registry = site.registry()
    before = registry.entries()
    site.add("moe-late", "late")
    assert registry.entries() is before  # cached
    assert "moe-late:late" in {e.qualified_name for e in registry.refresh()}


def test_broken_plugin_is_reported_and_does_not_stop_others(site):
    broken = site.add("moe-broken", "broken", source="raise RuntimeError('kaboom at import')\n")
    site.add("moe-good", "good", priority=5)
    registry = site.registry()
    rows = {r.name: r for r in registry.describe(check=True)}
    assert rows["broken"].status == "error"
    assert "moe-broken 1.0" in rows["broken"].reason and "kaboom at import" in rows["broken"].reason
    assert rows["good"].status == "available"
    assert rows["torch"].status == "available"
    result = registry.load(next(e for e in registry.entries() if e.name == "broken"))
    assert "RuntimeError: kaboom at import" in result.traceback
    assert broken not in sys.modules
    # auto still works and picks the healthy plugin with the higher priority, warning about the broken one
    with pytest.warns(PluginWarning, match="moe-broken"):
        assert select(PROBLEM, "auto", registry).name == "good"


def test_explicit_request_for_broken_plugin_raises_with_cause(site):
    site.add("moe-broken", "broken", source="import does_not_exist_anywhere\n")
    with pytest.raises(PluginLoadError, match="moe-broken 1.0.*does_not_exist_anywhere") as info:
        select(PROBLEM, "broken", site.registry())
    assert isinstance(info.value.__cause__, ModuleNotFoundError)


def test_api_version_mismatch_names_both_versions(site):
    site.add("moe-future", "future", api_version=2)
    registry = site.registry()
    row = next(r for r in registry.describe(check=True) if r.name == "future")
    assert row.status == "incompatible"
    assert "moe-future 1.0" in row.reason and "version 2" in row.reason and "API version 1" in row.reason
    with pytest.raises(PluginLoadError, match="API version 1"):
        select(PROBLEM, "future", registry)


def test_missing_api_version_is_incompatible(site):
    source = """
        from moe_core import hookimpl
        @hookimpl
        def moe_fused_ops():
            return []
    """
    site.add("moe-nover", "nover", source=source)
    row = next(r for r in site.registry().describe(check=True) if r.name == "nover")
    assert row.status == "incompatible" and "moe_api_version" in row.reason


def test_misspelled_hook_is_caught_by_check_pending(site):
    site.add(
        "moe-typo",
        "typo",
        extra="""
        @hookimpl
        def moe_fused_opz():
            return []
    """,
    )
    row = next(r for r in site.registry().describe(check=True) if r.name == "typo")
    assert row.status == "error" and "moe_fused_opz" in row.reason


def test_entry_point_name_must_match_fused_op_name(site):
    site.add("moe-mismatch", entry_points={"wanted": "PLACEHOLDER"}, backend="other")
    # rewrite the entry point to point at the module that was written
    dist = next(p for p in (site.root / "moe-mismatch").iterdir() if p.name.endswith(".dist-info"))
    module = next(p.stem for p in (site.root / "moe-mismatch").glob("*.py"))
    (dist / "entry_points.txt").write_text(f"[moe.fused_ops]\nwanted = {module}\n")
    row = next(r for r in site.registry().describe(check=True) if r.name == "wanted")
    assert row.status == "error" and "provides no fused op named 'wanted'" in row.reason and "other" in row.reason


def test_duplicate_backend_names_both_distributions(site):
    site.add("moe-fast-a", "fast")
    site.add("moe-fast-b", "fast")
    registry = site.registry()
    with pytest.raises(DuplicateBackendError) as info:
        select(PROBLEM, "fast", registry)
    assert "moe-fast-a" in str(info.value) and "moe-fast-b" in str(info.value)
    # auto leaves the ambiguous pair out, with one warning naming both, and picks among the rest
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert select(PROBLEM, "auto", registry).name == "torch"
    dup = [w for w in caught if issubclass(w.category, PluginWarning) and "'fast'" in str(w.message)]
    assert len(dup) == 1 and "moe-fast-a" in str(dup[0].message) and "moe-fast-b" in str(dup[0].message)
    # the user picks one: qualified name, or block one distribution
    assert select(PROBLEM, "moe-fast-b:fast", registry).entry.distribution == "moe-fast-b"
    rows = [r for r in registry.describe(check=True) if r.name == "fast"]
    assert {r.status for r in rows} == {"error"} and all("duplicate" in r.reason for r in rows)


def test_duplicate_resolved_by_block_list(site, monkeypatch):
    site.add("moe-fast-a", "fast")
    site.add("moe-fast-b", "fast")
    monkeypatch.setenv("MOE_DISABLE_PLUGINS", "moe-fast-a")
    assert select(PROBLEM, "fast", site.registry()).entry.distribution == "moe-fast-b"


def test_enabled_names_are_sorted_once_each_and_filtered(site, monkeypatch):
    site.add("moe-fast-a", "fast")
    site.add("moe-fast-b", "fast")
    site.add("moe-one", "one")
    names = site.registry().enabled_names()
    assert names == sorted(set(names)) and {"fast", "one", "torch"} <= set(names)
    monkeypatch.setenv("MOE_DISABLE_PLUGINS", "one")
    assert "one" not in site.registry().enabled_names()


def test_allow_list(site, monkeypatch):
    site.add("moe-one", "one")
    site.add("moe-two", "two")
    monkeypatch.setenv("MOE_PLUGINS", "one")
    registry = site.registry()
    status = {r.name: r.status for r in registry.describe()}
    # plugins installed outside the test site (first-party ones in a combined env) are filtered too
    assert {n: status[n] for n in ("one", "two", "torch")} == {
        "one": "discovered",
        "two": "disabled",
        "torch": "discovered",
    }
    assert all(s == "disabled" for n, s in status.items() if n not in ("one", "torch"))
    with pytest.raises(BackendDisabledError, match="MOE_PLUGINS"):
        select(PROBLEM, "two", registry)
    assert select(PROBLEM, "one", registry).name == "one"


def test_empty_allow_list_keeps_only_core(site, monkeypatch):
    module = site.add("moe-one", "one", priority=10)
    monkeypatch.setenv("MOE_PLUGINS", "")
    registry = site.registry()
    assert select(PROBLEM, "auto", registry).name == "torch"
    assert module not in sys.modules
    status = {r.name: r.status for r in registry.describe(check=True)}
    assert status["one"] == "disabled" and status["torch"] == "available"
    assert all(s == "disabled" for n, s in status.items() if n != "torch")


def test_block_list(site, monkeypatch):
    site.add("moe-one", "one", priority=10)
    monkeypatch.setenv("MOE_DISABLE_PLUGINS", "one")
    registry = site.registry()
    assert select(PROBLEM, "auto", registry).name == "torch"
    with pytest.raises(BackendDisabledError, match="MOE_DISABLE_PLUGINS"):
        select(PROBLEM, "one", registry)


def test_unmatched_filter_names_warn(site, monkeypatch):
    site.add("moe-one", "one")
    monkeypatch.setenv("MOE_PLUGINS", "one,nope")
    monkeypatch.setenv("MOE_DISABLE_PLUGINS", "ghost")
    with pytest.warns(PluginWarning) as record:
        site.registry().filters()
    text = " ".join(str(w.message) for w in record)
    assert "MOE_PLUGINS names 'nope'" in text and "MOE_DISABLE_PLUGINS names 'ghost'" in text


def test_strict_mode_raises_on_load_failure(site, monkeypatch):
    site.add("moe-broken", "broken", source="raise ImportError('no kernels here')\n")
    site.add("moe-future", "future", api_version=7)
    monkeypatch.setenv("MOE_STRICT_PLUGINS", "1")
    registry = site.registry()
    broken = next(e for e in registry.entries() if e.name == "broken")
    future = next(e for e in registry.entries() if e.name == "future")
    with pytest.raises(PluginLoadError, match="no kernels here") as info:
        registry.load(broken)
    assert isinstance(info.value.__cause__, ImportError)
    with pytest.raises(IncompatiblePluginError, match="version 7"):
        registry.load(future)
    with pytest.raises(PluginLoadError):
        select(PROBLEM, "auto", registry)


def test_missing_first_party_backend_names_the_wheel(site, monkeypatch):
    from moe_core.known_backends import FIRST_PARTY

    assert FIRST_PARTY["flashinfer_mxfp4"] == "moe-flashinfer-mxfp4" and FIRST_PARTY["triton"] == "moe-triton"
    # first-party plugins may be installed where these tests run: block them to see the message
    installed = {e.name for e in site.registry().entries()}
    for name, dist in FIRST_PARTY.items():
        if name in installed:
            continue
        with pytest.raises(BackendNotInstalledError, match=f"pip install {dist}"):
            select(PROBLEM, name, site.registry())
    monkeypatch.setitem(FIRST_PARTY, "fancy_kernels", "moe-fancy-kernels")
    with pytest.raises(BackendNotInstalledError, match="pip install moe-fancy-kernels"):
        select(PROBLEM, "fancy_kernels", site.registry())


def test_missing_unknown_backend_lists_installed(site):
    with pytest.raises(BackendNotInstalledError, match="'nosuch' is not installed.*moe-core:torch"):
        select(PROBLEM, "nosuch", site.registry())


def test_explicit_unusable_backend_lists_every_backend_reason(site):
    site.add("moe-gpu-only", "gpuonly", device_types=("cuda",))
    site.add("moe-broken", "broken", source="raise RuntimeError('broken on purpose')\n")
    with pytest.raises(BackendUnavailableError) as info:
        select(PROBLEM, "gpuonly", site.registry())
    text = str(info.value)
    assert "device type 'cpu' not supported" in text
    assert "moe-core:torch: usable" in text
    assert "moe-broken:broken: failed to load" in text and "broken on purpose" in text


def test_auto_picks_highest_priority_supported(site):
    site.add("moe-low", "low", priority=1)
    site.add("moe-high-gpu", "highgpu", priority=100, device_types=("cuda",))
    site.add("moe-mid", "mid", priority=50)
    assert select(PROBLEM, "auto", site.registry()).name == "mid"


def test_a2a_key(site):
    site.add("moe-ep", "epkern", a2a_backends=("deepep",))
    registry = site.registry()
    with pytest.raises(BackendUnavailableError, match="a2a backend 'none'"):
        select(PROBLEM, "epkern", registry)
    ep_cfg = MoeConfig(4, 2, 32, 16, quant_scheme="fp32", dtype=torch.float32, a2a_backend="deepep")
    assert select(MoeProblem(ep_cfg), "auto", registry).name == "epkern"


def test_runner_binds_once_and_forward_does_no_lookup(site, monkeypatch):
    site.add("moe-one", "one", priority=3)
    registry = site.registry()
    weights = random_weights(CFG)
    runner = MoeRunner(CFG, weights, backend="auto", registry=registry)
    assert runner.backend == "one" and runner.distribution == "moe-one"

    def forbidden(*a, **k):
        raise AssertionError("registry touched during a forward")

    for method in ("entries", "load", "filters", "describe", "refresh"):
        monkeypatch.setattr(registry, method, forbidden)
    monkeypatch.setattr("moe_core.selection.select", forbidden)
    monkeypatch.setattr("moe_core.discovery.read_entries", forbidden)
    x, ids, tw = random_inputs(CFG, 5)
    out = runner(x, ids, tw)
    assert out.shape == (5, 32)


def test_shared_module_serves_two_entry_points(site):
    source = """
        from moe_core import API_VERSION, hookimpl

        @hookimpl
        def moe_api_version():
            return API_VERSION

        @hookimpl
        def moe_fused_ops():
            from moe_core.backends.torch.fused_op import TorchFusedOp
            class A(TorchFusedOp):
                name = "alpha"
            class B(TorchFusedOp):
                name = "beta"
            return [A, B]
    """
    module = site.add("moe-pair", entry_points={}, source=source)
    dist = next(p for p in (site.root / "moe-pair").iterdir() if p.name.endswith(".dist-info"))
    (dist / "entry_points.txt").write_text(f"[moe.fused_ops]\nalpha = {module}\nbeta = {module}\n")
    registry = site.registry()
    assert select(PROBLEM, "alpha", registry).name == "alpha"
    assert select(PROBLEM, "beta", registry).name == "beta"


def test_no_warning_without_filters(site):
    site.add("moe-one", "one")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        site.registry().describe(check=True)
