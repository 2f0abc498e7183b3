"""First-party runner backends and the distributions that provide them.

Plain strings, never imports: this is how core can say "pip install
moe-triton" for a backend that is not installed without knowing its code.
"""

from __future__ import annotations

#: runner backend name -> distribution that provides it
FIRST_PARTY: dict[str, str] = {
    "torch": "moe-core",
    "triton": "moe-triton",
    "flashinfer_mxfp4": "moe-flashinfer-mxfp4",
    "cutlass_fp4": "moe-cutlass-fp4",
}

#: the distribution whose own backends are exempt from the MOE_PLUGINS allow-list
CORE_DISTRIBUTION = "moe-core"
