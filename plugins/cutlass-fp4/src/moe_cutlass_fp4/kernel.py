"""The NVFP4 call into ``flashinfer.fused_moe.cutlass_fused_moe``: weights once, scales per forward.

Layout facts (FlashInfer's binding, ``flashinfer_cutlass_fused_moe_binding.cu``, and its tests):

* weights: packed E2M1 bytes (low nibble = even element, as moe-core's) viewed as int64,
  ``[E, 2I, H/16]`` and ``[E, H, I/16]``; fc1 rows ``[up; gate]`` (the activation kernel reads
  the linear half first, the gate second);
* block scales: E4M3 bytes per 16 along K in the 128x4 swizzled layout, one swizzle per expert,
  viewed as int32: ``[E, round_up(2I, 128), round_up(H/16, 4) / 4]``;
* ``quant_scales`` = ``[fc1_act_global, fc1_weight_block, fc1_global, fc2_act_global,
  fc2_weight_block, fc2_global]``: the act globals are QUANTIZATION multipliers (448*6/amax),
  the ``fc*_global`` alphas dequantize each GEMM's fp32 accumulator: ``1 / (act_global *
  weight_global_quant)``. moe-core's global scales are DEQUANTIZATION multipliers
  (value = e2m1 * e4m3 * gs), so ``alpha = gs_weight * gs_activation``.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from types import SimpleNamespace

import torch

from moe_core.config import MoeConfig
from moe_core.errors import BackendUnavailableError
from moe_core.layout import swap_gate_up, swizzle_128x4
from moe_core.quant.fp4 import E2M1_MAX
from moe_core.quant.nvfp4 import E4M3_MAX
from moe_core.weights import MoeWeights
from moe_cutlass_fp4 import requirements
from moe_cutlass_fp4.devices import MODULES

#: amax / AMAX_TO_SCALE is moe-core's dynamic global scale (``moe_core.quant.nvfp4.default_global_scale``)
AMAX_TO_SCALE = E4M3_MAX * E2M1_MAX


def load() -> SimpleNamespace:
    try:
        import flashinfer
        from flashinfer import fused_moe
    except Exception as exc:
        raise BackendUnavailableError(
            f"cutlass_fp4: importing flashinfer failed ({type(exc).__name__}: {exc})"
        ) from exc
    version = requirements.flashinfer_version()
    imported = str(getattr(flashinfer, "__version__", "?"))
    if version is None or imported.split("+")[0] != version.public:
        raise BackendUnavailableError(
            f"cutlass_fp4: the imported flashinfer reports {imported} but the installed {requirements.DISTRIBUTION} "
            f"metadata says {version}"
        )
    try:
        fn = fused_moe.cutlass_fused_moe
        activation = fused_moe.ActivationType
        modules = {name: getattr(fused_moe, name) for name in set(MODULES.values())}
    except AttributeError as exc:
        raise BackendUnavailableError(f"cutlass_fp4: flashinfer {imported} lacks {exc.name}") from exc
    takes_4over6 = "nvfp4_4over6" in inspect.signature(fn).parameters
    if requirements.four_over_six_switches() and not takes_4over6:
        raise BackendUnavailableError(f"cutlass_fp4: {requirements.check_recipe(version).reason}")
    return SimpleNamespace(
        version=version,
        cutlass_fused_moe=fn,
        ActivationType=activation,
        takes_4over6=takes_4over6,
        modules=modules,
    )


@dataclass
class Prepared:
    w13: torch.Tensor  # int64 view [E, 2I, H/16], rows [up; gate]
    w2: torch.Tensor  # int64 view [E, H, I/16]
    s13: torch.Tensor  # int32 view of the per-expert 128x4-swizzled E4M3 bytes
    s2: torch.Tensor
    w13_gs: torch.Tensor  # float32 [E], moe-core convention (dequantization multiplier)
    amax_to_scale: torch.Tensor  # float32 0-d 448*6 on the device (true division, as moe-core's reference)
    a2: torch.Tensor  # float32 0-d: fc2_act_global = 1 / static GEMM2-input scale
    alpha2: torch.Tensor  # float32 [E]: w2_gs * static GEMM2-input scale
    b13: torch.Tensor | None  # activation dtype [E, 2I], [up; gate]
    b2: torch.Tensor | None
    swiglu: tuple  # (alpha, beta, limit) float32 [E] each, or Nones


def _packed_as_int64(packed: torch.Tensor) -> torch.Tensor:
    return packed.contiguous().view(torch.int64)  # 16 E2M1 per int64 (FlashInfer's NVFP4 weight dtype)


def _swizzled_as_int32(scale: torch.Tensor) -> torch.Tensor:
    return swizzle_128x4(scale).view(torch.uint8).view(torch.int32)


def swiglu_params(config: MoeConfig, device) -> tuple:
    """``swiglu_oai`` = FlashInfer's SwiGLU-with-bias at beta = 1; ``silu`` = plain Swiglu (no tensors)."""
    if config.activation == "silu":
        return (None, None, None)
    values = (config.swiglu_alpha, 1.0, config.swiglu_limit)
    return tuple(torch.full((config.num_experts,), float(v), dtype=torch.float32, device=device) for v in values)


def prepare(config: MoeConfig, weights: MoeWeights, fc2_input_scale: float) -> Prepared:
    device = weights.device
    s = torch.tensor(float(fc2_input_scale), dtype=torch.float32, device=device)
    b13 = b2 = None
    if config.has_bias:
        b13 = swap_gate_up(weights.b13, dim=1).to(config.dtype).contiguous()
        b2 = weights.b2.to(config.dtype).contiguous()
    return Prepared(
        w13=_packed_as_int64(swap_gate_up(weights.w13, dim=1)),
        w2=_packed_as_int64(weights.w2),
        s13=_swizzled_as_int32(swap_gate_up(weights.w13_scale, dim=1)),
        s2=_swizzled_as_int32(weights.w2_scale),
        w13_gs=weights.w13_global_scale.float().contiguous(),
        amax_to_scale=torch.tensor(AMAX_TO_SCALE, dtype=torch.float32, device=device),
        a2=torch.reciprocal(s),
        alpha2=(weights.w2_global_scale.float() * s).contiguous(),
        b13=b13,
        b2=b2,
        swiglu=swiglu_params(config, device),
    )


def fc1_scales(x: torch.Tensor, p: Prepared) -> tuple[torch.Tensor, torch.Tensor]:
    """The GEMM1 input's dynamic global scale, as moe-core's reference computes it, on device (no sync).

    Returns ``(fc1_act_global, fc1_global)``: ``1 / gs_x`` (FlashInfer quantizes
    ``x * fc1_act_global``) and ``w13_gs * gs_x`` (the GEMM1 dequantization
    alpha), with ``gs_x = amax(|x|) / (448 * 6)``, 1.0 when x is all zero.
    """
    lo, hi = torch.aminmax(x)
    amax = torch.maximum(hi.float(), -lo.float())
    gs = torch.where(amax > 0, amax / p.amax_to_scale, torch.ones_like(amax))
    return torch.reciprocal(gs), p.w13_gs * gs


def call_kwargs(fi, config: MoeConfig, p: Prepared, x, topk_ids, topk_weights, out) -> dict:
    a1, alpha1 = fc1_scales(x, p)
    alpha, beta, limit = p.swiglu
    kwargs = dict(
        input=x,  # bf16/fp16: the kernel quantizes it to NVFP4 with fc1_act_global
        token_selected_experts=topk_ids,
        token_final_scales=topk_weights,
        fc1_expert_weights=p.w13,
        fc2_expert_weights=p.w2,
        output_dtype=config.dtype,
        quant_scales=[a1, p.s13, alpha1, p.a2, p.s2, p.alpha2],
        fc1_expert_biases=p.b13,
        fc2_expert_biases=p.b2,
        input_sf=None,
        swiglu_alpha=alpha,
        swiglu_beta=beta,
        swiglu_limit=limit,
        output=out,
        use_fused_finalize=False,  # the fused finalize sums the top-k rows with atomics (not bitwise repeatable)
        activation_type=fi.ActivationType.Swiglu,
    )
    if fi.takes_4over6:
        kwargs["nvfp4_4over6"] = None  # the standard NVFP4 recipe, whatever FLASHINFER_NVFP4_4OVER6* says
    return kwargs
