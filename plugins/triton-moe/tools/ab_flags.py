"""A/B the forward's runtime switches on a GPU, every setting in this one process.

Settings (``SETTINGS``, each a ``moe_triton.switches.override`` on top of the switches' defaults, whatever
the environment says): ``base`` (the defaults: programmatic dependent launch where the tile config sets it),
``pdl`` / ``no-pdl`` (programmatic dependent launch forced on / off everywhere), ``in-loop``
(``fp8_prequant`` off: fp8_block quantizes inside GEMM1's K loop), ``pdl+in-loop``, ``bitops``
(``mxfp4_asm`` off: the Triton bit-op E2M1 decode instead of inline PTX), ``whole-chunk`` / ``halves``
(``mxfp4_whole_chunk`` on / off everywhere: one 64-deep MMA per MXFP4 chunk, or one per 32-value half,
whatever the tile config says), ``in-step-scales`` (fp8_block decode tiles
load their scales in each K step, not one step ahead) and ``unsplit`` (``split_k=1``:
GEMM1 never splits K, whatever the table says), ``aligned`` (``direct`` off: the alignment and slot-sum
launches at decode too) and ``direct-all`` (direct routing at every M, past ``kernel_configs.direct_decode``'s
rule: the measurement that rule stands on). Each (preset, scheme, M) row is timed under every
setting that applies to its scheme, one after another on the same weights and inputs, as ``moe bench``
times a row (CUDA-graph replay, median; a fresh graph per setting): bf16 on the four model presets,
fp8_block on deepseek-v3-tp8 and mxfp4 on gpt-oss-120b, at decode sizes. Prints each setting's time
against ``base`` and, with ``--output``, writes every row (with its setting) as JSON. Each setting's output on
the row's inputs is compared with ``base``'s (``equal_to_base``, ``rel_l2_to_base``; differences printed).

    python plugins/triton-moe/tools/ab_flags.py --tokens 1,8,64 --output ab-flags.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from dataclasses import asdict
from pathlib import Path

#: label -> (switch values changed from the defaults, the schemes it changes; None: all)
SETTINGS = {
    "base": ({}, None),
    "pdl": ({"pdl": True}, None),
    "no-pdl": ({"pdl": False}, None),
    "in-loop": ({"fp8_prequant": False}, {"fp8_block"}),
    "pdl+in-loop": ({"pdl": True, "fp8_prequant": False}, {"fp8_block"}),
    "bitops": ({"mxfp4_asm": False}, {"mxfp4"}),
    "whole-chunk": ({"mxfp4_whole_chunk": True}, {"mxfp4"}),
    "halves": ({"mxfp4_whole_chunk": False}, {"mxfp4"}),
    "in-step-scales": ({"fp8_scale_prefetch": False}, {"fp8_block"}),
    "unsplit": ({"split_k": 1}, None),
    "aligned": ({"direct": False}, None),
    "direct-all": ({"direct": True}, None),  # and the rule forced open: see forced_direct
}


@contextlib.contextmanager
def forced_direct(on: bool):
    """Direct routing for every M while ``on`` (``launch.direct_decode`` patched in this process)."""
    from moe_triton import launch

    rule = launch.direct_decode
    if on:
        launch.direct_decode = lambda m, top_k, num_experts: True
    try:
        yield
    finally:
        launch.direct_decode = rule


RUNS = [  # (scheme, presets)
    ("bf16", ["mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v3-tp8", "gpt-oss-120b"]),
    ("fp8_block", ["deepseek-v3-tp8"]),
    ("mxfp4", ["gpt-oss-120b"]),
]


def settings_for(scheme: str, chosen=None) -> list[tuple[str, dict]]:
    """(label, full switch values) of every setting that changes something for ``scheme`` (of ``chosen``
    only, if given; ``base`` always)."""
    from moe_triton.switches import Switches

    defaults = asdict(Switches())
    wanted = set(SETTINGS) if chosen is None else {*chosen, "base"}
    return [(label, {**defaults, **changes}) for label, (changes, schemes) in SETTINGS.items()
            if (schemes is None or scheme in schemes) and label in wanted]  # fmt: skip


def bench_preset(scheme: str, preset: str, tokens: list[int], ceilings, device, repeat: int, dtype=None,
                 chosen=None) -> list[dict]:  # fmt: skip
    """Rows of one preset (activations ``dtype``, default bf16): each token count timed under each setting,
    the settings interleaved per M."""
    import torch

    from moe_core import MoeRunner
    from moe_core.bench_rows import bench_row
    from moe_core.presets import PRESETS
    from moe_core.synthetic import random_inputs, random_weights
    from moe_core.tolerances import relative_l2
    from moe_triton import switches

    config = PRESETS[preset].config(scheme, dtype or torch.bfloat16)
    weights = random_weights(config, device)
    runner = MoeRunner(config, weights, backend="triton")
    rows = []
    for m in tokens:
        inputs = random_inputs(config, m, device, seed=1)
        base_out = None
        for label, values in settings_for(scheme, chosen):
            try:
                with switches.override(**values), forced_direct(label == "direct-all"):
                    out = runner(*inputs).clone()  # a backend may hand back a buffer the next call reuses
                    row = bench_row(preset, "triton", config, weights, runner, m, ceilings, device, repeat=repeat)
            except Exception as exc:  # one setting failing must not lose the others' rows
                print(f"  FAILED {label} {preset} {scheme} M={m}: {type(exc).__name__}: {exc}", flush=True)
                continue
            base_out = out if label == "base" else base_out
            rows.append({**row.as_dict(), "setting": label, **_against(out, base_out, relative_l2)})
    del runner, weights
    torch.cuda.empty_cache()
    return rows


def _against(out, base_out, relative_l2) -> dict:
    """How a setting's output on the row's inputs compares with ``base``'s: a switch that only reorders work
    should leave it bitwise equal, one that changes the arithmetic within the scheme's tolerance."""
    if base_out is None:
        return {}
    return {"equal_to_base": bool(out.equal(base_out)), "rel_l2_to_base": float(relative_l2(out, base_out))}


def print_table(rows: list[dict]) -> None:
    base = {(r["preset"], r["scheme"], r["tokens"]): r["time_us"] for r in rows if r["setting"] == "base"}
    print(f"\n{'preset':<18}{'scheme':<11}{'M':>5}  " + "".join(f"{s:>16}" for s in SETTINGS))
    for key in sorted(base):
        cells = []
        for label in SETTINGS:
            t = next((r["time_us"] for r in rows if r["setting"] == label and
                      (r["preset"], r["scheme"], r["tokens"]) == key), None)  # fmt: skip
            cells.append(f"{t:8.1f} ({base[key] / t:4.2f}x)" if t else f"{'-':>16}")
        print(f"{key[0]:<18}{key[1]:<11}{key[2]:>5}  " + "".join(f"{c:>16}" for c in cells))
    for r in rows:
        if r.get("equal_to_base") is False:
            print(
                f"output of {r['setting']} differs from base at {r['preset']} {r['scheme']} M={r['tokens']}: "
                f"relative L2 {r['rel_l2_to_base']:.2e}"
            )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", default="1,8,64", help="comma-separated token counts (default 1,8,64)")
    parser.add_argument("--repeat", type=int, default=20, help="timed samples per row; the median is reported")
    parser.add_argument("--output", help="write every row (with its setting) as JSON here")
    parser.add_argument("--settings", help=f"comma-separated settings to time besides base (default all: "
                                           f"{', '.join(SETTINGS)})")  # fmt: skip
    parser.add_argument("--schemes", help=f"comma-separated schemes to time (default all: "
                                          f"{', '.join(s for s, _ in RUNS)})")  # fmt: skip
    args = parser.parse_args(argv)
    known = [scheme for scheme, _ in RUNS]
    schemes = set(args.schemes.split(",")) if args.schemes else set(known)
    if schemes - set(known):
        parser.error(f"unknown scheme(s) {sorted(schemes - set(known))}; known: {', '.join(known)}")
    chosen = set(args.settings.split(",")) if args.settings else None
    if chosen and chosen - set(SETTINGS):
        parser.error(f"unknown setting(s) {sorted(chosen - set(SETTINGS))}; known: {', '.join(SETTINGS)}")
    import torch

    if not torch.cuda.is_available():
        print("ab_flags times the forward on a CUDA GPU; none is available", file=sys.stderr)
        return 1
    from moe_core.bench_rows import measure_ceilings

    device = torch.device("cuda")
    tokens = [int(t) for t in args.tokens.split(",")]
    ceilings = measure_ceilings(device)
    rows = []
    for scheme, presets in RUNS:
        if scheme not in schemes:
            continue
        for preset in presets:
            print(f"{preset} {scheme}: {', '.join(label for label, _ in settings_for(scheme, chosen))}", flush=True)
            rows += bench_preset(scheme, preset, tokens, ceilings, device, args.repeat, chosen=chosen)
    print_table(rows)
    if args.output:
        document = {"device": ceilings.name, "torch": torch.__version__, "rows": rows}
        Path(args.output).write_text(json.dumps(document, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
