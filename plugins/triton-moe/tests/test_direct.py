"""Direct routing at decode (``kernel_configs.direct_decode``): no alignment, one GEMM row block per
(token, slot) pair, GEMM1 zeroing GEMM2's counters and GEMM2 summing the slots itself.

The direct forward must be bitwise the aligned one (same tiles, same per-row arithmetic, the slot sum in
the same order), for every scheme, with either GEMM splitting K, with ids outside ``[0, E)``, and with
k = 1 (GEMM2 straight into the output); it must launch no alignment and no slot-sum kernel. Runs under
the interpreter (fp32/fp16, mxfp4) and on CUDA (bf16, fp8_block, mxfp4).
"""

from __future__ import annotations

import pytest
import torch
from test_kernel_paths import CUDA, DEVICE, FLOAT, HALF, _forward, _kc

from moe_core import MoeConfig
from moe_core.reference import reference_for
from moe_core.synthetic import random_inputs, random_weights
from moe_core.tolerances import relative_l2, tolerance
from moe_triton import kernel_configs, launch, switches

DENSE = "bf16" if CUDA else "fp32"

CASES = [
    # scheme, dtype, activation, bias, router_on_input, top_k, tokens, split_k, split_k2, invalid ids
    (DENSE, FLOAT, "silu", False, False, 2, 1, 1, 1, False),
    (DENSE, FLOAT, "swiglu_oai", True, False, 4, 1, 2, 2, True),  # both GEMMs split, one slot on no expert
    (DENSE, FLOAT, "gelu", False, False, 2, 2, 1, 3, True),  # two tokens, GEMM2 split unevenly
    (DENSE, FLOAT, "silu", False, True, 1, 1, 2, 1, False),  # k = 1: GEMM2 writes the output itself
    (DENSE, FLOAT, "silu", True, False, 1, 1, 1, 2, True),  # k = 1 and its only slot invalid: zeros
    ("fp16" if not CUDA else "bf16", HALF, "silu", False, False, 4, 2, 1, 1, False),
    ("mxfp4", HALF, "swiglu_oai", True, False, 2, 1, 2, 1, True),
    ("mxfp4", HALF, "swiglu_oai", True, False, 4, 2, 1, 2, False),
]
if CUDA:  # the interpreter's fp8 dot is inexact
    CASES += [
        ("fp8_block", torch.bfloat16, "silu", False, False, 4, 1, 4, 1, True),
        ("fp8_block", torch.bfloat16, "silu", True, False, 2, 2, 1, 2, False),
    ]


def _config(scheme, dtype, act, bias, on_input, top_k):
    fp8 = scheme == "fp8_block"
    return MoeConfig(64, top_k, 256 if fp8 else 128, 256 if fp8 else 96, quant_scheme=scheme, activation=act,
                     dtype=dtype, has_bias=bias, apply_router_weight_on_input=on_input)  # fmt: skip


@pytest.mark.parametrize("scheme,dtype,act,bias,on_input,top_k,m,split,split2,invalid", CASES)
def test_direct_forward_is_the_aligned_forward_bitwise(scheme, dtype, act, bias, on_input, top_k, m, split, split2,
                                                       invalid):  # fmt: skip
    cfg = _config(scheme, dtype, act, bias, on_input, top_k)
    assert kernel_configs.direct_decode(m, top_k, cfg.num_experts)
    weights = random_weights(cfg, DEVICE, seed=3)
    x, ids, tw = random_inputs(cfg, m, DEVICE, seed=4)
    if invalid:
        ids[0, -1] = -1  # "on another rank": contributes exactly zero
    block_k = 128 if scheme in ("mxfp4", "fp8_block") else 32
    tiles = _kc(block_k, split, split2=split2)
    with switches.override(direct=True):
        direct = _forward(cfg, weights, x, ids, tw, tiles)
        assert torch.equal(_forward(cfg, weights, x, ids, tw, tiles), direct)  # deterministic
    with switches.override(direct=False):
        aligned = _forward(cfg, weights, x, ids, tw, tiles)
    assert torch.equal(direct, aligned)
    err = relative_l2(direct, reference_for(cfg, weights, x, ids, tw))
    assert err <= tolerance(scheme, dtype), err


def test_a_token_with_no_expert_here_is_zero():
    cfg = _config(DENSE, FLOAT, "silu", True, False, 2)
    weights = random_weights(cfg, DEVICE)
    x, ids, tw = random_inputs(cfg, 2, DEVICE)
    ids[1] = -1
    with switches.override(direct=True):
        out = _forward(cfg, weights, x, ids, tw, _kc(32, 2, split2=2))
    assert not out[1].any() and out[0].abs().sum() > 0


def test_direct_forward_launches_only_the_two_gemms(monkeypatch):
    """No alignment and no ``_sum_slots`` launch; GEMM1 gets GEMM2's counters to zero, GEMM2 the slot sum."""
    calls = []

    def refuse(*args, **kwargs):
        raise AssertionError("the direct forward ran the alignment")

    class NoSumSlots:
        def __getitem__(self, grid):
            raise AssertionError("the direct forward launched _sum_slots")

    real1, real2 = launch.launch_gemm1, launch.launch_gemm2

    def gemm1(*args, **kwargs):
        calls.append(("gemm1", kwargs.get("zero") is not None, kwargs.get("split") is not None))
        return real1(*args, **kwargs)

    def gemm2(*args, **kwargs):
        calls.append(("gemm2", kwargs.get("slot_sum") is not None, kwargs.get("split") is not None))
        return real2(*args, **kwargs)

    monkeypatch.setattr(launch.align, "align", refuse)
    monkeypatch.setattr(launch.gemm, "_sum_slots", NoSumSlots())
    monkeypatch.setattr(launch, "launch_gemm1", gemm1)
    monkeypatch.setattr(launch, "launch_gemm2", gemm2)
    cfg = _config(DENSE, FLOAT, "silu", False, False, 4)
    weights = random_weights(cfg, DEVICE)
    x, ids, tw = random_inputs(cfg, 1, DEVICE)
    with switches.override(direct=True):
        out = _forward(cfg, weights, x, ids, tw, _kc(32, 1, split2=2))
        # GEMM1 splitting K needs its counters zero before it starts: a memset, and GEMM1 zeroes nothing
        split = _forward(cfg, weights, x, ids, tw, _kc(32, 2, split2=1))
    assert calls == [("gemm1", True, False), ("gemm2", True, True), ("gemm1", False, True), ("gemm2", True, False)]
    assert relative_l2(out, split) <= tolerance(DENSE, FLOAT)


def test_direct_decode_rule():
    assert kernel_configs.direct_decode(1, 2, 8)  # one token: its experts are distinct
    assert kernel_configs.direct_decode(2, 8, 128)  # 16 pairs over 128 experts: repeats are rare
    assert not kernel_configs.direct_decode(3, 8, 128)
    assert not kernel_configs.direct_decode(8, 2, 8)  # mixtral-like: every expert would be read twice
    assert switches.Switches().direct is True


def test_direct_routing_is_refused_where_it_does_not_apply():
    cfg = _config(DENSE, FLOAT, "silu", False, False, 2)
    x, ids, tw = random_inputs(cfg, 1, DEVICE)
    flat = ids.reshape(-1).to(torch.int32).contiguous()
    from moe_triton.kernels.align import align
    from moe_triton.launch_args import AlignedRouting, SlotSum

    aligned = AlignedRouting(tw.reshape(-1).contiguous(), *align(flat, 64, 16), top_k=2, block_m=16)
    y = torch.empty(2, 128, dtype=FLOAT, device=DEVICE)
    a = torch.empty(64, 96, dtype=FLOAT, device=DEVICE)
    from moe_triton.layout import prepare_weights

    p = prepare_weights(DENSE, random_weights(cfg, DEVICE))
    tiles = _kc(32, 1).gemm1
    counters = torch.zeros(8, dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match="direct routing"):
        launch.launch_gemm1(x, p.gemm1(), aligned, launch.Activation("silu"), a, tiles, zero=counters)
    with pytest.raises(ValueError, match="direct routing"):
        launch.launch_gemm2(a, p.gemm2(), aligned, y, tiles, slot_sum=SlotSum(y[:1], counters))
