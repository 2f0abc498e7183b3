"""moe-triton: Triton fused-MoE kernels (bf16/fp16, fp8_block, MXFP4 W4A16).

Placeholder package: it registers no entry point yet, so moe-core does not
list a backend for it. Its own issue implements the backend.
"""
