"""What the forward's GEMM launches take, grouped by job: the weight side of one GEMM, the activation,
the aligned routing and the split-K scratch.

``launch.launch_gemm1`` / ``launch_gemm2`` and ``launch.run_fused_moe`` take these instead of long runs of
positional tensors, so a caller cannot pass GEMM2's scale as GEMM1's or swap two floats unnoticed. The
custom op ``moe_triton::fused_moe`` keeps a flat schema (``torch.library`` accepts tensors and scalars,
not these) and builds the bundles once per forward. They are ``NamedTuple``s: immutable, and the
cheapest record Python builds, which matters because several are built on every forward.

Nothing here imports triton: ``moe_triton.layout.TritonWeights`` hands out ``GemmWeights``.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class GemmWeights(NamedTuple):
    """The weight side of one GEMM in the kernels' layout (``moe_triton.layout``).

    ``scheme`` says how ``weight`` and ``scale`` are stored (``scale`` is None for the float schemes;
    mxfp4's the folded scale pairs ``[E, Kp/64, N]``); ``mult`` is mxfp4's per-expert fp32 multiplier of the
    folded scales (None elsewhere); ``bias`` is ``[E, N]`` or None.
    """

    scheme: str
    weight: torch.Tensor
    scale: torch.Tensor | None = None
    mult: torch.Tensor | None = None
    bias: torch.Tensor | None = None


class Activation(NamedTuple):
    """GEMM1's epilogue activation: ``name`` (silu, gelu, swiglu_oai) and swiglu_oai's ``alpha`` and clamp
    ``limit`` (passed, unused, for the others); the defaults are ``moe_core.MoeConfig``'s."""

    name: str
    alpha: float = 1.702
    limit: float = 7.0


class AlignedRouting(NamedTuple):
    """The routing as both GEMMs read it, after ``kernels.align``.

    ``topk_weights`` flat ``[M*k]`` fp32; ``sorted_ids``, ``block_expert``, ``offsets`` the expert-sorted,
    ``block_m``-padded pair index of ``align``; ``top_k`` the slots per token; ``router_on_input``:
    the routing weight scales GEMM1's input rather than GEMM2's output.

    ``direct`` (decode, ``launch.direct_routing``): no alignment ran; all three index tensors are the flat
    expert ids ``[M*k]``, each GEMM row block is one pair (in pair order) and the intermediate has one
    row per pair.
    """

    topk_weights: torch.Tensor
    sorted_ids: torch.Tensor
    block_expert: torch.Tensor
    offsets: torch.Tensor
    top_k: int
    block_m: int
    router_on_input: bool = False
    direct: bool = False


class SplitK(NamedTuple):
    """One GEMM's split-K scratch (``launch.split_scratch``): fp32 ``partials [split, rows, width]`` and
    its int32 arrival ``counters``, zero before the launch. The split is ``partials.shape[0]``; a GEMM
    given no ``SplitK`` does not split K."""

    partials: torch.Tensor
    counters: torch.Tensor

    @property
    def factor(self) -> int:
        return self.partials.shape[0]


class SlotSum(NamedTuple):
    """GEMM2 sums the k slots itself (direct routing, k > 1): into ``out`` ``[M, H]``, counting each token's
    (pair, N tile) programs in with ``counters`` (int32, one per (token, N tile), zero before the launch)."""

    out: torch.Tensor
    counters: torch.Tensor
