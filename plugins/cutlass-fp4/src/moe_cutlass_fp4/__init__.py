"""moe-cutlass-fp4: the ``cutlass_fp4`` runner backend.

NVFP4 weights and activations (W4A4) through FlashInfer's CUTLASS fused-MoE
kernel (``flashinfer.fused_moe.cutlass_fused_moe``) on Blackwell-class GPUs
(SM100, SM103, SM110, SM120). moe-core finds it through the entry point
``moe.fused_ops: cutlass_fp4 = moe_cutlass_fp4.plugin``.

Importing this package imports nothing; flashinfer is imported only when a
runner binds the backend.
"""

__version__ = "0.1.0"
