"""``CutlassFp4FusedOp``: the ``("none", "cutlass_fp4")`` fused op (NVFP4 W4A4, FlashInfer CUTLASS)."""

from __future__ import annotations

from typing import ClassVar

import torch

from moe_core.config import MoeProblem
from moe_core.errors import BackendUnavailableError
from moe_core.fused_op import FusedOp, Support
from moe_core.weights import MoeWeights
from moe_cutlass_fp4 import devices, kernel, requirements


class CutlassFp4FusedOp(FusedOp):
    """NVFP4 weights and activations through ``flashinfer.fused_moe.cutlass_fused_moe``."""

    name = "cutlass_fp4"
    a2a_backends = ("none",)
    priority = 100
    quant_schemes: ClassVar[frozenset[str]] = frozenset({"nvfp4"})
    activations: ClassVar[frozenset[str]] = frozenset({"silu", "swiglu_oai"})
    #: the kernel quantizes bf16/fp16 input itself; output and biases share that dtype
    activation_dtypes = frozenset({torch.bfloat16, torch.float16})
    device_types = frozenset({"cuda"})
    compute_capabilities = None  # decided in probe, with the reason (Hopper gets its own)
    supports_bias = True
    #: CUTLASS NVFP4: N of each GEMM 128-aligned (MinNDimAlignmentNVFP4), scales swizzled in 128-row tiles
    size_alignment = 128

    @classmethod
    def probe(cls, problem: MoeProblem | None) -> Support:
        if problem is None:
            caps = {tuple(torch.cuda.get_device_capability(i)) for i in range(torch.cuda.device_count())}
            reasons = [devices.reason(c) for c in sorted(caps)]
            if caps and all(reasons):
                return Support.no("; ".join(reasons))
        else:
            why = devices.reason(devices.device_capability(problem.device))
            if why:
                return Support.no(why)
        return requirements.check()

    def __init__(self, problem: MoeProblem) -> None:
        super().__init__(problem)
        support = type(self).check(problem)
        if not support:
            raise BackendUnavailableError(f"cutlass_fp4 cannot run this problem: {support.reason}")
        self.fc2_input_scale, _ = requirements.fc2_input_scale()
        self._fi = kernel.load()
        self._kernel = self._fi.cutlass_fused_moe

    def prepare(self, weights: MoeWeights) -> kernel.Prepared:
        return kernel.prepare(self.config, weights, self.fc2_input_scale)

    def apply(self, hidden_states, topk_ids, topk_weights, prepared, out=None):
        m = hidden_states.shape[0]
        if out is None:
            out = torch.empty(m, self.config.hidden_size, dtype=self.config.dtype, device=hidden_states.device)
        if m == 0:
            return out
        kwargs = kernel.call_kwargs(
            self._fi,
            self.config,
            prepared,
            hidden_states.contiguous(),
            topk_ids.contiguous(),
            topk_weights.contiguous(),
            out,
        )
        result = self._kernel(**kwargs)
        first = result if isinstance(result, torch.Tensor) else (result[0] if result else None)
        if isinstance(first, torch.Tensor) and first.data_ptr() != out.data_ptr():
            out.copy_(first)
        return out

    @classmethod
    def warmup(cls, progress=None) -> Support:
        """Build FlashInfer's CUTLASS fused-MoE JIT module for every supported device here."""
        say = progress or (lambda message: None)
        here = cls._device_present()
        if not here:
            return here
        software = requirements.check_flashinfer()
        if not software:
            return software
        caps = sorted({tuple(torch.cuda.get_device_capability(i)) for i in range(torch.cuda.device_count())})
        wanted = {devices.MODULES[c] for c in caps if c in devices.MODULES}
        if not wanted:
            return Support.no("; ".join(devices.reason(c) for c in caps))
        say("importing flashinfer (a few seconds)")
        fi = kernel.load()
        done = []
        for name in sorted(wanted):
            spec = fi.modules[name]()
            units = len(getattr(spec, "sources", ())) or "?"
            say(
                f"{spec.name}: building {units} compile units with nvcc unless built or prebuilt (can take an hour; "
                f"flashinfer-jit-cache=={fi.version.public} for your CUDA ships it prebuilt)"
            )
            spec.build_and_load()
            done.append(f"{spec.name} ready")
        return Support(True, "; ".join(done))
