"""A/B the forward's switches on a GPU: each setting in its own process (the flags are read at import).

Settings (``SETTINGS``): ``base`` (the defaults), ``pdl`` (``MOE_TRITON_PDL=1``), ``in-loop``
(``MOE_TRITON_FP8_PREQUANT=0``, fp8_block only), ``pdl+in-loop``, ``bitops`` (``MOE_TRITON_MXFP4_ASM=0``:
the Triton bit-op E2M1 decode instead of inline PTX, mxfp4 only) and ``unsplit`` (``MOE_TRITON_SPLIT_K=1``:
GEMM1 never splits K, whatever the table says). For each, ``moe bench`` (CUDA-graph replay, median) at
decode sizes on bf16 (the four presets), fp8_block (deepseek-v3-tp8) and mxfp4 (gpt-oss-120b); one JSON
with every row and a table of each setting's time against ``base``.

    python plugins/triton-moe/tools/ab_flags.py --tokens 1,8,64 --output ab-flags.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

#: label -> (environment, the schemes it changes; None: all)
SETTINGS = {
    "base": ({}, None),
    "pdl": ({"MOE_TRITON_PDL": "1"}, None),
    "in-loop": ({"MOE_TRITON_FP8_PREQUANT": "0"}, {"fp8_block"}),
    "pdl+in-loop": ({"MOE_TRITON_PDL": "1", "MOE_TRITON_FP8_PREQUANT": "0"}, {"fp8_block"}),
    "bitops": ({"MOE_TRITON_MXFP4_ASM": "0"}, {"mxfp4"}),
    "unsplit": ({"MOE_TRITON_SPLIT_K": "1"}, None),
}
RUNS = [  # (scheme, presets)
    ("bf16", ["mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v3-tp8", "gpt-oss-120b"]),
    ("fp8_block", ["deepseek-v3-tp8"]),
    ("mxfp4", ["gpt-oss-120b"]),
]


def bench(scheme: str, presets: list[str], tokens: str, env: dict, path: Path) -> list[dict]:
    cmd = [sys.executable, "-m", "moe_core.cli", "bench", "--backend", "triton", "--scheme", scheme,
           "--tokens", tokens, "--output", str(path)]  # fmt: skip
    for preset in presets:
        cmd += ["--preset", preset]
    proc = subprocess.run(cmd, env={**os.environ, **env}, capture_output=True, text=True)
    if proc.returncode != 0:
        print(f"  FAILED ({' '.join(f'{k}={v}' for k, v in env.items()) or 'defaults'}) {scheme}: "
              f"{proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else proc.returncode}")  # fmt: skip
        return []
    return json.loads(path.read_text())["rows"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", default="1,8,64")
    parser.add_argument("--output", help="write every row (with its setting) as JSON here")
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for label, (env, schemes) in SETTINGS.items():
            for scheme, presets in RUNS:
                if schemes is not None and scheme not in schemes:
                    continue
                print(f"{label}: {scheme}", flush=True)
                for row in bench(scheme, presets, args.tokens, env, Path(tmp) / "rows.json"):
                    rows.append({**row, "setting": label})
    base = {(r["preset"], r["scheme"], r["tokens"]): r["time_us"] for r in rows if r["setting"] == "base"}
    print(f"\n{'preset':<18}{'scheme':<11}{'M':>5}  " + "".join(f"{s:>16}" for s in SETTINGS))
    for key in sorted(base):
        cells = []
        for label in SETTINGS:
            t = next((r["time_us"] for r in rows if r["setting"] == label and
                      (r["preset"], r["scheme"], r["tokens"]) == key), None)  # fmt: skip
            cells.append(f"{t:8.1f} ({base[key] / t:4.2f}x)" if t else f"{'-':>16}")
        print(f"{key[0]:<18}{key[1]:<11}{key[2]:>5}  " + "".join(f"{c:>16}" for c in cells))
    if args.output:
        Path(args.output).write_text(json.dumps({"rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
