"""moe-flashinfer-mxfp4: FlashInfer MXFP4 MoE kernels (SM90 W4A16, SM100 trtllm).

Placeholder package: it registers no entry point yet, so moe-core does not
list a backend for it. Its own issue implements the backend.
"""
