"""The slim SM90 W4A16 module on the CPU: which sources, the stub mechanism, the binding call, the module choice.

What needs a GPU (compiling 60 CUDA units, running the kernels) runs on the
H200 with ``bash tools/gpu.sh flashinfer:slim-build flashinfer:slim-run``; its results are in the plugin README.
Here: the source selection against the installed FlashInfer's real
generator and spec, the stubs with a real C++ compiler and binutils (a
program calls a stubbed symbol and gets the exception), the binding's
parameter order read from the installed source, and the slim/full choice.

Longer than 400 lines on purpose: one file for the slim module's whole CPU story, which shares one FlashInfer
install and its fixtures.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from mxfp4_testing import cuda_problem, weights

from moe_core.errors import BackendUnavailableError
from moe_flashinfer_mxfp4 import sm90_engine, warmup
from moe_flashinfer_mxfp4.slim import module as slim_module
from moe_flashinfer_mxfp4.slim import sources, stubs

flashinfer = pytest.importorskip("flashinfer", reason="flashinfer-python is not installed")


_SOURCES_PROBE = """
import json, math, sys
from pathlib import Path
from flashinfer.fused_moe import gen_cutlass_fused_moe_sm90_module
from flashinfer.jit.gemm.cutlass import generate_kernels as gk
from moe_flashinfer_mxfp4.slim import sources, stubs

full = gen_cutlass_fused_moe_sm90_module()
found = sources.slim_sources()
spec = found.spec
every = [o for o in gk.generate_sm90_mixed_type_grouped_gemm_operations(True)
         if o.act_type == gk.DataType.bf16 and o.weight_type == gk.e2m1]
mine = [o for o in every if sources.offered_by_heuristic(o)]
tiles = {tuple(o.cta_shape) for o in every}
one_schedule_per_tile = all(
    sum(tuple(o.cta_shape) == t and tuple(o.cga_shape) == c for o in mine) == 1
    for t in tiles for c in {tuple(o.cga_shape) for o in every})
per_m = {}
for o in mine:
    per_m[o.cta_shape[0]] = per_m.get(o.cta_shape[0], 0) + 1
spec.write_ninja()
texts = [p.read_text() for p in found.generated]
print(json.dumps(dict(
    name=spec.name, full_name=full.name,
    same_flags=spec.extra_cuda_cflags == full.extra_cuda_cflags and spec.extra_ldflags == full.extra_ldflags,
    instantiations=found.instantiations, expected_instantiations=len(mine),
    left_out=found.left_out, every=len(every), one_schedule_per_tile=one_schedule_per_tile,
    tiles=len(tiles), clusters=len({tuple(o.cga_shape) for o in every}),
    generated=len(found.generated),
    expected_generated=sum(math.ceil(n / sources.GROUP_SIZE) for n in per_m.values()),
    generated_ok=all(sources.MIXED_LAUNCHER_INL in t and "__nv_bfloat16" in t for t in texts),
    other_types=[t for t in texts if "__nv_fp8_e4m3" in t or "__half" in t][:1],
    names=[Path(p).name for p in spec.sources],
    paths=[str(p) for p in spec.sources],
    all_exist=all(Path(p).exists() for p in spec.sources),
    full_count=len(full.sources),
    objects=len(stubs.compiled_objects(Path(spec.ninja_path))),
)))
"""


def test_slim_sources_keep_only_the_w4a16_kernels(tmp_path):
    # a fresh interpreter: FlashInfer reads its target arch and cache location once, at import
    env = dict(os.environ, FLASHINFER_CUDA_ARCH_LIST="9.0a", FLASHINFER_WORKSPACE_BASE=str(tmp_path))
    run = subprocess.run([sys.executable, "-c", _SOURCES_PROBE], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got["name"] == sources.SLIM_MODULE_NAME != got["full_name"]
    assert got["same_flags"]
    # the instantiations: FlashInfer's generator's bf16 x E2M1 list, nothing else, all written
    assert got["instantiations"] == got["expected_instantiations"] > 100
    assert got["instantiations"] + got["left_out"] == got["every"]
    # FlashInfer's heuristic offers every generated tile with every cluster shape, one schedule each
    assert got["one_schedule_per_tile"] and got["instantiations"] == got["tiles"] * got["clusters"]
    assert got["generated"] == got["expected_generated"]
    assert got["generated_ok"] and got["other_types"] == []
    names = got["names"]
    assert "flashinfer_cutlass_fused_moe_binding.cu" in names and sources.KEEP_RUNNER in names
    assert str(sources.OUR_INSTANTIATION) in got["paths"] and sources.REPLACED not in names
    assert not [n for n in names if n.startswith("moe_gemm_kernels_") and n != sources.KEEP_RUNNER]
    assert got["all_exist"]
    assert len(names) < got["full_count"] / 3
    assert got["objects"] == len(names)
    assert all(str(tmp_path) in p for p in got["paths"] if p.endswith(".generated.cu"))  # nothing in ~/.cache


def test_the_cooperative_rule_matches_the_installed_heuristic_source():
    """The installed cutlass_heuristic.cpp's sm90_supports_coop, read as data, against ours for every tile."""
    import re

    from flashinfer.jit import env as jit_env

    src = Path(jit_env.FLASHINFER_CSRC_DIR) / "nv_internal/tensorrt_llm/kernels/cutlass_kernels/cutlass_heuristic.cpp"
    text = src.read_text()
    body = text[text.index("bool sm90_supports_coop") :]
    body = body[body.index("#else") : body.index("#endif")]
    rules = re.findall(r"if \(tile_m == (\d+) && \(?([^)]*?)\)?\) \{\s*return ([^;]*);", body)
    assert len(rules) == 4, body
    for m in (64, 128, 256):
        for n in (16, 32, 64, 128, 256):
            for k in (128, 256, 512):
                theirs = False
                for rm, ncond, kcond in rules:
                    if int(rm) == m and eval(ncond.replace("tile_n", str(n)).replace("||", " or ")):
                        theirs = eval(kcond.replace("tile_k", str(k)).replace("||", " or "))
                        break
                assert sources.supports_cooperative(m, n, k) == theirs, (m, n, k)


def test_our_instantiation_names_only_the_w4a16_runner():
    text = sources.OUR_INSTANTIATION.read_text()
    instantiated = [line for line in text.splitlines() if line.startswith(("template class", "INSTANTIATE"))]
    assert instantiated == [
        "template class CutlassMoeFCRunner<__nv_bfloat16, Fp4Type>;",
        "INSTANTIATE_FINALIZE_MOE_ROUTING(__nv_bfloat16, __nv_bfloat16, __nv_bfloat16);",
    ]


# ---- stubs -------------------------------------------------------------------------------------------
needs_toolchain = pytest.mark.skipif(
    not all(shutil.which(t) for t in ("c++", "nm", "c++filt")), reason="needs a C++ compiler and binutils (nm, c++filt)"
)


@needs_toolchain
def test_stubs_make_a_program_with_missing_symbols_link_and_raise(tmp_path):
    user = tmp_path / "user.cpp"
    user.write_text(
        textwrap.dedent(
            """
            namespace tensorrt_llm::kernels {
            int left_out(int);
            template <class T> struct Runner { int run(T); };
            extern template struct Runner<float>;
            }
            int call_left_out(int x) { return tensorrt_llm::kernels::left_out(x); }
            int call_runner(float x) { return tensorrt_llm::kernels::Runner<float>{}.run(x); }
            int call_libc(const char* s);
            """
        )
    )
    main = tmp_path / "main.cpp"
    main.write_text(
        textwrap.dedent(
            """
            #include <cstdio>
            #include <stdexcept>
            int call_left_out(int); int call_runner(float);
            int main() {
              try { call_left_out(1); } catch (std::runtime_error const& e) { std::puts(e.what()); }
              try { call_runner(1.f); } catch (std::runtime_error const& e) { std::puts(e.what()); }
              return 0;
            }
            """
        )
    )
    objs = []
    for src in (user, main):
        obj = src.with_suffix(".o")
        subprocess.run(["c++", "-std=c++17", "-c", str(src), "-o", str(obj)], check=True)
        objs.append(obj)
    found = stubs.write_stubs(objs, tmp_path / "stubs.cpp")
    assert sorted(s.demangled for s in found) == [
        "tensorrt_llm::kernels::Runner<float>::run(float)",
        "tensorrt_llm::kernels::left_out(int)",
    ]
    assert not any(s.is_data for s in found)
    exe = tmp_path / "prog"
    subprocess.run(["c++", "-std=c++17", *map(str, objs), str(tmp_path / "stubs.cpp"), "-o", str(exe)], check=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.splitlines()
    assert len(out) == 2
    assert "tensorrt_llm::kernels::left_out(int) is not compiled into it" in out[0]
    assert "Runner<float>::run(float)" in out[1] and "bf16 activations x MXFP4 weights only" in out[1]


def test_stubs_refuse_to_stand_in_for_the_w4a16_path():
    w4a16 = stubs.Stub(
        "_ZN12tensorrt_llm7kernels15cutlass_kernels18CutlassMoeFCRunnerI13__nv_bfloat16N7cutlass12float_e2m1_tEEC2Ev",
        "tensorrt_llm::kernels::cutlass_kernels::CutlassMoeFCRunner<__nv_bfloat16, cutlass::float_e2m1_t, "
        "__nv_bfloat16>::CutlassMoeFCRunner()",
        False,
    )
    other = stubs.Stub("_ZN12tensorrt_llm1fEv", "tensorrt_llm::f()", False)
    stubs.check_not_w4a16([other])
    with pytest.raises(stubs.StubError, match="W4A16 path itself"):
        stubs.check_not_w4a16([other, w4a16])

    def launcher(tile, schedule):
        m, n, k = tile
        name = (
            "void tensorrt_llm::kernels::cutlass_kernels_oss::sm90_generic_mixed_moe_gemm_kernelLauncher<"
            "__nv_bfloat16, cutlass::float_e2m1_t, __nv_bfloat16, tensorrt_llm::cutlass_extensions::EpilogueOpDefault, "
            f"cute::tuple<cute::C<{m}>, cute::C<{n}>, cute::C<{k}> >, "
            "cute::tuple<cute::C<1>, cute::C<1>, cute::C<1> >, "
            f"cutlass::gemm::KernelTmaWarpSpecialized{schedule}, cutlass::epilogue::TmaWarpSpecializedCooperative>(int)"
        )
        return stubs.Stub(f"_ZN12tensorrt_llm{m}{n}{k}{schedule}", name, False)

    # 128x16x256 is cooperative-capable: its ping-pong twin is never offered; 128x128x512 is not: its cooperative one
    twins = [launcher((128, 16, 256), "Pingpong"), launcher((128, 128, 512), "Cooperative")]
    assert all(stubs.never_offered(t.demangled) for t in twins)
    stubs.check_not_w4a16([other, *twins], left_out=2)  # exactly the twins sources left out: fine
    with pytest.raises(stubs.StubError):
        stubs.check_not_w4a16([other, *twins], left_out=1)  # a different count than sources left out
    offered = launcher((128, 16, 256), "Cooperative")
    assert not stubs.never_offered(offered.demangled)
    with pytest.raises(stubs.StubError):
        stubs.check_not_w4a16([*twins, offered], left_out=2)  # a kernel the heuristic can pick is missing


def test_only_tensorrt_llm_symbols_are_stubbed():
    match = stubs._TRTLLM.match
    assert match("_ZN12tensorrt_llm7kernels1fEv") and match("_ZNK12tensorrt_llm1A1gEv")
    assert match("_ZTVN12tensorrt_llm1AE")
    assert not match("_ZNSt6vectorIiSaIiEE9push_backERKi") and not match("cudaMalloc") and not match("TVMFFIError")


# ---- the binding call ------------------------------------------------------------------------------------
def test_the_installed_binding_is_readable_and_fully_covered():
    params = slim_module.check_binding(slim_module.read_binding_source())
    assert params[:4] == ["output", "input", "token_selected_experts", "token_final_scales"]
    assert {"swiglu_beta", "profile_ids", "enable_pdl", "base_activation_type"} <= set(params)


def test_a_binding_parameter_without_a_value_makes_the_slim_path_unavailable():
    source = slim_module.read_binding_source()
    at = source.index('name == "run_moe")')
    lambda_pdl = source.index("bool enable_pdl,", at)
    source = source[:lambda_pdl] + "bool enable_pdl, int64_t new_knob," + source[lambda_pdl + len("bool enable_pdl,") :]
    with pytest.raises(sources.SlimUnsupported, match="new_knob"):
        slim_module.check_binding(source)


class _Runner:
    def __init__(self, log):
        self.log = log

    def run_moe(self, *args):
        self.log.append(args)
        args[0].fill_(5)


def _slim_with_fake_library(params):
    mod = object.__new__(slim_module.SlimW4A16Module)
    log, inits = [], []
    mod.run_moe_params = params
    mod._runners = {}
    mod._lock = __import__("threading").Lock()
    mod._module = SimpleNamespace(init=lambda *a: inits.append(a) or _Runner(log))
    return mod, log, inits


@pytest.mark.parametrize("version", ["0.6.18", "0.7.4"])
def test_run_moe_arguments_go_to_their_named_positions(version, fake_gpu):
    extra = ["clamped_relu2_limit", "situ_beta", "situ_linear_beta"] if version == "0.7.4" else []
    params = [
        *slim_module.CALL_ARGS[:9],
        "input_sf",
        *slim_module.CALL_ARGS[9:],
        *extra,
        "swizzled_input_sf",
        "tp_size",
        "tp_rank",
        "ep_size",
        "ep_rank",
        "cluster_size",
        "cluster_rank",
        "enable_alltoall",
        "min_latency_mode",
        "profile_ids",
        "enable_pdl",
        "base_activation_type",
        "workspace_buffer",
        *(["nvfp4_4over6_code"] if version == "0.7.4" else []),
    ]
    mod, log, inits = _slim_with_fake_library(params)
    fake_gpu((9, 0))
    from moe_flashinfer_mxfp4 import kernel

    fi = kernel.load()
    cfg_kw = dict(activation="swiglu_oai", has_bias=True)
    from moe_flashinfer_mxfp4.fused_op import FlashInferMxfp4FusedOp as Op

    op = Op(cuda_problem(**cfg_kw))
    op._fi = SimpleNamespace(**{**vars(fi), "interleave_moe_weights_for_sm90_mixed_gemm": lambda w, q="fp4": w.clone()})
    p = op.prepare(weights(op.config))
    x = torch.randn(3, op.config.hidden_size, dtype=torch.bfloat16)
    ids = torch.zeros(3, 2, dtype=torch.int32)
    tw = torch.ones(3, 2)
    out = torch.zeros(3, op.config.hidden_size, dtype=torch.bfloat16)
    got = mod.cutlass_fused_moe(**kernel.sm90_kwargs(fi, p, x, ids, tw, out))
    assert got is out and bool((out == 5).all())
    (args,) = log
    assert len(args) == len(params)
    named = dict(zip(params, args, strict=True))
    assert named["output"] is out and named["input"] is x and named["quant_scales"] is p.quant_scales
    assert named["fc1_expert_biases"] is p.b13 and named["swiglu_beta"] is p.swiglu_beta
    assert named["profile_ids"] == [-1, -1] and named["tp_size"] == 1 and named["min_latency_mode"] is False
    assert named["base_activation_type"] == int(fi.ActivationType.Swiglu) and named["input_sf"] is None
    # one runner per finalize mode: bf16 x uint8 -> bf16, W4A16 group scaling, deterministic finalize
    assert inits == [(torch.bfloat16, torch.uint8, torch.bfloat16, False, True, False, False, False, False)]


def test_the_slim_call_refuses_what_it_would_drop():
    mod, _, _ = _slim_with_fake_library(list(slim_module.CALL_ARGS))
    with pytest.raises(TypeError, match="input_sf"):
        mod.cutlass_fused_moe(activation_type=0, input=torch.zeros(1, 1), input_sf=torch.zeros(1))
    with pytest.raises(ValueError, match="W4A16 path only"):
        mod.cutlass_fused_moe(activation_type=0, use_w4_group_scaling=False, input=torch.zeros(1, 1))


# ---- which module -----------------------------------------------------------------------------------------
def _engine_world(monkeypatch, *, slim_ok=True, slim_built=False, full_ready=False):
    monkeypatch.setattr(sm90_engine, "slim_problem", lambda: None if slim_ok else "no nvcc here")
    monkeypatch.setattr(sm90_engine, "slim_built", lambda: slim_built)
    monkeypatch.setattr(sm90_engine, "full_module_ready", lambda fi: full_ready)


@pytest.mark.engine_choice
@pytest.mark.parametrize(
    "slim_ok,slim_built,full_ready,kind,built",
    [
        (True, True, True, "slim", True),  # both built: the slim one
        (True, False, True, "full", True),  # only the full one is built: use it rather than build
        (True, False, False, "slim", False),  # neither: build the slim one (minutes, not an hour)
        (False, False, False, "full", False),  # slim impossible here: FlashInfer's own
        (False, True, False, "full", False),  # a built slim library is not used when its binding is unreadable
    ],
)
def test_auto_choice(monkeypatch, slim_ok, slim_built, full_ready, kind, built):
    monkeypatch.delenv(sm90_engine.ENV, raising=False)
    _engine_world(monkeypatch, slim_ok=slim_ok, slim_built=slim_built, full_ready=full_ready)
    engine = sm90_engine.choose(None)
    assert (engine.kind, engine.built) == (kind, built)
    if not slim_ok:
        assert "no nvcc here" in engine.reason


@pytest.mark.engine_choice
def test_the_choice_can_be_forced_and_a_bad_value_is_refused(monkeypatch):
    _engine_world(monkeypatch, slim_built=True, full_ready=True)
    monkeypatch.setenv(sm90_engine.ENV, "full")
    assert sm90_engine.choose(None).kind == "full"
    monkeypatch.setenv(sm90_engine.ENV, "slim")
    assert sm90_engine.choose(None).kind == "slim"
    monkeypatch.setenv(sm90_engine.ENV, "fastest")
    with pytest.raises(BackendUnavailableError, match="not one of auto, slim, full"):
        sm90_engine.choose(None)
    _engine_world(monkeypatch, slim_ok=False)
    monkeypatch.setenv(sm90_engine.ENV, "slim")
    with pytest.raises(BackendUnavailableError, match="no nvcc here"):
        sm90_engine.choose(None)


@pytest.mark.engine_choice
def test_an_op_bound_to_the_slim_module_prepares_and_runs_through_it(fake_gpu, monkeypatch):
    _engine_world(monkeypatch, slim_built=True)
    monkeypatch.delenv(sm90_engine.ENV, raising=False)
    calls = []

    def slim_namespace(fi, progress=None):
        calls.append("slim")
        return SimpleNamespace(
            **{
                **vars(fi),
                "interleave_moe_weights_for_sm90_mixed_gemm": lambda w, q="fp4": w.clone(),
                "cutlass_fused_moe": lambda **kw: kw["output"].fill_(9),
                "slim_module": object(),
            }
        )

    monkeypatch.setattr(sm90_engine, "slim_namespace", slim_namespace)
    fake_gpu((9, 0))
    from moe_flashinfer_mxfp4.fused_op import FlashInferMxfp4FusedOp as Op

    op = Op(cuda_problem())
    assert op.sm90_engine.kind == "slim" and op.sm90_engine.built
    p = op.prepare(weights(op.config))
    op.prepare(weights(op.config))
    assert calls == ["slim"]  # loaded once per op
    h = op.config.hidden_size
    got = op.apply(torch.randn(2, h).bfloat16(), torch.zeros(2, 2, dtype=torch.int32), torch.ones(2, 2), p)
    assert bool((got == 9).all())


@pytest.mark.engine_choice
def test_the_cold_notice_names_the_module_that_will_build():
    slim_cold = sm90_engine.Engine("slim", False, "neither module is built")
    notice = warmup.cold_build_notice(None, "sm90-cutlass-w4a16", slim_cold)
    assert "slim SM90 W4A16 module is not built" in notice and "neither module is built" in notice
    assert warmup.cold_build_notice(None, "sm90-cutlass-w4a16", sm90_engine.Engine("slim", True, "built")) is None


# ---- the build orchestration, end to end with a toy module ----------------------------------------------
@needs_toolchain
def test_build_compiles_stubs_links_and_reports(tmp_path, monkeypatch):
    """build(): ninja over the objects, stubs from their symbol tables, relink, report — on two tiny C++ units."""
    import dataclasses
    import json as _json

    from moe_flashinfer_mxfp4.slim import build as slim_build

    pytest.importorskip("ninja", reason="needs the ninja package (a FlashInfer dependency)")
    a = tmp_path / "a.cpp"
    a.write_text(
        "namespace tensorrt_llm { int left_out(int); }\nint use(int x) { return tensorrt_llm::left_out(x); }\n"
    )
    b = tmp_path / "b.cpp"
    b.write_text("int other(int x) { return x + 1; }\n")

    @dataclasses.dataclass
    class ToySpec:
        name: str
        sources: list
        build_dir: Path
        ninja_path: Path
        jit_library_path: Path

        def write_ninja(self):
            objs = [self.build_dir / (Path(s).stem + ".o") for s in self.sources]
            lines = [
                "rule compile\n  command = c++ -std=c++17 -fPIC -c $in -o $out\n",
                "rule link\n  command = c++ -shared $in -o $out\n",
                *(f"build {o}: compile {s}\n" for o, s in zip(objs, self.sources, strict=True)),
                f"build {self.jit_library_path}: link {' '.join(map(str, objs))}\n",
            ]
            self.build_dir.mkdir(parents=True, exist_ok=True)
            self.ninja_path.write_text("".join(lines))

    out = tmp_path / "toy"
    spec = ToySpec("toy", [a, b], out, out / "build.ninja", out / "toy.so")
    found = sources.SlimSources(spec=spec, generated=(a,), kept=(b,), dropped=(), instantiations=1, left_out=0)
    monkeypatch.setattr(slim_build.sources, "slim_sources", lambda group_size=4: found)
    lines = []
    report = slim_build.build(progress=lines.append, jobs=2)
    assert Path(report.library).exists() and report.stubs == 1 and report.compiled_now == 2
    assert report.compile_units == 3 and report.jobs == 2 and report.library_bytes > 0
    assert any("2/2 done" in line or "[2/2" in line for line in lines), lines
    assert any("1 symbols stubbed" in line for line in lines)
    assert "tensorrt_llm::left_out(int)" in (out / slim_build.STUB_SOURCE_NAME).read_text()
    assert _json.loads((out / slim_build.REPORT_NAME).read_text())["stubs"] == 1
    assert {name for name, _ in report.slowest_units} >= {"a.o", "b.o"}
    # a second call finds everything up to date and compiles nothing
    again = slim_build.build(progress=lines.append, jobs=2)
    assert again.compiled_now == 0 and again.stubs == 1


def test_load_slim_builds_when_missing_but_a_runner_respects_disable_jit(monkeypatch, tmp_path):
    from moe_flashinfer_mxfp4.slim import build as slim_build
    from moe_flashinfer_mxfp4.slim import module as slim_mod

    built, lines = [], []
    monkeypatch.setattr(slim_build, "is_built", lambda: bool(built))
    monkeypatch.setattr(slim_build, "build", lambda progress: built.append(progress) or None)
    monkeypatch.setattr(slim_build, "library_path", lambda: tmp_path / "lib.so")
    monkeypatch.setattr(slim_build, "last_report", lambda: {"compile_units": 44})
    monkeypatch.setattr(slim_mod, "SlimW4A16Module", lambda path: SimpleNamespace(library=path))
    monkeypatch.setenv("FLASHINFER_DISABLE_JIT", "1")
    with pytest.raises(BackendUnavailableError, match="FLASHINFER_DISABLE_JIT is set"):
        sm90_engine.load_slim(lines.append)
    assert built == []
    assert sm90_engine.load_slim(lines.append, warmup=True).library == tmp_path / "lib.so"  # warmup may build
    assert len(built) == 1
    sm90_engine.load_slim(lines.append, warmup=True)  # built now: reported, not rebuilt
    assert len(built) == 1 and any("already built" in line and "44 units" in line for line in lines)
