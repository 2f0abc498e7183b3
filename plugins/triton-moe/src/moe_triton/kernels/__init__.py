"""Triton kernels of the fused MoE forward (imported only when a runner binds)."""
