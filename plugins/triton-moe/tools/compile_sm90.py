"""Compile the moe_triton kernels for sm90 on a CPU (frontend + ptxas), to catch errors without a GPU.

Run without TRITON_INTERPRET (the interpreter replaces @triton.jit functions).
"""

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from moe_triton.kernels import align, gemm

target = GPUTarget("cuda", 90, 32)


def sig_of(fn, types, constexprs):
    sig = {}
    for name in fn.arg_names:
        if name in constexprs:
            sig[name] = "constexpr"
        else:
            sig[name] = types(name)
    return sig


def gemm_types(dt, wdt, sdt):
    def t(name):
        if name == "x_ptr" or name == "a_ptr":
            return f"*{dt}"
        if name == "w_ptr":
            return f"*{wdt}"
        if name == "s_ptr":
            return f"*{sdt}"
        if name == "bias_ptr":
            return f"*{dt}"
        if name == "topk_w_ptr":
            return "*fp32"
        if name in ("sorted_ptr", "block_expert_ptr", "offsets_ptr"):
            return "*i32"
        if name == "out_ptr":
            return f"*{dt}"
        if name in ("alpha", "limit"):
            return "fp32"
        return "i32"

    return t


ok = 0
for scheme, wdt, sdt in ((0, "bf16", "bf16"), (1, "fp8e4nv", "fp32"), (2, "u8", "u8")):
    for act in (0, 1, 2):
        for bias in (False, True):
            c1 = dict(
                TOP_K=2,
                SCHEME=scheme,
                ACTIVATION=act,
                HAS_BIAS=bias,
                ROUTER_ON_INPUT=False,
                PRECISION="tf32",
                BLOCK_M=16,
                BLOCK_N=64,
                BLOCK_K=128,
                GROUP_M=8,
            )
            src = ASTSource(gemm._gemm1, sig_of(gemm._gemm1, gemm_types("bf16", wdt, sdt), c1), c1)
            triton.compile(src, target=target, options={"num_warps": 4, "num_stages": 3})
            ok += 1
    c2 = dict(
        TOP_K=2,
        SCHEME=scheme,
        HAS_BIAS=True,
        ROUTER_ON_INPUT=False,
        OUT_BY_TOKEN=False,
        PRECISION="tf32",
        BLOCK_M=16,
        BLOCK_N=64,
        BLOCK_K=128,
        GROUP_M=8,
    )
    src = ASTSource(gemm._gemm2, sig_of(gemm._gemm2, gemm_types("bf16", wdt, sdt), c2), c2)
    triton.compile(src, target=target, options={"num_warps": 4, "num_stages": 3})
    ok += 1
cp = dict(E=256, E_POW2=512, BLOCK_M=16, CHUNK=64)
src = ASTSource(align._plan, sig_of(align._plan, lambda n: "*i32" if n.endswith("_ptr") else "i32", cp), cp)
triton.compile(src, target=target, options={"num_warps": 4})
ok += 1
src = ASTSource(
    align._plan_and_scatter, sig_of(align._plan_and_scatter, lambda n: "*i32" if n.endswith("_ptr") else "i32", cp), cp
)
triton.compile(src, target=target, options={"num_warps": 4})
ok += 1
for dt in ("fp16", "fp32"):
    c1 = dict(
        TOP_K=4,
        SCHEME=2,
        ACTIVATION=2,
        HAS_BIAS=True,
        ROUTER_ON_INPUT=False,
        PRECISION="ieee",
        BLOCK_M=16,
        BLOCK_N=64,
        BLOCK_K=128,
        GROUP_M=8,
    )
    src = ASTSource(gemm._gemm1, sig_of(gemm._gemm1, gemm_types(dt, "u8", "u8"), c1), c1)
    triton.compile(src, target=target, options={"num_warps": 4, "num_stages": 3})
    ok += 1
cs = dict(CHUNK=256)
src = ASTSource(align._scatter, sig_of(align._scatter, lambda n: "*i32" if n.endswith("_ptr") else "i32", cs), cs)
triton.compile(src, target=target, options={"num_warps": 4})
ok += 1
cr = dict(TOP_K=8, BLOCK_N=1024)
src = ASTSource(gemm._sum_slots, sig_of(gemm._sum_slots, lambda n: "*bf16" if n.endswith("_ptr") else "i32", cr), cr)
triton.compile(src, target=target, options={"num_warps": 4})
ok += 1
print("compiled", ok, "kernels for sm90")
