"""One rank's part of a MoE layer: canonical weights sharded for tensor and expert parallelism.

Tensor parallelism (``tp_size``) splits every expert's intermediate size ``I``: a rank holds rows
``[r*I/tp, (r+1)*I/tp)`` of the gate half and the same rows of the up half of ``w13`` (so its ``w13`` stays
``[gate; up]``) and those columns of ``w2``; its output is a partial sum, and the ranks' outputs summed (an
all-reduce) are the layer's. ``b2`` is added once: rank 0 keeps it, the others hold zeros. Expert
parallelism (``ep_size``) splits the experts: a rank holds the experts of its placement (contiguous ranges by
default, or any map that gives every expert to exactly one rank), in that order, and sees every other
expert's id as ``-1`` (``local_id_table``, ``local_ids``), which contributes zero on every backend (the
expert-id contract).
Both combine: rank ``(tp_rank, ep_rank)`` holds its experts' ``I`` slice.

Quantized schemes shard their stored bytes and scales as they are — nothing is requantized, so a shard
dequantizes to exactly the slice of the full layer — which needs the slice to fall on the scheme's blocks
(``moe_core.schemes``): ``I/tp`` a multiple of the scale block along ``N`` (``w13`` rows) and along ``K``
(``w2`` columns) and of the packing. A per-expert global scale (nvfp4) goes with its expert. Activations
quantized with a dynamic scale over a whole row (nvfp4's W4A4 GEMM2 input) are not shard-invariant: a TP
rank sees only its slice of that row; served nvfp4 uses a static calibrated input scale, which is.

Pure tensor work, no process group: the dispatchers that move tokens between ranks build on it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from moe_core.config import MoeConfig
from moe_core.errors import InvalidInputError
from moe_core.schemes import scheme_spec
from moe_core.weights import MoeWeights, validate_weights


@dataclass(frozen=True)
class Shard:
    """What one rank holds: the local ``config`` (``num_experts`` = its experts, ``intermediate_size`` =
    ``I/tp``) and ``weights``, the global ids of its ``experts`` in local order, and its place in the grid."""

    config: MoeConfig
    weights: MoeWeights
    experts: tuple[int, ...]
    tp_rank: int = 0
    tp_size: int = 1
    ep_rank: int = 0
    ep_size: int = 1


def contiguous_placement(num_experts: int, ep_size: int) -> list[tuple[int, ...]]:
    """Experts per rank as contiguous ranges, the first ``E % ep`` ranks one expert more."""
    _positive("ep_size", ep_size)
    if ep_size > num_experts:
        raise InvalidInputError(f"ep_size={ep_size} is larger than the {num_experts} experts")
    base, extra = divmod(num_experts, ep_size)
    out, start = [], 0
    for r in range(ep_size):
        n = base + (r < extra)
        out.append(tuple(range(start, start + n)))
        start += n
    return out


def check_placement(placement: Sequence[Sequence[int]], num_experts: int) -> list[tuple[int, ...]]:
    """``placement`` as tuples, refused unless every expert ``0..E-1`` is on exactly one rank and none is empty."""
    ranks = [tuple(int(e) for e in experts) for experts in placement]
    flat = [e for experts in ranks for e in experts]
    if sorted(flat) != list(range(num_experts)):
        missing = sorted(set(range(num_experts)) - set(flat))
        twice = sorted({e for e in flat if flat.count(e) > 1})
        outside = sorted({e for e in flat if not 0 <= e < num_experts})
        raise InvalidInputError(
            f"an expert placement must give each of the {num_experts} experts to exactly one rank: "
            f"missing {missing}, on several ranks {twice}, out of range {outside}"
        )
    if any(not experts for experts in ranks):
        raise InvalidInputError("an expert placement must give every rank at least one expert")
    return ranks


def shard_weights(
    config: MoeConfig,
    weights: MoeWeights,
    *,
    tp_rank: int = 0,
    tp_size: int = 1,
    ep_rank: int = 0,
    ep_size: int = 1,
    placement: Sequence[Sequence[int]] | None = None,
) -> Shard:
    """The shard of rank ``(tp_rank, ep_rank)`` (see the module docstring); the tensors are new (contiguous
    copies), so the full weights can be dropped. ``placement``: experts per EP rank (default contiguous)."""
    validate_weights(config, weights)
    _positive("tp_size", tp_size)
    _positive("ep_size", ep_size)
    if not 0 <= tp_rank < tp_size:
        raise InvalidInputError(f"tp_rank={tp_rank} is outside [0, tp_size={tp_size})")
    if not 0 <= ep_rank < ep_size:
        raise InvalidInputError(f"ep_rank={ep_rank} is outside [0, ep_size={ep_size})")
    if placement is None:
        ranks = contiguous_placement(config.num_experts, ep_size)
    else:
        ranks = check_placement(placement, config.num_experts)
        if len(ranks) != ep_size:
            raise InvalidInputError(f"the placement lists {len(ranks)} ranks, ep_size is {ep_size}")
    experts = ranks[ep_rank]
    short = [r for r, held in enumerate(ranks) if len(held) < config.top_k]
    if short:
        raise InvalidInputError(
            f"EP ranks {short} would hold fewer experts than top_k={config.top_k}: a shard's MoeConfig keeps the "
            f"layer's top_k (ids of experts elsewhere are -1), and top_k cannot exceed its experts. Use fewer EP "
            f"ranks, another placement, or a dispatcher that sends pairs one by one (AllToAllRunner)"
        )
    inter = local_intermediate(config, tp_size)
    local = dataclasses.replace(config, num_experts=len(experts), intermediate_size=inter)
    index = torch.tensor(experts, dtype=torch.long, device=weights.w13.device)
    pick = lambda t: None if t is None else t.index_select(0, index)
    spec = scheme_spec(config.quant_scheme)
    lo, hi = tp_rank * inter, (tp_rank + 1) * inter
    full = config.intermediate_size

    def rows13(t: torch.Tensor, per: int) -> torch.Tensor:
        """Rows [lo, hi) of the gate half and of the up half of a ``[E, 2I/per, ...]`` tensor."""
        gate, up = t[:, lo // per : hi // per], t[:, (full + lo) // per : (full + hi) // per]
        return torch.cat([gate, up], dim=1)

    def cols2(t: torch.Tensor, per: int) -> torch.Tensor:
        return t[..., lo // per : hi // per]

    block_n, block_k = spec.scale_block or (1, 1)
    b2 = pick(weights.b2)
    if b2 is not None and tp_rank != 0:
        b2 = torch.zeros_like(b2)  # added once, by TP rank 0
    sharded = MoeWeights(
        w13=rows13(pick(weights.w13), 1),
        w2=cols2(pick(weights.w2), spec.pack),
        b13=None if weights.b13 is None else rows13(pick(weights.b13), 1),
        b2=b2,
        w13_scale=None if weights.w13_scale is None else rows13(pick(weights.w13_scale), block_n),
        w2_scale=None if weights.w2_scale is None else cols2(pick(weights.w2_scale), block_k),
        w13_global_scale=pick(weights.w13_global_scale),
        w2_global_scale=pick(weights.w2_global_scale),
    )
    sharded = MoeWeights(**{f.name: _own(getattr(sharded, f.name)) for f in dataclasses.fields(MoeWeights)})
    validate_weights(local, sharded)
    return Shard(local, sharded, tuple(experts), tp_rank, tp_size, ep_rank, ep_size)


def local_id_table(experts: Sequence[int], num_experts: int, device=None) -> torch.Tensor:
    """int32 ``[E + 1]``: a global expert id's local id on the rank holding ``experts`` (in order), ``-1``
    elsewhere; the last entry (for id ``-1``) is ``-1``. Built once per rank, read by ``local_ids``."""
    table = torch.full((num_experts + 1,), -1, dtype=torch.int32, device=device)
    table[torch.tensor(list(experts), dtype=torch.long, device=device)] = torch.arange(
        len(experts), dtype=torch.int32, device=device
    )
    return table


def local_ids(topk_ids: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """Global expert ids ``[M, k]`` -> local ids through ``local_id_table`` (``-1`` stays ``-1``); int32."""
    ids = topk_ids.long()
    return table[torch.where(ids < 0, table.shape[0] - 1, ids)]


def check_grid(config: MoeConfig, tp_size: int, ep_size: int) -> None:
    """Refuse a TP x EP grid the layer cannot be sharded on (before any process starts)."""
    _positive("tp_size", tp_size)
    contiguous_placement(config.num_experts, ep_size)
    local_intermediate(config, tp_size)


def local_intermediate(config: MoeConfig, tp_size: int) -> int:
    """``I/tp`` of one TP rank, refused where it does not divide or does not fall on the scheme's blocks and packing."""
    full = config.intermediate_size
    if full % tp_size:
        raise InvalidInputError(f"tp_size={tp_size} does not divide the intermediate size I={full}")
    inter = full // tp_size
    spec = scheme_spec(config.quant_scheme)
    block_n, block_k = spec.scale_block or (1, 1)
    for what, multiple in (
        ("the scale block along w13's rows", block_n),
        ("the scale block along w2's columns", block_k),
        ("the packing", spec.pack),
    ):
        if inter % multiple:
            raise InvalidInputError(
                f"tensor parallelism of {tp_size} gives each rank I={inter}, not a multiple of {what} "
                f"({multiple}) of scheme {config.quant_scheme!r}: the stored blocks cannot be split"
            )
    return inter


def _positive(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidInputError(f"{name} must be an int >= 1, got {value!r}")


def _own(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.clone(memory_format=torch.contiguous_format)
