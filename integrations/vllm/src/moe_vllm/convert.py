"""A vLLM ``RoutedExperts`` layer with the unquantized method -> moe's canonical ``MoeConfig`` and ``MoeWeights``.

Read from the layer as vLLM's weight loader left it, *before* the method's ``process_weights_after_loading`` hands
the weights to its kernel's format (``convert_to_unquantized_kernel_format``: shuffles, w31 swaps, CPU prepacking):

- ``w13_weight`` ``[E, 2I, H]`` rows ``[gate; up]`` (vLLM's loader writes the gate shard first), ``w2_weight``
  ``[E, H, I]``, optional ``w13_bias`` ``[E, 2I]`` / ``w2_bias`` ``[E, H]`` in the weights' dtype;
- under ``swigluoai`` (gpt-oss) the gate and up rows of ``w13`` (and of ``w13_bias``) are *interleaved*
  (``g0, u0, g1, u1, ...``: what vLLM's ``swigluoai_and_mul`` reads), and are de-interleaved here.

What moe cannot express is returned as a reason (``Unservable``) instead of being approximated.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from moe_core.config import MoeConfig
from moe_core.layout import deinterleave_gate_up
from moe_core.weights import MoeWeights

_FLOAT_SCHEMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}
#: gpt-oss's SwiGLU as vLLM's ``swigluoai_and_mul`` computes it (its defaults; the modular path passes no others)
_SWIGLUOAI = {"swiglu_alpha": 1.702, "swiglu_limit": 7.0}


class Unservable(Exception):
    """A layer moe's runner cannot run as vLLM would; the message says why, in one sentence."""


@dataclass(frozen=True)
class LayerShape:
    """What moe needs to know about one vLLM MoE layer, independent of its weights."""

    config: MoeConfig
    #: gate/up rows interleaved in vLLM's w13 (swigluoai); canonical is [gate; up] halves
    interleaved: bool


def _activation(layer) -> tuple[str, dict]:
    """moe's activation and its parameters for the layer's ``MoEActivation``; ``Unservable`` otherwise."""
    act = layer.activation.value
    alpha, limit, beta = layer.swiglu_alpha, layer.swiglu_limit, layer.swiglu_beta
    if act in ("silu", "gelu"):
        if limit is not None or alpha is not None:
            raise Unservable(
                f"its {act} activation is clamped or scaled (swiglu_limit={limit}, swiglu_alpha={alpha}), "
                "which moe has no activation for"
            )
        return act, {}
    if act == "swigluoai":
        given = {"swiglu_alpha": alpha, "swiglu_limit": limit}
        if any(v is not None and float(v) != _SWIGLUOAI[k] for k, v in given.items()) or beta not in (None, 1.0):
            raise Unservable(
                f"its swigluoai parameters (alpha={alpha}, limit={limit}, beta={beta}) are not gpt-oss's "
                "(1.702, 7.0), the only ones moe has"
            )
        return "swiglu_oai", dict(_SWIGLUOAI)
    raise Unservable(f"its activation {act!r} is not one of moe's (silu, gelu, gpt-oss swigluoai)")


def layer_shape(layer) -> LayerShape:
    """The ``MoeConfig`` of a vLLM ``RoutedExperts`` whose weights are created (not necessarily loaded)."""
    moe = layer.moe_config
    dtype = layer.params_dtype
    if dtype not in _FLOAT_SCHEMES:
        raise Unservable(f"its unquantized weights are {dtype}, not a float dtype moe has a scheme for")
    activation, params = _activation(layer)
    h, i = moe.hidden_dim, moe.intermediate_size_per_partition
    padded = (moe.hidden_dim_unpadded, moe.intermediate_size_per_partition_unpadded)
    if padded != (h, i):
        raise Unservable(
            f"vLLM padded its sizes for its own kernel (H={padded[0]}->{h}, I={padded[1]}->{i}), "
            "and the padding is not part of the checkpoint"
        )
    if layer.apply_router_weight_on_input and layer.top_k != 1:
        raise Unservable(f"it applies the router weight on the input with top_k={layer.top_k} (moe needs top_k=1)")
    config = MoeConfig(
        num_experts=layer.local_num_experts,
        top_k=layer.top_k,
        hidden_size=h,
        intermediate_size=i,
        quant_scheme=_FLOAT_SCHEMES[dtype],
        activation=activation,
        dtype=dtype,
        has_bias=bool(moe.has_bias),
        apply_router_weight_on_input=bool(layer.apply_router_weight_on_input),
        **params,
    )
    return LayerShape(config, interleaved=activation == "swiglu_oai")


def _rows13(t: torch.Tensor, shape: LayerShape) -> torch.Tensor:
    """w13-like rows (weights, biases; dim 1) in canonical ``[gate; up]`` order."""
    return deinterleave_gate_up(t) if shape.interleaved else t


def canonical_weights(layer, shape: LayerShape) -> MoeWeights:
    """The layer's loaded weights in moe's canonical layout (copies where the order changes, else the tensors)."""
    w13 = _rows13(layer.w13_weight.data, shape).contiguous()
    w2 = layer.w2_weight.data.contiguous()
    biases = {}
    if shape.config.has_bias:
        biases = {
            "b13": _rows13(layer.w13_bias.data, shape).contiguous(),
            "b2": layer.w2_bias.data.contiguous(),
        }
    return MoeWeights(w13=w13, w2=w2, **biases)
