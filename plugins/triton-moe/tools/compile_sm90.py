"""Compile every moe_triton kernel variant for sm90 on a CPU (frontend + ptxas), to catch errors without a GPU.

Run without TRITON_INTERPRET (the interpreter replaces @triton.jit functions).
A GPU machine's Triton may be older and stricter than the one here, so every
constexpr branch the forward can take is compiled: each scheme x activation x bias x
split-K (GEMM1 partials and their in-kernel reduction), the MXFP4 chunk loop at BLOCK_K
64/128/256, and the fp16/fp32 activations of the interpreter tests.
``--dump DIR`` writes each variant's TTGIR/PTX/cubin there (to inspect layouts, or diff SASS with nvdisasm).
Importing it compiles nothing: ``sm90_loop.py`` reuses its argument types.
"""

import os
import sys
from pathlib import Path

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from moe_triton.kernels import align, gemm, route

target = GPUTarget("cuda", 90, 32)
DUMP: Path | None = None  # main(): --dump DIR
WEIGHTS = {0: ("bf16", "bf16"), 1: ("fp8e4nv", "fp32"), 2: ("u8", "i32")}  # scheme -> (weight, scale) dtypes


def with_defaults(fn, constexprs: dict) -> dict:
    """``constexprs`` with every constexpr parameter of ``fn`` it leaves out set to its default, in place:
    ``ASTSource`` compiles a parameter missing from its constants as a runtime argument, whatever its
    annotation."""
    for param in fn.params:
        if param.is_constexpr and param.name not in constexprs and param.has_default:
            constexprs[param.name] = param.default
    return constexprs


def sig_of(fn, types, constexprs):
    with_defaults(fn, constexprs)
    return {name: "constexpr" if name in constexprs else types(name) for name in fn.arg_names}


INDEX_POINTERS = ("sorted_ptr", "block_expert_ptr", "offsets_ptr", "count_ptr", "zero_ptr", "slot_count_ptr", "ids_ptr")


def gemm_types(dt, wdt, sdt, out_dt=None):
    def t(name):
        if name in ("x_ptr", "bias_ptr", "b13_ptr"):
            return f"*{dt}"
        if name == "a_ptr":
            return f"*{out_dt or dt}"
        if name == "w_ptr":
            return f"*{wdt}"
        if name == "s_ptr":
            return f"*{sdt}"
        if name in ("topk_w_ptr", "mult_ptr", "xs_ptr", "os_ptr", "as_ptr"):
            return "*fp32"
        if name == "part_ptr":
            return "*fp32"
        if name in INDEX_POINTERS:
            return "*i32"
        if name == "out_ptr":
            return f"*{out_dt or dt}"
        if name == "sum_ptr":
            return f"*{dt}"
        if name in ("alpha", "limit"):
            return "fp32"
        return "i32"

    return t


#: the variants ``main`` lists, compiled once the list is complete (``compile_all``)
JOBS: list[tuple] = []


def build(fn, types, constexprs, tag, num_warps=4, num_stages=3):
    """Add one variant to ``JOBS`` (its signature is fixed now: ``types`` may be a closure, which a worker
    process inherits through fork but could not be sent)."""
    JOBS.append((fn, sig_of(fn, types, constexprs), constexprs, tag, num_warps, num_stages))


def compile_one(index: int) -> None:
    """Compile ``JOBS[index]``; a failure is raised as a RuntimeError naming the variant (a compiler's own
    exception may not survive the trip back from a worker process)."""
    fn, signature, constexprs, tag, num_warps, num_stages = JOBS[index]
    try:
        k = triton.compile(ASTSource(fn, signature, constexprs), target=target,
                           options={"num_warps": num_warps, "num_stages": num_stages})  # fmt: skip
    except Exception as exc:
        raise RuntimeError(f"{tag} (warps={num_warps}, stages={num_stages}) did not compile: "
                           f"{type(exc).__name__}: {exc}") from None  # fmt: skip
    if DUMP is not None:
        DUMP.mkdir(parents=True, exist_ok=True)
        for ext in ("ttgir", "ptx"):
            (DUMP / f"{tag}.{ext}").write_text(k.asm[ext])
        (DUMP / f"{tag}.cubin").write_bytes(k.asm["cubin"])


def compile_all(jobs: int) -> int:
    """Compile every listed variant, in ``jobs`` forked processes (each compile is single-threaded and
    independent; Triton's cache is safe to share); the number compiled. The first failure stops the run
    with its exception."""
    if jobs <= 1 or len(JOBS) <= 1:
        for i in range(len(JOBS)):
            compile_one(i)
        return len(JOBS)
    import multiprocessing

    with multiprocessing.get_context("fork").Pool(jobs) as pool:
        for _ in pool.imap_unordered(compile_one, range(len(JOBS))):
            pass
    return len(JOBS)


def weight_types(scheme, dt):
    wdt, sdt = WEIGHTS[scheme]
    return (dt, dt) if scheme == 0 else (wdt, sdt)


def gemm1(scheme, act=0, bias=False, split=1, dt="bf16", block_k=128, block_n=64, router=False, asm=False,
          swap=False, block_m=16, a_fp8=False, out_fp8=False, pdl=False, direct=False, tma=False,
          num_warps=4, up_aligned=False, prefetch=False, persistent=False, tail=0, tail_swap=False,
          num_stages=3, whole=False):  # fmt: skip
    wdt, sdt = weight_types(scheme, dt)
    c = dict(TOP_K=2, SCHEME=scheme, ACTIVATION=act, HAS_BIAS=bias, ROUTER_ON_INPUT=router,
             PRECISION="ieee" if dt == "fp32" else "tf32", SPLIT_K=split, DECODE_ASM=asm, BLOCK_M=block_m,
             BLOCK_N=block_n, BLOCK_K=block_k, GROUP_M=8, SWAP_AB=swap, A_FP8=a_fp8, OUT_FP8=out_fp8,
             ROUND=tl.bfloat16, DIRECT=direct, PDL=pdl, TMA=tma, UP_ALIGNED=up_aligned, PREFETCH=prefetch,
             PERSISTENT=persistent, TAIL_M=tail, TAIL_SWAP=tail_swap, WHOLE_CHUNK=whole)  # fmt: skip
    tag = (f"g1_s{scheme}_a{act}_b{int(bias)}_k{split}_{dt}_{block_k}{'_asm' if asm else ''}"
           f"{f'_swap_n{block_n}_m{block_m}' if swap else ''}{'_afp8' if a_fp8 else ''}"
           f"{f'_ofp8_n{block_n}' if out_fp8 else ''}{'_direct' if direct else ''}{'_pdl' if pdl else ''}"
           f"{f'_tma_n{block_n}_m{block_m}_w{num_warps}' if tma else ''}{'_upal' if up_aligned else ''}"
           f"{'_prefetch' if prefetch else ''}{'_persistent' if persistent else ''}"
           f"{f'_tail{tail}{tail_swap:d}_n{block_n}_m{block_m}_s{num_stages}' if tail else ''}"
           f"{f'_whole_n{block_n}_m{block_m}_w{num_warps}' if whole else ''}")  # fmt: skip
    types = gemm_types(dt, wdt, sdt)
    fp8_names = {"x_ptr"} if a_fp8 else set()
    fp8_names |= {"out_ptr"} if out_fp8 else set()
    build(gemm._gemm1, lambda n: "*fp8e4nv" if n in fp8_names else types(n), c, tag, num_warps, num_stages)


def gemm2(scheme, bias=True, dt="bf16", block_k=128, by_token=False, asm=False, swap=False, block_n=64, block_m=16,
          pdl=False, split=1, a_fp8=False, direct=False, sum_slots=False, tma=False, tma_a=False,
          num_warps=4, prefetch=False, persistent=False, tail=0, tail_swap=False, num_stages=3,
          whole=False):  # fmt: skip
    wdt, sdt = weight_types(scheme, dt)
    c = dict(TOP_K=2, SCHEME=scheme, HAS_BIAS=bias, ROUTER_ON_INPUT=False, OUT_BY_TOKEN=by_token,
             PRECISION="ieee" if dt == "fp32" else "tf32", SPLIT_K=split, DECODE_ASM=asm, BLOCK_M=block_m,
             BLOCK_N=block_n, BLOCK_K=block_k, GROUP_M=8, SWAP_AB=swap, A_FP8=a_fp8, DIRECT=direct,
             SUM_SLOTS=sum_slots, PDL=pdl, TMA=tma, TMA_A=tma_a, PREFETCH=prefetch,
             PERSISTENT=persistent, TAIL_M=tail, TAIL_SWAP=tail_swap, WHOLE_CHUNK=whole)  # fmt: skip
    tag = (f"g2_s{scheme}_b{int(bias)}_k{split}_{dt}_{block_k}{'_asm' if asm else ''}"
           f"{f'_swap_n{block_n}_m{block_m}' if swap else ''}{'_afp8' if a_fp8 else ''}"
           f"{'_direct' if direct else ''}{'_slots' if sum_slots else ''}{'_pdl' if pdl else ''}"
           f"{f'_tma{int(tma_a)}_n{block_n}_m{block_m}_w{num_warps}' if tma else ''}"
           f"{'_prefetch' if prefetch else ''}{'_persistent' if persistent else ''}"
           f"{f'_tail{tail}{tail_swap:d}_n{block_n}_m{block_m}_s{num_stages}' if tail else ''}"
           f"{f'_whole_n{block_n}_m{block_m}_w{num_warps}' if whole else ''}")  # fmt: skip
    types = gemm_types(dt, wdt, sdt)
    build(gemm._gemm2, (lambda n: "*fp8e4nv" if n == "a_ptr" else types(n)) if a_fp8 else types, c, tag, num_warps,
          num_stages)  # fmt: skip


def main() -> None:
    """Compile every variant (``--dump DIR``: also write each one's TTGIR / PTX / cubin there; ``--jobs N``:
    in N processes, default the CPUs this process may use)."""
    global DUMP
    DUMP = Path(sys.argv[sys.argv.index("--dump") + 1]) if "--dump" in sys.argv else None
    jobs = int(sys.argv[sys.argv.index("--jobs") + 1]) if "--jobs" in sys.argv else len(os.sched_getaffinity(0))
    JOBS.clear()
    for scheme in (0, 1, 2):
        for act in (0, 1, 2):
            for bias in (False, True):
                for split in (1, 4):
                    gemm1(scheme, act, bias, split)
        for bias in (False, True):
            for split in (1, 4):
                gemm2(scheme, bias, split=split)
        gemm1(scheme, 0, False, 1, router=True)
        gemm2(scheme, True, by_token=True)
    for block_k in (64, 256):  # MXFP4 chunk loop unrolled 1x and 4x (128 above)
        gemm1(2, 2, True, 1, block_k=block_k)
        gemm1(2, 2, True, 2, block_k=block_k)
        gemm2(2, True, block_k=block_k)
    for block_k in (64, 128, 256):  # inline-PTX MXFP4 decode (the default on CUDA with bf16)
        for split in (1, 2):
            gemm1(2, 2, True, split, block_k=block_k, asm=True)
            gemm2(2, True, block_k=block_k, asm=True, split=split)
    for block_k, block_n, block_m in ((64, 64, 16), (128, 128, 16), (256, 64, 32), (128, 128, 64)):  # swapped operands
        for asm in (True, False):
            gemm1(2, 2, True, 1, block_k=block_k, block_n=block_n, block_m=block_m, asm=asm, swap=True)
            gemm2(2, True, block_k=block_k, block_n=block_n, block_m=block_m, asm=asm, swap=True)
    gemm1(2, 2, True, 2, block_k=128, asm=True, swap=True)
    gemm2(2, True, block_k=128, asm=True, swap=True, split=2)
    # one 64-deep MMA per MXFP4 chunk (the mxfp4_whole_chunk switch): swapped walks with few-row tails, 64 rows plain
    gemm1(2, 2, True, 1, block_k=64, block_n=64, block_m=128, asm=True, swap=True, persistent=True, tail=64,
          tail_swap=True, num_stages=4, whole=True)  # fmt: skip
    gemm2(2, True, block_k=64, block_n=256, block_m=128, asm=True, swap=True, persistent=True, num_warps=8,
          num_stages=4, whole=True)  # fmt: skip
    gemm1(2, 2, True, 1, block_k=64, block_n=64, block_m=64, asm=True, whole=True)
    gemm2(2, True, block_k=64, block_n=64, block_m=64, asm=True, whole=True)
    for split in (1, 4):  # fp8_block with activations quantized once per forward (the fp8_prequant switch)
        for bias in (False, True):
            gemm1(1, 0, bias, split, a_fp8=True)
    gemm1(1, 0, False, 1, router=True, a_fp8=True)
    for split in (1, 4):  # fp8_block: GEMM2's input quantized in GEMM1's epilogue, read as codes by GEMM2
        for block_n, block_m in ((128, 16), (256, 64)):
            gemm1(1, 0, True, split, block_n=block_n, block_m=block_m, a_fp8=True, out_fp8=True)
        gemm2(1, True, split=split, a_fp8=True)
    gemm1(1, 2, False, 1, block_n=128, a_fp8=True, out_fp8=True, pdl=True)
    gemm2(1, False, by_token=True, a_fp8=True, pdl=True)
    for pdl in (False, True):
        build(gemm._quant_fp8_groups, lambda n: {"x_ptr": "*bf16", "q_ptr": "*fp8e4nv", "s_ptr": "*fp32"}.get(n, "i32"),
              dict(ROWS=16, PDL=pdl), f"quant_fp8_groups{'_pdl' if pdl else ''}")  # fmt: skip
    # programmatic dependent launch (the pdl switch): every kernel of the forward with its grid-dependency prologue
    gemm1(0, 0, False, 1, pdl=True)
    gemm1(0, 0, False, 4, pdl=True)
    gemm1(2, 2, True, 1, asm=True, pdl=True)
    gemm1(1, 0, False, 1, a_fp8=True, pdl=True)
    gemm2(0, True, pdl=True)
    gemm2(2, True, asm=True, pdl=True)
    gemm2(0, True, pdl=True, split=4)
    # direct routing at decode: one pair per row block, GEMM1 zeroing GEMM2's counters, GEMM2 summing the slots
    for scheme, asm in ((0, False), (1, False), (2, True)):
        for split in (1, 4):
            gemm1(scheme, 2 if scheme == 2 else 0, scheme == 2, split, asm=asm, direct=True)
            gemm2(scheme, scheme == 2, asm=asm, split=split, direct=True, sum_slots=True)
        gemm2(scheme, False, asm=asm, by_token=True, direct=True)
    gemm1(0, 0, False, 1, router=True, direct=True, pdl=True)
    gemm2(0, True, direct=True, sum_slots=True, pdl=True)
    gemm1(2, 2, True, 1, block_k=128, asm=True, swap=True, direct=True)
    gemm2(2, True, block_k=128, asm=True, swap=True, direct=True, sum_slots=True)
    # swapped operands in the dense main loops: bf16 and fp8_block (codes in, codes out, and quantized in the loop)
    for block_n, block_m in ((64, 16), (128, 32)):
        gemm1(0, 0, False, 1, block_n=block_n, block_m=block_m, swap=True)
        gemm1(0, 0, False, 4, block_n=block_n, block_m=block_m, swap=True)
        gemm2(0, True, block_n=block_n, block_m=block_m, swap=True)
        gemm1(1, 0, False, 1, block_n=block_n, block_m=block_m, swap=True)
        gemm1(1, 0, True, 1, block_n=128, block_m=block_m, a_fp8=True, out_fp8=True, swap=True)
        gemm2(1, True, block_n=block_n, block_m=block_m, a_fp8=True, swap=True)
        gemm2(1, True, block_n=block_n, block_m=block_m, swap=True, split=4)
    gemm1(1, 0, False, 1, a_fp8=True, swap=True, direct=True)
    gemm2(1, False, a_fp8=True, swap=True, direct=True, sum_slots=True)
    gemm1(0, 0, False, 1, swap=True, dt="fp32")
    # tiles through tensor descriptors (GemmConfig.tma): weights, and GEMM2's aligned intermediate
    for block_n, block_k, block_m, warps in ((64, 64, 64, 4), (128, 64, 128, 8), (256, 64, 128, 8), (128, 128, 64, 8)):
        gemm1(0, 0, False, 1, block_n=block_n, block_k=block_k, block_m=block_m, tma=True, num_warps=warps)
        gemm2(0, False, block_n=block_n, block_k=block_k, block_m=block_m, tma=True, tma_a=True, num_warps=warps)
    gemm1(0, 2, True, 4, tma=True)
    gemm2(0, True, tma=True, split=4)
    gemm2(0, True, by_token=True, tma=True, tma_a=True)
    for block_n, block_m in ((64, 16), (128, 32)):  # swapped
        gemm1(0, 0, False, 1, block_n=block_n, block_m=block_m, swap=True, tma=True)
        gemm2(0, True, block_n=block_n, block_m=block_m, swap=True, tma=True, tma_a=True)
        gemm1(1, 0, True, 1, block_n=128, block_m=block_m, a_fp8=True, out_fp8=True, swap=True, tma=True)
        gemm2(1, True, block_n=block_n, block_m=block_m, a_fp8=True, swap=True, tma=True, tma_a=True)
    gemm1(0, 0, False, 1, direct=True, tma=True)
    gemm2(0, False, direct=True, sum_slots=True, tma=True)
    for block_n, block_m, warps in ((128, 64, 4), (256, 64, 8)):  # fp8_block: codes in, codes out
        gemm1(1, 0, True, 1, block_n=block_n, block_m=block_m, a_fp8=True, out_fp8=True, tma=True, num_warps=warps)
        gemm2(1, True, block_n=block_n, block_m=block_m, a_fp8=True, tma=True, tma_a=True, num_warps=warps)
    gemm1(1, 0, False, 1, tma=True)
    gemm2(1, True, split=4, tma=True, tma_a=True)
    # fp8_block with the up half's scales read as scalars (I a multiple of BLOCK_N <= 128; wider tiles load per row)
    for block_n, block_m, swap, warps in ((128, 64, False, 4), (256, 64, False, 8), (64, 16, True, 4)):
        gemm1(1, 0, True, 1, block_n=block_n, block_m=block_m, a_fp8=True, swap=swap, num_warps=warps, up_aligned=True)
    gemm1(1, 0, True, 1, block_n=128, block_m=64, a_fp8=True, out_fp8=True, num_warps=8, up_aligned=True, tma=True)
    gemm1(1, 0, False, 4, up_aligned=True)
    for a_fp8, swap in ((True, True), (False, False)):  # fp8_block scales loaded a K step ahead (fp8_scale_prefetch)
        gemm1(1, 0, True, 4 if swap else 1, block_n=64, a_fp8=a_fp8, swap=swap, up_aligned=True, prefetch=True)
        gemm2(1, True, split=2 if swap else 1, block_n=256 if swap else 64, a_fp8=a_fp8, swap=swap, prefetch=True)
    # persistent tile walks (GemmConfig.persistent)
    for block_n, block_m, warps, tma in ((128, 64, 4, False), (128, 128, 8, True), (256, 128, 8, True)):
        gemm1(0, 0, False, 1, block_n=block_n, block_k=64, block_m=block_m, tma=tma, num_warps=warps, persistent=True)
        gemm2(0, True, block_n=block_n, block_k=64, block_m=block_m, tma=tma, tma_a=tma, num_warps=warps,
              persistent=True)  # fmt: skip
    gemm2(0, True, by_token=True, block_n=128, block_k=64, block_m=128, tma=True, tma_a=True, num_warps=8,
          persistent=True)  # fmt: skip
    gemm1(1, 0, True, 1, block_n=128, block_m=64, a_fp8=True, out_fp8=True, up_aligned=True, tma=True, persistent=True)
    gemm2(1, True, block_n=128, block_m=64, a_fp8=True, tma=True, tma_a=True, persistent=True)
    gemm1(2, 2, True, 1, block_k=128, block_n=128, block_m=64, asm=True, swap=True, persistent=True)
    gemm2(2, True, block_k=128, block_n=128, block_m=64, asm=True, swap=True, persistent=True)
    # few-row blocks of a walk on their own tile (GemmConfig.tail_m), at the large tiles' stage counts
    for block_n1, block_n2, stages in ((128, 256, 4), (128, 128, 4)):
        for tail, swap in ((32, True), (64, False), (16, True)):
            gemm1(0, 0, False, 1, block_n=block_n1, block_k=64, block_m=128, tma=True, num_warps=8, persistent=True,
                  tail=tail, tail_swap=swap, num_stages=stages)  # fmt: skip
            gemm2(0, True, block_n=block_n2, block_k=64, block_m=128, tma=True, tma_a=True, num_warps=8,
                  persistent=True, tail=tail, tail_swap=swap, num_stages=stages)  # fmt: skip
    for tail in (32, 64):  # MXFP4 (its 128-row entries swap), fp8_block codes in and out
        gemm1(2, 2, True, 1, block_k=64, block_n=64, block_m=128, asm=True, swap=True, persistent=True, tail=tail,
              tail_swap=True, num_stages=4)  # fmt: skip
        gemm2(2, True, block_k=64, block_n=256, block_m=128, asm=True, swap=True, num_warps=8, persistent=True,
              tail=tail, tail_swap=True, num_stages=4)  # fmt: skip
        gemm1(1, 0, True, 1, block_n=128, block_m=128, a_fp8=True, out_fp8=True, up_aligned=True, tma=True,
              num_warps=8, persistent=True, tail=tail, tail_swap=tail < 64)  # fmt: skip
        gemm2(1, True, block_n=128, block_m=128, a_fp8=True, tma=True, tma_a=True, num_warps=8, persistent=True,
              tail=tail, tail_swap=tail < 64)  # fmt: skip
    for dt in ("fp16", "fp32"):  # the interpreter tests' dtypes
        gemm1(2, 2, True, 1, dt=dt)
        gemm1(2, 2, True, 1, dt=dt, swap=True)
        gemm1(0, 0, False, 2, dt=dt)
        gemm1(2, 2, True, 2, dt=dt)
        gemm2(2, True, dt=dt)
        gemm2(0, False, dt=dt, split=2)
        gemm1(0, 0, False, 2, dt=dt, direct=True)
        gemm2(0, False, dt=dt, split=2, direct=True, sum_slots=True)
        gemm1(0, 0, False, 2, dt=dt, tma=True)
        gemm2(0, False, dt=dt, tma=True, tma_a=True)

    i32 = lambda n: "*i32" if n.endswith("_ptr") else "i32"
    for e, e_pow2, pair_chunk, block_chunk in ((256, 512, 256, 64), (128, 256, 16, 16)):  # prefill, decode widths
        for pdl in (False, True):
            tag = f"E={e} steps {pair_chunk}{' pdl' if pdl else ''}"
            build(align._count, i32, dict(E=e, E_POW2=e_pow2, PAIRS=256, WIDTH=1024, PDL=pdl), f"count {tag}")
            tiles = align.plan_scatter_tiles(align.ALIGN_PROGRAMS, e_pow2, block_chunk)
            ps = dict(E=e, BLOCK_M=16, PAIRS=256, PDL=pdl, **tiles)
            build(align._plan_scatter, i32, ps, f"plan_scatter {tag}", num_warps=8)
            cp = dict(
                E=e, E_POW2=e_pow2, BLOCK_M=16, WIDTH=1024, PAIR_CHUNK=pair_chunk, BLOCK_CHUNK=block_chunk, PDL=pdl
            )
            build(align._plan_and_scatter, i32, cp, f"plan_and_scatter {tag}")
    for pdl in (False, True):
        build(gemm._sum_slots, lambda n: "*i32" if n == "ids_ptr" else "*bf16" if n.endswith("_ptr") else "i32",
              dict(TOP_K=8, BLOCK_N=1024, PDL=pdl), f"sum_slots{' pdl' if pdl else ''}")  # fmt: skip
    # the fused router: Qwen3 / gpt-oss (128 experts, top 8 / 4) and Mixtral (8, top 2) on bf16 logits
    route_types = lambda n: {"logits_ptr": "*bf16", "ids_ptr": "*i32", "weights_ptr": "*fp32"}.get(n, "i32")
    for e, k, renormalize in ((128, 8, True), (128, 8, False), (128, 4, True), (8, 2, True)):
        rc = dict(TOP_K=k, K_POW2=k, RENORMALIZE=renormalize, BLOCK_M=min(64, 4096 // e), BLOCK_E=e)
        build(route._softmax_topk, route_types, rc, f"softmax_topk E={e} k={k} renormalize={renormalize}")
    rc = dict(TOP_K=1, K_POW2=1, RENORMALIZE=True, BLOCK_M=32, BLOCK_E=128, SIGMOID_WEIGHT=True)  # Llama 4 Maverick
    build(route._softmax_topk, route_types, rc, "sigmoid_top1 E=128")
    # the gate GEMM in the router (16-row blocks, up to 256 tokens): Qwen3 (no bias) and gpt-oss (bias) at
    # decode (K split) and at 256 tokens (unsplit), Llama 4's sigmoid top-1, an fp32 gate (IEEE dot), E=256
    for dt, e, k, bias, split, sigmoid in (
        ("bf16", 128, 8, False, 8, False), ("bf16", 128, 4, True, 16, False), ("bf16", 128, 8, False, 1, False),
        ("bf16", 128, 1, False, 4, True), ("fp32", 8, 2, False, 2, False), ("bf16", 256, 8, False, 16, False),
    ):  # fmt: skip
        pointers = {"x_ptr": f"*{dt}", "w_ptr": f"*{dt}", "b_ptr": f"*{dt}", "ids_ptr": "*i32", "weights_ptr": "*fp32",
                    "part_ptr": "*fp32", "count_ptr": "*i32"}  # fmt: skip
        types = lambda n, p=pointers: p.get(n, "i32")
        block_e = max(16, e)
        rc = dict(TOP_K=k, K_POW2=k, RENORMALIZE=True, HAS_BIAS=bias, SPLIT_K=split, IEEE=dt == "fp32", BLOCK_M=16,
                  BLOCK_E=block_e, BLOCK_K=128, SIGMOID_WEIGHT=sigmoid)  # fmt: skip
        build(route._gate_softmax_topk, types, rc, f"gate_softmax_topk {dt} E={e} k={k} split={split}",
              num_stages=3 if block_e <= 128 else 2)  # fmt: skip
    # the grouped router: DeepSeek-V3 (fp32 logits, bias, 8 groups of 32, 4 kept, top 8), DeepSeek-V2 (160
    # experts in 8 groups of 20: not a power of two; softmax, groups by their best), MiniMax-M2 (one group)
    for dt, e, k, groups, kept, sigmoid, bias in (
        ("fp32", 256, 8, 8, 4, True, True), ("fp32", 160, 6, 8, 3, False, False), ("bf16", 256, 8, 1, 1, True, True)
    ):  # fmt: skip
        pointers = {"logits_ptr": f"*{dt}", "bias_ptr": "*fp32", "ids_ptr": "*i32", "weights_ptr": "*fp32"}
        types = lambda n, p=pointers: p.get(n, "fp32" if n in ("scale", "eps", "floor") else "i32")
        block_e = triton.next_power_of_2(e)
        rc = dict(TOP_K=k, K_POW2=triton.next_power_of_2(k), N_GROUP=groups, G_POW2=groups, TOPK_GROUP=kept,
                  PER_GROUP=e // groups, SIGMOID=sigmoid, TOP2_SUM=sigmoid, HAS_BIAS=bias, RENORMALIZE=sigmoid,
                  BLOCK_M=min(64, 4096 // block_e), BLOCK_E=block_e)  # fmt: skip
        build(route._grouped_topk, types, rc, f"grouped_topk {dt} E={e} k={k} groups={groups}")
    print("compiled", compile_all(jobs), "kernels for sm90")


if __name__ == "__main__":
    main()
