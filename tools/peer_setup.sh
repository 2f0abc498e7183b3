#!/usr/bin/env bash
# Set up issue 20's peer harness in the git-ignored .peer/ of this checkout (../shared/peer-bench/README.md):
# copy the harness, cut vLLM 0.33.0's kernels out of its wheel (downloaded once into ../vllm-wheel, ~340 MB, kept
# out of the tree) and point the harness at this checkout's module names. Then `bash tools/gpu.sh peer` runs it on
# a GPU machine (carry .peer). Re-running replaces .peer/ but keeps the wheel.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SRC=${PEER_BENCH:-$ROOT/../shared/peer-bench}
WHEELS=${VLLM_WHEEL_DIR:-$ROOT/../vllm-wheel}
PY=${PYTHON:-python3}
[ -f "$SRC/side_by_side.py" ] || { echo "no peer harness at $SRC (set PEER_BENCH)" >&2; exit 1; }
git -C "$ROOT" check-ignore -q .peer/x || { echo ".peer/ is not git-ignored here" >&2; exit 1; }
ls "$WHEELS"/vllm-0.33.0-*.whl > /dev/null 2>&1 || "$PY" -m pip download -q --no-deps vllm==0.33.0 -d "$WHEELS"
rm -rf "$ROOT/.peer" && cp -r "$SRC" "$ROOT/.peer"
"$PY" "$ROOT/.peer/vendor_vllm.py" "$WHEELS"/vllm-0.33.0-*.whl
# the harness was written against older module names: measure_ceilings is in bench_rows, work in timing
sed -i 's/^from moe_core.bench import measure_ceilings, work\( *# noqa: E402\)$/from moe_core.bench_rows import measure_ceilings\1\nfrom moe_core.timing import work\1/' \
  "$ROOT/.peer/side_by_side.py"
"$PY" - "$ROOT/.peer/side_by_side.py" <<'PYEOF'
import ast, sys
tree = ast.parse(open(sys.argv[1]).read())
mods = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("moe_core")}
assert "moe_core.bench" not in mods, "side_by_side.py still imports moe_core.bench: update tools/peer_setup.sh"
print("peer harness ready in .peer/ (imports:", ", ".join(sorted(mods)) + ")")
PYEOF
