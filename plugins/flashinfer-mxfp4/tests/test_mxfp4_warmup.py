"""``moe warmup flashinfer_mxfp4``: a clean refusal on CPU, progress and estimates around FlashInfer's JIT build."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

from mxfp4_testing import no_cuda_here
from packaging.version import Version

import moe_flashinfer_mxfp4.warmup as wm
from moe_core.cli import main
from moe_flashinfer_mxfp4 import kernel
from moe_flashinfer_mxfp4.fused_op import FlashInferMxfp4FusedOp as Op

REAL_COLD_BUILD_NOTICE = wm.cold_build_notice  # conftest stubs it for the binding tests


class FakeSpec:
    """The parts of FlashInfer's JitSpecNvcc that warmup uses; build_and_load writes one object per unit."""

    def __init__(self, root: Path, units: int, name="fused_moe_90", aot=False, compiled=False, delay=0.0):
        self.name, self.is_aot, self.delay = name, aot, delay
        self.build_dir = root / name
        self.build_dir.mkdir(parents=True, exist_ok=True)
        self._objects = [self.build_dir / f"unit{k}.cuda.o" for k in range(units)]
        self.is_compiled = compiled
        self.loaded = False

    def get_object_paths(self):
        return list(self._objects)

    def build_and_load(self):
        for path in self._objects:
            if not path.exists():
                time.sleep(self.delay)
                path.write_text("")
        self.loaded = True
        return object()


@no_cuda_here
def test_cli_on_this_cpu_machine_refuses_with_the_support_reason(capsys):
    code = main(["warmup", "flashinfer_mxfp4"])
    out = capsys.readouterr().out
    assert code == 1
    assert "flashinfer_mxfp4: FlashInferMxfp4FusedOp: not warmed up: no CUDA device is available" in out


def test_build_reports_units_rate_and_estimate(tmp_path):
    spec = FakeSpec(tmp_path, units=12, delay=0.02)
    (spec.build_dir / "unit0.cuda.o").write_text("")  # one unit left over from an interrupted build
    lines = []
    result = wm.build_with_progress(
        spec, lines.append, units_per_minute=wm.SM90_UNITS_PER_MINUTE, measured=wm.SM90_MEASURED, interval=0.05
    )
    assert spec.loaded and result.startswith("fused_moe_90 built and loaded in")
    assert "JIT build of 12 compile units + link, 1 already compiled" in lines[0]
    assert "estimate ~3 min (36 of its units compiled in 9.5 min on an H200 host with 16 cores)" in lines[0]
    assert any("units compiled after" in line for line in lines[1:]), lines


def test_the_sm90_estimate_is_about_an_hour():
    assert 60 <= 249 / wm.SM90_UNITS_PER_MINUTE <= 70


def test_prebuilt_and_already_built_modules_are_just_loaded(tmp_path):
    lines = []
    aot = FakeSpec(tmp_path / "a", units=3, aot=True)
    assert "prebuilt cache" in wm.build_with_progress(aot, lines.append)
    built = FakeSpec(tmp_path / "b", units=3, compiled=True)
    for path in built.get_object_paths():
        path.write_text("")
    assert wm.build_with_progress(built, lines.append) == "fused_moe_90 is built and loads"
    assert "already built (3 units)" in lines[-1]


def fake_fi(tmp_path, **overrides):
    fi = kernel.load()
    spec = FakeSpec(tmp_path, units=4)
    fi.gen_cutlass_fused_moe_sm90_module = lambda: spec
    fi.gen_trtllm_gen_fused_moe_sm100_module = lambda: FakeSpec(tmp_path, units=2, name="fused_moe_trtllm_sm100")
    vars(fi).update(overrides)
    return fi, spec


def test_warmup_on_a_hopper_verifies_the_layout_then_builds(fake_gpu, monkeypatch, tmp_path):
    fake_gpu((9, 0))
    fi, spec = fake_fi(tmp_path)
    monkeypatch.setattr(kernel, "load", lambda: fi)
    lines = []
    support = Op.warmup(lines.append)
    assert support and spec.loaded and "fused_moe_90 built and loaded" in support.reason
    text = "\n".join(lines)
    assert "SM90 W4A16 layout verified" in text
    assert f"flashinfer-jit-cache=={fi.version.public}" in text and "flashinfer.ai/whl" in text


def test_warmup_refuses_a_layout_it_cannot_verify(fake_gpu, monkeypatch, tmp_path):
    fake_gpu((9, 0))
    fi, spec = fake_fi(tmp_path, interleave_moe_scales_for_sm90_mixed_gemm=lambda s, group_size=32: s)
    monkeypatch.setattr(kernel, "load", lambda: fi)
    support = Op.warmup(None)
    assert not support and "refuses to feed the kernel a layout" in support.reason
    assert not spec.loaded


def test_warmup_on_blackwell_explains_missing_cubins(fake_gpu, monkeypatch, tmp_path):
    fake_gpu((10, 0))

    def offline():
        raise RuntimeError("could not download checksums.txt")

    fi, _ = fake_fi(tmp_path, gen_trtllm_gen_fused_moe_sm100_module=offline)
    monkeypatch.setattr(kernel, "load", lambda: fi)
    support = Op.warmup(None)
    assert not support
    assert "could not download checksums.txt" in support.reason
    assert f"flashinfer-cubin=={fi.version.public}" in support.reason and "FLASHINFER_CUBIN_DIR" in support.reason


def test_cold_build_notice(tmp_path, monkeypatch):
    monkeypatch.delenv("FLASHINFER_DISABLE_JIT", raising=False)
    spec = FakeSpec(tmp_path, units=248)
    fi = SimpleNamespace(version=Version("0.7.4"), gen_cutlass_fused_moe_sm90_module=lambda: spec)
    notice = REAL_COLD_BUILD_NOTICE(fi, "sm90-cutlass-w4a16")
    assert "fused_moe_90 is not built" in notice and "249 ninja steps, about 66 min" in notice
    assert "moe warmup flashinfer_mxfp4" in notice and "flashinfer-jit-cache==0.7.4" in notice
    assert REAL_COLD_BUILD_NOTICE(fi, "sm100-trtllm-w4a16") is None
    spec.is_compiled = True
    assert REAL_COLD_BUILD_NOTICE(fi, "sm90-cutlass-w4a16") is None
