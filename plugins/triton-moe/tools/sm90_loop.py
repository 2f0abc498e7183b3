"""One GEMM variant built for sm90 on a CPU with the launch's specialization; what its K loop issues.

``compile_sm90.py`` compiles every variant with generic arguments, which is enough to catch errors but not
to read performance off the code: a real launch specializes pointers and strides divisible by 16 and the
unit strides, and only then are loads vectorized. This builds one variant that way and prints the
registers (ptxas), then the memory and MMA instructions of the innermost K loop of its PTX, counted by
kind (``ld.shared.v2.b8`` against ``ld.shared.v4.b32`` is the difference between two byte orders), so two
layouts or tile shapes can be compared without a GPU. Needs the device's Triton (``PYTHONPATH`` to a
``pip install --no-deps --target DIR triton==3.6.0``) and no ``TRITON_INTERPRET``.

    PYTHONPATH=../t36:plugins/triton-moe/src:core/src python plugins/triton-moe/tools/sm90_loop.py gemm1 \\
        --scheme mxfp4 BLOCK_M=128 BLOCK_N=64 BLOCK_K=64 SWAP_AB=True --warps 4 --stages 4
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

#: scheme -> (code of the kernels' SCHEME constexpr, the forward's usual activation there)
SCHEMES = {"bf16": (0, 0), "fp8_block": (1, 0), "mxfp4": (2, 2)}
#: arguments a launch passes as 1 (Triton specializes them into constants)
UNIT_STRIDES = {"stride_xk", "stride_wk", "stride_on", "stride_sn", "stride_pn", "stride_bn", "stride_ak"}
#: the instructions counted in the loop
COUNTED = re.compile(r"(?:ld|st)\.(?:shared|global)[a-z0-9.]*|ldmatrix[a-z0-9.]*|stmatrix[a-z0-9.]*|cp\.async\.c[ag]"
                     r"[a-z0-9.]*|wgmma\.mma_async|wgmma\.wait_group[a-z.]* \d+|mma\.sync|shfl[a-z0-9.]*"
                     r"|prmt")  # fmt: skip


def constexprs(kernel: str, scheme: str, overrides: list[str]) -> dict:
    """The kernel's constexprs: the forward's usual bf16 setting for ``scheme``, then ``NAME=VALUE`` overrides."""
    import triton.language as tl

    code, activation = SCHEMES[scheme]
    c = dict(TOP_K=4, SCHEME=code, ACTIVATION=activation, HAS_BIAS=True, ROUTER_ON_INPUT=False, PRECISION="tf32",
             SPLIT_K=1, DECODE_ASM=scheme == "mxfp4", BLOCK_M=16, BLOCK_N=64, BLOCK_K=128, GROUP_M=8, SWAP_AB=False,
             A_FP8=False, OUT_FP8=False, ROUND=tl.bfloat16, DIRECT=False, PDL=False, TMA=False, UP_ALIGNED=False,
             OUT_BY_TOKEN=False, SUM_SLOTS=False, TMA_A=False, PREFETCH=False, PERSISTENT=False)  # fmt: skip
    from moe_triton.kernels import gemm

    known = set(c) | {p.name for p in getattr(gemm, f"_{kernel}").params if p.is_constexpr}
    for item in overrides:
        name, _, value = item.partition("=")
        if name not in known or not value:
            raise SystemExit(f"unknown constexpr override {item!r}; known: {', '.join(sorted(known))}")
        c[name] = {"True": True, "False": False}.get(value, int(value) if value.lstrip("-").isdigit() else value)
    return c


def build(kernel: str, scheme: str, overrides: list[str], warps: int, stages: int):
    import triton
    from compile_sm90 import gemm_types, weight_types, with_defaults  # what every compiled variant is given
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from moe_triton.kernels import gemm

    fn = gemm._gemm1 if kernel == "gemm1" else gemm._gemm2
    types = gemm_types("bf16", *weight_types(SCHEMES[scheme][0], "bf16"))
    given = constexprs(kernel, scheme, overrides)
    c = with_defaults(fn, {k: v for k, v in given.items() if k in fn.arg_names})
    sig, attrs = {}, {}
    for i, name in enumerate(fn.arg_names):
        if name in c:
            sig[name] = "constexpr"
        elif name in UNIT_STRIDES:
            sig[name], c[name] = "constexpr", 1
        elif name.endswith("_ptr"):
            codes = (name in ("x_ptr", "a_ptr") and given["A_FP8"]) or (name == "out_ptr" and given["OUT_FP8"])
            sig[name] = "*fp8e4nv" if codes else types(name)
            attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            sig[name] = types(name)
            if name.startswith("stride") or name in ("K", "N", "N_HALF"):
                attrs[(i,)] = [["tt.divisibility", 16]]
    src = ASTSource(fn, sig, c, attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "num_stages": stages})


def registers(ptx: str) -> str:
    """ptxas's register and spill line for ``ptx`` (the ptxas Triton compiles with), or why it could not run."""
    import inspect

    from triton.backends.nvidia import compiler

    get = compiler.get_ptxas
    tool = get(90) if inspect.signature(get).parameters else get()
    ptxas = getattr(tool, "path", None) or shutil.which("ptxas")
    if not ptxas:
        return "ptxas not found"
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "k.ptx"
        src.write_text(ptx)
        run = subprocess.run([str(ptxas), "-arch=sm_90a", "-v", str(src), "-o", str(Path(tmp) / "k.cubin")],
                             capture_output=True, text=True)  # fmt: skip
    found = re.findall(r"Used \d+ registers|\d+ bytes spill stores", run.stderr)
    return ", ".join(found) or run.stderr.strip()[-300:]


def inner_loop(ptx: str) -> str:
    """The PTX of the innermost loop (LLVM marks its header ``Inner Loop Header``) up to the next label."""
    lines = ptx.splitlines()
    start = next((i for i, line in enumerate(lines) if "Inner Loop Header" in line), None)
    if start is None:
        return ""
    end = next((i for i in range(start + 1, len(lines)) if re.match(r"^\$L__BB\d+_\d+:", lines[i])
                and "Loop" not in lines[i]), len(lines))  # fmt: skip
    return "\n".join(lines[start:end])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("kernel", choices=("gemm1", "gemm2"))
    p.add_argument("overrides", nargs="*", help="constexpr NAME=VALUE (BLOCK_M=128 SWAP_AB=True ...)")
    p.add_argument("--scheme", choices=sorted(SCHEMES), default="bf16")
    p.add_argument("--warps", type=int, default=4)
    p.add_argument("--stages", type=int, default=3)
    p.add_argument("--dump", type=Path, help="also write the TTGIR and PTX here")
    args = p.parse_intermixed_args(argv)
    kernel = build(args.kernel, args.scheme, args.overrides, args.warps, args.stages)
    ptx = kernel.asm["ptx"]
    if args.dump:
        args.dump.mkdir(parents=True, exist_ok=True)
        (args.dump / f"{args.kernel}.ttgir").write_text(kernel.asm["ttgir"])
        (args.dump / f"{args.kernel}.ptx").write_text(ptx)
    loop = inner_loop(ptx)
    print(f"{args.kernel} {args.scheme} {' '.join(args.overrides)} warps={args.warps} stages={args.stages}: "
          f"{registers(ptx)}, shared {kernel.metadata.shared} B")  # fmt: skip
    if not loop:
        print("  no inner loop found in the PTX")
        return 1
    for name, n in sorted(Counter(COUNTED.findall(loop)).items()):
        print(f"  {n:4d} {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
