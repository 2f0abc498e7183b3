"""A fresh virtualenv for tests that install something, seeing this interpreter's packages.

``venv --system-site-packages`` would expose the *base* interpreter's packages, not those of the
virtualenv running the tests, so a ``.pth`` file adds this interpreter's site directories instead
(``site.addsitedir``, so their own ``.pth`` files — editable installs — work too): torch is not
reinstalled, and whatever is installed into the new environment lands in its own site-packages.
``moe``, ``pip`` and ``pytest`` in its ``bin`` run its own Python.
"""

from __future__ import annotations

import os
import site
import subprocess
import sys
import sysconfig
from pathlib import Path

from moe_core.filters import ALLOW_VAR, BLOCK_VAR, STRICT_VAR


class FreshVenv:
    def __init__(self, path: Path) -> None:
        self.path = path
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True, timeout=120)
        self.bin = path / "bin"
        self.python = str(self.bin / "python")
        purelib = subprocess.run(
            [self.python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
        parents = [p for p in [*site.getsitepackages(), sysconfig.get_paths()["purelib"]] if os.path.isdir(p)]
        lines = [f"import site; site.addsitedir({p!r})" for p in dict.fromkeys(parents)]
        Path(purelib, "_moe_test_parent_env.pth").write_text("\n".join(lines) + "\n")
        for command, module in (("moe", "moe_core.cli"), ("pip", "pip"), ("pytest", "pytest")):
            shim = self.bin / command
            shim.write_text(f'#!/bin/sh\nexec "{self.python}" -m {module} "$@"\n')
            shim.chmod(0o755)

    def env(self) -> dict[str, str]:
        """The environment of a process inside it: its ``bin`` first, no plugin filters of the test run."""
        env = {k: v for k, v in os.environ.items() if k not in (ALLOW_VAR, BLOCK_VAR, STRICT_VAR, "PYTHONPATH")}
        env["VIRTUAL_ENV"] = str(self.path)
        env["PATH"] = os.pathsep.join([str(self.bin), env.get("PATH", "")])
        env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
        return env

    def run(self, *args: str, cwd=None, check: bool = True, timeout: int = 300) -> subprocess.CompletedProcess:
        """Its Python with ``args``; a failure raises with both output streams when ``check``."""
        proc = subprocess.run(
            [self.python, *args], cwd=cwd, env=self.env(), capture_output=True, text=True, timeout=timeout
        )
        if check and proc.returncode:
            raise AssertionError(f"{args} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
        return proc
