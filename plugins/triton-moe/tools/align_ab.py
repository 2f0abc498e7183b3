"""Time the alignment (``moe_triton.kernels.align.align``) alone, and A/B it against another version of it.

The alignment is a few small launches before GEMM1 whose time inside a whole forward is hard to see, so
this times it alone: each case's random top-k ids (``E`` experts, top ``k``, ``M`` tokens, ``BLOCK_M``), CUDA-
graph replay medians (``moe_core.timing.time_forward``). ``--against FILE`` loads another version of
``kernels/align.py`` (e.g. ``git show <commit>:plugins/triton-moe/src/moe_triton/kernels/align.py >
/tmp/align_then.py``) as a module beside the tree's: both are timed in this one process on the same ids, and
their outputs compared (the same offsets and block segments, and the same pairs in each segment: the order
of a segment's rows is free). ``--device cpu`` with ``TRITON_INTERPRET=1`` is a smoke run of this tool.

    python plugins/triton-moe/tools/align_ab.py --against /tmp/align_then.py --json align_ab.json
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import itertools
import json
import sys

import torch

#: (E, k, M, BLOCK_M): Qwen3 / gpt-oss (128 experts) and DeepSeek-V3 (256) at prefill sizes, Mixtral (8),
#: and two sizes just past the one-program alignment
CASES = ((128, 8, 2048, 128), (128, 8, 2048, 64), (128, 4, 2048, 128), (128, 8, 4096, 128), (256, 8, 4096, 128),
         (8, 2, 2048, 128), (128, 8, 256, 64), (256, 8, 512, 64))  # fmt: skip


def _load(path: str):
    spec = importlib.util.spec_from_file_location("align_against", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def same_alignment(a, b, num_experts: int) -> bool:
    """Whether two ``align`` results are the same alignment: offsets and block segments equal, and each
    segment holding the same pairs."""
    if not (torch.equal(a[1], b[1]) and torch.equal(a[2], b[2])):
        return False
    offsets = a[2].tolist()
    return all(
        torch.equal(a[0][lo:hi].sort().values, b[0][lo:hi].sort().values)
        for lo, hi in itertools.pairwise(offsets)  # segments 0..E; offsets[E + 1] is the total
    )


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--against", help="another version of kernels/align.py to time and compare beside the tree's")
    default = ",".join(":".join(map(str, c)) for c in CASES)
    p.add_argument("--cases", help=f"E:k:M:BLOCK_M,... (default: {default})")
    p.add_argument("--repeat", type=int, default=30)
    p.add_argument("--device", default="cuda")
    p.add_argument("--json", help="write the rows here")
    args = p.parse_args(argv)

    from moe_core.timing import time_forward
    from moe_triton.kernels import align as tree

    cases = [tuple(map(int, c.split(":"))) for c in args.cases.split(",")] if args.cases else CASES
    versions = {"tree": tree}
    if args.against:
        versions["against"] = _load(args.against)
    device = torch.device(args.device)
    rows = []
    for num_experts, top_k, m, block_m in cases:
        gen = torch.Generator(device=device).manual_seed(m + num_experts)
        scores = torch.rand(m, num_experts, generator=gen, device=device)
        ids = scores.topk(top_k, dim=1).indices.to(torch.int32)
        row = {"E": num_experts, "k": top_k, "M": m, "block_m": block_m}
        results = {}
        for name, module in versions.items():
            call = functools.partial(module.align, ids, num_experts, block_m)
            results[name] = call()
            row[f"{name}_us"] = round(time_forward(call, device, args.repeat)[0], 2)
        if "against" in results:
            row["same"] = same_alignment(results["tree"], results["against"], num_experts)
        print(json.dumps(row), flush=True)
        rows.append(row)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": str(device), "rows": rows}, f, indent=1)
    return 0 if all(r.get("same", True) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
