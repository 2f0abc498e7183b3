"""moe-cutlass-fp4: NVFP4 MoE through FlashInfer CUTLASS kernels (SM100+).

Placeholder package: it registers no entry point yet, so moe-core does not
list a backend for it. Its own issue implements the backend.
"""
