"""The layouts FlashInfer's MXFP4 MoE kernels read, written as index formulas (pure torch, any device).

At run time the weights are converted by the *installed* FlashInfer's own
helpers (so the bytes always match the installed kernels). These formulas are
this package's independent statement of what those helpers must produce; they
serve the structural probe at bind time (``detect_sm90_layout``,
``check_trtllm_row_shuffle``: fail closed if FlashInfer's helpers disagree)
and the tests.

SM90 CUTLASS W4A16 block scales (UE8M0 byte per 32 along K, ``[E, R, G]``
with ``G = K/32``):

* v2 (flashinfer 0.6.16-0.6.16.post2 and >= 0.6.18): ``[E, R/64, G/4, 16, 16]``,
  ``out[e, r//64, g//4, r%16, 4*((r%64)//16) + g%4] = s[e, r, g]`` — each
  64-row x 128-K block is 16 folded rows of 16 bytes;
* v1 (0.6.10-0.6.15.post1, 0.6.16.post3-0.6.17): ``[E, G/4, 4R]``,
  ``out[e, g//4, 4*r + g%4] = s[e, r, g]``.

trtllm-gen (SM100) row order of a gated ``[up; gate]`` matrix with ``2I``
rows: first ``reorder_rows_for_gated_act_gemm`` (rows ``up0, gate0, up1,
gate1, ...``), then ``shuffle_matrix_a`` with epilogue tile 128, which moves
row ``o`` to ``32*(o//32) + 8*(o%4) + (o%32)//4`` inside blocks of 32 rows.
"""

from __future__ import annotations

import torch


def sm90_fold_scales_v2(scales: torch.Tensor) -> torch.Tensor:
    """``[E, R, G]`` -> ``[E, R/64, G/4, 16, 16]`` by the v2 index formula (R % 64 == 0, G % 4 == 0)."""
    e, rows, groups = scales.shape
    if rows % 64 or groups % 4:
        raise ValueError(f"v2 scale fold needs rows % 64 == 0 and groups % 4 == 0, got {tuple(scales.shape)}")
    r = torch.arange(rows, device=scales.device).view(-1, 1)
    g = torch.arange(groups, device=scales.device).view(1, -1)
    out = scales.new_empty(e, rows // 64, groups // 4, 16, 16)
    out[:, r // 64, g // 4, r % 16, 4 * ((r % 64) // 16) + g % 4] = scales
    return out


def sm90_fold_scales_v1(scales: torch.Tensor) -> torch.Tensor:
    """``[E, R, G]`` -> ``[E, G/4, 4R]`` by the v1 index formula (G % 4 == 0)."""
    e, rows, groups = scales.shape
    if groups % 4:
        raise ValueError(f"v1 scale fold needs groups % 4 == 0, got {tuple(scales.shape)}")
    r = torch.arange(rows, device=scales.device).view(-1, 1)
    g = torch.arange(groups, device=scales.device).view(1, -1)
    out = scales.new_empty(e, groups // 4, 4 * rows)
    out[:, g // 4, 4 * r + g % 4] = scales
    return out


def _probe_scales() -> torch.Tensor:
    # 256 distinct bytes in one 64-row x 128-K block: every position is identifiable
    return torch.arange(256, dtype=torch.int32).to(torch.uint8).reshape(1, 64, 4)


def detect_sm90_layout(interleave_scales) -> str:
    """Which layout family a ``interleave_moe_scales_for_sm90_mixed_gemm``-like function produces.

    Runs it on a 64x4 CPU probe (pure torch in every FlashInfer release that
    has it) and compares with both formulas: ``"v2"``, ``"v1"``, or
    ``"unknown (...)"`` describing what came back.
    """
    probe = _probe_scales()
    try:
        got = interleave_scales(probe.clone(), group_size=32)
    except Exception as exc:  # a helper that rejects the probe is not a layout we know
        return f"unknown (the helper raised {type(exc).__name__}: {exc})"
    if not isinstance(got, torch.Tensor):
        return f"unknown (the helper returned {type(got).__name__})"
    for name, formula in (("v2", sm90_fold_scales_v2), ("v1", sm90_fold_scales_v1)):
        want = formula(probe)
        if tuple(got.shape) == tuple(want.shape) and torch.equal(got.cpu().to(torch.uint8), want):
            return name
    return f"unknown (a {got.dim()}-d {tuple(got.shape)} result matching neither the v1 nor the v2 formula)"


def shuffle_rows_source(rows: int, device=None) -> torch.Tensor:
    """Source row of every output row of trtllm-gen's row shuffle (epilogue tile 128: blocks of 32)."""
    if rows % 32:
        raise ValueError(f"the trtllm-gen row shuffle needs rows % 32 == 0, got {rows}")
    o = torch.arange(rows, device=device)
    dest = (o // 32) * 32 + 8 * (o % 4) + (o % 32) // 4
    src = torch.empty_like(o)
    src[dest] = o
    return src


def gated_rows_source(rows: int, device=None) -> torch.Tensor:
    """Source row (in ``[up; gate]``) of every output row after the gated reorder and the row shuffle."""
    if rows % 64:
        raise ValueError(f"gated trtllm-gen rows must be a multiple of 64, got {rows}")
    half = rows // 2
    o = torch.arange(rows, device=device)
    reordered = o // 2 + (o % 2) * half  # after reorder_rows_for_gated_act_gemm: up0, gate0, up1, gate1, ...
    return reordered[shuffle_rows_source(rows, device)]


def check_trtllm_row_shuffle(reorder_rows_for_gated_act_gemm, shuffle_matrix_a, rows: int = 256) -> str | None:
    """None if FlashInfer's trtllm-gen row helpers still do what ``gated_rows_source`` says; else why not."""
    column = torch.arange(rows, dtype=torch.int64).view(-1, 1)
    try:
        gated = shuffle_matrix_a(reorder_rows_for_gated_act_gemm(column), 128).view(-1)
        plain = shuffle_matrix_a(column, 128).view(-1)
    except Exception as exc:
        return f"FlashInfer's trtllm-gen row helpers raised {type(exc).__name__}: {exc}"
    if not torch.equal(gated.cpu(), gated_rows_source(rows)):
        return "reorder_rows_for_gated_act_gemm + shuffle_matrix_a no longer produce the known gated row order"
    if not torch.equal(plain.cpu(), shuffle_rows_source(rows)):
        return "shuffle_matrix_a no longer produces the known row shuffle"
    return None
