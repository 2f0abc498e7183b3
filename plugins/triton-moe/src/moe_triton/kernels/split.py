"""Split-K inside one launch: each program stores its K slice's fp32 partial tile, and the last of a
tile's programs to arrive sums all of them.

Used by both GEMMs at decode, when (row block x N tile) programs alone would leave most SMs idle. The
arrival counter is one int32 per output tile, zero at launch (the alignment kernel zeroes the buffer;
the reducing program zeroes its counter again, so repeated launches on one buffer work too). Ordering:
every thread of the program has stored its partials before one thread's release increment
(``debug_barrier``, then an ``acq_rel`` atomic at GPU scope); the program that sees ``SPLIT_K - 1``
(acquire) reads the partials past L1 (``.cg``) in split order, so the sum does not depend on which
split finished last: the result is deterministic.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _arrive(counter):
    """Count this program's partials in; returns how many of the tile's programs had arrived before it."""
    tl.debug_barrier()  # every thread's partial stores precede the release below
    return tl.atomic_add(counter, 1, sem="acq_rel")


@triton.jit
def _sum_partials(part, mask, stride_split, SPLIT_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Sum of the ``SPLIT_K`` partial tiles at ``part + s * stride_split`` (a ``[BLOCK_M, BLOCK_N]`` pointer
    block), in split order."""
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for s in tl.static_range(SPLIT_K):
        acc += tl.load(part + s * stride_split, mask=mask, other=0.0, cache_modifier=".cg")
    return acc
