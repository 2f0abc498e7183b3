"""Entry point of the ``triton`` backend (group ``moe.fused_ops``).

Importing this module imports neither triton nor the kernels: discovery and
``moe backends`` stay cheap, and the support check reads triton's version
from metadata.
"""

from __future__ import annotations

from moe_core import hookimpl

#: the moe-core plugin API this plugin was written against, a literal on purpose: returning
#: ``moe_core.API_VERSION`` would claim compatibility with every future moe-core
PLUGIN_API_VERSION = 1


@hookimpl
def moe_api_version() -> int:
    return PLUGIN_API_VERSION


@hookimpl
def moe_fused_ops() -> list:
    from moe_triton.fused_op import TritonFusedOp

    return [TritonFusedOp]
