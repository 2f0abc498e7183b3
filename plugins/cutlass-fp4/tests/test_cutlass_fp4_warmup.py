"""``moe warmup cutlass_fp4``."""

from __future__ import annotations

from types import SimpleNamespace

from cutlass_fp4_testing import no_cuda_here

from moe_core.cli import main
from moe_cutlass_fp4 import kernel
from moe_cutlass_fp4.fused_op import CutlassFp4FusedOp as Op


@no_cuda_here
def test_on_this_cpu_machine(capsys):
    assert main(["warmup", "cutlass_fp4"]) == 1
    assert "cutlass_fp4: CutlassFp4FusedOp: not warmed up: no CUDA device is available" in capsys.readouterr().out


def test_on_a_hopper_it_says_why(gpu):
    gpu(9, 0)
    support = Op.warmup()
    assert not support and "Hopper (SM90) has no NVFP4 path" in support.reason


def test_on_blackwell_it_builds_the_module_for_the_device(gpu, monkeypatch):
    gpu(10, 3)
    built = []
    spec = SimpleNamespace(name="fused_moe_103", sources=[1] * 282, build_and_load=lambda: built.append(1))
    fi = kernel.load()
    fi.modules = {"gen_cutlass_fused_moe_sm103_module": lambda: spec}
    monkeypatch.setattr(kernel, "load", lambda: fi)
    lines = []
    support = Op.warmup(lines.append)
    assert support and support.reason == "fused_moe_103 ready" and built == [1]
    assert "fused_moe_103: building 282 compile units" in lines[-1]
