"""How close a backend must come to the reference, per quant scheme — one table.

The metric is the relative L2 error ``||out - ref|| / ||ref||`` against the
float64 oracle (``moe_core.reference``) computed from the *dequantized*
weights, so weight quantization itself costs nothing; what is left is the
backend's own arithmetic: rounding of the activation dtype (hidden states,
the intermediate activation and the output are each rounded once), and for
schemes that quantize activations, that quantization.

- ``fp32``: 1e-4. Exact float32 is ~1e-7; 1e-4 leaves room for TF32-class
  tensor-core products (10-bit mantissa, ~3e-4 worst element, far less in L2)
  only if a backend declares fp32 and uses them — those should use IEEE.
- ``fp16``: 5e-3. Half an ulp is 2^-11 ~ 4.9e-4 per rounding; three roundings
  and accumulation stay well under 5e-3.
- ``bf16``: 1.5e-2. Half an ulp is 2^-8 ~ 3.9e-3 per rounding; three roundings
  give ~7e-3 in L2. FlashInfer's own tests use 1e-2 (elementwise rtol/atol).
- ``mxfp4`` / ``fp8_block`` / ``nvfp4``: the dequantized weights are exact
  in bf16, so with bf16 activations the same 1.5e-2 holds for weight-only
  paths. Schemes that quantize activations (fp8_block per token-group fp8:
  e4m3 has a 3-bit mantissa, 2^-4 half-ulp ~ 6% worst element, ~2-3% in L2
  over both GEMMs; nvfp4 W4A4: e2m1 has a 1-bit mantissa) are compared with a
  reference that applies the same activation quantization, so only rounding
  ties and accumulation order differ: 3e-2 (fp8) and 1e-1 (fp4, FlashInfer's
  figure for fp4 paths).
"""

from __future__ import annotations

import torch

from moe_core.dtypes import FLOAT_DTYPE_NAMES, short_name
from moe_core.quant.act_quant import activation_fake_quant

REL_L2: dict[str, float] = {
    "fp32": 1e-4,
    "fp16": 5e-3,
    "bf16": 1.5e-2,
    "fp8_block": 3e-2,
    "nvfp4": 1e-1,
}


def tolerance(scheme: str, dtype: torch.dtype) -> float:
    """Allowed relative L2 error for ``scheme`` driven with activations of ``dtype``.

    Unquantized schemes: their own row. Weight-only schemes (mxfp4): the
    activation dtype's row, since the dequantized weights are exact. Schemes
    that quantize activations: the larger of their row and the dtype's.
    """
    own = REL_L2[short_name(dtype)]
    if scheme in FLOAT_DTYPE_NAMES:
        return REL_L2[scheme]
    # schemes that also quantize the activations have a fake-quant round trip; the rest are weight-only
    return max(own, REL_L2[scheme]) if activation_fake_quant(scheme) is not None else own


def relative_l2(out: torch.Tensor, ref: torch.Tensor) -> float:
    """``||out - ref|| / ||ref||`` in float64 (0 when both are zero)."""
    out64, ref64 = out.detach().to("cpu", torch.float64), ref.detach().to("cpu", torch.float64)
    denom = float(ref64.norm())
    num = float((out64 - ref64).norm())
    if denom == 0.0:
        return 0.0 if num == 0.0 else float("inf")
    return num / denom
