"""Write installable-looking distributions into a folder, for tests.

A folder on ``sys.path`` holding ``NAME-VERSION.dist-info/METADATA`` and
``entry_points.txt`` *is* an installed distribution as far as
``importlib.metadata`` is concerned; this is the cheapest way to test entry
point discovery without pip. ``write_distribution`` also writes the plugin's
modules next to it.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path


def write_distribution(
    root: str | Path,
    name: str,
    version: str = "1.0",
    entry_points: dict[str, str] | None = None,
    modules: dict[str, str] | None = None,
    group: str = "moe.fused_ops",
) -> Path:
    """Create distribution ``name`` under ``root`` and return ``root``.

    ``entry_points`` maps entry-point names to ``module:attr`` targets in
    ``group``; ``modules`` maps dotted module names to their source.
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    folder = root / f"{re.sub(r'[-_.]+', '_', name)}-{version}.dist-info"
    folder.mkdir()
    (folder / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    lines = [f"[{group}]"] + [f"{k} = {v}" for k, v in (entry_points or {}).items()]
    (folder / "entry_points.txt").write_text("\n".join(lines) + "\n")
    for module, source in (modules or {}).items():
        path = root.joinpath(*module.split(".")).with_suffix(".py")
        path.parent.mkdir(parents=True, exist_ok=True)
        for parent in path.relative_to(root).parents:
            if str(parent) != ".":
                init = root / parent / "__init__.py"
                if not init.exists():
                    init.write_text("")
        path.write_text(textwrap.dedent(source))
    return root


def _module_source(api_version, hook: str, base: str, cls: str, attributes: str, body: str, extra: str) -> str:
    """A plugin module whose ``hook`` returns one class ``cls`` deriving from ``base`` (``module:Class``), with
    ``attributes`` (declaration lines), ``body`` added to the class and ``extra`` to the module."""
    module, base_name = base.split(":")
    head = textwrap.dedent(
        f"""
        from moe_core import API_VERSION, hookimpl

        @hookimpl
        def moe_api_version():
            return {api_version}

        @hookimpl
        def {hook}():
            from {module} import {base_name}

            class {cls}({base_name}):
        """
    )
    declared = textwrap.indent(textwrap.dedent(attributes) + textwrap.dedent(body), " " * 8)
    return head + declared + f"\n    return [{cls}]\n" + textwrap.dedent(extra)


def plugin_source(
    backend: str,
    *,
    api_version: int | str = "API_VERSION",
    priority: int | str = 0,
    device_types: tuple[str, ...] = ("cpu",),
    a2a_backends: tuple[str, ...] = ("none",),
    body: str = "",
    extra: str = "",
) -> str:
    """Source of a plugin module providing backend ``backend``.

    Its fused op reuses the torch reference's arithmetic, so a runner bound to
    it computes real results; ``body`` is added to the op's class (e.g. a
    planted bug in ``prepare``), ``extra`` to the module (e.g. a broken hook).
    """
    attributes = (
        f"name = {backend!r}\npriority = {priority}\ndevice_types = frozenset({set(device_types)!r})\n"
        f"a2a_backends = {tuple(a2a_backends)!r}\n"
    )
    base = "moe_core.backends.torch.fused_op:TorchFusedOp"
    return _module_source(api_version, "moe_fused_ops", base, "StandInFusedOp", attributes, body, extra)


def dispatcher_source(name: str, *, format: str = "token_major_local_ids", body: str = "", extra: str = "") -> str:
    """Source of a plugin module providing dispatcher ``name`` (group ``moe.a2a``).

    It reuses core's ``replicate`` dispatcher, so a runner driven by it computes real results; ``format`` is
    the format it declares, ``body`` is added to its class and ``extra`` to the module, as in ``plugin_source``.
    """
    base = "moe_core.dispatchers.replicate:ReplicateDispatcher"
    attributes = f"name = {name!r}\nformat = {format!r}\n"
    return _module_source("API_VERSION", "moe_dispatchers", base, "StandInDispatcher", attributes, body, extra)
