"""The ``--moe-runner-backend`` names moe-sglang adds, and the moe backend each one asks for.

``moe`` is moe's ``auto``; ``moe:<backend>`` is one installed moe backend, explicitly. The backends are the entry
points of group ``moe.fused_ops`` read from installed metadata (``moe_core.plugins.PluginRegistry.entries``:
discovery imports no plugin), so offering a name never imports a kernel library, and a backend installed later
appears at the next start.
"""

from __future__ import annotations

from moe_core.plugins import default_registry

PREFIX = "moe"
#: the SGLang choice that means moe's ``auto``
AUTO = PREFIX


def choices() -> list[str]:
    """``moe`` then ``moe:<backend>`` for every enabled installed moe backend (MOE_PLUGINS / MOE_DISABLE_PLUGINS
    apply), sorted, each once even when two distributions provide the same backend name."""
    return [AUTO, *(f"{PREFIX}:{name}" for name in default_registry().enabled_names())]


def moe_backend(choice: str) -> str | None:
    """The moe backend an SGLang runner-backend name asks for (``"auto"`` for ``moe``), or None when the name
    is not one of ours (SGLang's own backends)."""
    if choice == AUTO:
        return "auto"
    prefix, sep, name = choice.partition(":")
    return name if sep and prefix == PREFIX and name else None
