#!/usr/bin/env bash
# The one entry point for work on a GPU machine. See `bash tools/gpu.sh --help`.
#
# Runs in the repository root (the device tool's copy of the working tree, or a checkout on a CUDA host),
# installs what the requested steps need from this tree, records the machine, then runs each step under its
# own time limit with its output in its own folder of $OUT. A failing or cut step does not stop the later
# ones; the exit status is non-zero when any step did not finish cleanly.
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=SCRIPTDIR/gpu_common.sh
source "$ROOT/tools/gpu_common.sh"  # set -uo pipefail, PYTHONUNBUFFERED=1; gpu_install_*, gpu_versions, ...
SELF=$ROOT/tools/gpu.sh
cd "$ROOT" || exit 2
PY=${PYTHON:-python3}
SITE=${SITE:-/tmp/site}

usage() {
  cat <<'EOF'
Usage: bash tools/gpu.sh [--no-install] STEP[@SECONDS] [ARG ...] [STEP[@SECONDS] [ARG ...] ...]
       bash tools/gpu.sh --help

Runs each STEP in the order given, each in its own folder $OUT/<step>/ (a step given twice gets -2, -3),
each under `timeout` (its default limit below, or SECONDS after @). Words after a step that are not step
names are that step's arguments. A failing or cut step does not stop the later ones; exit status 1 when any
step failed, timed out or was left out for lack of time, 2 for a usage error.

A step named install does nothing but what every run does first: install (every package) and record
the machine, so that later `--no-install` runs, side by side, need not.

Always written:
  $OUT/machine.txt   date (UTC), the command, git commit of this tree (MOE_GPU_COMMIT overrides: the device
                     copy's .git can be stale) and how many paths differ from it, GPU name/driver/memory
                     (nvidia-smi), nvcc, python/torch/CUDA/triton versions, the moe packages and flashinfer
  $OUT/install.txt   what was installed (pip install --no-deps --no-build-isolation -e, and .whl/ wheels)
  $OUT/summary.txt   one line per step: status, seconds, folder; also printed last
  $OUT/out.tar.gz    every file above and below, packed, when they are more than the device tool brings
                     back (8 files, 3 levels deep); machine.txt and summary.txt stay beside it. GPU_PACK=1
                     packs always, GPU_PACK=0 never
  $OUT/<step>/log.txt  everything the step printed

Steps (default limit in seconds):
  tests [PYTEST ARGS]  (420)  every GPU-marked test: `pytest -m gpu` in core/tests, plugins/*/tests and
                       examples/*/tests, one pytest run per folder -> pytest-<package>.txt / .xml
                       (a folder with no GPU-marked test is reported, not failed)
  check [BACKEND ...]  (420)  `moe backends --check --json` -> backends-check.json, then
                       `moe check BACKEND --device cuda --json` for every available backend (or the named
                       ones) -> check-<backend>-cuda.json, summary.txt. CHECK_SKIP (default
                       "flashinfer_mxfp4": checking it without a built module would start its hour-long
                       JIT build; use flashinfer:conformance or flashinfer:slim-run) is left out unless named
  bench [BENCH ARGS]   (420)  `moe bench` on the model presets: triton and torch side by side in bf16
                       (BENCH_BACKENDS, default "triton torch") -> bench-triton-torch-bf16.json (+ .png with
                       matplotlib; the name follows BENCH_BACKENDS); triton fp8_block on
                       deepseek-v3-tp8 -> bench-triton-fp8_block.json; triton mxfp4 on gpt-oss-120b
                       -> bench-triton-mxfp4.json. BENCH ARGS (e.g. --tokens 1,8,64) go to every run
  door-cost [ARGS]     (240)  tools/gpu_door_cost.py: host cost of the runner's checks, GPU cost of the id
                       mask, bad expert ids through triton -> door-cost.json (ARGS e.g. --parts mask)
  transformers [FAMILY ...] [ARGS]  (420)  tools/transformers_bench.py for qwen3-30b-a3b and gpt-oss-120b (or the
                       FAMILY ones named; 2 decoder
                       layers, real shapes): patch_model with triton (and mxfp4 for gpt-oss) against
                       transformers' eager, grouped_mm and batched_mm -> transformers-<family>.json (needs the
                       transformers wheels in .whl/)
  select [bf16] [mxfp4] [PRESET ...] [ARGS]  (540)  `moe select record --cold` (hot and cold times) on the four
                       bf16 model presets (or the PRESET ones) for triton, torch_grouped (not gpt-oss:
                       silu only) and torch (part bf16), and on gpt-oss-120b mxfp4 for
                       triton and flashinfer_mxfp4 where its slim module is built or carried in .slim/ (part
                       mxfp4; both parts when none is named), into MOE_SELECTION_DIR=$OUT/selection; then
                       `moe backends --explain --json` per problem -> select-<preset>-<scheme>.json,
                       explain-<preset>-<scheme>.json, selection/table.json (ARGS go to every record)
  sglang [ARGS]        (300)  integrations/sglang/tools/gpu_bench.py: SGLang MoE layers with real shapes (Qwen3-30B-A3B
                       bf16, gpt-oss-120b mxfp4) under SGLang's own runner and --moe-runner-backend moe:<backend>,
                       eager and graph times and error against moe's reference -> sglang.json. SGLang comes from
                       .sgl/: sglang-src.tar.xz (the sglang 0.5.23 wheel's Python files and metadata; its cp311
                       Rust extensions left out, the layer needs none) and .sgl/*.whl, installed into $SITE-sglang
  ranks [BENCH ARGS]   (540)  on a machine with 2 GPUs (NCCL, NVLink multicast off): `moe run --verify --json`
                       with --tp 2, --ep 2 and --ep 2 --a2a all_to_all for the four bf16 presets, gpt-oss-120b
                       mxfp4 and deepseek-v3-tp8 fp8_block (triton) -> run-<preset>-<scheme>-<grid>.json; then
                       `moe bench --tp 2` and `--ep 2` (replicate and all_to_all) at M = 1, 64, 512, 4096: time,
                       communication share, achieved and peak link bandwidth -> bench-tp2.json, bench-ep2.json
  peer [ARGS]          (420)  the peer comparison of issue 20: .peer/side_by_side.py (a git-ignored copy of
                       ../shared/peer-bench with vLLM 0.33.0's kernels cut into .peer/vendor/, made by
                       tools/peer_setup.sh on a machine with network: carry .peer) ->
                       side_by_side.json, log.txt and the markdown tables (report.md). ARGS go to the harness
                       (e.g. --parts bf16 --ms 512,4096 --profile-ms 4096)
  peer-ncu ROWS        (420)  Nsight Compute counters of our forward's kernels and the peer's GEMM launches for
                       the rows PRESET:SCHEME:M,... (tools/peer_ncu.py under ncu, one process; carry .peer;
                       PEER_NCU_KERNELS: the kernel-name regex, default the GEMMs of both sides; rows are
                       started until 3/4 of the limit)
                       -> peer-ncu.ncu-rep, peer-ncu.csv (raw page), peer-ncu.json and the table (report.md)
  sh 'COMMAND'         (300)  one bash command, given as one quoted argument, run in this script's environment:
                       every package installed, the carried wheels on PYTHONPATH, $OUT the step's folder
                       -> whatever it writes there, log.txt; for a one-off probe or A/B beside the steps
                       (e.g. sh@90 'cd plugins/triton-moe && pytest -q tests/test_gpu.py -k pdl')
  overhead [ARGS]      (180)  tools/layer_overhead.py: host and wall time of a patched block (Qwen3-30B-A3B, or
                       --family gpt-oss-120b; --tokens M,...) and of its parts (router, runner, checks, apply)
                       against transformers' grouped_mm block; --cprofile N, --kernels -> overhead.json
                       (transformers wheels in .whl/)

Plugin steps, PREFIX:STEP [ARGS] (default limit 300; flashinfer:build / flashinfer:slim-build /
triton:tune 590): run plugins/PREFIX*/tools/gpu_check.sh STEP [ARGS] with OUT=$OUT/PREFIX-STEP/ (the
plugin's own files stay with the plugin; this script installs for it). Listed below from each script.

Environment: OUT (default /tmp/moe-gpu/<UTC time>), GPU_BUDGET_S (default 570: the steps together stop
that many seconds after the start, so a 600-second device call still returns its summary; 0 = no overall
limit), PYTHON (python3), SITE (/tmp/site: where .whl/*.whl are installed with --target, put on PYTHONPATH),
MOE_GPU_COMMIT. --no-install: use what is installed already.

Examples:
  bash tools/gpu.sh tests check                    # what `nox -s gpu` runs
  bash tools/gpu.sh tests check bench door-cost
  bash tools/gpu.sh triton:tune@560 mxfp4 gpt-oss-120b
  bash tools/gpu.sh flashinfer:slim-build          # .whl/ with flashinfer-python carried
EOF
  local script
  for script in plugins/*/tools/gpu_check.sh; do
    [ -f "$script" ] || continue
    echo
    echo "$(plugin_prefix "$script"): steps of $script"
    bash "$script" --help | sed 's/^/  /'
  done
}

plugin_prefix() {  # plugins/triton-moe/tools/gpu_check.sh -> triton
  local dir=${1#plugins/}
  dir=${dir%%/*}
  echo "${dir%%-*}"
}

plugin_script() {  # triton -> plugins/triton-moe/tools/gpu_check.sh (exactly one plugins/PREFIX or PREFIX-*)
  local found=() d
  for d in plugins/"$1" plugins/"$1"-*; do
    [ -f "$d/tools/gpu_check.sh" ] && found+=("$d/tools/gpu_check.sh")
  done
  [ ${#found[@]} -eq 1 ] && echo "${found[0]}"
}

default_limit() {
  case "$1" in
    tests | check | bench) echo 420 ;;
    door-cost) echo 240 ;;
    install) echo 30 ;;
    transformers) echo 420 ;;
    overhead) echo 180 ;;
    sglang) echo 300 ;;
    select) echo 540 ;;
    ranks) echo 540 ;;
    peer | peer-ncu) echo 420 ;;
    flashinfer:build | flashinfer:slim-build | triton:tune) echo 590 ;;
    *) echo 300 ;;
  esac
}

packages_for() {  # the folders a step needs installed
  local d
  case "$1" in
    tests | check | install | sh)
      echo core
      for d in plugins/*/ examples/*/; do [ -f "$d/pyproject.toml" ] && echo "${d%/}"; done ;;
    bench | door-cost | transformers | overhead | ranks | peer | peer-ncu) echo core plugins/triton-moe ;;
    sglang) echo core plugins/triton-moe plugins/flashinfer-mxfp4 integrations/sglang ;;
    select) echo core plugins/triton-moe plugins/flashinfer-mxfp4 examples/moe-torch-grouped ;;
    flashinfer:slim-run) echo core "$(dirname "$(dirname "$(plugin_script flashinfer)")")" plugins/triton-moe ;;
    *:*) echo core "$(dirname "$(dirname "$(plugin_script "${1%%:*}")")")" ;;
  esac
}

# ---------------------------------------------------------------- steps (run as `gpu.sh --run-step NAME ...`)

step_tests() {
  local status=0 dir name rc
  for dir in core/tests plugins/*/tests examples/*/tests; do
    [ -d "$dir" ] || continue
    name=$(basename "${dir%/tests}")
    echo "--- pytest -m gpu $dir $*"
    "$PY" -m pytest "$dir" -m gpu -q -rfEs -p no:cacheprovider --junitxml="$OUT/pytest-$name.xml" "$@" \
      > "$OUT/pytest-$name.txt" 2>&1
    rc=$?
    tail -n 12 "$OUT/pytest-$name.txt"
    case $rc in
      0) ;;
      5) echo "($dir: no GPU-marked test)" ;;
      *) echo "FAILED: pytest -m gpu $dir (exit $rc)"; status=1 ;;
    esac
  done
  return $status
}

step_check() {
  local status=0 name state reason rc rows=() wanted=("$@") skip=" ${CHECK_SKIP-flashinfer_mxfp4} "
  "$PY" -m moe_core.cli backends --check --json > "$OUT/backends-check.json" || status=1
  mapfile -t rows < <("$PY" - "$OUT/backends-check.json" <<'PY'
import json, sys
try:
    rows = json.load(open(sys.argv[1]))
except (OSError, ValueError):
    rows = []
for r in rows:
    print(r["name"], r["status"], " ".join(str(r.get("reason", "")).split())[:200], sep="\t")
PY
)
  [ ${#rows[@]} -gt 0 ] || { echo "FAILED: moe backends --check gave no backends"; return 1; }
  : > "$OUT/summary.txt"
  for row in "${rows[@]}"; do
    IFS=$'\t' read -r name state reason <<< "$row"
    if [ ${#wanted[@]} -gt 0 ]; then
      [[ " ${wanted[*]} " == *" $name "* ]] || continue
    elif [[ $skip == *" $name "* ]]; then
      echo "$name: left out (CHECK_SKIP)" | tee -a "$OUT/summary.txt"; continue
    fi
    case $state in
      available) ;;
      error | incompatible) echo "FAILED $name: $state: $reason" | tee -a "$OUT/summary.txt"; status=1; continue ;;
      *) echo "$name: $state: $reason" | tee -a "$OUT/summary.txt"; continue ;;
    esac
    echo "--- moe check $name --device cuda"
    "$PY" -m moe_core.cli check "$name" --device cuda --json > "$OUT/check-$name-cuda.json" \
      2> "$OUT/check-$name-cuda.log" < /dev/null
    rc=$?
    tail -n 3 "$OUT/check-$name-cuda.log"
    gpu_summarize_check "$OUT/check-$name-cuda.json" | tee -a "$OUT/summary.txt"
    [ "$rc" -eq 0 ] || { echo "FAILED: moe check $name (exit $rc)" | tee -a "$OUT/summary.txt"; status=1; }
  done
  return $status
}

step_bench() {
  local status=0 plot=() backends=() b name
  for b in ${BENCH_BACKENDS:-triton torch}; do backends+=(--backend "$b"); done
  name=bench-$(echo ${BENCH_BACKENDS:-triton torch} | tr ' ' '-')-bf16
  "$PY" -c "import matplotlib" 2>/dev/null && plot=(--plot "$OUT/$name.png")
  "$PY" -m moe_core.cli bench "${backends[@]}" --output "$OUT/$name.json" \
    ${plot[@]+"${plot[@]}"} "$@" 2>&1 | tail -n 45 || status=1
  "$PY" -m moe_core.cli bench --backend triton --scheme fp8_block --preset deepseek-v3-tp8 \
    --output "$OUT/bench-triton-fp8_block.json" "$@" 2>&1 | tail -n 10 || status=1
  "$PY" -m moe_core.cli bench --backend triton --scheme mxfp4 --preset gpt-oss-120b \
    --output "$OUT/bench-triton-mxfp4.json" "$@" 2>&1 | tail -n 10 || status=1
  return $status
}

step_door_cost() {
  "$PY" tools/gpu_door_cost.py --output "$OUT/door-cost.json" "$@"
}

MODEL_PRESETS="mixtral-8x7b qwen3-30b-a3b deepseek-v3-tp8 gpt-oss-120b"

step_select() {
  local status=0 preset backends parts=()
  while [ $# -gt 0 ] && [[ $1 == bf16 || $1 == mxfp4 ]]; do parts+=("$1"); shift; done
  [ ${#parts[@]} -gt 0 ] || parts=(bf16 mxfp4)
  export MOE_SELECTION_DIR="$OUT/selection"
  local presets=()
  while [ $# -gt 0 ] && [[ " $MODEL_PRESETS " == *" $1 "* ]]; do presets+=("$1"); shift; done
  [ ${#presets[@]} -gt 0 ] || read -r -a presets <<< "$MODEL_PRESETS"
  if [[ " ${parts[*]} " == *" bf16 "* ]]; then
    for preset in "${presets[@]}"; do
      backends=(--backend triton --backend torch)
      [ "$preset" = gpt-oss-120b ] || backends+=(--backend torch_grouped)  # silu only: not gpt-oss's swiglu_oai
      "$PY" -m moe_core.cli select record --preset "$preset" "${backends[@]}" --cold --json "$@" \
        > "$OUT/select-$preset-bf16.json" || status=1
      "$PY" -m moe_core.cli backends --explain --preset "$preset" --json > "$OUT/explain-$preset-bf16.json" \
        || status=1
    done
  fi
  if [[ " ${parts[*]} " == *" mxfp4 "* ]]; then
    step_select_mxfp4 "$@" || status=1
  fi
  "$PY" -m moe_core.cli select show
  return $status
}

step_select_mxfp4() {
  local status=0 backends=(--backend triton)
  gpu_slim_in_place && echo "slim FlashInfer library in place"
  "$PY" -m moe_core.cli backends --explain --preset gpt-oss-120b --scheme mxfp4 --json > "$OUT/explain-before.json"
  "$PY" -c 'import json, sys; rows = json.load(open(sys.argv[1]))["backends"]
sys.exit(not any(r["name"].endswith(":flashinfer_mxfp4") and r["automatic"] for r in rows))' "$OUT/explain-before.json" \
    && backends+=(--backend flashinfer_mxfp4)  # only once its module is built: never a build inside this step
  "$PY" -m moe_core.cli select record --preset gpt-oss-120b --scheme mxfp4 "${backends[@]}" --cold --json "$@" \
    > "$OUT/select-gpt-oss-120b-mxfp4.json" || status=1
  "$PY" -m moe_core.cli backends --explain --preset gpt-oss-120b --scheme mxfp4 --json \
    > "$OUT/explain-gpt-oss-120b-mxfp4.json" || status=1
  return $status
}

step_sglang() {  # SGLang from .sgl/ into its own target, ahead of $SITE (one version of each package there)
  local site=$SITE-sglang
  if [ -f .sgl/sglang-src.tar.xz ]; then
    mkdir -p "$site" && tar -xJf .sgl/sglang-src.tar.xz -C "$site" || return 1
    if ls .sgl/*.whl > /dev/null 2>&1; then
      "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" .sgl/*.whl \
        || return 1
    fi
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
  fi
  gpu_slim_in_place && echo "slim FlashInfer library in place"
  "$PY" integrations/sglang/tools/gpu_bench.py --stub-sgl-kernel --json "$OUT/sglang.json" "$@"  # stand-in if absent
}

step_ranks() {  # issue 21's run: needs as many GPUs as ranks (nvidia-h200-x2); NCCL, NVLink multicast left off
  local status=0 preset scheme n gpus
  gpus=$("$PY" -c 'import torch; print(torch.cuda.device_count())')
  if [ "$gpus" -lt 2 ]; then echo "ranks: $gpus GPU(s) here; --tp 2 / --ep 2 need 2 (one per rank)"; return 1; fi
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
  for spec in mixtral-8x7b:bf16 qwen3-30b-a3b:bf16 deepseek-v3-tp8:bf16 gpt-oss-120b:bf16 gpt-oss-120b:mxfp4 \
              deepseek-v3-tp8:fp8_block; do
    preset=${spec%%:*} scheme=${spec#*:}
    for n in "--tp 2" "--ep 2" "--ep 2 --a2a all_to_all"; do
      # shellcheck disable=SC2086
      "$PY" -m moe_core.cli run --preset "$preset" --scheme "$scheme" --tokens 64 --backend triton $n --verify --json \
        > "$OUT/run-$preset-$scheme-${n//[ -]/}.json" || status=1
      tail -c 300 "$OUT/run-$preset-$scheme-${n//[ -]/}.json"; echo
    done
  done
  "$PY" -m moe_core.cli bench --tp 2 --backend triton --tokens 1,64,512,4096 --json --output "$OUT/bench-tp2.json" \
    "$@" > /dev/null || status=1
  "$PY" -m moe_core.cli bench --ep 2 --a2a replicate --a2a all_to_all --backend triton --tokens 1,64,512,4096 \
    --json --output "$OUT/bench-ep2.json" "$@" > /dev/null || status=1
  return $status
}

step_peer() {  # the harness stops starting rows 30 s before the step's limit, so its JSON always comes back
  [ -f .peer/side_by_side.py ] && [ -d .peer/vendor ] \
    || { echo "peer: .peer/side_by_side.py and .peer/vendor/ not here (../shared/peer-bench/README.md; carry .peer)"; return 1; }
  local budget=$((${MOE_STEP_LIMIT:-420} - 40))
  "$PY" .peer/side_by_side.py --out "$OUT" --budget-s "$budget" "$@" || return 1
  "$PY" .peer/side_by_side.py --report "$OUT/side_by_side.json" > "$OUT/report.md" && cat "$OUT/report.md"
}

step_peer_ncu() {  # ROWS: PRESET:SCHEME:M,...
  [ -f .peer/side_by_side.py ] && [ -d .peer/vendor ] \
    || { echo "peer-ncu: .peer/side_by_side.py and .peer/vendor/ not here (carry .peer)"; return 1; }
  local rows=${1:-} ncu
  [ -n "$rows" ] || { echo "peer-ncu needs ROWS (PRESET:SCHEME:M,...)"; return 1; }
  ncu=$(gpu_find_ncu) || { echo "peer-ncu: Nsight Compute (ncu) not found"; return 1; }
  "$ncu" --profile-from-start off --clock-control none -k "regex:${PEER_NCU_KERNELS:-_gemm|_ncu_mark|fused_moe_kernel|matmul}" \
    --section SpeedOfLight --section LaunchStats --section Occupancy --section SchedulerStats \
    --section WarpStateStats --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis -f -o "$OUT/peer-ncu" \
    "$PY" tools/peer_ncu.py --rows "$rows" --budget-s $((${MOE_STEP_LIMIT:-420} * 3 / 4)) || return 1
  "$ncu" --import "$OUT/peer-ncu.ncu-rep" --csv --page raw > "$OUT/peer-ncu.csv" || return 1
  "$PY" tools/peer_ncu.py --table "$OUT/peer-ncu.csv" --rows "$rows" --json "$OUT/peer-ncu.json" > "$OUT/report.md" \
    && cat "$OUT/report.md"
}

step_transformers() {
  local status=0 families=()
  while [ $# -gt 0 ] && [[ $1 == qwen3-30b-a3b || $1 == gpt-oss-120b ]]; do families+=("$1"); shift; done
  [ ${#families[@]} -gt 0 ] || families=(qwen3-30b-a3b gpt-oss-120b)
  if [[ " ${families[*]} " == *" qwen3-30b-a3b "* ]]; then
    "$PY" tools/transformers_bench.py --family qwen3-30b-a3b --json "$OUT/transformers-qwen3-30b-a3b.json" "$@" \
      || status=1
  fi
  if [[ " ${families[*]} " == *" gpt-oss-120b "* ]]; then
    "$PY" tools/transformers_bench.py --family gpt-oss-120b \
      --impls eager,grouped_mm,batched_mm,moe:triton,moe:triton:mxfp4 --json "$OUT/transformers-gpt-oss-120b.json" \
      "$@" || status=1
  fi
  return $status
}

if [ "${1:-}" = --run-step ]; then
  step=$2; shift 2
  case $step in
    tests) step_tests "$@" ;;
    check) step_check "$@" ;;
    bench) step_bench "$@" ;;
    door-cost) step_door_cost "$@" ;;
    transformers) step_transformers "$@" ;;
    overhead) "$PY" tools/layer_overhead.py --json "$OUT/overhead.json" "$@" ;;
    select) step_select "$@" ;;
    sglang) step_sglang "$@" ;;
    ranks) step_ranks "$@" ;;
    peer) step_peer "$@" ;;
    peer-ncu) step_peer_ncu "$@" ;;
    install) echo "installed: $(cat "$(dirname "$OUT")/install.txt" 2>/dev/null | tail -n 1)" ;;
    sh) [ $# -eq 1 ] || { echo "sh takes one quoted command, got $# words: sh 'COMMAND'"; exit 2; }; bash -c "$1" ;;
    *) echo "unknown step $step"; exit 2 ;;
  esac
  exit $?
fi

# ---------------------------------------------------------------- parse the command line

INSTALL=1
COMMAND="tools/gpu.sh $*"
NAMES=() LIMITS=() STEP_ARGS=() FIRST_ARG=() ARG_COUNT=()  # a step's ARGS: STEP_ARGS[FIRST_ARG[i]] on, ARG_COUNT[i] of them
is_step() {  # NAME -> 0 when it is a step name (core, or PREFIX:STEP of a plugin script that lists STEP)
  local script
  case "$1" in
    tests | check | bench | door-cost | transformers | overhead | select | sglang | ranks | peer | peer-ncu | install | sh)
      return 0 ;;
    *:*)
      script=$(plugin_script "${1%%:*}") || return 1
      [ -n "$script" ] && bash "$script" --steps | grep -qx -- "${1#*:}" ;;
    *) return 1 ;;
  esac
}
looks_like_step() { [[ $1 =~ ^([a-z][a-z0-9-]*(:[a-z][a-z0-9-]*)?)(@[0-9]+)?$ ]]; }

while [ $# -gt 0 ]; do
  word=$1; shift
  case $word in
    -h | --help) usage; exit 0 ;;
    --no-install) INSTALL=0; continue ;;
  esac
  name=${word%@*}
  if looks_like_step "$word" && is_step "$name"; then
    limit=$(default_limit "$name")
    [[ $word == *@* ]] && limit=${word##*@}
    [ "$limit" -ge 1 ] || { echo "tools/gpu.sh: $word: the limit must be at least 1 second" >&2; exit 2; }
    NAMES+=("$name"); LIMITS+=("$limit"); FIRST_ARG+=("${#STEP_ARGS[@]}"); ARG_COUNT+=(0)
  elif [ ${#NAMES[@]} -eq 0 ] || { looks_like_step "$word" && [[ $word == *:* ]]; }; then
    echo "tools/gpu.sh: unknown step '$word' (bash tools/gpu.sh --help lists them)" >&2
    exit 2
  else
    STEP_ARGS+=("$word")  # kept word for word, an empty argument too
    ARG_COUNT[-1]=$((ARG_COUNT[-1] + 1))
  fi
done
if [ ${#NAMES[@]} -eq 0 ]; then
  usage >&2
  exit 2
fi

# ---------------------------------------------------------------- install, record the machine

OUT=${OUT:-/tmp/moe-gpu/$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$OUT"
export OUT
START=$(date +%s)
BUDGET=${GPU_BUDGET_S:-570}
FAILED=0

[ "$INSTALL" = 1 ] || echo "nothing installed (--no-install)" > "$OUT/install.txt"
if ls .whl/*.whl > /dev/null 2>&1 && [ "$INSTALL" = 1 ]; then
  echo "wheels from .whl/ -> $SITE: $(cd .whl && echo *.whl)" | tee "$OUT/install.txt"
  gpu_install_wheels 2>&1 | tail -n 3 | tee -a "$OUT/install.txt"
  [ "${PIPESTATUS[0]}" -eq 0 ] || FAILED=1
fi
[ -d "$SITE" ] && export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"

PACKAGES=()
for name in "${NAMES[@]}"; do
  for pkg in $(packages_for "$name"); do
    [[ " ${PACKAGES[*]-} " == *" $pkg "* ]] || PACKAGES+=("$pkg")
  done
done
if [ "$INSTALL" = 1 ] && [ ${#PACKAGES[@]} -gt 0 ]; then
  echo "pip install --no-deps --no-build-isolation$(printf ' -e %s' "${PACKAGES[@]}")" | tee -a "$OUT/install.txt"
  gpu_install_editable "${PACKAGES[@]}" 2>&1 | tail -n 3 | tee -a "$OUT/install.txt"
  [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "FAILED: pip install" | tee -a "$OUT/install.txt"; FAILED=1; }
fi

{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "command: $COMMAND"
  commit=${MOE_GPU_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
  echo "commit: $commit ($(git status --porcelain 2>/dev/null | wc -l) paths differ from git HEAD in this tree)"
  echo "host: $(nproc) cores, $(free -g 2>/dev/null | awk '/^Mem:/ {print $2 " GiB"}')"
  gpu_versions
} | tee "$OUT/machine.txt"

# ---------------------------------------------------------------- run the steps

: > "$OUT/summary.txt"
declare -A SEEN=()
N=${#NAMES[@]}
for i in "${!NAMES[@]}"; do
  name=${NAMES[i]} limit=${LIMITS[i]}
  args=("${STEP_ARGS[@]:${FIRST_ARG[i]}:${ARG_COUNT[i]}}")
  folder=${name/:/-}
  SEEN[$folder]=$((${SEEN[$folder]:-0} + 1))
  [ "${SEEN[$folder]}" -gt 1 ] && folder=$folder-${SEEN[$folder]}
  dir=$OUT/$folder
  mkdir -p "$dir"
  if [ "$BUDGET" -gt 0 ]; then
    left=$((START + BUDGET - $(date +%s)))
    if [ "$left" -lt 30 ]; then
      printf '%-10s %5ss  %-24s %s\n' "no-time" 0 "$name" "${args[*]-}" | tee -a "$OUT/summary.txt"
      FAILED=1
      continue
    fi
    [ "$limit" -gt $((left - 10)) ] && limit=$((left - 10))
  fi
  echo
  echo "=== [$((i + 1))/$N] $name ${args[*]-} (limit ${limit}s) -> $folder/"
  t0=$(date +%s)
  if [[ $name == *:* ]]; then
    MOE_SKIP_INSTALL=1 MOE_STEP_LIMIT=$limit OUT=$dir timeout -k 15 "$limit" \
      bash "$(plugin_script "${name%%:*}")" "${name#*:}" ${args[@]+"${args[@]}"} 2>&1 | tee "$dir/log.txt"
  else
    MOE_STEP_LIMIT=$limit OUT=$dir timeout -k 15 "$limit" \
      bash "$SELF" --run-step "$name" ${args[@]+"${args[@]}"} 2>&1 | tee "$dir/log.txt"
  fi
  rc=${PIPESTATUS[0]}
  case $rc in
    0) state=ok ;;
    124 | 137) state=timeout; FAILED=1 ;;
    *) state="failed($rc)"; FAILED=1 ;;
  esac
  printf '%-10s %5ss  %-24s %s\n' "$state" "$(($(date +%s) - t0))" "$name" "${args[*]-}" >> "$OUT/summary.txt"
done

echo
echo "=== summary ($OUT; $(($(date +%s) - START)) s; machine.txt has the versions and the command)"
cat "$OUT/summary.txt"
gpu_pack_out "$OUT"
exit $FAILED
