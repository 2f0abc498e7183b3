"""The bridge between the element formats and ``MoeWeights``.

``quantize_weights`` turns unquantized canonical weights into a scheme's
storage (``moe_core.schemes.SCHEMES`` says which fields it fills);
``dequantize_expert`` / ``dequantize_weights`` go back to floats for the
torch reference backend and for error checks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

from moe_core.errors import InvalidInputError
from moe_core.quant._common import check_float_input
from moe_core.quant.fp8 import dequantize_fp8_block, quantize_fp8_block
from moe_core.quant.mxfp4 import dequantize_mxfp4, quantize_mxfp4
from moe_core.quant.nvfp4 import dequantize_nvfp4, quantize_nvfp4
from moe_core.schemes import SchemeSpec, scheme_spec
from moe_core.weights import MoeWeights

_PROJECTIONS = ("w13", "w2")

#: elements of a projection quantized per step. The codecs work in float32 with temporaries of their input's
#: size, so a whole projection at once (gpt-oss-120b's w13: 2.1 G elements) would need tens of GB on top of the
#: weights; every scheme's blocks and global scales lie within one expert, so steps of whole experts give the
#: same bytes.
QUANT_STEP_ELEMENTS = 1 << 26


class _Codec(NamedTuple):
    """A quantized scheme's element format: weights -> (codes, block scale, global scale or None) and back."""

    quantize: Callable[[torch.Tensor, SchemeSpec], tuple]
    dequantize: Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None, SchemeSpec, torch.dtype], torch.Tensor]


def _needs_global_scale(q, scale, global_scale, spec, dtype):
    if global_scale is None:
        raise InvalidInputError(f"scheme {spec.name!r} needs a global scale")
    return dequantize_nvfp4(q, scale, global_scale, dtype)


#: scheme name -> its codec; every quantized scheme of ``moe_core.schemes.SCHEMES`` has one (tested)
CODECS: dict[str, _Codec] = {
    "mxfp4": _Codec(lambda w, spec: (*quantize_mxfp4(w), None), lambda q, s, g, spec, dt: dequantize_mxfp4(q, s, dt)),
    "nvfp4": _Codec(lambda w, spec: quantize_nvfp4(w), _needs_global_scale),
    "fp8_block": _Codec(
        lambda w, spec: (*quantize_fp8_block(w, spec.scale_block), None),
        lambda q, s, g, spec, dt: dequantize_fp8_block(q, s, spec.scale_block, dt),
    ),
}


def _codec(spec: SchemeSpec) -> _Codec:
    try:
        return CODECS[spec.name]
    except KeyError:  # a scheme added to SCHEMES without a codec here
        raise InvalidInputError(f"no quantizer for scheme {spec.name!r}") from None


def quantize_weights(weights: MoeWeights, scheme: str) -> MoeWeights:
    """Quantize canonical float ``w13 [E, 2I, H]`` / ``w2 [E, H, I]`` into ``scheme``.

    Quantized schemes fill ``w*_scale`` (and ``w*_global_scale`` for nvfp4, one
    per expert) and pass the biases through unchanged: their dtype is the
    activation dtype, which the caller chooses. Unquantized schemes
    (fp32/bf16/fp16) cast ``w13``/``w2`` *and* the biases to the scheme's dtype,
    because ``validate_weights`` requires that for them.
    """
    if not isinstance(weights, MoeWeights):
        raise InvalidInputError(f"weights must be a MoeWeights, got {type(weights).__name__}")
    spec = scheme_spec(scheme)
    for name in _PROJECTIONS:
        check_float_input(getattr(weights, name), f"{name}", min_dim=3)
    if not spec.quantized:

        def cast(t):
            return None if t is None else t.to(spec.storage_dtype)

        return MoeWeights(w13=cast(weights.w13), w2=cast(weights.w2), b13=cast(weights.b13), b2=cast(weights.b2))
    out = MoeWeights(w13=weights.w13, w2=weights.w2, b13=weights.b13, b2=weights.b2)
    for name in _PROJECTIONS:
        q, scale, global_scale = _quantize_by_experts(_codec(spec), getattr(weights, name), spec)
        setattr(out, name, q)
        setattr(out, f"{name}_scale", scale)
        setattr(out, f"{name}_global_scale", global_scale)
    return out


def _quantize_by_experts(codec: _Codec, w: torch.Tensor, spec: SchemeSpec) -> tuple:
    """``codec.quantize(w, spec)`` in steps of whole experts (``QUANT_STEP_ELEMENTS``), written into outputs
    allocated once, so the float32 temporaries are a step's, not the projection's."""
    experts = w.shape[0]
    step = max(1, QUANT_STEP_ELEMENTS // max(1, w[0].numel())) if experts else 1
    if step >= experts:
        return codec.quantize(w, spec)
    first = codec.quantize(w[:step], spec)
    outs = tuple(None if t is None else t.new_empty((experts, *t.shape[1:])) for t in first)
    for lo in range(0, experts, step):
        part = first if lo == 0 else codec.quantize(w[lo : lo + step], spec)
        for out, t in zip(outs, part, strict=True):
            if out is not None:
                out[lo : lo + step] = t
    return outs


def _dequantize(spec: SchemeSpec, q, scale, global_scale, dtype: torch.dtype) -> torch.Tensor:
    """One stored projection (any leading dims) back to ``dtype``."""
    if not spec.quantized:
        return q.to(dtype)
    if scale is None:
        raise InvalidInputError(f"scheme {spec.name!r} needs a block scale")
    return _codec(spec).dequantize(q, scale, global_scale, spec, dtype)


def dequantize_projection(weights: MoeWeights, scheme: str, projection: str, expert: int) -> torch.Tensor:
    """Expert ``expert``'s ``w13 [2I, H]`` or ``w2 [H, I]`` (``projection``) in float32."""
    if projection not in _PROJECTIONS:
        raise InvalidInputError(f"projection must be one of {_PROJECTIONS}, got {projection!r}")
    spec = scheme_spec(scheme)
    num_experts = weights.w13.shape[0]
    if not -num_experts <= expert < num_experts:
        raise InvalidInputError(f"expert {expert} out of range for {num_experts} experts")

    def pick(t):
        return None if t is None else t[expert]

    return _dequantize(
        spec,
        getattr(weights, projection)[expert],
        pick(getattr(weights, f"{projection}_scale")),
        pick(getattr(weights, f"{projection}_global_scale")),
        torch.float32,
    )


def dequantize_expert(weights: MoeWeights, scheme: str, expert: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Expert ``expert``'s ``w13 [2I, H]`` and ``w2 [H, I]`` in float32.

    What the torch reference backend calls per active expert, so memory stays
    at the stored size plus one expert.
    """
    return tuple(dequantize_projection(weights, scheme, name, expert) for name in _PROJECTIONS)


def dequantize_weights(
    weights: MoeWeights, scheme: str, dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor]:
    """All experts' ``w13 [E, 2I, H]`` and ``w2 [E, H, I]`` in ``dtype``."""
    spec = scheme_spec(scheme)
    return tuple(
        _dequantize(
            spec,
            getattr(weights, name),
            getattr(weights, f"{name}_scale"),
            getattr(weights, f"{name}_global_scale"),
            dtype,
        )
        for name in _PROJECTIONS
    )
