"""Where the host time of one patched MoE block goes at decode (eager, one token): the parts timed alone.

A Qwen3-30B-A3B-shaped block (H 2048, 128 experts, top-8, I 768; random weights, bf16) is patched with
``patch_model(backend=...)``; for M=1 each part is called ``--repeat`` times back to back and timed two
ways: *host* (the loop's wall time before synchronising, per call: what the CPU spends submitting work)
and *wall* (synchronised after every call). Parts: the whole patched block as it runs by default (replayed
from its own CUDA graph, ``moe_core.graphs``) and with those graphs off, its router, the runner's call, the
runner's input checks (``validate_forward``), the backend's ``apply``, and transformers' own block with
``grouped_mm`` for comparison.

    python tools/layer_overhead.py --json overhead.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch
from transformers_bench import FAMILIES  # this folder: the model shapes, written once


def _time(fn, repeat: int) -> dict:
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeat):
        fn()
    host = (time.perf_counter() - start) / repeat * 1e6
    torch.cuda.synchronize()
    walls = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        walls.append((time.perf_counter() - t) * 1e6)
    return {"host_us": round(host, 1), "wall_us": round(statistics.median(walls), 1)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", default="triton")
    p.add_argument("--repeat", type=int, default=200)
    p.add_argument("--json")
    args = p.parse_args(argv)

    import transformers

    from moe_core.integrations.transformers import patch_model
    from moe_core.validation import validate_forward

    torch.manual_seed(0)
    cfg = FAMILIES["qwen3-30b-a3b"](transformers, 1)  # the shapes transformers_bench measures
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).cuda().eval()
    model.set_experts_implementation("grouped_mm")
    hf_block = model.model.layers[0].mlp
    x = torch.randn(1, 1, cfg.hidden_size, device="cuda", dtype=torch.bfloat16)
    rows = {}
    with torch.no_grad():
        rows["hf_grouped_mm_block"] = _time(lambda: hf_block(x), args.repeat)
        patch_model(model, backend=args.backend)
        layer = model.model.layers[0].mlp
        x2 = x.reshape(1, -1)
        ids, weights = layer.router(x2)
        runner = layer.runner
        out = torch.empty_like(x2)
        rows["patched_block"] = _time(lambda: layer(x), args.repeat)  # replayed from the layer's CUDA graph
        max_tokens, layer.graphs.max_tokens = layer.graphs.max_tokens, 0
        rows["patched_block_eager"] = _time(lambda: layer(x), args.repeat)  # every part below, in a row
        layer.graphs.max_tokens = max_tokens
        rows["router"] = _time(lambda: layer.router(x2), args.repeat)
        rows["runner_call"] = _time(lambda: runner(x2, ids, weights), args.repeat)
        rows["validate_forward"] = _time(
            lambda: validate_forward(runner.config, runner.device, x2, ids, weights, None), args.repeat
        )
        rows["apply"] = _time(lambda: runner.fused_op.apply(x2, ids, weights, runner.prepared, out), args.repeat)
    result = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "backend": layer.backend,
        "command": " ".join(sys.argv),
        "M": 1,
        "parts": rows,
    }
    print(json.dumps(result, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
