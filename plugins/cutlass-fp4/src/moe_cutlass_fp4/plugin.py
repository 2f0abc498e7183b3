"""Entry point of the ``cutlass_fp4`` backend (group ``moe.fused_ops``); imports no flashinfer."""

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
    from moe_cutlass_fp4.fused_op import CutlassFp4FusedOp

    return [CutlassFp4FusedOp]
