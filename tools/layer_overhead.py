"""Where the host time of one patched MoE block goes (eager): the parts timed alone, and what they run.

A block with a family's real shapes (``transformers_bench.FAMILIES``: Qwen3-30B-A3B or gpt-oss-120b; random
weights, bf16) is patched with ``patch_model(backend=...)``; for each token count M each part is called
``--repeat`` times back to back and timed two ways: *host* (the loop's wall time before synchronising, per
call: what the CPU spends submitting work) and *wall* (synchronised after every call). Parts: the whole
patched block as it runs by default (replayed from its own CUDA graph up to ``CUDA_GRAPH_MAX_TOKENS``) and
with those graphs off, its router, the runner's call, the runner's input checks (``validate_forward``), the
backend's ``apply``, and transformers' own block with ``grouped_mm`` for comparison.

With the triton backend the eager block and ``apply`` are timed in alternating rounds with fast launches
and with every kernel launched through Triton's ``JITFunction.run`` (the ``fast_launch`` switch off);
``route`` is the router's routing function alone on its logits, ``route_softmax_topk_renormalise``
transformers' six-kernel form of a renormalised softmax top-k on the same logits.

``--cprofile N``: the N functions with the most own time over ``--repeat`` eager calls of the patched block
(graphs off), per call. ``--kernels``: the GPU kernels of one eager call of the patched block and of
transformers' block (``torch.profiler``): name, count and GPU µs — how many launches the host pays for.

    python tools/layer_overhead.py --family gpt-oss-120b --tokens 1,2048 --cprofile 25 --kernels --json o.json
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import statistics
import sys
import time

import torch
from transformers_bench import FAMILIES  # this folder: the model shapes, written once


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _time(fn, repeat: int, warmup: int = 10) -> dict:
    for _ in range(warmup):
        fn()
    _sync()
    start = time.perf_counter()
    for _ in range(repeat):
        fn()
    host = (time.perf_counter() - start) / repeat * 1e6
    _sync()
    walls = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        _sync()
        walls.append((time.perf_counter() - t) * 1e6)
    return {"host_us": round(host, 1), "wall_us": round(statistics.median(walls), 1)}


def _alternating(fast, plain, repeat: int, rounds: int = 20) -> dict:
    """Host and wall µs per call of two variants timed in alternating rounds (median over rounds), so that
    the host's drift between measurements falls on both alike."""
    out = {"fast": {"host_us": [], "wall_us": []}, "plain": {"host_us": [], "wall_us": []}}
    n = max(1, repeat // 4)
    for _ in range(rounds):
        for name, fn in (("fast", fast), ("plain", plain)):
            t = _time(fn, n, warmup=2)
            out[name]["host_us"].append(t["host_us"])
            out[name]["wall_us"].append(t["wall_us"])
    return {name: {k: round(statistics.median(v), 1) for k, v in d.items()} for name, d in out.items()}


def _cprofile(fn, repeat: int, top: int) -> list[dict]:
    """The ``top`` functions by own time over ``repeat`` calls of ``fn``, in µs per call of ``fn``."""
    for _ in range(5):
        fn()
    _sync()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(repeat):
        fn()
    prof.disable()
    _sync()
    stats = pstats.Stats(prof)
    rows = []
    for (path, line, name), (_, ncalls, tottime, cumtime, _) in stats.stats.items():
        where = f"{path.rsplit('site-packages/', 1)[-1]}:{line}({name})"
        rows.append({"function": where, "calls_per_call": round(ncalls / repeat, 2),
                     "own_us": round(tottime / repeat * 1e6, 2),
                     "cum_us": round(cumtime / repeat * 1e6, 2)})  # fmt: skip
    rows.sort(key=lambda r: -r["own_us"])
    return rows[:top]


def _kernels(fn) -> list[dict]:
    """GPU kernels of one call of ``fn`` (after warm-up): name, launches, total GPU µs; largest first."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        fn()
    _sync()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        _sync()
    rows = [
        {"kernel": e.key[:120], "count": e.count, "gpu_us": round(e.device_time_total, 1)}
        for e in prof.key_averages()
        if e.device_time_total > 0
    ]
    return sorted(rows, key=lambda r: -r["gpu_us"])


def _six_kernel_route(logits: torch.Tensor, top_k: int):
    """A renormalised softmax top-k as transformers writes it (cast, softmax, top-k, sum, divide, cast): the
    yardstick of ``moe_core.routing.softmax_topk``'s three kernels."""
    probs = torch.softmax(logits.float(), dim=-1)
    weights, ids = probs.topk(top_k, dim=-1)
    return ids.to(torch.int32), weights / weights.sum(dim=-1, keepdim=True)


def _hf_parts(hf_block, x, args) -> dict:
    """transformers' own block on ``x``: its time, and its kernels with ``--kernels``."""
    out = {"time": _time(lambda: hf_block(x), args.repeat)}
    if args.kernels:
        out["kernels_hf_grouped_mm"] = _kernels(lambda: hf_block(x))
    return out


def _patched_parts(layer, x, args) -> dict:
    """The patched block on ``x`` as it runs by default, then eager (its graphs off) with each part alone."""
    from moe_core.validation import validate_forward

    m = x.shape[1]
    x2 = x.reshape(m, -1)
    ids, weights = layer.router(x2)
    runner = layer.runner
    out = torch.empty_like(x2)
    rows = {"patched_block": _time(lambda: layer(x), args.repeat)}
    entry = {"parts": rows}
    max_tokens, layer.graphs.max_tokens = layer.graphs.max_tokens, 0
    try:
        rows["patched_block_eager"] = _time(lambda: layer(x), args.repeat)
        rows["router"] = _time(lambda: layer.router(x2), args.repeat)
        rows["runner_call"] = _time(lambda: runner(x2, ids, weights), args.repeat)
        rows["validate_forward"] = _time(
            lambda: validate_forward(runner.config, runner.device, x2, ids, weights, None), args.repeat
        )
        rows["apply"] = _time(lambda: runner.fused_op.apply(x2, ids, weights, runner.prepared, out), args.repeat)
        if layer.backend == "triton":  # fast launches against Triton's JITFunction.run, in alternating rounds
            from moe_triton import switches

            def plain(fn):
                def run():
                    with switches.override(fast_launch=False):
                        fn()

                return run

            block, apply = (lambda: layer(x)), (lambda: runner.fused_op.apply(x2, ids, weights, runner.prepared, out))
            entry["fast_vs_plain_launch"] = {
                "block_eager": _alternating(block, plain(block), args.repeat),
                "apply": _alternating(apply, plain(apply), args.repeat),
            }
        logits = layer.router.logits(x2)
        rows["route"] = _time(lambda: layer.router.route(logits), args.repeat)
        rows["route_softmax_topk_renormalise"] = _time(lambda: _six_kernel_route(logits, ids.shape[1]), args.repeat)
        if args.cprofile:
            entry["cprofile_block_eager"] = _cprofile(lambda: layer(x), args.repeat, args.cprofile)
        if args.kernels:
            entry["kernels_block_eager"] = _kernels(lambda: layer(x))
    finally:
        layer.graphs.max_tokens = max_tokens
    return entry


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--family", choices=sorted(FAMILIES), default="qwen3-30b-a3b")
    p.add_argument("--tokens", default="1", help="comma-separated token counts M (default 1)")
    p.add_argument("--backend", default="triton")
    p.add_argument("--repeat", type=int, default=200)
    p.add_argument("--cprofile", type=int, default=0, metavar="N", help="also the N functions with most own time")
    p.add_argument("--kernels", action="store_true", help="also the GPU kernels of one eager call")
    p.add_argument("--device", default="cuda", help="cuda (default), or cpu for a smoke run with --backend torch")
    p.add_argument("--json")
    args = p.parse_args(argv)
    tokens = [int(t) for t in args.tokens.split(",")]

    import transformers

    from moe_core.integrations.transformers import patch_model

    torch.manual_seed(0)
    cfg = FAMILIES[args.family](transformers, 1)  # the shapes transformers_bench measures
    with torch.device(args.device):
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).eval()
    model.set_experts_implementation("grouped_mm")
    hf_block = model.model.layers[0].mlp
    xs = {m: torch.randn(1, m, cfg.hidden_size, device=args.device, dtype=torch.bfloat16) for m in tokens}
    per_m = {}
    with torch.no_grad():
        hf = {m: _hf_parts(hf_block, xs[m], args) for m in tokens}
        patch_model(model, backend=args.backend)
        layer = model.model.layers[0].mlp  # a PatchedMoeBlock: a MoeLayer returning what the block did
        for m in tokens:
            per_m[str(m)] = entry = _patched_parts(layer, xs[m], args)
            entry["parts"] = {"hf_grouped_mm_block": hf[m].pop("time"), **entry["parts"]}
            entry.update(hf[m])
            print(f"M={m}: " + ", ".join(f"{k} {v['host_us']}/{v['wall_us']}" for k, v in entry["parts"].items()),
                  entry.get("fast_vs_plain_launch", ""), flush=True)  # fmt: skip
    result = {
        "device": torch.cuda.get_device_name() if args.device == "cuda" else args.device,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "family": args.family,
        "backend": layer.backend if tokens else None,
        "command": " ".join(sys.argv),
        "units": "µs per call: host (submit only) / wall (synchronised)",
        "tokens": per_m,
    }
    print(json.dumps(result, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
