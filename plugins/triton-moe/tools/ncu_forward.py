"""Run the `triton` forward of one preset eagerly a few times: the program `ncu` profiles (``gpu_check.sh ncu``).

Nsight Compute reads the hardware counters of the two GEMM launches (which stage bounds them: DRAM, issue
slots, a stall reason); the warm-up forwards compile the kernels first so the profiled launches are the
tuned ones.

    ncu --clock-control none -k regex:_gemm --launch-skip 2 --launch-count 2 \\
        python plugins/triton-moe/tools/ncu_forward.py --preset gpt-oss-120b --scheme mxfp4 --tokens 1
"""

from __future__ import annotations

import argparse

import torch


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", required=True)
    parser.add_argument("--scheme", default="bf16")
    parser.add_argument("--tokens", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=3, help="forwards after the first (default 3)")
    args = parser.parse_args(argv)
    from profile_launches import make_forward  # this folder is on sys.path when run as a script

    forward = make_forward(args.preset, args.scheme, args.tokens)
    for _ in range(1 + args.repeat):
        forward()
    torch.cuda.synchronize()
    print(f"{args.preset} {args.scheme} M={args.tokens}: {1 + args.repeat} forwards")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
