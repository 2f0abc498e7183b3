"""The quantization schemes of the canonical weight contract (DESIGN.md).

One table says, for every scheme, how the canonical ``w13`` ``[E, 2I, H]`` and
``w2`` ``[E, H, I]`` are stored: element dtype, how many logical elements share
a byte, and the shape and dtype of the scales. Validation, quantization helpers
and backends all read this table instead of repeating the facts.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from moe_core.dtypes import float_dtypes


@dataclass(frozen=True)
class SchemeSpec:
    """How one quantization scheme stores a logical ``[..., N, K]`` weight."""

    name: str
    storage_dtype: torch.dtype
    #: logical elements per stored element along K (2 for packed fp4)
    pack: int = 1
    #: dtype of the block scales, None when unquantized
    scale_dtype: torch.dtype | None = None
    #: scale block as (rows along N, columns along K), None when unquantized
    scale_block: tuple[int, int] | None = None
    #: one fp32 dequantization multiplier per expert and weight (nvfp4)
    global_scale: bool = False
    #: activation dtype an unquantized scheme computes in (None: any float dtype)
    fixed_activation_dtype: torch.dtype | None = None

    @property
    def quantized(self) -> bool:
        return self.scale_block is not None

    def storage_shape(self, n: int, k: int) -> tuple[int, int]:
        return (n, k // self.pack)

    def scale_shape(self, n: int, k: int) -> tuple[int, int] | None:
        if self.scale_block is None:
            return None
        bn, bk = self.scale_block
        return (-(-n // bn), -(-k // bk))


SCHEMES: dict[str, SchemeSpec] = {
    s.name: s
    for s in (
        *(SchemeSpec(name, dtype, fixed_activation_dtype=dtype) for name, dtype in float_dtypes().items()),
        # E2M1 pairs in a byte (low nibble = even index), UE8M0 scale per 32 along K.
        SchemeSpec("mxfp4", torch.uint8, pack=2, scale_dtype=torch.uint8, scale_block=(1, 32)),
        # E2M1 pairs in a byte, E4M3 scale per 16 along K, fp32 global scale per expert.
        SchemeSpec(
            "nvfp4",
            torch.uint8,
            pack=2,
            scale_dtype=torch.float8_e4m3fn,
            scale_block=(1, 16),
            global_scale=True,
        ),
        # float8_e4m3fn weights, fp32 scale per 128x128 block.
        SchemeSpec("fp8_block", torch.float8_e4m3fn, scale_dtype=torch.float32, scale_block=(128, 128)),
    )
}

#: Activation dtypes a quantized scheme may be driven with.
ACTIVATION_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def scheme_spec(name: str) -> SchemeSpec:
    try:
        return SCHEMES[name]
    except KeyError:
        from moe_core.errors import InvalidInputError

        raise InvalidInputError(f"unknown quant scheme {name!r}; known schemes: {', '.join(SCHEMES)}") from None
