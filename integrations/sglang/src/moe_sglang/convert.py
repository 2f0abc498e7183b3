"""An SGLang ``FusedMoE`` layer -> moe's canonical ``MoeConfig`` and ``MoeWeights``.

Read from the layer as SGLang's weight loader left it, *before* SGLang's ``process_weights_after_loading`` re-lays
it out for its own kernels (VNNI packing on CPU, swizzles, shuffles): at that point the layouts are the
checkpoint's, per quantization method:

- unquantized: ``w13_weight`` ``[E, 2I, H]`` rows ``[gate; up]`` (``[up; gate]`` when the method's
  ``load_up_proj_weight_first`` says so), ``w2_weight`` ``[E, H, I]``, fp32 biases;
- block fp8: the same shapes in ``float8_e4m3fn`` with fp32 ``*_weight_scale_inv`` per 128x128 block — moe's
  ``fp8_block`` exactly;
- MXFP4 (gpt-oss): packed E2M1 (low nibble = even element, moe's convention) with UE8M0 ``*_weight_scale``
  per 32, gate and up rows *interleaved* (``g0, u0, g1, u1, ...``) when the layer's
  ``moe_runner_config.gate_up_interleaved`` is set and the activation has gpt-oss's alpha; a buffer may be
  padded past the layer's own sizes (SGLang rounds for some kernels), and the padding is cut off.

What moe cannot express is returned as a reason (``Unservable``) instead of being approximated.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from moe_core.config import MoeConfig
from moe_core.layout import deinterleave_gate_up, swap_gate_up
from moe_core.weights import MoeWeights

#: quant scheme by SGLang quantization method class name (the classes moe-sglang hooks)
SCHEME_BY_METHOD = {"UnquantizedFusedMoEMethod": None, "Fp8MoEMethod": "fp8_block", "Mxfp4MoEMethod": "mxfp4"}
_FLOAT_SCHEMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


class Unservable(Exception):
    """A layer moe's runner cannot run as SGLang would; the message says why, in one sentence."""


@dataclass(frozen=True)
class LayerShape:
    """What moe needs to know about one SGLang MoE layer, independent of its weights."""

    config: MoeConfig
    #: gate/up rows interleaved in SGLang's w13 (gpt-oss); canonical is [gate; up] halves
    interleaved: bool
    #: SGLang's w13 holds [up; gate] (load_up_proj_weight_first)
    up_first: bool


def scheme_of(method) -> str:
    """moe's quant scheme for the SGLang quantization method of a layer; ``Unservable`` if it has none."""
    name = type(method).__name__
    if name not in SCHEME_BY_METHOD:
        raise Unservable(
            f"its quantization method {name} is not one moe-sglang converts (it serves {', '.join(SCHEME_BY_METHOD)})"
        )
    if name == "Fp8MoEMethod":
        block = getattr(method.quant_config, "weight_block_size", None)
        if getattr(method, "use_mxfp8", False) or list(block or ()) != [128, 128]:
            raise Unservable(f"its fp8 weights are not 128x128 block-quantized (weight_block_size={block})")
    return SCHEME_BY_METHOD[name] or ""


def _activation(rc) -> tuple[str, dict]:
    """moe's activation name and its parameters for SGLang's ``MoeRunnerConfig``; ``Unservable`` otherwise."""
    if not rc.is_gated:
        raise Unservable("its experts are not gated (is_gated=False); moe's activations are gated")
    if rc.swiglu_limit is not None:
        raise Unservable(f"it clamps SwiGLU with swiglu_limit={rc.swiglu_limit}, which moe has no activation for")
    if getattr(rc, "no_combine", False):
        raise Unservable("it asks for uncombined per-expert outputs (no_combine), moe returns the combined sum")
    if rc.activation == "silu" and rc.gemm1_alpha is not None:
        if rc.gemm1_clamp_limit is None or rc.gemm1_beta not in (None, 1.0):
            raise Unservable(
                f"its SwiGLU variant (alpha={rc.gemm1_alpha}, limit={rc.gemm1_clamp_limit}, beta={rc.gemm1_beta}) "
                "is not gpt-oss's, the only one moe has"
            )
        return "swiglu_oai", {"swiglu_alpha": float(rc.gemm1_alpha), "swiglu_limit": float(rc.gemm1_clamp_limit)}
    if rc.activation in ("silu", "gelu") and rc.gemm1_alpha is None and rc.gemm1_clamp_limit is None:
        return rc.activation, {}
    raise Unservable(
        f"its activation {rc.activation!r} (gemm1_alpha={rc.gemm1_alpha}, gemm1_clamp_limit={rc.gemm1_clamp_limit}) "
        "is not one of moe's (silu, gelu, gpt-oss swiglu)"
    )


def layer_shape(layer, method, a2a_backend: str = "none") -> LayerShape:
    """The ``MoeConfig`` of an SGLang layer whose weights are created (not necessarily loaded)."""
    rc = layer.moe_runner_config
    scheme = scheme_of(method)
    activation, params = _activation(rc)
    dtype = rc.params_dtype or layer.params_dtype
    has_bias = getattr(layer, "w13_weight_bias", None) is not None
    if not scheme:
        if dtype not in _FLOAT_SCHEMES:
            raise Unservable(f"its unquantized weights are {dtype}, not a float dtype moe has a scheme for")
        scheme = _FLOAT_SCHEMES[dtype]
    if rc.apply_router_weight_on_input and layer.top_k != 1:
        raise Unservable(f"it applies the router weight on the input with top_k={layer.top_k} (moe needs top_k=1)")
    config = MoeConfig(
        num_experts=layer.num_local_experts,
        top_k=layer.top_k,
        hidden_size=layer.hidden_size,
        intermediate_size=layer.intermediate_size_per_partition,
        quant_scheme=scheme,
        activation=activation,
        dtype=dtype,
        has_bias=has_bias,
        apply_router_weight_on_input=bool(rc.apply_router_weight_on_input),
        **params,
    )
    interleaved = activation == "swiglu_oai" and bool(getattr(rc, "gate_up_interleaved", True))
    return LayerShape(config, interleaved, bool(getattr(method, "load_up_proj_weight_first", False)))


def _rows13(t: torch.Tensor, shape: LayerShape) -> torch.Tensor:
    """w13-like rows (weights, scales, biases; dim 1) in canonical ``[gate; up]`` order, padding cut off."""
    i = shape.config.intermediate_size
    t = t[:, : 2 * i]
    if shape.interleaved:
        return deinterleave_gate_up(t)
    if shape.up_first:
        return swap_gate_up(t)
    return t


def _cut(t: torch.Tensor, *sizes: int) -> torch.Tensor:
    """``t[:, :sizes[0], :sizes[1]]``: a buffer SGLang padded, cut to the layer's own sizes."""
    return t[(slice(None), *(slice(0, s) for s in sizes))]


def canonical_weights(layer, shape: LayerShape) -> MoeWeights:
    """The layer's loaded weights in moe's canonical layout (copies where the order changes, else views)."""
    cfg = shape.config
    spec = cfg.scheme
    h, i = cfg.hidden_size, cfg.intermediate_size
    k13, k2 = spec.storage_shape(2 * i, h)[1], spec.storage_shape(h, i)[1]
    w13 = _rows13(_cut(layer.w13_weight.data, 2 * i, k13), shape).contiguous()
    w2 = _cut(layer.w2_weight.data, h, k2).contiguous()
    scales = {}
    if spec.quantized:
        suffix = "_weight_scale_inv" if cfg.quant_scheme == "fp8_block" else "_weight_scale"
        s13 = spec.scale_shape(2 * i, h)
        s2 = spec.scale_shape(h, i)
        w13_scale = getattr(layer, "w13" + suffix).data
        if spec.scale_block[0] == 1:  # a scale per row follows its row
            w13_scale = _rows13(w13_scale, shape)
        else:  # a scale per 128-row block: gate and up are whole blocks, never interleaved
            w13_scale = _cut(w13_scale, *s13)
            if shape.up_first:
                w13_scale = torch.cat(w13_scale.chunk(2, dim=1)[::-1], dim=1)
        scales = {
            "w13_scale": _cut(w13_scale, *s13).contiguous(),
            "w2_scale": _cut(getattr(layer, "w2" + suffix).data, *s2).contiguous(),
        }
    biases = {}
    if cfg.has_bias:
        bias_dtype = cfg.dtype if spec.quantized else spec.storage_dtype
        b13 = layer.w13_weight_bias.data
        biases = {
            "b13": _rows13(b13.unsqueeze(-1), shape).squeeze(-1).to(bias_dtype).contiguous(),
            "b2": layer.w2_weight_bias.data[:, :h].to(bias_dtype).contiguous(),
        }
    return MoeWeights(w13=w13, w2=w2, **scales, **biases)
