"""Step 2 of 3: load one discovered plugin, capturing every failure.

Loading imports the entry point's target, registers it with the pluggy
``PluginManager``, checks the hooks (``check_pending``), the API version and
the fused ops it returns. Whatever goes wrong is caught and kept in a
``LoadResult`` — distribution, version, exception, traceback — so one broken
plugin never breaks core or another plugin. Strict mode is applied by the
caller, which decides whether a failed result should raise.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass, field

import pluggy

from moe_core import hookspecs
from moe_core.discovery import PluginEntry
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


def _failure(entry: PluginEntry, status: str, reason: str, exc: BaseException | None) -> LoadResult:
    tb = "".join(traceback.format_exception(exc)) if exc is not None else ""
    where = f"{entry.distribution} {entry.version}"
    return LoadResult(entry, status, reason=f"{where}: {reason}", error=exc, traceback=tb)


def load_entry(pm: pluggy.PluginManager, entry: PluginEntry) -> LoadResult:
    """Import, register and validate one entry point. Never raises (but on
    ``KeyboardInterrupt``/``SystemExit``-like BaseExceptions)."""
    from moe_core.fused_op import FusedOp

    try:
        plugin = entry.entry_point.load()
    except Exception as exc:
        return _failure(entry, ERROR, f"importing {entry.value!r} failed: {type(exc).__name__}: {exc}", exc)

    registered_here = False
    if not pm.is_registered(plugin):
        try:
            pm.register(plugin, name=entry.qualified_name)
            registered_here = True
            pm.check_pending()
        except Exception as exc:
            if registered_here:
                pm.unregister(plugin)
            return _failure(entry, ERROR, f"invalid hooks: {type(exc).__name__}: {exc}", exc)

    def fail(status, reason, exc=None):
        if registered_here:
            pm.unregister(plugin)
        return _failure(entry, status, reason, exc)

    impl = _impl_of(pm, "moe_api_version", plugin)
    if impl is None:
        return fail(INCOMPATIBLE, "declares no plugin API version (implement the moe_api_version hook)")
    try:
        version = impl.function()
    except Exception as exc:
        return fail(ERROR, f"moe_api_version raised {type(exc).__name__}: {exc}", exc)
    if version != API_VERSION:
        return fail(
            INCOMPATIBLE,
            f"targets moe-core plugin API version {version!r}, but this moe-core provides API version {API_VERSION}",
        )

    impl = _impl_of(pm, "moe_fused_ops", plugin)
    if impl is None:
        return fail(ERROR, "provides no fused ops (implement the moe_fused_ops hook)")
    try:
        ops = list(impl.function() or ())
    except Exception as exc:
        return fail(ERROR, f"moe_fused_ops raised {type(exc).__name__}: {exc}", exc)

    bad = [op for op in ops if not (isinstance(op, type) and issubclass(op, FusedOp))]
    if bad:
        return fail(ERROR, f"moe_fused_ops returned non-FusedOp objects: {bad!r}")
    mine = tuple(op for op in ops if getattr(op, "name", None) == entry.name)
    if not mine:
        provided = ", ".join(sorted({str(getattr(op, "name", "?")) for op in ops})) or "nothing"
        return fail(
            ERROR, f"entry point {entry.name!r} provides no fused op named {entry.name!r} (it provides: {provided})"
        )
    keys = [(a2a, op.name) for op in mine for a2a in op.a2a_backends]
    repeated = sorted({k for k in keys if keys.count(k) > 1})
    if repeated:
        return fail(ERROR, f"two fused ops for the same (a2a, runner) key: {repeated}")
    return LoadResult(entry, LOADED, fused_ops=mine, plugin=plugin)
