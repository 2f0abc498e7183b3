"""Which launch of the `triton` forward costs what: per-kernel GPU time next to the CUDA-graph time.

For each (preset, scheme, M) the forward is run eagerly under ``torch.profiler`` (CUDA activity only) to get
every kernel's device time per forward, then captured in a CUDA graph and replayed (``moe_core.timing``) for
the time a user sees. ``graph - sum(kernels)`` is what the launches cost beyond their kernels' run time
(gaps between dependent kernels, ramp-up/tail). Needs a CUDA GPU; writes JSON with ``--output``.

    python plugins/triton-moe/tools/profile_launches.py --preset qwen3-30b-a3b --tokens 1,8 --output prof.json
"""

from __future__ import annotations

import argparse
import collections
import json
import sys

import torch


def make_forward(preset: str, scheme: str, m: int):
    """A no-argument ``triton`` forward of one preset at M tokens on CUDA (random weights and routing, seed 1)."""
    from moe_core import MoeRunner
    from moe_core.presets import PRESETS
    from moe_core.synthetic import random_inputs, random_weights

    config = PRESETS[preset].config(scheme, torch.bfloat16)
    device = torch.device("cuda")
    runner = MoeRunner(config, random_weights(config, device), backend="triton")
    x, ids, tw = random_inputs(config, m, device, seed=1)
    out = torch.empty(m, config.hidden_size, dtype=config.dtype, device=device)

    def forward():
        runner(x, ids, tw, out=out)

    return forward


def profile_row(preset: str, scheme: str, m: int, repeat: int = 20) -> dict:
    from torch.profiler import ProfilerActivity, profile

    from moe_core.timing import time_forward

    device = torch.device("cuda")
    forward = make_forward(preset, scheme, m)
    graph_us, how = time_forward(forward, device, repeat=repeat)
    for _ in range(3):
        forward()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(repeat):
            forward()
        torch.cuda.synchronize()
    per_kernel: dict[str, float] = collections.defaultdict(float)
    calls: dict[str, int] = collections.defaultdict(int)
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA and event.device_time_total > 0:
            per_kernel[event.name] += event.device_time_total
            calls[event.name] += 1
    kernels = {name: round(total / repeat, 2) for name, total in sorted(per_kernel.items(), key=lambda kv: -kv[1])}
    kernel_sum = sum(kernels.values())
    torch.cuda.empty_cache()
    return {
        "preset": preset,
        "scheme": scheme,
        "tokens": m,
        "graph_us": round(graph_us, 2),
        "timing": how,
        "kernels_us": kernels,
        "launches_per_forward": round(sum(calls.values()) / repeat, 2),
        "kernel_sum_us": round(kernel_sum, 2),
        "overhead_us": round(graph_us - kernel_sum, 2),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", action="append", help="repeatable; default: the four model presets")
    parser.add_argument("--scheme", action="append", help="repeatable; default bf16")
    parser.add_argument("--tokens", default="1,8", help="comma-separated token counts (default 1,8)")
    parser.add_argument("--output", help="write the rows as JSON here")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("profile_launches needs a CUDA GPU", file=sys.stderr)
        return 1
    from moe_core.presets import MODEL_PRESETS

    presets = args.preset or list(MODEL_PRESETS)
    schemes = args.scheme or ["bf16"]
    rows = []
    for preset in presets:
        for scheme in schemes:
            for m in (int(t) for t in args.tokens.split(",")):
                row = profile_row(preset, scheme, m)
                rows.append(row)
                parts = ", ".join(f"{name[:28]} {us:.1f}" for name, us in row["kernels_us"].items())
                print(f"{preset} {scheme} M={m}: graph {row['graph_us']:.1f} us = kernels {row['kernel_sum_us']:.1f} "
                      f"({parts}) + {row['overhead_us']:.1f} launch/gap", flush=True)  # fmt: skip
    if args.output:
        with open(args.output, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
