"""A/B whole kernel configs (``KernelConfig``: block size and both GEMMs' tiles) of one layer, in one process.

The tuner times each GEMM's candidates on their own; a table entry's worth is the whole forward. This times
``launch.run_fused_moe`` (alignment, both GEMMs, slot sum) with each given config on the same weights and
inputs, on uniform random routing (``moe_core.synthetic.random_routing``, what the benches and the tuner use)
and on balanced routing (``balanced_routing``: every expert the mean number of pairs, so no block is padding
for uneven loads: the difference is what those padded blocks cost). Rounds interleave the configs, so a
drift of the GPU's clocks shows as a difference between rounds rather than between configs. Each output is
compared with the first config's on the same routing (``moe_core.tolerances``): a config whose output
differs is reported and the exit status is 1.

Configs (``--config NAME=SOURCE``, repeatable; default: every shipped table's entry and ``selected``):
``selected`` (what a forward on this device picks: user table, shipped table, heuristic), ``shipped:SLUG``
(a shipped table's entry, e.g. ``shipped:NVIDIA_H200``), ``file:PATH`` (a table file as ``moe tune triton``
writes it). A table gives the entry of the layer's shape at the nearest M, as a forward looks it up, or
with ``@M`` the entry tuned at exactly M tokens (``shipped:NVIDIA_H200@512``), whatever M is timed: the
way to check where one entry should take over from the next.
A source may end in field changes, ``+FIELD=VALUE`` each (``block_m``, ``split_k``, ``split_k2``, ``pdl``, or
``gemm1.`` / ``gemm2.`` and a ``GemmConfig`` field; VALUE in JSON: ``true``, ``128``), to time one field of
an entry against the entry as it is: ``wc=shipped:NVIDIA_H200+gemm1.whole_chunk=true``. A config that does
not compile or launch (shared memory, registers) is reported as a row with its error, and the others run.

    python plugins/triton-moe/tools/configs_ab.py --preset gpt-oss-120b --scheme mxfp4 --tokens 2048 \\
        --config shipped=selected --config mine=file:/tmp/table.json \\
        --config wide=selected+gemm1.block_n=128+gemm1.num_warps=8 --profile --json configs_ab.json

``--shape E,k,H,I`` replaces the preset by a small layer (``--device cpu`` with ``TRITON_INTERPRET=1``: a
smoke run of this tool).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROUTINGS = ("random", "balanced")


def layer_config(args):
    """The layer's ``MoeConfig``: the preset's, or a small one from ``--shape``."""
    from moe_core import MoeConfig
    from moe_core.presets import PRESETS

    dtype = getattr(torch, args.dtype)
    if args.shape:
        e, k, h, i = (int(v) for v in args.shape.split(","))
        return MoeConfig(e, k, h, i, quant_scheme=args.scheme, dtype=dtype)
    return PRESETS[args.preset].config(args.scheme, dtype)


def changed(config, changes: list[str]):
    """``config`` with every ``FIELD=VALUE`` of ``changes`` applied at once (``gemm1.``/``gemm2.`` for a GEMM's
    tiles), so their order does not matter; the dataclasses' own checks refuse a bad value or combination."""
    from dataclasses import fields, replace

    from moe_triton import kernel_configs as kc

    layer = [f.name for f in fields(kc.KernelConfig) if f.name not in ("gemm1", "gemm2")]
    tiles = [f.name for f in fields(kc.GemmConfig)]
    top, per_gemm = {}, {"gemm1": {}, "gemm2": {}}
    for change in changes:
        name, eq, text = change.partition("=")
        gemm, _, field = name.rpartition(".")
        if not eq or field not in (tiles if gemm else layer) or gemm not in ("", *per_gemm):
            raise ValueError(f"{change!r}: expected FIELD=VALUE, FIELD one of {', '.join(layer)} or gemm1./gemm2. "
                             f"and one of {', '.join(tiles)}")  # fmt: skip
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            raise ValueError(f"{change!r}: the value must be JSON (true, false, a number)") from None
        (per_gemm[gemm] if gemm else top)[field] = value
    gemms = {g: replace(getattr(config, g), **c) for g, c in per_gemm.items() if c}
    return replace(config, **top, **gemms)


def resolve(source: str, cfg, m: int, device):
    """The ``KernelConfig`` a ``--config`` source names for this layer at ``m`` tokens, with its field changes."""
    source, *changes = source.split("+")
    return changed(_base(source, cfg, m, device), changes)


def _base(source: str, cfg, m: int, device):
    from moe_triton import kernel_configs as kc

    shape = (cfg.quant_scheme, cfg.num_experts, cfg.hidden_size, cfg.intermediate_size, cfg.top_k)
    if source == "selected":
        return kc.select_config(*shape, m, device)
    kind, _, where = source.partition(":")
    where, at, exact = where.partition("@")
    if kind == "shipped":
        entries = kc.shipped_table(where)
    elif kind == "file":
        entries = kc.parse_table(Path(where).read_text())
    else:
        raise ValueError(f"unknown config source {source!r}: selected, shipped:SLUG or file:PATH")
    entry = entries.get(kc.table_key(*shape))
    if not entry:
        raise ValueError(f"{source} has no entry for {kc.table_key(*shape)}")
    if at:
        if not exact.isdigit() or int(exact) not in entry:
            have = ", ".join(map(str, sorted(entry)))
            raise ValueError(f"{source}: {kc.table_key(*shape)} has entries at M = {have}")
        m = int(exact)
    return kc.entry_at(entry, m, cfg.quant_scheme)


def _kernels(fn, device) -> dict:
    """GPU time per call of each of the forward's three largest kernels (CUDA only)."""
    if device.type != "cuda":
        return {}
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
    timed = sorted(((e.self_device_time_total / 3, e.key) for e in prof.key_averages() if e.self_device_time_total > 0),
                   reverse=True)  # fmt: skip
    return {name[:40]: round(us, 1) for us, name in timed[:3]}


def run(cfg, plan: dict, sources: dict, device, rounds: int = 2, repeat: int = 50, profile: bool = False,
        log=print, routings=ROUTINGS) -> list[dict]:  # fmt: skip
    """Rows of every (M, round, routing, config) of ``plan`` (M -> name -> ``KernelConfig``; ``sources``: name ->
    where it came from), timed as CUDA-graph medians (``moe_core.timing``)."""
    from moe_core.synthetic import balanced_routing, random_inputs
    from moe_core.timing import time_forward
    from moe_core.tolerances import relative_l2, tolerance
    from moe_triton import launch
    from moe_triton.launch_args import Activation
    from moe_triton.tune import prepare_weights_for

    weights = prepare_weights_for(cfg, device)
    act = Activation(cfg.activation, cfg.swiglu_alpha, cfg.swiglu_limit)
    limit = tolerance(cfg.quant_scheme, cfg.dtype)
    rows = []
    for m, chosen in plan.items():
        x, ids, tw = random_inputs(cfg, m, device)
        routed = {name: ids if name == "random" else balanced_routing(m, cfg.num_experts, cfg.top_k, device)[0]
                  for name in routings}  # fmt: skip
        for rnd in range(1, rounds + 1):
            for routing, r in routed.items():
                first = None
                for name, kernel_config in chosen.items():
                    out = torch.empty_like(x)

                    def fn(kernel_config=kernel_config, x=x, r=r, tw=tw, out=out):
                        launch.run_fused_moe(x, r, tw, weights.gemm1(), weights.gemm2(), act, out, config=kernel_config,
                                             router_on_input=cfg.apply_router_weight_on_input)  # fmt: skip

                    try:
                        us, how = time_forward(fn, device, repeat=repeat)
                        fn()
                    except Exception as exc:  # a tile this GPU cannot run: say so, time the others
                        log(f"M={m} round {rnd} {routing:<8} {name:<20} failed: {exc!r:.300}")
                        rows.append({"M": m, "round": rnd, "routing": routing, "config": name,
                                     "source": sources[name], "error": repr(exc)[:1000], "same": False,
                                     "entry": kernel_config.as_dict()})  # fmt: skip
                        if device.type == "cuda":
                            torch.cuda.synchronize()
                        continue
                    err = 0.0 if first is None else relative_l2(out, first)
                    first = out if first is None else first
                    counts = torch.bincount(r.flatten().long(), minlength=cfg.num_experts)
                    row = {"M": m, "round": rnd, "routing": routing, "config": name, "source": sources[name],
                           "us": round(us, 1), "how": how, "rel_l2_vs_first": err, "same": err <= limit,
                           "pairs_per_expert": [int(counts.min()), int(counts.max())],
                           "kernels": _kernels(fn, device) if profile and rnd == 1 else {},
                           "entry": kernel_config.as_dict()}  # fmt: skip
                    log(f"M={m} round {rnd} {routing:<8} {name:<20} {us:9.1f} us  rel L2 {err:.1e}"
                        f"{'' if row['same'] else '  DIFFERS'}  {row['kernels'] or ''}")  # fmt: skip
                    rows.append(row)
    return rows


def main(argv=None) -> int:
    from moe_core.presets import PRESETS
    from moe_triton import kernel_configs as kc

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", choices=sorted(PRESETS), default="qwen3-30b-a3b")
    p.add_argument("--shape", help="E,k,H,I: a small layer instead of the preset (a smoke run)")
    p.add_argument("--scheme", default="bf16", help="bf16, fp8_block, mxfp4, ... (default bf16)")
    p.add_argument("--dtype", default="bfloat16", help="activations' torch dtype (default bfloat16)")
    p.add_argument("--tokens", default="2048", help="comma list of M (default 2048)")
    sources = (
        "selected | shipped:SLUG[@M] | file:PATH[@M], each optionally +FIELD=VALUE... (repeatable; default: "
        "selected and every shipped table)"
    )
    p.add_argument("--config", action="append", default=[], metavar="NAME=SOURCE", help=sources)
    p.add_argument("--routings", default=",".join(ROUTINGS), help=f"comma list of {', '.join(ROUTINGS)} (default both)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--repeat", type=int, default=50, help="timed samples per row; the median is reported")
    p.add_argument("--profile", action="store_true", help="also the three largest kernels of each row (round 1)")
    p.add_argument("--device", default="cuda", help="cuda, or cpu with TRITON_INTERPRET=1 (a smoke run)")
    p.add_argument("--json", help="write every row here")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("configs_ab times forwards on a CUDA GPU; none is available (--device cpu: a smoke run)",
              file=sys.stderr)  # fmt: skip
        return 1
    configs = dict(c.split("=", 1) for c in args.config if "=" in c)
    if len(configs) != len(args.config):
        p.error("each --config is NAME=SOURCE")
    if not configs:
        configs = {"selected": "selected", **{slug: f"shipped:{slug}" for slug in kc.shipped_slugs()}}
    routings = args.routings.split(",")
    if not routings or set(routings) - set(ROUTINGS):
        p.error(f"--routings: {args.routings!r}; known: {', '.join(ROUTINGS)}")
    cfg = layer_config(args)
    try:  # every config found before anything is timed
        plan = {m: {name: resolve(source, cfg, m, device) for name, source in configs.items()}
                for m in (int(t) for t in args.tokens.split(","))}  # fmt: skip
    except (ValueError, OSError) as exc:  # a source without an entry for this layer, or no such file: say which
        print(f"configs_ab: {exc}", file=sys.stderr)
        return 2
    rows = run(cfg, plan, configs, device, args.rounds, args.repeat, args.profile, routings=routings)
    if args.json:
        document = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
                    "torch": torch.__version__, "layer": repr(cfg), "configs": configs, "rows": rows}  # fmt: skip
        Path(args.json).write_text(json.dumps(document, indent=1))
    return 0 if all(r["same"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
