"""The vLLM releases this bridge was written and tested against.

The bridge subclasses vLLM's ``UnquantizedFusedMoEMethod`` and reads the ``RoutedExperts`` layer it is handed
(README: "What it touches"); those internals change between releases without notice. So any release not listed
here is left alone: the plugin logs one line saying so and registers nothing. It does not raise, because vLLM
calls general plugins without catching, and an exception there would stop vLLM itself. Read from package
metadata, never by importing vLLM.
"""

from __future__ import annotations

import importlib.metadata as metadata

#: vLLM versions the bridge was tested against (exact releases)
TESTED = ("0.33.0",)


def installed() -> str | None:
    """The installed vLLM version, or None when vLLM is not installed."""
    try:
        return metadata.version("vllm")
    except metadata.PackageNotFoundError:
        return None


def refusal(version: str | None) -> str | None:
    """Why moe-vllm will not hook this vLLM ``version`` (None: it will)."""
    if version in TESTED:
        return None
    found = "is not installed" if version is None else f"{version} is installed"
    return (
        f"moe-vllm {__import__('moe_vllm').__version__} subclasses vLLM internals and was tested against "
        f"vllm {', '.join(TESTED)} only; vllm {found}, so it registers nothing and every MoE layer stays on "
        "vLLM's own path. Install a tested vLLM or a moe-vllm release made for yours."
    )
