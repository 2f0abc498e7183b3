"""Running a command's work on several ranks: spawned here, or the ranks ``torchrun`` started.

``run_ranks(fn, args, world, timeout)`` calls ``fn(args, rank, device)`` on every rank inside an initialised
``torch.distributed`` process group and returns rank 0's result (None on the other ranks under torchrun).
Under ``torchrun`` (``WORLD_SIZE`` / ``RANK`` in the environment) this process is one rank: ``env://``
initialisation, and ``WORLD_SIZE`` must equal ``world``. Otherwise ``world`` processes are spawned on this
machine with a free loopback port: gloo on the CPU, NCCL with one GPU per rank on CUDA. A rank that raises ends
the run with its error; a rank that stops answering ends it after ``timeout`` seconds (the group's timeout),
never a hang.
"""

from __future__ import annotations

import datetime
import json
import os
import socket
import tempfile
from pathlib import Path


def run_ranks(fn, args, world: int, timeout: float):
    import torch

    from moe_core.errors import InvalidInputError

    on_cuda = (args.device or ("cuda" if torch.cuda.is_available() else "cpu")).startswith("cuda")
    if on_cuda and torch.cuda.device_count() < world and "WORLD_SIZE" not in os.environ:
        raise InvalidInputError(
            f"{world} ranks on CUDA need {world} GPUs here, {torch.cuda.device_count()} are visible"
        )
    if "WORLD_SIZE" in os.environ:  # torchrun
        if int(os.environ["WORLD_SIZE"]) != world:
            raise InvalidInputError(f"torchrun started {os.environ['WORLD_SIZE']} ranks; --tp x --ep asks for {world}")
        rank = int(os.environ["RANK"])
        return _in_group(fn, args, rank, world, "env://", timeout, on_cuda, int(os.environ.get("LOCAL_RANK", rank)))
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="moe-ranks-") as tmp:
        out = Path(tmp) / "rank0.json"
        mp.spawn(_spawned, args=(fn, args, world, _free_port(), timeout, on_cuda, str(out)), nprocs=world, join=True)
        return json.loads(out.read_text())


def _spawned(rank, fn, args, world, port, timeout, on_cuda, out) -> None:
    result = _in_group(fn, args, rank, world, f"tcp://127.0.0.1:{port}", timeout, on_cuda, rank)
    if rank == 0:
        Path(out).write_text(json.dumps(result))


def _in_group(fn, args, rank, world, init_method, timeout, on_cuda, local_rank):
    import torch
    import torch.distributed as dist

    device = torch.device("cuda", local_rank) if on_cuda else torch.device("cpu")
    if on_cuda:
        torch.cuda.set_device(device)
    dist.init_process_group(
        "nccl" if on_cuda else "gloo", init_method=init_method, rank=rank, world_size=world,
        timeout=datetime.timedelta(seconds=timeout),
    )  # fmt: skip
    try:
        return fn(args, rank, device)
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
