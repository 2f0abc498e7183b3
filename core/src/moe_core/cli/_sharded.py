"""The sharded layer a command's ranks run (``moe run``, ``moe bench``): checked before any rank starts, built
on every rank from the options, one batch spread over the ranks, the whole batch's output gathered, its
forwards timed the same way on every rank.

Every rank builds the same full random weights and the same batch (same seeds), keeps its shard
(``DispatchedRunner``) and brings the rows its dispatcher says (``Dispatcher.token_slice``); the rows'
outputs are gathered so that rank 0 can report and verify the whole batch against the single-process layer.
"""

from __future__ import annotations

import math
import time

#: the dispatcher of --tp/--ep when --a2a is not given
DEFAULT_DISPATCHER = "replicate"
#: a timing sample groups forwards lasting at least this long, at most ``MAX_GROUP`` of them
SAMPLE_TARGET_S = 1e-3
MAX_GROUP = 1000
WARMUP = 3


def dispatcher_names(args) -> list[str]:
    """The ``--a2a`` names asked for (a list for ``moe bench``, one for ``moe run``), default ``replicate``."""
    names = args.a2a if isinstance(args.a2a, list) else [args.a2a] if args.a2a else []
    return names or [DEFAULT_DISPATCHER]


def check_parallel(args, config) -> None:
    """Refuse a grid or dispatcher before any process starts: ``--tp``/``--ep`` below 1, a grid the layer
    cannot be sharded on, an unknown dispatcher (the error lists the installed ones)."""
    from moe_core.dispatch import get_dispatcher
    from moe_core.errors import InvalidInputError
    from moe_core.sharding import check_grid

    if args.tp < 1 or args.ep < 1:
        raise InvalidInputError("--tp and --ep must be >= 1")
    if args.a2a and args.tp * args.ep == 1:
        raise InvalidInputError("--a2a chooses how tokens move between ranks: it needs --tp or --ep above 1")
    check_grid(config, args.tp, args.ep)
    for name in dispatcher_names(args):
        get_dispatcher(name)


def sharded_runner(args, config, weights, dispatcher: str, backend: str | type = "auto"):
    """This rank's ``DispatchedRunner`` of the layer (inside the ranks' process group)."""
    from moe_core.distributed import DispatchedRunner

    return DispatchedRunner(config, weights, dispatcher=dispatcher, tp_size=args.tp, ep_size=args.ep, backend=backend)


def whole_output(layer, mine, num_tokens: int):
    """The output of the whole batch of ``num_tokens`` on every rank, from each rank's output ``mine`` on the
    rows it brought (``layer.token_slice``); ``InvalidInputError`` on every rank when the ranks' rows do not
    cover the batch once."""
    import torch
    import torch.distributed as dist

    from moe_core.errors import InvalidInputError

    group, world = layer.group, layer.world
    rows = layer.token_slice(num_tokens)
    spans: list[tuple[int, int] | None] = [None] * world
    dist.all_gather_object(spans, (rows.start, rows.stop), group=group)
    if all(span == (0, num_tokens) for span in spans):  # every rank brought, and holds, the whole batch
        return mine
    if sorted(i for a, b in spans for i in range(a, b)) != list(range(num_tokens)):
        raise InvalidInputError(f"the ranks' token slices {spans} do not cover the batch of {num_tokens} once")
    longest = max(b - a for a, b in spans)
    padded = mine.new_zeros(longest, mine.shape[1], dtype=torch.float32)
    padded[: mine.shape[0]] = mine.float()
    parts = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(parts, padded, group=group)
    whole = torch.empty(num_tokens, mine.shape[1], dtype=torch.float32, device=mine.device)
    for (a, b), part in zip(spans, parts):
        whole[a:b] = part[: b - a]
    return whole.to(mine.dtype)


def sample_forwards(forward, device, repeat: int, layer=None) -> tuple[list[float], int]:
    """(µs per forward of each of ``repeat`` samples, forwards per sample), eagerly: ``WARMUP`` forwards, one
    timed forward that sizes a sample (about ``SAMPLE_TARGET_S``), then each sample on this process's wall
    clock after a device synchronisation. Over ``layer``'s ranks the slowest rank's forward sizes the sample
    and each sample starts at a barrier, so every rank makes the same forwards (each pairs collectives, and an
    unpaired one hangs until the group's timeout); without a layer, in this process alone."""
    import torch
    import torch.distributed as dist

    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(WARMUP):
        forward()
    sync()
    start = time.perf_counter()
    forward()
    sync()
    once = time.perf_counter() - start
    if layer is not None:
        once = max(gather_from_ranks(layer, once))  # the slowest rank decides, so every rank makes the same calls
    calls = max(1, min(MAX_GROUP, math.ceil(SAMPLE_TARGET_S / max(once, 1e-9))))
    samples = []
    for _ in range(repeat):
        if layer is not None:
            dist.barrier(group=layer.group)
        start = time.perf_counter()
        for _ in range(calls):
            forward()
        sync()
        samples.append((time.perf_counter() - start) / calls * 1e6)
    return samples, calls


def gather_from_ranks(layer, value) -> list:
    """``value`` of every rank of ``layer``'s group, in rank order."""
    import torch.distributed as dist

    gathered: list = [None] * layer.world
    dist.all_gather_object(gathered, value, group=layer.group)
    return gathered


def median_us(samples: list[float]) -> float:
    from moe_core.timing import Timing

    return Timing.of(samples, "wall clock").median_us
