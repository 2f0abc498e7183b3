"""The fused MoE forward as one ``torch.library`` custom op: ``moe_triton::fused_moe``.

Launch sequence (all on the current stream, no host synchronisation, so it
can be captured in a CUDA graph): align (1-3 small kernels) -> GEMM1 with the
activation in its epilogue -> GEMM2 with bias and routing weight in its
epilogue -> sum over the k slots (skipped when k == 1). At decode
(``kernel_configs.direct_decode``) the alignment is skipped: each GEMM row
block is one (token, slot) pair, GEMM1 zeroes GEMM2's counters and GEMM2 sums
the slots itself (``SlotSum``), so the forward is the two GEMM launches.
With split-K (decode) either GEMM writes fp32 partials to a workspace sized from the shapes alone and
the last program of each tile reduces them (arrival counters that the
alignment zeroes), so the launch count is unchanged. With the ``pdl`` switch
(``moe_triton.switches``) on, every kernel is launched with programmatic dependent
launch (``pdl_kwargs``) and waits for its predecessor in its first statement; unset, the tile config's
``pdl`` decides.
Registered as a custom op with a fake implementation so
``torch.compile(fullgraph=True)`` treats the whole forward as one opaque node.

The op's schema is flat (tensors and scalars, as ``torch.library`` needs); it
builds the launch bundles of ``moe_triton.launch_args`` once and
``run_fused_moe`` and the GEMM launches take those. Weights are the prepared
ones (``moe_triton.layout.TritonWeights``): for mxfp4 the chunked packed
layout, folded scale pairs ``[E, Kp/64, N]`` and the per-expert multipliers.
"""

from __future__ import annotations

import functools

import torch
import triton.language as tl

from moe_triton import tma
from moe_triton.fast_launch import launch
from moe_triton.kernel_configs import (
    INTERPRETER_SMS,
    GemmConfig,
    KernelConfig,
    direct_decode,
    resolve_split_k,
    sanitize,
    select_config,
    sm_count,
    whole_chunk_applies,
)
from moe_triton.kernels import align, gemm
from moe_triton.kernels.operands import HAS_PDL
from moe_triton.launch_args import Activation, AlignedRouting, GemmWeights, SlotSum, SplitK
from moe_triton.sizes import cdiv, next_power_of_2
from moe_triton.switches import Switches, current_switches

SCHEME_IDS = {
    "fp32": gemm.FLOAT,
    "bf16": gemm.FLOAT,
    "fp16": gemm.FLOAT,
    "fp8_block": gemm.FP8_BLOCK,
    "mxfp4": gemm.MXFP4,
}
ACTIVATION_IDS = {"silu": gemm.SILU, "gelu": gemm.GELU, "swiglu_oai": gemm.SWIGLU_OAI}


def _scale_strides(s: torch.Tensor | None, scheme: str) -> tuple[int, int, int]:
    """(expert, n, k) strides of a scale tensor; mxfp4's prepared scales are stored ``[E, K-chunk, N]``."""
    if s is None:
        return (0, 0, 0)
    if scheme == "mxfp4":
        return (s.stride(0), s.stride(2), s.stride(1))
    return tuple(s.stride())


def _bias_strides(b: torch.Tensor | None) -> tuple[int, int]:
    return (b.stride(0), b.stride(1)) if b is not None else (0, 0)


def _precision(dtype: torch.dtype) -> str:
    return "ieee" if dtype == torch.float32 else "tf32"


#: the largest BLOCK_M whose fp8_block tiles load their scales a K step ahead (the ``fp8_scale_prefetch``
#: switch): in 16-row tiles the scale loads' latency is exposed and prefetching it pays; 32-row tiles lose
#: more to the extra registers (results/README.md, fp8_block scale prefetch)
PREFETCH_MAX_BLOCK_M = 16


def _scale_prefetch(scheme: str, block_m: int, switches: Switches | None) -> bool:
    """fp8_block scales loaded one K step ahead (``kernels.gemm._fp8_scales1``): the ``fp8_scale_prefetch``
    switch, in tiles of at most ``PREFETCH_MAX_BLOCK_M`` rows."""
    return (
        scheme == "fp8_block"
        and block_m <= PREFETCH_MAX_BLOCK_M
        and (switches or current_switches()).fp8_scale_prefetch
    )


def _decode_asm(scheme: str, t: torch.Tensor, switches: Switches | None) -> bool:
    """Inline-PTX MXFP4 decode: mxfp4, CUDA, bf16 activations and the ``mxfp4_asm`` switch (default on)."""
    if scheme != "mxfp4" or not t.is_cuda or t.dtype != torch.bfloat16:
        return False
    return (switches or current_switches()).mxfp4_asm


def _whole_chunk(scheme: str, block_m: int, tiles: GemmConfig, switches: Switches | None) -> bool:
    """One 64-deep MMA per MXFP4 chunk (``kernels.gemm._cat_k``): the tile's ``whole_chunk``, or the
    ``mxfp4_whole_chunk`` switch where it is set; False wherever it would change nothing
    (``whole_chunk_applies``), so such tiles keep one compiled variant."""
    if not whole_chunk_applies(scheme, block_m, tiles):
        return False
    forced = (switches or current_switches()).mxfp4_whole_chunk
    return tiles.whole_chunk if forced is None else forced


def pdl_wanted(switches: Switches | None = None, config: KernelConfig | None = None) -> bool:
    """Whether a forward asks for programmatic dependent launch: the ``pdl`` switch where it is set (default
    ``current_switches()``'s), else the tile config's ``pdl`` (the tuner's measured choice; off without one)."""
    forced = (switches or current_switches()).pdl
    return forced if forced is not None else config is not None and config.pdl


def pdl_kwargs(device: torch.device, switches: Switches | None = None, config: KernelConfig | None = None) -> dict:
    """Launch keywords for programmatic dependent launch where ``pdl_wanted`` and the device has it (CUDA SM90+
    with Triton's grid-dependency intrinsics), else none: every kernel of the forward takes them."""
    if pdl_wanted(switches, config) and HAS_PDL and device.type == "cuda" and _sm90_or_newer(device):
        return {"PDL": True, "launch_pdl": True}
    return {}


@functools.cache
def _sm90_or_newer(device: torch.device) -> bool:
    return torch.cuda.get_device_capability(device) >= (9, 0)


def split_scratch(n_blocks: int, block_m: int, device, *gemms: tuple[int, int, int, int], extra: int = 0):
    """Split-K scratch for each GEMM given as ``(split_k, width, n, block_n)``: a ``SplitK`` (fp32 partials
    ``[split_k, rows, width]``, int32 counters, one per (row block, N tile) of ``n`` columns), or None where
    ``split_k == 1``. Only rows holding a pair are written and read. The counters of all GEMMs are views of
    one buffer, returned last (None if it would be empty), followed by ``extra`` more counters (GEMM2's
    ``SlotSum``); it must be zero before the GEMMs run: ``align(zero=...)`` clears it without an extra
    launch (direct routing: ``launch_gemm1(zero=...)``)."""
    tiles = [n_blocks * cdiv(n, block_n) if split > 1 else 0 for split, _, n, block_n in gemms]
    total = sum(tiles) + extra
    counters = torch.empty(total, dtype=torch.int32, device=device) if total else None
    out, start = [], 0
    for (split, width, _, _), t in zip(gemms, tiles, strict=True):
        if split > 1:
            partials = torch.empty(split, n_blocks * block_m, width, dtype=torch.float32, device=device)
            out.append(SplitK(partials, counters[start : start + t]))
        else:
            out.append(None)
        start += t
    return (*out, counters)


def _grid(tiles: int, g: GemmConfig, routing: AlignedRouting, split_k: int, device: torch.device) -> tuple[int, bool]:
    """(programs, persistent) of a GEMM launch over ``tiles`` tiles: with ``GemmConfig.persistent`` (aligned
    routing, unsplit) ``persistent`` programs per SM, each walking the tiles in use; else one program per
    tile and K split."""
    if g.persistent and not routing.direct and split_k == 1:
        return max(1, min(tiles, (sm_count(device) or INTERPRETER_SMS) * g.persistent)), True
    return tiles * split_k, False


def _tail(g: GemmConfig, persistent: bool) -> dict:
    """The ``TAIL_M`` / ``TAIL_SWAP`` constexprs of a GEMM launch (``GemmConfig.tail_m``, walks only): a
    tile under 64 rows swaps its operands where the weight tile fills a ``wgmma``'s 64 rows."""
    tail = g.tail_m if persistent else 0
    return {"TAIL_M": tail, "TAIL_SWAP": bool(tail) and (g.swap_ab or (tail < 64 and g.block_n >= 64))}


def _split_args(split: SplitK | None, fallback: torch.Tensor):
    """Kernel arguments for a GEMM's split-K scratch: (split, partials, counters, *partials strides)."""
    if split is None or split.factor == 1:
        return (1, fallback, fallback, 0, 0, 0)
    return (split.factor, split.partials, split.counters, *split.partials.stride())


def quantize_fp8_groups(x: torch.Tensor, pdl: dict | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` [M, K] -> (e4m3 codes [M, K], fp32 scales [M, ceil(K/128)]), per token and 128 columns: the
    quantization fp8_block's GEMM1 otherwise repeats inside every N-tile program (the ``fp8_prequant``
    switch)."""
    m, k = x.shape
    q = torch.empty(m, k, dtype=torch.float8_e4m3fn, device=x.device)
    s = torch.empty(m, cdiv(k, 128), dtype=torch.float32, device=x.device)
    rows = min(16, next_power_of_2(m))
    launch(
        gemm._quant_fp8_groups, (cdiv(m, rows), cdiv(k, 128)),
        x, q, s, m, k, x.stride(0), x.stride(1), q.stride(0), s.stride(0), ROWS=rows, num_warps=4, **(pdl or {})
    )  # fmt: skip
    return q, s


def launch_gemm1(
    x: torch.Tensor,
    weights: GemmWeights,
    routing: AlignedRouting,
    activation: Activation,
    out: torch.Tensor,
    tiles: GemmConfig,
    *,
    x_scale: torch.Tensor | None = None,
    out_scale: torch.Tensor | None = None,
    round_to: torch.dtype | None = None,
    split: SplitK | None = None,
    zero: torch.Tensor | None = None,
    pdl: dict | None = None,
    switches: Switches | None = None,
) -> None:
    """GEMM1 into ``out``, the activated intermediate ``[rows, I]``. ``split``: split K (partials
    ``[split, rows, 2I]`` and zeroed counters of ``split_scratch``); None: unsplit. ``x_scale``: ``x``
    holds fp8_block codes from ``quantize_fp8_groups`` and these are their scales. ``out_scale``
    (fp8_block, ``fp8_intermediate(tiles)``): ``out`` is float8_e4m3fn and receives GEMM2's input
    quantized, ``out_scale`` ``[rows, ceil(I/128)]`` fp32 its scales; ``round_to`` (required with it) is
    the activations' dtype, which the activated tile is rounded to first, as an unquantized intermediate
    is. ``zero`` (direct routing only): an int32 buffer GEMM1 zeroes (GEMM2's counters). ``pdl``: the
    keywords of ``pdl_kwargs`` (None: a plain launch); ``switches``: the MXFP4 decode and fp8_block scale
    prefetch choices (None: ``current_switches()``)."""
    w, r, g = weights, routing, tiles
    num_m = r.block_expert.numel()
    inter = w.weight.shape[1] // 2
    num_experts = w.weight.shape[0]
    split_k, partials, counters, *p_strides = _split_args(split, r.offsets)
    a_fp8 = x_scale is not None
    out_fp8 = out_scale is not None
    if out_fp8 and (not fp8_intermediate(w.scheme, g) or round_to not in _TL_DTYPES):
        raise ValueError(f"GEMM1 quantizes its output for fp8_block tiles with BLOCK_N a multiple of 128 and a "
                         f"float round_to dtype, not {g} and {round_to}")  # fmt: skip
    if zero is not None and not r.direct:
        raise ValueError("launch_gemm1(zero=...) is for direct routing; align(zero=...) clears buffers otherwise")
    programs, persistent = _grid(num_m * cdiv(inter, g.block_n), g, r, split_k, x.device)
    launch(
        gemm._gemm1, (programs,),
        x, x_scale if a_fp8 else x, w.weight, w.scale if w.scale is not None else w.weight,
        w.mult if w.mult is not None else r.topk_weights,
        w.bias if w.bias is not None else x, r.topk_weights, r.sorted_ids, r.block_expert, r.offsets, out,
        out_scale if out_fp8 else r.topk_weights,
        partials, counters, zero if zero is not None else r.offsets, zero.numel() if zero is not None else 0,
        r.topk_weights.numel(), num_m, inter, x.shape[1], num_experts,
        float(activation.alpha), float(activation.limit),
        x.stride(0), x.stride(1), x_scale.stride(0) if a_fp8 else 0, *w.weight.stride(),
        *_scale_strides(w.scale, w.scheme), *_bias_strides(w.bias), out.stride(0), out.stride(1),
        out_scale.stride(0) if out_fp8 else 0, *p_strides,
        A_FP8=a_fp8, OUT_FP8=out_fp8, ROUND=_TL_DTYPES[round_to] if out_fp8 else tl.bfloat16,
        TOP_K=r.top_k, SCHEME=SCHEME_IDS[w.scheme], ACTIVATION=ACTIVATION_IDS[activation.name],
        HAS_BIAS=w.bias is not None, ROUTER_ON_INPUT=r.router_on_input, PRECISION=_precision(x.dtype),
        SPLIT_K=split_k, DECODE_ASM=_decode_asm(w.scheme, x, switches), BLOCK_M=r.block_m, BLOCK_N=g.block_n,
        BLOCK_K=g.block_k, GROUP_M=g.group_m, SWAP_AB=g.swap_ab, DIRECT=r.direct,
        TMA=tma.applies(g.tma, w.scheme, w.weight), UP_ALIGNED=w.scheme == "fp8_block" and inter % g.block_n == 0,
        PREFETCH=_scale_prefetch(w.scheme, r.block_m, switches), PERSISTENT=persistent, **_tail(g, persistent),
        WHOLE_CHUNK=_whole_chunk(w.scheme, r.block_m, g, switches),
        num_warps=g.num_warps, num_stages=g.num_stages, **(pdl or {}),
    )  # fmt: skip


def launch_gemm2(
    a: torch.Tensor,
    weights: GemmWeights,
    routing: AlignedRouting,
    y: torch.Tensor,
    tiles: GemmConfig,
    *,
    a_scale: torch.Tensor | None = None,
    by_token: bool = False,
    split: SplitK | None = None,
    slot_sum: SlotSum | None = None,
    pdl: dict | None = None,
    switches: Switches | None = None,
) -> None:
    """GEMM2 of the intermediate ``a`` ``[rows, I]`` + bias + routing weight into ``y``: ``[M*k, H]``, one
    row per (token, slot) pair, or ``[M, H]`` when ``by_token`` (k == 1: no slot sum follows). ``a_scale``:
    ``a`` holds fp8_block codes and these are their scales (``launch_gemm1``'s ``out_scale``). ``split``
    (partials ``[split, rows, H]``), ``pdl`` and ``switches`` as in ``launch_gemm1``. ``slot_sum`` (direct
    routing, k > 1): also sum each token's slots of ``y`` into ``slot_sum.out`` in this launch."""
    w, r, g = weights, routing, tiles
    num_m = r.block_expert.numel()
    h = y.shape[1]
    split_k, partials, counters, *p_strides = _split_args(split, r.offsets)
    if slot_sum is not None and (not r.direct or by_token):
        raise ValueError("GEMM2 sums the slots itself only with direct routing and k > 1")
    a_fp8 = a_scale is not None
    use_tma = tma.applies(g.tma, w.scheme, w.weight)
    tma_a = use_tma and not r.direct and a.shape[0] == num_m * r.block_m and tma.rows_ok(a)  # aligned rows
    programs, persistent = _grid(num_m * cdiv(h, g.block_n), g, r, split_k, y.device)
    launch(
        gemm._gemm2, (programs,),
        a, a_scale if a_fp8 else a, w.weight, w.scale if w.scale is not None else w.weight,
        w.mult if w.mult is not None else r.topk_weights,
        w.bias if w.bias is not None else y, r.topk_weights, r.sorted_ids, r.block_expert, r.offsets, y,
        partials, counters, slot_sum.out if slot_sum else y, slot_sum.counters if slot_sum else r.offsets,
        r.topk_weights.numel(), num_m, h, a.shape[1], w.weight.shape[0],
        a.stride(0), a.stride(1), a_scale.stride(0) if a_fp8 else 0, *w.weight.stride(),
        *_scale_strides(w.scale, w.scheme), *_bias_strides(w.bias), y.stride(0), y.stride(1), *p_strides,
        slot_sum.out.stride(0) if slot_sum else 0,
        TOP_K=r.top_k, SCHEME=SCHEME_IDS[w.scheme], HAS_BIAS=w.bias is not None, ROUTER_ON_INPUT=r.router_on_input,
        OUT_BY_TOKEN=by_token, PRECISION=_precision(y.dtype), SPLIT_K=split_k,
        DECODE_ASM=_decode_asm(w.scheme, y, switches), BLOCK_M=r.block_m, BLOCK_N=g.block_n, BLOCK_K=g.block_k,
        GROUP_M=g.group_m, SWAP_AB=g.swap_ab, A_FP8=a_fp8, DIRECT=r.direct,
        SUM_SLOTS=slot_sum is not None, TMA=use_tma, TMA_A=tma_a,
        PREFETCH=_scale_prefetch(w.scheme, r.block_m, switches), PERSISTENT=persistent, **_tail(g, persistent),
        WHOLE_CHUNK=_whole_chunk(w.scheme, r.block_m, g, switches),
        num_warps=g.num_warps, num_stages=g.num_stages, **(pdl or {}),
    )  # fmt: skip


def fp8_intermediate(scheme: str, gemm1_tiles: GemmConfig) -> bool:
    """Whether GEMM1 can hand GEMM2 its input already quantized (``launch_gemm1``'s ``out_scale``):
    fp8_block, with GEMM1's N tile covering whole 128-column scale groups."""
    return scheme == "fp8_block" and gemm1_tiles.block_n % 128 == 0


_TL_DTYPES = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}


def _check_prepared(w13: GemmWeights) -> None:
    if w13.scheme == "mxfp4" and (w13.scale is None or w13.scale.dtype != torch.int32 or w13.mult is None):
        raise ValueError(
            "moe_triton::fused_moe needs mxfp4 weights in the prepared layout (moe_triton.layout.prepare_weights: "
            "chunked packed bytes, folded scale pairs and w13_mult/w2_mult), not the canonical uint8 scales"
        )


def run_fused_moe(
    x: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    w13: GemmWeights,
    w2: GemmWeights,
    activation: Activation,
    out: torch.Tensor,
    *,
    router_on_input: bool = False,
    config: KernelConfig | None = None,
    switches: Switches | None = None,
) -> None:
    """Compute the routed-expert output into ``out`` ([M, H], contiguous) from prepared weights
    (``TritonWeights.gemm1()`` / ``gemm2()``). ``config``: explicit tiles (None: the table or the
    heuristic); ``switches``: None reads ``moe_triton.switches.current_switches()`` once for the whole forward."""
    _check_prepared(w13)
    m, h = x.shape
    top_k = topk_ids.shape[1]
    num_experts = w13.weight.shape[0]
    inter = w13.weight.shape[1] // 2
    if m == 0:
        return
    scheme = w13.scheme
    sw = switches or current_switches()
    cfg = (
        sanitize(config, scheme)
        if config is not None
        else select_config(scheme, num_experts, h, inter, top_k, m, x.device)
    )
    split = resolve_split_k(scheme, num_experts, h, inter, top_k, m, cfg, x.device, sw)
    pdl = pdl_kwargs(x.device, sw, cfg)
    ids = align.flat_ids(topk_ids)  # contiguous int32 [M*k]: align and the slot sum index it
    weights = topk_weights.reshape(-1).contiguous()
    by_token = top_k == 1
    if sw.direct and direct_decode(m, top_k, num_experts):
        _run_direct(x, ids, weights, w13, w2, activation, out, cfg, split, router_on_input, pdl, sw)
        return
    n_blocks = align.max_blocks(m * top_k, num_experts, cfg.block_m)
    scratch1, scratch2, counters = split_scratch(
        n_blocks, cfg.block_m, x.device, (split, 2 * inter, inter, cfg.gemm1.block_n),
        (cfg.split_k2, h, h, cfg.gemm2.block_n),
    )  # fmt: skip
    routing = AlignedRouting(
        weights, *align.align(ids, num_experts, cfg.block_m, pdl, zero=counters), top_k, cfg.block_m, router_on_input
    )
    rows = n_blocks * cfg.block_m
    prequant = scheme == "fp8_block" and sw.fp8_prequant
    a, a_scale = quantize_fp8_groups(x, pdl) if prequant else (x, None)
    if prequant and fp8_intermediate(scheme, cfg.gemm1):  # GEMM1 quantizes GEMM2's input in its epilogue
        intermediate = torch.empty(rows, inter, dtype=torch.float8_e4m3fn, device=x.device)
        inter_scale = torch.empty(rows, cdiv(inter, 128), dtype=torch.float32, device=x.device)
    else:
        intermediate, inter_scale = torch.empty(rows, inter, dtype=x.dtype, device=x.device), None
    launch_gemm1(a, w13, routing, activation, intermediate, cfg.gemm1, x_scale=a_scale, out_scale=inter_scale,
                 round_to=x.dtype, split=scratch1, pdl=pdl, switches=sw)  # fmt: skip
    y = out if by_token else torch.empty(m * top_k, h, dtype=x.dtype, device=x.device)
    launch_gemm2(intermediate, w2, routing, y, cfg.gemm2, a_scale=inter_scale, by_token=by_token, split=scratch2,
                 pdl=pdl, switches=sw)  # fmt: skip
    if not by_token:
        block = min(1024, next_power_of_2(h))
        launch(gemm._sum_slots, (m, cdiv(h, block)), y, out, ids, h, y.stride(0), out.stride(0), num_experts,
               TOP_K=top_k, BLOCK_N=block, **pdl)  # fmt: skip


def direct_routing(ids: torch.Tensor, topk_weights: torch.Tensor, top_k: int, block_m: int, router_on_input: bool):
    """The ``AlignedRouting`` of a forward that skips the alignment: flat int32 ``ids`` ``[M*k]`` stand for
    all three index tensors, one pair per row block (see ``AlignedRouting.direct``)."""
    return AlignedRouting(topk_weights, ids, ids, ids, top_k, block_m, router_on_input, direct=True)


def _run_direct(x, ids, weights, w13, w2, activation, out, cfg, split, router_on_input, pdl, sw) -> None:
    """The decode forward in two launches: GEMM1 over one row block per pair (zeroing GEMM2's counters),
    GEMM2 summing the slots itself. fp8_block quantizes in the K loops (``A_FP8`` off): a row per block
    makes that cheaper than the extra launch of ``quantize_fp8_groups``. If GEMM1 splits K its own counters
    must be zero before it starts: one memset then."""
    m, h = x.shape
    top_k = ids.numel() // m
    inter = w13.weight.shape[1] // 2
    pairs = ids.numel()
    by_token = top_k == 1
    slot_tiles = 0 if by_token else m * cdiv(h, cfg.gemm2.block_n)
    scratch1, scratch2, counters = split_scratch(
        pairs, 1, x.device, (split, 2 * inter, inter, cfg.gemm1.block_n), (cfg.split_k2, h, h, cfg.gemm2.block_n),
        extra=slot_tiles,
    )  # fmt: skip
    routing = direct_routing(ids, weights, top_k, cfg.block_m, router_on_input)
    zero = counters
    if scratch1 is not None:  # GEMM1's own counters: zero before it runs
        counters.zero_()
        zero = None
    intermediate = torch.empty(pairs, inter, dtype=x.dtype, device=x.device)
    launch_gemm1(x, w13, routing, activation, intermediate, cfg.gemm1, split=scratch1, zero=zero, pdl=pdl,
                 switches=sw)  # fmt: skip
    if by_token:
        launch_gemm2(intermediate, w2, routing, out, cfg.gemm2, by_token=True, split=scratch2, pdl=pdl, switches=sw)
        return
    y = torch.empty(pairs, h, dtype=x.dtype, device=x.device)
    slots = SlotSum(out, counters[counters.numel() - slot_tiles :])
    launch_gemm2(intermediate, w2, routing, y, cfg.gemm2, split=scratch2, slot_sum=slots, pdl=pdl, switches=sw)


def fused_moe_flat(
    x: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    w13_scale: torch.Tensor | None,
    w2_scale: torch.Tensor | None,
    b13: torch.Tensor | None,
    b2: torch.Tensor | None,
    out: torch.Tensor,
    scheme: str,
    activation: str,
    alpha: float,
    limit: float,
    router_on_input: bool,
    w13_mult: torch.Tensor | None = None,
    w2_mult: torch.Tensor | None = None,
) -> None:
    """Routed-expert output of a MoE layer into ``out`` (see ``run_fused_moe``): the flat schema,
    unpacked into the launch bundles here, once. Eager callers call this directly; ``fused_moe`` is the
    same function as a custom op, for ``torch.compile`` (an eager call through the dispatcher only adds
    host time)."""
    run_fused_moe(
        x,
        topk_ids,
        topk_weights,
        GemmWeights(scheme, w13, w13_scale, w13_mult, b13),
        GemmWeights(scheme, w2, w2_scale, w2_mult, b2),
        Activation(activation, alpha, limit),
        out,
        router_on_input=router_on_input,
    )


fused_moe = torch.library.custom_op("moe_triton::fused_moe", fused_moe_flat, mutates_args=("out",))


@fused_moe.register_fake
def _(x, topk_ids, topk_weights, w13, w2, w13_scale, w2_scale, b13, b2, out, scheme, activation, alpha, limit,
      router_on_input, w13_mult=None, w2_mult=None) -> None:  # fmt: skip
    return None
