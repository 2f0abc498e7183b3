#!/usr/bin/env bash
# Device calls for the plugin door and the expert-id contract on the lent H200 (writes into $OUT):
#   checks: GPU tests (core, triton: graph/compile, out-of-range ids), `moe check triton` and
#           `moe check torch` on CUDA (expert_ids cases with the id check off), tools/gpu_door_cost.py
#           (host cost of the runner's checks, GPU cost of the id mask, bad ids at qwen3-30b-a3b's shape).
#   ab:     `moe bench` of the triton backend with the kernels before the null-segment change (.ab/old, a
#           `git archive` of that commit's plugins/triton-moe, carried) and after, in one call, same tables.
# Usage: bash tools/gpu_door.sh checks | ab   (AB_ROUNDS=N alternates old/new N times; default 1)
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
LOG="$OUT/log-$1.txt"
moe() { python3 -m moe_core.cli "$@"; }
install() { python3 -m pip install -q --no-deps --no-build-isolation -e core -e "$1" 2>&1 | tail -2; }
install plugins/triton-moe
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, triton, sys; print('torch', torch.__version__, 'triton', triton.__version__, 'python', sys.version.split()[0])"
  git log -1 --format='commit %H' 2>/dev/null; date -u; } | tee "$LOG"
summary() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(sys.argv[1].rsplit('/',1)[-1], {k: d[k] for k in ('passed','failed','skipped')}); [print('  FAILED', c['kind'], c['id'], c['reason'][:300]) for c in d['cases'] if c['status']=='failed']" "$1"; }
case "$1" in
  checks)
    python3 -m pytest core/tests -m gpu -q -rs -p no:cacheprovider 2>&1 | tail -3 | tee -a "$LOG"
    python3 -m pytest plugins/triton-moe/tests/test_gpu.py plugins/triton-moe/tests/test_expert_ids.py -q -rfs \
      -p no:cacheprovider 2>&1 | tail -8 | tee -a "$LOG"
    moe check triton --json > "$OUT/check-triton-cuda.json" 2>>"$LOG"; summary "$OUT/check-triton-cuda.json" | tee -a "$LOG"
    moe check torch --json > "$OUT/check-torch-cuda.json" 2>>"$LOG"; summary "$OUT/check-torch-cuda.json" | tee -a "$LOG"
    python3 tools/gpu_door_cost.py --output "$OUT/door.json" 2>&1 | tee -a "$LOG"
    ;;
  ab)
    bench() {  # $1: label; first, which kernels are installed (only the new align names the null segment)
      python3 -c "import moe_triton.kernels.align as a; print(a.__file__, 'null segment:', 'null segment' in open(a.__file__).read())" | tee -a "$LOG"
      moe bench --backend triton --tokens 1,8,64,4096 --output "$OUT/ab-$1-bf16.json" 2>/dev/null | grep triton | tee -a "$LOG"
      moe bench --backend triton --scheme fp8_block --preset deepseek-v3-tp8 --tokens 1,8,64,4096 \
        --output "$OUT/ab-$1-fp8.json" 2>/dev/null | grep triton | tee -a "$LOG"
      moe bench --backend triton --scheme mxfp4 --preset gpt-oss-120b --tokens 1,8,64,4096 \
        --output "$OUT/ab-$1-mxfp4.json" 2>/dev/null | grep triton | tee -a "$LOG"
    }
    python3 tools/gpu_door_cost.py --parts mask --output "$OUT/mask.json" 2>&1 | tee -a "$LOG"
    for round in $(seq "${AB_ROUNDS:-1}"); do
      install .ab/old/plugins/triton-moe; echo "== old kernels, round $round" | tee -a "$LOG"; bench "old$round"
      install plugins/triton-moe; echo "== new kernels, round $round" | tee -a "$LOG"; bench "new$round"
    done
    ;;
esac
