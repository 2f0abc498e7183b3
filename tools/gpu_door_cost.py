"""The runner's door on a GPU: what the per-forward checks cost, and that bad ids are harmless.

Run on a GPU through ``bash tools/gpu.sh door-cost [--parts ...]`` (or directly: ``--output FILE``);
writes one JSON file.

1. ``door``: host time of one ``runner(x, ids, tw, out=out)`` whose bound ``apply`` is a no-op returning
   ``out`` — everything the runner does around the kernel (input metadata checks, the ``out`` overlap
   check, the result check) — against the same with ``check_result`` replaced by the identity, interleaved
   in rounds; the difference is the output check's cost. Also without ``out`` (a fresh result checked).
2. ``eager``: a real triton forward through the runner against ``fused_op.apply`` called directly, both
   synchronised per call, interleaved; the difference is the whole door's cost at decode.
3. ``mask``: GPU time of ``mask_invalid_ids`` per call (CUDA graph of 100 calls): what a forward costs extra
   on a backend that does not declare ``handles_invalid_ids``.
4. ``bad_ids``: the triton forward at qwen3-30b-a3b's shape with the default settings (id check off) and one
   id set to E, 10**6, -1 or -5: no crash, finite output, equal to the reference with that pair dropped.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

import moe_core.runner as runner_mod
from moe_core import MoeConfig, MoeRunner
from moe_core.reference import reference_for
from moe_core.synthetic import random_inputs, random_weights
from moe_core.tolerances import relative_l2, tolerance
from moe_core.validation import mask_invalid_ids

QWEN3 = dict(num_experts=128, top_k=8, hidden_size=2048, intermediate_size=768)


def _per_call_us(fn, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


def _interleaved(variants: dict, calls: int, rounds: int) -> dict:
    """Median per-call µs of each variant over ``rounds`` rounds, the variants alternating in each round.
    A variant is a callable, or (setup, callable) where setup runs untimed before its block of calls."""
    samples = {name: [] for name in variants}
    for _ in range(rounds):
        for name, variant in variants.items():
            setup, fn = variant if isinstance(variant, tuple) else (None, variant)
            if setup is not None:
                setup()
            samples[name].append(_per_call_us(fn, calls))
    return {name: round(statistics.median(v), 3) for name, v in samples.items()}


def door(cfg: MoeConfig, runner: MoeRunner, m: int, rounds: int) -> dict:
    x, ids, tw = random_inputs(cfg, m, "cuda")
    out = torch.empty(m, cfg.hidden_size, dtype=cfg.dtype, device="cuda")
    fresh = torch.empty_like(out)
    real_apply, real_check = runner._apply, runner_mod.check_result

    def use(check):
        return lambda: setattr(runner_mod, "check_result", check)

    def identity(backend, result, *args):
        return result

    result = {"m": m}
    try:
        runner._apply = lambda x, ids, tw, prepared, o: o if o is not None else fresh
        for label, fn in (("out", lambda: runner(x, ids, tw, out=out)), ("fresh", lambda: runner(x, ids, tw))):
            t = _interleaved({"checked": (use(real_check), fn), "unchecked": (use(identity), fn)}, 20000, rounds)
            result[label] = {**t, "check_us": round(t["checked"] - t["unchecked"], 3)}
    finally:
        runner._apply, runner_mod.check_result = real_apply, real_check
    return result


def eager(cfg: MoeConfig, runner: MoeRunner, m: int, rounds: int) -> dict:
    x, ids, tw = random_inputs(cfg, m, "cuda")
    out = torch.empty(m, cfg.hidden_size, dtype=cfg.dtype, device="cuda")
    op, prepared = runner.fused_op, runner.prepared

    def through_runner():
        runner(x, ids, tw, out=out)
        torch.cuda.synchronize()

    def direct():
        op.apply(x, ids, tw, prepared, out)
        torch.cuda.synchronize()

    for _ in range(50):
        through_runner()
        direct()
    t = _interleaved({"runner": through_runner, "apply": direct}, 500, rounds)
    return {"m": m, **t, "door_us": round(t["runner"] - t["apply"], 3)}


def mask(cfg: MoeConfig, m: int) -> dict:
    _, ids, tw = random_inputs(cfg, m, "cuda")
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        mask_invalid_ids(ids, tw, cfg.num_experts)
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        for _ in range(100):
            mask_invalid_ids(ids, tw, cfg.num_experts)
    graph.replay()
    times = []
    for _ in range(20):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / 100)
    return {"m": m, "us_per_call": round(statistics.median(times), 3)}


def bad_ids(scheme: str, m: int) -> list[dict]:
    cfg = MoeConfig(**QWEN3, quant_scheme=scheme, dtype=torch.bfloat16)
    weights = random_weights(cfg, "cuda")
    runner = MoeRunner(cfg, weights, backend="triton")  # default settings: on CUDA the id check is off
    x, ids, tw = random_inputs(cfg, m, "cuda")
    rows = []
    for bad in (cfg.num_experts, 10**6, -1, -5):
        bad_ids_ = ids.clone()
        bad_ids_[m // 2, 3] = bad
        out = runner(x, bad_ids_, tw)
        torch.cuda.synchronize()
        err = relative_l2(out, reference_for(cfg, weights, x, bad_ids_, tw))
        rows.append({
            "scheme": scheme, "m": m, "id": bad, "check_expert_ids": runner.check_expert_ids,
            "finite": bool(torch.isfinite(out).all()), "rel_l2_vs_reference_without_that_pair": err,
            "tolerance": tolerance(scheme, cfg.dtype), "ok": err <= tolerance(scheme, cfg.dtype),
        })  # fmt: skip
        print(rows[-1], flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", required=True, help="JSON file to write")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--parts", default="door,eager,mask,bad_ids", help="comma-separated parts to run")
    args = parser.parse_args()
    cfg = MoeConfig(**QWEN3, quant_scheme="bf16", dtype=torch.bfloat16)
    runner = MoeRunner(cfg, random_weights(cfg, "cuda"), backend="triton")
    parts = {
        "door": lambda: [door(cfg, runner, m, args.rounds) for m in (1, 64)],
        "eager": lambda: [eager(cfg, runner, m, args.rounds) for m in (1, 8)],
        "mask": lambda: [mask(cfg, m) for m in (1, 64, 4096)],
        "bad_ids": lambda: [row for s in ("bf16", "fp8_block", "mxfp4") for m in (8, 4096) for row in bad_ids(s, m)],
    }
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "shape": QWEN3}
    for part in args.parts.split(","):
        report[part] = parts[part]()
        if part != "bad_ids":
            print(part, json.dumps(report[part]), flush=True)
    with open(args.output, "w") as f:
        json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
