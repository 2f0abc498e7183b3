#!/bin/bash
# the lean call: install; the alignment's CUDA tests and A/B against 9582b93's; Qwen3 at 2048 through
# transformers (HF grouped_mm and ours); ours with PDL, and with the gated kernel at 2048. Inner limits keep
# the packing inside the call's limit.
export MOE_GPU_COMMIT=${MOE_GPU_COMMIT:?}
SECONDS=0
bash tools/gpu.sh install
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
V=$OUT/variants; mkdir -p $V
echo "install done at ${SECONDS}s" > $V/times.txt
(cd plugins/triton-moe && timeout 80 python3 -m pytest -q -x tests/test_plugin.py tests/test_expert_ids.py tests/test_kernel_paths.py > $V/pytest.txt 2>&1; echo "rc=$?" >> $V/pytest.txt)
echo "pytest done at ${SECONDS}s" >> $V/times.txt
timeout 45 python3 plugins/triton-moe/tools/align_ab.py --against .ab/align_old.py --json $V/align_ab.json > $V/align_ab.log 2>&1; echo "rc=$?" >> $V/align_ab.log
echo "align_ab done at ${SECONDS}s" >> $V/times.txt
bench() {  # NAME IMPLS ENV...
  local name=$1 impls=$2; shift 2
  local left=$((330 - SECONDS)); [ $left -lt 30 ] && { echo "skipped $name" >> $V/times.txt; return; }
  env "$@" timeout $((left < 70 ? left : 70)) python3 tools/transformers_bench.py --family qwen3-30b-a3b --tokens 2048 \
    --impls $impls --profile --repeat 20 --json $V/$name.json > $V/$name.log 2>&1; echo "rc=$?" >> $V/$name.log
  echo "$name done at ${SECONDS}s" >> $V/times.txt
}
bench base grouped_mm,moe:triton
# the H200 table's Qwen3 M=2048 entry sets pdl (base has it): the A/B is without; elsewhere base has none
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  bench nopdl moe:triton MOE_TRITON_PDL=0
else
  bench pdl1 moe:triton MOE_TRITON_PDL=1
fi
bench gate4096 moe:triton MOE_TRITON_GATE_MAX_TOKENS=4096
cd $OUT && tar czf /tmp/all.tgz . && rm -rf ./* && mv /tmp/all.tgz $OUT/all.tgz && ls -la $OUT
