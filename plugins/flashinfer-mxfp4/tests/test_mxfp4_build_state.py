"""The SM90 support check and the module build: ``auto`` passes over a backend whose first use would compile.

On a pretend SM90 device with the slim W4A16 module and FlashInfer's fused_moe_90 reported not built, the check
answers ``Support.explicit_only`` with the reason: ``auto`` chooses another backend, an explicit
``backend="flashinfer_mxfp4"`` still binds (and warns that its prepare builds). Once a module is built, the plain
yes returns (nothing stale is cached). SM100 (trtllm-gen, no such build) is unaffected.
"""

from __future__ import annotations

import inspect
import sys
from types import SimpleNamespace

import pytest
import torch
from mxfp4_testing import cuda_problem

from moe_core import PluginRegistry
from moe_core.errors import BackendUnavailableError
from moe_core.fused_op import Support
from moe_core.selection import explain_auto, select
from moe_core.selection_table import DIR_VAR
from moe_flashinfer_mxfp4 import sm90_engine, warmup
from moe_flashinfer_mxfp4.fused_op import FlashInferMxfp4FusedOp as Op
from moe_flashinfer_mxfp4.slim import build as slim_build

#: these tests decide what is built themselves (conftest's "the full module is built" stand-in is off)
pytestmark = pytest.mark.engine_choice

NAME = "moe-flashinfer-mxfp4:flashinfer_mxfp4"


@pytest.fixture
def world(fake_gpu, monkeypatch, tmp_path):
    """``world(cap, slim_ok=, slim_built=, full_built=)``: a pretend device and what is built for the SM90 path.

    Nothing reads this machine's FlashInfer cache; the selection table is an empty folder; the device has a name
    (the selection table keys on it)."""
    monkeypatch.delenv(sm90_engine.ENV, raising=False)
    monkeypatch.delenv("FLASHINFER_DISABLE_JIT", raising=False)
    monkeypatch.setenv(DIR_VAR, str(tmp_path / "selection"))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "pretend GPU")
    monkeypatch.setattr(sm90_engine, "jit_env", lambda: SimpleNamespace())

    def install(cap=(9, 0), *, slim_ok=True, slim_built=False, full_built=False):
        fake_gpu(cap)
        monkeypatch.setattr(sm90_engine, "slim_problem", lambda: None if slim_ok else "no nvcc here")
        monkeypatch.setattr(sm90_engine, "slim_built", lambda: slim_built)
        monkeypatch.setattr(sm90_engine, "full_module_on_disk", lambda: full_built)
        monkeypatch.setattr(sm90_engine, "full_module_ready", lambda fi: full_built)

    return install


# ---- the answer per state ----------------------------------------------------------------------------------
def test_sm90_with_nothing_built_is_explicit_only_naming_the_slim_build(world):
    world((9, 0))
    support = Op.check(cuda_problem())
    assert support.ok and not support.automatic
    assert "would build the slim SM90 W4A16 module first" in support.reason
    assert warmup.SLIM_ESTIMATE in support.reason
    assert "run `moe warmup flashinfer_mxfp4`, or name the backend to build it on first use" in support.reason


def test_sm90_without_a_usable_slim_module_names_the_hour_long_full_build(world):
    world((9, 0), slim_ok=False)
    support = Op.check(cuda_problem())
    assert support.ok and not support.automatic
    assert "FlashInfer's full SM90 module fused_moe_90" in support.reason and "about an hour" in support.reason
    assert "no nvcc here" in support.reason  # why not the slim one
    assert "moe warmup flashinfer_mxfp4" in support.reason and "flashinfer-jit-cache==" in support.reason


@pytest.mark.parametrize(
    "state",
    [dict(slim_built=True), dict(full_built=True), dict(slim_ok=False, full_built=True)],
    ids=["slim-built", "full-built", "full-built-slim-unusable"],
)
def test_sm90_with_a_module_built_is_plain_yes(world, state):
    world((9, 0), **state)
    assert Op.check(cuda_problem()) == Support.yes()


def test_forcing_the_full_module_counts_only_the_full_module(world, monkeypatch):
    world((9, 0), slim_built=True)
    monkeypatch.setenv(sm90_engine.ENV, "full")
    support = Op.check(cuda_problem())
    assert support.ok and not support.automatic and "fused_moe_90" in support.reason
    assert f"{sm90_engine.ENV}=full" in support.reason


def test_declared_refusals_come_before_the_build_state(world, monkeypatch):
    world((9, 0))
    monkeypatch.setattr(sm90_engine, "expected", lambda: pytest.fail("the build state was looked up"))
    support = Op.check(cuda_problem(dtype=torch.float16))
    assert not support and "activation dtype float16 not supported" in support.reason
    assert Op.available() == Support.yes()  # the machine question never asks what is built


def test_sm100_is_unaffected(world, monkeypatch):
    world((10, 0))
    monkeypatch.setattr(sm90_engine, "expected", lambda: pytest.fail("SM100 looked up the SM90 build state"))
    assert Op.check(cuda_problem()) == Support.yes()
    assert select(cuda_problem(), "auto", PluginRegistry()).name == "flashinfer_mxfp4"


# ---- auto and an explicit request --------------------------------------------------------------------------
def test_auto_passes_over_it_while_an_explicit_request_still_selects_it(world):
    world((9, 0))
    problem = cuda_problem()
    registry = PluginRegistry()
    candidates, order = explain_auto(problem, registry)
    row = next(c for c in candidates if c.name == NAME)
    assert row.usable and not row.automatic and row.rank is None
    assert "auto passes over it" in row.reason and "would build the slim SM90 W4A16 module" in row.reason
    assert order and "flashinfer_mxfp4" not in [s.name for s in order]
    assert select(problem, "auto", registry).name != "flashinfer_mxfp4"
    explicit = select(problem, "flashinfer_mxfp4", registry)
    assert explicit.name == "flashinfer_mxfp4" and "asked for by name" in explicit.why


def test_auto_chooses_it_once_built(world):
    world((9, 0), slim_built=True)
    registry = PluginRegistry()
    candidates, order = explain_auto(cuda_problem(), registry)
    assert next(c for c in candidates if c.name == NAME).automatic
    names = [s.name for s in order]
    assert names.index("flashinfer_mxfp4") < names.index("torch")  # SM90 priority 40 over the torch reference's 0


def test_priority_is_lower_on_sm90_than_on_sm100(world):
    world((9, 0), slim_built=True)
    assert Op.priority_for(cuda_problem()) == Op.sm90_priority < 50 < Op.priority
    world((10, 0))
    assert Op.priority_for(cuda_problem()) == Op.priority == 100


def test_an_explicit_bind_that_will_build_still_warns(world):
    world((9, 0))
    with pytest.warns(RuntimeWarning, match="the slim SM90 W4A16 module is not built; this runner's prepare builds"):
        op = Op(cuda_problem())
    assert op.sm90_engine.kind == sm90_engine.SLIM and not op.sm90_engine.built


def test_after_warmup_builds_the_module_the_plain_yes_returns(world, monkeypatch, tmp_path):
    world((9, 0))
    library = tmp_path / "slim" / "moe_slim.so"
    monkeypatch.setattr(slim_build, "library_path", lambda: library)
    monkeypatch.setattr(sm90_engine, "slim_built", lambda: slim_build.is_built())  # the real test, on our file
    first = Op.check(cuda_problem())
    assert first.ok and not first.automatic
    library.parent.mkdir(parents=True)
    library.write_bytes(b"")  # what `moe warmup flashinfer_mxfp4` leaves behind
    assert Op.check(cuda_problem()) == Support.yes()  # same process: no stale "not built"


# ---- finding out fails: a clear no, never an exception out of check -----------------------------------------
def test_a_bad_module_variable_is_a_clear_no_and_auto_goes_on(world, monkeypatch):
    world((9, 0))
    monkeypatch.setenv(sm90_engine.ENV, "fastest")
    support = Op.check(cuda_problem())
    assert not support and support.reason.startswith(f"{sm90_engine.ENV}='fastest' is not one of auto, slim, full")
    assert select(cuda_problem(), "auto", PluginRegistry()).name != "flashinfer_mxfp4"


def test_a_forced_slim_module_that_cannot_be_used_is_a_no(world, monkeypatch):
    world((9, 0), slim_ok=False)
    monkeypatch.setenv(sm90_engine.ENV, "slim")
    support = Op.check(cuda_problem())
    assert not support and "the slim module cannot be used: no nvcc here" in support.reason


def test_an_unexpected_failure_while_finding_out_is_a_no(world, monkeypatch):
    world((9, 0))

    def broken():
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(sm90_engine, "slim_problem", broken)
    support = Op.check(cuda_problem())
    assert not support and "could not find out" in support.reason and "RuntimeError: disk on fire" in support.reason


def test_a_flashinfer_that_cannot_be_imported_is_a_no(fake_gpu, monkeypatch):
    fake_gpu((9, 0))
    monkeypatch.delenv(sm90_engine.ENV, raising=False)
    import flashinfer.jit  # noqa: F401  (imported first, so that the failure below leaves no half-imported flashinfer)

    monkeypatch.setitem(sys.modules, "flashinfer.jit", None)  # the real jit_env: its import fails
    support = Op.check(cuda_problem())
    assert not support and support.reason.startswith("importing flashinfer failed (ModuleNotFoundError")


def test_flashinfer_disable_jit_with_nothing_built_refuses(world, monkeypatch):
    world((9, 0))
    monkeypatch.setenv("FLASHINFER_DISABLE_JIT", "1")
    support = Op.check(cuda_problem())
    assert not support and "FLASHINFER_DISABLE_JIT is set" in support.reason and "moe warmup" in support.reason
    with pytest.raises(BackendUnavailableError, match="FLASHINFER_DISABLE_JIT is set"):
        select(cuda_problem(), "flashinfer_mxfp4", PluginRegistry())


# ---- the on-disk test agrees with FlashInfer's spec --------------------------------------------------------
def test_full_module_on_disk_reads_the_jit_library_and_the_prebuilt_copies(monkeypatch, tmp_path):
    aot = []
    env = SimpleNamespace(FLASHINFER_JIT_DIR=tmp_path / "cached_ops", get_aot_artifacts=lambda name: tuple(aot))
    monkeypatch.setattr(sm90_engine, "jit_env", lambda: env)
    monkeypatch.setattr(sm90_engine, "full_module_name", lambda: "fused_moe_90")
    assert not sm90_engine.full_module_on_disk()
    library = tmp_path / "cached_ops" / "fused_moe_90" / "fused_moe_90.so"
    library.parent.mkdir(parents=True)
    library.write_bytes(b"")
    assert sm90_engine.full_module_on_disk()
    library.unlink()
    aot.append(object())  # flashinfer-jit-cache provides it for this GPU
    assert sm90_engine.full_module_on_disk()


def test_the_full_module_name_follows_the_installed_flashinfer():
    from flashinfer.jit import fused_moe as jit_fused_moe

    source = inspect.getsource(jit_fused_moe.gen_cutlass_fused_moe_sm90_module)
    assert '"fused_moe_90_h20_prebuilt_d"' in source  # the variant full_module_name knows
    assert callable(getattr(jit_fused_moe, "_should_enable_sm90_moe_prebuilt_d_descriptor", None))
    assert 'f"fused_moe_{device_arch}"' in inspect.getsource(jit_fused_moe.gen_cutlass_fused_moe_module)
    assert sm90_engine.full_module_name() == "fused_moe_90"  # no GPU here: not an H20
