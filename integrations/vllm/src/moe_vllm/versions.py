"""The vLLM releases this bridge was written and tested against.

The bridge subclasses vLLM's ``UnquantizedFusedMoEMethod`` and reads the ``RoutedExperts`` layer it is handed
(README: "What it touches"); those internals change between releases without notice. So any release not listed
here is left alone: the plugin logs one line saying so and registers nothing. It does not raise, because vLLM
calls general plugins without catching, and an exception there would stop vLLM itself. Read from package
metadata (``moe_core.integrations.engine_versions``, the guard every bridge shares), never by importing vLLM.
"""

from __future__ import annotations

from moe_core.integrations import engine_versions

#: vLLM versions the bridge was tested against (exact releases)
TESTED = ("0.33.0",)


def installed() -> str | None:
    """The installed vLLM version, or None when it is not installed."""
    return engine_versions.installed("vllm")


def refusal(version: str | None) -> str | None:
    """Why moe-vllm will not hook this version (None: it will)."""
    return engine_versions.refusal(
        "moe-vllm", "vllm", version, TESTED, "subclasses vLLM internals", "every MoE layer stays on vLLM's own path"
    )
