"""Running a command's work on several ranks: spawned here, or the ranks ``torchrun`` started.

``run_ranks(fn, args, world, timeout)`` calls ``fn(args, rank, device)`` on every rank inside an initialised
``torch.distributed`` process group and returns rank 0's result (None on the other ranks under torchrun).
Under ``torchrun`` (``WORLD_SIZE`` / ``RANK`` in the environment) this process is one rank: ``env://``
initialisation, and ``WORLD_SIZE`` must equal ``world``; torchrun's agent watches its workers. Otherwise
``world`` processes are spawned on this machine with a free loopback port: gloo on the CPU, NCCL with one GPU
per rank on CUDA, and this process watches them. Each rank leaves its outcome in a file (its result, or the
error it raised); a rank that ends without one died (a signal, ``os._exit``, the out-of-memory killer). At the
first rank that fails or dies the others get a short grace to fail on their own (their errors are reported
too) and are then stopped, and ``RankError`` names the rank and its error, a rank's own ``MoeError`` first.
A rank that stops answering without dying ends the others' collectives after ``timeout`` seconds (the group's
timeout): never a hang.
"""

from __future__ import annotations

import datetime
import json
import os
import socket
import tempfile
import time
from pathlib import Path

#: seconds the other ranks get to end by themselves once one has failed, before they are stopped
GRACE_S = 2.0


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
    with tempfile.TemporaryDirectory(prefix="moe-ranks-") as tmp:
        return _spawn_and_watch(fn, args, world, timeout, on_cuda, Path(tmp))


def _spawn_and_watch(fn, args, world: int, timeout: float, on_cuda: bool, folder: Path):
    import multiprocessing
    import multiprocessing.connection

    ctx = multiprocessing.get_context("spawn")
    port = _free_port()
    procs = [
        ctx.Process(target=_spawned, args=(r, fn, args, world, port, timeout, on_cuda, str(folder)), daemon=False)
        for r in range(world)
    ]
    for p in procs:
        p.start()
    try:
        running = {p.sentinel: r for r, p in enumerate(procs)}
        while running:
            for sentinel in multiprocessing.connection.wait(list(running)):
                rank = running.pop(sentinel)
                procs[rank].join()
                if _outcome(folder, rank, procs[rank].exitcode).get("error"):
                    raise _failure(folder, procs, _stop(procs, GRACE_S))
        return _outcome(folder, 0, 0)["result"]
    finally:
        _stop(procs, 0.0)


def _spawned(rank, fn, args, world, port, timeout, on_cuda, folder) -> None:
    """One spawned rank: its outcome goes to ``rank<r>.json`` (written whole, then renamed into place)."""
    try:
        outcome = {"result": _in_group(fn, args, rank, world, f"tcp://127.0.0.1:{port}", timeout, on_cuda, rank)}
    except BaseException as exc:  # reported through the file; the exit code says it failed
        from moe_core.errors import MoeError

        outcome = {"error": f"{type(exc).__name__}: {exc}", "moe_error": isinstance(exc, MoeError)}
    path = Path(folder) / f"rank{rank}.json"
    path.with_suffix(".tmp").write_text(json.dumps(outcome))
    path.with_suffix(".tmp").replace(path)
    if "error" in outcome:
        os._exit(1)  # skip interpreter teardown: a half-initialised backend must not hang the exit


def _outcome(folder: Path, rank: int, exitcode: int | None, stopped: bool = False) -> dict:
    """What rank ``rank`` left (its result or error); a rank that ended without a file, unless this process
    stopped it, died."""
    path = folder / f"rank{rank}.json"
    if path.exists():
        return json.loads(path.read_text())
    if stopped:
        return {"error": "was stopped after another rank failed"}
    how = f"signal {-exitcode}" if exitcode < 0 else f"exit code {exitcode}"
    return {"error": f"died ({how}) before finishing its part of the run", "died": True}


def _failure(folder: Path, procs, stopped: set[int]):
    """``RankError`` naming the failed ranks: first the cause — a rank's own ``MoeError``, else a rank that
    died, else the first that failed — in full, then the others (whose collectives broke because of it), cut
    short."""
    from moe_core.errors import RankError

    failed = [(r, _outcome(folder, r, p.exitcode, r in stopped)) for r, p in enumerate(procs)]
    failed = [(r, o) for r, o in failed if o.get("error")]
    failed.sort(key=lambda ro: (not ro[1].get("moe_error"), not ro[1].get("died"), ro[0] in stopped, ro[0]))
    first, outcome = failed[0]
    lines = [f"rank {first} of {len(procs)} {'' if outcome.get('died') else 'failed: '}{outcome['error']}"]
    lines += [f"  rank {r}: {_short(o['error'])}" for r, o in failed[1:]]
    return RankError("\n".join(lines))


def _short(error: str, limit: int = 300) -> str:
    """A consequence's error cut to its start (a broken collective's message runs long)."""
    return error if len(error) <= limit else error[:limit] + " ..."


def _stop(procs, grace: float) -> set[int]:
    """Let the living ranks end within ``grace`` seconds, then terminate (and at last kill) the rest; the
    ranks it had to stop."""
    deadline = time.monotonic() + grace
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    stopped = {r for r, p in enumerate(procs) if p.is_alive()}
    for r in stopped:
        procs[r].terminate()
    for p in procs:
        p.join(5.0)
        if p.is_alive():
            p.kill()
            p.join()
    return stopped


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
