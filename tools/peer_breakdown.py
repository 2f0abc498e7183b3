"""Where each row of a peer run goes: our GEMMs, our other launches, the peer's GEMMs, and the byte bound.

Reads the ``side_by_side.json`` of a peer run made with ``--profile-ms`` covering the rows (``bash
tools/gpu.sh peer --profile-ms 1,8,64,512,4096``: per-kernel times of one CUDA-graph-free forward under the
torch profiler) and prints one markdown row per (preset, scheme, M):

- ours / peer: the run's ratio (CUDA-graph replay medians; the issue's number);
- ours GEMMs, ours other launches (alignment, slot sum, activation quantization, fills) and the peer's
  GEMM launches, in µs of kernel time;
- GEMMs / GEMMs: the ratio the row would have if our forward were its two GEMMs alone;
- bound: the ratio a forward reading the row's bytes at ``--bandwidth`` (default 4.42 TB/s: 92% of the
  H200's 4.8 TB/s, the best a GEMM of ours or the peer's reached under Nsight Compute) would have against
  the peer's time: a row whose bound is above the target cannot meet it by reading faster.

    python3 tools/peer_breakdown.py results/peer/2026-12-04/ncu-final/call3-final/side_by_side.json
"""

from __future__ import annotations

import argparse
import json


def peer_key(row: dict) -> str:
    return "vllm_oai_gemms" if row["scheme"] == "mxfp4" else "vllm_gemms"


def short_name(kernel: str) -> str:
    """``void at::native::vectorized_elementwise_kernel<4, ...>(...)`` -> ``vectorized_elementwise_kernel``."""
    return kernel.split("<")[0].split("(")[0].split("::")[-1]


def breakdown(rows: list[dict], bandwidth: float) -> str:
    lines = ["| row | ours / peer | ours GEMMs µs | ours other launches µs | peer GEMMs µs | GEMMs / GEMMs | "
             "bound | our other launches |", "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        key = peer_key(r)
        if "proj_triton_us" not in r or f"{key}_us" not in r:
            continue
        kernels = r.get("proj_triton_kernels_us") or {}
        peer_kernels = r.get(f"{key}_kernels_us") or {}
        if not kernels or not peer_kernels:
            raise SystemExit(f"{r['preset']} {r['scheme']} M={r['M']}: no kernel profile (run with --profile-ms)")
        gemms = sum(v for k, v in kernels.items() if k.startswith("_gemm"))
        other = {short_name(k): v for k, v in kernels.items() if not k.startswith("_gemm")}
        peer = sum(peer_kernels.values())
        bound = r["bytes"] / bandwidth * 1e6 / r[f"{key}_us"]
        names = ", ".join(f"{k} {v:.1f}" for k, v in sorted(other.items(), key=lambda kv: -kv[1])) or "none"
        lines.append(f"| {r['preset']} {r['scheme']} M={r['M']} | {r['proj_triton_us'] / r[f'{key}_us']:.3f} | "
                     f"{gemms:.1f} | {sum(other.values()):.1f} | {peer:.1f} | {gemms / peer:.2f} | {bound:.2f} | "
                     f"{names} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("json", help="side_by_side.json of a peer run with --profile-ms")
    parser.add_argument("--bandwidth", type=float, default=4.42e12, help="bytes per second of the bound")
    args = parser.parse_args(argv)
    with open(args.json) as f:
        rows = json.load(f)["rows"]
    print(breakdown(rows, args.bandwidth), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
