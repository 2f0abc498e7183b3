#!/usr/bin/env bash
# moe-triton on a CUDA machine (the lent H200: torch 2.11+cu130, triton 3.6, no network). Writes into $OUT.
# Reached through the one entry point: bash tools/gpu.sh triton:STEP [ARGS] (each step in its own folder);
# standalone: bash plugins/triton-moe/tools/gpu_check.sh STEP [ARGS] [STEP ...] (installs core + plugin first,
# unless MOE_SKIP_INSTALL is set).
# shellcheck source=SCRIPTDIR/../../../tools/gpu_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../../tools/gpu_common.sh"  # set -uo pipefail; gpu_plugin_*, fail, ...

help() {
  cat <<'HELP'
tests          every plugin test (pytest plugins/triton-moe/tests) -> pytest-triton.txt, then `check`
check          `moe check triton` on CUDA -> check-triton-cuda.json
gpu-tests      the CUDA tests: test_gpu.py (CUDA graph, torch.compile, split-K determinism), test_plugin.py,
               test_kernel_paths.py, test_direct.py, test_mxfp4_layout.py, test_fast_launch.py, test_expert_ids.py,
               test_compile_pool.py, test_router.py
               -> pytest-triton-gpu.txt
bench          `moe bench --backend triton`: bf16 on the four presets, fp8_block deepseek-v3-tp8, mxfp4
               gpt-oss-120b -> bench-triton-bf16.json, bench-triton-fp8.json, bench-triton-mxfp4.json
bench-quant    the fp8_block and mxfp4 runs of `bench` only
bench-torch    triton and torch side by side, bf16, four presets -> bench-triton-torch-bf16.json, bench-bf16.png
bench-decode   triton at M=1,8,64: bf16 (four presets), fp8_block, mxfp4 -> decode-bf16/fp8/mxfp4.json
ab-flags       the decode sizes under each switch (PDL, fp8 in-loop quantization, bit-op MXFP4 decode,
               split-K off, the alignment at decode, direct routing at every M) against the defaults, each
               in its own process (tools/ab_flags.py; AB_TOKENS, default 1,8,64; AB_SETTINGS: a
               comma-separated subset) -> ab-flags.json
profile        per-kernel GPU time next to the CUDA-graph time (tools/profile_launches.py; PROFILE_TOKENS,
               default 1,8): bf16 four presets, fp8_block deepseek-v3-tp8, mxfp4 gpt-oss-120b -> profile-*.json
ncu            Nsight Compute counters of GEMM1/GEMM2 (NCU_RUNS "preset:scheme[:M] ...", M default NCU_TOKENS,
               default 1) -> ncu-PRESET-SCHEME-M.txt
tune SCHEME PRESET...  `moe tune triton` (TUNE_TOKENS default 1,8,64,512,4096, each M saved when done;
               TUNE_TIMEOUT seconds, default the step's limit less 20, or 300) with MOE_TRITON_TABLE_DIR=
               $OUT/triton-table (later steps of the same gpu_check.sh call read it too) -> triton-table/
               <device>.json: the entries tuned here only (to ship them, copy them into kernel_configs/)
Every step also writes versions.txt.
HELP
}
STEPS="tests check gpu-tests bench bench-quant bench-torch bench-decode ab-flags profile ncu tune"
gpu_plugin_args "$@"
gpu_plugin_setup plugins/triton-moe "" versions.txt
moe() { python3 -m moe_core.cli "$@"; }
check_triton() {
  moe check triton --json > "$OUT/check-triton-cuda.json" || fail "moe check triton (exit $?)"
  gpu_summarize_check "$OUT/check-triton-cuda.json"
}
while [ $# -gt 0 ]; do
  case "$1" in
    tests)
      python3 -m pytest plugins/triton-moe/tests -q -x -rs -p no:cacheprovider 2>&1 | tail -15 \
        | tee "$OUT/pytest-triton.txt" || fail "pytest plugins/triton-moe/tests"
      check_triton
      shift ;;
    check)
      check_triton
      shift ;;
    gpu-tests)
      python3 -m pytest plugins/triton-moe/tests/test_gpu.py plugins/triton-moe/tests/test_plugin.py \
        plugins/triton-moe/tests/test_kernel_paths.py plugins/triton-moe/tests/test_direct.py \
        plugins/triton-moe/tests/test_mxfp4_layout.py plugins/triton-moe/tests/test_fast_launch.py \
        plugins/triton-moe/tests/test_expert_ids.py plugins/triton-moe/tests/test_compile_pool.py \
        plugins/triton-moe/tests/test_router.py -q -rfs -p no:cacheprovider 2>&1 \
        | tee "$OUT/pytest-triton-gpu.txt" | tail -25 || fail "GPU tests"  # the whole output kept: a cut run keeps its progress
      shift ;;
    bench-decode)
      moe bench --backend triton --tokens 1,8,64 --output "$OUT/decode-bf16.json" 2>/dev/null | grep triton \
        || fail "bench-decode bf16"
      moe bench --backend triton --scheme fp8_block --preset deepseek-v3-tp8 --tokens 1,8,64 \
        --output "$OUT/decode-fp8.json" 2>/dev/null | grep triton || fail "bench-decode fp8_block"
      moe bench --backend triton --scheme mxfp4 --preset gpt-oss-120b --tokens 1,8,64 \
        --output "$OUT/decode-mxfp4.json" 2>/dev/null | grep triton || fail "bench-decode mxfp4"
      shift ;;
    ab-flags)
      python3 plugins/triton-moe/tools/ab_flags.py --tokens "${AB_TOKENS:-1,8,64}" --output "$OUT/ab-flags.json" \
        ${AB_SETTINGS:+--settings "$AB_SETTINGS"} \
        || fail "ab_flags.py"
      shift ;;
    bench)
      moe bench --backend triton --output "$OUT/bench-triton-bf16.json" | tail -25 || fail "bench bf16"
      moe bench --backend triton --scheme fp8_block --preset deepseek-v3-tp8 --output "$OUT/bench-triton-fp8.json" \
        | tail -8 || fail "bench fp8_block"
      moe bench --backend triton --scheme mxfp4 --preset gpt-oss-120b --output "$OUT/bench-triton-mxfp4.json" \
        | tail -8 || fail "bench mxfp4"
      shift ;;
    bench-quant)
      moe bench --backend triton --scheme fp8_block --preset deepseek-v3-tp8 --output "$OUT/bench-triton-fp8.json" \
        | tail -8 || fail "bench fp8_block"
      moe bench --backend triton --scheme mxfp4 --preset gpt-oss-120b --output "$OUT/bench-triton-mxfp4.json" \
        | tail -8 || fail "bench mxfp4"
      shift ;;
    profile)
      python3 plugins/triton-moe/tools/profile_launches.py --tokens "${PROFILE_TOKENS:-1,8}" \
        --output "$OUT/profile-bf16.json" 2>&1 | grep -v Warn || fail "profile bf16"
      python3 plugins/triton-moe/tools/profile_launches.py --preset deepseek-v3-tp8 --scheme fp8_block \
        --tokens "${PROFILE_TOKENS:-1,8}" --output "$OUT/profile-fp8.json" 2>&1 | grep -v Warn || fail "profile fp8_block"
      python3 plugins/triton-moe/tools/profile_launches.py --preset gpt-oss-120b --scheme mxfp4 \
        --tokens "${PROFILE_TOKENS:-1,8}" --output "$OUT/profile-mxfp4.json" 2>&1 | grep -v Warn || fail "profile mxfp4"
      shift ;;
    ncu)
      # hardware counters of GEMM1/GEMM2 at M=1 (NCU_RUNS: "preset:scheme ..."), one text report per run
      NCU=$(gpu_find_ncu) || { fail "ncu: Nsight Compute not found"; shift; continue; }
      for run in ${NCU_RUNS:-gpt-oss-120b:mxfp4 gpt-oss-120b:bf16 deepseek-v3-tp8:fp8_block}; do
        IFS=: read -r preset scheme tokens <<< "$run"
        tokens=${tokens:-${NCU_TOKENS:-1}}
        report="$OUT/ncu-$preset-$scheme-$tokens.txt"
        timeout 150 "$NCU" --clock-control none -k regex:_gemm --launch-skip 2 --launch-count 2 \
          --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy \
          --section LaunchStats --section MemoryWorkloadAnalysis python3 plugins/triton-moe/tools/ncu_forward.py \
          --preset "$preset" --scheme "$scheme" --tokens "$tokens" > "$report" 2>&1 \
          || fail "ncu $preset $scheme M=$tokens (exit $?)"
        grep -E "^  _gemm|Duration|DRAM Throughput|Memory Throughput|Compute \(SM\) Throughput|Issue Slots Busy|No Eligible|Registers Per|Achieved Occupancy|Grid Size|Warp Cycles Per Issued" "$report" | head -40
      done
      shift ;;
    bench-torch)
      moe bench --backend triton --backend torch --output "$OUT/bench-triton-torch-bf16.json" --plot "$OUT/bench-bf16.png" \
        | tail -45 || fail "bench-torch"
      shift ;;
    tune)
      scheme=${2:?tune needs SCHEME PRESET...}; shift 2; presets=()
      while [ $# -gt 0 ] && ! gpu_is_step "$1"; do
        presets+=(--preset "$1"); shift
      done
      limit=300
      [ -n "${MOE_STEP_LIMIT:-}" ] && limit=$((MOE_STEP_LIMIT - 20))
      # the tuner writes the user's table (never the package): here a folder of $OUT, so it comes back
      export MOE_TRITON_TABLE_DIR=$OUT/triton-table
      timeout "${TUNE_TIMEOUT:-$limit}" python3 -m moe_core.cli tune triton --scheme "$scheme" ${presets[@]+"${presets[@]}"} \
        --tokens "${TUNE_TOKENS:-1,8,64,512,4096}" 2>&1 | tail -60 || fail "tune $scheme (exit ${PIPESTATUS[0]})"
      ls -l "$MOE_TRITON_TABLE_DIR" 2>&1 ;;
    *) gpu_unknown_step "$1" ;;
  esac
done
exit $status
