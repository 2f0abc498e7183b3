"""Token alignment: the expert-sorted, block-padded index the GEMMs walk.

No host synchronisation (so a forward can be captured in a CUDA graph), sizes
bounded statically: at most ``min(E + 1, M*k) + ceil(M*k / BLOCK_M)`` blocks are
used (each non-empty segment wastes less than one block), so a decode step
launches a handful of programs, not one per possible expert.

Segments: one per expert ``0..E-1``, then the *null segment* ``E``, which holds
every pair whose id lies outside ``[0, E)`` (-1 is "expert on another rank"
under expert parallelism; any other such id is a caller's error that must not
read out of bounds). Its blocks have expert ``E``: GEMM1 skips them and GEMM2
writes zeros for their pairs, so these pairs contribute exactly zero and read
no weights, without an extra launch or a per-forward memset of the output.

Above ``SINGLE_PROGRAM_PAIRS`` pairs, two launches over the same chunks of pairs:

1. ``_count`` (one program per ``COUNT_PAIRS`` pairs or more): the segment counts of its
   pairs (one atomic increment each, into its own row of a partial-count
   matrix), and its share of the plain fills: the padding sentinel into the
   sorted index and, optionally, zeros into a caller's int32 buffer (the
   split-K arrival counters of both GEMMs: zeroing them here costs no launch).
2. ``_plan_scatter`` (one program per chunk again): each program sums the
   partial counts itself into the padded segment offsets (each segment's
   pairs padded to a multiple of BLOCK_M; program 0 writes them), and its
   pairs take the rows of their segments after those of the chunks before
   it, claimed with atomics on a cursor row of its own: no program waits for
   another, and no atomic is contended across programs (a single cursor per
   segment would need a plan launch of its own before the claims, and every
   program's claims would contend on it).

Up to it (decode), ``_plan_and_scatter`` does all of it in one program. The
counting and the fills are spread over programs because in one program they
grow with M*k and E (a histogram compares every pair with every bin): at
M*k = 32768 pairs over 256 experts that single program took as long as a GEMM.

Rows of one expert land in an arbitrary order, which changes nothing in the
result: every GEMM row is computed independently of the other rows of its
tile, and the second GEMM writes each pair to its own (token, slot) place.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from moe_triton.fast_launch import launch
from moe_triton.kernels.operands import _pdl_start
from moe_triton.sizes import cdiv, next_power_of_2


@triton.jit
def _segment(ids, E: tl.constexpr):
    """Segment of each expert id: the id itself inside ``[0, E)``, else the null segment ``E``."""
    return tl.where((ids >= 0) & (ids < E), ids, E)


@triton.jit
def _fill(ptr, lo, hi, value, WIDTH: tl.constexpr):
    """``ptr[lo:hi] = value``, WIDTH entries per step."""
    for start in range(lo, hi, WIDTH):
        idx = start + tl.arange(0, WIDTH)
        tl.store(ptr + idx, tl.full((WIDTH,), 0, tl.int32) + value, mask=idx < hi)


@triton.jit
def _count_into(ids_ptr, counts_ptr, lo, hi, E: tl.constexpr, E_POW2: tl.constexpr, WIDTH: tl.constexpr):
    """Pairs ``[lo, hi)`` counted per segment into ``counts_ptr[0:E_POW2]`` (zeroed here first) with atomics:
    one increment per pair, where ``tl.histogram`` over E_POW2 bins costs a compare per bin and pair."""
    experts = tl.arange(0, E_POW2)
    tl.store(counts_ptr + experts, tl.zeros((E_POW2,), dtype=tl.int32))
    tl.debug_barrier()  # the zeros are visible to every thread of this program before the first increment
    for start in range(lo, hi, WIDTH):
        offs = start + tl.arange(0, WIDTH)
        mask = offs < hi
        ids = _segment(tl.load(ids_ptr + offs, mask=mask, other=0), E)
        tl.atomic_add(counts_ptr + ids, 1, mask=mask, sem="relaxed", scope="cta")
    tl.debug_barrier()


@triton.jit
def _starts(counts, E: tl.constexpr, E_POW2: tl.constexpr, BLOCK_M: tl.constexpr):
    """From the per-segment counts: each segment's first row (its pairs padded to a multiple of BLOCK_M) and
    the padded rows in use."""
    experts = tl.arange(0, E_POW2)
    padded = tl.where(experts <= E, (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M, 0)
    return tl.cumsum(padded, 0) - padded, tl.sum(padded, 0)


@triton.jit
def _store_offsets(offsets_ptr, starts, total, E: tl.constexpr, E_POW2: tl.constexpr):
    """``offsets[0..E] = starts`` (experts, then the null segment), ``offsets[E + 1] = total``."""
    experts = tl.arange(0, E_POW2)
    tl.store(offsets_ptr + experts, starts, mask=experts <= E)
    tl.store(offsets_ptr + E + 1, total)


@triton.jit
def _layout(counts, offsets_ptr, cursor_ptr, E: tl.constexpr, E_POW2: tl.constexpr, BLOCK_M: tl.constexpr):
    """From the per-segment counts: padded segment offsets and the total, zeroed cursors."""
    experts = tl.arange(0, E_POW2)
    starts, total = _starts(counts, E, E_POW2, BLOCK_M)
    _store_offsets(offsets_ptr, starts, total, E, E_POW2)
    tl.store(cursor_ptr + experts, tl.zeros((E_POW2,), dtype=tl.int32), mask=experts <= E)


@triton.jit
def _owners(
    offsets_ptr, block_expert_ptr, lo, hi, E: tl.constexpr, E_POW2: tl.constexpr, BLOCK_M: tl.constexpr,
    WIDTH: tl.constexpr,
):  # fmt: skip
    """``block_expert[lo:hi]`` from the written offsets: the segment holding each block's first row — the
    last segment whose start is at or below it (an empty segment starts where the next one does, so it is
    never the last such), found by a branchless binary search over ``offsets[0..E]`` (log2(E_POW2) gathers
    per block, where comparing every block with every segment end cost a [blocks, E_POW2] tile); ``E + 1``
    past the rows in use."""
    total = tl.load(offsets_ptr + E + 1)
    for start in range(lo, hi, WIDTH):
        blocks = start + tl.arange(0, WIDTH)
        row = blocks * BLOCK_M
        seg = tl.zeros((WIDTH,), dtype=tl.int32)
        for i in tl.static_range(16):  # steps E_POW2/2, E_POW2/4, ..., 1 (E_POW2 <= 2**16)
            if (E_POW2 >> (i + 1)) > 0:
                cand = seg + (E_POW2 >> (i + 1))
                ok = cand <= E
                first = tl.load(offsets_ptr + cand, mask=ok, other=0)
                seg = tl.where(ok & (first <= row), cand, seg)
        tl.store(block_expert_ptr + blocks, tl.where(row < total, seg, E + 1), mask=blocks < hi)


@triton.jit
def _count(
    ids_ptr, partial_ptr, sorted_ptr, zero_ptr, num_pairs, max_rows, num_zero, rows_per, zero_per,
    E: tl.constexpr, E_POW2: tl.constexpr, PAIRS: tl.constexpr, WIDTH: tl.constexpr, PDL: tl.constexpr = False,
):  # fmt: skip
    """Program p: the segment counts of pairs ``[p*PAIRS, (p+1)*PAIRS)`` into row p of ``partial
    [programs, E_POW2]``, and its share of the plain fills (the sentinel ``num_pairs`` into ``rows_per`` rows of
    the sorted index, zeros into ``zero_per`` entries of the caller's buffer)."""
    _pdl_start(PDL)
    p = tl.program_id(0)
    lo = p * PAIRS
    _count_into(ids_ptr, partial_ptr + p * E_POW2, lo, tl.minimum(lo + PAIRS, num_pairs), E, E_POW2, WIDTH)
    _fill(sorted_ptr, p * rows_per, tl.minimum((p + 1) * rows_per, max_rows), num_pairs, WIDTH)
    _fill(zero_ptr, p * zero_per, tl.minimum((p + 1) * zero_per, num_zero), 0, WIDTH)


@triton.jit
def _plan_scatter(
    ids_ptr, partial_ptr, offsets_ptr, cursor_ptr, sorted_ptr, block_expert_ptr, num_pairs, programs, max_blocks,
    blocks_per, E: tl.constexpr, E_POW2: tl.constexpr, BLOCK_M: tl.constexpr, PAIRS: tl.constexpr,
    ROWS: tl.constexpr, CHUNK: tl.constexpr, BLOCK_CHUNK: tl.constexpr, E_CHUNK: tl.constexpr,
    PDL: tl.constexpr = False,
):  # fmt: skip
    """Program p, over the pairs ``_count``'s program p counted: every program sums the partial counts
    (``[programs, E_POW2]``, at most ``ALIGN_PROGRAMS`` rows) into the padded segment offsets itself, so
    no program waits for another's; program 0 writes them. Program p's pairs of segment e take the rows
    after those of programs ``q < p`` (the partial rows before its own), so each program claims rows with
    atomics on a cursor row of its own (``cursor_ptr[p]``, contended only inside the program), and it
    writes the segments of blocks ``[p*blocks_per, (p+1)*blocks_per)`` from the offsets it holds
    (``[BLOCK_CHUNK, E_CHUNK]`` compares: a few blocks per program)."""
    _pdl_start(PDL)
    p = tl.program_id(0)
    experts = tl.arange(0, E_POW2)
    counts = tl.zeros((E_POW2,), dtype=tl.int32)
    before = tl.zeros((E_POW2,), dtype=tl.int32)  # pairs of each segment counted by programs q < p
    for start in range(0, programs, ROWS):
        q = start + tl.arange(0, ROWS)
        tile = tl.load(partial_ptr + q[:, None] * E_POW2 + experts[None, :], mask=(q < programs)[:, None], other=0)
        counts += tl.sum(tile, 0)
        before += tl.sum(tl.where((q < p)[:, None], tile, 0), 0)
    starts, total = _starts(counts, E, E_POW2, BLOCK_M)
    if p == 0:
        _store_offsets(offsets_ptr, starts, total, E, E_POW2)
    cursor = cursor_ptr + p * E_POW2
    tl.store(cursor + experts, starts)  # read back below in E_CHUNK-wide steps (a [blocks, E_POW2] tile can be huge)
    tl.debug_barrier()
    for lo in range(p * blocks_per, tl.minimum((p + 1) * blocks_per, max_blocks), BLOCK_CHUNK):
        blocks = lo + tl.arange(0, BLOCK_CHUNK)
        row = blocks * BLOCK_M
        # the last segment starting at or below the row (an empty one starts where the next does, so it is
        # never the last such): how many of segments 1..E start at or below it
        seg = tl.zeros((BLOCK_CHUNK,), dtype=tl.int32)
        for e0 in range(0, E_POW2, E_CHUNK):
            e = e0 + tl.arange(0, E_CHUNK)
            first = tl.load(cursor + e)
            below = (first[None, :] <= row[:, None]) & (e[None, :] >= 1) & (e[None, :] <= E)
            seg += tl.sum(below.to(tl.int32), 1)
        tl.store(block_expert_ptr + blocks, tl.where(row < total, seg, E + 1), mask=blocks < max_blocks)
    tl.debug_barrier()  # every start is read before the row turns into this program's cursors
    tl.store(cursor + experts, starts + before)
    tl.debug_barrier()  # the cursor row is visible to every thread of this program before the first claim
    hi = tl.minimum(p * PAIRS + PAIRS, num_pairs)
    for lo in range(p * PAIRS, hi, CHUNK):
        offs = lo + tl.arange(0, CHUNK)
        mask = offs < hi
        ids = _segment(tl.load(ids_ptr + offs, mask=mask, other=0), E)
        row = tl.atomic_add(cursor + ids, 1, mask=mask, sem="relaxed", scope="cta")
        tl.store(sorted_ptr + row, offs, mask=mask)


@triton.jit
def _plan_and_scatter(
    ids_ptr, offsets_ptr, cursor_ptr, block_expert_ptr, sorted_ptr, zero_ptr, num_pairs, max_rows, max_blocks,
    num_zero, E: tl.constexpr, E_POW2: tl.constexpr, BLOCK_M: tl.constexpr, WIDTH: tl.constexpr,
    PAIR_CHUNK: tl.constexpr, BLOCK_CHUNK: tl.constexpr, PDL: tl.constexpr = False,
):  # fmt: skip
    """Every step in one program, for small batches (decode): one launch instead of three. ``cursor_ptr``
    (``E_POW2`` entries here) holds the counts, then the cursors."""
    _pdl_start(PDL)
    experts = tl.arange(0, E_POW2)
    _count_into(ids_ptr, cursor_ptr, 0, num_pairs, E, E_POW2, PAIR_CHUNK)
    counts = tl.load(cursor_ptr + experts)
    tl.debug_barrier()  # every count is read before _layout zeroes the cursors
    _layout(counts, offsets_ptr, cursor_ptr, E, E_POW2, BLOCK_M)
    _fill(sorted_ptr, 0, max_rows, num_pairs, WIDTH)
    _fill(zero_ptr, 0, num_zero, 0, WIDTH)
    tl.debug_barrier()  # the plan's global writes are visible to every thread of this program
    _owners(offsets_ptr, block_expert_ptr, 0, max_blocks, E, E_POW2, BLOCK_M, BLOCK_CHUNK)
    for start in range(0, num_pairs, PAIR_CHUNK):
        offs = start + tl.arange(0, PAIR_CHUNK)
        mask = offs < num_pairs
        ids = _segment(tl.load(ids_ptr + offs, mask=mask, other=0), E)
        slot = tl.atomic_add(cursor_ptr + ids, 1, mask=mask)
        first = tl.load(offsets_ptr + ids, mask=mask, other=0)
        tl.store(sorted_ptr + first + slot, offs, mask=mask)


#: up to this many (token, slot) pairs the alignment runs as one single-program launch; its atomics and
#: fills run in that one program, so its time grows with the pairs, and above this two launches cost less
SINGLE_PROGRAM_PAIRS = 512
#: pairs each ``_count`` / ``_plan_scatter`` program takes at least (above SINGLE_PROGRAM_PAIRS): one
#: ``_plan_scatter`` step of claims
COUNT_PAIRS = 256
#: at most this many programs per alignment launch (more pairs: more per program); every ``_plan_scatter``
#: program reads all programs' partial counts, so past this, more programs cost each of them more reading
ALIGN_PROGRAMS = 64
#: entries per step of the plain fills and of ``_count``'s loop
FILL_WIDTH = 1024


def _chunk_for(count: int, chunk: int) -> int:
    """Step width for a loop over ``count`` items: ``chunk``, or the next power of two >= count (>= 16) if smaller.

    Steps wider than the work are padding, and at decode (a few pairs and blocks) padding would be most of
    the work.
    """
    return min(chunk, max(16, next_power_of_2(count)))


def plan_scatter_tiles(programs: int, e_pow2: int, blocks_per: int) -> dict:
    """``_plan_scatter``'s step widths: all ``programs`` partial rows in one load where they fit 16384
    entries, one step of 256 claims, and ``[BLOCK_CHUNK, E_CHUNK]`` block-segment compares of at most 8192."""
    block_chunk = _chunk_for(blocks_per, 64)
    rows = min(next_power_of_2(programs), max(1, 16384 // e_pow2))
    return dict(
        E_POW2=e_pow2, ROWS=rows, CHUNK=256, BLOCK_CHUNK=block_chunk, E_CHUNK=min(e_pow2, max(16, 8192 // block_chunk))
    )


def max_blocks(num_pairs: int, num_experts: int, block_m: int) -> int:
    """Static upper bound of the BLOCK_M blocks in use (see the module docstring)."""
    return min(num_experts + 1, num_pairs) + cdiv(num_pairs, block_m)


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
    e_pow2 = next_power_of_2(num_experts + 2)
    if zero is not None and (zero.dtype != torch.int32 or not zero.is_contiguous()):
        raise ValueError(f"align zeroes a contiguous int32 buffer, got {zero.dtype}")
    num_zero = zero.numel() if zero is not None else 0
    pdl = pdl or {}
    if num_pairs <= SINGLE_PROGRAM_PAIRS:
        cursor = torch.empty(e_pow2, dtype=torch.int32, device=device)  # the counts first: one per bin
        launch(
            _plan_and_scatter, (1,),
            ids, offsets, cursor, block_expert, sorted_ids, zero if zero is not None else cursor, num_pairs, max_rows,
            n_blocks, num_zero, E=num_experts, E_POW2=e_pow2, BLOCK_M=block_m, WIDTH=FILL_WIDTH,
            PAIR_CHUNK=_chunk_for(num_pairs, 256), BLOCK_CHUNK=_chunk_for(n_blocks, 1024), num_warps=4, **pdl,
        )  # fmt: skip
        return sorted_ids, block_expert, offsets
    pairs_per = max(COUNT_PAIRS, next_power_of_2(cdiv(num_pairs, ALIGN_PROGRAMS)))
    programs = cdiv(num_pairs, pairs_per)
    partial, cursor = torch.empty(2, programs, e_pow2, dtype=torch.int32, device=device)  # one allocation
    launch(
        _count, (programs,),
        ids, partial, sorted_ids, zero if zero is not None else partial, num_pairs, max_rows, num_zero,
        cdiv(max_rows, programs), cdiv(num_zero, programs), E=num_experts, E_POW2=e_pow2,
        PAIRS=pairs_per, WIDTH=FILL_WIDTH, num_warps=4, **pdl,
    )  # fmt: skip
    blocks_per = cdiv(n_blocks, programs)
    launch(_plan_scatter, (programs,), ids, partial, offsets, cursor, sorted_ids, block_expert, num_pairs, programs,
           n_blocks, blocks_per, E=num_experts, BLOCK_M=block_m, PAIRS=pairs_per,
           **plan_scatter_tiles(programs, e_pow2, blocks_per), num_warps=8, **pdl)  # fmt: skip
    return sorted_ids, block_expert, offsets
