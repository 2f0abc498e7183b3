set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>&1 | tail -1
export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-deps --no-build-isolation -e core -e plugins/cutlass-fp4 -e plugins/flashinfer-mxfp4 -e plugins/triton-moe 2>&1 | tail -1
python3 - <<'PY' 2>&1 | tee $OUT/h200-support-checks.txt
import datetime, importlib.metadata as md, torch, triton
from moe_core import MoeConfig, MoeProblem
from moe_core.errors import BackendUnavailableError
from moe_core.selection import select
print(datetime.datetime.utcnow().isoformat(timespec="seconds"), torch.cuda.get_device_name(), "SM%d%d" % torch.cuda.get_device_capability(),
      "torch", torch.__version__, "triton", triton.__version__, "flashinfer-python", md.version("flashinfer-python"))
for scheme in ("nvfp4", "mxfp4"):
    problem = MoeProblem(MoeConfig(8, 2, 256, 128, quant_scheme=scheme, dtype=torch.bfloat16), "cuda")
    for backend in ("cutlass_fp4", "flashinfer_mxfp4"):
        try:
            sel = select(problem, backend)
            print(f"{scheme} {backend}: selected {sel.op.__name__}")
        except BackendUnavailableError as exc:
            print(f"{scheme} {backend}: BackendUnavailableError: {exc}")
PY
python3 -m moe_core.cli backends --check --json | tee $OUT/h200-backends-check.json
