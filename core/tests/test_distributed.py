"""``moe_core.distributed.ShardedRunner`` on gloo: 2 and 4 spawned CPU processes, each holding one shard, all
tokens on every rank, outputs all-reduced; every rank's output equals the single-process layer.

Routing is skewed on purpose (most tokens to the first rank's experts, one ``-1`` pair), and with EP=4 some
ranks receive no token for their experts.
"""

from __future__ import annotations

import socket
import sys

import pytest
import torch
import torch.multiprocessing as mp

from moe_core import MoeConfig, MoeRunner
from moe_core.synthetic import random_inputs, random_weights
from moe_core.tolerances import relative_l2

pytestmark = pytest.mark.skipif(
    not torch.distributed.is_available() or sys.platform == "win32", reason="needs torch.distributed with gloo"
)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _in_gloo(rank: int, world: int, port: int, case: dict, body) -> None:
    """A spawned rank: ``body(rank, case)`` inside a gloo group of ``world`` ranks (60 s collective timeout)."""
    import datetime

    import torch.distributed as dist

    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
        timeout=datetime.timedelta(seconds=60),
    )  # fmt: skip
    try:
        body(rank, case)
    finally:
        dist.destroy_process_group()


def _replicated(rank: int, case: dict) -> None:
    from moe_core.distributed import ShardedRunner

    hidden = case["hidden"] + (32 if case.get("mismatch") and rank == 1 else 0)
    cfg = MoeConfig(8, 2, hidden, 256, quant_scheme=case["scheme"], dtype=case["dtype"])
    weights = random_weights(cfg, seed=3)  # the same full weights on every rank
    x, ids, tw = random_inputs(cfg, 12, seed=4)
    ids[:8] = torch.tensor([0, 1], dtype=torch.int32)  # skewed: most tokens to the first experts
    ids[9, 1] = -1
    sharded = ShardedRunner(cfg, weights, tp_size=case["tp"], ep_size=case["ep"], backend="torch")
    out = sharded(x, ids, tw)
    full = MoeRunner(cfg, weights, backend="torch")(x, ids, tw)
    err = relative_l2(out.float(), full.float())
    assert out.dtype == cfg.dtype and err < case["tol"], f"rank {rank}: rel. L2 {err}"


def _spawn(case: dict, world: int, body=None) -> None:
    mp.spawn(_in_gloo, args=(world, _port(), case, body or _replicated), nprocs=world, join=True)


def _all_to_all(rank: int, case: dict) -> None:
    """Each rank brings its own slice of one global batch (sizes ``case["split"]``, zeros allowed)."""
    from moe_core.distributed import AllToAllRunner

    cfg = MoeConfig(8, 2, 128, 256, quant_scheme=case["scheme"], dtype=case["dtype"], has_bias=True)
    weights = random_weights(cfg, seed=3)
    split = case["split"]
    x, ids, tw = random_inputs(cfg, sum(split), seed=4)
    ids[: sum(split) // 2] = torch.tensor([7, 6], dtype=torch.int32)  # skewed to the last rank's experts
    ids[1, 0] = -1
    full = MoeRunner(cfg, weights, backend="torch")(x, ids, tw)
    lo = sum(split[:rank])
    mine = slice(lo, lo + split[rank])
    out = AllToAllRunner(cfg, weights, placement=case.get("placement"), backend="torch")(x[mine], ids[mine], tw[mine])
    assert out.shape == (split[rank], 128) and out.dtype == cfg.dtype
    if split[rank]:
        err = relative_l2(out.float(), full[mine].float())
        assert err < case["tol"], f"rank {rank}: rel. L2 {err}"


A2A = [
    ([7, 5], "fp32", torch.float32, 1e-5, None),
    ([6, 0, 4, 2], "fp32", torch.float32, 1e-5, None),  # a rank with no tokens of its own
    ([3, 3, 3, 3], "bf16", torch.bfloat16, 1e-2, [(7,), (0, 1, 2), (3, 4), (5, 6)]),  # a given placement
]


@pytest.mark.parametrize("split,scheme,dtype,tol,placement", A2A, ids=["2-ranks", "4-ranks-one-empty", "4-ranks-bf16"])
def test_all_to_all_equals_the_single_process_layer(split, scheme, dtype, tol, placement):
    case = dict(split=split, scheme=scheme, dtype=dtype, tol=tol, placement=placement)
    _spawn(case, len(split), _all_to_all)


CASES = [
    (2, 1, "fp32", torch.float32, 1e-5),
    (1, 2, "fp32", torch.float32, 1e-5),
    (1, 4, "fp32", torch.float32, 1e-5),
    (2, 2, "fp32", torch.float32, 1e-5),
    (2, 2, "bf16", torch.bfloat16, 1e-2),  # the sum is float32; each rank's partial is rounded to bf16 once
    (2, 2, "mxfp4", torch.float32, 1e-5),
]


@pytest.mark.parametrize("tp,ep,scheme,dtype,tol", CASES, ids=[f"tp{c[0]}-ep{c[1]}-{c[2]}" for c in CASES])
def test_sharded_layer_equals_the_single_process_layer(tp, ep, scheme, dtype, tol):
    _spawn(dict(tp=tp, ep=ep, scheme=scheme, dtype=dtype, hidden=128, tol=tol), tp * ep)


def test_ranks_given_different_layers_fail_with_a_reason_not_a_hang():
    with pytest.raises(Exception, match="were given another layer or grid than rank 0"):
        _spawn(dict(tp=1, ep=2, scheme="fp32", dtype=torch.float32, hidden=128, tol=1e-5, mismatch=True), 2)


def test_without_a_process_group_it_says_so():
    from moe_core.distributed import ShardedRunner
    from moe_core.errors import InvalidInputError

    cfg = MoeConfig(8, 2, 128, 256, quant_scheme="fp32", dtype=torch.float32)
    with pytest.raises(InvalidInputError, match="initialised torch.distributed process group"):
        ShardedRunner(cfg, random_weights(cfg), tp_size=2)


def test_moe_run_tp2_ep2_on_the_cpu_verifies():
    import json
    import subprocess

    proc = subprocess.run(
        [sys.executable, "-m", "moe_core.cli", "run", "--preset", "small", "--tp", "2", "--ep", "2", "--verify",
         "--json", "--device", "cpu"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert report["verified"] is True and report["ranks"] == 4 and report["dispatcher"] == "replicate"
    assert report["rank0_tokens"] == report["tokens"]  # replicate: every rank brings the whole batch


def _moe(*argv: str, timeout: float = 300):
    import subprocess

    return subprocess.run([sys.executable, "-m", "moe_core.cli", *argv], capture_output=True, text=True,
                          timeout=timeout)  # fmt: skip


def test_moe_run_all_to_all_spreads_the_batch_and_verifies():
    import json

    proc = _moe("run", "--ep", "2", "--a2a", "all_to_all", "--tokens", "7", "--dtype", "fp32", "--verify", "--json",
                "--device", "cpu")  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert report["verified"] is True and report["rel_l2_error"] < 1e-5
    assert report["dispatcher"] == "all_to_all" and report["dispatcher_distribution"] == "moe-core"
    assert report["rank0_tokens"] == 4 and report["ranks"] == 2  # rank 0 brought its 4 of the 7 tokens


def test_moe_run_names_the_installed_dispatchers_for_an_unknown_one():
    proc = _moe("run", "--ep", "2", "--a2a", "nosuch", "--device", "cpu", timeout=120)
    assert proc.returncode == 2
    assert "dispatcher 'nosuch' is not installed" in proc.stderr and "moe-core:all_to_all" in proc.stderr


def test_a_dispatchers_refusal_on_the_ranks_is_reported_by_rank():
    proc = _moe("run", "--tp", "2", "--a2a", "all_to_all", "--device", "cpu", timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "rank 0 of 2 failed: PluginError" in proc.stderr and "pure expert parallelism" in proc.stderr


def test_moe_run_refuses_a_grid_before_spawning():
    import subprocess

    proc = subprocess.run(
        [sys.executable, "-m", "moe_core.cli", "run", "--preset", "small", "--tp", "3", "--device", "cpu"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2 and "tp_size=3 does not divide the intermediate size I=256" in proc.stderr


# ---- bad input across ranks: a clear error within a timeout, never a hang -------------------------------------


def _given_shards(rank: int, case: dict) -> None:
    """Each rank given its own ``Shard`` runs the layer; a rank given another's shard, or other full weights,
    is an error on every rank (one world for the three)."""
    from moe_core.distributed import ShardedRunner
    from moe_core.errors import InvalidInputError
    from moe_core.sharding import shard_weights

    cfg = MoeConfig(8, 2, 64, 128, quant_scheme="fp32", dtype=torch.float32)
    weights = random_weights(cfg, seed=3)
    x, ids, tw = random_inputs(cfg, 9, seed=4)
    own = shard_weights(cfg, weights, ep_rank=rank, ep_size=2)
    out = ShardedRunner(cfg, own, ep_size=2, backend="torch")(x, ids, tw)
    assert relative_l2(out, MoeRunner(cfg, weights, backend="torch")(x, ids, tw)) < 1e-5
    first = shard_weights(cfg, weights, ep_rank=0, ep_size=2)  # rank 1 loads rank 0's shard
    with pytest.raises(InvalidInputError, match=r"ranks \[1\] were given weights that are not their shard") as info:
        ShardedRunner(cfg, first, ep_size=2, backend="torch")
    assert "the shard of tp_rank 0/1, ep_rank 0/2 (experts [0, 1, 2, 3]); this rank is tp_rank 0/1, ep_rank 1/2" in str(
        info.value
    )
    other = random_weights(cfg, seed=3 + rank)  # rank 1 read another checkpoint
    with pytest.raises(InvalidInputError, match="were given another layer or grid than rank 0") as info:
        ShardedRunner(cfg, other, ep_size=2, backend="torch")
    assert "weights=w13[8, 256, 64]" in str(info.value)


def test_a_rank_given_another_ranks_shard_or_other_weights_fails_on_every_rank():
    _spawn({}, 2, _given_shards)


def _rank_one_fails(args, rank, device):
    """A rank of ``run_ranks`` (``args.how``): rank 1 dies or hangs mid-forward while rank 0 waits for it."""
    import os
    import time

    from moe_core.distributed import ShardedRunner

    cfg = MoeConfig(8, 2, 64, 128, quant_scheme="fp32", dtype=torch.float32)
    layer = ShardedRunner(cfg, random_weights(cfg, seed=3), ep_size=2, backend="torch")
    x, ids, tw = random_inputs(cfg, 4, seed=4)
    layer(x, ids, tw)
    if rank == 1:
        if args.how == "exits":
            os._exit(0)  # ends "successfully", as a rank whose process was told to stop might
        time.sleep(600)  # stops answering without dying
    for _ in range(3):
        layer(x, ids, tw)  # rank 0 waits in the all-reduce for rank 1
    return {"ok": True}


@pytest.mark.parametrize("how", ["exits", "hangs"])
def test_a_rank_that_dies_or_hangs_mid_forward_ends_the_run_with_its_name(how):
    import argparse
    import time

    from moe_core.cli._ranks import run_ranks
    from moe_core.errors import RankError

    start = time.monotonic()
    with pytest.raises(RankError) as info:
        run_ranks(_rank_one_fails, argparse.Namespace(device="cpu", how=how), 2, timeout=4 if how == "hangs" else 60)
    took = time.monotonic() - start
    text = str(info.value)
    if how == "exits":  # the watch notices at once, long before the 60 s collective timeout
        assert text.startswith("rank 1 of 2 died (exit code 0) before finishing") and took < 30, (took, text)
        assert "\n  rank 0: " in text  # its collective broke when rank 1 went (or it was stopped)
    else:  # rank 0's collective times out after 4 s; the sleeping rank is stopped
        assert text.startswith("rank 0 of 2 failed: ") and "rank 1: was stopped after another rank failed" in text
        assert took < 40, (took, text)
