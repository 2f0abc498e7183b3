"""Expert ids outside ``[0, E)`` (``FusedOp.handles_invalid_ids``): such a (token, slot) pair contributes
exactly zero and reads no weight; valid pairs are computed exactly as without it.

``align`` puts these pairs in a null segment after the E experts; GEMM1 skips its blocks and GEMM2 writes
zeros for them. Every float buffer the forward allocates starts as NaN here and every int32 one as 2**30
(``_PoisonedTorch``), so a row or an index entry that the kernels fail to write cannot pass for zero.
Runs under the interpreter (fp32/fp16, mxfp4 with fp16 activations) and on CUDA (bf16).
"""

from __future__ import annotations

import pytest
import test_kernel_paths
import torch
from test_kernel_paths import DEVICE, FLOAT, HALF, _forward, _kc

from moe_core import MoeConfig, MoeRunner
from moe_core.reference import reference_for
from moe_core.synthetic import random_inputs, random_weights
from moe_core.tolerances import relative_l2, tolerance
from moe_triton import fused_op, launch
from moe_triton.fused_op import TritonFusedOp
from moe_triton.kernels import align as align_mod
from moe_triton.launch_args import Activation, AlignedRouting
from moe_triton.layout import prepare_weights

WIDE = "fp32" if FLOAT == torch.float32 else "bf16"
NARROW = "fp16" if HALF == torch.float16 else "bf16"
BAD = (-1, 8, 10**6, -5)  # for E = 8: "on another rank", then out of range above and below


class _PoisonedTorch:
    """``torch`` for the modules that allocate the forward's buffers: ``empty`` fills float tensors with NaN
    and int32 ones with 2**30; everything else is torch's own. (Patching ``torch.empty`` itself, even restored
    afterwards, broke torch.compile later in the same process: torch 2.11, test_gpu.py.)"""

    def __getattr__(self, name):
        return getattr(torch, name)

    @staticmethod
    def empty(*args, **kwargs):
        t = torch.empty(*args, **kwargs)
        if t.dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
            t.fill_(float("nan"))
        elif t.dtype == torch.int32:
            t.fill_(2**30)
        return t


@pytest.fixture(autouse=True)
def _poisoned_empty(monkeypatch):
    for module in (launch, align_mod, fused_op, test_kernel_paths):
        monkeypatch.setattr(module, "torch", _PoisonedTorch())


def _poison(ids: torch.Tensor, pairs, all_bad_tokens=()) -> torch.Tensor:
    """A copy of ``ids`` with the given (token, slot) pairs and every slot of ``all_bad_tokens`` set to ids
    outside ``[0, 8)``, cycling through ``BAD``."""
    out = ids.clone()
    cells = [*pairs, *((t, s) for t in all_bad_tokens for s in range(ids.shape[1]))]
    for n, (t, s) in enumerate(cells):
        out[t, s] = BAD[n % len(BAD)]
    return out


def _check_against_reference(cfg, weights, x, ids, tw, kernel_config):
    out = _forward(cfg, weights, x, ids, tw, kernel_config)
    assert torch.isfinite(out).all()
    err = relative_l2(out, reference_for(cfg, weights, x, ids, tw))
    assert err <= tolerance(cfg.quant_scheme, cfg.dtype), (err, kernel_config)
    return out


CASES = [
    # scheme, dtype, activation, bias, router_on_input, top_k, H, I, block_k, split_k, split_k2
    (WIDE, FLOAT, "silu", True, False, 2, 128, 64, 32, 1, 1),
    (WIDE, FLOAT, "gelu", True, True, 1, 128, 64, 32, 1, 1),  # k = 1: GEMM2 writes the output rows itself
    (NARROW, HALF, "silu", False, False, 2, 192, 96, 32, 3, 2),  # both GEMMs split, differently
    (WIDE, FLOAT, "silu", True, True, 1, 128, 64, 32, 4, 4),
    ("mxfp4", HALF, "swiglu_oai", True, False, 2, 192, 96, 64, 2, 2),
    ("mxfp4", HALF, "silu", True, True, 1, 128, 64, 64, 1, 1),
]


@pytest.mark.parametrize("scheme,dtype,act,bias,on_input,top_k,h,i,block_k,split,split2", CASES)
def test_invalid_ids_contribute_zero_and_leave_valid_tokens_bitwise_unchanged(
    scheme, dtype, act, bias, on_input, top_k, h, i, block_k, split, split2
):
    cfg = MoeConfig(8, top_k, h, i, quant_scheme=scheme, activation=act, dtype=dtype, has_bias=bias,
                    apply_router_weight_on_input=on_input)  # fmt: skip
    weights = random_weights(cfg, DEVICE)
    kc = _kc(block_k, split, split2=split2)
    x, ids, tw = random_inputs(cfg, 7, DEVICE)
    # token 0: its first slot; token 2: its last; tokens 1 and 4: every slot; 3, 5, 6 stay valid
    bad = _poison(ids, [(0, 0), (2, top_k - 1)], all_bad_tokens=(1, 4))
    out = _check_against_reference(cfg, weights, x, bad, tw, kc)
    for t in (1, 4) if top_k > 1 else (0, 1, 2, 4):  # every slot invalid: exactly zero, bias or not
        assert torch.equal(out[t], torch.zeros_like(out[t])), t
    clean = _forward(cfg, weights, x, ids, tw, kc)
    valid = [3, 5, 6]
    assert torch.equal(out[valid], clean[valid])  # other rows of the same tiles, same bits
    everything = torch.full_like(ids, -1)
    everything[::2] = 10**6
    assert torch.equal(_forward(cfg, weights, x, everything, tw, kc), torch.zeros_like(out))


@pytest.mark.parametrize("scheme,dtype,top_k", [(WIDE, FLOAT, 2), ("mxfp4", HALF, 1)])
def test_two_launch_alignment_sends_invalid_ids_to_the_null_segment(monkeypatch, scheme, dtype, top_k):
    """Above ``SINGLE_PROGRAM_PAIRS`` the alignment is two kernels: count, then plan and scatter (lowered here to 8
    pairs)."""
    monkeypatch.setattr(align_mod, "SINGLE_PROGRAM_PAIRS", 8)
    cfg = MoeConfig(8, top_k, 128, 64, quant_scheme=scheme, activation="silu", dtype=dtype, has_bias=True)
    weights = random_weights(cfg, DEVICE)
    x, ids, tw = random_inputs(cfg, 9, DEVICE)
    bad = _poison(ids, [(0, 0), (3, top_k - 1), (5, 0), (8, top_k - 1)], all_bad_tokens=(6,))
    block_k = 64 if scheme == "mxfp4" else 32
    out = _check_against_reference(cfg, weights, x, bad, tw, _kc(block_k, 2))
    assert torch.equal(out[6], torch.zeros_like(out[6]))
    assert torch.equal(_forward(cfg, weights, x, torch.full_like(ids, 8), tw, _kc(block_k, 1)), torch.zeros_like(out))


def test_null_segment_blocks_skip_gemm1_and_zero_their_gemm2_rows():
    """GEMM1 leaves the null segment's intermediate rows unwritten (it returns before any load); with k > 1
    GEMM2 leaves the invalid pairs' rows of ``[M*k, H]`` unwritten too (``_sum_slots`` leaves those slots
    out); neither touches a split-K counter for these blocks. (k == 1, where GEMM2 zeroes the token's output
    row itself, is covered by the forward tests.)"""
    cfg = MoeConfig(8, 2, 128, 64, quant_scheme=WIDE, activation="silu", dtype=FLOAT, has_bias=True)
    p = prepare_weights(WIDE, random_weights(cfg, DEVICE))
    x, ids, tw = random_inputs(cfg, 5, DEVICE)
    bad = _poison(ids, [(0, 0), (3, 1)], all_bad_tokens=(2,))
    tw = tw.reshape(-1).contiguous()
    n_blocks, g = align_mod.max_blocks(10, 8, 16), _kc(32, 2).gemm1
    scratch1, scratch2, counters = launch.split_scratch(n_blocks, 16, DEVICE, (2, 128, 64, 32), (2, 128, 128, 32))
    routing = AlignedRouting(tw, *align_mod.align(bad, 8, 16, zero=counters), top_k=2, block_m=16)
    null = slice(*routing.offsets[8:].tolist())
    assert null.stop - null.start == 16  # four invalid pairs, padded to one block
    inter = _PoisonedTorch.empty(n_blocks * 16, 64, dtype=FLOAT, device=DEVICE)
    launch.launch_gemm1(x, p.gemm1(), routing, Activation("silu"), inter, g, split=scratch1)
    assert inter[null].isnan().all()
    y = _PoisonedTorch.empty(10, 128, dtype=FLOAT, device=DEVICE)
    launch.launch_gemm2(inter, p.gemm2(), routing, y, g, split=scratch2)
    invalid = (bad.reshape(-1) < 0) | (bad.reshape(-1) >= 8)
    assert y[invalid].isnan().all() and torch.isfinite(y[~invalid]).all()
    assert not counters.any()


# one program; count, then plan and scatter, with one program each, then with five (each also fills its share);
# 64 experts (most segments empty) in one program and over five; 300 experts over one program (its 339 blocks'
# segments in six steps) and over two; 600 pairs capped at two programs of 512 (two steps of claims each);
# 1100 experts (the block segments found in 128-wide steps over the 2048 bins)
@pytest.mark.parametrize("pairs,count_pairs,e,cap", [(7, 1024, 8, 64), (40, 1024, 8, 64), (40, 8, 8, 64),
                                                     (9, 1024, 64, 64), (600, 128, 64, 64), (600, 1024, 300, 64),
                                                     (600, 512, 300, 64), (600, 16, 8, 2),
                                                     (600, 1024, 1100, 64)])  # fmt: skip
def test_align_builds_the_null_segment(monkeypatch, pairs, count_pairs, e, cap):
    monkeypatch.setattr(align_mod, "SINGLE_PROGRAM_PAIRS", 16)
    monkeypatch.setattr(align_mod, "COUNT_PAIRS", count_pairs)
    monkeypatch.setattr(align_mod, "ALIGN_PROGRAMS", cap)
    block_m = 16
    gen = torch.Generator().manual_seed(pairs)
    flat = torch.randint(0, e, (pairs,), generator=gen, dtype=torch.int32)
    flat[::3] = torch.tensor(BAD, dtype=torch.int32).repeat(pairs)[: len(flat[::3])]
    zero = torch.full((13,), 7, dtype=torch.int32, device=DEVICE)  # split-K counters: zeroed on the way
    aligned = align_mod.align(flat.view(-1, 1).to(DEVICE), e, block_m, zero=zero)
    sorted_ids, block_expert, offsets = (t.cpu() for t in aligned)
    assert not zero.any()
    segment = [x if 0 <= x < e else e for x in flat.tolist()]
    counts = [segment.count(s) for s in range(e + 1)]
    padded = [-(-c // block_m) * block_m for c in counts]
    starts = [sum(padded[:s]) for s in range(e + 1)]
    total = sum(padded)
    assert offsets.tolist() == [*starts, total]
    assert block_expert.numel() == align_mod.max_blocks(pairs, e, block_m) >= total // block_m
    null = sorted_ids[starts[e] : total].tolist()
    assert sorted(p for p in null if p < pairs) == [p for p, s in enumerate(segment) if s == e]
    assert null.count(pairs) == padded[e] - counts[e]
    assert block_expert[starts[e] // block_m : total // block_m].tolist() == [e] * (padded[e] // block_m)
    owners = [s for s in range(e + 1) for _ in range(padded[s] // block_m)]  # every block's segment, in order
    assert block_expert[: total // block_m].tolist() == owners
    assert set(block_expert[total // block_m :].tolist()) <= {e + 1}
    assert set(sorted_ids[total:].tolist()) <= {pairs}


def test_runner_passes_invalid_ids_to_the_kernels_unchecked():
    assert TritonFusedOp.handles_invalid_ids
    cfg = MoeConfig(8, 2, 128, 64, quant_scheme=WIDE, activation="silu", dtype=FLOAT, has_bias=True)
    weights = random_weights(cfg, DEVICE)
    runner = MoeRunner(cfg, weights, backend="triton", check_expert_ids=False)
    x, ids, tw = random_inputs(cfg, 3, DEVICE)
    bad = _poison(ids, [(0, 1)], all_bad_tokens=(2,))
    out = runner(x, bad, tw)
    assert relative_l2(out, reference_for(cfg, weights, x, bad, tw)) <= tolerance(WIDE, FLOAT)
    assert torch.equal(out[2], torch.zeros_like(out[2]))
