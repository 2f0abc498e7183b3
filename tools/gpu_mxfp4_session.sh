#!/usr/bin/env bash
# One H200 call for the MXFP4 work (issues 4 and 8), in priority order, each step time-boxed so a cut call
# still returns what finished. Needs .whl/ (flashinfer-python 0.6.18.post1 + its import-time deps) and, unless the
# slim module is built in this machine's cache, .slim/moe_w4a16_fused_moe_90.so carried.
#   1. moe-triton GPU tests (CUDA graph / torch.compile at M=1, split-K paths, MXFP4 decode): the kernels on main
#      must be correct on the GPU before any timing means anything
#   2. flashinfer_mxfp4 on the slim module: conformance suite, `moe bench` gpt-oss-120b mxfp4 next to triton,
#      `moe check` (plugins/flashinfer-mxfp4/tools/gpu_check.sh slim-run)
#   3. decode ratios: triton bf16 on gpt-oss-120b (vs step 2's mxfp4), fp8_block and bf16 on deepseek-v3-tp8
# Usage: OUT=... bash tools/gpu_mxfp4_session.sh
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  2>&1 | tail -1
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
python3 -m pip install -q --no-deps --no-build-isolation -e core -e plugins/triton-moe -e plugins/flashinfer-mxfp4 \
  2>&1 | tail -1
timeout "${TESTS_TIMEOUT:-170}" python3 -m pytest plugins/triton-moe/tests/test_gpu.py \
  plugins/triton-moe/tests/test_kernel_paths.py plugins/triton-moe/tests/test_mxfp4_layout.py -q -x -rs \
  -p no:cacheprovider 2>&1 | tail -8 | tee "$OUT/pytest-triton-gpu.txt"
timeout "${SLIM_TIMEOUT:-300}" bash plugins/flashinfer-mxfp4/tools/gpu_check.sh slim-run
for spec in "bf16 gpt-oss-120b" "fp8_block deepseek-v3-tp8" "bf16 deepseek-v3-tp8"; do
  read -r scheme preset <<< "$spec"
  timeout 60 python3 -m moe_core.cli bench --backend triton --scheme "$scheme" --preset "$preset" --tokens 1,8,64 \
    --output "$OUT/decode-$scheme-$preset.json" 2>&1 | tail -5
done
