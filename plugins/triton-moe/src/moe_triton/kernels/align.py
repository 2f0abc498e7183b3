"""Token alignment: the expert-sorted, block-padded index the GEMMs walk.

Two launches, no host synchronisation (so a forward can be captured in a CUDA
graph), sizes bounded statically: at most ``min(E + 1, M*k) + ceil(M*k / BLOCK_M)``
blocks are used (each non-empty segment wastes less than one block), so a
decode step launches a handful of programs, not one per possible expert.

Segments: one per expert ``0..E-1``, then the *null segment* ``E``, which holds
every pair whose id lies outside ``[0, E)`` (-1 is "expert on another rank"
under expert parallelism; any other such id is a caller's error that must not
read out of bounds). Its blocks have expert ``E``: GEMM1 skips them and GEMM2
writes zeros for their pairs, so these pairs contribute exactly zero and read
no weights, without an extra launch or a per-forward memset of the output.

1. ``_plan`` (one program): histogram of segment ids, padded segment offsets
   (each segment's pairs padded to a multiple of BLOCK_M), the number of used
   padded rows, the segment of every block, the padding sentinel everywhere,
   zeroed per-segment cursors and, optionally, a caller's int32 buffer (the
   split-K arrival counters of both GEMMs: zeroing them here costs no extra launch).
2. ``_scatter`` (one program per chunk of pairs): each (token, slot) pair
   claims the next row of its segment with an atomic increment.

Rows of one expert land in an arbitrary order, which changes nothing in the
result: every GEMM row is computed independently of the other rows of its
tile, and the second GEMM writes each pair to its own (token, slot) place.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from moe_triton.kernels.operands import _pdl_start


@triton.jit
def _segment(ids, E: tl.constexpr):
    """Segment of each expert id: the id itself inside ``[0, E)``, else the null segment ``E``."""
    return tl.where((ids >= 0) & (ids < E), ids, E)


@triton.jit
def _plan(
    ids_ptr,
    offsets_ptr,  # [E + 2] int32: start row of each segment (experts, then the null one), then the total
    cursor_ptr,  # [E + 1] int32: zeroed here, used by _scatter
    block_expert_ptr,  # [max_blocks] int32: segment of each BLOCK_M block (E + 1 for unused blocks)
    sorted_ptr,  # [max_rows] int32: filled with the sentinel num_pairs
    zero_ptr,  # [num_zero] int32: zeroed here (the GEMMs' split-K arrival counters)
    num_pairs,
    max_rows,
    max_blocks,
    num_zero,
    E: tl.constexpr,
    E_POW2: tl.constexpr,  # a power of two >= E + 2: bin E_POW2 - 1 lies past the null segment
    BLOCK_M: tl.constexpr,
    CHUNK: tl.constexpr,
    PAIR_CHUNK: tl.constexpr,  # pairs per histogram step: [PAIR_CHUNK, E_POW2] compares
    BLOCK_CHUNK: tl.constexpr,  # blocks per owner step: [BLOCK_CHUNK, E_POW2] compares
    PDL: tl.constexpr = False,
):
    _pdl_start(PDL)
    experts = tl.arange(0, E_POW2)
    counts = tl.zeros((E_POW2,), dtype=tl.int32)
    for start in range(0, num_pairs, PAIR_CHUNK):
        offs = start + tl.arange(0, PAIR_CHUNK)
        mask = offs < num_pairs
        ids = _segment(tl.load(ids_ptr + offs, mask=mask, other=0), E)
        # pairs past the end go to bin E_POW2 - 1 > E, which no segment uses
        counts += tl.histogram(tl.where(mask, ids, E_POW2 - 1), E_POW2)
    padded = tl.where(experts <= E, (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M, 0)
    ends = tl.cumsum(padded, 0)
    starts = ends - padded
    tl.store(offsets_ptr + experts, starts, mask=experts <= E)
    total = tl.sum(padded, 0)
    tl.store(offsets_ptr + E + 1, total)
    tl.store(cursor_ptr + experts, tl.zeros((E_POW2,), dtype=tl.int32), mask=experts <= E)
    # segment of each block: the number of segment ends at or before the block start
    for start in range(0, max_blocks, BLOCK_CHUNK):
        blocks = start + tl.arange(0, BLOCK_CHUNK)
        row = blocks * BLOCK_M
        owner = tl.sum((ends[None, :] <= row[:, None]).to(tl.int32), 1)
        owner = tl.where(row < total, owner, E + 1)
        tl.store(block_expert_ptr + blocks, owner, mask=blocks < max_blocks)
    for start in range(0, max_rows, CHUNK):
        rows = start + tl.arange(0, CHUNK)
        tl.store(sorted_ptr + rows, tl.full((CHUNK,), 0, tl.int32) + num_pairs, mask=rows < max_rows)
    for start in range(0, num_zero, CHUNK):
        idx = start + tl.arange(0, CHUNK)
        tl.store(zero_ptr + idx, tl.zeros((CHUNK,), dtype=tl.int32), mask=idx < num_zero)


@triton.jit
def _plan_and_scatter(
    ids_ptr, offsets_ptr, cursor_ptr, block_expert_ptr, sorted_ptr, zero_ptr, num_pairs, max_rows, max_blocks,
    num_zero, E: tl.constexpr, E_POW2: tl.constexpr, BLOCK_M: tl.constexpr, CHUNK: tl.constexpr,
    PAIR_CHUNK: tl.constexpr, BLOCK_CHUNK: tl.constexpr, PDL: tl.constexpr = False,
):  # fmt: skip
    """Both steps in one program, for small batches (decode): one launch instead of two."""
    _plan(ids_ptr, offsets_ptr, cursor_ptr, block_expert_ptr, sorted_ptr, zero_ptr, num_pairs, max_rows, max_blocks,
          num_zero, E, E_POW2, BLOCK_M, CHUNK, PAIR_CHUNK, BLOCK_CHUNK, PDL)  # fmt: skip
    tl.debug_barrier()  # the plan's global writes are visible to every thread of this program
    for start in range(0, num_pairs, PAIR_CHUNK):
        offs = start + tl.arange(0, PAIR_CHUNK)
        mask = offs < num_pairs
        ids = _segment(tl.load(ids_ptr + offs, mask=mask, other=0), E)
        slot = tl.atomic_add(cursor_ptr + ids, 1, mask=mask)
        first = tl.load(offsets_ptr + ids, mask=mask, other=0)
        tl.store(sorted_ptr + first + slot, offs, mask=mask)


@triton.jit
def _scatter(
    ids_ptr, offsets_ptr, cursor_ptr, sorted_ptr, num_pairs, E: tl.constexpr, CHUNK: tl.constexpr,
    PDL: tl.constexpr = False,
):  # fmt: skip
    _pdl_start(PDL)
    offs = tl.program_id(0) * CHUNK + tl.arange(0, CHUNK)
    mask = offs < num_pairs
    ids = _segment(tl.load(ids_ptr + offs, mask=mask, other=0), E)
    slot = tl.atomic_add(cursor_ptr + ids, 1, mask=mask)
    start = tl.load(offsets_ptr + ids, mask=mask, other=0)
    tl.store(sorted_ptr + start + slot, offs, mask=mask)


#: up to this many (token, slot) pairs the alignment runs as one single-program launch
SINGLE_PROGRAM_PAIRS = 2048


def _chunk_for(count: int, chunk: int) -> int:
    """Step width for a loop over ``count`` items: ``chunk``, or the next power of two >= count (>= 16) if smaller.

    The histogram and the block-owner search compare a [step, E_POW2] tile; at decode (8 pairs, 9 blocks)
    a 256-wide step made the alignment 9 us for 128 experts on the H200 (E=8: 3.5 us), almost all of it
    compares of padding.
    """
    return min(chunk, max(16, triton.next_power_of_2(count)))


def max_blocks(num_pairs: int, num_experts: int, block_m: int) -> int:
    """Static upper bound of the BLOCK_M blocks in use (see the module docstring)."""
    return min(num_experts + 1, num_pairs) + triton.cdiv(num_pairs, block_m)


def flat_ids(topk_ids: torch.Tensor) -> torch.Tensor:
    """``topk_ids`` ``[M, k]`` as the contiguous int32 ``[M*k]`` the kernels index (no copy when it is one)."""
    ids = topk_ids.reshape(-1)
    if not ids.is_contiguous() or ids.dtype != torch.int32:
        ids = ids.to(torch.int32).contiguous()
    return ids


def align(
    topk_ids: torch.Tensor, num_experts: int, block_m: int, pdl: dict | None = None, zero: torch.Tensor | None = None
):
    """(sorted pair ids [max_rows], block segments [max_blocks], offsets [E+2]).

    ``offsets[e]`` (on the device) is the first row of segment ``e`` (``offsets[E]``: the null segment of
    the ids outside ``[0, E)``) and ``offsets[E + 1]`` the number of padded rows in use; blocks past it
    have segment ``E + 1``, and rows past it, like a segment's padding rows, hold the sentinel ``M*k``.
    ``pdl``: the launch keywords of ``launch.pdl_kwargs`` (programmatic dependent launch), or none.
    ``zero``: a contiguous int32 buffer to zero on the way (the GEMMs' split-K counters), or none.
    """
    ids = flat_ids(topk_ids)
    num_pairs = ids.numel()
    n_blocks = max_blocks(num_pairs, num_experts, block_m)
    max_rows = n_blocks * block_m
    device = ids.device
    sorted_ids = torch.empty(max_rows, dtype=torch.int32, device=device)
    block_expert = torch.empty(n_blocks, dtype=torch.int32, device=device)
    offsets = torch.empty(num_experts + 2, dtype=torch.int32, device=device)
    cursor = torch.empty(num_experts + 1, dtype=torch.int32, device=device)
    e_pow2 = triton.next_power_of_2(num_experts + 2)
    chunk = 256 if e_pow2 <= 256 else 64
    sizes = dict(
        E=num_experts, E_POW2=e_pow2, BLOCK_M=block_m, CHUNK=chunk,
        PAIR_CHUNK=_chunk_for(num_pairs, chunk), BLOCK_CHUNK=_chunk_for(n_blocks, chunk),
    )  # fmt: skip
    if zero is not None and (zero.dtype != torch.int32 or not zero.is_contiguous()):
        raise ValueError(f"align zeroes a contiguous int32 buffer, got {zero.dtype}")
    num_zero = zero.numel() if zero is not None else 0
    zero = zero if zero is not None else cursor  # never written when num_zero == 0
    args = (ids, offsets, cursor, block_expert, sorted_ids, zero, num_pairs, max_rows, n_blocks, num_zero)
    pdl = pdl or {}
    if num_pairs <= SINGLE_PROGRAM_PAIRS:
        _plan_and_scatter[(1,)](*args, **sizes, num_warps=4, **pdl)
        return sorted_ids, block_expert, offsets
    _plan[(1,)](*args, **sizes, num_warps=4, **pdl)
    _scatter[(triton.cdiv(num_pairs, 256),)](ids, offsets, cursor, sorted_ids, num_pairs, E=num_experts, CHUNK=256,
                                             num_warps=4, **pdl)  # fmt: skip
    return sorted_ids, block_expert, offsets
