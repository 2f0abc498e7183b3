"""Quantization formats of the canonical weight contract, in plain torch.

One module per format, each working on the LAST dimension as K with any
leading dims, on CPU and CUDA, fully vectorised:

* ``fp4``    E2M1 element encode/decode and two-per-byte packing
* ``mxfp4``  OCP MX FP4 (UE8M0 scale per 32)
* ``nvfp4``  NVFP4 (E4M3 scale per 16, fp32 global scale per expert)
* ``fp8``    DeepSeek-style block FP8 weights and per-token-group activations
* ``weights`` ``MoeWeights`` <-> scheme storage
"""

from __future__ import annotations

from moe_core.quant.codec import dequantize_expert, dequantize_projection, dequantize_weights, quantize_weights
from moe_core.quant.fp4 import e2m1_to_float, float_to_e2m1, pack_fp4, unpack_fp4
from moe_core.quant.fp8 import (
    dequantize_fp8_block,
    dequantize_fp8_per_token_group,
    quantize_fp8_block,
    quantize_fp8_per_token_group,
)
from moe_core.quant.mxfp4 import dequantize_mxfp4, quantize_mxfp4
from moe_core.quant.nvfp4 import dequantize_nvfp4, quantize_nvfp4

__all__ = [
    "dequantize_expert",
    "dequantize_fp8_block",
    "dequantize_fp8_per_token_group",
    "dequantize_mxfp4",
    "dequantize_nvfp4",
    "dequantize_projection",
    "dequantize_weights",
    "e2m1_to_float",
    "float_to_e2m1",
    "pack_fp4",
    "quantize_fp8_block",
    "quantize_fp8_per_token_group",
    "quantize_mxfp4",
    "quantize_nvfp4",
    "quantize_weights",
    "unpack_fp4",
]
