"""``moe warmup``: the generic hook (FusedOp.warmup) and the command that calls it."""

from __future__ import annotations

import json

from moe_core.cli import main
from moe_core.fused_op import FusedOp, Support

WARMING_PLUGIN = """
from moe_core import API_VERSION, hookimpl

@hookimpl
def moe_api_version():
    return API_VERSION

@hookimpl
def moe_fused_ops():
    from moe_core.backends.torch.fused_op import TorchFusedOp
    from moe_core.fused_op import Support

    class Warming(TorchFusedOp):
        name = {name!r}

        @classmethod
        def warmup(cls, progress=None):
            {body}

    return [Warming]
"""


def add(site, name, body):
    site.add("moe-warming", name, source=WARMING_PLUGIN.format(name=name, body=body))


def run_cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_default_hook_has_nothing_to_do():
    class Plain(FusedOp):
        name = "plain"

    assert Plain.warmup() == Support(True, "nothing to warm up")


def test_torch_backend_has_nothing_to_warm_up(capsys):
    code, out, _ = run_cli(capsys, "warmup", "torch")
    assert code == 0
    assert "torch: TorchFusedOp: ready: nothing to warm up" in out


def test_progress_goes_to_stderr_and_json_to_stdout(site, capsys):
    add(site, "warming", 'progress("building 3 units"); progress("done"); return Support(True, "built 3 units")')
    code, out, err = run_cli(capsys, "warmup", "warming", "--json")
    assert code == 0
    data = json.loads(out)
    assert data["backend"] == "warming" and data["ok"] is True
    assert data["ops"] == [{"op": "Warming", "a2a_backends": ["none"], "ok": True, "reason": "built 3 units"}]
    assert "building 3 units" in err and "done" in err


def test_a_backend_that_cannot_warm_up_here_exits_1_with_its_reason(site, capsys):
    add(site, "cold", 'return Support.no("no CUDA device is available")')
    code, out, _ = run_cli(capsys, "warmup", "cold")
    assert code == 1
    assert "cold: Warming: not warmed up: no CUDA device is available" in out


def test_a_raising_hook_is_reported_not_a_traceback(site, capsys):
    add(site, "broken", 'raise RuntimeError("ninja failed")')
    code, out, _ = run_cli(capsys, "warmup", "broken")
    assert code == 1
    assert "moe-warming 1.0: warmup raised RuntimeError: ninja failed" in out


def test_a_missing_backend_is_an_install_hint(capsys):
    code, _, err = run_cli(capsys, "warmup", "flashinfer_mxfp4_nope")
    assert code == 2 and "not installed" in err


def test_help_lists_warmup(capsys):
    import pytest

    with pytest.raises(SystemExit):
        main(["--help"])
    assert "warmup" in capsys.readouterr().out
