"""The plugin registry: discovery cache, per-plugin load results, filters.

One ``PluginRegistry`` holds what has been discovered (cached until
``refresh()``) and what has been loaded (each entry at most once). It is
thread-safe (a re-entrant lock around discovery and the tables, one lock per
entry around its import, one around pluggy's manager) and survives ``fork``:
the child gets fresh locks, so a fork taken while another thread held one
cannot deadlock. One registry serves one entry-point group (``moe_core.kinds``:
kernel backends or dispatchers) through the same code. Selection lives in
``moe_core.selection``; the registry only answers "what is there and what
happened when we loaded it".
"""

from __future__ import annotations

import os
import threading
import warnings
import weakref
from collections import defaultdict
from dataclasses import asdict, dataclass

from moe_core.discovery import GROUP, PluginEntry, read_entries
from moe_core.errors import IncompatiblePluginError, PluginError, PluginLoadError, PluginWarning
from moe_core.filters import PluginFilters
from moe_core.guard import support
from moe_core.kinds import KINDS, kind_of
from moe_core.loading import ERROR, INCOMPATIBLE, from_error, import_entry, load_entry, new_plugin_manager

DISCOVERED = "discovered"
DISABLED = "disabled"
AVAILABLE = "available"
UNAVAILABLE = "unavailable"


@dataclass(frozen=True)
class BackendInfo:
    """One row of ``moe backends``: a runner backend (``kind`` "fused_op") or a dispatcher ("dispatcher").
    ``formats``: for a backend the dispatch formats its fused ops accept, for a dispatcher the one it hands."""

    name: str
    distribution: str
    version: str
    status: str
    reason: str = ""
    entry_point: str = ""
    a2a_backends: tuple[str, ...] = ()
    priority: int | None = None
    kind: str = "fused_op"
    formats: tuple[str, ...] = ()

    def as_dict(self) -> dict:
        d = asdict(self)
        d["a2a_backends"] = list(self.a2a_backends)
        d["formats"] = list(self.formats)
        return d


class PluginRegistry:
    def __init__(self, group: str = GROUP) -> None:
        self.group = group
        self.kind = kind_of(group)
        self._lock = threading.RLock()
        self._entries: tuple[PluginEntry, ...] | None = None
        self._results: dict[tuple[str, str], object] = {}
        self._entry_locks: dict[tuple[str, str], threading.Lock] = {}
        self._pm_lock = threading.Lock()
        self._pm = None
        self._warned: set[tuple[str, str]] = set()
        ref = weakref.ref(self)

        def _after_fork_in_child() -> None:
            registry = ref()
            if registry is not None:
                registry._lock = threading.RLock()
                registry._pm_lock = threading.Lock()
                registry._entry_locks = {}

        os.register_at_fork(after_in_child=_after_fork_in_child)

    # ---- discovery ----------------------------------------------------------
    def entries(self) -> tuple[PluginEntry, ...]:
        """Every installed entry point of the group (cached; imports nothing)."""
        with self._lock:
            if self._entries is None:
                self._entries = read_entries(self.group)
            return self._entries

    def refresh(self) -> tuple[PluginEntry, ...]:
        """Forget the discovery cache and read the metadata again.

        Plugins already loaded stay loaded (Python cannot unimport them).
        """
        with self._lock:
            self._entries = None
            self._warned.clear()
            return self.entries()

    def filters(self) -> PluginFilters:
        """The current environment's filters; warns once per item that matches nothing."""
        filters = PluginFilters.from_environ()
        if not (filters.allow or filters.block):
            return filters
        # one pair of variables filters every kind: an item is unmatched only if it names no plugin of any
        everything = [e for k in KINDS for e in (self.entries() if k.group == self.group else read_entries(k.group))]
        for var, item in filters.unmatched((e.name, e.distribution) for e in everything):
            with self._lock:
                if (var, item) in self._warned:
                    continue
                self._warned.add((var, item))
                names = ", ".join(sorted({e.qualified_name for e in everything})) or "none"
                warnings.warn(
                    f"{var} names {item!r}, which matches no installed moe plugin (installed: {names})",
                    PluginWarning,
                    stacklevel=3,
                )
        return filters

    def enabled_entries(self, filters: PluginFilters | None = None) -> list[PluginEntry]:
        filters = filters or self.filters()
        return [e for e in self.entries() if filters.disabled_reason(e.name, e.distribution) is None]

    def enabled_names(self) -> list[str]:
        """The names of the enabled entries, sorted, each once (two distributions may provide one name): what an
        engine bridge offers its operators, read from metadata without importing a plugin."""
        return sorted({e.name for e in self.enabled_entries()})

    def duplicates(self, filters: PluginFilters | None = None) -> dict[str, list[PluginEntry]]:
        """Names (of backends, or of dispatchers) that more than one enabled distribution provides."""
        by_name: dict[str, list[PluginEntry]] = defaultdict(list)
        for e in self.enabled_entries(filters):
            by_name[e.name].append(e)
        return {n: es for n, es in by_name.items() if len({x.distribution for x in es}) > 1}

    # ---- loading ------------------------------------------------------------
    def load(self, entry: PluginEntry, strict: bool | None = None):
        """Load ``entry`` once and return its ``LoadResult``.

        Locked per entry: a slow plugin import delays only callers of that same
        entry, never a runner of another backend. With ``strict`` (default:
        ``MOE_STRICT_PLUGINS``) a failed load raises ``PluginLoadError`` /
        ``IncompatiblePluginError`` chained to the cause.
        """
        key = (entry.qualified_name, entry.value)
        with self._lock:
            result = self._results.get(key)
            entry_lock = self._entry_locks.setdefault(key, threading.Lock())
        if result is None:
            with entry_lock:
                result = self._results.get(key)
                if result is None:
                    try:
                        plugin = import_entry(entry)
                    except PluginError as exc:
                        result = from_error(entry, exc)
                    else:
                        with self._pm_lock:  # pluggy's manager is not thread-safe; registering is quick
                            if self._pm is None:
                                self._pm = new_plugin_manager()
                            result = load_entry(self._pm, entry, plugin)
                    with self._lock:
                        self._results[key] = result
        if strict is None:
            strict = PluginFilters.from_environ().strict
        if strict and not result.ok:
            cls = IncompatiblePluginError if result.status == INCOMPATIBLE else PluginLoadError
            raise cls(
                f"moe plugin {entry.qualified_name!r} failed to load: {result.reason} (MOE_STRICT_PLUGINS is set)"
            ) from result.error
        return result

    # ---- reporting ----------------------------------------------------------
    def describe(self, check: bool = False) -> list[BackendInfo]:
        """Rows of ``moe backends``. Without ``check`` nothing is imported."""
        filters = self.filters()
        dupes = self.duplicates(filters)
        rows = []
        for e in self.entries():
            base = dict(name=e.name, distribution=e.distribution, version=e.version, entry_point=e.value,
                        kind=self.kind.key)  # fmt: skip
            disabled = filters.disabled_reason(e.name, e.distribution)
            if disabled:
                rows.append(BackendInfo(status=DISABLED, reason=disabled, **base))
                continue
            dup_reason = ""
            if e.name in dupes:
                others = [x.distribution for x in dupes[e.name] if x.distribution != e.distribution]
                dup_reason = (
                    f"duplicate: {self.kind.noun} {e.name!r} is also provided by {', '.join(others)}; "
                    f"pick one with '{e.distribution}:{e.name}' or MOE_DISABLE_PLUGINS"
                )
            if not check:
                rows.append(BackendInfo(status=DISCOVERED, reason=dup_reason, **base))
                continue
            result = self.load(e, strict=False)
            if not result.ok:
                rows.append(BackendInfo(status=result.status, reason=result.reason, **base))
                continue
            extra = dict(**self.kind.summary(result.provided), **base)
            if dup_reason:
                rows.append(BackendInfo(status=ERROR, reason=dup_reason, **extra))
                continue
            try:
                supports = [support(e, "available", cls.available) for cls in result.provided]
            except PluginError as exc:
                rows.append(BackendInfo(status=ERROR, reason=str(exc), **extra))
                continue
            if any(supports):
                # an available backend may still say something (e.g. which kernel path it will take)
                note = "; ".join(sorted({s.reason for s in supports if s and s.reason}))
                rows.append(BackendInfo(status=AVAILABLE, reason=note, **extra))
            else:
                reason = "; ".join(sorted({s.reason for s in supports}))
                rows.append(BackendInfo(status=UNAVAILABLE, reason=reason, **extra))
        return rows


_default: PluginRegistry | None = None  # of moe.fused_ops (tests reset it)
_default_by_group: dict[str, PluginRegistry] = {}  # of the other groups
_default_lock = threading.Lock()


def _reset_default_lock() -> None:
    global _default_lock
    _default_lock = threading.Lock()


os.register_at_fork(after_in_child=_reset_default_lock)


def default_registry(group: str = GROUP) -> PluginRegistry:
    """The process-wide registry of ``group`` (default: kernel backends) every runner uses unless given
    another."""
    global _default
    with _default_lock:
        if group != GROUP:
            if group not in _default_by_group:
                _default_by_group[group] = PluginRegistry(group)
            return _default_by_group[group]
        if _default is None:
            _default = PluginRegistry()
        return _default
