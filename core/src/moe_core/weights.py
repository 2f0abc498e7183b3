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


@dataclass
class SharedExperts:
    """Dense gated MLP(s) every token passes through beside the routed experts (DeepSeek, Qwen2-MoE,
    Llama 4, GraniteMoeShared), added to the routed output.

    Canonical like one expert of ``MoeWeights``: ``w13`` ``[2I_s, H]`` rows ``[gate; up]``, ``w2``
    ``[H, I_s]`` (several shared experts of one block are one MLP of their summed width). ``gate``
    ``[1, H]``, where present, scales the MLP's output by ``sigmoid(x @ gate.T)`` per token (Qwen2-MoE).
    ``activation`` is the MLP's gated activation (``None``: the routed experts'). A dense MLP is a MoE
    of one expert with top-1 routing, so ``moe_core.MoeLayer`` runs it through a backend like the
    routed experts (the gate, if any, is that expert's routing weight).
    """

    w13: torch.Tensor
    w2: torch.Tensor
    gate: torch.Tensor | None = None
    activation: str | None = None

    @property
    def intermediate_size(self) -> int:
        return self.w13.shape[0] // 2

    def validate(self, hidden_size: int) -> None:
        """Shapes and dtypes that fit a layer of ``hidden_size``; raises ``InvalidInputError``."""
        w13, w2 = self.w13, self.w2
        if w13.dim() != 2 or w13.shape[0] % 2 or w13.shape[1] != hidden_size:
            raise InvalidInputError(f"shared experts' w13 has shape {tuple(w13.shape)}, expected [2I, {hidden_size}]")
        _expect("shared experts' w2", w2, (hidden_size, w13.shape[0] // 2), w13.dtype, w13.device)
        if self.gate is not None:
            _expect("shared experts' gate", self.gate, (1, hidden_size), self.gate.dtype, w13.device)
