#!/usr/bin/env bash
# moe-flashinfer-mxfp4 on a CUDA machine (the lent H200: SM90; torch 2.11+cu130, Python 3.12, nvcc 13.0, NO
# network). Writes into $OUT. Reached through the one entry point: bash tools/gpu.sh flashinfer:STEP [ARGS]
# (each step in its own folder); standalone: bash plugins/flashinfer-mxfp4/tools/gpu_check.sh [STEP [ARGS] ...]
# (installs core + plugin and the .whl/ wheels first, unless MOE_SKIP_INSTALL is set; no step = check).
#
# flashinfer is not on that image: carry it as wheels in .whl/ (repo root) and they are installed with
# `pip install --no-index --no-deps --target $SITE`. Needed: flashinfer_python-<v>-py3-none-any.whl with
# 0.6.18 <= v < 0.8 and apache_tvm_ffi-<...>-cp312-*manylinux*.whl (flashinfer imports tvm_ffi; the rest of its
# requirements are on the image or optional at import: nvidia-cutlass-dsl, cudnn-frontend, nccl4py, cuda-tile
# were checked to be unneeded for `import flashinfer.fused_moe`). The carry limit is 64 MiB: 0.7.4 (101 MB) does
# not fit; 0.6.18.post1 (18 MB) or 0.7.0.post1 (34 MB) do.
# shellcheck source=SCRIPTDIR/../../../tools/gpu_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../../tools/gpu_common.sh"  # set -uo pipefail; gpu_plugin_*, fail, ...

help() {
  cat <<'HELP'
check          versions -> gpu.txt, `moe backends --check` -> backends-check.json, bind the op on the real
               GPU (imports flashinfer, runs the layout probe: v2 by version AND by the installed helper)
               -> bind.txt, the CPU-safe plugin tests (pretend-device tests included; the conformance
               module and the fresh-venv test left out) -> pytest-cpu-safe.txt
build [S]      `moe warmup flashinfer_mxfp4` for at most S seconds (default 540, or the step's limit less
               30): FlashInfer's JIT build of fused_moe_90 with progress lines and the ETA -> warmup.txt. A
               cold build is ~249 ninja steps, ~1 hour on 16 cores: it does NOT finish in one call or one
               30-minute lease; ninja resumes from the objects in $FLASHINFER_WORKSPACE_BASE while the
               machine stays warm
conformance    only when fused_moe_90 is built (or prebuilt): pytest test_mxfp4_conformance.py
               -> pytest-conformance.txt and `moe check flashinfer_mxfp4` on CUDA
               -> check-flashinfer_mxfp4.json; otherwise says why it skipped
slim-build [S] build the slim SM90 W4A16 module (moe_flashinfer_mxfp4.slim; MOE_FLASHINFER_MXFP4_SM90_MODULE=slim)
               with `moe warmup` for at most S seconds (default 560, or the step's limit less 30), timed
               -> slim-warmup.txt, moe_slim_build.json, slim-ninja_log.txt and (under 16 MB) the library
slim-run       with the slim library built here or carried in .slim/ (a file from an earlier slim-build): the
               conformance suite -> pytest-conformance-slim.txt, `moe bench` gpt-oss-120b mxfp4 for
               flashinfer_mxfp4 and triton side by side -> bench-mxfp4-flashinfer-triton.json (needs
               plugins/triton-moe too), `moe check flashinfer_mxfp4` -> check-flashinfer_mxfp4-slim.json
HELP
}
STEPS="check build conformance slim-build slim-run"
gpu_plugin_args "$@"
export FLASHINFER_WORKSPACE_BASE=${FLASHINFER_WORKSPACE_BASE:-/tmp/fi-workspace}   # JIT cache (gpu_slim_in_place: same default)
export MAX_JOBS=${MAX_JOBS:-16}
PLUGIN=plugins/flashinfer-mxfp4
gpu_plugin_setup "$PLUGIN" wheels gpu.txt  # the .whl/ wheels, core and the plugin; versions -> gpu.txt
seconds_for() {  # the default S of a build step: DEFAULT, or the step's limit (tools/gpu.sh) less 30 when smaller
  local s=$1
  if [ -n "${MOE_STEP_LIMIT:-}" ] && [ $((MOE_STEP_LIMIT - 30)) -lt "$s" ]; then s=$((MOE_STEP_LIMIT - 30)); fi
  echo "$s"
}

check() {
  python3 -m moe_core.cli backends --check --json | tee "$OUT/backends-check.json" || fail "moe backends --check"
  python3 - <<'PY' 2>&1 | tee "$OUT/bind.txt" || fail "binding the op on CUDA"
import time, torch
from moe_core import MoeConfig, MoeProblem
from moe_flashinfer_mxfp4 import layout
from moe_flashinfer_mxfp4.fused_op import FlashInferMxfp4FusedOp as Op
cfg = MoeConfig(8, 2, 256, 128, quant_scheme="mxfp4", activation="swiglu_oai", dtype=torch.bfloat16, has_bias=True)
problem = MoeProblem(cfg, torch.device("cuda"))
print("check:", Op.check(problem))
print("path:", Op.path(problem.device))
t = time.perf_counter()
op = Op(problem)  # imports flashinfer, probes the layout; builds nothing
print(f"bound in {time.perf_counter() - t:.1f}s: path={op.kernel_path} layout={op.layout} flashinfer={op._fi.version}")
s = torch.randint(0, 256, (4, 256, 8), dtype=torch.int32).to(torch.uint8).cuda()
same = torch.equal(op._fi.interleave_moe_scales_for_sm90_mixed_gemm(s, group_size=32), layout.sm90_fold_scales_v2(s))
print("scale fold on CUDA == v2 formula:", same)
spec = op._fi.gen_cutlass_fused_moe_sm90_module()
objs = spec.get_object_paths()
print(f"{spec.name}: {len(objs)} compile units, {sum(p.exists() for p in objs)} compiled, "
      f"compiled={spec.is_compiled} aot={spec.is_aot}")
PY
  python3 -m pytest "$PLUGIN/tests" -q -rs -p no:cacheprovider \
    --ignore="$PLUGIN/tests/test_mxfp4_conformance.py" --ignore="$PLUGIN/tests/test_mxfp4_seed_scenario.py" \
    2>&1 | tail -12 | tee "$OUT/pytest-cpu-safe.txt" || fail "CPU-safe tests"
}

build() {
  local seconds=${1:-$(seconds_for 540)}
  echo "building for at most ${seconds}s (a cold fused_moe_90 needs ~1 hour; progress lines below)"
  timeout "$seconds" python3 -m moe_core.cli warmup flashinfer_mxfp4 2>&1 | tee "$OUT/warmup.txt" | tail -40
  local rc=${PIPESTATUS[0]}
  echo "warmup exit $rc (124 = cut by the time limit; rerun to resume)"
  [ "$rc" -eq 0 ] || status=1
}

conformance() {
  if ! python3 -c "
import sys
from moe_flashinfer_mxfp4 import kernel
spec = kernel.load().gen_cutlass_fused_moe_sm90_module()
sys.exit(0 if (spec.is_compiled or spec.is_aot) else 1)"; then
    echo "conformance skipped: fused_moe_90 is not built here (run the build step until it finishes, ~1 hour on"
    echo "16 cores, or carry flashinfer-jit-cache of the same version); running it now would start that build"
    return 0
  fi
  FLASHINFER_DISABLE_JIT=1 python3 -m pytest "$PLUGIN/tests/test_mxfp4_conformance.py" -q -rs -p no:cacheprovider \
    2>&1 | tail -25 | tee "$OUT/pytest-conformance.txt" || fail "conformance tests"
  FLASHINFER_DISABLE_JIT=1 python3 -m moe_core.cli check flashinfer_mxfp4 --json > "$OUT/check-flashinfer_mxfp4.json" \
    || fail "moe check flashinfer_mxfp4 (exit $?)"
  gpu_summarize_check "$OUT/check-flashinfer_mxfp4.json"
}

slim_library() {
  python3 -c "from moe_flashinfer_mxfp4.slim.build import library_path; print(library_path())"
}

slim_build() {
  local seconds=${1:-$(seconds_for 560)}
  echo "slim build for at most ${seconds}s with MAX_JOBS=$MAX_JOBS ($(nproc) cores)"
  local t0; t0=$(date +%s.%N)
  MOE_FLASHINFER_MXFP4_SM90_MODULE=slim timeout "$seconds" python3 -m moe_core.cli warmup flashinfer_mxfp4 2>&1 \
    | tee "$OUT/slim-warmup.txt" | grep -v '^\[' | tail -20
  local rc=${PIPESTATUS[0]}
  echo "warmup exit $rc after $(python3 -c "import time; print(round(time.time() - $t0, 1))") s wall"
  [ "$rc" -eq 0 ] || status=1
  grep '^\[' "$OUT/slim-warmup.txt" | tail -3
  local lib; lib=$(slim_library); local dir; dir=$(dirname "$lib")
  cp "$dir/moe_slim_build.json" "$OUT/" 2>/dev/null && cat "$OUT/moe_slim_build.json"
  cp "$dir/.ninja_log" "$OUT/slim-ninja_log.txt" 2>/dev/null
  if [ -f "$lib" ] && [ "$(stat -c %s "$lib")" -lt 16000000 ]; then cp "$lib" "$OUT/"; fi
  ls -la "$lib" 2>&1
}

slim_run() {
  gpu_slim_in_place || { echo "slim-run skipped: no slim library at $(slim_library)"; return 0; }
  export MOE_FLASHINFER_MXFP4_SM90_MODULE=slim FLASHINFER_DISABLE_JIT=1
  python3 -m pytest "$PLUGIN/tests/test_mxfp4_conformance.py" -q -rs -p no:cacheprovider 2>&1 | tail -15 \
    | tee "$OUT/pytest-conformance-slim.txt" || fail "conformance tests (slim)"
  if [ -z "${MOE_SKIP_INSTALL:-}" ]; then
    gpu_install_editable plugins/triton-moe 2>&1 | tail -n 1
  fi
  python3 -m moe_core.cli bench --backend flashinfer_mxfp4 --backend triton --scheme mxfp4 --preset gpt-oss-120b \
    --output "$OUT/bench-mxfp4-flashinfer-triton.json" 2>&1 | tail -16 || fail "bench flashinfer_mxfp4 + triton"
  python3 -m moe_core.cli check flashinfer_mxfp4 --json > "$OUT/check-flashinfer_mxfp4-slim.json" \
    || fail "moe check flashinfer_mxfp4 (exit $?)"
  gpu_summarize_check "$OUT/check-flashinfer_mxfp4-slim.json"
  unset MOE_FLASHINFER_MXFP4_SM90_MODULE FLASHINFER_DISABLE_JIT
}

[ $# -eq 0 ] && set -- check
while [ $# -gt 0 ]; do
  case "$1" in
    check) check; shift ;;
    build) if [[ "${2:-}" =~ ^[0-9]+$ ]]; then build "$2"; shift 2; else build; shift; fi ;;
    conformance) conformance; shift ;;
    slim-build) if [[ "${2:-}" =~ ^[0-9]+$ ]]; then slim_build "$2"; shift 2; else slim_build; shift; fi ;;
    slim-run) slim_run; shift ;;
    *) gpu_unknown_step "$1" ;;
  esac
done
exit $status
