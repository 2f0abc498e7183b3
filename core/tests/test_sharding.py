"""``moe_core.sharding``: every rank's shard run on its own, the partial outputs summed, equals the whole layer.

Single process: each shard gets its own ``MoeRunner`` (torch backend) and the ids of its experts
(``local_ids``, ``-1`` elsewhere); the sum over all ranks stands in for the all-reduce the dispatchers do.
"""

from __future__ import annotations

import pytest
import torch

from moe_core import MoeConfig, MoeRunner
from moe_core.errors import InvalidInputError
from moe_core.quant import dequantize_weights
from moe_core.sharding import check_placement, contiguous_placement, local_id_table, local_ids, shard_weights
from moe_core.synthetic import random_inputs, random_weights
from moe_core.tolerances import relative_l2

# I = 256: halves and quarters fall on every scheme's blocks (fp8_block's 128, mxfp4's 32, nvfp4's 16)
E, K, H, I = 8, 2, 256, 256  # noqa: E741 - the canonical names


def config(scheme="fp32", dtype=torch.float32, **kw):
    return MoeConfig(E, K, H, I, quant_scheme=scheme, dtype=dtype, **kw)


def sharded_output(cfg, weights, x, ids, tw, tp, ep, placement=None):
    out = torch.zeros(x.shape[0], H, dtype=torch.float32)
    for tp_rank in range(tp):
        for ep_rank in range(ep):
            shard = shard_weights(
                cfg, weights, tp_rank=tp_rank, tp_size=tp, ep_rank=ep_rank, ep_size=ep, placement=placement
            )
            runner = MoeRunner(shard.config, shard.weights, backend="torch")
            out += runner(x, local_ids(ids, local_id_table(shard.experts, E)), tw).float()
    return out


GRIDS = [(2, 1), (1, 2), (1, 4), (2, 2)]


@pytest.mark.parametrize("tp,ep", GRIDS, ids=[f"tp{t}-ep{e}" for t, e in GRIDS])
@pytest.mark.parametrize("bias", [False, True])
def test_fp32_shards_sum_to_the_layer(tp, ep, bias):
    cfg = config(has_bias=bias)
    weights = random_weights(cfg, seed=3)
    x, ids, tw = random_inputs(cfg, 13, seed=4)
    full = MoeRunner(cfg, weights, backend="torch")(x, ids, tw)
    assert relative_l2(sharded_output(cfg, weights, x, ids, tw, tp, ep), full) < 1e-5


@pytest.mark.parametrize("scheme", ["mxfp4", "nvfp4", "fp8_block"])
def test_quantized_shards_dequantize_to_exact_slices(scheme):
    """Nothing is requantized: a shard's stored blocks and scales are slices of the layer's."""
    cfg = config(scheme)
    weights = random_weights(cfg, seed=5)
    w13, w2 = dequantize_weights(weights, scheme)
    shard = shard_weights(cfg, weights, tp_rank=1, tp_size=2, ep_rank=1, ep_size=2)
    s13, s2 = dequantize_weights(shard.weights, scheme)
    assert torch.equal(s13, torch.cat([w13[4:, 128:256], w13[4:, 256 + 128 :]], dim=1))
    assert torch.equal(s2, w2[4:, :, 128:256])


@pytest.mark.parametrize("scheme", ["mxfp4", "fp8_block"])
@pytest.mark.parametrize("tp,ep", [(2, 1), (2, 2)])
def test_quantized_shards_sum_to_the_layer(scheme, tp, ep):
    """The sum matches to fp32 rounding where the activations' quantization also falls on a shard's blocks:
    mxfp4 is W4A16; fp8_block quantizes activations per 128 along K, which a 128-aligned slice keeps. (nvfp4
    is W4A4 with a dynamic scale from the amax of GEMM2's whole input row, which a TP rank sees only a slice
    of: sharded, it is a different quantization — served nvfp4 uses a static calibrated input scale.)"""
    cfg = config(scheme)
    weights = random_weights(cfg, seed=5)
    x, ids, tw = random_inputs(cfg, 9, seed=6)
    full = MoeRunner(cfg, weights, backend="torch")(x, ids, tw)
    assert relative_l2(sharded_output(cfg, weights, x, ids, tw, tp, ep), full) < 1e-5


def test_bf16_shards_within_the_scheme_tolerance():
    cfg = config("bf16", torch.bfloat16)
    weights = random_weights(cfg, seed=7)
    x, ids, tw = random_inputs(cfg, 11, seed=8)
    full = MoeRunner(cfg, weights, backend="torch")(x, ids, tw)
    # each rank rounds its partial sum to bf16 once before the sum: about one bf16 ulp (2**-8) of error
    assert relative_l2(sharded_output(cfg, weights, x, ids, tw, 2, 2), full.float()) < 1e-2


def test_skewed_routing_minus_one_ids_and_a_given_placement():
    cfg = config()
    weights = random_weights(cfg, seed=9)
    x, ids, tw = random_inputs(cfg, 10, seed=10)
    ids = torch.where(torch.arange(10)[:, None] < 7, torch.tensor([[6, 1]], dtype=torch.int32), ids)  # rank-skewed
    ids[8, 1] = -1  # a pair on no rank contributes nothing, sharded or not
    placement = [(6, 1, 7), (0, 2, 3, 4, 5)]  # rank 0 holds most of the traffic; rank 1 some tokens only
    full = MoeRunner(cfg, weights, backend="torch")(x, ids, tw)
    assert relative_l2(sharded_output(cfg, weights, x, ids, tw, 1, 2, placement), full) < 1e-5
    assert relative_l2(sharded_output(cfg, weights, x, ids, tw, 2, 2, placement), full) < 1e-5


def test_local_ids_and_placements():
    ids = torch.tensor([[0, 5], [7, -1], [3, 4]], dtype=torch.int32)
    assert local_ids(ids, local_id_table((4, 5, 6, 7), 8)).tolist() == [[-1, 1], [3, -1], [-1, 0]]
    assert local_ids(ids, local_id_table((3, 0), 8)).tolist() == [[1, -1], [-1, -1], [0, -1]]
    assert contiguous_placement(8, 3) == [(0, 1, 2), (3, 4, 5), (6, 7)]
    shard = shard_weights(config(), random_weights(config()), ep_rank=2, ep_size=3)
    assert shard.experts == (6, 7) and shard.config.num_experts == 2 and shard.config.intermediate_size == I


def test_b2_is_added_once():
    cfg = config(has_bias=True)
    weights = random_weights(cfg, seed=11)
    zero, one = (shard_weights(cfg, weights, tp_rank=r, tp_size=2).weights.b2 for r in (0, 1))
    assert torch.equal(zero, weights.b2) and not one.any()


def test_shards_own_their_storage():
    cfg = config()
    weights = random_weights(cfg)
    shard = shard_weights(cfg, weights, tp_rank=0, tp_size=2, ep_rank=0, ep_size=2)
    for t in shard.weights.tensors().values():
        assert t.is_contiguous() and t.untyped_storage().data_ptr() != weights.w13.untyped_storage().data_ptr()


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(tp_size=3), "does not divide"),
        (dict(tp_size=0), "tp_size must be an int >= 1"),
        (dict(tp_rank=2, tp_size=2), "tp_rank=2 is outside"),
        (dict(ep_size=9), "larger than the 8 experts"),
        (dict(ep_rank=-1, ep_size=2), "ep_rank=-1 is outside"),
        (dict(ep_size=2, placement=[(0, 1, 2), (3, 4, 5, 6)]), r"missing \[7\]"),
        (dict(ep_size=2, placement=[(0, 1, 2, 3), (3, 4, 5, 6, 7)]), r"on several ranks \[3\]"),
        (dict(ep_size=3, placement=[tuple(range(8)), ()]), "at least one expert"),
        (dict(ep_size=3, placement=[(0, 1, 2, 3), (4, 5, 6, 7)]), "lists 2 ranks, ep_size is 3"),
        (
            dict(ep_size=2, placement=[(0,), (1, 2, 3, 4, 5, 6, 7)]),
            r"EP ranks \[0\] would hold fewer experts than top_k=2",
        ),
    ],
)
def test_bad_grids_are_refused(kwargs, match):
    with pytest.raises(InvalidInputError, match=match):
        shard_weights(config(), random_weights(config()), **kwargs)


def test_a_split_off_the_scale_blocks_is_refused():
    cfg = config("fp8_block")
    with pytest.raises(InvalidInputError, match=r"I=64, not a multiple of the scale block along w13's rows \(128\)"):
        shard_weights(cfg, random_weights(cfg), tp_size=4)


def test_check_placement_out_of_range():
    with pytest.raises(InvalidInputError, match=r"out of range \[9\]"):
        check_placement([(0, 9)], 2)
