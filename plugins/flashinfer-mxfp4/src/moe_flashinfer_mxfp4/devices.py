"""Which kernel path a CUDA device gets, by compute capability; torch.cuda only, no flashinfer.

One runner backend name, two FlashInfer kernels:

* SM90 (H100/H200/H20): ``flashinfer.fused_moe.cutlass_fused_moe(use_w4_group_scaling=True)``, the
  CUTLASS mixed-input (bf16 x MXFP4) grouped GEMM, weights and scales interleaved by FlashInfer's
  SM90 helpers.
* SM100 (B200/GB200): ``flashinfer.fused_moe.trtllm_fp4_block_scale_routed_moe`` with bf16 hidden
  states (trtllm-gen "W4A16"), weights row-shuffled for the trtllm-gen GEMMs.

Everything else is refused with the reason.
"""

from __future__ import annotations

import torch

SM90_CUTLASS = "sm90-cutlass-w4a16"
SM100_TRTLLM = "sm100-trtllm-w4a16"

PATHS: dict[tuple[int, int], str] = {(9, 0): SM90_CUTLASS, (10, 0): SM100_TRTLLM}

_NEEDS = "needs SM90 for the CUTLASS W4A16 path or SM100 for the trtllm-gen W4A16 path"
_WHY_NOT: dict[tuple[int, int], str] = {
    (10, 3): (
        "FlashInfer itself excludes SM103 from its trtllm-gen MXFP4xBF16 (W4A16) MoE "
        "(TrtllmFp4RoutedRunner keeps the upstream SM103 xfail, flashinfer #1754)"
    ),
    (10, 7): "FlashInfer's SM107 trtllm-gen W4A16 MoE is untested with this backend",
    (11, 0): "FlashInfer has no MXFP4xBF16 fused-MoE kernel for SM110",
    (12, 0): "FlashInfer has no MXFP4xBF16 fused-MoE kernel for SM12x (the CUTLASS W4A16 path is SM90-only)",
    (12, 1): "FlashInfer has no MXFP4xBF16 fused-MoE kernel for SM12x (the CUTLASS W4A16 path is SM90-only)",
}


def sm(cap: tuple[int, int]) -> str:
    return f"SM{cap[0]}{cap[1]}"


def path_for(cap: tuple[int, int]) -> tuple[str | None, str]:
    """``(path, "")`` for a supported capability, else ``(None, reason)``."""
    cap = tuple(cap)
    path = PATHS.get(cap)
    if path is not None:
        return path, ""
    extra = _WHY_NOT.get(cap)
    return None, f"compute capability {sm(cap)} not supported ({_NEEDS})" + (f": {extra}" if extra else "")


def capability(device: torch.device | int | None = None) -> tuple[int, int]:
    """Compute capability of ``device`` (default: the current CUDA device)."""
    if isinstance(device, torch.device) and device.index is None:
        device = None
    return tuple(torch.cuda.get_device_capability(device))


def path_for_device(device: torch.device) -> tuple[str | None, str]:
    return path_for(capability(device))


def machine_paths() -> tuple[set[str], list[str]]:
    """Paths of every visible CUDA device, and the reasons for devices that have none."""
    paths, reasons = set(), []
    for index in range(torch.cuda.device_count()):
        path, reason = path_for(capability(index))
        if path:
            paths.add(path)
        else:
            reasons.append(f"cuda:{index}: {reason}")
    return paths, reasons
