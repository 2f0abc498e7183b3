"""Everything this backend touches in FlashInfer, in one place: imported lazily, called by keyword.

``load()`` imports flashinfer (seconds) and returns the handful of functions
and enums used, so a runner binds them once and the hot path looks nothing
up. The ``*_kwargs`` builders produce the exact keyword arguments of each
kernel call; the tests bind them against the installed FlashInfer's real
signatures (``inspect.signature(fn).bind(**kwargs)``), so an API change fails
the tests rather than a deployment. The ``prepare_*`` pipelines take that
namespace as an argument, which lets the tests run them on CPU with the two
CUDA-only helpers replaced by stand-ins.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from types import SimpleNamespace

import torch
from packaging.version import Version

from moe_core.config import MoeConfig
from moe_core.errors import BackendUnavailableError
from moe_core.layout import swap_gate_up
from moe_core.weights import MoeWeights
from moe_flashinfer_mxfp4 import layout, requirements

#: trtllm-gen's epilogue tile along M; sets the row shuffle (blocks of 32 rows)
EPILOGUE_TILE_M = 128
#: UE8M0 scale block along K
GROUP = 32


def load() -> SimpleNamespace:
    """Import flashinfer and collect what this backend calls; BackendUnavailableError if anything is off."""
    try:
        import flashinfer
        from flashinfer import fused_moe
    except Exception as exc:  # ImportError, or a CUDA library problem surfacing at import
        raise BackendUnavailableError(
            f"flashinfer_mxfp4: importing flashinfer failed ({type(exc).__name__}: {exc})"
        ) from exc
    imported = Version(str(getattr(flashinfer, "__version__", "0")))
    metadata = requirements.installed()
    if metadata is None or imported.public != metadata.public:
        raise BackendUnavailableError(
            f"flashinfer_mxfp4: the imported flashinfer reports version {imported} but the installed "
            f"{requirements.DISTRIBUTION} metadata says {metadata}; refusing to guess which layouts it expects"
        )
    names = {
        "cutlass_fused_moe": fused_moe,
        "trtllm_fp4_block_scale_routed_moe": fused_moe,
        "interleave_moe_weights_for_sm90_mixed_gemm": fused_moe,
        "interleave_moe_scales_for_sm90_mixed_gemm": fused_moe,
        "reorder_rows_for_gated_act_gemm": fused_moe,
        "gen_cutlass_fused_moe_sm90_module": fused_moe,
        "gen_trtllm_gen_fused_moe_sm100_module": fused_moe,
        "ActivationType": fused_moe,
        "RoutingMethodType": fused_moe,
        "shuffle_matrix_a": flashinfer,
        "shuffle_matrix_sf_a": flashinfer,
    }
    found, missing = {}, []
    for name, module in names.items():
        value = getattr(module, name, None)
        (missing.append(name) if value is None else found.__setitem__(name, value))
    if missing:
        raise BackendUnavailableError(
            f"flashinfer_mxfp4: flashinfer {imported} lacks {', '.join(missing)}; supported: "
            f"{requirements.DISTRIBUTION}{requirements.SUPPORTED}"
        )
    sf_layout = getattr(flashinfer, "SfLayout", None)
    return SimpleNamespace(
        version=imported,
        SfLayout=sf_layout,
        # optional keyword of newer releases (0.7.0+): declare the activation-scale layout (deprecation otherwise)
        routed_takes_sf_layout=has_param(found["trtllm_fp4_block_scale_routed_moe"], "hidden_states_scale_layout")
        and sf_layout is not None,
        **found,
    )


def has_param(fn, name: str) -> bool:
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


# ---- layout verification (bind time) -----------------------------------------------------------
def verify_sm90_layout(fi) -> str:
    """The SM90 layout family, established by version AND by probing the installed helper; fail closed."""
    by_version = requirements.sm90_layout_family(fi.version)
    by_probe = layout.detect_sm90_layout(fi.interleave_moe_scales_for_sm90_mixed_gemm)
    if by_version != requirements.LAYOUT_V2 or by_probe != requirements.LAYOUT_V2:
        raise BackendUnavailableError(
            f"flashinfer_mxfp4: flashinfer {fi.version} ships SM90 W4A16 layout {by_version!r} by its version, and "
            f"its interleave_moe_scales_for_sm90_mixed_gemm produces layout {by_probe!r}; this backend prepares "
            f"only the 'v2' layout and refuses to feed the kernel a layout the installed FlashInfer may not expect"
        )
    return by_probe


def verify_trtllm_rows(fi) -> str:
    problem = layout.check_trtllm_row_shuffle(fi.reorder_rows_for_gated_act_gemm, fi.shuffle_matrix_a)
    if problem:
        raise BackendUnavailableError(
            f"flashinfer_mxfp4: flashinfer {fi.version}: {problem}; refusing to prepare trtllm-gen weights"
        )
    return "trtllm-gen row shuffle (epilogue tile 128)"


# ---- prepared weights --------------------------------------------------------------------------
def activation_params(config: MoeConfig, device) -> tuple[torch.Tensor | None, ...]:
    """Per-expert float32 (alpha, beta, limit) for swiglu_oai, Nones for plain silu.

    FlashInfer's SwiGLU-with-bias computes ``min(g, limit) * sigmoid(alpha *
    min(g, limit)) * (clamp(u, -limit, limit) + beta)``; moe-core's
    ``swiglu_oai`` is that with beta = 1 (the ``+1`` on the linear half).
    Plain ``silu`` passes none of them (FlashInfer's default Swiglu:
    ``silu(g) * u``).
    """
    if config.activation != "swiglu_oai":
        return None, None, None
    e = config.num_experts

    def full(v):
        return torch.full((e,), float(v), dtype=torch.float32, device=device)

    return full(config.swiglu_alpha), full(1.0), full(config.swiglu_limit)


@dataclass
class Sm90Weights:
    """Inputs of ``cutlass_fused_moe(use_w4_group_scaling=True)`` that do not change per forward."""

    w13: torch.Tensor  # uint8 [E, 2I, H/2], rows [up; gate], interleaved by FlashInfer
    w2: torch.Tensor  # uint8 [E, H, I/2], interleaved
    quant_scales: list  # [int32 view of uint8 [E, 2I/64, H/128, 16, 16], same for w2]
    b13: torch.Tensor | None  # bf16 [E, 2I], [up; gate]
    b2: torch.Tensor | None  # bf16 [E, H]
    swiglu_alpha: torch.Tensor | None
    swiglu_beta: torch.Tensor | None
    swiglu_limit: torch.Tensor | None


@dataclass
class Sm100Weights:
    """Inputs of ``trtllm_fp4_block_scale_routed_moe`` (bf16 activations) that do not change per forward."""

    w13: torch.Tensor  # uint8 [E, 2I, H/2], gated-reordered + shuffled rows
    s13: torch.Tensor  # float8_e4m3fn view of UE8M0 bytes [E, 2I, H/32], shuffled + 128x4-interleaved
    b13: torch.Tensor | None  # float32 [E, 2I], same row order as w13
    w2: torch.Tensor  # uint8 [E, H, I/2], shuffled rows
    s2: torch.Tensor  # float8 view [E, H, I/32]
    b2: torch.Tensor | None  # float32 [E, H]
    alpha: torch.Tensor | None
    beta: torch.Tensor | None
    limit: torch.Tensor | None
    ones: torch.Tensor  # float32 [E]: output scales (unit: bf16 activations, scales live in the weights)


def prepare_sm90(config: MoeConfig, weights: MoeWeights, fi) -> Sm90Weights:
    """Canonical mxfp4 weights -> the SM90 CUTLASS W4A16 layout, with the installed FlashInfer's helpers."""
    e, h, i = config.num_experts, config.hidden_size, config.intermediate_size
    w13 = swap_gate_up(weights.w13, dim=1)  # [gate; up] -> [up; gate] (CUTLASS: act(x @ w[I:]) * (x @ w[:I]))
    s13 = swap_gate_up(weights.w13_scale, dim=1)
    w2, s2 = weights.w2.contiguous(), weights.w2_scale.contiguous()
    w13_il = fi.interleave_moe_weights_for_sm90_mixed_gemm(w13, "fp4")
    w2_il = fi.interleave_moe_weights_for_sm90_mixed_gemm(w2, "fp4")
    s13_f = fi.interleave_moe_scales_for_sm90_mixed_gemm(s13, group_size=GROUP)
    s2_f = fi.interleave_moe_scales_for_sm90_mixed_gemm(s2, group_size=GROUP)
    for name, got, want in (
        ("w13", w13_il, (e, 2 * i, h // 2)),
        ("w2", w2_il, (e, h, i // 2)),
        ("w13 scales", s13_f, (e, 2 * i // 64, h // 128, 16, 16)),
        ("w2 scales", s2_f, (e, h // 64, i // 128, 16, 16)),
    ):
        if tuple(got.shape) != want or got.dtype != torch.uint8:
            raise BackendUnavailableError(
                f"flashinfer_mxfp4: FlashInfer's SM90 helper returned {name} as {got.dtype} {tuple(got.shape)}, "
                f"expected uint8 {want} (the v2 layout); refusing to run"
            )
    b13 = b2 = None
    if config.has_bias:
        b13 = swap_gate_up(weights.b13, dim=1).to(torch.bfloat16).contiguous()
        b2 = weights.b2.to(torch.bfloat16).contiguous()
    alpha, beta, limit = activation_params(config, weights.device)
    return Sm90Weights(
        w13=w13_il,
        w2=w2_il,
        quant_scales=[s13_f.contiguous().view(torch.int32), s2_f.contiguous().view(torch.int32)],
        b13=b13,
        b2=b2,
        swiglu_alpha=alpha,
        swiglu_beta=beta,
        swiglu_limit=limit,
    )


def prepare_sm100(config: MoeConfig, weights: MoeWeights, fi) -> Sm100Weights:
    """Canonical mxfp4 weights -> the trtllm-gen layout (FlashInfer's documented per-expert shuffles)."""
    e, h, i = config.num_experts, config.hidden_size, config.intermediate_size
    tile = EPILOGUE_TILE_M
    w13 = swap_gate_up(weights.w13, dim=1)  # [up; gate], the order trtllm_*_moe expects
    s13 = swap_gate_up(weights.w13_scale, dim=1)
    gated = fi.reorder_rows_for_gated_act_gemm

    def stack(f, t):
        return torch.stack([f(t[x]) for x in range(e)]).contiguous()

    g1w = stack(lambda t: fi.shuffle_matrix_a(gated(t), tile), w13)
    g1s = stack(lambda t: fi.shuffle_matrix_sf_a(gated(t), tile).reshape(2 * i, h // GROUP), s13)
    g2w = stack(lambda t: fi.shuffle_matrix_a(t, tile), weights.w2)
    g2s = stack(lambda t: fi.shuffle_matrix_sf_a(t.contiguous(), tile).reshape(h, i // GROUP), weights.w2_scale)
    b13 = b2 = None
    if config.has_bias:
        b13_rows = swap_gate_up(weights.b13, dim=1).float()
        b13 = stack(lambda t: fi.shuffle_matrix_a(gated(t.unsqueeze(1)), tile).squeeze(1), b13_rows)
        b2 = weights.b2.float().contiguous()
    alpha, beta, limit = activation_params(config, weights.device)
    return Sm100Weights(
        w13=g1w,
        s13=g1s.view(torch.float8_e4m3fn),  # the launcher wants float8 metadata for UE8M0 bytes too
        b13=b13,
        w2=g2w,
        s2=g2s.view(torch.float8_e4m3fn),
        b2=b2,
        alpha=alpha,
        beta=beta,
        limit=limit,
        ones=torch.ones(e, dtype=torch.float32, device=weights.device),
    )


# ---- per-forward keyword arguments ---------------------------------------------------------------
def sm90_kwargs(fi, p: Sm90Weights, x, topk_ids, topk_weights, out) -> dict:
    return dict(
        input=x,
        token_selected_experts=topk_ids,
        token_final_scales=topk_weights,
        fc1_expert_weights=p.w13,
        fc2_expert_weights=p.w2,
        output_dtype=torch.bfloat16,
        quant_scales=p.quant_scales,
        fc1_expert_biases=p.b13,
        fc2_expert_biases=p.b2,
        swiglu_alpha=p.swiglu_alpha,
        swiglu_beta=p.swiglu_beta,
        swiglu_limit=p.swiglu_limit,
        output=out,
        use_w4_group_scaling=True,
        # the default fused finalize reduces the top-k rows with atomics: run-to-run different bits
        use_fused_finalize=False,
        activation_type=fi.ActivationType.Swiglu,
    )


def sm100_kwargs(fi, p: Sm100Weights, config: MoeConfig, x, topk_ids, topk_weights, out) -> dict:
    kwargs = dict(
        topk_ids=(topk_ids, topk_weights),  # unpacked precomputed routing: int32 ids, float32 weights as is
        routing_bias=None,
        hidden_states=x,
        hidden_states_scale=None,
        gemm1_weights=p.w13,
        gemm1_weights_scale=p.s13,
        gemm1_bias=p.b13,
        gemm1_alpha=p.alpha,
        gemm1_beta=p.beta,
        gemm1_clamp_limit=p.limit,
        gemm2_weights=p.w2,
        gemm2_weights_scale=p.s2,
        gemm2_bias=p.b2,
        output1_scale_scalar=p.ones,
        output1_scale_gate_scalar=p.ones,
        output2_scale_scalar=p.ones,
        num_experts=config.num_experts,
        top_k=config.top_k,
        n_group=None,
        topk_group=None,
        intermediate_size=config.intermediate_size,
        local_expert_offset=0,
        local_num_experts=config.num_experts,
        routed_scaling_factor=None,
        routing_method_type=int(fi.RoutingMethodType.TopK),  # weights are final: no softmax/renormalisation
        do_finalize=True,
        activation_type=int(fi.ActivationType.Swiglu),
        output=out,
    )
    if fi.routed_takes_sf_layout:
        kwargs["hidden_states_scale_layout"] = fi.SfLayout.layout_linear
    return kwargs
