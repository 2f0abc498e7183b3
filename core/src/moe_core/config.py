"""What a MoE layer *is* (``MoeConfig``) and where it runs (``MoeProblem``).

A backend's support check receives a ``MoeProblem`` and nothing else, so this
is the complete list of facts a backend may base its yes/no on.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from moe_core.errors import InvalidInputError
from moe_core.schemes import ACTIVATION_DTYPES, SCHEMES, scheme_spec

#: Activation names; formulas live in ``moe_core.activations``.
ACTIVATIONS = ("silu", "gelu", "swiglu_oai")


@dataclass(frozen=True)
class MoeConfig:
    """Shape and numerics of one MoE layer (routed experts only).

    ``dtype`` is the dtype of ``hidden_states`` and of the output. For the
    unquantized schemes it must equal the weights' dtype; quantized schemes take
    activations in any of bf16/fp16/fp32 (what a backend accepts is its own
    declaration).
    """

    num_experts: int
    top_k: int
    hidden_size: int
    intermediate_size: int
    quant_scheme: str = "bf16"
    activation: str = "silu"
    dtype: torch.dtype = torch.bfloat16
    has_bias: bool = False
    #: Llama 4 style: scale the expert *input* by the router weight, not its output.
    apply_router_weight_on_input: bool = False
    #: swiglu_oai parameters (gpt-oss defaults).
    swiglu_alpha: float = 1.702
    swiglu_limit: float = 7.0
    a2a_backend: str = "none"

    def __post_init__(self) -> None:
        for name in ("num_experts", "top_k", "hidden_size", "intermediate_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise InvalidInputError(f"MoeConfig.{name} must be a positive int, got {value!r}")
        if self.top_k > self.num_experts:
            raise InvalidInputError(f"MoeConfig.top_k={self.top_k} is larger than num_experts={self.num_experts}")
        spec = scheme_spec(self.quant_scheme)
        if self.activation not in ACTIVATIONS:
            raise InvalidInputError(f"unknown activation {self.activation!r}; known: {', '.join(ACTIVATIONS)}")
        if not isinstance(self.dtype, torch.dtype):
            raise InvalidInputError(f"MoeConfig.dtype must be a torch.dtype, got {self.dtype!r}")
        if spec.fixed_activation_dtype is not None and self.dtype != spec.fixed_activation_dtype:
            raise InvalidInputError(
                f"quant scheme {self.quant_scheme!r} computes in {spec.fixed_activation_dtype}, "
                f"but MoeConfig.dtype is {self.dtype}"
            )
        if self.dtype not in ACTIVATION_DTYPES:
            raise InvalidInputError(
                f"MoeConfig.dtype {self.dtype} is not an activation dtype ({', '.join(map(str, ACTIVATION_DTYPES))})"
            )
        if spec.pack > 1:
            for name in ("hidden_size", "intermediate_size"):
                if getattr(self, name) % spec.scale_block[1]:
                    raise InvalidInputError(
                        f"{self.quant_scheme}: {name}={getattr(self, name)} must be a multiple "
                        f"of the scale block {spec.scale_block[1]}"
                    )
        if self.apply_router_weight_on_input and self.top_k != 1:
            raise InvalidInputError(
                "apply_router_weight_on_input needs top_k == 1 (the weight scales the "
                "expert input, which is only well defined for one expert per token)"
            )
        if not self.a2a_backend or not isinstance(self.a2a_backend, str):
            raise InvalidInputError("MoeConfig.a2a_backend must be a non-empty string ('none' for pure TP)")

    @property
    def scheme(self):
        return SCHEMES[self.quant_scheme]


@dataclass(frozen=True)
class MoeProblem:
    """A config placed on a device: the question a backend's support check answers."""

    config: MoeConfig
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    def __post_init__(self) -> None:
        object.__setattr__(self, "device", torch.device(self.device))
