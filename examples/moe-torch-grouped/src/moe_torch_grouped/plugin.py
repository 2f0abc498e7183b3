"""Entry point of the ``torch_grouped`` backend (group ``moe.fused_ops``).

moe-core imports this module only when a runner (or ``moe backends --check``)
needs the backend, registers it with its pluggy plugin manager and calls the two
hooks below. The fused op's module is imported inside the hook, so loading the
plugin costs nothing until its ops are asked for.
"""

from __future__ import annotations

from moe_core import hookimpl

#: The moe-core plugin API major version this plugin was written against. A
#: literal on purpose: returning ``moe_core.API_VERSION`` would claim
#: compatibility with every future major version too.
PLUGIN_API_VERSION = 1


@hookimpl
def moe_api_version() -> int:
    return PLUGIN_API_VERSION


@hookimpl
def moe_fused_ops() -> list:
    from moe_torch_grouped.fused_op import TorchGroupedFusedOp

    return [TorchGroupedFusedOp]
