"""Time a transformers MoE model patched with ``patch_model`` against transformers' own experts implementations.

A model with the real layer shapes of a family (random weights, ``--layers`` decoder layers, a small
vocabulary so the LM head does not dominate) is built once in bf16 on the GPU; every implementation runs
the same weights and the same inputs:

- ``eager``, ``grouped_mm``, ``batched_mm``: transformers' experts implementations (``set_experts_implementation``);
- ``moe:<backend>`` (and ``moe:<backend>:<scheme>``): a deep copy patched with
  ``moe_core.integrations.transformers.patch_model(copy, backend=..., quant_scheme=...)``.

For each token count M it reports, for one MoE block on ``[M, H]``:

- ``block_us``: eager wall time (CUDA-synchronised, median of ``--repeat`` after warm-up) — what a transformers
  user pays, host overhead included. For ``moe:*`` that is the default layer, which replays forwards of few
  tokens from its own CUDA graphs (``moe_core.graphs``); ``block_nograph_us`` is the same layer with those
  off (``cuda_graph_max_tokens=0``);
- ``block_graph_us``: the block captured by the caller in one CUDA graph, per replay (CUDA events over
  ``--repeat`` replays); ``block_graph_error`` where the implementation cannot be captured;
- with ``--compile``, ``block_compiled_us``: the block (``moe:*``: the default layer, its own graphs on) under
  ``torch.compile`` (default mode, a fresh compile per implementation and M, ``dynamic=False``), eager wall
  time as ``block_us``; ``block_compile_s`` the first call (tracing and code generation);
  ``block_compile_error`` where it fails;

and the whole model's eager forward on ``[1, M]`` (prefill) or ``[M, 1]`` (a decode step of a batch of M
sequences, no KV cache). For every implementation — bf16 transformers ones included, so their spread is the
yardstick — the relative L2 error of the block's output and of the logits against the same model run in
float32. An implementation that runs out of memory at some M records ``error`` for that row.
With ``--profile``, the block (``block_kernels``) and each whole-model row (``<phase>_kernels``) also get GPU
kernel time per call and its largest kernels, so a wall-time gap can be told apart as host time or as
different kernels.

    python tools/transformers_bench.py --family qwen3-30b-a3b --tokens 1,64,2048 --json out.json
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import statistics
import sys
import time

import torch

FAMILIES = {
    # real layer shapes; vocabulary cut to 32000 (the LM head is not what is measured)
    "qwen3-30b-a3b": lambda t, layers: t.Qwen3MoeConfig(
        hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768, num_experts=128,
        num_experts_per_tok=8, norm_topk_prob=True, num_attention_heads=32, num_key_value_heads=4, head_dim=128,
        num_hidden_layers=layers, vocab_size=32000,
    ),
    "gpt-oss-120b": lambda t, layers: t.GptOssConfig(
        num_hidden_layers=layers, vocab_size=32000,
        layer_types=(["sliding_attention", "full_attention"] * layers)[:layers],
    ),
}  # fmt: skip


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _median_us(fn, repeat: int, device: torch.device, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    _sync(device)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        _sync(device)
        times.append((time.perf_counter() - start) * 1e6)
    return statistics.median(times)


def _graph_us(fn, repeat: int) -> float:
    """Per-replay time of ``fn`` captured in one CUDA graph (warmed up on a side stream first)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    for _ in range(3):
        graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeat):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / repeat


def _kernels(fn, calls: int = 2, top: int = 6) -> dict:
    """GPU kernel time per call of ``fn`` and its largest kernels (torch.profiler, CUDA activity only).

    Why: a wall time above the sum of the kernels is host time; kernels that differ between two implementations
    of the same model say where a gap comes from.
    """
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    rows = []
    for event in prof.key_averages():
        us = getattr(event, "self_device_time_total", None)
        us = event.self_cuda_time_total if us is None else us
        if us > 0:
            rows.append((us / calls, event.count / calls, event.key))
    rows.sort(reverse=True)
    return {
        "gpu_us": round(sum(r[0] for r in rows), 1),
        "top": [{"us": round(us, 1), "per_call": n, "kernel": name[:120]} for us, n, name in rows[:top]],
    }


def _layers_graphs(model, max_tokens: int) -> None:
    """Set the CUDA-graph token limit of every ``MoeLayer`` in ``model`` (``ForwardGraphs.max_tokens``)."""
    from moe_core import MoeLayer

    for module in model.modules():
        if isinstance(module, MoeLayer):
            module.graphs.max_tokens = max_tokens


def _block(model):
    return model.model.layers[0].mlp


def _first(out):
    """A block's output tensor (gpt-oss and Llama 4 blocks return a tuple)."""
    return out[0] if isinstance(out, tuple) else out


def _rel_l2(got: torch.Tensor, ref: torch.Tensor) -> float:
    """Relative L2 error of ``got`` against the float32 ``ref`` (shapes flattened alike)."""
    got, ref = got.float().reshape(ref.shape), ref.float()
    return round(float((got - ref).norm() / ref.norm().clamp_min(1e-30)), 6)


def _compiled(row: dict, block, x, repeat: int, device) -> None:
    """``block_compiled_us`` / ``block_compile_s`` (or ``block_compile_error``) of ``torch.compile(block)`` on ``x``."""
    torch._dynamo.reset()  # each (implementation, M) traced afresh: no cache-limit fallbacks between rows
    compiled = torch.compile(block, dynamic=False)
    try:
        started = time.perf_counter()
        compiled(x)
        _sync(device)
        row["block_compile_s"] = round(time.perf_counter() - started, 1)
        # 20 warm-up calls, not 3: the steady time of a compiled call is what a serving loop pays
        row["block_compiled_us"] = round(_median_us(lambda: compiled(x), repeat, device, warmup=20), 1)
    except Exception as exc:  # a block that does not compile: say why, go on with the row
        row["block_compile_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"


def _measure(
    row: dict, model, reference, block, impl: str, m: int, config, device, repeat: int, profile: bool = False,
    compile_block: bool = False,
) -> None:  # fmt: skip
    h = config.hidden_size
    gen = torch.Generator(device=device).manual_seed(m)
    x = torch.randn(1, m, h, device=device, dtype=torch.bfloat16, generator=gen)
    ids_prefill = torch.randint(0, config.vocab_size, (1, m), device=device, generator=gen)
    ids_decode = ids_prefill.reshape(m, 1)
    ours = impl.startswith("moe:")
    with torch.no_grad():
        call = lambda: block(x)
        row["block_us"] = round(_median_us(call, repeat, device), 1)
        row["block_rel_l2"] = _rel_l2(_first(block(x)), _first(_block(reference)(x.float())))
        if ours:
            from moe_core.layer import CUDA_GRAPH_MAX_TOKENS

            _layers_graphs(model, 0)
            row["block_nograph_us"] = round(_median_us(call, repeat, device), 1)
            _layers_graphs(model, CUDA_GRAPH_MAX_TOKENS)  # the default layer again: caller's graph, compiled
        if device.type == "cuda":
            try:
                row["block_graph_us"] = round(_graph_us(call, repeat), 1)
            except Exception as exc:  # an implementation that cannot be captured: say why
                row["block_graph_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
                torch.cuda.synchronize()
        if profile and device.type == "cuda":
            row["block_kernels"] = _kernels(call)
        if compile_block:
            _compiled(row, block, x, repeat, device)
        for phase, ids in (("prefill", ids_prefill), ("decode", ids_decode)):
            if phase == "prefill" and m == 1:
                continue
            forward = lambda ids=ids: model(input_ids=ids, use_cache=False)
            row[f"{phase}_us"] = round(_median_us(forward, repeat, device), 1)
            if profile and device.type == "cuda":
                row[f"{phase}_kernels"] = _kernels(forward)
            ref = reference(input_ids=ids, use_cache=False).logits
            row[f"{phase}_logits_rel_l2"] = _rel_l2(model(input_ids=ids, use_cache=False).logits, ref)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--family", choices=sorted(FAMILIES), required=True)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--tokens", default="1,64,2048", help="comma list of M")
    p.add_argument(
        "--impls", default="eager,grouped_mm,batched_mm,moe:triton", help="comma list (moe:BACKEND[:SCHEME])"
    )
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--device", default="cuda", help="cuda (what is measured) or cpu (a smoke run of the tool)")
    p.add_argument(
        "--profile", action="store_true", help="also GPU kernel time and largest kernels per block and whole-model row"
    )
    p.add_argument(
        "--compile", action="store_true", help="also time each block under torch.compile (block_compiled_us)"
    )
    p.add_argument("--json", help="write the rows here")
    args = p.parse_args(argv)

    import transformers

    from moe_core.integrations.transformers import patch_model

    torch.manual_seed(0)
    started = time.perf_counter()
    config = FAMILIES[args.family](transformers, args.layers)
    device = torch.device(args.device)
    with device:  # random initialisation on the GPU: on the host it takes minutes at gpt-oss-120b's shapes
        base = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).eval()
    print(f"model built on {device} in {time.perf_counter() - started:.1f}s", flush=True)
    tokens = [int(t) for t in args.tokens.split(",")]
    # the yardstick of every implementation, bf16 ones included: the same model in float32
    reference = copy.deepcopy(base).float()
    reference.set_experts_implementation("grouped_mm" if device.type == "cuda" else "eager")
    rows = []
    for impl in args.impls.split(","):
        if impl.startswith("moe:"):
            _, backend, *scheme = impl.split(":")
            model = copy.deepcopy(base)
            report = patch_model(model, backend=backend, quant_scheme=scheme[0] if scheme else None)
            print(report, flush=True)
        else:
            model = base
            model.set_experts_implementation(impl)
        block = _block(model)
        for m in tokens:
            row = {"family": args.family, "impl": impl, "M": m}
            try:
                _measure(row, model, reference, block, impl, m, config, device, args.repeat, args.profile,
                         args.compile)  # fmt: skip
            except torch.OutOfMemoryError as exc:
                row["error"] = f"out of memory: {str(exc).splitlines()[0]}"
                torch.cuda.empty_cache()
            print(json.dumps(row), flush=True)
            rows.append(row)
        if model is not base:  # the patched copy goes, and `block`, which still holds its first layer
            del model, block
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
    out = {
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "command": " ".join(sys.argv),
        "rows": rows,
    }
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
