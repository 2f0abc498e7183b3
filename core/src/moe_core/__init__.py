"""moe-core: MoE layers through separately installable kernel backends.

Public API (imported lazily, so ``import moe_core`` and ``moe backends`` stay
cheap and never import torch kernels or any plugin)::

    from moe_core import MoeConfig, MoeWeights, MoeRunner
    from moe_core import MoeLayer, SharedExperts                   # a whole block as an nn.Module
    from moe_core import FusedOp, Support, hookimpl, API_VERSION   # plugin authors
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__version__ = "0.1.0"

from moe_core.hookspecs import API_VERSION, hookimpl  # torch-free, needed by every plugin

_LAZY = {
    "MoeConfig": "moe_core.config",
    "MoeProblem": "moe_core.config",
    "MoeWeights": "moe_core.weights",
    "SharedExperts": "moe_core.weights",
    "MoeRunner": "moe_core.runner",
    "MoeLayer": "moe_core.layer",
    "FusedOp": "moe_core.fused_op",
    "Support": "moe_core.fused_op",
    "PluginRegistry": "moe_core.plugins",
    "default_registry": "moe_core.plugins",
    "select": "moe_core.selection",
    "explain": "moe_core.selection",
    "MoeError": "moe_core.errors",
    "InvalidInputError": "moe_core.errors",
    "BackendError": "moe_core.errors",
    "BackendNotInstalledError": "moe_core.errors",
    "BackendDisabledError": "moe_core.errors",
    "BackendUnavailableError": "moe_core.errors",
    "DuplicateBackendError": "moe_core.errors",
    "PluginLoadError": "moe_core.errors",
    "PluginError": "moe_core.errors",
    "IncompatiblePluginError": "moe_core.errors",
    "PluginWarning": "moe_core.errors",
}

__all__ = [
    "API_VERSION",
    "__version__",
    "hookimpl",
    "MoeConfig",
    "MoeProblem",
    "MoeWeights",
    "SharedExperts",
    "MoeRunner",
    "MoeLayer",
    "FusedOp",
    "Support",
    "PluginRegistry",
    "default_registry",
    "select",
    "explain",
    "MoeError",
    "InvalidInputError",
    "BackendError",
    "BackendNotInstalledError",
    "BackendDisabledError",
    "BackendUnavailableError",
    "DuplicateBackendError",
    "PluginLoadError",
    "PluginError",
    "IncompatiblePluginError",
    "PluginWarning",
]


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'moe_core' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(__all__)


if TYPE_CHECKING:  # pragma: no cover
    from moe_core.config import MoeConfig, MoeProblem
    from moe_core.errors import (
        BackendDisabledError,
        BackendError,
        BackendNotInstalledError,
        BackendUnavailableError,
        DuplicateBackendError,
        IncompatiblePluginError,
        InvalidInputError,
        MoeError,
        PluginError,
        PluginLoadError,
        PluginWarning,
    )
    from moe_core.fused_op import FusedOp, Support
    from moe_core.layer import MoeLayer
    from moe_core.plugins import PluginRegistry, default_registry
    from moe_core.runner import MoeRunner
    from moe_core.selection import explain, select
    from moe_core.weights import MoeWeights, SharedExperts
