#!/usr/bin/env bash
# One device call for moe-triton on the lent H200 (torch 2.11+cu130, triton 3.6, no network):
#   install core + plugin, GPU tests (conformance on CUDA, CUDA graph, torch.compile),
#   `moe check triton`, `moe bench` (triton, optionally torch), optional tuning.
#   profile: per-kernel GPU time of the forward next to its CUDA-graph time (tools/profile_launches.py), M=1,8,
#   bf16 on the four presets, fp8_block on deepseek-v3-tp8, mxfp4 on gpt-oss-120b.
#   tune: TUNE_TOKENS (default 1,8,64,512,4096; each M is saved as soon as it is tuned), TUNE_TIMEOUT seconds.
#   check: only `moe check triton` on CUDA; gpu-tests: the GPU-marked tests, alignment and kernel-path tests
#   (not the conformance module, which `check` covers); bench-decode: M=1,8,64 for bf16 (four presets),
#   fp8_block (deepseek-v3-tp8) and mxfp4 (gpt-oss-120b), triton only. ab-flags: the same decode sizes under
#   each switch (PDL, fp8 in-loop quantization, bit-op MXFP4 decode, split-K off) against the defaults
#   (tools/ab_flags.py; AB_TOKENS).
# Usage: bash plugins/triton-moe/tools/gpu_check.sh [tests] [check] [gpu-tests] [ab-flags] [bench] [bench-quant] [bench-decode]
#        [bench-torch] [profile] [ncu] [tune SCHEME PRESET...]
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-deps --no-build-isolation -e core -e plugins/triton-moe 2>&1 | tail -2
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())" | tee "$OUT/versions.txt"
moe() { python3 -m moe_core.cli "$@"; }
check_triton() {
  moe check triton --json > "$OUT/check-triton-cuda.json"; echo "moe check triton exit $?"
  python3 -c "import json; d=json.load(open('$OUT/check-triton-cuda.json')); print({k: d[k] for k in ('passed','failed','skipped')}); [print(c['id'], c['reason'][:300]) for c in d['cases'] if c['status']=='failed']"
}
while [ $# -gt 0 ]; do
  case "$1" in
    tests)
      python3 -m pytest plugins/triton-moe/tests -q -x -rs 2>&1 | tail -15 | tee "$OUT/pytest-triton.txt"
      check_triton
      shift ;;
    check)
      check_triton
      shift ;;
    gpu-tests)
      python3 -m pytest plugins/triton-moe/tests/test_gpu.py plugins/triton-moe/tests/test_plugin.py \
        plugins/triton-moe/tests/test_kernel_paths.py plugins/triton-moe/tests/test_mxfp4_layout.py -q -rfs \
        -p no:cacheprovider 2>&1 | tail -25 | tee "$OUT/pytest-triton-gpu.txt"
      shift ;;
    bench-decode)
      moe bench --backend triton --tokens 1,8,64 --output "$OUT/decode-bf16.json" 2>/dev/null | grep triton
      moe bench --backend triton --scheme fp8_block --preset deepseek-v3-tp8 --tokens 1,8,64 \
        --output "$OUT/decode-fp8.json" 2>/dev/null | grep triton
      moe bench --backend triton --scheme mxfp4 --preset gpt-oss-120b --tokens 1,8,64 \
        --output "$OUT/decode-mxfp4.json" 2>/dev/null | grep triton
      shift ;;
    ab-flags)
      python3 plugins/triton-moe/tools/ab_flags.py --tokens "${AB_TOKENS:-1,8,64}" --output "$OUT/ab-flags.json"
      shift ;;
    bench)
      moe bench --backend triton --output "$OUT/bench-triton-bf16.json" | tail -25
      moe bench --backend triton --scheme fp8_block --preset deepseek-v3-tp8 --output "$OUT/bench-triton-fp8.json" | tail -8
      moe bench --backend triton --scheme mxfp4 --preset gpt-oss-120b --output "$OUT/bench-triton-mxfp4.json" | tail -8
      shift ;;
    bench-quant)
      moe bench --backend triton --scheme fp8_block --preset deepseek-v3-tp8 --output "$OUT/bench-triton-fp8.json" | tail -8
      moe bench --backend triton --scheme mxfp4 --preset gpt-oss-120b --output "$OUT/bench-triton-mxfp4.json" | tail -8
      shift ;;
    profile)
      python3 plugins/triton-moe/tools/profile_launches.py --tokens "${PROFILE_TOKENS:-1,8}" \
        --output "$OUT/profile-bf16.json" 2>&1 | grep -v Warn
      python3 plugins/triton-moe/tools/profile_launches.py --preset deepseek-v3-tp8 --scheme fp8_block \
        --tokens "${PROFILE_TOKENS:-1,8}" --output "$OUT/profile-fp8.json" 2>&1 | grep -v Warn
      python3 plugins/triton-moe/tools/profile_launches.py --preset gpt-oss-120b --scheme mxfp4 \
        --tokens "${PROFILE_TOKENS:-1,8}" --output "$OUT/profile-mxfp4.json" 2>&1 | grep -v Warn
      shift ;;
    ncu)
      # hardware counters of GEMM1/GEMM2 at M=1 (NCU_RUNS: "preset:scheme ..."), one text report per run
      NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
      for run in ${NCU_RUNS:-gpt-oss-120b:mxfp4 gpt-oss-120b:bf16 deepseek-v3-tp8:fp8_block}; do
        preset=${run%%:*}; scheme=${run##*:}
        timeout 150 "$NCU" --clock-control none -k regex:_gemm --launch-skip 2 --launch-count 2 \
          --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy \
          --section LaunchStats python3 plugins/triton-moe/tools/ncu_forward.py --preset "$preset" \
          --scheme "$scheme" --tokens "${NCU_TOKENS:-1}" > "$OUT/ncu-$preset-$scheme.txt" 2>&1
        echo "ncu $preset $scheme exit $?"
        grep -E "^  _gemm|Duration|DRAM Throughput|Memory Throughput|Compute \(SM\) Throughput|Issue Slots Busy|No Eligible|Registers Per|Achieved Occupancy|Grid Size|Warp Cycles Per Issued" "$OUT/ncu-$preset-$scheme.txt" | head -40
      done
      shift ;;
    bench-torch)
      moe bench --backend triton --backend torch --output "$OUT/bench-triton-torch-bf16.json" --plot "$OUT/bench-bf16.png" | tail -45
      shift ;;
    tune)
      scheme=$2; shift 2; presets=()
      while [ $# -gt 0 ] && [[ "$1" != tests && "$1" != check && "$1" != gpu-tests && "$1" != ab* && "$1" != bench* && "$1" != tune &&
              "$1" != profile && "$1" != ncu ]]; do
        presets+=(--preset "$1"); shift
      done
      timeout "${TUNE_TIMEOUT:-300}" python3 -m moe_core.cli tune triton --scheme "$scheme" "${presets[@]}" \
        --tokens "${TUNE_TOKENS:-1,8,64,512,4096}" 2>&1 | tail -60
      cp plugins/triton-moe/src/moe_triton/kernel_configs/*.json "$OUT/" 2>/dev/null ;;
    *) echo "unknown step $1"; exit 2 ;;
  esac
done
