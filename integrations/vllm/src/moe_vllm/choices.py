"""The one switch: which moe backend vLLM's MoE layers are asked to run through, if any.

``--additional-config '{"moe_vllm_backend": "auto"}'`` (vLLM's own per-engine settings, so it reaches every worker
with the engine's configuration) or the environment variable ``MOE_VLLM_BACKEND`` (read where the configuration
does not say); the configuration wins where both are set. Values: ``auto`` (moe's own selection), one installed moe
backend by name (``torch``, ``triton``, ...; ``moe backends`` lists them), or ``off`` / unset: vLLM's own path.

The installed backends are the entry points of group ``moe.fused_ops`` read from metadata
(``moe_core.plugins.PluginRegistry.enabled_names``: discovery imports no plugin), so offering a name never
imports a kernel library.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from moe_core.plugins import default_registry

#: the key in vLLM's ``additional_config`` and, upper-cased, the environment variable
KEY = "moe_vllm_backend"
ENV = KEY.upper()
AUTO = "auto"
OFF = ("", "off", "none", "0", "false")


@dataclass(frozen=True)
class Request:
    """What the operator asked for: a moe backend (``auto`` or a name) and where the setting came from."""

    backend: str
    source: str

    def __str__(self) -> str:
        return f"{self.source}={self.backend}"


def backends() -> list[str]:
    """Every enabled installed moe backend (MOE_PLUGINS / MOE_DISABLE_PLUGINS apply), sorted, each once."""
    return default_registry().enabled_names()


def parse(value: str | None, source: str) -> Request | None:
    """The request a setting's value makes, or None for vLLM's own path."""
    if value is None:
        return None
    value = str(value).strip()
    if value.lower() in OFF:
        return None
    return Request(AUTO if value.lower() == AUTO else value, source)


def requested(additional_config=None) -> Request | None:
    """The request for layers built now: vLLM's ``additional_config`` (the current vLLM configuration's unless
    given), then the environment."""
    if additional_config is None:
        from vllm.config import get_current_vllm_config

        additional_config = get_current_vllm_config().additional_config
    if isinstance(additional_config, dict) and KEY in additional_config:
        return parse(additional_config[KEY], f"additional_config[{KEY!r}]")
    return parse(os.environ.get(ENV), ENV)
