#!/usr/bin/env bash
# moe-cutlass-fp4 on a CUDA machine. The lent H200 is SM90: it has NO NVFP4 CUTLASS path, so this checks what an
# SM90 machine can; no SM100 result is claimed anywhere. Writes into $OUT. Reached through the one entry point:
# bash tools/gpu.sh cutlass:check; standalone: bash plugins/cutlass-fp4/tools/gpu_check.sh [check] (installs core +
# plugin and the .whl/ wheels first, unless MOE_SKIP_INSTALL is set).
#
# flashinfer is carried as wheels in .whl/ (see plugins/flashinfer-mxfp4/tools/gpu_check.sh: flashinfer_python
# 0.6.18 <= v < 0.8 within the 64 MiB carry, e.g. 0.6.18.post1 or 0.7.0.post1, plus apache_tvm_ffi for cp312).
# shellcheck source=SCRIPTDIR/../../../tools/gpu_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../../tools/gpu_common.sh"  # set -uo pipefail; gpu_plugin_*, fail, ...

help() {
  cat <<'HELP'
check          the support reason on this GPU (Hopper, precisely) and that an explicit request lists the
               torch backend as usable -> cutlass-fp4-support.txt; moe-core's 128x4 scale swizzle against
               FlashInfer's own CUDA block_scale_interleave (builds the small fp4_quantization_90 JIT
               module, 7 sources, a few minutes) -> swizzle-vs-block_scale_interleave.txt; the plugin's
               tests -> pytest-cutlass-fp4.txt
HELP
}
STEPS="check"
gpu_plugin_args "$@"  # no step = check, the only one
export FLASHINFER_WORKSPACE_BASE=${FLASHINFER_WORKSPACE_BASE:-/tmp/fi-workspace}
export MAX_JOBS=${MAX_JOBS:-16}
PLUGIN=plugins/cutlass-fp4
gpu_plugin_setup "$PLUGIN" wheels  # the .whl/ wheels, core and the plugin

python3 - <<'PY' 2>&1 | tee "$OUT/cutlass-fp4-support.txt" || fail "support check"
import os, torch, importlib.metadata as md
from moe_core import MoeConfig, MoeProblem
from moe_core.errors import BackendUnavailableError
from moe_core.selection import select
from moe_cutlass_fp4.fused_op import CutlassFp4FusedOp as Op
print(torch.cuda.get_device_name(), "SM%d%d" % torch.cuda.get_device_capability(), "flashinfer-python",
      md.version("flashinfer-python"))
cfg = MoeConfig(8, 2, 256, 128, quant_scheme="nvfp4", dtype=torch.bfloat16)
problem = MoeProblem(cfg, "cuda")
for opted in (False, True):
    if opted:
        os.environ["MOE_CUTLASS_FP4_FC2_INPUT_SCALE"] = "0.01"
    print(f"opt-in={opted}: check ->", Op.check(problem))
try:
    select(problem, "cutlass_fp4")
    print("UNEXPECTED: cutlass_fp4 was selected on", torch.cuda.get_device_name())
    raise SystemExit(1 if torch.cuda.get_device_capability() < (10, 0) else 0)
except BackendUnavailableError as exc:
    print("explicit request:", exc)
PY

python3 - <<'PY' 2>&1 | tee "$OUT/swizzle-vs-block_scale_interleave.txt" || fail "swizzle against block_scale_interleave"
import time, torch, flashinfer
from moe_core.layout import swizzle_128x4
t = time.perf_counter()
ok = True
for shape in [(128, 4), (256, 16), (200, 9), (4, 256, 16), (3, 384, 36), (8, 512, 8)]:
    sf = torch.randint(0, 256, shape, dtype=torch.int32).to(torch.uint8).cuda()
    ref = flashinfer.block_scale_interleave(sf).flatten()  # FlashInfer's CUDA kernel (JIT fp4_quantization_90)
    mine = swizzle_128x4(sf).flatten()
    same = torch.equal(ref, mine)
    ok &= same
    print(shape, "equal" if same else f"DIFFERENT ({(ref != mine).sum().item()} bytes)")
print("swizzle_128x4 == flashinfer.block_scale_interleave:", ok, f"({time.perf_counter() - t:.0f}s incl. JIT build)")
raise SystemExit(0 if ok else 1)
PY

python3 -m pytest "$PLUGIN/tests" -q -rs -p no:cacheprovider 2>&1 | tail -8 \
  | tee "$OUT/pytest-cutlass-fp4.txt" || fail "plugin tests"
exit $status
