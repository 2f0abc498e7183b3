"""Routing in torch: router logits -> (topk_ids int32 [M, k], topk_weights float32 [M, k]).

Kept apart from the fused op so any backend can be fed by any router. All
arithmetic is float32 whatever the logits' dtype. The k experts of a token come
in no particular order where the choice is a top-k (``sorted=False``): a sorted
top-k sorts its k results in a kernel of its own, and the forward sums a token's
slots, so their order changes nothing but the rounding of that sum.

- ``softmax_topk``: softmax over all experts, top-k, optional renormalisation
  (Qwen2-MoE / Qwen3-MoE / OLMoE ``norm_topk_prob``; Mixtral renormalises).
- ``topk_softmax``: top-k of the logits, softmax over the k selected (Mixtral,
  gpt-oss, GraniteMoe and its Shared/SWA/Hybrid variants). Softmax is monotone
  and the renormalised softmax over a subset equals the softmax of that
  subset's logits, so this equals ``softmax_topk(renormalize=True)``.
- ``grouped_topk``: sigmoid (or softmax) scoring with ``e_score_correction_bias``
  used for *choosing* only, group-limited choice (``n_group`` groups, the best
  ``topk_group`` kept, a group scored by the sum of its two best experts, or by
  its best expert), renormalisation and ``routed_scaling_factor`` (DeepSeek-V3;
  DeepSeek-V2 with softmax scoring, ``group_scoring="max"``, no renormalisation); with
  ``n_group=1`` a plain (optionally biased) sigmoid / softmax top-k whose renormalisation
  denominator ``max(sum + renormalize_eps, renormalize_min)`` fits MiniMax-M2, Flint, LFM2-MoE
  (``eps=1e-6``), Ernie 4.5 (``clamp(min=norm_min)``) and Mistral 4 (softmax, groups).
- ``sigmoid_top1``: top-1 with weight ``sigmoid(logit)`` meant to be applied to
  the expert *input* (Llama 4; ``MoeConfig.apply_router_weight_on_input``).
- ``sparsemixer``: PhiMoE's top-2 SparseMixer in its inference (eval) form.

``SoftmaxTopK``, ``GroupedTopK`` and ``SigmoidTop1`` are ``softmax_topk``, ``grouped_topk`` and
``sigmoid_top1`` as named bundles of their parameters: a router whose choice is one (``HFRouter.route``)
says *what* it computes, so a layer can ask its backend for a fused kernel of it (``FusedOp.router``)
instead of running the torch ops; called, a bundle is its function.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import torch

from moe_core.errors import InvalidInputError


def _check(logits: torch.Tensor, top_k: int) -> torch.Tensor:
    """``logits`` checked, as they are (the callers cast where the arithmetic needs float32)."""
    if not isinstance(logits, torch.Tensor) or logits.dim() != 2:
        raise InvalidInputError("router logits must be a [M, E] tensor")
    if not logits.dtype.is_floating_point:
        raise InvalidInputError(f"router logits must be floating point, got {logits.dtype}")
    if not 1 <= top_k <= logits.shape[1]:
        raise InvalidInputError(f"top_k={top_k} must be in [1, E={logits.shape[1]}]")
    return logits


def _out(ids: torch.Tensor, weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return ids.to(torch.int32), weights.to(torch.float32)


def softmax_topk(logits: torch.Tensor, top_k: int, renormalize: bool = True):
    """Softmax over experts, then the k largest probabilities (renormalised to sum 1 when ``renormalize``).

    Renormalised, that is the softmax of the k largest logits (``topk_softmax``): the same choice (softmax
    is monotone) and the same weights, in three kernels instead of six — at decode each kernel of the
    router costs as much host time as the arithmetic of the whole router."""
    if renormalize:
        return topk_softmax(logits, top_k)
    probs = torch.softmax(_check(logits, top_k), dim=-1, dtype=torch.float32)
    weights, ids = probs.topk(top_k, dim=-1, sorted=False)
    return _out(ids, weights)


@dataclass(frozen=True)
class SoftmaxTopK:
    """``softmax_topk(logits, top_k, renormalize)`` as data: what a backend's fused router must compute.

    A fused kernel returns the same k experts per token (in any order; ties between equal logits may
    resolve to either expert, as in ``torch.topk``) with the same float32 weights up to float32 rounding."""

    top_k: int
    renormalize: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 1:
            raise InvalidInputError(f"top_k must be a positive int, got {self.top_k!r}")

    def __call__(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return softmax_topk(logits, self.top_k, self.renormalize)


def topk_softmax(logits: torch.Tensor, top_k: int):
    """Top-k of the logits, then softmax over the k selected, in float32 (Mixtral). The top-k runs on the
    logits as given: casting to float32 is exact, so it keeps their order and the k chosen."""
    values, ids = _check(logits, top_k).topk(top_k, dim=-1, sorted=False)
    return _out(ids, torch.softmax(values, dim=-1, dtype=torch.float32))


def grouped_topk(
    logits: torch.Tensor,
    top_k: int,
    *,
    n_group: int = 1,
    topk_group: int = 1,
    correction_bias: torch.Tensor | None = None,
    scoring: str = "sigmoid",
    renormalize: bool = True,
    routed_scaling_factor: float = 1.0,
    group_scoring: str = "top2_sum",
    renormalize_eps: float = 1e-20,
    renormalize_min: float = 0.0,
):
    """DeepSeek routing: biased choice within the best groups, unbiased weights.

    ``s = sigmoid(logits)`` (or ``softmax``); the choice uses ``c = s + correction_bias``; with
    ``n_group > 1`` a group's score is the sum of its two best ``c`` (``group_scoring="top2_sum"``,
    DeepSeek-V3) or its best ``c`` (``"max"``, DeepSeek-V2's ``group_limited_greedy``), the best
    ``topk_group`` groups are kept (the others masked with ``-inf``), the top-k of ``c`` chosen;
    ``w = s[ids]``, divided by ``max(sum(w) + renormalize_eps, renormalize_min)`` (DeepSeek:
    ``sum(w) + 1e-20``) iff ``renormalize``, times ``routed_scaling_factor``. DeepSeek-V2's ``greedy``
    is ``n_group=1``, softmax, no renormalisation.
    """
    x = _check(logits, top_k).float()
    m, e = x.shape
    if scoring == "sigmoid":
        scores = x.sigmoid()
    elif scoring == "softmax":
        scores = torch.softmax(x, dim=-1)
    else:
        raise InvalidInputError(f"scoring must be 'sigmoid' or 'softmax', got {scoring!r}")
    problem = _grouping_problem(e, top_k, n_group, topk_group, correction_bias)
    if problem:
        raise InvalidInputError(problem)
    per_group = e // n_group
    choice = scores
    if correction_bias is not None:
        choice = scores + correction_bias.to(device=x.device, dtype=torch.float32)
    if n_group > 1:
        grouped = choice.view(m, n_group, per_group)
        if group_scoring == "top2_sum":
            group_score = grouped.topk(min(2, per_group), dim=-1).values.sum(dim=-1)  # [M, n_group]
        elif group_scoring == "max":
            group_score = grouped.amax(dim=-1)
        else:
            raise InvalidInputError(f"group_scoring must be 'top2_sum' or 'max', got {group_scoring!r}")
        keep = torch.zeros_like(group_score, dtype=torch.bool)
        keep.scatter_(1, group_score.topk(topk_group, dim=-1).indices, True)
        choice = choice.masked_fill(~keep.repeat_interleave(per_group, dim=1), float("-inf"))
    ids = choice.topk(top_k, dim=-1).indices
    weights = scores.gather(1, ids)
    if renormalize:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + renormalize_eps).clamp(min=renormalize_min)
    return _out(ids, weights * routed_scaling_factor)


def _grouping_problem(e: int, top_k: int, n_group: int, topk_group: int, correction_bias) -> str:
    """Why ``grouped_topk`` cannot route ``e`` experts with these parameters, or ``""``."""
    if n_group < 1 or e % n_group:
        return f"n_group={n_group} must divide the number of experts {e}"
    if not 1 <= topk_group <= n_group:
        return f"topk_group={topk_group} must be in [1, n_group={n_group}]"
    if top_k > topk_group * (e // n_group):
        return f"top_k={top_k} exceeds the {topk_group * (e // n_group)} experts in the chosen groups"
    if correction_bias is not None and tuple(correction_bias.shape) != (e,):
        return f"correction_bias must be [{e}], got {list(correction_bias.shape)}"
    return ""


@dataclass(frozen=True, eq=False)
class GroupedTopK:
    """``grouped_topk(logits, top_k, ...)`` as data: what a backend's fused router must compute (DeepSeek-V2/V3
    and their clones, Mistral 4, and the one-group sigmoid / softmax routers: MiniMax-M2, LFM2-MoE, Ernie 4.5).

    ``correction_bias`` is the block's own tensor (referenced, read at each call), so bundles compare by
    identity: two bundles with equal numbers but different biases choose differently. A fused kernel returns
    the same k experts per token (in any order; near-ties of the biased scores may resolve to either expert)
    with the same float32 weights up to float32 rounding."""

    top_k: int
    n_group: int = 1
    topk_group: int = 1
    scoring: str = "sigmoid"
    renormalize: bool = True
    routed_scaling_factor: float = 1.0
    group_scoring: str = "top2_sum"
    renormalize_eps: float = 1e-20
    renormalize_min: float = 0.0
    correction_bias: torch.Tensor | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        for name in ("top_k", "n_group", "topk_group"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidInputError(f"{name} must be a positive int, got {value!r}")
        if self.topk_group > self.n_group:
            raise InvalidInputError(f"topk_group={self.topk_group} must be in [1, n_group={self.n_group}]")
        if self.scoring not in ("sigmoid", "softmax"):
            raise InvalidInputError(f"scoring must be 'sigmoid' or 'softmax', got {self.scoring!r}")
        if self.group_scoring not in ("top2_sum", "max"):
            raise InvalidInputError(f"group_scoring must be 'top2_sum' or 'max', got {self.group_scoring!r}")
        bias = self.correction_bias
        if bias is not None and (not isinstance(bias, torch.Tensor) or bias.dim() != 1):
            raise InvalidInputError("correction_bias must be a 1-D tensor [E] or None")

    def __call__(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return grouped_topk(logits, **{f.name: getattr(self, f.name) for f in fields(self)})  # same names

    def problem(self, num_experts: int) -> str:
        """Why this bundle cannot route ``num_experts`` experts (``grouped_topk`` would raise it), or ``""``."""
        return _grouping_problem(num_experts, self.top_k, self.n_group, self.topk_group, self.correction_bias)

    def __repr__(self) -> str:
        shown = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in fields(self) if f.name != "correction_bias")
        return f"GroupedTopK({shown}, correction_bias={'yes' if self.correction_bias is not None else 'no'})"


def sigmoid_top1(logits: torch.Tensor):
    """Llama 4: the best expert, weight ``sigmoid(logit)`` (apply it on the input).

    transformers' ``Llama4Router`` keeps the top-k logits, sets the others to ``-inf`` and takes the
    sigmoid (0 for the others); with ``top_k=1`` (every Llama 4) that is this.
    """
    values, ids = _check(logits, 1).topk(1, dim=-1)
    return _out(ids, values.float().sigmoid())


@dataclass(frozen=True)
class SigmoidTop1:
    """``sigmoid_top1`` as data (Llama 4): what a backend's fused router must compute — the best logit's expert
    (chosen on the logits, not on their sigmoid, which saturates to 1 and would tie), weight its sigmoid."""

    top_k: int = field(default=1, init=False)

    def __call__(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return sigmoid_top1(logits)


def sparsemixer(logits: torch.Tensor, jitter_eps: float):
    """PhiMoE: SparseMixer top-2, the inference form of transformers' ``sparsemixer`` (``training=False``).

    Per token, with ``l`` the logits: the first expert is ``i1 = argmax l``; the logits ``l_j`` with
    ``(l[i1] - l_j) / max(|l_j|, l[i1]) > 2 * jitter_eps`` are masked to ``-inf`` and the weight is
    ``softmax(masked l)[i1]``. The second expert is the argmax ``i2`` of ``l`` with ``i1`` removed; the
    same mask relative to ``l[i2]`` (``i1`` stays removed) gives ``softmax(...)[i2]``. Always two experts.
    """
    x = _check(logits, 2).float()
    ids, weights = [], []
    masked = x
    for _ in range(2):
        top, idx = masked.max(dim=-1, keepdim=True)
        far = (top - x) / x.abs().clamp(min=top) > 2 * jitter_eps
        probs = torch.softmax(masked.masked_fill(far, float("-inf")), dim=-1)
        ids.append(idx)
        weights.append(probs.gather(1, idx))
        masked = masked.scatter(1, idx, float("-inf"))
    return _out(torch.cat(ids, dim=1), torch.cat(weights, dim=1))
