"""Step 2 of 3: load one discovered plugin, capturing every failure.

Loading imports the entry point's target, registers it with the pluggy
``PluginManager``, checks the hooks (``check_pending``), the API version and
the classes its kind's hook returns (their base class and names, then what the
kind requires them to declare: ``moe_core.kinds``), for a fused-op plugin and a
dispatcher plugin alike. Every call into the plugin goes through
``moe_core.guard``; whatever goes wrong is kept in a ``LoadResult`` —
distribution, version, step, exception, traceback — so one broken plugin never
breaks core or another plugin. Strict mode is
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
from moe_core.kinds import kind_of

LOADED = "loaded"
ERROR = "error"
INCOMPATIBLE = "incompatible"


@dataclass
class LoadResult:
    entry: PluginEntry
    status: str
    #: the classes provided under this entry's name (loaded only): ``FusedOp`` subclasses for ``moe.fused_ops``,
    #: one ``Dispatcher`` subclass for ``moe.a2a``
    provided: tuple[type, ...] = ()
    reason: str = ""
    error: BaseException | None = None
    traceback: str = ""
    plugin: object | None = field(default=None, repr=False)

    @property
    def ok(self) -> bool:
        return self.status == LOADED

    @property
    def fused_ops(self) -> tuple[type, ...]:
        """``provided``, under the name selection, warmup and tune read it by (an entry of ``moe.fused_ops``)."""
        return self.provided


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
    kind = kind_of(entry.group)
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
        impl = _impl_of(pm, kind.hook, plugin)
        if impl is None:
            return fail(ERROR, f"provides no {kind.thing}s (implement the {kind.hook} hook)")
        provided = guard.call(entry, f"{kind.hook} hook", lambda: list(impl.function() or ()))
        base = kind.base()
        bad = [c for c in provided if not (isinstance(c, type) and issubclass(c, base))]
        if bad:
            return fail(ERROR, f"{kind.hook} returned non-{base.__name__} objects: {bad!r}")
        mine = tuple(c for c in provided if guard.call(entry, "name", getattr, c, "name", None) == entry.name)
        if not mine:
            names = ", ".join(sorted({str(getattr(c, "name", "?")) for c in provided})) or "nothing"
            return fail(
                ERROR,
                f"entry point {entry.name!r} provides no {kind.thing} named {entry.name!r} (it provides: {names})",
            )
        refused = kind.check(entry, mine)
    except PluginError as exc:
        if registered_here:
            pm.unregister(plugin)
        return from_error(entry, exc)
    if refused:
        return fail(ERROR, refused)
    return LoadResult(entry, LOADED, provided=mine, plugin=plugin)
