"""The triton backend as the local experts of a sharded layer: two spawned gloo ranks, the kernels under Triton's
CPU interpreter (``TRITON_INTERPRET=1`` from ``conftest.py``, inherited by the spawned processes; the
interpreter is not thread-safe, separate processes are fine), float32 at toy shapes.

One world runs both of core's dispatchers: ``replicate`` over TP=2 (each rank half of ``I``, the triton
kernels on a ``-1`` for nothing) and ``all_to_all`` over EP=2 (each rank its own tokens, top-1 pairs on its
experts), each equal to the single-process triton layer within 1e-5.
"""

from __future__ import annotations

import datetime
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


def _rank(rank: int, port: int) -> None:
    import torch.distributed as dist

    from moe_core.distributed import AllToAllRunner, ShardedRunner

    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=120)
    )
    try:
        cfg = MoeConfig(4, 2, 32, 64, quant_scheme="fp32", dtype=torch.float32, has_bias=True)
        weights = random_weights(cfg, seed=3)
        x, ids, tw = random_inputs(cfg, 6, seed=4)
        ids[:3] = torch.tensor([0, 1], dtype=torch.int32)  # skewed to EP rank 0's experts
        ids[4, 1] = -1
        full = MoeRunner(cfg, weights, backend="triton")(x, ids, tw)
        tp = ShardedRunner(cfg, weights, tp_size=2, backend="triton")
        assert tp.runner.backend == "triton" and tp.runner.config.intermediate_size == 32
        err = relative_l2(tp(x, ids, tw), full)
        assert err < 1e-5, f"rank {rank} TP=2: rel. L2 {err}"
        ep = AllToAllRunner(cfg, weights, backend="triton")
        mine = ep.token_slice(6)
        err = relative_l2(ep(x[mine], ids[mine], tw[mine]), full[mine])
        assert ep.runner.backend == "triton" and err < 1e-5, f"rank {rank} EP=2: rel. L2 {err}"
    finally:
        dist.destroy_process_group()


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter case; on CUDA the GPU tests cover triton")
def test_sharded_triton_layers_equal_the_single_process_one_under_the_interpreter():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_rank, args=(port,), nprocs=2, join=True)
