"""Step 1 of 3: discover plugins from installed distribution metadata.

Reads the entry points of a group — ``moe.fused_ops`` (kernel backends) or
``moe.a2a`` (token dispatchers, ``moe_core.kinds``) — with ``importlib.metadata``.
Nothing is imported: an entry is a name, a ``module:attr`` string and the
distribution that declared it. Listing backends therefore stays cheap and can
never fail because some plugin's code is broken.
"""

from __future__ import annotations

import importlib
import importlib.metadata as metadata
from dataclasses import dataclass

GROUP = "moe.fused_ops"


@dataclass(frozen=True)
class PluginEntry:
    """One entry point of a plugin group: a runner backend (``moe.fused_ops``) or a dispatcher (``moe.a2a``)."""

    #: entry-point name == runner backend (or dispatcher) name
    name: str
    #: the entry point's ``module:attr`` target
    value: str
    distribution: str
    version: str
    #: None for a class passed to a runner directly
    entry_point: metadata.EntryPoint | None
    #: the entry-point group it was read from, which says what kind of plugin it is
    group: str = GROUP

    @property
    def qualified_name(self) -> str:
        """``distribution:name``: unique even when two distributions share a name."""
        return f"{self.distribution}:{self.name}"

    @classmethod
    def direct(cls, op: type, group: str = GROUP) -> PluginEntry:
        """The entry of a class (a ``FusedOp``, a ``Dispatcher``) handed over directly (no distribution, no entry
        point)."""
        target = f"{op.__module__}:{op.__qualname__}"
        return cls(getattr(op, "name", op.__name__), target, target, "(passed directly)", None, group)

    @property
    def module(self) -> str:
        return self.value.partition(":")[0].strip()


def read_entries(group: str = GROUP) -> tuple[PluginEntry, ...]:
    """Read the entry points of ``group`` from every distribution on ``sys.path``.

    ``importlib.invalidate_caches()`` first, so a distribution installed (or put
    on ``sys.path``) after start-up is seen by an explicit refresh.
    """
    importlib.invalidate_caches()
    entries = []
    for ep in metadata.entry_points(group=group):
        dist = ep.dist
        name = dist.metadata["Name"] if dist is not None else "<unknown distribution>"
        version = dist.version if dist is not None else "?"
        entries.append(PluginEntry(ep.name, ep.value, name, version, ep, group))
    return tuple(sorted(entries, key=lambda e: (e.name, e.distribution)))
