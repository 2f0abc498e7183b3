"""The canonical weights of a MoE layer, and the checks that they match a config.

Canonical form (DESIGN.md): ``w13`` ``[E, 2I, H]`` with rows ``[gate; up]``,
``w2`` ``[E, H, I]``, biases ``b13`` ``[E, 2I]`` and ``b2`` ``[E, H]``.
Quantized schemes keep the logical shapes; packed fp4 halves the last dim and
scales follow ``SchemeSpec.scale_shape``. Backends convert to their own layout
in ``FusedOp.prepare``; nothing else in the system sees a backend layout.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from moe_core.config import MoeConfig
from moe_core.errors import InvalidInputError


@dataclass
class MoeWeights:
    w13: torch.Tensor
    w2: torch.Tensor
    b13: torch.Tensor | None = None
    b2: torch.Tensor | None = None
    #: block scales of w13 / w2 (quantized schemes)
    w13_scale: torch.Tensor | None = None
    w2_scale: torch.Tensor | None = None
    #: nvfp4: fp32 dequantization multiplier per expert, shape [E]
    #: (value = e2m1 * e4m3_scale * global_scale, the ModelOpt ``weight_scale_2``)
    w13_global_scale: torch.Tensor | None = None
    w2_global_scale: torch.Tensor | None = None

    def tensors(self) -> dict[str, torch.Tensor]:
        """The non-None tensors by field name."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}

    @property
    def device(self) -> torch.device:
        return self.w13.device

    def to(self, device) -> MoeWeights:
        return MoeWeights(**{k: v.to(device) for k, v in self.tensors().items()})


def _expect(name: str, tensor, shape: tuple[int, ...], dtype: torch.dtype, device) -> None:
    if not isinstance(tensor, torch.Tensor):
        raise InvalidInputError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
    if tuple(tensor.shape) != tuple(shape):
        raise InvalidInputError(f"{name} has shape {tuple(tensor.shape)}, expected {tuple(shape)}")
    if tensor.dtype != dtype:
        raise InvalidInputError(f"{name} has dtype {tensor.dtype}, expected {dtype}")
    if tensor.device != device:
        raise InvalidInputError(
            f"{name} is on {tensor.device} but w13 is on {device}; all weights must share one device"
        )


def validate_weights(config: MoeConfig, weights: MoeWeights) -> torch.device:
    """Check every weight against the config; return the device they live on.

    Raises ``InvalidInputError`` naming the first tensor that is wrong, with the
    shape/dtype it should have had.
    """
    if not isinstance(weights, MoeWeights):
        raise InvalidInputError(f"weights must be a MoeWeights, got {type(weights).__name__}")
    spec = config.scheme
    e, h, i = config.num_experts, config.hidden_size, config.intermediate_size
    if not isinstance(weights.w13, torch.Tensor):
        raise InvalidInputError(f"w13 must be a torch.Tensor, got {type(weights.w13).__name__}")
    device = weights.w13.device
    _expect("w13", weights.w13, (e, *spec.storage_shape(2 * i, h)), spec.storage_dtype, device)
    _expect("w2", weights.w2, (e, *spec.storage_shape(h, i)), spec.storage_dtype, device)

    bias_dtype = config.dtype if spec.quantized else spec.storage_dtype
    for name, shape in (("b13", (e, 2 * i)), ("b2", (e, h))):
        bias = getattr(weights, name)
        if config.has_bias:
            if bias is None:
                raise InvalidInputError(f"config.has_bias is set but {name} is missing")
            _expect(name, bias, shape, bias_dtype, device)
        elif bias is not None:
            raise InvalidInputError(f"{name} given but config.has_bias is False")

    for w, n, k in (("w13", 2 * i, h), ("w2", h, i)):
        scale, global_scale = getattr(weights, f"{w}_scale"), getattr(weights, f"{w}_global_scale")
        if spec.quantized:
            if scale is None:
                raise InvalidInputError(f"scheme {spec.name!r} needs {w}_scale")
            _expect(f"{w}_scale", scale, (e, *spec.scale_shape(n, k)), spec.scale_dtype, device)
        elif scale is not None:
            raise InvalidInputError(f"{w}_scale given but scheme {spec.name!r} is unquantized")
        if spec.global_scale:
            if global_scale is None:
                raise InvalidInputError(f"scheme {spec.name!r} needs {w}_global_scale")
            _expect(f"{w}_global_scale", global_scale, (e,), torch.float32, device)
        elif global_scale is not None:
            raise InvalidInputError(f"{w}_global_scale given but scheme {spec.name!r} has none")
    return device
