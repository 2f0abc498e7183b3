"""Compute capabilities with an NVFP4 CUTLASS fused-MoE kernel in FlashInfer, and why the others have none."""

from __future__ import annotations

import torch

#: capability -> FlashInfer's JIT module generator for it (``flashinfer.fused_moe.gen_cutlass_fused_moe_*``)
MODULES: dict[tuple[int, int], str] = {
    (10, 0): "gen_cutlass_fused_moe_sm100_module",
    (10, 3): "gen_cutlass_fused_moe_sm103_module",
    (11, 0): "gen_cutlass_fused_moe_sm100_module",  # FlashInfer builds SM110 from its SM100 module
    (12, 0): "gen_cutlass_fused_moe_sm120_module",
}

_HOPPER = (
    "Hopper (SM90) has no NVFP4 path in FlashInfer's CUTLASS fused MoE: FP4 x FP4 block-scaled tensor-core MMA "
    "needs SM100 or newer (FlashInfer's CUTLASS NVFP4 runner is built for SM100/103/107/110/120/121 only). "
    "On this device the torch backend runs nvfp4 by dequantizing"
)
_UNTRIED = "FlashInfer lists it for its CUTLASS NVFP4 MoE, but this backend has not been run there"


def reason(cap: tuple[int, int]) -> str | None:
    """None if ``cap`` is supported, else why not."""
    cap = tuple(cap)
    if cap in MODULES:
        return None
    wanted = ", ".join(f"SM{a}{b}" for a, b in sorted(MODULES))
    why = {(9, 0): _HOPPER, (10, 7): _UNTRIED, (12, 1): _UNTRIED}.get(cap, "NVFP4 needs Blackwell tensor cores")
    return f"compute capability SM{cap[0]}{cap[1]} not supported (needs {wanted}): {why}"


def device_capability(device) -> tuple[int, int]:
    device = torch.device(device) if not isinstance(device, torch.device) else device
    return tuple(torch.cuda.get_device_capability(None if device.index is None else device))
