"""What this machine's software must look like, read without importing flashinfer.

Three facts, each a ``Support`` with the reason when it fails:

* the flashinfer-python version (package metadata): ``SUPPORTED``;
* the GEMM2-input scale, which moe-core's nvfp4 contract cannot supply
  (``fc2_input_scale``; see the README's "Activation scales");
* FlashInfer's process-wide ``FLASHINFER_NVFP4_4OVER6*`` switches, which
  change the activation quantization recipe and cannot be overridden per
  call before flashinfer-python 0.7.4.
"""

from __future__ import annotations

import math
import os

from packaging.version import Version

from moe_core import requirements
from moe_core.fused_op import Support

DISTRIBUTION = "flashinfer-python"
#: checked: the CPU test suite binds every call against 0.7.4, and the signatures of every call this
#: backend makes read the same in the 0.6.18 ... 0.7.2.post1 wheels; 0.8 changes the fused-MoE return types
SUPPORTED = ">=0.6.18,<0.8"
#: first release whose cutlass_fused_moe takes ``nvfp4_4over6`` (None = recipe off, environment ignored)
PER_CALL_4OVER6 = Version("0.7.4")

#: opt-in: the static dequantization scale of the GEMM2 input (moe-core / ModelOpt ``input_scale`` convention)
FC2_SCALE_VAR = "MOE_CUTLASS_FP4_FC2_INPUT_SCALE"
FOUR_OVER_SIX_PREFIX = "FLASHINFER_NVFP4_4OVER6"

_WHY = "for FlashInfer's CUTLASS NVFP4 fused MoE"


def flashinfer_version() -> Version | None:
    return requirements.distribution_version(DISTRIBUTION)


def check_flashinfer() -> Support:
    version = flashinfer_version()
    if version is not None and version >= Version("0.8.dev0"):
        return Support.no(
            f"{DISTRIBUTION} {version} is installed, but 0.8 is untested with this backend (FlashInfer announced "
            f"return-type changes of its fused-MoE entry points for 0.8); this backend supports "
            f"{DISTRIBUTION}{SUPPORTED}: pip install '{DISTRIBUTION}{SUPPORTED}'"
        )
    return requirements.require_distribution(DISTRIBUTION, SUPPORTED, why=_WHY)


def fc2_input_scale() -> tuple[float | None, str]:
    """The opted-in static GEMM2-input scale, or ``(None, reason)``."""
    raw = os.environ.get(FC2_SCALE_VAR, "").strip()
    if not raw:
        return None, (
            "moe-core's nvfp4 contract quantizes the second GEMM's input (the activation output) with a dynamic "
            "global scale from that tensor's amax, which FlashInfer's fused CUTLASS kernel cannot compute (it takes "
            "a static fc2 input scale), so its results would not be the contract's. To accept a static scale "
            f"instead, set {FC2_SCALE_VAR} to the intermediate activation's dequantization scale (amax / 2688, "
            "ModelOpt's w2 input_scale); see the moe-cutlass-fp4 README"
        )
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        return None, f"{FC2_SCALE_VAR}={raw!r} is not a finite positive number"
    return value, ""


def four_over_six_switches() -> list[str]:
    return sorted(k for k, v in os.environ.items() if k.startswith(FOUR_OVER_SIX_PREFIX) and v.strip())


def check_recipe(version: Version | None) -> Support:
    switches = four_over_six_switches()
    if switches and version is not None and version < PER_CALL_4OVER6:
        return Support.no(
            f"{', '.join(switches)} set: FlashInfer's 4over6 NVFP4 recipe differs from moe-core's nvfp4 "
            f"quantization, and {DISTRIBUTION} {version} cannot be told per call to ignore it "
            f"({DISTRIBUTION}>={PER_CALL_4OVER6} can); unset it"
        )
    return Support.yes()


def check() -> Support:
    support = check_flashinfer()
    if not support:
        return support
    scale, reason = fc2_input_scale()
    if scale is None:
        return Support.no(reason)
    return check_recipe(flashinfer_version())
