"""Entry point of the ``flashinfer_mxfp4`` backend (group ``moe.fused_ops``).

Loading this module (``moe backends --check``, the first runner) imports
moe-core's plugin API and, when the hook is called, the op class — never
flashinfer, which the op imports only when a runner binds it.
"""

from __future__ import annotations

from moe_core.hookspecs import hookimpl

#: the moe-core plugin API this plugin was written against, a literal on purpose: returning
#: ``moe_core.API_VERSION`` would claim compatibility with every future moe-core
PLUGIN_API_VERSION = 1


@hookimpl
def moe_api_version() -> int:
    return PLUGIN_API_VERSION


@hookimpl
def moe_fused_ops() -> list:
    from moe_flashinfer_mxfp4.fused_op import FlashInferMxfp4FusedOp

    return [FlashInferMxfp4FusedOp]
