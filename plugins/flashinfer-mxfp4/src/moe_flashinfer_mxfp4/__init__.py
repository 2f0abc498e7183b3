"""moe-flashinfer-mxfp4: the ``flashinfer_mxfp4`` runner backend.

MXFP4 weights x bf16 activations (W4A16) through FlashInfer's fused MoE
kernels: the CUTLASS mixed-input kernel on SM90 (Hopper) and the trtllm-gen
kernel on SM100 (Blackwell). moe-core finds it through the entry point
``moe.fused_ops: flashinfer_mxfp4 = moe_flashinfer_mxfp4.plugin``.

Importing this package imports nothing (no torch, no flashinfer): FlashInfer
is imported only when a runner binds the backend.
"""

__version__ = "0.1.0"
