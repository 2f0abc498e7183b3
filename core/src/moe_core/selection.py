"""Step 3 of 3: choose the fused op for a problem.

``backend="auto"`` loads every enabled plugin and ranks the ops whose support
check passes by declared priority (ties broken by name, so the choice is
deterministic); a plugin that fails to load or whose check raises is passed
over with one ``PluginWarning`` (an error under ``MOE_STRICT_PLUGINS``), and so
is a backend name two distributions provide. An explicit backend either works or
raises an error that lists, for every installed backend, why it was not usable.
Nothing here runs per forward: the runner calls ``select`` once.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

from moe_core import guard
from moe_core.config import MoeProblem
from moe_core.discovery import PluginEntry
from moe_core.dtypes import dtype_label
from moe_core.errors import (
    BackendDisabledError,
    BackendNotInstalledError,
    BackendUnavailableError,
    DuplicateBackendError,
    PluginError,
    PluginLoadError,
    PluginWarning,
)
from moe_core.filters import normalize_distribution
from moe_core.known_backends import FIRST_PARTY
from moe_core.plugins import PluginRegistry, default_registry


@dataclass(frozen=True)
class Selection:
    """The fused op chosen for a problem and the entry point it came from."""

    op: type
    entry: PluginEntry

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


def _duplicate_error(name: str, entries: list[PluginEntry]) -> DuplicateBackendError:
    dists = sorted({f"{e.distribution} {e.version}" for e in entries})
    picks = " or ".join(f"backend={e.qualified_name!r}" for e in entries)
    return DuplicateBackendError(
        f"runner backend {name!r} is provided by more than one distribution: {' and '.join(dists)}. "
        f"Pick one with {picks}, or block one with MOE_DISABLE_PLUGINS=<distribution>."
    )


def _served(result) -> list[str]:
    return sorted({a for op in result.fused_ops for a in op.a2a_backends})


def _op_for(result, problem: MoeProblem) -> type | None:
    """The fused op of a loaded plugin that serves the problem's a2a backend, if any."""
    return next((op for op in result.fused_ops if problem.config.a2a_backend in op.a2a_backends), None)


def explain(problem: MoeProblem, registry: PluginRegistry | None = None) -> list[tuple[str, str | None]]:
    """For every installed backend: (qualified name, None if usable else the reason)."""
    registry = registry or default_registry()
    filters = registry.filters()
    out = []
    for e in registry.entries():
        disabled = filters.disabled_reason(e.name, e.distribution)
        if disabled:
            out.append((e.qualified_name, disabled))
            continue
        result = registry.load(e, strict=False)
        if not result.ok:
            out.append((e.qualified_name, f"failed to load: {result.reason}"))
            continue
        op = _op_for(result, problem)
        if op is None:
            out.append((e.qualified_name, f"serves a2a backends {_served(result)}, not {problem.config.a2a_backend!r}"))
            continue
        try:
            answer = guard.support(e, "check", op.check, problem)
        except PluginError as exc:
            out.append((e.qualified_name, f"error: {exc}"))
            continue
        out.append((e.qualified_name, None if answer else answer.reason))
    return out


def _explanation(problem: MoeProblem, registry: PluginRegistry) -> str:
    lines = [f"  - {name}: {'usable' if reason is None else reason}" for name, reason in explain(problem, registry)]
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
    problem: MoeProblem, backend: str | type = "auto", registry: PluginRegistry | None = None
) -> list[Selection]:
    """The fused ops that may run ``problem``, best first: one for an explicit backend; for ``"auto"``
    every supported one in priority order, so a runner whose first choice fails to bind can take the next.

    ``backend`` may also be a ``FusedOp`` subclass itself (as xarray's engines accept a class): no
    discovery, no entry point — for tests and experiments; its support check still runs through the door.
    """
    if isinstance(backend, type):
        return [_select_class(problem, backend)]
    registry = registry or default_registry()
    if backend == "auto":
        return _auto_candidates(problem, registry)
    return [_select_explicit(problem, backend, registry)]


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
    return Selection(op, entry)


def resolve_backend(backend: str, registry: PluginRegistry | None = None):
    """Find, filter and load the plugin behind an explicit backend name.

    Returns the ``LoadResult`` of the one enabled distribution providing it;
    raises ``BackendNotInstalledError``, ``BackendDisabledError``,
    ``DuplicateBackendError`` or ``PluginLoadError`` otherwise.
    """
    registry = registry or default_registry()
    dist, name = parse_backend(backend)
    named = [e for e in registry.entries() if e.name == name]
    if dist is not None:
        chosen = [e for e in named if normalize_distribution(e.distribution) == normalize_distribution(dist)]
        if not chosen and named:
            by = ", ".join(sorted({e.distribution for e in named}))
            raise BackendNotInstalledError(f"runner backend {name!r} is provided by {by}, not by {dist!r}")
        named = chosen
    if not named:
        hint = (
            f"install it with: pip install {FIRST_PARTY[name]}"
            if name in FIRST_PARTY
            else "no known distribution provides it"
        )
        raise BackendNotInstalledError(
            f"runner backend {name!r} is not installed; {hint}. Installed backends: {_installed_summary(registry)}"
        )
    filters = registry.filters()
    enabled = [e for e in named if filters.disabled_reason(e.name, e.distribution) is None]
    if not enabled:
        reasons = "; ".join(f"{e.qualified_name}: {filters.disabled_reason(e.name, e.distribution)}" for e in named)
        raise BackendDisabledError(f"runner backend {name!r} is installed but {reasons}")
    if len({e.distribution for e in enabled}) > 1:
        raise _duplicate_error(name, enabled)
    result = registry.load(enabled[0], strict=False)
    if not result.ok:
        raise PluginLoadError(
            f"runner backend {name!r} failed to load: {result.reason}\n{result.traceback}".rstrip()
        ) from result.error
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
    return Selection(op, result.entry)


def skip(entry: PluginEntry, cause: str, strict: bool, error: BaseException | None = None) -> None:
    """``auto`` passes over a faulty backend: one ``PluginWarning`` naming it, or with ``strict`` an error."""
    message = f"moe backend {entry.qualified_name!r} skipped: {cause}"
    if strict:
        raise PluginLoadError(f"{message} (MOE_STRICT_PLUGINS is set)") from error
    warnings.warn(message, PluginWarning, stacklevel=4)


def _auto_candidates(problem: MoeProblem, registry: PluginRegistry) -> list[Selection]:
    filters = registry.filters()
    dupes = registry.duplicates(filters)
    found: list[tuple[float, str, Selection]] = []
    for entry in registry.enabled_entries(filters):
        if entry.name in dupes:
            if filters.strict:
                raise _duplicate_error(entry.name, dupes[entry.name])
            if entry == dupes[entry.name][0]:  # one warning for the pair, naming both
                skip(entry, str(_duplicate_error(entry.name, dupes[entry.name])), strict=False)
            continue
        result = registry.load(entry, strict=filters.strict)
        if not result.ok:
            skip(entry, result.reason, filters.strict, result.error)
            continue
        op = _op_for(result, problem)
        if op is None:
            continue
        try:
            answer = guard.support(entry, "check", op.check, problem)
        except PluginError as exc:
            skip(entry, str(exc), filters.strict, exc)
            continue
        if answer:
            found.append((-op.priority, entry.name, Selection(op, entry)))
    if not found:
        raise BackendUnavailableError(
            f"no installed backend can run this problem ({_describe(problem)}).\n"
            f"Every installed backend for this problem:\n{_explanation(problem, registry)}"
        )
    # highest priority first, then alphabetical name for a stable choice
    return [sel for *_, sel in sorted(found, key=lambda f: f[:2])]
