"""Summarise the ``gpu_check.sh ab`` runs: decode time per (preset, scheme, M), split-K auto vs off, speed-up over bf16.

Usage: python ab_summary.py OUT_DIR (reads ``ab-<label>-<preset>-split<0|1>.json``; label is the scheme, or
``mxfp4asm`` for the inline-PTX decode; split0 = as configured, split1 = split-K forced off).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path


def load(out: Path) -> dict[tuple[str, str, int, str], dict]:
    rows = {}
    for path in sorted(out.glob("ab-*-split*.json")):
        match = re.match(r"ab-(.+?)-(.+)-split(\d)\.json", path.name)
        scheme, preset, split = match.group(1), match.group(2), "auto" if match.group(3) == "0" else "off"
        for row in json.loads(path.read_text())["rows"]:
            if row.get("backend") == "triton" and row.get("time_us"):
                rows[(preset, scheme, row["tokens"], split)] = row
    return rows


def main(out: Path) -> None:
    rows = load(out)
    keys = sorted({k[:3] for k in rows})
    print(f"{'preset':<18}{'scheme':<11}{'M':>3}{'auto µs':>10}{'off µs':>10}{'split gain':>11}"
          f"{'vs bf16 (auto)':>15}{'roofline':>10}")  # fmt: skip
    for preset, scheme, m in keys:
        auto, off = rows.get((preset, scheme, m, "auto")), rows.get((preset, scheme, m, "off"))
        bf16 = rows.get((preset, "bf16", m, "auto"))
        t_auto = auto["time_us"] if auto else float("nan")
        t_off = off["time_us"] if off else float("nan")
        vs = bf16["time_us"] / t_auto if bf16 and auto else float("nan")
        roof = auto["roofline_fraction"] if auto else float("nan")
        print(f"{preset:<18}{scheme:<11}{m:>3}{t_auto:>10.1f}{t_off:>10.1f}{t_off / t_auto:>10.2f}x"
              f"{vs:>14.2f}x{roof:>9.0%}")  # fmt: skip


if __name__ == "__main__":
    main(Path(sys.argv[1]))
