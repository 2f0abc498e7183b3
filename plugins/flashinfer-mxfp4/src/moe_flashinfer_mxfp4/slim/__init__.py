"""A slim FlashInfer SM90 W4A16 module: only the bf16 x MXFP4 fused-MoE kernels, built from the installed FlashInfer.

FlashInfer's ``fused_moe_90`` JIT module compiles ~248 CUTLASS units for every
dtype combination its CUTLASS MoE supports (about an hour on 16 cores). The
W4A16 path needs one runner and its mixed-input grouped GEMMs. ``sources``
picks those from the installed FlashInfer (its own sources and its own kernel
generator, nothing copied), ``stubs`` answers the symbols of the left-out
combinations with functions that raise, ``build`` drives FlashInfer's JitSpec
and ninja with progress, and ``module`` loads the result and calls its binding.
"""

from moe_flashinfer_mxfp4.slim.sources import SLIM_MODULE_NAME, SlimUnsupported

__all__ = ["SLIM_MODULE_NAME", "SlimUnsupported"]
