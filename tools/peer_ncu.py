"""Nsight Compute counters of our forward and of the peer's GEMM launches, row by row, in one process.

Issue 20 asks for every row where ours / peer misses 0.95 to be stated with its cause measured by Nsight
Compute. A row here is ``PRESET:SCHEME:M`` of the peer harness (``.peer/side_by_side.py``, made by
``tools/peer_setup.sh``): the same weights (seed 0), inputs (seed 1) and peer objects the side-by-side run
times. For each row both sides run twice (compiles, tuned configs), then, between ``cudaProfilerStart`` and
``cudaProfilerStop``, a marker launch, our whole forward , a second marker and the peer's GEMM launches alone
(its side-by-side ratio's denominator); ncu's kernel filter decides which of them are profiled (the
``peer-ncu`` step: the GEMMs of both sides and the markers). The markers' grids say
which row and side the kernels after them belong to, so one process and one report cover every row.

On the GPU (``bash tools/gpu.sh peer-ncu ROWS`` wraps both steps)::

    ncu --profile-from-start off --clock-control none --section SpeedOfLight ... -o rows \\
        python3 tools/peer_ncu.py --rows deepseek-v3-tp8:fp8_block:8,qwen3-30b-a3b:bf16:1
    ncu --import rows.ncu-rep --csv --page raw > rows.csv
    python3 tools/peer_ncu.py --table rows.csv --json rows.json    # markdown table per row and side

Counters are of one launch each under the profiler (caches flushed before every replay, clocks not
locked), so durations are cold-cache single launches, not the CUDA-graph replay medians of the ratio.
"""

from __future__ import annotations

import argparse
import csv
import functools
import json
import os
import sys
import time

#: the columns of the table: (header, metric of ncu's raw page, how to show it)
COLUMNS = [
    ("µs", "gpu__time_duration.sum", "time"),
    ("DRAM %", "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed", "pct"),
    ("DRAM TB/s", "dram__bytes.sum.per_second", "rate"),
    ("SM %", "sm__throughput.avg.pct_of_peak_sustained_elapsed", "pct"),
    ("tensor %", "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active", "pct"),
    ("regs", "launch__registers_per_thread", "int"),
    ("grid", "launch__grid_size", "int"),
    ("threads", "launch__block_size", "int"),
    ("occupancy %", "sm__warps_active.avg.pct_of_peak_sustained_active", "pct"),
    ("issue %", "smsp__issue_active.avg.pct_of_peak_sustained_active", "pct"),
]
#: warp stall reasons (cycles per issued instruction); the table names the largest
STALL = ("smsp__average_warps_issue_stalled_", "_per_issue_active.ratio")
MARK = "_ncu_mark"
OURS, PEER = 1, 2
TIME_UNITS = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3, "s": 1e6}
RATE_UNITS = {"byte/s": 1e-12, "Kbyte/s": 1e-9, "Mbyte/s": 1e-6, "Gbyte/s": 1e-3, "Tbyte/s": 1.0}


def parse_rows(text: str) -> list[tuple[str, str, int]]:
    rows = []
    for item in text.split(","):
        parts = item.strip().split(":")
        if len(parts) != 3 or not parts[2].isdigit():
            raise SystemExit(f"--rows: {item!r} is not PRESET:SCHEME:M")
        rows.append((parts[0], parts[1], int(parts[2])))
    return rows


# ------------------------------------------------------------------------------------------ profiling side
@functools.cache
def _mark_kernel():
    """The marker kernel, built on first use (``--table`` needs no Triton)."""
    import triton
    import triton.language as tl

    @triton.jit
    def _ncu_mark(ptr):
        tl.store(ptr + tl.program_id(0), 1)

    return _ncu_mark


def _mark(code: int, dev) -> None:
    """One launch of the marker kernel with ``code`` programs: the report's grid size names what follows."""
    import torch

    _mark_kernel()[(code,)](torch.empty(code, dtype=torch.int32, device=dev))


def profile(rows, harness: str, smoke: bool = False, budget_s: float = 0.0) -> int:
    """``smoke``: on the CPU under ``TRITON_INTERPRET=1`` in float32 (the harness's smoke presets), no profiler.
    ``budget_s``: start no row after that many seconds, so that ncu still writes its report inside a limit."""
    start = time.time()
    sys.path.insert(0, harness)
    import side_by_side as sbs  # the peer harness: vLLM's kernels and the objects its run times
    import torch

    dev = torch.device("cpu" if smoke else "cuda")
    dtype = torch.float32 if smoke else torch.bfloat16
    dense = {}
    for index, (preset, scheme, m) in enumerate(rows):
        if budget_s and time.time() - start > budget_s:
            print(f"budget of {budget_s:.0f} s reached: rows {index + 1}-{len(rows)} not profiled", flush=True)
            break
        cfg_bf = sbs.PRESETS[preset].config("fp32" if smoke else "bf16", dtype)
        cfg = sbs.PRESETS[preset].config(scheme if scheme in ("fp8_block", "mxfp4") else cfg_bf.quant_scheme, dtype)
        if preset not in dense:
            dense.clear()
            torch.cuda.empty_cache()
            dense[preset] = sbs.random_canonical_weights(cfg_bf, dev, seed=0)
        weights = dense[preset] if not cfg.scheme.quantized else sbs.quantize_weights(dense[preset], scheme)
        ours = sbs.MoeRunner(cfg, weights, backend="triton")
        x, ids, tw = sbs.random_inputs(cfg, m, dev, seed=1)
        out = torch.empty((m, cfg.hidden_size), dtype=dtype, device=dev)
        if scheme == "mxfp4":
            peer = sbs.VllmOaiMxfp4(weights, cfg.top_k, m, dtype, cfg.swiglu_alpha, cfg.swiglu_limit)
        else:
            peer = sbs.VllmFusedMoE(weights.w13, weights.w2, weights.b13, weights.b2, cfg.top_k, cfg.activation, m,
                                    dtype, weights.w13_scale, weights.w2_scale)  # fmt: skip
        peer.forward(x, ids, tw, record=True)
        for _ in range(2):
            ours(x, ids, tw, out=out)
            peer.gemms()
        _mark(1, dev)
        if not smoke:
            torch.cuda.synchronize()
            torch.cuda.profiler.start()
        _mark(10 * (index + 1) + OURS, dev)
        ours(x, ids, tw, out=out)
        _mark(10 * (index + 1) + PEER, dev)
        peer.gemms()
        if not smoke:
            torch.cuda.synchronize()
            torch.cuda.profiler.stop()
        print(f"row {index + 1}: {preset} {scheme} M={m} profiled", flush=True)
        del ours, peer, weights, out
    return 0


# ---------------------------------------------------------------------------------------------- the table
def _number(text: str) -> float | None:
    text = text.replace(",", "").strip()
    try:
        return float(text)
    except ValueError:
        return None


def read_report(path: str, rows) -> list[dict]:
    """Kernels of an ncu ``--csv --page raw`` export, each with its row and side from the markers before it."""
    with open(path, newline="") as f:
        lines = [line for line in f if line.startswith('"')]  # ncu's own messages are not quoted
    table = list(csv.reader(lines))
    if len(table) < 2:
        raise SystemExit(f"{path}: no kernels in this export")
    header, units, body = table[0], table[1], table[2:]
    col = {name: i for i, name in enumerate(header)}
    name_col = col.get("Kernel Name", col.get("Function Name"))
    if name_col is None or "launch__grid_size" not in col:
        raise SystemExit(f"{path}: not an ncu raw-page export with launch statistics (columns: {header[:12]}...)")
    kernels, where = [], None
    for rec in body:
        name = rec[name_col]
        grid = int(_number(rec[col["launch__grid_size"]]) or 0)
        if MARK in name:
            if grid >= 10:
                index, side = divmod(grid, 10)
                where = (rows[index - 1] if rows and index <= len(rows) else ("row", str(index), 0), side)
            continue
        if where is None:
            continue
        entry = {"row": ":".join(map(str, where[0])), "side": "ours" if where[1] == OURS else "peer", "kernel": name}
        for head, metric, kind in COLUMNS:
            if metric not in col:
                continue
            value = _number(rec[col[metric]])
            unit = units[col[metric]]
            if value is not None and kind in ("time", "rate"):
                scale = (TIME_UNITS if kind == "time" else RATE_UNITS).get(unit)
                if scale is None:
                    raise SystemExit(f"{path}: unit {unit!r} of {metric} is not one this table knows")
                value *= scale
            entry[head] = value
        stalls = {name[len(STALL[0]) : -len(STALL[1])]: _number(rec[i]) or 0.0 for name, i in col.items()
                  if name.startswith(STALL[0]) and name.endswith(STALL[1]) and "selected" not in name}  # fmt: skip
        if stalls:
            top = max(stalls, key=stalls.get)
            entry["top stall"] = f"{top} {stalls[top]:.1f}"
        kernels.append(entry)
    return kernels


def _cell(value, kind: str) -> str:
    if value is None:
        return "–"
    if isinstance(value, str):
        return value
    if kind == "int":
        return str(int(value))
    return f"{value:.2f}" if kind == "rate" else f"{value:.1f}"


def markdown(kernels: list[dict]) -> str:
    present = [c for c in [*COLUMNS, ("top stall", "", "text")] if any(c[0] in k for k in kernels)]
    lines = ["| row | side | kernel | " + " | ".join(c[0] for c in present) + " |",
             "|---|---|---|" + "---|" * len(present)]  # fmt: skip
    totals: dict[tuple[str, str], float] = {}
    for k in kernels:
        lines.append(f"| {k['row']} | {k['side']} | {k['kernel'][:40]} | "
                     + " | ".join(_cell(k.get(c[0]), c[2]) for c in present) + " |")  # fmt: skip
        totals[(k["row"], k["side"])] = totals.get((k["row"], k["side"]), 0.0) + (k.get("µs") or 0.0)
    lines += ["", "| row | ours µs (profiled kernels) | peer µs (GEMMs) | ratio under the profiler |",
              "|---|---|---|---|"]  # fmt: skip
    for row in dict.fromkeys(k["row"] for k in kernels):
        o, p = totals.get((row, "ours"), 0.0), totals.get((row, "peer"), 0.0)
        lines.append(f"| {row} | {o:.1f} | {p:.1f} | {o / p:.2f} |" if p else f"| {row} | {o:.1f} | – | – |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", help="PRESET:SCHEME:M,... (profile these; run under ncu)")
    parser.add_argument("--harness", default=os.path.join(os.path.dirname(__file__), "..", ".peer"),
                        help="the peer harness folder (default .peer)")  # fmt: skip
    parser.add_argument("--table", metavar="CSV", help="print the markdown table of an ncu raw-page CSV export")
    parser.add_argument("--json", metavar="PATH", help="with --table: also write the kernels as JSON")
    parser.add_argument("--budget-s", type=float, default=0.0, help="start no row after this many seconds")
    parser.add_argument("--smoke", action="store_true", help="CPU, TRITON_INTERPRET=1, float32 (toy presets)")
    args = parser.parse_args(argv)
    rows = parse_rows(args.rows) if args.rows else []
    if args.table:
        kernels = read_report(args.table, rows)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"rows": [":".join(map(str, r)) for r in rows], "kernels": kernels}, f, indent=1)
        print(markdown(kernels), end="")
        return 0
    if not rows:
        parser.error("give --rows to profile, or --table CSV")
    return profile(rows, os.path.abspath(args.harness), args.smoke, args.budget_s)


if __name__ == "__main__":
    raise SystemExit(main())
