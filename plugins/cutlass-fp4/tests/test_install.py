"""The package installs next to moe-core without disturbing it."""

import importlib.metadata as md

from moe_core.plugins import PluginRegistry


def test_installed_beside_core_without_an_entry_point_yet():
    assert md.version("moe-cutlass-fp4") == "0.1.0"
    names = {e.name for e in PluginRegistry().entries()}
    assert "torch" in names
    assert not any(e.distribution == "moe-cutlass-fp4" for e in PluginRegistry().entries())
