"""Environment switches that filter plugins (read on each use, not at import).

- ``MOE_PLUGINS``: comma-separated allow-list. Unset: every installed plugin.
  Empty: none but core's own backends (autoload off).
- ``MOE_DISABLE_PLUGINS``: comma-separated block-list.
- ``MOE_STRICT_PLUGINS=1``: a plugin that fails to load raises instead of
  being reported (for CI).

A list item matches a backend name (``triton``), a distribution name
(``moe-triton``) or both (``moe-triton:triton``), so a duplicate backend name
can be resolved by blocking one distribution.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from moe_core.known_backends import CORE_DISTRIBUTION

ALLOW_VAR = "MOE_PLUGINS"
BLOCK_VAR = "MOE_DISABLE_PLUGINS"
STRICT_VAR = "MOE_STRICT_PLUGINS"

_TRUE = {"1", "true", "yes", "on"}


def env_flag(name: str, environ: Mapping[str, str] | None = None) -> bool:
    """Whether environment variable ``name`` is set to a true value (1/true/yes/on), read now."""
    return (os.environ if environ is None else environ).get(name, "").strip().lower() in _TRUE


def normalize_distribution(name: str) -> str:
    """PEP 503 normalisation, so ``Moe_Triton`` and ``moe-triton`` compare equal."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _split(value: str) -> frozenset[str]:
    return frozenset(item.strip() for item in value.split(",") if item.strip())


def matches(token: str, name: str, distribution: str) -> bool:
    """Whether a filter item names this (backend, distribution)."""
    if ":" in token:
        dist, _, backend = token.partition(":")
        return backend == name and normalize_distribution(dist) == normalize_distribution(distribution)
    return token == name or normalize_distribution(token) == normalize_distribution(distribution)


@dataclass(frozen=True)
class PluginFilters:
    allow: frozenset[str] | None = None
    block: frozenset[str] = frozenset()
    strict: bool = False

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> PluginFilters:
        env = os.environ if environ is None else environ
        allow = env.get(ALLOW_VAR)
        return cls(
            allow=None if allow is None else _split(allow),
            block=_split(env.get(BLOCK_VAR, "")),
            strict=env_flag(STRICT_VAR, env),
        )

    def disabled_reason(self, name: str, distribution: str) -> str | None:
        """Why the backend ``name`` from ``distribution`` is filtered out, or None."""
        for token in sorted(self.block):
            if matches(token, name, distribution):
                return f"disabled by {BLOCK_VAR} (item {token!r})"
        if self.allow is not None:
            is_core = normalize_distribution(distribution) == CORE_DISTRIBUTION
            if not is_core and not any(matches(t, name, distribution) for t in self.allow):
                shown = ",".join(sorted(self.allow))
                return f"disabled: not in the {ALLOW_VAR} allow-list ({ALLOW_VAR}={shown!r})"
        return None

    def unmatched(self, installed: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
        """(variable, item) pairs that name no installed (backend, distribution)."""
        installed = list(installed)
        out = []
        for var, items in ((ALLOW_VAR, self.allow or ()), (BLOCK_VAR, self.block)):
            for token in sorted(items):
                if not any(matches(token, n, d) for n, d in installed):
                    out.append((var, token))
        return out
