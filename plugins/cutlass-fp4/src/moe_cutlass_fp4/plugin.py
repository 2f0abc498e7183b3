"""Entry point of the ``cutlass_fp4`` backend (group ``moe.fused_ops``); imports no flashinfer."""

from __future__ import annotations

from moe_core.hookspecs import API_VERSION, hookimpl


@hookimpl
def moe_api_version() -> int:
    return API_VERSION


@hookimpl
def moe_fused_ops() -> list:
    from moe_cutlass_fp4.op import CutlassFp4FusedOp

    return [CutlassFp4FusedOp]
