"""Entry point of the ``flashinfer_mxfp4`` backend (group ``moe.fused_ops``).

Loading this module (``moe backends --check``, the first runner) imports
moe-core's plugin API and, when the hook is called, the op class — never
flashinfer, which the op imports only when a runner binds it.
"""

from __future__ import annotations

from moe_core.hookspecs import API_VERSION, hookimpl


@hookimpl
def moe_api_version() -> int:
    return API_VERSION


@hookimpl
def moe_fused_ops() -> list:
    from moe_flashinfer_mxfp4.op import FlashInferMxfp4FusedOp

    return [FlashInferMxfp4FusedOp]
