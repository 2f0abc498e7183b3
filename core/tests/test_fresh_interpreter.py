"""Behaviour that only a fresh interpreter can show: import side effects, the seed scenario."""

from __future__ import annotations

import json
import sys

import pytest

SEED_PLUGIN = """
from moe_core import API_VERSION, hookimpl

@hookimpl
def moe_api_version():
    return API_VERSION

@hookimpl
def moe_fused_ops():
    from moe_core.backends.torch.fused_op import TorchFusedOp

    class FlashInferMxfp4StandIn(TorchFusedOp):
        name = "flashinfer_mxfp4"
        priority = 100

    return [FlashInferMxfp4StandIn]
"""


@pytest.fixture
def seed_site(site):
    """A stand-in moe-flashinfer-mxfp4 registering ('none', 'flashinfer_mxfp4')."""
    from moe_core.testing.distributions import write_distribution

    write_distribution(
        site.root / "fi",
        "moe-flashinfer-mxfp4",
        "0.0.1",
        {"flashinfer_mxfp4": "standin_fi_mxfp4.plugin"},
        {"standin_fi_mxfp4.plugin": SEED_PLUGIN},
    )
    site._paths.append(str(site.root / "fi"))
    return site


RUN_SEED = """
import torch
from moe_core import MoeConfig, MoeRunner
from moe_core.synthetic import random_inputs, random_weights
cfg = MoeConfig(8, 2, 64, 32, quant_scheme="fp32", dtype=torch.float32)
runner = MoeRunner(cfg, random_weights(cfg), backend="flashinfer_mxfp4")
assert runner.backend == "flashinfer_mxfp4", runner.backend
assert ("none" in runner.fused_op.a2a_backends)
out = runner(*random_inputs(cfg, 3))
print("OK", runner.distribution, tuple(out.shape))
"""


@pytest.mark.parametrize(
    "prelude",
    [
        "",  # nothing imported first
        "import moe_core.runner\n",  # core's runner first (the seed's failing order)
        "import standin_fi_mxfp4.plugin\n",  # the plugin first
        "import moe_core.backends.torch.fused_op, moe_core.selection\n",
    ],
    ids=["nothing-first", "runner-first", "plugin-first", "core-internals-first"],
)
def test_seed_scenario_pure_tp_flashinfer_mxfp4_found_in_any_import_order(seed_site, prelude):
    proc = seed_site.python(prelude + RUN_SEED)
    assert "OK moe-flashinfer-mxfp4 (3, 64)" in proc.stdout


def test_import_moe_core_imports_no_plugin_and_no_torch(seed_site):
    proc = seed_site.python(
        """
        import sys, moe_core
        mods = sorted(m for m in sys.modules if m.startswith(('standin', 'torch', 'triton', 'flashinfer')))
        print(mods)
        """
    )
    assert proc.stdout.strip() == "[]"


def test_moe_backends_imports_no_plugin_no_kernels(seed_site):
    proc = seed_site.python(
        """
        import io, json, sys, contextlib
        from moe_core.cli import main
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            assert main(["backends", "--json"]) == 0
        rows = json.loads(buf.getvalue())
        roots = ('standin_fi_mxfp4', 'torch', 'triton', 'flashinfer')
        heavy = sorted(m for m in sys.modules if m.split('.')[0] in roots)
        print(json.dumps({"rows": rows, "heavy": heavy}))
        """
    )
    data = json.loads(proc.stdout)
    assert data["heavy"] == []
    by_name = {r["name"]: r for r in data["rows"]}
    assert by_name["flashinfer_mxfp4"]["distribution"] == "moe-flashinfer-mxfp4"
    assert by_name["flashinfer_mxfp4"]["status"] == "discovered"
    assert by_name["torch"]["status"] == "discovered"
    for row in data["rows"]:
        assert {"name", "distribution", "version", "status", "reason"} <= set(row)


def test_fork_while_another_thread_holds_the_registry_lock(seed_site):
    """A child forked while a thread holds the lock must not deadlock."""
    proc = seed_site.python(
        """
        import os, sys, threading, time
        from moe_core.plugins import default_registry
        reg = default_registry()
        reg.entries()
        held, release = threading.Event(), threading.Event()
        def hold():
            with reg._lock:
                held.set()
                release.wait()
        t = threading.Thread(target=hold); t.start(); held.wait()
        pid = os.fork()
        if pid == 0:
            import signal
            signal.alarm(60)
            import torch
            from moe_core import MoeConfig, MoeRunner
            from moe_core.synthetic import random_weights
            cfg = MoeConfig(4, 2, 32, 16, quant_scheme="fp32", dtype=torch.float32)
            r = MoeRunner(cfg, random_weights(cfg), backend="flashinfer_mxfp4")
            os._exit(0 if r.backend == "flashinfer_mxfp4" else 3)
        _, status = os.waitpid(pid, 0)
        release.set(); t.join()
        print("child", os.waitstatus_to_exitcode(status))
        """
    )
    assert "child 0" in proc.stdout


def test_threads_construct_runners_concurrently(seed_site):
    proc = seed_site.python(
        """
        import threading, torch
        from moe_core import MoeConfig, MoeRunner
        from moe_core.synthetic import random_weights
        cfg = MoeConfig(4, 2, 32, 16, quant_scheme="fp32", dtype=torch.float32)
        w = random_weights(cfg)
        barrier = threading.Barrier(8)
        results, errors = [], []
        def build():
            barrier.wait()
            try:
                results.append(MoeRunner(cfg, w, backend="auto").backend)
            except Exception as exc:
                errors.append(repr(exc))
        ts = [threading.Thread(target=build) for _ in range(8)]
        [t.start() for t in ts]; [t.join() for t in ts]
        print(sorted(set(results)), errors)
        import sys
        print(sum(1 for m in sys.modules if m == 'standin_fi_mxfp4.plugin'))
        """
    )
    lines = proc.stdout.strip().splitlines()
    assert lines[0] == "['flashinfer_mxfp4'] []"
    assert lines[1] == "1"


@pytest.mark.skipif(sys.platform == "win32", reason="console script path differs")
def test_moe_console_script_runs(seed_site):
    import shutil
    import subprocess

    exe = shutil.which("moe") or str(__import__("pathlib").Path(sys.executable).with_name("moe"))
    proc = subprocess.run([exe, "backends", "--json"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert any(r["name"] == "torch" for r in json.loads(proc.stdout))
