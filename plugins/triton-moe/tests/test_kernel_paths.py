"""Kernel paths the conformance suite does not reach on its own, forced through explicit configs.

Split-K (each GEMM's partials reduced by the tile's last program), the MXFP4 chunk loop
with BLOCK_K 128/256 and K tails that are not a multiple of 64, experts whose
folded scales need the shift multiplier, and the automatic split heuristic.
Each forward is compared with the float64 oracle; split-K is also checked to
be deterministic. Runs under the interpreter (fp32/fp16) and on CUDA (bf16,
and fp8_block, which the interpreter cannot run).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from moe_core import MoeConfig
from moe_core.reference import reference_for
from moe_core.synthetic import random_inputs, random_weights
from moe_core.tolerances import relative_l2, tolerance
from moe_triton import kernel_configs, launch, switches
from moe_triton import tma as tma_mod
from moe_triton.launch_args import Activation, AlignedRouting, GemmWeights
from moe_triton.layout import prepare_weights

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
FLOAT = torch.bfloat16 if CUDA else torch.float32
HALF = torch.bfloat16 if CUDA else torch.float16


def _forward(cfg: MoeConfig, weights, x, ids, tw, kernel_config):
    p = prepare_weights(cfg.quant_scheme, weights)
    out = torch.empty(x.shape[0], cfg.hidden_size, dtype=cfg.dtype, device=x.device)
    launch.run_fused_moe(
        x,
        ids,
        tw,
        p.gemm1(),
        p.gemm2(),
        Activation(cfg.activation, cfg.swiglu_alpha, cfg.swiglu_limit),
        out,
        router_on_input=cfg.apply_router_weight_on_input,
        config=kernel_config,
    )
    return out


def _kc(block_k: int, split_k: int, block_n: int = 32, block_m: int = 16, swap=(False, False), split2=None,
        tma=(False, False), persistent=(0, 0), group_m=1):  # fmt: skip
    """Explicit tiles; ``split_k`` splits both GEMMs unless ``split2`` gives GEMM2's own (GEMM1's 0 = auto
    reaches GEMM2 as 0, which ``sanitize`` makes 1); ``persistent`` per GEMM."""
    g1, g2 = (
        kernel_configs.GemmConfig(block_n, block_k, group_m, 4, 2, swap_ab=s, tma=t, persistent=p)
        for s, t, p in zip(swap, tma, persistent, strict=True)
    )
    return kernel_configs.KernelConfig(block_m, g1, g2, split_k, split_k if split2 is None else split2)


def _check(cfg, weights, m, kernel_config, seed=1):
    x, ids, tw = random_inputs(cfg, m, DEVICE, seed=seed)
    out = _forward(cfg, weights, x, ids, tw, kernel_config)
    err = relative_l2(out, reference_for(cfg, weights, x, ids, tw))
    assert err <= tolerance(cfg.quant_scheme, cfg.dtype), (err, kernel_config)
    return out, (x, ids, tw)


SPLIT_CASES = [
    # scheme, dtype, activation, bias, router_on_input, top_k, H, I, block_k, split_k
    ("fp32" if not CUDA else "bf16", FLOAT, "silu", False, False, 2, 192, 96, 32, 2),
    ("fp32" if not CUDA else "bf16", FLOAT, "gelu", True, False, 2, 160, 64, 32, 3),  # uneven split of K
    ("fp32" if not CUDA else "bf16", FLOAT, "silu", False, True, 1, 128, 64, 32, 4),  # router on input, k=1
    ("mxfp4", HALF, "swiglu_oai", True, False, 2, 192, 96, 64, 2),
    ("mxfp4", HALF, "swiglu_oai", True, False, 2, 256, 128, 128, 4),
    ("mxfp4", HALF, "silu", False, False, 1, 128, 64, 64, 8),  # more splits than K tiles: empty slices
]


@pytest.mark.parametrize("scheme,dtype,act,bias,on_input,top_k,h,i,block_k,split", SPLIT_CASES)
def test_split_k_matches_reference_and_is_deterministic(scheme, dtype, act, bias, on_input, top_k, h, i, block_k,
                                                        split):  # fmt: skip
    cfg = MoeConfig(8, top_k, h, i, quant_scheme=scheme, activation=act, dtype=dtype, has_bias=bias,
                    apply_router_weight_on_input=on_input)  # fmt: skip
    weights = random_weights(cfg, DEVICE)
    out, inputs = _check(cfg, weights, 5, _kc(block_k, split))  # both GEMMs split
    assert torch.equal(_forward(cfg, weights, *inputs, _kc(block_k, split)), out)
    unsplit = _forward(cfg, weights, *inputs, _kc(block_k, 1))
    assert relative_l2(out, unsplit) <= tolerance(scheme, dtype)
    for one_gemm in (_kc(block_k, split, split2=1), _kc(block_k, 1, split2=split)):
        assert relative_l2(_forward(cfg, weights, *inputs, one_gemm), unsplit) <= tolerance(scheme, dtype)


@pytest.mark.parametrize("h,i,block_k", [(96, 160, 128), (160, 96, 256), (2880 // 10, 2880 // 10, 128)])
def test_mxfp4_chunk_loop_with_k_tails(h, i, block_k):
    """K = 96/160/288 are not multiples of 64: the last chunk is half padding, BLOCK_K overshoots K."""
    cfg = MoeConfig(4, 2, h, i, quant_scheme="mxfp4", activation="swiglu_oai", dtype=HALF, has_bias=True)
    _check(cfg, random_weights(cfg, DEVICE), 7, _kc(block_k, 1, block_n=64))


@pytest.mark.parametrize(
    "swap,split,block_k,block_n,block_m,h,i",
    [
        ((True, True), 1, 64, 64, 16, 192, 128),
        ((True, False), 2, 128, 64, 16, 256, 128),  # GEMM1 swapped and split, GEMM2 not
        ((False, True), 2, 64, 32, 32, 160, 96),  # GEMM2 swapped reading split partials; K tails
        ((True, True), 1, 256, 64, 16, 2880 // 10, 2880 // 10),
        ((True, False), 1, 64, 64, 64, 192, 128),  # 64-row blocks: GEMM2's bytes put in K order un-swapped
    ],
)
def test_mxfp4_swapped_operands_match_reference(swap, split, block_k, block_n, block_m, h, i):
    """``GemmConfig.swap_ab``: weights x rows^T accumulated transposed; same result as the plain order. The
    bytes' fragment order (``moe_triton.layout``) is undone in registers where a tile feeds a warp-group
    MMA (swapped, or 64 rows and more) and followed by the activations elsewhere: each case mixes both."""
    cfg = MoeConfig(8, 2, h, i, quant_scheme="mxfp4", activation="swiglu_oai", dtype=HALF, has_bias=True)
    weights = random_weights(cfg, DEVICE)
    out, inputs = _check(cfg, weights, 9, _kc(block_k, split, block_n, block_m, swap))
    plain = _forward(cfg, weights, *inputs, _kc(block_k, split, block_n, block_m))
    assert relative_l2(out, plain) <= tolerance("mxfp4", HALF) / 4


@pytest.mark.parametrize(
    "swap,split,block_k,block_n,block_m,persistent,tail",
    [
        ((True, True), 1, 64, 64, 16, (0, 0), 0),  # the swapped tiles of decode
        ((True, True), 2, 128, 64, 32, (0, 0), 0),  # split K, two chunks per K step
        ((False, False), 1, 64, 32, 64, (1, 1), 0),  # 64 rows unswapped: K in order too
        ((True, True), 1, 64, 64, 64, (1, 1), 32),  # walks with swapped few-row tails
        ((False, False), 1, 64, 64, 16, (0, 0), 0),  # K in stored order: the switch changes nothing
    ],
)
def test_mxfp4_whole_chunk_matches_halves(swap, split, block_k, block_n, block_m, persistent, tail):
    """``GemmConfig.whole_chunk``: one 64-deep MMA per MXFP4 chunk (``kernels.gemm._cat_k``) gives the
    forward two 32-deep MMAs give (the ``mxfp4_whole_chunk`` switch forcing it off), in every tile shape that
    takes K in order, and agrees with the oracle."""
    cfg = MoeConfig(8, 2, 192, 128, quant_scheme="mxfp4", activation="swiglu_oai", dtype=HALF, has_bias=True)
    weights = random_weights(cfg, DEVICE)
    g1, g2 = (
        kernel_configs.GemmConfig(block_n, block_k, 2, 4, 2, swap_ab=s, persistent=p, tail_m=tail, whole_chunk=True)
        for s, p in zip(swap, persistent, strict=True)
    )
    kc = kernel_configs.KernelConfig(block_m, g1, g2, split, split)
    with switches.override(mxfp4_whole_chunk=None):  # as the tiles say
        out, inputs = _check(cfg, weights, 70, kc)
    with switches.override(mxfp4_whole_chunk=False):
        halves = _forward(cfg, weights, *inputs, kc)
    assert relative_l2(out, halves) <= tolerance("mxfp4", HALF) / 8


DENSE_SCHEMES = ["bf16", "fp8_block"] if CUDA else ["fp32"]


@pytest.mark.parametrize("scheme", DENSE_SCHEMES)
@pytest.mark.parametrize(
    "swap,split,block_k,block_n,block_m,act,bias,on_input,top_k,h,i",
    [
        ((True, True), 1, 128, 64, 16, "silu", False, False, 2, 256, 128),
        ((True, False), 2, 128, 64, 16, "gelu", True, False, 2, 384, 192),  # GEMM1 swapped and split, GEMM2 not
        ((False, True), 1, 128, 128, 32, "silu", True, True, 1, 256, 320),  # K tails, router on input, k = 1
        ((True, True), 2, 128, 128, 16, "swiglu_oai", True, False, 2, 320, 256),  # both split: K tails
    ],
)
def test_dense_swapped_operands_match_reference(scheme, swap, split, block_k, block_n, block_m, act, bias, on_input,
                                                top_k, h, i):  # fmt: skip
    """``GemmConfig.swap_ab`` in the bf16/fp32 and fp8_block main loops (fp8: the transposed dot scaled by
    its row and column scales): the same forward as the plain order, within a quarter of the tolerance."""
    dtype = FLOAT if scheme != "fp8_block" else torch.bfloat16
    cfg = MoeConfig(8, top_k, h, i, quant_scheme=scheme, activation=act, dtype=dtype, has_bias=bias,
                    apply_router_weight_on_input=on_input)  # fmt: skip
    weights = random_weights(cfg, DEVICE)
    out, inputs = _check(cfg, weights, 9, _kc(block_k, split, block_n, block_m, swap))
    plain = _forward(cfg, weights, *inputs, _kc(block_k, split, block_n, block_m))
    assert relative_l2(out, plain) <= tolerance(scheme, dtype) / 4
    assert kernel_configs.sanitize(_kc(block_k, 1, swap=swap), scheme).gemm1.swap_ab is swap[0]


@pytest.mark.parametrize("scheme", DENSE_SCHEMES)
@pytest.mark.parametrize(
    "m,tma,swap,split,block_k,block_n,block_m,act,bias,top_k,h,i",
    [
        (9, (True, True), (False, False), 1, 64, 64, 16, "silu", False, 2, 160, 96),  # K and N tails
        (40, (True, True), (True, True), 1, 128, 64, 32, "gelu", True, 2, 256, 192),  # swapped, 32-row blocks
        (9, (True, False), (False, True), 2, 128, 128, 16, "swiglu_oai", True, 2, 384, 192),  # GEMM1 split
        (1, (True, True), (True, False), 2, 128, 64, 16, "silu", False, 4, 256, 128),  # direct: no TMA_A
        (24, (False, True), (False, False), 1, 128, 128, 64, "silu", True, 1, 256, 320),  # k = 1: by token
    ],
)
def test_tma_tiles_match_plain_loads(scheme, m, tma, swap, split, block_k, block_n, block_m, act, bias, top_k, h, i):
    """``GemmConfig.tma``: weight (and GEMM2's aligned intermediate) tiles through tensor descriptors give
    the forward the plain loads give — to fp32 rounding under the interpreter (the same tiles and dots);
    rows a descriptor reads past an expert's own N (GEMM1's up half, the next expert) reach no output,
    nor GEMM1's fp8 epilogue (128-wide tiles with ``I % 128 != 0``)."""
    dtype = FLOAT if scheme != "fp8_block" else torch.bfloat16
    cfg = MoeConfig(8, top_k, h, i, quant_scheme=scheme, activation=act, dtype=dtype, has_bias=bias)
    weights = random_weights(cfg, DEVICE)
    p = prepare_weights(scheme, weights)
    assert tma_mod.applies(True, scheme, p.gemm1().weight) and tma_mod.applies(True, scheme, p.gemm2().weight)
    out, inputs = _check(cfg, weights, m, _kc(block_k, split, block_n, block_m, swap, tma=tma))
    plain = _forward(cfg, weights, *inputs, _kc(block_k, split, block_n, block_m, swap))
    if CUDA:
        assert relative_l2(out, plain) <= tolerance(scheme, dtype) / 8
    else:
        assert relative_l2(out, plain) <= 1e-6  # rounding: NumPy sums a transposed tile in another order


@pytest.mark.parametrize(
    "scheme,m,persistent,tma,swap,block_k,block_n,block_m,act,bias,on_input,top_k,h,i,group_m",
    [
        ("dense", 40, (1, 1), (False, False), (False, False), 32, 32, 16, "silu", True, False, 2, 160, 96, 1),
        ("dense", 40, (1, 2), (True, True), (False, False), 64, 64, 32, "gelu", True, False, 2, 256, 192, 4),
        ("dense", 24, (1, 1), (False, True), (True, True), 64, 64, 16, "silu", True, True, 1, 128, 320, 2),  # k=1
        ("dense", 70, (0, 1), (True, True), (False, False), 32, 64, 64, "swiglu_oai", True, False, 2, 128, 64, 8),
        ("mxfp4", 40, (1, 1), (False, False), (True, False), 64, 64, 16, "swiglu_oai", True, False, 2, 192, 96, 1),
        ("mxfp4", 24, (2, 1), (False, False), (False, True), 128, 64, 32, "silu", False, True, 1, 256, 128, 2),
    ],
)
def test_persistent_tiles_match_one_program_per_tile(scheme, m, persistent, tma, swap, block_k, block_n, block_m,
                                                     act, bias, on_input, top_k, h, i, group_m):  # fmt: skip
    """``GemmConfig.persistent``: fewer programs than tiles, each walking the tiles in use, give the forward
    one program per tile gives — the same tiles and dots, so the same bits under the interpreter — with
    the null segment's pairs zero (k == 1: GEMM2 writes their rows) and the alignment's unused blocks
    never walked. A K split turns it off (it needs whole tiles)."""
    scheme = DENSE_SCHEMES[0] if scheme == "dense" else scheme
    dtype = (FLOAT if scheme != "fp8_block" else torch.bfloat16) if scheme != "mxfp4" else HALF
    cfg = MoeConfig(8, top_k, h, i, quant_scheme=scheme, activation=act, dtype=dtype, has_bias=bias,
                    apply_router_weight_on_input=on_input)  # fmt: skip
    weights = random_weights(cfg, DEVICE)
    kc = _kc(block_k, 1, block_n, block_m, swap, tma=tma, persistent=persistent, group_m=group_m)
    x, ids, tw = random_inputs(cfg, m, DEVICE)
    ids = ids.clone()
    ids[1] = -1  # every slot of token 1 in the null segment
    ids[3, 0] = 8
    out = _forward(cfg, weights, x, ids, tw, kc)
    err = relative_l2(out, reference_for(cfg, weights, x, ids, tw))
    assert err <= tolerance(scheme, dtype), err
    assert torch.equal(out[1], torch.zeros_like(out[1]))
    plain = _forward(cfg, weights, x, ids, tw, _kc(block_k, 1, block_n, block_m, swap, tma=tma, group_m=group_m))
    if CUDA:
        assert relative_l2(out, plain) <= tolerance(scheme, dtype) / 8
    else:
        assert torch.equal(out, plain)
    routing = launch.direct_routing(ids.reshape(-1).int(), tw.reshape(-1), top_k, block_m, on_input)
    assert launch._grid(100, kc.gemm1, routing, 1, x.device) == (100, False)  # direct: one program per tile
    aligned = AlignedRouting(tw.reshape(-1), ids, ids, ids, top_k, block_m, on_input)
    assert launch._grid(100, kc.gemm2, aligned, 2, x.device) == (200, False)  # split: one per tile and split
    assert launch._grid(100, kc.gemm2, aligned, 1, x.device)[1] is bool(persistent[1])


@pytest.mark.parametrize(
    "scheme,m,tail,tma,swap,block_k,block_n,block_m,act,bias,on_input,top_k,h,i",
    [
        ("dense", 70, 16, (False, False), (False, False), 32, 64, 32, "silu", True, False, 2, 160, 96),
        ("dense", 90, 16, (True, True), (False, False), 64, 64, 32, "swiglu_oai", True, False, 2, 128, 192),
        ("dense", 300, 32, (False, True), (False, False), 32, 32, 64, "gelu", False, True, 1, 128, 64),  # k=1
        ("dense", 90, 16, (False, False), (True, True), 32, 64, 32, "silu", False, False, 2, 96, 64),
        ("mxfp4", 70, 16, (False, False), (False, False), 64, 64, 32, "swiglu_oai", True, False, 2, 192, 128),
        ("mxfp4", 300, 32, (False, False), (True, False), 64, 64, 64, "silu", False, False, 1, 128, 64),
    ],
)
def test_tail_tiles_match_full_tiles(scheme, m, tail, tma, swap, block_k, block_n, block_m, act, bias, on_input,
                                     top_k, h, i):  # fmt: skip
    """``GemmConfig.tail_m``: the blocks whose pairs fit in their first ``tail_m`` rows run a ``tail_m``-row
    tile (swapped below 64 rows where BLOCK_N is at least 64) and give the forward the full tiles give; the
    routing holds blocks of both kinds (at, just above and below ``tail_m`` rows) and null-segment pairs."""
    scheme = DENSE_SCHEMES[0] if scheme == "dense" else scheme
    dtype = (FLOAT if scheme != "fp8_block" else torch.bfloat16) if scheme != "mxfp4" else HALF
    cfg = MoeConfig(8, top_k, h, i, quant_scheme=scheme, activation=act, dtype=dtype, has_bias=bias,
                    apply_router_weight_on_input=on_input)  # fmt: skip
    weights = random_weights(cfg, DEVICE)
    x, ids, tw = random_inputs(cfg, m, DEVICE)
    ids = ids.clone()
    ids[1] = -1  # every slot of token 1 in the null segment
    ids[3, 0] = 8
    counts = torch.bincount(ids[(ids >= 0) & (ids < 8)].long(), minlength=8).tolist()
    last = {c % block_m or block_m for c in counts if c}  # rows in each segment's last block
    assert min(last) <= tail < max(last), counts  # both tile kinds run

    def tiles(t):
        g1, g2 = (kernel_configs.GemmConfig(block_n, block_k, 2, 4, 2, swap_ab=s, tma=tm, persistent=1, tail_m=t)
                  for s, tm in zip(swap, tma, strict=True))  # fmt: skip
        return kernel_configs.KernelConfig(block_m, g1, g2, 1, 1)

    out = _forward(cfg, weights, x, ids, tw, tiles(tail))
    err = relative_l2(out, reference_for(cfg, weights, x, ids, tw))
    assert err <= tolerance(scheme, dtype), err
    assert torch.equal(out[1], torch.zeros_like(out[1]))
    full = _forward(cfg, weights, x, ids, tw, tiles(0))
    assert relative_l2(out, full) <= (tolerance(scheme, dtype) / 8 if CUDA else 1e-6)


@pytest.mark.parametrize("tail,block_m", [(8, 64), (24, 64), (64, 64), (128, 64)])
def test_tail_m_must_be_a_power_of_two_below_block_m(tail, block_m):
    g = kernel_configs.GemmConfig(tail_m=tail)
    with pytest.raises(ValueError, match="tail_m"):
        kernel_configs.KernelConfig(block_m, g, kernel_configs.GemmConfig())
    kernel_configs.KernelConfig(256, kernel_configs.GemmConfig(tail_m=64), kernel_configs.GemmConfig(tail_m=16))


@pytest.mark.skipif(not CUDA, reason="the shipped large-M walk tiles compile for CUDA only")
@pytest.mark.parametrize(
    "block_m,block_n1,block_n2,stages", [(128, 128, 128, 4), (128, 128, 256, 4), (64, 256, 256, 3)]
)
def test_persistent_walks_of_the_shipped_large_tiles_match_plain_tiles_on_cuda(block_m, block_n1, block_n2, stages):
    """The walk shapes the H200 table ships at large M (64- and 128-row blocks, 8 warps, descriptor loads, 1
    and 2 programs per SM so each walks many tiles), with a bias and the null segment: the forward of one
    program per tile. (A 256-wide GEMM1 tile of 128 rows needs more shared memory than an SM has.)"""
    cfg = MoeConfig(8, 2, 512, 256, quant_scheme="bf16", activation="silu", dtype=torch.bfloat16, has_bias=True)
    weights = random_weights(cfg, DEVICE)
    x, ids, tw = random_inputs(cfg, 3000, DEVICE)
    ids = ids.clone()
    ids[1] = -1

    def tiles(persistent):
        g1, g2 = (kernel_configs.GemmConfig(bn, 64, 8, 8, stages, tma=True, persistent=persistent)
                  for bn in (block_n1, block_n2))  # fmt: skip
        return kernel_configs.KernelConfig(block_m, g1, g2, 1, 1)

    plain = _forward(cfg, weights, x, ids, tw, tiles(0))
    ref = reference_for(cfg, weights, x, ids, tw)
    for persistent in (1, 2):
        walk = _forward(cfg, weights, x, ids, tw, tiles(persistent))
        assert relative_l2(walk, plain) <= tolerance("bf16", torch.bfloat16) / 8, persistent
        assert relative_l2(walk, ref) <= tolerance("bf16", torch.bfloat16), persistent
        assert torch.equal(walk[1], torch.zeros_like(walk[1]))


@pytest.mark.skipif(not CUDA, reason="the shipped large-M walk tiles compile for CUDA only")
@pytest.mark.parametrize("block_n1,block_n2,stages,tail1,tail2", [(128, 256, 4, 0, 32), (128, 256, 4, 64, 0),
                                                                  (128, 128, 4, 32, 64)])  # fmt: skip
def test_tail_tiles_of_the_shipped_walks_match_full_tiles_on_cuda(block_n1, block_n2, stages, tail1, tail2):
    """The H200 table's 128-row walks with few-row tiles (``GemmConfig.tail_m``) at about one block per
    expert, so some segments end in a block of a few rows and others in a nearly full one: the forward of
    the same walks without tails, and the reference."""
    cfg = MoeConfig(32, 2, 512, 256, quant_scheme="bf16", activation="silu", dtype=torch.bfloat16, has_bias=True)
    weights = random_weights(cfg, DEVICE)
    x, ids, tw = random_inputs(cfg, 2200, DEVICE)
    counts = torch.bincount(ids.reshape(-1).long(), minlength=32).tolist()
    last = [c % 128 or 128 for c in counts]
    assert min(last) <= 32 and max(last) > 64, counts  # both tile kinds run

    def tiles(tail_1, tail_2):
        g1, g2 = (kernel_configs.GemmConfig(bn, 64, 8, 8, stages, tma=True, persistent=1, tail_m=t)
                  for bn, t in ((block_n1, tail_1), (block_n2, tail_2)))  # fmt: skip
        return kernel_configs.KernelConfig(128, g1, g2, 1, 1)

    full = _forward(cfg, weights, x, ids, tw, tiles(0, 0))
    out = _forward(cfg, weights, x, ids, tw, tiles(tail1, tail2))
    assert relative_l2(out, full) <= tolerance("bf16", torch.bfloat16) / 8
    assert relative_l2(out, reference_for(cfg, weights, x, ids, tw)) <= tolerance("bf16", torch.bfloat16)


def test_tma_applies_only_to_what_a_descriptor_can_describe():
    """mxfp4, weights not stored back to back, or rows not a multiple of 16 bytes take the plain loads."""
    w = torch.zeros(4, 64, 32, dtype=FLOAT, device=DEVICE)
    assert tma_mod.applies(True, "bf16" if CUDA else "fp32", w)
    assert not tma_mod.applies(False, "bf16", w)
    assert not tma_mod.applies(True, "mxfp4", w)
    assert not tma_mod.applies(True, "bf16", w.transpose(1, 2))
    assert not tma_mod.applies(True, "bf16", torch.zeros(4, 64, 3, dtype=FLOAT, device=DEVICE))
    assert not tma_mod.rows_ok(w[:, :, 1:17])


def test_split_k_counters_are_zeroed_by_align_and_left_zero_by_the_gemms():
    """The split reductions' arrival counters: ``align(zero=...)`` clears them, and each tile's reducing
    program clears its own again, so repeated launches on one buffer (the tuner's replays) reduce every
    time, bitwise the same, and agree with the unsplit GEMMs."""
    from moe_triton.kernels.align import align, max_blocks

    scheme = "fp32" if not CUDA else "bf16"
    cfg = MoeConfig(8, 2, 192, 96, quant_scheme=scheme, activation="silu", dtype=FLOAT, has_bias=True)
    p = prepare_weights(scheme, random_weights(cfg, DEVICE))
    x, ids, tw = random_inputs(cfg, 5, DEVICE)
    tw = tw.reshape(-1).contiguous()
    n_blocks, g = max_blocks(10, 8, 16), _kc(32, 3).gemm1
    rows = n_blocks * 16
    scratch1, scratch2, counters = launch.split_scratch(n_blocks, 16, DEVICE, (3, 192, 96, 32), (2, 192, 192, 32))
    assert counters.numel() == n_blocks * 9 and scratch2[0].shape == (2, rows, 192)
    assert (scratch1.factor, scratch2.factor) == (3, 2)
    counters.fill_(7)
    routing = AlignedRouting(tw, *align(ids, 8, 16, zero=counters), top_k=2, block_m=16)
    assert not counters.any()
    with pytest.raises(ValueError, match="int32"):
        align(ids, 8, 16, zero=torch.zeros(4, device=DEVICE))

    def gemm1(split=None):
        out = torch.zeros(rows, 96, dtype=FLOAT, device=DEVICE)
        launch.launch_gemm1(x, p.gemm1(), routing, Activation("silu"), out, g, split=split)
        return out

    def gemm2(a, split=None):
        y = torch.zeros(10, 192, dtype=FLOAT, device=DEVICE)
        launch.launch_gemm2(a, p.gemm2(), routing, y, g, split=split)
        return y

    first = gemm1(scratch1)
    assert not counters.any()
    assert torch.equal(gemm1(scratch1), first)
    assert relative_l2(first, gemm1()) <= tolerance(scheme, FLOAT)
    y = gemm2(first, scratch2)
    assert not counters.any()
    assert torch.equal(gemm2(first, scratch2), y)
    assert relative_l2(y, gemm2(first)) <= tolerance(scheme, FLOAT)


def test_mxfp4_expert_with_shifted_scales():
    """An expert scaled up 2**12 has UE8M0 bytes above 128: its folded scales are shifted, undone by w*_mult."""
    cfg = MoeConfig(4, 2, 128, 64, quant_scheme="mxfp4", activation="silu", dtype=torch.float32)
    dense = random_weights(MoeConfig(4, 2, 128, 64, quant_scheme="fp32", dtype=torch.float32), DEVICE)
    dense.w13[1] *= 4096.0
    dense.w2[2] *= 4096.0
    from moe_core.quant import quantize_weights

    weights = quantize_weights(dense, "mxfp4")
    p = prepare_weights("mxfp4", weights)
    assert p.w13_mult[1].item() > 1.0 and p.w2_mult[2].item() > 1.0 and p.w13_mult[0].item() == 1.0
    for split in (1, 2):
        _check(cfg, weights, 6, _kc(64, split))


@pytest.mark.skipif(not CUDA, reason="fp8_block runs on CUDA only: the interpreter has no float8 dot")
@pytest.mark.parametrize(
    "block_n,i,swap",
    [
        (64, 192, False),  # up half starts mid-block, on a multiple of BLOCK_N: one scalar per tile
        (128, 192, False),  # up tiles straddle two blocks: a scale load per row
        (128, 256, False),  # every tile one block: scalars for gate and up
        (256, 256, False),  # two blocks per tile: per-row loads
        (128, 384, True),  # swapped: the scales run down the accumulator's rows
    ],
)
def test_fp8_block_scales_of_every_tile_alignment(block_n, i, swap):
    """``_col_scale``: each 128-row block of the weights scaled by its own factor (neighbours 2-16x apart, so a
    tile reading its neighbour's scale is far off), every way an N tile can lie on the scale blocks
    (``UP_ALIGNED``)."""
    from moe_core.quant import quantize_weights

    h = 256
    dense = random_weights(MoeConfig(8, 2, h, i, quant_scheme="bf16", dtype=torch.bfloat16), DEVICE)
    factors = torch.tensor([1.0, 4.0, 0.5, 2.0, 0.25, 3.0], device=DEVICE)
    for w in (dense.w13, dense.w2):
        rows = torch.arange(w.shape[1], device=DEVICE)
        w.mul_(factors[(rows // 128) % len(factors)][None, :, None])
    cfg = MoeConfig(8, 2, h, i, quant_scheme="fp8_block", dtype=torch.bfloat16)
    weights = quantize_weights(dense, "fp8_block")
    block_m = 16 if swap else 64
    _check(cfg, weights, 70, _kc(128, 1, block_n, block_m, (swap, swap)))


def test_prepared_weights_are_required_for_mxfp4():
    cfg = MoeConfig(4, 2, 64, 64, quant_scheme="mxfp4", dtype=torch.float32)
    w = random_weights(cfg, DEVICE)
    x, ids, tw = random_inputs(cfg, 2, DEVICE)
    out = torch.empty(2, 64, device=DEVICE)
    with pytest.raises(ValueError, match="prepared layout"):
        launch.run_fused_moe(x, ids, tw, GemmWeights("mxfp4", w.w13, w.w13_scale),
                             GemmWeights("mxfp4", w.w2, w.w2_scale), Activation("silu"), out)  # fmt: skip


def test_sanitize_leaves_gemm2_unsplit_for_split_0():
    assert kernel_configs.sanitize(_kc(64, 0), "bf16").split_k2 == 1
    assert kernel_configs.sanitize(_kc(64, 4), "bf16").split_k2 == 4


def test_split_k_heuristic():
    # deepseek-v3-tp8 at M=1: 8 experts x 256/32 N tiles = 64 programs on 132 SMs -> split 4 (256 programs)
    assert kernel_configs.split_k_for(8, 256, 7168, 256, 32, 128, 132) == 4
    # gpt-oss-120b at M=1 with BLOCK_N 64: 4 x 45 = 180 programs already fill 132 SMs
    assert kernel_configs.split_k_for(4, 128, 2880, 2880, 64, 64, 132) == 1
    # prefill-sized batches never split; the CPU (0 SMs) never splits on its own
    assert kernel_configs.split_k_for(4096, 8, 4096, 14336, 64, 64, 132) == 1
    assert kernel_configs.split_k_for(8, 256, 7168, 256, 32, 128, 0) == 1
    # K too short for more slices: at most two BLOCK_K tiles of K per split
    assert kernel_configs.split_k_for(1, 8, 512, 64, 64, 128, 132) == 2
    assert kernel_configs.sanitize(_kc(32, 0), "mxfp4").gemm1.block_k == 64
    assert kernel_configs.sanitize(_kc(96, 0), "mxfp4").gemm2.block_k == 128
    assert kernel_configs.sanitize(_kc(64, 0), "fp8_block").gemm1.block_k == 128


def test_tables_without_split_k_still_load():
    entry = {
        "block_m": 16,
        "gemm1": kernel_configs.GemmConfig().__dict__,
        "gemm2": kernel_configs.GemmConfig().__dict__,
    }
    kc = kernel_configs.KernelConfig.from_dict(entry)
    assert kc.split_k == 0  # decided at launch
    assert kernel_configs.KernelConfig.from_dict(kc.as_dict()) == kc
    slugs = sorted(p.stem for p in Path(kernel_configs.__file__).parent.glob("*.json"))
    assert "NVIDIA_H200" in slugs
    for slug in slugs:  # every entry of every shipped table parsed
        shipped = kernel_configs.shipped_table(slug)
        assert shipped and all(isinstance(c, kernel_configs.KernelConfig) for e in shipped.values() for c in e.values())


@pytest.mark.skipif(not CUDA, reason="fp8_block needs CUDA (the interpreter's fp8 dot is inexact)")
@pytest.mark.parametrize("split", [2, 4])
def test_fp8_block_split_k_on_cuda(split):
    cfg = MoeConfig(8, 2, 512, 256, quant_scheme="fp8_block", activation="silu", dtype=torch.bfloat16)
    weights = random_weights(cfg, DEVICE)
    out, inputs = _check(cfg, weights, 5, _kc(128, split))
    assert torch.equal(_forward(cfg, weights, *inputs, _kc(128, split)), out)


@pytest.mark.skipif(not CUDA, reason="the inline-PTX MXFP4 decode runs on CUDA only")
@pytest.mark.parametrize("m,split", [(5, 1), (5, 2), (1, 0)])
def test_mxfp4_inline_ptx_decode_on_cuda(m, split):
    cfg = MoeConfig(8, 2, 256, 192, quant_scheme="mxfp4", activation="swiglu_oai", dtype=torch.bfloat16, has_bias=True)
    weights = random_weights(cfg, DEVICE)
    with switches.override(mxfp4_asm=True):
        out, inputs = _check(cfg, weights, m, _kc(128, split, block_n=64))
    with switches.override(mxfp4_asm=False):
        assert torch.equal(_forward(cfg, weights, *inputs, _kc(128, split, block_n=64)), out)  # same bits as bit-ops


def test_automatic_split_k_is_off_by_default_and_a_pinned_split_still_applies(monkeypatch):
    cfg = kernel_configs.heuristic_config("bf16", 256, 7168, 256, 8, 1)
    monkeypatch.setattr(kernel_configs, "sm_count", lambda device: 132)  # an H200's SMs, so the heuristic would split
    assert switches.Switches().auto_split_k is False
    with switches.override(auto_split_k=False):
        assert kernel_configs.resolve_split_k("bf16", 256, 7168, 256, 8, 1, cfg, "cpu") == 1
    with switches.override(auto_split_k=True):
        assert kernel_configs.resolve_split_k("bf16", 256, 7168, 256, 8, 1, cfg, "cpu") > 1
    pinned = kernel_configs.KernelConfig(cfg.block_m, cfg.gemm1, cfg.gemm2, split_k=3)
    with switches.override(auto_split_k=False):
        assert kernel_configs.resolve_split_k("bf16", 256, 7168, 256, 8, 1, pinned, "cpu") == 3
    forced = switches.Switches(split_k=2)
    assert kernel_configs.resolve_split_k("bf16", 256, 7168, 256, 8, 1, pinned, "cpu", forced) == 2


def test_fp8_activation_group_quantization():
    """``quantize_fp8_groups`` uses ``_quant_fp8_rows``' formula: per token and 128 columns, amax / 448."""
    gen = torch.Generator().manual_seed(3)
    x = (torch.randn(5, 300, generator=gen) * 3).to(DEVICE, FLOAT)
    x[2, 128:256] = 0  # an all-zero group: the scale floor, codes 0
    q, s = launch.quantize_fp8_groups(x)
    assert q.dtype == torch.float8_e4m3fn and q.shape == x.shape and s.shape == (5, 3)
    groups = torch.nn.functional.pad(x.float(), (0, 84)).view(5, 3, 128)
    scale = groups.abs().amax(dim=2).clamp_min(1e-10) / 448.0
    assert torch.equal(s, scale)
    if CUDA:  # the interpreter's fp8 conversion misrounds values just below a power of two (124.3 -> 64)
        codes = (groups / scale[:, :, None]).to(torch.float8_e4m3fn).view(5, 384)[:, :300]
        assert torch.equal(q.view(torch.uint8), codes.view(torch.uint8))
    assert torch.all(q[2, 128:256].float() == 0)


@pytest.mark.parametrize("act,bias,split,i", [("silu", False, 1, 256), ("swiglu_oai", True, 2, 320)])
def test_gemm1_epilogue_quantizes_gemm2_input_as_a_separate_pass_would(act, bias, split, i):
    """fp8_block, GEMM1 tiles of whole 128-column groups (``launch.fp8_intermediate``): the codes and scales
    GEMM1's epilogue writes equal ``quantize_fp8_groups`` of the intermediate the same GEMM1 writes unquantized
    (I = 320: a last group of 64 columns; the padding rows are not compared). Runs under the interpreter too:
    both sides come from the same dot, so its inexact fp8 products do not matter."""
    dtype = torch.bfloat16 if CUDA else torch.float16
    cfg = MoeConfig(8, 2, 256, i, quant_scheme="fp8_block", activation=act, dtype=dtype, has_bias=bias)
    w13 = prepare_weights("fp8_block", random_weights(cfg, DEVICE)).gemm1()
    x, ids, tw = random_inputs(cfg, 6, DEVICE, seed=3)
    xq, xs = launch.quantize_fp8_groups(x)
    tiles = kernel_configs.GemmConfig(block_n=128, block_k=128, group_m=1, num_warps=4, num_stages=2)
    assert launch.fp8_intermediate("fp8_block", tiles) and not launch.fp8_intermediate("bf16", tiles)
    assert not launch.fp8_intermediate("fp8_block", kernel_configs.GemmConfig(block_n=64, block_k=128))
    from moe_triton.kernels.align import align, max_blocks

    rows = max_blocks(12, 8, 16) * 16
    routing = AlignedRouting(tw.reshape(-1).contiguous(), *align(ids, 8, 16), top_k=2, block_m=16)
    scratch = launch.split_scratch(rows // 16, 16, DEVICE, (split, 2 * i, i, 128))
    act_ = Activation(act, cfg.swiglu_alpha, cfg.swiglu_limit)
    plain = torch.empty(rows, i, dtype=dtype, device=DEVICE)
    codes = torch.empty(rows, i, dtype=torch.float8_e4m3fn, device=DEVICE)
    scales = torch.empty(rows, -(-i // 128), dtype=torch.float32, device=DEVICE)
    for out, kw in ((plain, {}), (codes, {"out_scale": scales, "round_to": dtype})):
        if scratch[-1] is not None:
            scratch[-1].zero_()
        launch.launch_gemm1(xq, w13, routing, act_, out, tiles, x_scale=xs, split=scratch[0], **kw)
    used = routing.sorted_ids < 12  # rows that hold a pair
    want_codes, want_scales = launch.quantize_fp8_groups(plain[used])
    assert torch.equal(scales[used], want_scales)
    assert torch.equal(codes[used].view(torch.uint8), want_codes.view(torch.uint8))
    with pytest.raises(ValueError, match="multiple of 128"):
        narrow = kernel_configs.GemmConfig(block_n=64, block_k=128)
        launch.launch_gemm1(xq, w13, routing, act_, codes, narrow, x_scale=xs, out_scale=scales, round_to=dtype)


@pytest.mark.skipif(not CUDA, reason="fp8_block needs CUDA (the interpreter's fp8 dot is inexact)")
@pytest.mark.parametrize("split,on_input,block_n", [(1, False, 32), (4, False, 32), (1, True, 32), (1, False, 128),
                                                    (2, False, 128)])  # fmt: skip
def test_fp8_block_activations_quantized_once_give_the_same_result(split, on_input, block_n):
    """GEMM1 reads codes quantized once per forward; with GEMM1 tiles of 128 columns GEMM2 reads the codes
    GEMM1's epilogue wrote instead of quantizing its K tile: the same result as quantizing in the loops."""
    cfg = MoeConfig(8, 1 if on_input else 2, 512, 256, quant_scheme="fp8_block", activation="silu",
                    dtype=torch.bfloat16, apply_router_weight_on_input=on_input)  # fmt: skip
    weights = random_weights(cfg, DEVICE)
    with switches.override(fp8_prequant=False):
        in_loop, inputs = _check(cfg, weights, 5, _kc(128, split, block_n))
    with switches.override(fp8_prequant=True):
        assert torch.equal(_forward(cfg, weights, *inputs, _kc(128, split, block_n)), in_loop)


# --- fp8_block scales under the interpreter -------------------------------------------------------------------


def _blocky_fp8_weights(cfg: MoeConfig, seed: int = 3):
    """fp8_block weights whose 128x128 blocks differ in magnitude by up to 100x, so a K step scaled by another
    block's scales is far off (random weights of one magnitude would hide it)."""
    from moe_core.quant import quantize_weights
    from moe_core.synthetic import random_canonical_weights

    dense = random_canonical_weights(cfg, DEVICE, seed, dtype=torch.float32)
    gen = torch.Generator().manual_seed(seed + 1)
    for name in ("w13", "w2"):
        w = getattr(dense, name)
        e, rows, cols = w.shape
        blocks = 10.0 ** (torch.rand(e, -(-rows // 128), -(-cols // 128), generator=gen) * 2 - 1)
        factor = blocks.repeat_interleave(128, 1).repeat_interleave(128, 2)[:, :rows, :cols]
        setattr(dense, name, (w * factor.to(w.device)).to(torch.bfloat16))
    return quantize_weights(dense, "fp8_block")


@pytest.mark.parametrize("prefetch", [True, False])
@pytest.mark.parametrize("prequant", [True, False])
@pytest.mark.parametrize(
    "swap,split,block_n,block_m",
    [((False, False), 1, 64, 16), ((True, True), 1, 128, 16), ((True, False), 2, 64, 16), ((False, True), 3, 128, 64)],
)
def test_fp8_block_k_steps_use_their_own_blocks_scales(prefetch, prequant, swap, split, block_n, block_m):
    """Which scales each K step multiplies, loaded in the step or, with the ``fp8_scale_prefetch`` switch, one
    step ahead (``kernels.gemm._fp8_scales1``; 16-row tiles only, so the 64-row case loads in the step either
    way): a step scaled by another block's would be off by up to 100x. The
    bound is loose because the interpreter's fp8 dot is inexact (about 10% here; see ``fused_op.probe``)."""
    cfg = MoeConfig(4, 2, 384, 256, quant_scheme="fp8_block", activation="silu", dtype=torch.float32)
    weights = _blocky_fp8_weights(cfg)
    x, ids, tw = random_inputs(cfg, 6, DEVICE, seed=2)
    with switches.override(fp8_prequant=prequant, fp8_scale_prefetch=prefetch):
        out = _forward(cfg, weights, x, ids, tw, _kc(128, split, block_n, block_m, swap))
    assert relative_l2(out, reference_for(cfg, weights, x, ids, tw)) < 0.2
