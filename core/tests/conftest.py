"""Fixtures: a temporary "site" where tests install stand-in plugin distributions."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from moe_core.filters import ALLOW_VAR, BLOCK_VAR, STRICT_VAR
from moe_core.plugins import PluginRegistry
from moe_core.testing.distributions import plugin_source, write_distribution


class Site:
    """A folder on sys.path that tests add distributions to."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def add(
        self,
        dist: str,
        backend: str | None = None,
        *,
        source: str | None = None,
        version: str = "1.0",
        entry_points: dict[str, str] | None = None,
        group: str = "moe.fused_ops",
        **plugin_kwargs,
    ) -> str:
        """Install distribution ``dist`` providing ``backend`` (a dispatcher with ``group="moe.a2a"`` and a
        ``source``); return its module name."""
        module = f"{dist.replace('-', '_')}_{uuid.uuid4().hex[:8]}"
        if source is None:
            source = plugin_source(backend, **plugin_kwargs)
        if entry_points is None:
            entry_points = {backend: module}
        write_distribution(self.root / dist, dist, version, entry_points, {module: source}, group)
        sys.path.insert(0, str(self.root / dist))
        self._paths.append(str(self.root / dist))
        return module

    def registry(self, group: str = "moe.fused_ops") -> PluginRegistry:
        return PluginRegistry(group)

    @property
    def pythonpath(self) -> str:
        return os.pathsep.join([*self._paths, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)

    def python(self, code: str, env: dict[str, str] | None = None, check: bool = True):
        """Run ``code`` in a fresh interpreter that sees this site's distributions."""
        return self._run(["-c", textwrap.dedent(code)], env, check)

    def moe(self, *args: str, env: dict[str, str] | None = None, check: bool = False):
        """Run the ``moe`` command in a fresh interpreter that sees this site's distributions."""
        return self._run(["-m", "moe_core.cli", *args], env, check)

    def _run(self, argv: list[str], env: dict[str, str] | None, check: bool):
        full_env = {k: v for k, v in os.environ.items() if k not in (ALLOW_VAR, BLOCK_VAR, STRICT_VAR)}
        full_env["PYTHONPATH"] = self.pythonpath
        full_env.update(env or {})
        proc = subprocess.run([sys.executable, *argv], capture_output=True, text=True, env=full_env, timeout=300)
        if check and proc.returncode != 0:
            raise AssertionError(f"subprocess failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
        return proc


@pytest.fixture
def site(tmp_path, monkeypatch):
    for var in (ALLOW_VAR, BLOCK_VAR, STRICT_VAR):
        monkeypatch.delenv(var, raising=False)
    s = Site(tmp_path)
    s._paths = []
    saved = list(sys.path)
    # the process-wide registry must not carry discovery results across tests
    monkeypatch.setattr("moe_core.plugins._default", None)
    monkeypatch.setattr("moe_core.plugins._default_by_group", {})
    yield s
    sys.path[:] = saved
    import importlib

    importlib.invalidate_caches()
