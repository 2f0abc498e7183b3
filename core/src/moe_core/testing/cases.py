"""The conformance cases, as data plus one runner — no pytest needed.

``moe check`` runs these directly; ``moe_core.testing.conformance`` wraps the
same cases as a pytest base class that a backend's test module subclasses.
A case is *skipped* when the backend's support check declines it (the reason
is the check's), *failed* when the backend accepted it and got it wrong, and
*passed* otherwise. Everything is compared with the float64 oracle
(``moe_core.reference``) within ``moe_core.tolerances``.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass, field, replace

import torch

from moe_core.config import ACTIVATIONS, MoeConfig, MoeProblem
from moe_core.dtypes import FLOAT_DTYPE_NAMES, float_dtype, short_name
from moe_core.errors import BackendError, InvalidInputError
from moe_core.schemes import SCHEMES

#: activation dtypes tried, in order, when a case leaves the dtype to the backend
DTYPE_PREFERENCE = (torch.bfloat16, torch.float16, torch.float32)

PASSED, FAILED, SKIPPED = "passed", "failed", "skipped"


def _short(dtype: torch.dtype | None) -> str:
    return "any" if dtype is None else short_name(dtype)


@dataclass(frozen=True)
class Case:
    """One conformance case. ``dtype=None`` means the first dtype the backend accepts."""

    kind: str
    scheme: str
    dtype: torch.dtype | None = None
    activation: str = "silu"
    bias: bool = False
    router_weight_on_input: bool = False
    #: "default", "m0", "m1", "large", "one_expert", "zero_weights"
    shape: str = "default"
    #: bad-input variant for kind == "bad_input"
    bad: str = ""
    #: routing bundle for kind "router" / "gated_router" (``ROUTES``)
    route: str = ""

    @property
    def id(self) -> str:
        if self.route:  # a router case: the backend picks its scheme and dtype
            return self.route
        parts = [self.scheme, _short(self.dtype)]
        if self.kind in ("reference", "bias"):
            parts.append(self.activation)
        if self.shape != "default":
            parts.append(self.shape)
        if self.bad:
            parts.append(self.bad)
        return "-".join(parts)


@dataclass
class CaseResult:
    case: Case
    status: str
    reason: str = ""
    error: float | None = None
    tolerance: float | None = None

    def as_dict(self) -> dict:
        return {
            "kind": self.case.kind,
            "id": self.case.id,
            "status": self.status,
            "reason": self.reason,
            "rel_l2_error": self.error,
            "tolerance": self.tolerance,
        }


def _dtypes(scheme: str) -> tuple[torch.dtype, ...]:
    return (float_dtype(scheme),) if scheme in FLOAT_DTYPE_NAMES else DTYPE_PREFERENCE


def all_cases() -> list[Case]:
    """Every case, grouped by kind in a stable order (``moe check`` reports one line per kind)."""
    cases = [
        Case("reference", scheme, dtype, activation=act)
        for scheme in SCHEMES
        for dtype in _dtypes(scheme)
        for act in ACTIVATIONS
    ]
    per_scheme = [
        *(dict(kind="bias", activation=act, bias=True) for act in ACTIVATIONS),
        dict(kind="router_weight_on_input", router_weight_on_input=True),
        *(dict(kind="expert_ids", bad=ids) for ids in ("unassigned", "beyond")),
        *(dict(kind="shapes", shape=shape) for shape in ("m0", "m1", "large", "one_expert", "zero_weights")),
        dict(kind="out_buffer"),
        dict(kind="deterministic"),
        dict(kind="non_contiguous"),
    ]
    cases += [Case(scheme=scheme, **spec) for spec in per_scheme for scheme in SCHEMES]
    for bad in ("dtype", "ids_dtype", "shape", "device", "expert_range", "out_dtype", "out_overlap"):
        cases.append(Case("bad_input", "auto", bad=bad))
    cases += [Case(kind, "auto", route=route) for kind in ("router", "gated_router") for route in ROUTES]
    return cases


#: the routing bundles a backend's fused router (``FusedOp.router`` / ``gated_router``) is checked on
ROUTES = ("softmax", "softmax_all", "sigmoid_top1", "grouped")


def _routing(route: str, num_experts: int, top_k: int, device):
    from moe_core.routing import GroupedTopK, SigmoidTop1, SoftmaxTopK

    if route == "softmax":
        return SoftmaxTopK(top_k)
    if route == "softmax_all":  # the weights are the softmax over all E at the k
        return SoftmaxTopK(top_k, renormalize=False)
    if route == "sigmoid_top1":
        return SigmoidTop1()
    bias = torch.rand(num_experts, generator=torch.Generator().manual_seed(7)).to(device) * 0.1
    return GroupedTopK(top_k, n_group=num_experts // 2, topk_group=2, routed_scaling_factor=2.5,
                       correction_bias=bias)  # fmt: skip


def cases_of(kind: str) -> list[Case]:
    return [c for c in all_cases() if c.kind == kind]


class _Skip(Exception):
    pass


@dataclass
class Conformance:
    """Runs cases against one backend on one device.

    The default shape (E=8, k=2, H=256, I=128) satisfies every scheme's block
    size and FlashInfer's 128-alignment while staying CPU-sized; "large" uses
    259 tokens so every tile size up to 256 sees a partial last tile.
    """

    backend: str
    device: torch.device | str | None = None
    num_experts: int = 8
    top_k: int = 2
    hidden_size: int = 256
    intermediate_size: int = 128
    tokens: int = 16
    large_tokens: int = 259
    seed: int = 0
    registry: object | None = None
    _ops: list = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        if self.device is None:
            self.device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(self.device)

    # ---- plumbing -----------------------------------------------------------
    def fused_op(self):
        """The backend's fused op for a2a 'none' (raises BackendError if unusable)."""
        if not self._ops:
            from moe_core.selection import resolve_backend

            result = resolve_backend(self.backend, self.registry)
            ops = [op for op in result.fused_ops if "none" in op.a2a_backends]
            if not ops:
                raise BackendError(f"backend {self.backend!r} serves no fused op for a2a backend 'none'")
            self._ops.append(ops[0])
        return self._ops[0]

    def config(self, case: Case, dtype: torch.dtype) -> MoeConfig:
        return MoeConfig(
            num_experts=self.num_experts,
            top_k=1 if case.router_weight_on_input else self.top_k,
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            quant_scheme=case.scheme,
            activation=case.activation,
            dtype=dtype,
            has_bias=case.bias,
            apply_router_weight_on_input=case.router_weight_on_input,
        )

    def _supported_config(self, case: Case) -> MoeConfig:
        """The case's config with a dtype the backend accepts, or _Skip with its reason."""
        op = self.fused_op()
        dtypes = (case.dtype,) if case.dtype is not None else _dtypes(case.scheme)
        reasons = []
        for dtype in dtypes:
            cfg = self.config(case, dtype)
            support = op.check(MoeProblem(cfg, self.device))
            if support:
                return cfg
            reasons.append(support.reason)
        raise _Skip(f"{self.backend} declines: {reasons[0]}")

    def _layer(self, cfg: MoeConfig, **runner_kwargs):
        """(canonical weights, runner); fails the case when ``prepare`` changed the caller's weights."""
        from moe_core.runner import MoeRunner
        from moe_core.synthetic import random_weights

        weights = random_weights(cfg, self.device, seed=self.seed)
        pristine = {name: t.clone() for name, t in weights.tensors().items()}
        runner = MoeRunner(cfg, weights, backend=self.backend, registry=self.registry, **runner_kwargs)
        changed = [name for name, t in weights.tensors().items() if not _same_bits(t, pristine[name])]
        if changed:
            raise AssertionError(
                f"prepare modified the caller's canonical weights ({', '.join(changed)}): a runner built later "
                "on the same weights would compute something else"
            )
        return weights, runner

    def _inputs(self, cfg: MoeConfig, shape: str):
        from moe_core.synthetic import random_inputs

        m = {"m0": 0, "m1": 1, "large": self.large_tokens}.get(shape, self.tokens)
        x, ids, tw = random_inputs(cfg, m, self.device, seed=self.seed + 1)
        if shape == "one_expert":  # every token to experts 0..k-1; all other experts get nothing
            ids = torch.arange(cfg.top_k, dtype=torch.int32, device=self.device).expand(m, -1).contiguous()
        if shape == "zero_weights":  # half the tokens carry zero routing weight
            tw = tw.clone()
            tw[::2] = 0.0
        return x, ids, tw

    def _compare(self, cfg, weights, x, ids, tw, out) -> tuple[float, float]:
        from moe_core.reference import reference_for
        from moe_core.tolerances import relative_l2, tolerance

        if out.shape != (x.shape[0], cfg.hidden_size) or out.dtype != cfg.dtype or out.device != x.device:
            raise AssertionError(
                f"output is {list(out.shape)} {out.dtype} on {out.device}, expected "
                f"[{x.shape[0]}, {cfg.hidden_size}] {cfg.dtype} on {x.device}"
            )
        if not bool(torch.isfinite(out).all()):
            raise AssertionError("output contains NaN or Inf")
        ref = reference_for(cfg, weights, x, ids, tw)
        err, tol = relative_l2(out, ref), tolerance(cfg.quant_scheme, cfg.dtype)
        if err > tol:
            raise AssertionError(f"relative L2 error {err:.3g} exceeds the {cfg.quant_scheme} tolerance {tol:.3g}")
        return err, tol

    # ---- cases --------------------------------------------------------------
    def run(self, case: Case) -> CaseResult:
        """Run one case; never raises for a backend's failure (it is reported)."""
        try:
            err_tol = getattr(self, f"_run_{case.kind}")(case)
        except _Skip as skip:
            return CaseResult(case, SKIPPED, str(skip))
        except BackendError as exc:
            return CaseResult(case, FAILED, f"{type(exc).__name__}: {exc}")
        except AssertionError as exc:
            return CaseResult(case, FAILED, str(exc))
        except Exception as exc:
            tb = traceback.format_exc(limit=-3)
            return CaseResult(case, FAILED, f"{type(exc).__name__}: {exc}\n{tb}")
        err, tol = err_tol if err_tol else (None, None)
        return CaseResult(case, PASSED, error=err, tolerance=tol)

    def _run_reference(self, case: Case):
        cfg = self._supported_config(case)
        weights, runner = self._layer(cfg)
        x, ids, tw = self._inputs(cfg, case.shape)
        return self._compare(cfg, weights, x, ids, tw, runner(x, ids, tw))

    _run_bias = _run_router_weight_on_input = _run_shapes = _run_reference

    def _run_out_buffer(self, case: Case):
        cfg = self._supported_config(case)
        weights, runner = self._layer(cfg)
        x, ids, tw = self._inputs(cfg, "default")
        out = torch.full((x.shape[0], cfg.hidden_size), float("nan"), dtype=cfg.dtype, device=self.device)
        got = runner(x, ids, tw, out=out)
        if got is not out:
            raise AssertionError("apply(out=buf) did not return buf itself")
        return self._compare(cfg, weights, x, ids, tw, out)

    def _run_deterministic(self, case: Case):
        cfg = self._supported_config(case)
        weights, runner = self._layer(cfg)
        x, ids, tw = self._inputs(cfg, "large")
        first, second = runner(x, ids, tw).clone(), runner(x, ids, tw)
        if not torch.equal(first, second):
            diff = (first.float() - second.float()).abs().max().item()
            raise AssertionError(f"two calls on the same input differ (max abs difference {diff:.3g})")
        return self._compare(cfg, weights, x, ids, tw, second)

    def _run_non_contiguous(self, case: Case):
        cfg = self._supported_config(case)
        weights, runner = self._layer(cfg)
        x, ids, tw = self._inputs(cfg, "default")
        wide = torch.zeros(x.shape[0], 2 * cfg.hidden_size, dtype=x.dtype, device=x.device)
        wide[:, 1::2] = x
        strided_ids = torch.zeros(ids.shape[0], 2 * cfg.top_k, dtype=ids.dtype, device=ids.device)
        strided_ids[:, ::2] = ids
        xs, ids_s = wide[:, 1::2], strided_ids[:, ::2]
        assert not xs.is_contiguous() and not ids_s.is_contiguous()
        return self._compare(cfg, weights, x, ids, tw, runner(xs, ids_s, tw))

    def _run_expert_ids(self, case: Case):
        """-1 ("unassigned") contributes zero with the id check on and off; other ids outside [0, E)
        (``beyond``: E, 10**6, -5) with the check off either raise InvalidInputError or contribute zero."""
        cfg = self._supported_config(case)
        check = case.bad == "unassigned" and self.device.type != "cuda"
        weights, runner = self._layer(cfg, check_expert_ids=check)
        x, ids, tw = self._inputs(cfg, "default")
        ids = ids.clone()
        ids[0, :] = -1  # a token with no expert here
        if case.bad == "unassigned":
            ids[1::3, -1] = -1
        else:
            ids[1, 0], ids[2, -1], ids[3, 0] = cfg.num_experts, 10**6, -5
        try:
            out = runner(x, ids, tw)
        except InvalidInputError:
            if case.bad == "unassigned":
                raise AssertionError("expert id -1 (unassigned) was refused; it must contribute zero") from None
            return None
        if not bool((out[0] == 0).all()):
            raise AssertionError("a token whose every id is -1 got a non-zero output")
        return self._compare(cfg, weights, x, ids, tw, out)

    def _fused_router(self, case: Case):
        """(config, routing bundle, the backend's ``FusedRouter``) for a router case, or _Skip: no scheme
        usable here, or no kernel offered for the bundle. A hook that raises (warned about by the layer, which
        then routes in torch) fails the case."""
        import warnings

        from moe_core.fused_router import bind

        cfg = self._any_config(case)
        _, runner = self._layer(cfg)
        routing = _routing(case.route, cfg.num_experts, cfg.top_k, self.device)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fused = bind(runner, routing, gate=case.kind == "gated_router")
        problems = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
        if problems:
            raise AssertionError(problems[0])
        if fused is None:
            raise _Skip(f"{self.backend} offers no fused router for {routing!r}")
        if case.kind == "gated_router" and not fused.takes_gate:
            raise _Skip(f"{self.backend} offers no gated router for {routing!r}")
        return cfg, routing, fused

    def _any_config(self, case: Case) -> MoeConfig:
        """The first scheme's config (with a dtype) the backend accepts here, or _Skip."""
        declined = []
        for scheme in SCHEMES:
            try:
                return self._supported_config(replace(case, scheme=scheme))
            except _Skip as skip:
                declined.append(str(skip))
        raise _Skip(f"no scheme is usable on {self.device}; first reason: {declined[0]}")

    def _run_router(self, case: Case):
        """``FusedOp.router``'s kernel on logits of the activation dtype against the bundle itself, at
        ``large_tokens`` rows (partial tiles) and at none."""
        cfg, routing, fused = self._fused_router(case)
        gen = torch.Generator().manual_seed(self.seed + 2)
        for m in (self.large_tokens, 0):
            logits = (torch.randn(m, cfg.num_experts, generator=gen) * 2).to(self.device, cfg.dtype)
            ids, weights = fused(logits)
            ref_ids, ref_weights = routing(logits)
            _check_choice(ids, weights, ref_ids, ref_weights, _ranked_scores(routing, logits), m, routing.top_k,
                          slack=1e-6, atol=1e-5)  # fmt: skip

    def _run_gated_router(self, case: Case):
        """``FusedOp.gated_router``'s kernel on ``(x, gate weight, bias)`` against the bundle on torch's
        ``F.linear`` logits rounded to the activation dtype, at ``tokens`` and ``large_tokens`` rows (a backend
        may take either path by size) and at none. The kernel sums in another order, so its logits
        may round one unit of that dtype apart: the choice is checked within that unit."""
        import torch.nn.functional as F

        cfg, routing, fused = self._fused_router(case)
        gen = torch.Generator().manual_seed(self.seed + 3)
        h, e, dtype = cfg.hidden_size, cfg.num_experts, cfg.dtype
        weight = (torch.randn(e, h, generator=gen) * h**-0.5 * 2).to(self.device, dtype)
        bias = torch.randn(e, generator=gen).to(self.device, dtype)
        eps = 0.0 if dtype == torch.float32 else float(torch.finfo(dtype).eps)
        for m, b in ((self.tokens, None), (self.tokens, bias), (self.large_tokens, bias), (0, None)):
            x = torch.randn(m, h, generator=gen).to(self.device, dtype)
            ids, weights = fused.gated(x, weight, b)
            exact = F.linear(x.float(), weight.float(), None if b is None else b.float())
            ref_ids, ref_weights = routing(exact.to(dtype))
            slack = 1e-5 + eps * float(exact.abs().max()) if m else 0.0
            _check_choice(ids, weights, ref_ids, ref_weights, _ranked_scores(routing, exact), m, routing.top_k,
                          slack=slack, atol=1e-5 + 4 * eps)  # fmt: skip

    def _run_bad_input(self, case: Case):
        op = self.fused_op()
        declined = []
        for scheme in SCHEMES:
            try:
                cfg = self._supported_config(replace(case, scheme=scheme))
                break
            except _Skip as skip:
                declined.append(str(skip))
        else:
            raise _Skip(f"no scheme is usable on {self.device}; first reason: {declined[0]}")
        _, runner = self._layer(cfg)
        x, ids, tw = self._inputs(cfg, "default")
        out = None
        if case.bad == "dtype":
            x = x.to(torch.float64)
        elif case.bad == "ids_dtype":
            ids = ids.long()
        elif case.bad == "shape":
            ids = ids[:, :1]
        elif case.bad == "device":
            other = "meta" if self.device.type != "meta" else "cpu"
            x = x.to(other)
        elif case.bad == "out_dtype":
            out = torch.empty(x.shape[0], cfg.hidden_size, dtype=torch.float64, device=self.device)
        elif case.bad == "out_overlap":  # out written over the input it reads
            out = x
        elif case.bad == "expert_range":
            if self.device.type == "cuda":
                raise _Skip(
                    "out-of-range expert ids on CUDA are caught by a device-side assert, which aborts the "
                    "process; checked on CPU only"
                )
            ids = ids.clone()
            ids[0, 0] = cfg.num_experts
        try:
            result = runner(x, ids, tw, out=out)
        except InvalidInputError:
            return None
        if self.device.type != "meta":
            torch.cuda.synchronize() if self.device.type == "cuda" else None
        raise AssertionError(
            f"bad input '{case.bad}' was accepted by {op.__name__} and returned a "
            f"{list(result.shape)} tensor instead of raising InvalidInputError"
        )


def _check_choice(ids, weights, ref_ids, ref_weights, scores, m: int, top_k: int, slack: float, atol: float) -> None:
    """A fused router's ``(ids, weights)`` against the bundle's ``(ref_ids, ref_weights)``. Equal (or, for a
    gated router, one-rounding-apart) ``scores`` may resolve to either expert, so: the ids are distinct and in
    range, the chosen experts' ``scores`` (the float32 quantity the bundle ranks) sorted equal the bundle's
    within ``slack``, and where both chose the same experts their weights agree within ``atol``."""
    e = scores.shape[1]
    for what, t, dtype in (("topk_ids", ids, torch.int32), ("topk_weights", weights, torch.float32)):
        if tuple(t.shape) != (m, top_k) or t.dtype != dtype:
            raise AssertionError(f"{what} is {list(t.shape)} {t.dtype}, expected [{m}, {top_k}] {dtype}")
    if not m:
        return
    if int(ids.min()) < 0 or int(ids.max()) >= e:
        raise AssertionError(f"expert ids outside [0, {e})")
    if bool((ids.long().sort(1).values.diff(dim=1) == 0).any()):
        raise AssertionError("a token was given the same expert twice")
    chosen = scores.gather(1, ids.long()).sort(1).values
    best = scores.gather(1, ref_ids.long()).sort(1).values
    worst = float((chosen - best).abs().max())
    if worst > slack:
        raise AssertionError(f"the experts chosen are not the top {top_k}: their scores differ by up to {worst:.3g}")
    order, ref_order = ids.long().sort(1), ref_ids.long().sort(1)
    same = (order.values == ref_order.values).all(1)
    if float(same.float().mean()) < 0.9:
        raise AssertionError(f"only {float(same.float().mean()):.0%} of the tokens got the bundle's experts")
    diff = (weights.gather(1, order.indices) - ref_weights.gather(1, ref_order.indices))[same].abs()
    if diff.numel() and float(diff.max()) > atol:
        raise AssertionError(f"routing weights differ from the bundle's by up to {float(diff.max()):.3g}")


def _ranked_scores(routing, logits: torch.Tensor) -> torch.Tensor:
    """What ``routing`` ranks the experts by, in float32: the logits (softmax is monotonic), or grouped
    top-k's biased scores."""
    from moe_core.routing import GroupedTopK

    x = logits.float()
    if type(routing) is not GroupedTopK:
        return x
    scores = x.sigmoid() if routing.scoring == "sigmoid" else torch.softmax(x, dim=-1)
    return scores if routing.correction_bias is None else scores + routing.correction_bias.float()


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equality (NaN-safe, any dtype including fp8): compare the raw bytes."""
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(_bytes(a), _bytes(b))


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)


def summarize(results: list[CaseResult]) -> dict:
    return {
        "passed": sum(r.status == PASSED for r in results),
        "failed": sum(r.status == FAILED for r in results),
        "skipped": sum(r.status == SKIPPED for r in results),
    }
