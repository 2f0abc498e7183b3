"""Entry point of core's own ``torch`` backend (group ``moe.fused_ops``).

Core registers its backend through the same door as every plugin, so the
machinery that finds third-party backends is exercised by core itself.
"""

from __future__ import annotations

from moe_core.hookspecs import API_VERSION, hookimpl


@hookimpl
def moe_api_version() -> int:
    return API_VERSION


@hookimpl
def moe_fused_ops() -> list:
    from moe_core.backends.torch.fused_op import TorchFusedOp

    return [TorchFusedOp]
