"""The fused MoE forward as one ``torch.library`` custom op: ``moe_triton::fused_moe``.

Launch sequence (all on the current stream, no host synchronisation, so it
can be captured in a CUDA graph): align (2 small kernels) -> GEMM1 with the
activation in its epilogue -> GEMM2 with bias and routing weight in its
epilogue -> sum over the k slots (skipped when k == 1). Registered as a custom
op with a fake implementation so ``torch.compile(fullgraph=True)`` treats the
whole forward as one opaque node.
"""

from __future__ import annotations

import torch
import triton

from moe_triton.configs import GemmConfig, KernelConfig, select_config
from moe_triton.kernels import align as align_mod
from moe_triton.kernels import gemm

SCHEME_IDS = {
    "fp32": gemm.FLOAT,
    "bf16": gemm.FLOAT,
    "fp16": gemm.FLOAT,
    "fp8_block": gemm.FP8_BLOCK,
    "mxfp4": gemm.MXFP4,
}
ACTIVATION_IDS = {"silu": gemm.SILU, "gelu": gemm.GELU, "swiglu_oai": gemm.SWIGLU_OAI}


def _strides3(t: torch.Tensor | None) -> tuple[int, int, int]:
    return tuple(t.stride()) if t is not None else (0, 0, 0)


def _bias_strides(b: torch.Tensor | None) -> tuple[int, int]:
    return (b.stride(0), b.stride(1)) if b is not None else (0, 0)


def launch_gemm1(
    x, w13, w13_scale, b13, topk_weights, sorted_ids, block_expert, offsets, intermediate,
    scheme: str, activation: str, alpha: float, limit: float, router_on_input: bool, top_k: int,
    block_m: int, g: GemmConfig,
) -> None:  # fmt: skip
    """GEMM1 + activation into ``intermediate`` ``[num_blocks * block_m, I]``."""
    num_m = block_expert.numel()
    inter = intermediate.shape[1]
    num_experts = w13.shape[0]
    gemm._gemm1[(num_m * triton.cdiv(inter, g.block_n),)](
        x, w13, w13_scale if w13_scale is not None else w13, b13 if b13 is not None else x, topk_weights,
        sorted_ids, block_expert, offsets, intermediate,
        topk_weights.numel(), num_m, inter, x.shape[1], num_experts, float(alpha), float(limit),
        x.stride(0), x.stride(1), *w13.stride(), *_strides3(w13_scale), *_bias_strides(b13),
        intermediate.stride(0), intermediate.stride(1),
        TOP_K=top_k, SCHEME=SCHEME_IDS[scheme], ACTIVATION=ACTIVATION_IDS[activation], HAS_BIAS=b13 is not None,
        ROUTER_ON_INPUT=router_on_input, PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
        BLOCK_M=block_m, BLOCK_N=g.block_n, BLOCK_K=g.block_k, GROUP_M=g.group_m,
        num_warps=g.num_warps, num_stages=g.num_stages,
    )  # fmt: skip


def launch_gemm2(
    intermediate, w2, w2_scale, b2, topk_weights, sorted_ids, block_expert, offsets, y,
    scheme: str, router_on_input: bool, top_k: int, block_m: int, g: GemmConfig, by_token: bool,
) -> None:  # fmt: skip
    """GEMM2 + bias + routing weight into ``y``: ``[M*k, H]``, or ``[M, H]`` when ``by_token``."""
    num_m = block_expert.numel()
    h = y.shape[1]
    gemm._gemm2[(num_m * triton.cdiv(h, g.block_n),)](
        intermediate, w2, w2_scale if w2_scale is not None else w2, b2 if b2 is not None else intermediate,
        topk_weights, sorted_ids, block_expert, offsets, y,
        topk_weights.numel(), num_m, h, intermediate.shape[1], w2.shape[0],
        intermediate.stride(0), intermediate.stride(1), *w2.stride(), *_strides3(w2_scale), *_bias_strides(b2),
        y.stride(0), y.stride(1),
        TOP_K=top_k, SCHEME=SCHEME_IDS[scheme], HAS_BIAS=b2 is not None, ROUTER_ON_INPUT=router_on_input,
        OUT_BY_TOKEN=by_token, PRECISION="ieee" if intermediate.dtype == torch.float32 else "tf32",
        BLOCK_M=block_m, BLOCK_N=g.block_n, BLOCK_K=g.block_k, GROUP_M=g.group_m,
        num_warps=g.num_warps, num_stages=g.num_stages,
    )  # fmt: skip


def run_fused_moe(
    x: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    w13_scale: torch.Tensor | None,
    w2_scale: torch.Tensor | None,
    b13: torch.Tensor | None,
    b2: torch.Tensor | None,
    out: torch.Tensor,
    scheme: str,
    activation: str,
    alpha: float,
    limit: float,
    router_on_input: bool,
    config: KernelConfig | None = None,
) -> None:
    """Compute the routed-expert output into ``out`` ([M, H], contiguous)."""
    m, h = x.shape
    top_k = topk_ids.shape[1]
    num_experts = w13.shape[0]
    inter = w2.shape[2] * (2 if scheme == "mxfp4" else 1)
    if m == 0:
        return
    cfg = config or select_config(scheme, num_experts, h, inter, top_k, m, x.device)
    sorted_ids, block_expert, offsets = align_mod.align(topk_ids, num_experts, cfg.block_m)
    topk_weights = topk_weights.reshape(-1).contiguous()
    intermediate = torch.empty(block_expert.numel() * cfg.block_m, inter, dtype=x.dtype, device=x.device)
    launch_gemm1(x, w13, w13_scale, b13, topk_weights, sorted_ids, block_expert, offsets, intermediate, scheme,
                 activation, alpha, limit, router_on_input, top_k, cfg.block_m, cfg.gemm1)  # fmt: skip
    by_token = top_k == 1
    y = out if by_token else torch.empty(m * top_k, h, dtype=x.dtype, device=x.device)
    launch_gemm2(intermediate, w2, w2_scale, b2, topk_weights, sorted_ids, block_expert, offsets, y, scheme,
                 router_on_input, top_k, cfg.block_m, cfg.gemm2, by_token)  # fmt: skip
    if not by_token:
        block = min(1024, triton.next_power_of_2(h))
        gemm._sum_slots[(m, triton.cdiv(h, block))](y, out, h, y.stride(0), out.stride(0), TOP_K=top_k, BLOCK_N=block)


@torch.library.custom_op("moe_triton::fused_moe", mutates_args=("out",))
def fused_moe(
    x: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    w13_scale: torch.Tensor | None,
    w2_scale: torch.Tensor | None,
    b13: torch.Tensor | None,
    b2: torch.Tensor | None,
    out: torch.Tensor,
    scheme: str,
    activation: str,
    alpha: float,
    limit: float,
    router_on_input: bool,
) -> None:
    """Routed-expert output of a MoE layer into ``out`` (see ``run_fused_moe``)."""
    run_fused_moe(
        x, topk_ids, topk_weights, w13, w2, w13_scale, w2_scale, b13, b2, out, scheme, activation, alpha, limit,
        router_on_input,
    )  # fmt: skip


@fused_moe.register_fake
def _(x, topk_ids, topk_weights, w13, w2, w13_scale, w2_scale, b13, b2, out, scheme, activation, alpha, limit,
      router_on_input) -> None:  # fmt: skip
    return None
