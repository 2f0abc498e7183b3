"""The ``torch_grouped`` fused op: SwiGLU MoE on ``torch._grouped_mm``.

Two paths compute the same thing; which one a problem takes is decided once,
when the runner is built, and reported by the support check
(``TorchGroupedFusedOp.path``):

- ``grouped_mm``: token-expert pairs are sorted by expert and each GEMM is one
  ``torch._grouped_mm`` call over all experts, with the group ends (``offs``,
  int32 cumulative counts) computed on the device: no host synchronisation, so
  a forward can be captured in a CUDA graph. torch runs its fused CUTLASS kernel
  only for bf16 on SM90/SM100-family GPUs (elsewhere ``_grouped_mm`` falls back
  to a per-group loop that reads ``offs`` on the host), so this path is taken
  only there, and only when H and I keep every row 16-byte aligned.
- ``loop``: the same sort, then one float32 matmul pair per active expert. The
  expert counts go to the host (one synchronisation per forward). CPU, fp16,
  fp32 and every other GPU take this path.

Numerics follow moe-core's float reference: canonical ``[gate; up]`` rows,
``silu(gate) * up`` in float32, router weights applied to each expert's output
in float32, then a fixed-order sum over the k slots of each token (no atomics,
so two calls on the same input are bitwise equal) and one cast to the config's
dtype. The ``grouped_mm`` path's GEMMs take bf16 inputs and accumulate in
float32 inside the kernel, writing bf16.

``MOE_TORCH_GROUPED_PATH=loop|grouped_mm`` overrides the choice (default
``auto``), e.g. to compare the two paths on one GPU or to run the
``grouped_mm`` code on CPU, where torch >= 2.9 implements ``_grouped_mm`` too.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import ClassVar

import torch

from moe_core import FusedOp, InvalidInputError, MoeProblem, MoeWeights, Support
from moe_core.activations import apply_activation

#: environment variable that forces a path: "auto" (default), "loop", "grouped_mm"
PATH_VAR = "MOE_TORCH_GROUPED_PATH"
GROUPED_MM = "grouped_mm"
LOOP = "loop"
#: torch's bf16 grouped-GEMM kernel takes fewer than this many groups
MAX_GROUPS = 1024


@dataclass(frozen=True)
class GroupedWeights:
    """``prepare``'s output: the canonical weights as ``[E, K, N]`` views.

    ``w13_t[e] = w13[e].T`` is ``[H, 2I]`` with columns ``[gate | up]`` and
    ``w2_t[e] = w2[e].T`` is ``[I, H]``: transposed *views* of the contiguous
    canonical tensors, i.e. column-major B operands, which is the layout
    ``torch._grouped_mm`` wants. Nothing is copied for contiguous weights.
    """

    w13_t: torch.Tensor
    w2_t: torch.Tensor


def _fast_kernel_capability(cap: tuple[int, int]) -> bool:
    # torch._grouped_mm's fused bf16 kernel: SM90 and the SM100 family
    return cap == (9, 0) or cap[0] == 10


@functools.cache
def _grouped_mm_runs_on_cpu(dtype: torch.dtype) -> bool:
    """Whether this torch implements ``_grouped_mm`` on CPU for ``dtype`` (one tiny call, cached)."""
    try:
        a = torch.zeros(2, 8, dtype=dtype)
        b = torch.zeros(2, 8, 8, dtype=dtype)
        torch._grouped_mm(a, b.transpose(1, 2), offs=torch.tensor([1, 2], dtype=torch.int32))
    except Exception:
        return False
    return True


def _forced_path() -> str:
    return (os.environ.get(PATH_VAR, "") or "auto").strip().lower()


class TorchGroupedFusedOp(FusedOp):
    name = "torch_grouped"
    a2a_backends = ("none",)
    #: above moe-core's torch reference (0), below real GPU kernels
    priority = 10
    quant_schemes: ClassVar[frozenset[str]] = frozenset({"bf16", "fp16", "fp32"})
    activations: ClassVar[frozenset[str]] = frozenset({"silu"})
    activation_dtypes = frozenset({torch.bfloat16, torch.float16, torch.float32})
    device_types = frozenset({"cpu", "cuda"})

    # ---- support ------------------------------------------------------------
    @classmethod
    def path(cls, problem: MoeProblem | None = None) -> tuple[str | None, str]:
        """``(path, why)`` for ``problem``; ``(None, reason)`` when neither path may run it.

        With ``problem=None`` the answer is about this machine in general (what
        ``moe backends --check`` asks).
        """
        forced = _forced_path()
        if forced not in ("auto", LOOP, GROUPED_MM):
            return None, f"{PATH_VAR}={forced!r} is not one of auto, loop, grouped_mm"
        if forced == LOOP:
            return LOOP, f"per-expert matmul loop (forced by {PATH_VAR}=loop)"
        if problem is None:
            return cls._machine_path(forced)
        why_not = cls._grouped_mm_blocker(problem, forced == GROUPED_MM)
        if why_not is None:
            how = f"forced by {PATH_VAR}=grouped_mm" if forced == GROUPED_MM else "fused bf16 kernel"
            return GROUPED_MM, f"torch._grouped_mm on {problem.device} ({how})"
        if forced == GROUPED_MM:
            return None, f"{PATH_VAR}=grouped_mm, but {why_not}"
        return LOOP, f"per-expert matmul loop ({why_not})"

    @classmethod
    def _machine_path(cls, forced: str) -> tuple[str | None, str]:
        if not hasattr(torch, "_grouped_mm"):
            if forced == GROUPED_MM:
                return None, f"{PATH_VAR}=grouped_mm, but torch {torch.__version__} has no torch._grouped_mm"
            return LOOP, f"per-expert matmul loop (torch {torch.__version__} has no torch._grouped_mm)"
        if forced == GROUPED_MM:
            return GROUPED_MM, f"torch._grouped_mm wherever torch runs it (forced by {PATH_VAR}=grouped_mm)"
        fast = []
        if torch.cuda.is_available():
            for i in range(torch.cuda.device_count()):
                cap = torch.cuda.get_device_capability(i)
                if _fast_kernel_capability(cap):
                    fast.append(f"cuda:{i} (SM{cap[0]}{cap[1]})")
        if fast:
            return GROUPED_MM, (
                f"torch._grouped_mm for bf16 on {', '.join(fast)}; per-expert matmul loop for fp16/fp32 and elsewhere"
            )
        where = "no CUDA device" if not torch.cuda.is_available() else "no SM90/SM100 GPU"
        return LOOP, f"per-expert matmul loop (torch._grouped_mm's fused kernel needs a bf16 SM90/SM100 GPU; {where})"

    @classmethod
    def _grouped_mm_blocker(cls, problem: MoeProblem, forced: bool) -> str | None:
        """Why ``problem`` cannot take the grouped_mm path, or None."""
        cfg, device = problem.config, problem.device
        if not hasattr(torch, "_grouped_mm"):
            return f"torch {torch.__version__} has no torch._grouped_mm"
        if cfg.num_experts >= MAX_GROUPS:
            return f"{cfg.num_experts} experts (torch._grouped_mm's kernel takes fewer than {MAX_GROUPS} groups)"
        # every row of every operand must start on a 16-byte boundary
        per_16_bytes = 16 // cfg.dtype.itemsize
        for attr in ("hidden_size", "intermediate_size"):
            size = getattr(cfg, attr)
            if size % per_16_bytes:
                return f"{attr}={size} is not a multiple of {per_16_bytes} (16-byte rows)"
        if forced:
            if device.type == "cpu" and not _grouped_mm_runs_on_cpu(cfg.dtype):
                return f"torch {torch.__version__} does not run torch._grouped_mm on CPU for {cfg.dtype}"
            if device.type == "cuda" and cfg.dtype != torch.bfloat16:
                return "torch._grouped_mm on CUDA takes bf16 only"
            return None
        if device.type != "cuda":
            return f"torch._grouped_mm's fused kernel needs a CUDA device, not {device.type}"
        cap = torch.cuda.get_device_capability(device)
        if not _fast_kernel_capability(cap):
            return f"torch._grouped_mm's fused kernel needs SM90/SM100, {device} is SM{cap[0]}{cap[1]}"
        if cfg.dtype != torch.bfloat16:
            return f"torch._grouped_mm's fused kernel is bf16 only, the layer is {str(cfg.dtype).replace('torch.', '')}"
        return None

    @classmethod
    def probe(cls, problem: MoeProblem | None) -> Support:
        # Called last by check(problem) and by available() with None. An "ok"
        # Support may carry a reason too: here it says which path will run.
        path, why = cls.path(problem)
        if path is None:
            return Support.no(why)
        return Support(True, f"path {path}: {why}")

    # ---- the op -------------------------------------------------------------
    def __init__(self, problem: MoeProblem) -> None:
        super().__init__(problem)
        path, why = self.path(problem)
        if path is None:  # check() said no; a runner never gets here
            raise InvalidInputError(f"torch_grouped cannot run this problem: {why}")
        self.path_name, self.path_reason = path, why
        self._forward = self._forward_grouped_mm if path == GROUPED_MM else self._forward_loop
        # expert e's group ends at the number of sorted ids <= e
        self._experts = torch.arange(self.config.num_experts, dtype=torch.int32, device=problem.device)

    def prepare(self, weights: MoeWeights) -> GroupedWeights:
        def aligned(t: torch.Tensor) -> torch.Tensor:
            t = t.contiguous()
            # _grouped_mm reads operands with 16-byte vector loads
            return t.clone() if t.data_ptr() % 16 else t

        return GroupedWeights(aligned(weights.w13).transpose(1, 2), aligned(weights.w2).transpose(1, 2))

    def apply(
        self,
        hidden_states: torch.Tensor,
        topk_ids: torch.Tensor,
        topk_weights: torch.Tensor,
        prepared: GroupedWeights,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        m, k = topk_ids.shape
        if m == 0:
            result = hidden_states.new_zeros(0, self.config.hidden_size, dtype=torch.float32)
        else:
            # expert ids in [0, E) are the runner's to check (MoeRunner(check_expert_ids=...))
            sorted_ids, order = torch.sort(topk_ids.reshape(-1), stable=True)
            token_of = order // k
            route_w = topk_weights.reshape(-1).index_select(0, order).unsqueeze(1)
            y = self._forward(hidden_states, sorted_ids, token_of, prepared)  # [M*k, H] float32, sorted order
            y = y * route_w
            # back to (token, slot) order, then a fixed-order sum over the k slots
            unsorted = torch.empty_like(y)
            unsorted[order] = y
            result = unsorted.view(m, k, -1).sum(dim=1)
        if out is None:
            return result.to(self.config.dtype)
        out.copy_(result)
        return out

    def _forward_grouped_mm(self, x, sorted_ids, token_of, w: GroupedWeights) -> torch.Tensor:
        # group ends: int32 cumulative expert counts, computed on the device
        offs = torch.searchsorted(sorted_ids, self._experts, right=True, out_int32=True)
        xs = x.index_select(0, token_of)  # [M*k, H], rows grouped by expert
        h13 = torch._grouped_mm(xs, w.w13_t, offs=offs)  # [M*k, 2I]
        act = apply_activation("silu", h13.float()).to(x.dtype)  # [M*k, I]
        return torch._grouped_mm(act, w.w2_t, offs=offs).float()  # [M*k, H]

    def _forward_loop(self, x, sorted_ids, token_of, w: GroupedWeights) -> torch.Tensor:
        counts = torch.bincount(sorted_ids, minlength=self.config.num_experts).tolist()  # one host sync
        xs = x.index_select(0, token_of).float()
        y = torch.empty(xs.shape[0], self.config.hidden_size, dtype=torch.float32, device=x.device)
        start = 0
        for e, n in enumerate(counts):
            if n:
                rows = slice(start, start + n)
                act = apply_activation("silu", xs[rows] @ w.w13_t[e].float())
                y[rows] = act @ w.w2_t[e].float()
                start += n
        return y
