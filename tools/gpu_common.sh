# shellcheck shell=bash
# What tools/gpu.sh and the plugins' tools/gpu_check.sh scripts share; sourced by each, found from the sourcing
# script's own location (the scripts themselves run in the repository root). Sourcing it sets the shell options
# and PYTHONUNBUFFERED and defines functions; it runs nothing else.
#
#   gpu_plugin_args "$@"   a plugin script's --help / --steps (it defines help() and STEPS), and a first word
#                          that is not a step: a usage error (exit 2)
#   gpu_plugin_setup PLUGIN [wheels] [VERSIONS]   OUT (default /tmp/out), SITE, PY, status; unless
#                          MOE_SKIP_INSTALL is set, installs (the .whl/ wheels with "wheels", then core and
#                          PLUGIN); writes gpu_versions to $OUT/VERSIONS when named
#   fail MESSAGE           prints FAILED: MESSAGE and sets status=1 (the plugin script's exit status)
#   gpu_is_step, gpu_unknown_step   a word of $STEPS; the "unknown step" usage error
#   gpu_install_wheels     .whl/*.whl -> $SITE (pip --target); gpu_install_editable FOLDER...: pip -e
#   gpu_versions           GPU, nvcc, python/torch/CUDA/triton/capability, the moe packages and flashinfer
#   gpu_summarize_check FILE   one line for a `moe check --json` file, and its failed cases
#   gpu_pack_out DIR       DIR's files in one DIR/out.tar.gz (machine.txt and summary.txt left beside it) when
#                          the device tool would not bring them all back (GPU_PACK: auto, 1 always, 0 never)
#   gpu_slim_in_place      the slim FlashInfer library where moe-flashinfer-mxfp4 looks for it: built here, or
#                          copied from a carried .slim/*.so (an earlier slim-build's file); exit 1 when neither
set -uo pipefail
export PYTHONUNBUFFERED=1

# ---------------------------------------------------------------- plugin scripts

gpu_is_step() { [[ " $STEPS " == *" $1 "* ]]; }

gpu_unknown_step() {
  echo "unknown step $1 (steps: $STEPS)"
  exit 2
}

gpu_plugin_args() {
  case "${1:-}" in
    --help | -h) help; exit 0 ;;
    --steps) tr ' ' '\n' <<< "$STEPS"; exit 0 ;;
    '') ;;
    *) gpu_is_step "$1" || gpu_unknown_step "$1" ;;
  esac
}

fail() { echo "FAILED: $*"; status=1; }

gpu_plugin_setup() {
  local plugin=$1 wheels=${2:-} versions=${3:-}
  OUT=${OUT:-/tmp/out}
  mkdir -p "$OUT"
  SITE=${SITE:-/tmp/site}
  PY=python3
  # shellcheck disable=SC2034  # the plugin script's exit status, set by fail
  status=0
  if [ -z "${MOE_SKIP_INSTALL:-}" ]; then
    if [ "$wheels" = wheels ]; then
      if ls .whl/*.whl > /dev/null 2>&1; then
        gpu_install_wheels 2>&1 | tail -n 2
      else
        echo "no .whl/ folder: flashinfer must already be importable"
      fi
      export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
    fi
    gpu_install_editable core "$plugin" 2>&1 | tail -n 2
  fi
  [ -z "$versions" ] || gpu_versions | tee "$OUT/$versions"
}

# ---------------------------------------------------------------- also used by tools/gpu.sh ($PY, $SITE set)

gpu_install_wheels() {  # exit status: pip's
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl
}

gpu_install_editable() {  # FOLDER... -> pip install --no-deps --no-build-isolation -e FOLDER ...
  local editable=() folder
  for folder in "$@"; do editable+=(-e "$folder"); done
  "$PY" -m pip install -q --no-deps --no-build-isolation "${editable[@]}"
}

gpu_versions() {
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | sed 's/^/gpu: /'
  (nvcc --version 2>/dev/null | tail -n 1 | sed 's/^/nvcc: /')
  "$PY" - <<'PY' 2>&1
import importlib.metadata as md
import sys
import torch
try:
    import triton
    tv = triton.__version__
except ImportError:
    tv = "not installed"
cap = torch.cuda.get_device_capability() if torch.cuda.is_available() else None
print(f"python {sys.version.split()[0]}, torch {torch.__version__}, cuda {torch.version.cuda}, triton {tv}, "
      f"capability {cap}")
names = sorted({d.metadata["Name"] for d in md.distributions() if (d.metadata["Name"] or "").startswith("moe-")})
extra = [n for n in ("flashinfer-python", "apache-tvm-ffi", "flashinfer-jit-cache", "flashinfer-cubin")
         if any((d.metadata["Name"] or "") == n for d in md.distributions())]
print("packages:", ", ".join(f"{n} {md.version(n)}" for n in names + extra))
PY
}

gpu_find_ncu() {  # prints the Nsight Compute CLI's path (PATH, else the CUDA image's install); status 1: none
  command -v ncu || find /opt/nvidia/nsight-compute /usr/local/cuda/bin -maxdepth 2 -name ncu -type f 2>/dev/null \
    | head -1 | grep .
}

gpu_summarize_check() {  # exit status 1 when FILE cannot be read
  "$PY" - "$1" <<'PY'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except (OSError, ValueError) as exc:
    print(f"{sys.argv[1]}: no result ({exc})")
    raise SystemExit(1)
print(f"{d['backend']} on {d['device']}: {d['passed']} passed, {d['failed']} failed, {d['skipped']} skipped")
for c in d["cases"]:
    if c["status"] == "failed":
        print("  FAILED", c["kind"], c["id"], c["reason"][:300])
PY
}

gpu_slim_in_place() {  # FLASHINFER_WORKSPACE_BASE decides where the library is looked for: one default for all
  export FLASHINFER_WORKSPACE_BASE=${FLASHINFER_WORKSPACE_BASE:-/tmp/fi-workspace}
  local lib
  lib=$("$PY" -c "from moe_flashinfer_mxfp4.slim.build import library_path; print(library_path())" 2>/dev/null) \
    || return 1
  if [ ! -f "$lib" ] && ls .slim/*.so > /dev/null 2>&1; then
    mkdir -p "$(dirname "$lib")" && cp .slim/*.so "$lib" && echo "using the carried slim library -> $lib"
  fi
  [ -f "$lib" ]
}

# ---------------------------------------------------------------- what comes back

#: the most files the device tool brings back from $OUT, and how deep (DIR/a/b/file comes back, DIR/a/b/c/file not)
GPU_BACK_FILES=8
GPU_BACK_DEPTH=3

gpu_pack_out() {  # DIR: past GPU_BACK_FILES files or GPU_BACK_DEPTH levels, one archive instead (see the top)
  local dir=$1 mode=${GPU_PACK:-auto} count deep
  count=$(find "$dir" -type f | wc -l)
  deep=$(find "$dir" -mindepth $((GPU_BACK_DEPTH + 1)) -type f | wc -l)
  case $mode in
    0) return 0 ;;
    auto) [ "$count" -gt "$GPU_BACK_FILES" ] || [ "$deep" -gt 0 ] || return 0 ;;
  esac
  (cd "$dir" && find . -type f ! -path ./out.tar.gz -print0 | tar --null -czf out.tar.gz -T -) || return 1
  find "$dir" -mindepth 1 -depth ! -path "$dir/out.tar.gz" ! -path "$dir/machine.txt" ! -path "$dir/summary.txt" \
    -delete
  echo "packed $count files into $dir/out.tar.gz (the device tool brings back at most $GPU_BACK_FILES, $GPU_BACK_DEPTH" \
    "levels down): tar -xzf out.tar.gz"
}
