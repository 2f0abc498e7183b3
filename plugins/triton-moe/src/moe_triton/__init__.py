"""moe-triton: Triton fused-MoE kernels as the ``triton`` runner backend of moe-core.

Schemes bf16/fp16/fp32, fp8_block (w8a8, 128x128 weight blocks, per-token-group
activations) and mxfp4 weights with bf16 activations (W4A16, dequantized in
the GEMM main loop). Nothing is imported here: the entry point is
``moe_triton.plugin``, the kernels load when a runner binds.
"""

__version__ = "0.1.0"
