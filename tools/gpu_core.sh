#!/usr/bin/env bash
# One device call for moe-core on the lent H200: install, GPU tests, conformance on CUDA,
# and `moe bench` of the torch backend on the four model presets. Writes into $OUT.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-deps --no-build-isolation -e core 2>&1 | tail -2
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch, sys; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'python', sys.version.split()[0])" | tee -a "$OUT/gpu.txt"
python3 -m pytest core/tests -q -x -m gpu -rs 2>&1 | tail -3 | tee "$OUT/pytest-gpu.txt"
python3 -m moe_core.cli check torch --json > "$OUT/check-torch-cuda.json"; echo "moe check torch exit $?"
python3 -c "import json; d=json.load(open('$OUT/check-torch-cuda.json')); print({k: d[k] for k in ('backend','device','passed','failed','skipped')})"
python3 -m moe_core.cli bench --backend torch --output "$OUT/bench-torch.json" --plot "$OUT/bench-torch.png" "$@"
