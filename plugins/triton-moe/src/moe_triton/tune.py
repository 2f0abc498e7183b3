"""Measure candidate tile configurations on this GPU and write a tuned table.

For each (layer shape, scheme, token count) the two GEMMs are tuned
separately (they share only BLOCK_M, which the alignment pads to): for every
candidate BLOCK_M the alignment runs once, then each GEMM's candidates are
timed as CUDA-graph replays (``triton.testing.do_bench_cudagraph``) and the
fastest kept. Candidate lists are short and regime-specific (decode, medium,
large rows per expert) so a preset tunes in minutes, not hours.

In the decode regime split-K is tuned too, for each GEMM on its own (each
reduces its partials in the same launch): for each split in ``SPLITS`` the few
tiles that were fastest unsplit are re-timed, and the fastest (split, tile)
wins (1 = off is always a candidate). Wherever the forward aligns its routing
(``kernel_configs.direct_decode`` false) the fastest unsplit tiles are also
re-timed as persistent walks (``GemmConfig.persistent`` in ``PERSISTENT``). Weights are prepared first
(``moe_triton.layout``), as the runner does.

For MXFP4 the fastest tiles that take K in order are also re-timed with one 64-deep MMA per chunk
(``GemmConfig.whole_chunk``), per GEMM and split.

Once a token count's tiles are chosen, the whole forward on them is timed without and with
programmatic dependent launch (CUDA SM90+), alternately, and the entry's ``pdl`` is set where it was
faster by ``PDL_MIN_GAIN`` (``_choose_pdl``).

A forward takes the entry tuned at the nearest token count (``kernel_configs.entry_at``), and between two
tuned counts far apart that rule can pick the slower neighbour by a wide margin. So once a preset is tuned,
the whole forward is timed on both neighbours of each pair of adjacent entries (the shipped table's with the
written ones over them, one of the pair tuned in this run) at a few token counts between
them (``probe_points``); where the entry the rule does not pick was ``BOUNDARY_MIN_GAIN`` faster at any of
them, every probed count of that pair gets an entry with the tiles that won there (``boundary_entries``).

Every timed candidate's output is compared with the output the first candidate
of the same launch wrote (the heuristic tile, which every list starts with),
and one that disagrees by more than the scheme's tolerance
(``moe_core.tolerances``) is logged and never chosen: a tile a compiler
lowers wrongly must not win by being fast.

Compiling a candidate costs far more than timing it, so on CUDA each batch of
candidates is first compiled by worker processes (``moe_triton.compile_pool``,
``MOE_TRITON_TUNE_JOBS``) and only then timed, here, one after another.

The table is written to the user's table of this device
(``kernel_configs.user_table_path``; ``--output`` elsewhere), merged with what
is there, after every token count; the config caches are cleared after each
write so this process's next forward sees it.
"""

from __future__ import annotations

import functools
import itertools
import json
import os
import time
import warnings
from dataclasses import replace
from pathlib import Path

import torch
import triton

from moe_core.tolerances import relative_l2, tolerance
from moe_triton import kernel_configs, launch
from moe_triton import tma as tma_mod
from moe_triton.compile_pool import Compiler, default_jobs
from moe_triton.kernel_configs import (
    GemmConfig,
    KernelConfig,
    device_slug,
    heuristic_config,
    legal_block_k,
    table_key,
)
from moe_triton.launch_args import Activation, AlignedRouting
from moe_triton.sizes import cdiv
from moe_triton.switches import VARIABLES, Switches, current_switches

# (block_n, block_k, num_warps, num_stages)
_DECODE = [
    (16, 256, 4, 4), (16, 128, 4, 5), (32, 128, 4, 4), (32, 256, 4, 3), (64, 128, 4, 4), (64, 256, 4, 3),
    (64, 64, 4, 5), (128, 128, 4, 4),
    (128, 64, 4, 4), (32, 64, 2, 5), (64, 128, 8, 4), (128, 128, 8, 3), (256, 64, 4, 4), (256, 128, 8, 3),
]  # fmt: skip
_MEDIUM = [
    (64, 64, 4, 4), (64, 128, 4, 3), (128, 64, 4, 4), (128, 64, 8, 4), (128, 128, 8, 3), (256, 64, 8, 3),
    (64, 64, 4, 3), (128, 128, 4, 3),
]  # fmt: skip
_LARGE = [
    (128, 64, 8, 3), (128, 64, 8, 4), (256, 64, 8, 3), (128, 128, 8, 3), (64, 64, 4, 4), (128, 32, 4, 4),
    (128, 128, 4, 3), (256, 128, 8, 3), (256, 64, 8, 4), (128, 64, 4, 4),
]  # fmt: skip
#: K splits tried at decode (re-timing the fastest unsplit tiles)
SPLITS = (2, 4, 8)
#: how many of each GEMM's fastest unsplit tiles each split re-times
SPLIT_TOP = 4
#: programs per SM of the persistent walks tried where the forward aligns its routing (re-timing the fastest tiles)
PERSISTENT = (1, 2)
#: how many of each GEMM's fastest plain tiles are re-timed as persistent walks
PERSISTENT_TOP = 3
#: few-row tiles (``GemmConfig.tail_m``) tried on the fastest persistent walks, those below BLOCK_M
TAILS = (32, 64)
#: how many of each GEMM's fastest walks are re-timed with each tail
TAIL_TOP = 2
#: how many of each split's fastest MXFP4 tiles are re-timed with one 64-deep MMA per chunk
#: (``GemmConfig.whole_chunk``, where ``whole_chunk_applies``)
WHOLE_TOP = 3
#: programmatic dependent launch is set in an entry (``KernelConfig.pdl``) only where the whole forward was at
#: least this much faster with it: it moves forwards by a few percent either way, and below this the choice
#: would follow the timing noise
PDL_MIN_GAIN = 0.005
#: alternating timings of the forward without and with programmatic dependent launch (the fastest of each kept)
PDL_ROUNDS = 3
#: between adjacent entries tuned at a < b tokens, both are timed at a * (b / a) ** (i / BOUNDARY_STEPS) tokens,
#: i = 1 .. BOUNDARY_STEPS - 1: evenly on a log scale, since a tile's fit follows the rows per expert
BOUNDARY_STEPS = 4
#: entries are added between two neighbours only where the one the nearest-M rule does not pick ran at least
#: this much faster somewhere between them
BOUNDARY_MIN_GAIN = 0.02
#: alternating timings of the two neighbours at each probed token count (the fastest of each kept)
BOUNDARY_ROUNDS = 2


def swap_worth_trying(scheme: str, block_m: int) -> bool:
    """Whether swapped operands (``GemmConfig.swap_ab``, tried only where the weight tile fills a wgmma's
    64 rows: BLOCK_N >= 64) join the candidates: for mxfp4 at every BLOCK_M (the decoded tile may feed the
    MMA from registers), elsewhere only below 64 rows, where the plain order cannot use ``wgmma`` at all."""
    return scheme == "mxfp4" or block_m < 64


def candidates(scheme: str, rows_per_expert: float, tma: bool = False) -> list[tuple[int, list[GemmConfig]]]:
    """(block_m, gemm candidates) pairs for this regime and scheme. ``tma``: each tile also with its loads
    through tensor descriptors (``GemmConfig.tma``; the caller knows whether they apply on its device)."""
    if rows_per_expert <= 16:
        # from 4 rows per expert on average, routing skew gives many experts more than 16: a 32-row block
        # reads their weights once where 16-row blocks read them twice
        plan = [(16, _DECODE), *([(32, _MEDIUM)] if rows_per_expert > 4 else [])]
    elif rows_per_expert <= 96:
        # from half a 128-row block per expert on average, the busiest experts fill whole 128-row blocks and
        # the large tiles' fewer weight reads can outweigh the padding: they compete too
        plan = [(32, _MEDIUM), (64, _MEDIUM), *([(128, _LARGE)] if rows_per_expert >= 64 else [])]
    else:
        plan = [(64, _LARGE), (128, _LARGE)]
    out = []
    for block_m, shapes in plan:
        # the heuristic default always competes, so tuning can only improve on it
        h = heuristic_config(scheme, 1, 1, 1, 1, block_m).gemm1
        shapes = [(h.block_n, h.block_k, h.num_warps, h.num_stages), *shapes]
        gemms, seen = [], set()
        swaps = (False, True) if swap_worth_trying(scheme, block_m) else (False,)
        for swap in swaps:
            for bn, bk, w, s in shapes:
                bk = legal_block_k(scheme, bk)
                key = (bn, bk, w, s, swap)
                if key not in seen and (not swap or bn >= 64):
                    seen.add(key)
                    gemms.append(GemmConfig(bn, bk, 8 if block_m >= 64 else 1, w, s, swap))
        if tma and scheme in tma_mod.SCHEMES:
            gemms += [replace(g, tma=True) for g in gemms]
        out.append((block_m, gemms))
    return out


def _bench(fn) -> float:
    return triton.testing.do_bench_cudagraph(fn, rep=20, return_mode="median")


#: the GEMM launches a (layer, M, BLOCK_M) is tuned with; ``gemm2_codes`` (fp8_block): GEMM2 reading the
#: e4m3 codes a quantizing GEMM1 writes (``launch.fp8_intermediate``)
KINDS = ("gemm1", "gemm2", "gemm2_codes")


def _inputs(config, m: int, device):
    """(x, x_scale, ids, flat routing weights) of a forward of ``m`` tokens: seeded, so a compile worker
    (``Compiler``) builds the same shapes; fp8_block's ``x`` quantized as the forward does by default."""
    from moe_core.synthetic import random_inputs

    x, ids, tw = random_inputs(config, m, device)
    x_scale = None
    if config.quant_scheme == "fp8_block":
        x, x_scale = launch.quantize_fp8_groups(x)
    return x, x_scale, ids, tw.reshape(-1).contiguous()


def _launches(config, weights, inputs, block_m: int, device) -> dict:
    """``{kind: make}`` for one BLOCK_M: the alignment runs once and the buffers are allocated here;
    ``make(g, split)`` returns a zero-argument launch of that GEMM candidate (its split-K scratch taken,
    counters zeroed), to time or to run once; the launch's ``written`` is (which buffer, a float32 view of
    what it wrote there), for ``_Agreement``."""
    from moe_triton.kernels import align

    scheme, h, i, k = config.quant_scheme, config.hidden_size, config.intermediate_size, config.top_k
    fp8 = scheme == "fp8_block"
    x, x_scale, ids, tw = inputs
    m = x.shape[0]
    w13, w2 = weights.gemm1(), weights.gemm2()
    act = Activation(config.activation, config.swiglu_alpha, config.swiglu_limit)
    sorted_ids, block_expert, offsets = align.align(ids, config.num_experts, block_m)
    n_blocks = block_expert.numel()
    y = torch.empty(m * k, h, dtype=config.dtype, device=device)
    a = torch.zeros(n_blocks * block_m, i, dtype=config.dtype, device=device)
    # fp8_block: GEMM1 tiles of whole scale groups quantize GEMM2's input (launch.fp8_intermediate)
    a8 = torch.zeros(n_blocks * block_m, i, dtype=torch.float8_e4m3fn, device=device) if fp8 else None
    a8_scale = torch.ones(n_blocks * block_m, cdiv(i, 128), device=device) if fp8 else None
    routing = AlignedRouting(tw, sorted_ids, block_expert, offsets, k, block_m, config.apply_router_weight_on_input)

    def scratch(block_n, split, width, n):
        found, counters = launch.split_scratch(n_blocks, block_m, device, (split, width, n, block_n))
        if counters is not None:
            counters.zero_()  # each reducing program zeroes its counter again: every replay reduces
        return found

    # the intermediate's rows that hold a pair: the only ones GEMM1 writes, so a candidate is judged on them
    # alone (what an earlier, refused candidate left in the padding rows is no fault of the next one)
    pair_rows = sorted_ids[: n_blocks * block_m] < m * k

    def codes():  # the quantized intermediate as the values it stands for
        return (a8.float() * a8_scale.repeat_interleave(128, dim=1)[:, :i])[pair_rows]

    def written(fn, buffer, read):
        fn.written = (buffer, read)
        return fn

    def gemm1(g, split):
        sc = scratch(g.block_n, split, 2 * i, i)
        if launch.fp8_intermediate(scheme, g):
            fn = functools.partial(launch.launch_gemm1, x, w13, routing, act, a8, g, x_scale=x_scale,
                                   out_scale=a8_scale, round_to=config.dtype, split=sc)  # fmt: skip
            return written(fn, "a8", codes)
        fn = functools.partial(launch.launch_gemm1, x, w13, routing, act, a, g, x_scale=x_scale, split=sc)
        return written(fn, "a", lambda: a[pair_rows].float())

    def gemm2(g, split):
        fn = functools.partial(launch.launch_gemm2, a, w2, routing, y, g, split=scratch(g.block_n, split, h, h))
        return written(fn, "y", y.float)

    def gemm2_codes(g, split):
        return written(functools.partial(launch.launch_gemm2, a8, w2, routing, y, g, a_scale=a8_scale,
                                         split=scratch(g.block_n, split, h, h)), "y from a8", y.float)  # fmt: skip

    return {"gemm1": gemm1, "gemm2": gemm2, **({"gemm2_codes": gemm2_codes} if fp8 else {})}


def _no_warm(pairs) -> None:
    """No compile workers: each candidate compiles when first timed."""


class _Agreement:
    """Each candidate's output against the first output written to the same buffer of one (M, BLOCK_M)
    (``_launches``' ``written``): ``check`` is their relative L2 difference (0 for the first)."""

    def __init__(self):
        self.first: dict[str, tuple] = {}  # buffer -> (the first launch that wrote it, what it wrote)

    def check(self, fn) -> float:
        buffer, read = fn.written
        out = read()
        if buffer not in self.first:
            self.first[buffer] = (fn, out.clone())
            return 0.0
        ref = self.first[buffer][1]
        denom, num = float(ref.norm()), float((out - ref).norm())
        return num / denom if denom else (0.0 if num == 0.0 else float("inf"))

    def restore(self) -> None:
        """Run each buffer's first launch again, so the next GEMM's candidates read its output rather than
        the last candidate's (which may be one that ``check`` rejected)."""
        for fn, _ in self.first.values():
            fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()


def _time(make, split: int, gemms, agree: _Agreement | None = None, limit: float = 0.0, log=print) -> dict:
    """Times of one GEMM's candidates at this split; with ``agree``, a candidate whose output differs from
    the first one's by more than ``limit`` gets an infinite time (never chosen) and a log line."""
    times = {}
    for c in gemms:
        fn = make(c, split)
        times[c] = _safe(_bench, fn)
        if agree is not None and times[c] != float("inf"):
            err = agree.check(fn)
            if not err <= limit:
                log(f"  candidate wrote another {fn.written[0]} than the first tile (relative L2 {err:.2e} > "
                    f"{limit:g}), not chosen: {c} split {split}")  # fmt: skip
                times[c] = float("inf")
    return times


def _trials(make, gemms, decode: bool, warm, walks: bool = False, timer=_time, tails=(),
            whole=None) -> dict[int, dict]:  # fmt: skip
    """Times per split of one GEMM: every candidate unsplit, then at decode each split in ``SPLITS`` on the
    ``SPLIT_TOP`` fastest unsplit tiles, and with ``walks`` (aligned routing) the ``PERSISTENT_TOP`` fastest
    unsplit tiles as persistent walks (``PERSISTENT`` programs per SM; a walk is never split), then the
    ``TAIL_TOP`` fastest walks with each few-row tile in ``tails`` (``GemmConfig.tail_m``; the caller's
    ``TAILS`` below its BLOCK_M). With ``whole`` (a tile -> whether ``GemmConfig.whole_chunk`` applies to it:
    MXFP4), each split's ``WHOLE_TOP`` fastest tiles it applies to are timed again with it on.
    ``warm(pairs)`` compiles (candidate, split) pairs ahead of timing; ``timer(make, split, tiles)`` times
    them (``_time``)."""
    warm([(g, 1) for g in gemms])
    trials = {1: timer(make, 1, gemms)}
    if decode:
        top = sorted(trials[1], key=trials[1].get)[:SPLIT_TOP]
        warm([(g, split) for split in SPLITS for g in top])
        for split in SPLITS:
            trials[split] = timer(make, split, top)
    if walks:
        persistent = [replace(g, persistent=p) for g in sorted(trials[1], key=trials[1].get)[:PERSISTENT_TOP]
                      for p in PERSISTENT]  # fmt: skip
        warm([(g, 1) for g in persistent])
        trials[1].update(timer(make, 1, persistent))
        fastest = sorted(persistent, key=trials[1].get)[:TAIL_TOP]
        tailed = [replace(g, tail_m=t) for g in fastest for t in tails]
        warm([(g, 1) for g in tailed])
        trials[1].update(timer(make, 1, tailed))
    if whole is not None:
        chunked = {split: [replace(g, whole_chunk=True) for g in sorted(times, key=times.get) if whole(g)][:WHOLE_TOP]
                   for split, times in trials.items()}  # fmt: skip
        warm([(g, split) for split, tiles in chunked.items() for g in tiles])
        for split, tiles in chunked.items():
            trials[split].update(timer(make, split, tiles))
    return trials


def _best(trials: dict[int, dict]) -> tuple[float, int, GemmConfig | None]:
    """(time, split, tile) of the fastest candidate over all splits; time is infinite if none ran."""
    best = (float("inf"), 1, None)
    for split, times in trials.items():
        for tile, t in times.items():
            if t < best[0]:
                best = (t, split, tile)
    return best


def tune_shape(config, weights, tokens: list[int], device, log=print, on_result=None, compiler=None) -> dict:
    """Best KernelConfig per token count for one layer (MoeConfig + prepared ``TritonWeights``).

    ``on_result(m, config)`` is called as soon as each token count is done (the caller saves it, so a
    tuning run cut short by a time limit keeps every M it finished). ``compiler``: a ``Compiler`` whose
    worker processes build each batch of candidates before it is timed (None: each compiles when first
    timed).
    """
    scheme, e, k = config.quant_scheme, config.num_experts, config.top_k
    descriptors = _descriptors(device)
    shapes = weights.shapes()
    limit = tolerance(scheme, config.dtype)
    # GemmConfig.whole_chunk is timed only where the tile decides it (the switch, when set, decides for all)
    chunks_free = scheme == "mxfp4" and current_switches().mxfp4_whole_chunk is None
    if scheme == "mxfp4" and not chunks_free:
        log(f"  {VARIABLES['mxfp4_whole_chunk']} is set: whole_chunk is not tuned (every entry keeps off)")
    result = {}
    for m in tokens:
        inputs = _inputs(config, m, device)
        best_total, best = float("inf"), None
        for block_m, gemms in candidates(scheme, m * k / e, descriptors):
            makes = _launches(config, weights, inputs, block_m, device)
            agree = _Agreement()
            timer = functools.partial(_time, agree=agree, limit=limit, log=log)
            decode = m * k / e <= 16  # a GEMM may not fill the GPU: K splits are tried too
            walks = not kernel_configs.direct_decode(m, k, e)  # the forward aligns: persistent walks apply
            whole = functools.partial(kernel_configs.whole_chunk_applies, scheme, block_m) if chunks_free else None
            trials = {}
            for kind, make in makes.items():
                if kind == "gemm2_codes" and not any(launch.fp8_intermediate(scheme, g) for g in gemms):
                    continue  # no GEMM1 candidate writes codes
                warm = functools.partial(compiler.warm, config, shapes, m, block_m, kind) if compiler else _no_warm
                tails = tuple(t for t in TAILS if t < block_m)
                trials[kind] = _trials(make, gemms, decode, warm, walks, timer, tails, whole)
                if kind == "gemm1":
                    agree.restore()  # GEMM2's candidates read the first GEMM1 tile's output
            trials1, trials2 = trials["gemm1"], trials["gemm2"]
            for split in trials1:
                t1, t2 = trials1[split], trials2[split]
                c1, c2 = min(t1, key=t1.get), min(t2, key=t2.get)
                log(f"  M={m} BLOCK_M={block_m} split_k={split}: gemm1 {t1[c1] * 1e3:.1f} us {c1}, "
                    f"gemm2 {t2[c2] * 1e3:.1f} us {c2}{_plain_note(t1, t2)}")  # fmt: skip
            # GEMM2 after a quantizing GEMM1 reads codes: timed that way for those pairings
            for quantizing, second in ((False, trials2), (True, trials.get("gemm2_codes"))):
                if second is None:
                    continue
                first = {s: {g: t for g, t in ts.items() if launch.fp8_intermediate(scheme, g) == quantizing}
                         for s, ts in trials1.items()}  # fmt: skip
                (t1, s1, c1), (t2, s2, c2) = _best(first), _best(second)
                if quantizing:
                    log(f"  M={m} BLOCK_M={block_m}: gemm1 quantizing its output {t1 * 1e3:.1f} us {c1}, "
                        f"gemm2 on codes {t2 * 1e3:.1f} us {c2}")  # fmt: skip
                if t1 + t2 < best_total:
                    best_total, best = t1 + t2, KernelConfig(block_m, c1, c2, s1, s2)
        if best is None:
            raise RuntimeError(f"no tile candidate of {scheme} E={e} H={config.hidden_size} "
                               f"I={config.intermediate_size} k={k} ran at M={m} (see the log)")  # fmt: skip
        if _pdl_available(device):
            use, plain, dependent = _choose_pdl(_forwards(config, weights, m, best, device), log=log)
            log(f"  M={m} whole forward: {plain * 1e3:.1f} us plain, {dependent * 1e3:.1f} us with programmatic "
                f"dependent launch -> pdl {'on' if use else 'off'}")  # fmt: skip
            best = replace(best, pdl=use)
        result[m] = best
        if on_result is not None:
            on_result(m, best)
    return result


def _pdl_available(device) -> bool:
    """Whether the forward can launch with programmatic dependent launch here (``launch.pdl_kwargs``)."""
    return bool(launch.pdl_kwargs(torch.device(device), Switches(pdl=True)))


def _forward_on(config, weights, inputs, entry: KernelConfig, switches: Switches | None = None):
    """The whole forward of ``inputs`` (``random_inputs``) on ``entry`` (``launch.run_fused_moe``: alignment,
    both GEMMs and the slot sum, or the direct path at decode), as a forward that looked ``entry`` up would run
    it (``switches``: these instead of the current ones), writing its own output (``.out``)."""
    x, ids, tw = inputs
    act = Activation(config.activation, config.swiglu_alpha, config.swiglu_limit)
    out = torch.empty_like(x)
    fn = functools.partial(launch.run_fused_moe, x, ids, tw, weights.gemm1(), weights.gemm2(), act, out,
                           router_on_input=config.apply_router_weight_on_input, config=entry,
                           switches=switches)  # fmt: skip
    fn.out = out
    return fn


def _forwards(config, weights, m: int, best: KernelConfig, device) -> dict:
    """``{pdl: launch}``: the whole forward of ``best`` at ``m`` tokens (``_forward_on``) without and with
    programmatic dependent launch, on the same inputs, the other switches as they are."""
    from moe_core.synthetic import random_inputs

    inputs = random_inputs(config, m, device)
    return {pdl: _forward_on(config, weights, inputs, best, replace(current_switches(), pdl=pdl))
            for pdl in (False, True)}  # fmt: skip


def _choose_pdl(forwards: dict, bench=None, log=print) -> tuple[bool, float, float]:
    """(use PDL, plain time, PDL time) of ``_forwards``' two launches: each timed ``PDL_ROUNDS`` times,
    alternately, the fastest of each kept; PDL is chosen only when it is ``PDL_MIN_GAIN`` faster and wrote
    the same output (it changes when kernels start, not what they compute)."""
    times = {False: [], True: []}
    for _ in range(PDL_ROUNDS):
        for pdl, fn in forwards.items():
            times[pdl].append(_safe(bench or _bench, fn, log))
    plain, dependent = min(times[False]), min(times[True])
    faster = dependent < plain * (1 - PDL_MIN_GAIN)
    if faster and not torch.equal(forwards[False].out, forwards[True].out):
        log("  the forward with programmatic dependent launch wrote another output than without: pdl off")
        return False, plain, dependent
    return faster, plain, dependent


def probe_points(a: int, b: int) -> list[int]:
    """Token counts strictly between ``a`` and ``b`` at which both neighbours are timed (``BOUNDARY_STEPS``)."""
    points = {round(a * (b / a) ** (i / BOUNDARY_STEPS)) for i in range(1, BOUNDARY_STEPS)}
    return sorted(p for p in points if a < p < b)


def boundary_entries(config, weights, entry: dict[int, KernelConfig], tuned, device, bench=None,
                     log=print) -> dict[int, KernelConfig]:  # fmt: skip
    """Entries to add to one layer's ``entry`` (token count -> config) so that between each pair of adjacent
    token counts of which one is in ``tuned``, the forward at every ``probe_points`` count runs on the
    neighbour that was faster there — added only for a pair where, at some probed count, the neighbour the
    nearest-M rule does not pick was ``BOUNDARY_MIN_GAIN`` faster and wrote the same output within the
    scheme's tolerance. Pairs with the same config are not timed."""
    from moe_core.synthetic import random_inputs

    limit = tolerance(config.quant_scheme, config.dtype)
    ms = sorted(entry)
    added = {}
    for a, b in itertools.pairwise(ms):
        if entry[a] == entry[b] or not ({a, b} & set(tuned)):
            continue
        winners, wrong = {}, False
        for p in probe_points(a, b):
            near, far = (a, b) if p - a <= b - p else (b, a)  # entry_at's rule: the nearest, a tie to the smaller
            inputs = random_inputs(config, p, device)
            forwards = {n: _forward_on(config, weights, inputs, entry[n]) for n in (near, far)}
            times = {n: [] for n in forwards}
            for _ in range(BOUNDARY_ROUNDS):
                for n, fn in forwards.items():
                    times[n].append(_safe(bench or _bench, fn, log))
            t_near, t_far = min(times[near]), min(times[far])
            faster = t_far < t_near * (1 - BOUNDARY_MIN_GAIN)
            err = 0.0  # a nearest entry that did not run (infinite time) wrote nothing to compare with
            if faster and t_near != float("inf"):
                err = relative_l2(forwards[far].out, forwards[near].out)
            if faster and not err <= limit:
                log(f"  M={p}: the entry tuned at {far} wrote another output than the one at {near} (relative L2 "
                    f"{err:.2e}): not used")  # fmt: skip
                faster = False
            winners[p] = far if faster else near
            wrong |= faster
            log(f"  M={p}: entry tuned at {near} (the nearest) {t_near * 1e3:.1f} us, at {far} {t_far * 1e3:.1f} us"
                f"{f' -> the {far} tiles' if faster else ''}")  # fmt: skip
        if wrong:
            added.update({p: entry[n] for p, n in winners.items()})
    return added


def _descriptors(device) -> bool:
    """Whether tiles through tensor descriptors are worth trying here: an SM90+ GPU (``moe_triton.tma``)."""
    device = torch.device(device)
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= (9, 0)


def _plain_note(times1: dict, times2: dict) -> str:
    """The fastest plain-load tiles of both GEMMs where descriptor tiles competed too (what ``tma`` gained)."""
    plain = [min((t for g, t in ts.items() if not g.tma), default=None) for ts in (times1, times2)]
    if not any(g.tma for g in times1) or None in plain:
        return ""
    return f" (plain loads: gemm1 {plain[0] * 1e3:.1f} us, gemm2 {plain[1] * 1e3:.1f} us)"


def _compile_failure(exc: Exception) -> bool:
    """Triton could not build this candidate (frontend, MLIR pass or ptxas): skip it, not the whole run."""
    names = {cls.__name__ for cls in type(exc).__mro__}
    return bool(names & {"CompilationError", "PTXASError", "TritonError"}) or "PassManager" in str(exc)


def _safe(bench, fn, log=print) -> float:
    """Median time of a candidate; infinite (never chosen) if it does not fit or does not compile."""
    try:
        return bench(fn)
    except Exception as exc:
        if "out of resource" in str(exc) or "OutOfResources" in type(exc).__name__:
            return float("inf")
        if _compile_failure(exc):  # e.g. a tile shape this Triton cannot lower: reported, not chosen
            lines = str(exc).strip().splitlines() or [""]
            log(f"  candidate did not compile ({type(exc).__name__}): {lines[-1][:160]}")
            return float("inf")
        raise


def _existing_table(path: Path) -> dict:
    """The table at ``path`` to merge into: empty if missing, and empty with a warning if unreadable."""
    try:
        table = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        warnings.warn(f"replacing the unreadable table {path} ({exc})", RuntimeWarning, stacklevel=3)
        return {}
    if not isinstance(table, dict) or not isinstance(table.get("entries", {}), dict):
        warnings.warn(f"replacing {path}: it is not a table", RuntimeWarning, stacklevel=3)
        return {}
    return table


def write_table(path: Path, device, entries: dict[str, dict[int, KernelConfig]]) -> Path:
    """Merge ``entries`` into the table file at ``path`` (created with its folders if missing): per shape
    key, the token counts given replace those already there; other token counts of that key and other
    keys stay. Written to a temporary file and renamed, so an interrupted write leaves the old table.
    Clears the config caches (``kernel_configs.clear_cache``): the next forward reads the new table."""
    path = Path(path)
    table = _existing_table(path)
    device = torch.device(device)
    table.setdefault("device", torch.cuda.get_device_name(device) if device.type == "cuda" else device.type)
    table["triton"] = triton.__version__
    table["torch"] = torch.__version__
    table["updated"] = time.strftime("%Y-%m-%d")
    table.setdefault("entries", {})
    for key, per_m in entries.items():
        merged = {int(m): c for m, c in table["entries"].get(key, {}).items()}
        merged.update({m: c.as_dict() for m, c in per_m.items()})
        table["entries"][key] = {str(m): merged[m] for m in sorted(merged)}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    tmp.replace(path)
    kernel_configs.clear_cache()
    return path


def default_table_path(device) -> Path:
    """The user's table of this device (``kernel_configs.user_table_path``), where tuning writes by default."""
    return kernel_configs.user_table_path(device_slug(torch.device(device)))


def prepare_weights_for(config, device):
    """Random weights of ``config`` in the layout the runner prepares (``moe_triton.layout``): what a layer
    is tuned on (the values do not matter, the shapes, strides and dtypes do)."""
    from moe_core.synthetic import random_weights
    from moe_triton.layout import prepare_weights

    return prepare_weights(config.quant_scheme, random_weights(config, device))


def tune_presets(presets, scheme: str, tokens: list[int], output: Path | None, device="cuda", log=print) -> Path:
    """Tune each preset at each token count; merge into ``output`` (default: the user's table of this
    device, ``default_table_path``)."""
    from moe_core.presets import PRESETS

    device = torch.device(device)
    dtype = (
        torch.bfloat16
        if scheme in ("bf16", "mxfp4", "fp8_block")
        else {"fp16": torch.float16}.get(scheme, torch.float32)
    )
    path = Path(output) if output else default_table_path(device)
    log(f"writing the tuned table to {path}")
    with Compiler(default_jobs(device), device, log) as compiler:
        for name in presets:
            cfg = PRESETS[name].config(scheme, dtype)
            weights = prepare_weights_for(cfg, device)
            where = torch.cuda.get_device_name(device) if device.type == "cuda" else device
            log(f"tuning {name} ({scheme}) on {where}")
            t0 = time.time()
            key = table_key(scheme, cfg.num_experts, cfg.hidden_size, cfg.intermediate_size, cfg.top_k)
            # written after every token count, so an interrupted run keeps what it measured
            save = lambda m, best, key=key: write_table(path, device, {key: {m: best}})
            tuned = tune_shape(cfg, weights, tokens, device, log, on_result=save, compiler=compiler)
            # the entries a forward would choose from, were the table written here the user's
            written = kernel_configs.parse_table(path.read_text())
            entry = kernel_configs.merge_tables(kernel_configs.shipped_table(device_slug(device)), written)[key]
            added = boundary_entries(cfg, weights, entry, tuned, device, log=log)
            if added:
                write_table(path, device, {key: added})
                log(f"  {name}: entries added at M = {', '.join(map(str, sorted(added)))}, where the nearest tuned "
                    f"entry was slower than its neighbour")  # fmt: skip
            log(f"  {name}: {time.time() - t0:.0f} s -> {path}")
            del weights
            torch.cuda.empty_cache()
    return path
