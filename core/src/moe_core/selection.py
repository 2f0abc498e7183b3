"""Step 3 of 3: choose the fused op for a problem.

``backend="auto"`` loads every enabled plugin and ranks the ops whose support
check passes and that may be chosen automatically (``Support.explicit_only`` says
not): first those the measured selection table has times for, fastest first under
its rule (``moe_core.selection_table``), then the rest by priority for the problem
(``FusedOp.priority_for``), ties broken by name, so the choice is deterministic. A
plugin that fails to load or whose check raises is passed over with one
``PluginWarning`` (an error under ``MOE_STRICT_PLUGINS``), and so is a backend name
two distributions provide. Every selection says why (``Selection.why``) and what
was considered (``Selection.candidates``: ``moe backends --explain``). An explicit
backend either works or raises an error that lists, for every installed backend,
why it was not usable. Nothing here runs per forward: the runner calls ``select``
once.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

from moe_core import guard, selection_table
from moe_core.config import MoeProblem
from moe_core.discovery import GROUP, PluginEntry
from moe_core.dtypes import dtype_label
from moe_core.errors import (
    BackendDisabledError,
    BackendNotInstalledError,
    BackendUnavailableError,
    DuplicateBackendError,
    InvalidInputError,
    PluginError,
    PluginLoadError,
    PluginWarning,
)
from moe_core.filters import normalize_distribution
from moe_core.known_backends import FIRST_PARTY
from moe_core.plugins import PluginRegistry, default_registry


@dataclass(frozen=True)
class Candidate:
    """One installed backend as selection saw it for a problem: usable or why not, whether ``auto`` may pick
    it, its priority for the problem, its measured times and score where the table has them, and its place
    in ``auto``'s order (0: what ``auto`` binds; None: not an ``auto`` candidate)."""

    name: str
    usable: bool
    automatic: bool
    reason: str
    priority: float | None = None
    times_us: dict[int, float] | None = None
    score: float | None = None
    rank: int | None = None

    def as_dict(self) -> dict:
        d = dict(self.__dict__)
        d["times_us"] = None if self.times_us is None else {str(m): t for m, t in self.times_us.items()}
        return d


@dataclass(frozen=True)
class Selection:
    """The fused op chosen for a problem, the entry point it came from, why it was chosen, and every
    installed backend as selection saw it (``candidates``; empty for an explicit request)."""

    op: type
    entry: PluginEntry
    why: str = ""
    candidates: tuple[Candidate, ...] = ()

    @property
    def name(self) -> str:
        return self.entry.name


def parse_backend(spec: str) -> tuple[str | None, str]:
    """``"triton"`` -> (None, "triton"); ``"moe-triton:triton"`` -> ("moe-triton", "triton")."""
    if not isinstance(spec, str) or not spec.strip():
        raise BackendNotInstalledError(f"backend must be a non-empty string, got {spec!r}")
    dist, sep, name = spec.strip().rpartition(":")
    return (dist or None) if sep else None, name


def _installed_summary(registry: PluginRegistry) -> str:
    names = sorted({e.qualified_name for e in registry.entries()})
    return ", ".join(names) if names else "none"


def _duplicate_error(name: str, entries: list[PluginEntry], noun: str = "runner backend") -> DuplicateBackendError:
    dists = sorted({f"{e.distribution} {e.version}" for e in entries})
    picks = " or ".join(f"{noun.rpartition(' ')[2]}={e.qualified_name!r}" for e in entries)
    return DuplicateBackendError(
        f"{noun} {name!r} is provided by more than one distribution: {' and '.join(dists)}. "
        f"Pick one with {picks}, or block one with MOE_DISABLE_PLUGINS=<distribution>."
    )


def _served(result) -> list[str]:
    return sorted({a for op in result.fused_ops for a in op.a2a_backends})


def _op_for(result, problem: MoeProblem) -> type | None:
    """The fused op of a loaded plugin that serves the problem's a2a backend, if any."""
    return next((op for op in result.fused_ops if problem.config.a2a_backend in op.a2a_backends), None)


@dataclass
class _Seen:
    """An installed backend after the support check: the op and its answer, or why it is out."""

    entry: PluginEntry
    op: type | None = None
    answer: object | None = None  # a Support
    reason: str = ""
    priority: float | None = None


def _survey(
    problem: MoeProblem, registry: PluginRegistry, *, warn: bool, dispatcher: type | None = None
) -> list[_Seen]:
    """Every installed backend for ``problem``. ``warn``: the way ``auto`` treats a faulty plugin (a warning
    each, an error under ``MOE_STRICT_PLUGINS``); else silently, as a reason on its row. ``dispatcher``: the
    ``Dispatcher`` class whose tokens the op will run; an op that cannot read them is out, with the reason
    (``moe_core.dispatch.format_refusal``)."""
    filters = registry.filters()
    dupes = registry.duplicates(filters)
    out = []
    for e in registry.entries():
        disabled = filters.disabled_reason(e.name, e.distribution)
        if disabled:
            out.append(_Seen(e, reason=disabled))
            continue
        if e.name in dupes:
            error = _duplicate_error(e.name, dupes[e.name])
            if warn:
                if filters.strict:
                    raise error
                if e == dupes[e.name][0]:  # one warning for the pair, naming both
                    skip(e, str(error), strict=False)
            out.append(_Seen(e, reason=str(error)))
            continue
        result = registry.load(e, strict=filters.strict if warn else False)
        if not result.ok:
            if warn:
                skip(e, result.reason, filters.strict, result.error)
            out.append(_Seen(e, reason=f"failed to load: {result.reason}"))
            continue
        op = _op_for(result, problem)
        if op is None:
            out.append(_Seen(e, reason=f"serves a2a backends {_served(result)}, not {problem.config.a2a_backend!r}"))
            continue
        refusal = _format_refusal(dispatcher, op)
        if refusal:
            out.append(_Seen(e, op, reason=refusal))
            continue
        try:
            answer = guard.support(e, "check", op.check, problem)
            priority = guard.priority(e, op, problem) if answer else None
        except PluginError as exc:
            if warn:
                skip(e, str(exc), filters.strict, exc)
            out.append(_Seen(e, op, reason=f"error: {exc}"))
            continue
        out.append(_Seen(e, op, answer, answer.reason, priority))
    return out


def explain(problem: MoeProblem, registry: PluginRegistry | None = None) -> list[tuple[str, str | None]]:
    """For every installed backend: (qualified name, None if usable else the reason). A backend that runs the
    problem only when named (``Support.explicit_only``) is usable."""
    seen = _survey(problem, registry or default_registry(), warn=False)
    return [(s.entry.qualified_name, None if s.answer else s.reason) for s in seen]


def explain_auto(
    problem: MoeProblem, registry: PluginRegistry | None = None, dispatcher: type | None = None
) -> tuple[tuple[Candidate, ...], list[Selection]]:
    """(every installed backend as ``auto`` sees it for ``problem`` — for the tokens of ``dispatcher`` when
    given —, ``auto``'s order best first — ``[]`` when it can choose none — each with its ``why``); nothing is
    warned about (``moe backends --explain``). ``InvalidInputError`` for an unknown ``MOE_SELECTION_RULE``."""
    return _auto_order(problem, registry or default_registry(), warn=False, dispatcher=dispatcher)


def _explanation(problem: MoeProblem, registry: PluginRegistry, dispatcher: type | None = None) -> str:
    lines = []
    for s in _survey(problem, registry, warn=False, dispatcher=dispatcher):
        if not s.answer:
            state = s.reason
        elif not s.answer.automatic:
            state = f"usable when named; auto passes over it: {s.answer.reason}"
        else:
            state = "usable"
        lines.append(f"  - {s.entry.qualified_name}: {state}")
    return "\n".join(lines) if lines else "  (no backend is installed)"


def _describe(problem: MoeProblem) -> str:
    c = problem.config
    return (
        f"E={c.num_experts} top_k={c.top_k} H={c.hidden_size} I={c.intermediate_size} "
        f"scheme={c.quant_scheme} activation={c.activation} dtype={dtype_label(c.dtype)} "
        f"bias={c.has_bias} a2a={c.a2a_backend} device={problem.device}"
    )


def select(problem: MoeProblem, backend: str | type = "auto", registry: PluginRegistry | None = None) -> Selection:
    """Choose the fused op for ``problem``; raise a ``BackendError`` saying why not."""
    return candidates(problem, backend, registry)[0]


def candidates(
    problem: MoeProblem,
    backend: str | type = "auto",
    registry: PluginRegistry | None = None,
    dispatcher: type | None = None,
) -> list[Selection]:
    """The fused ops that may run ``problem``, best first: one for an explicit backend; for ``"auto"``
    every supported one in priority order, so a runner whose first choice fails to bind can take the next.

    ``backend`` may also be a ``FusedOp`` subclass itself (as xarray's engines accept a class): no
    discovery, no entry point — for tests and experiments; its support check still runs through the door.
    ``dispatcher``: the ``Dispatcher`` class whose tokens the op will run: ``auto`` passes over the ops that
    cannot read them, an explicit backend that cannot is refused (``moe_core.dispatch.check_formats``).
    """
    if isinstance(backend, type):
        chosen = [_select_class(problem, backend)]
    else:
        registry = registry or default_registry()
        if backend == "auto":
            return _auto_candidates(problem, registry, dispatcher)
        chosen = [_select_explicit(problem, backend, registry)]
    refusal = _format_refusal(dispatcher, chosen[0].op)
    if refusal:
        raise BackendUnavailableError(refusal)
    return chosen


def _format_refusal(dispatcher: type | None, op: type) -> str:
    from moe_core.dispatch import format_refusal

    return "" if dispatcher is None else format_refusal(dispatcher, op)


def _select_class(problem: MoeProblem, op: type) -> Selection:
    from moe_core.fused_op import FusedOp

    if not issubclass(op, FusedOp):
        raise BackendNotInstalledError(f"backend must be a name, 'auto' or a FusedOp subclass, got {op!r}")
    entry = PluginEntry.direct(op)
    try:
        answer = guard.support(entry, "check", op.check, problem)
    except PluginError as exc:
        raise BackendUnavailableError(f"{op.__qualname__} failed its support check: {exc}") from exc
    if not answer:
        raise BackendUnavailableError(
            f"{op.__qualname__} cannot run this problem ({_describe(problem)}): {answer.reason}"
        )
    return Selection(op, entry, why=f"passed as a class ({op.__qualname__})")


def resolve_backend(backend: str, registry: PluginRegistry | None = None):
    """Find, filter and load the plugin behind an explicit backend name (a dispatcher name with a registry of
    ``moe.a2a``: the messages say which kind).

    Returns the ``LoadResult`` of the one enabled distribution providing it;
    raises ``BackendNotInstalledError``, ``BackendDisabledError``,
    ``DuplicateBackendError`` or ``PluginLoadError`` otherwise.
    """
    registry = registry or default_registry()
    noun = registry.kind.noun
    dist, name = parse_backend(backend)
    named = [e for e in registry.entries() if e.name == name]
    if dist is not None:
        chosen = [e for e in named if normalize_distribution(e.distribution) == normalize_distribution(dist)]
        if not chosen and named:
            by = ", ".join(sorted({e.distribution for e in named}))
            raise BackendNotInstalledError(f"{noun} {name!r} is provided by {by}, not by {dist!r}")
        named = chosen
    if not named:
        hint = (
            f"install it with: pip install {FIRST_PARTY[name]}"
            if name in FIRST_PARTY and registry.group == GROUP
            else "no known distribution provides it"
        )
        raise BackendNotInstalledError(
            f"{noun} {name!r} is not installed; {hint}. Installed {noun}s: {_installed_summary(registry)}"
        )
    filters = registry.filters()
    enabled = [e for e in named if filters.disabled_reason(e.name, e.distribution) is None]
    if not enabled:
        reasons = "; ".join(f"{e.qualified_name}: {filters.disabled_reason(e.name, e.distribution)}" for e in named)
        raise BackendDisabledError(f"{noun} {name!r} is installed but {reasons}")
    if len({e.distribution for e in enabled}) > 1:
        raise _duplicate_error(name, enabled, noun)
    result = registry.load(enabled[0], strict=False)
    if not result.ok:
        raise PluginLoadError(f"{noun} {name!r} failed to load: {result.reason}\n{result.traceback}".rstrip()) from (
            result.error
        )
    return result


def _select_explicit(problem: MoeProblem, backend: str, registry: PluginRegistry) -> Selection:
    result = resolve_backend(backend, registry)
    name = result.entry.name
    op = _op_for(result, problem)
    if op is None:
        raise BackendUnavailableError(
            f"runner backend {name!r} has no fused op for a2a backend {problem.config.a2a_backend!r} "
            f"(it serves {_served(result)})"
        )
    try:
        answer = guard.support(result.entry, "check", op.check, problem)
    except PluginError as exc:
        raise BackendUnavailableError(f"runner backend {name!r} failed its support check: {exc}") from exc
    if not answer:
        raise BackendUnavailableError(
            f"runner backend {name!r} cannot run this problem ({_describe(problem)}): {answer.reason}\n"
            f"Every installed backend for this problem:\n{_explanation(problem, registry)}"
        )
    return Selection(op, result.entry, why=f"asked for by name ({backend!r})")


def skip(entry: PluginEntry, cause: str, strict: bool, error: BaseException | None = None) -> None:
    """``auto`` passes over a faulty backend: one ``PluginWarning`` naming it, or with ``strict`` an error."""
    message = f"moe backend {entry.qualified_name!r} skipped: {cause}"
    if strict:
        raise PluginLoadError(f"{message} (MOE_STRICT_PLUGINS is set)") from error
    warnings.warn(message, PluginWarning, stacklevel=4)


def _auto_candidates(problem: MoeProblem, registry: PluginRegistry, dispatcher: type | None) -> list[Selection]:
    _, ordered = _auto_order(problem, registry, warn=True, dispatcher=dispatcher)
    if not ordered:
        raise BackendUnavailableError(
            f"no installed backend can run this problem ({_describe(problem)}) when chosen automatically.\n"
            f"Every installed backend for this problem:\n{_explanation(problem, registry, dispatcher)}"
        )
    return ordered


def _auto_order(
    problem: MoeProblem, registry: PluginRegistry, *, warn: bool, dispatcher: type | None = None
) -> tuple[tuple[Candidate, ...], list[Selection]]:
    seen = _survey(problem, registry, warn=warn, dispatcher=dispatcher)
    pool = {s.entry.name: s for s in seen if s.answer and s.answer.automatic}
    priorities = {name: s.priority for name, s in pool.items()}
    try:
        ranking = selection_table.rank(
            problem, {name: (s.entry.distribution, s.entry.version) for name, s in pool.items()}, priorities
        )
    except ValueError as exc:  # an unknown MOE_SELECTION_RULE: a configuration error, not a plugin's
        raise InvalidInputError(str(exc)) from None
    unmeasured = sorted((n for n in pool if n not in ranking.order), key=lambda n: (-priorities[n], n))
    order = ranking.order + unmeasured
    rank = {name: i for i, name in enumerate(order)}
    candidates = tuple(_candidate(s, ranking, rank.get(s.entry.name)) for s in seen)
    return candidates, [
        Selection(pool[n].op, pool[n].entry, _why(n, i, ranking, priorities, order), candidates)
        for i, n in enumerate(order)
    ]


def _candidate(s: _Seen, ranking, rank: int | None) -> Candidate:
    name = s.entry.name
    if not s.answer:
        reason = s.reason
    elif not s.answer.automatic:
        reason = f"usable when named; auto passes over it: {s.answer.reason}"
    else:
        reason = ranking.notes.get(name, "") or s.answer.reason
    return Candidate(
        name=s.entry.qualified_name,
        usable=bool(s.answer),
        automatic=bool(s.answer) and s.answer.automatic,
        reason=reason,
        priority=s.priority,
        times_us=ranking.times.get(name),
        score=ranking.scores.get(name),
        rank=rank,
    )


def _why(name: str, i: int, ranking, priorities: dict[str, float], order: list[str]) -> str:
    """Why ``name`` sits at place ``i`` of ``auto``'s order."""
    if name in ranking.scores:
        others = [n for n in ranking.order if n != name]
        versus = f"; next {others[0]} {ranking.scores[others[0]]:.2f}" if others and i == 0 else ""
        tie = ""
        if i == 0 and others and ranking.scores[others[0]] <= ranking.scores[name] * (1 + selection_table.TIE):
            tie = f" (within {selection_table.TIE:.0%} of {others[0]}: priority {priorities[name]:g} decides)"
        measured = (
            f"measured {'fastest' if i == 0 else f'#{i + 1}'} for this problem on this device: score "
            f"{ranking.scores[name]:.2f}{versus}{tie} (rule {ranking.rule!r}, {ranking.mode} weights, tokens "
            f"{','.join(map(str, ranking.counts))}; 1.00 = the fastest at every count)"
        )
        return measured
    where = "no backend was measured" if not ranking.scores else "not measured"
    return (
        f"priority {priorities[name]:g} ({where} for this problem on this device: `moe select record`)"
        if i == 0 or not ranking.scores
        else f"not measured, priority {priorities[name]:g}: after every measured backend"
    )
