"""Step 2 of 3: load one discovered plugin, capturing every failure.

Loading imports the entry point's target, registers it with the pluggy
``PluginManager``, checks the hooks (``check_pending``), the API version and
the fused ops it returns (their names, a2a backends and priorities). Every
call into the plugin goes through ``moe_core.guard``; whatever goes wrong is
kept in a ``LoadResult`` — distribution, version, step, exception, traceback —
so one broken plugin never breaks core or another plugin. Strict mode is
applied by the caller, which decides whether a failed result should raise.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass, field

import pluggy

from moe_core import guard, hookspecs
from moe_core.discovery import PluginEntry
from moe_core.errors import PluginError
from moe_core.hookspecs import API_VERSION

LOADED = "loaded"
ERROR = "error"
INCOMPATIBLE = "incompatible"


@dataclass
class LoadResult:
    entry: PluginEntry
    status: str
    #: FusedOp subclasses provided under this entry's name (loaded only)
    fused_ops: tuple[type, ...] = ()
    reason: str = ""
    error: BaseException | None = None
    traceback: str = ""
    plugin: object | None = field(default=None, repr=False)

    @property
    def ok(self) -> bool:
        return self.status == LOADED


def new_plugin_manager() -> pluggy.PluginManager:
    pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
    pm.add_hookspecs(hookspecs)
    return pm


def _impl_of(pm: pluggy.PluginManager, hook_name: str, plugin: object):
    """The hook implementation ``plugin`` registered for ``hook_name``, if any."""
    caller = getattr(pm.hook, hook_name)
    for impl in caller.get_hookimpls():
        if impl.plugin is plugin:
            return impl
    return None


def _failure(entry: PluginEntry, status: str, reason: str, exc: BaseException | None = None) -> LoadResult:
    tb = "".join(traceback.format_exception(exc)) if exc is not None else ""
    return LoadResult(entry, status, reason=f"{guard.where(entry)}: {reason}", error=exc, traceback=tb)


def from_error(entry: PluginEntry, exc: PluginError) -> LoadResult:
    return LoadResult(entry, ERROR, reason=str(exc), error=exc.__cause__ or exc, traceback=exc.traceback)


def import_entry(entry: PluginEntry) -> object:
    """Import the entry point's target (the slow part of loading; needs no lock of core's)."""
    return guard.call(entry, f"import of {entry.value!r}", entry.entry_point.load)


def load_entry(pm: pluggy.PluginManager, entry: PluginEntry, plugin: object | None = None) -> LoadResult:
    """Import (unless ``plugin`` is given), register and validate one entry point. Never raises but
    ``KeyboardInterrupt``: every failure of plugin code is a ``LoadResult`` with its cause."""
    try:
        if plugin is None:
            plugin = import_entry(entry)
        return _register(pm, entry, plugin)
    except PluginError as exc:
        return from_error(entry, exc)


def _register(pm: pluggy.PluginManager, entry: PluginEntry, plugin: object) -> LoadResult:
    """Register ``plugin`` and ask its hooks; the caller holds the plugin manager's lock."""
    from moe_core.fused_op import FusedOp

    registered_here = False
    if not pm.is_registered(plugin):
        try:
            guard.call(entry, "registering its hooks", pm.register, plugin, name=entry.qualified_name)
            registered_here = True
            guard.call(entry, "hook validation", pm.check_pending)
        except PluginError as exc:
            if registered_here:
                pm.unregister(plugin)
            return LoadResult(
                entry, ERROR, reason=f"{exc} (invalid hooks)", error=exc.__cause__, traceback=exc.traceback
            )

    def fail(status, reason, exc=None):
        if registered_here:
            pm.unregister(plugin)
        return _failure(entry, status, reason, exc)

    try:
        impl = _impl_of(pm, "moe_api_version", plugin)
        if impl is None:
            return fail(INCOMPATIBLE, "declares no plugin API version (implement the moe_api_version hook)")
        version = guard.call(entry, "moe_api_version hook", impl.function)
        if version != API_VERSION:
            return fail(
                INCOMPATIBLE,
                f"targets moe-core plugin API version {version!r}, but this moe-core provides API version "
                f"{API_VERSION}",
            )
        impl = _impl_of(pm, "moe_fused_ops", plugin)
        if impl is None:
            return fail(ERROR, "provides no fused ops (implement the moe_fused_ops hook)")
        ops = guard.call(entry, "moe_fused_ops hook", lambda: list(impl.function() or ()))
        bad = [op for op in ops if not (isinstance(op, type) and issubclass(op, FusedOp))]
        if bad:
            return fail(ERROR, f"moe_fused_ops returned non-FusedOp objects: {bad!r}")
        mine = tuple(op for op in ops if guard.call(entry, "name", getattr, op, "name", None) == entry.name)
        if not mine:
            provided = ", ".join(sorted({str(getattr(op, "name", "?")) for op in ops})) or "nothing"
            return fail(
                ERROR, f"entry point {entry.name!r} provides no fused op named {entry.name!r} (it provides: {provided})"
            )
        keys = []
        for op in mine:
            a2a = guard.call(entry, "a2a_backends", getattr, op, "a2a_backends")
            if isinstance(a2a, str) or not all(isinstance(a, str) for a in a2a):
                return fail(ERROR, f"{op.__name__}.a2a_backends must be a tuple of names, got {a2a!r}")
            guard.priority(entry, op)
            keys += [(a, op.name) for a in a2a]
    except PluginError as exc:
        if registered_here:
            pm.unregister(plugin)
        return from_error(entry, exc)
    repeated = sorted({k for k in keys if keys.count(k) > 1})
    if repeated:
        return fail(ERROR, f"two fused ops for the same (a2a, runner) key: {repeated}")
    return LoadResult(entry, LOADED, fused_ops=mine, plugin=plugin)
