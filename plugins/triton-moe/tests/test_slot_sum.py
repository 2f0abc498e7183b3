"""GEMM2 summing the k slots itself under aligned routing (the ``slot_sum`` switch, ``_tile_slot_sum``):
a tile holds pairs of many tokens, each counted in at its token's counter, and a token's last pair to
finish sums its rows. The forward must be bitwise the one with the separate ``_sum_slots`` launch. The
forward's buffers start as NaN (float) and 2**30 (int32, the counters too) (``_PoisonedTorch``), so a slot
summed before its row was stored, or a counter nobody zeroed, cannot pass."""

from __future__ import annotations

import pytest
import torch
from test_expert_ids import _PoisonedTorch

from moe_core import MoeConfig
from moe_core.reference import reference_for
from moe_core.synthetic import random_inputs, random_weights
from moe_core.tolerances import relative_l2, tolerance
from moe_triton import kernel_configs, launch, switches
from moe_triton.kernels import align as align_mod
from moe_triton.launch_args import Activation
from moe_triton.layout import prepare_weights

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
FLOAT = torch.bfloat16 if CUDA else torch.float32
HALF = torch.bfloat16 if CUDA else torch.float16


@pytest.fixture(autouse=True)
def _poisoned_empty(monkeypatch):
    for module in (launch, align_mod):
        monkeypatch.setattr(module, "torch", _PoisonedTorch())


def _tiles(block_m, block_n, block_k, split=1, persistent=0, tail=0, swap=False):
    g1 = kernel_configs.GemmConfig(32, block_k, 2, 4, 2)
    g2 = kernel_configs.GemmConfig(block_n, block_k, 2, 4, 2, swap_ab=swap, persistent=persistent, tail_m=tail)
    return kernel_configs.KernelConfig(block_m, g1, g2, 1, split)


def _forward(cfg, p, x, ids, tw, kc, slot_sum: bool):
    out = torch.full((x.shape[0], cfg.hidden_size), float("nan"), dtype=cfg.dtype, device=x.device)
    with switches.override(slot_sum=slot_sum, direct=False):
        launch.run_fused_moe(x, ids, tw, p.gemm1(), p.gemm2(),
                             Activation(cfg.activation, cfg.swiglu_alpha, cfg.swiglu_limit), out,
                             router_on_input=cfg.apply_router_weight_on_input, config=kc)  # fmt: skip
    return out


class _CountSumSlots:
    """Stands in for ``gemm._sum_slots`` and counts its launches (then runs the real kernel)."""

    def __init__(self, real):
        self.real, self.launches = real, 0

    def __getitem__(self, grid):
        self.launches += 1
        return self.real[grid]


@pytest.mark.parametrize(
    "scheme,top_k,m,block_m,block_n,block_k,split,persistent,tail,swap",
    [
        ("dense", 2, 40, 16, 32, 32, 1, 0, 0, False),
        ("dense", 4, 33, 16, 64, 32, 2, 0, 0, False),  # split K: the last split's program sums
        ("dense", 2, 70, 32, 64, 32, 1, 1, 16, False),  # a walk with few-row tiles
        ("dense", 3, 50, 16, 32, 32, 1, 2, 0, True),  # swapped operands, two programs per SM
        ("mxfp4", 2, 40, 16, 64, 64, 1, 1, 0, False),
    ],
)
def test_gemm2_slot_sum_is_bitwise_the_separate_launch(monkeypatch, scheme, top_k, m, block_m, block_n, block_k,
                                                       split, persistent, tail, swap):  # fmt: skip
    """With null-segment pairs (a token with every slot invalid, single invalid slots) and a token whose two
    slots name the same expert (two rows of one tile count in at one counter): the same bits as
    ``_sum_slots``, the reference's result, and the counters left zero (a second forward agrees)."""
    scheme = "fp32" if scheme == "dense" and not CUDA else "bf16" if scheme == "dense" else scheme
    dtype = HALF if scheme == "mxfp4" else FLOAT
    cfg = MoeConfig(8, top_k, 128, 64, quant_scheme=scheme, activation="silu", dtype=dtype, has_bias=True)
    weights = random_weights(cfg, DEVICE)
    p = prepare_weights(scheme, weights)
    x, ids, tw = random_inputs(cfg, m, DEVICE)
    ids = ids.clone()
    ids[1] = -1  # every slot of token 1 in the null segment
    ids[3, 0] = 8
    ids[5, 1] = ids[5, 0]  # one expert twice
    kc = _tiles(block_m, block_n, block_k, split, persistent, tail, swap)
    counting = _CountSumSlots(launch.gemm._sum_slots)
    monkeypatch.setattr(launch.gemm, "_sum_slots", counting)
    separate = _forward(cfg, p, x, ids, tw, kc, slot_sum=False)
    assert counting.launches == 1
    fused = _forward(cfg, p, x, ids, tw, kc, slot_sum=True)
    assert counting.launches == 1  # GEMM2 summed the slots itself
    assert torch.equal(fused, separate)
    assert torch.equal(fused[1], torch.zeros_like(fused[1]))
    assert relative_l2(fused, reference_for(cfg, weights, x, ids, tw)) <= tolerance(scheme, dtype)
    assert torch.equal(_forward(cfg, p, x, ids, tw, kc, slot_sum=True), fused)  # counters were left at zero


def test_slot_sum_applies_to_k_above_one_only():
    """k == 1 writes each pair's row into its token's row: nothing to sum, so no counters are asked for."""
    cfg = MoeConfig(8, 1, 128, 64, quant_scheme="fp32" if not CUDA else "bf16", activation="silu", dtype=FLOAT)
    weights = random_weights(cfg, DEVICE)
    p = prepare_weights(cfg.quant_scheme, weights)
    x, ids, tw = random_inputs(cfg, 24, DEVICE)
    out = _forward(cfg, p, x, ids, tw, _tiles(16, 32, 32), slot_sum=True)
    assert relative_l2(out, reference_for(cfg, weights, x, ids, tw)) <= tolerance(cfg.quant_scheme, FLOAT)


@pytest.mark.skipif(not CUDA, reason="the shipped large-M walk tiles compile for CUDA only")
@pytest.mark.parametrize("block_n2,tail", [(256, 32), (128, 0)])
def test_slot_sum_in_the_shipped_walks_on_cuda(block_n2, tail):
    """The H200 table's 128-row GEMM2 walks at Qwen3-like routing (128 experts, top 8): thousands of tokens
    counted in concurrently by many programs, bitwise the separate launch."""
    cfg = MoeConfig(128, 8, 512, 256, quant_scheme="bf16", activation="silu", dtype=torch.bfloat16)
    weights = random_weights(cfg, DEVICE)
    p = prepare_weights("bf16", weights)
    x, ids, tw = random_inputs(cfg, 2048, DEVICE)
    g1 = kernel_configs.GemmConfig(128, 64, 8, 8, 4, tma=True, persistent=1)
    g2 = kernel_configs.GemmConfig(block_n2, 64, 8, 8, 4, tma=True, persistent=1, tail_m=tail)
    kc = kernel_configs.KernelConfig(128, g1, g2, 1, 1)
    separate = _forward(cfg, p, x, ids, tw, kc, slot_sum=False)
    for _ in range(3):
        assert torch.equal(_forward(cfg, p, x, ids, tw, kc, slot_sum=True), separate)
