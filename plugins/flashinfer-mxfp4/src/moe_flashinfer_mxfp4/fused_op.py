"""``FlashInferMxfp4FusedOp``: the ``("none", "flashinfer_mxfp4")`` fused op.

``check`` (cheap): core's declared-capability checks, then ``probe`` — the
device's kernel path by compute capability (``devices``) and the installed
flashinfer-python version (``requirements``, metadata only); on the SM90 path,
last, whether the FlashInfer module it would run is built: when its first use
would compile it (minutes to an hour) the answer is ``Support.explicit_only``,
so ``backend="auto"`` passes over it and an explicit ``backend="flashinfer_mxfp4"``
still builds it. Only that last step imports flashinfer (its JIT environment).
Binding (``__init__``) imports flashinfer and verifies, by running the
installed helpers on small CPU probes, that they produce the layouts this
backend prepares; any disagreement refuses the backend.
"""

from __future__ import annotations

import warnings
from typing import ClassVar

import torch

from moe_core.config import MoeProblem
from moe_core.errors import BackendUnavailableError
from moe_core.fused_op import FusedOp, Support
from moe_core.weights import MoeWeights
from moe_flashinfer_mxfp4 import devices, kernel, padding, requirements, sm90_engine


class FlashInferMxfp4FusedOp(FusedOp):
    """MXFP4 weights x bf16 activations through FlashInfer (SM90 CUTLASS / SM100 trtllm-gen)."""

    name = "flashinfer_mxfp4"
    a2a_backends = ("none",)
    #: on SM100 (trtllm-gen's native MXFP4 kernels); SM90 ranks lower, see ``priority_for``
    priority = 100
    #: SM90 runs CUTLASS's mixed-input W4A16 GEMM (weights converted to bf16 in the main loop), which measured
    #: slower than moe-triton's MXFP4 kernels on the H200 at every batch size (results/README.md, 2026-12-02
    #: calls 4 and 7): below the 50 a tuned Triton family declares, so an unmeasured ``auto`` does not prefer it
    sm90_priority = 40
    quant_schemes: ClassVar[frozenset[str]] = frozenset({"mxfp4"})
    activations: ClassVar[frozenset[str]] = frozenset({"silu", "swiglu_oai"})
    #: bf16 only: the SM90 W4A16 kernel rejects fp16 since flashinfer 0.6.18 (interleaved layout)
    activation_dtypes = frozenset({torch.bfloat16})
    device_types = frozenset({"cuda"})
    #: decided per path in ``probe`` so the reason can say which path and why not
    compute_capabilities = None
    supports_bias = True
    #: MX scale groups of 32; the kernels' 128-multiples (scale folds of 64 rows x 128 K on SM90, 128-row tiles on
    #: SM100) are reached by zero padding in ``prepare`` (``padding``: gpt-oss's 2880 runs as 2944)
    size_alignment = 32

    # ---- support (flashinfer imported only by the SM90 build-state step) ----------------------
    @classmethod
    def check(cls, problem: MoeProblem) -> Support:
        support = super().check(problem)
        if not support and support.reason.startswith("device type"):  # say what would work
            here = "a CUDA device is available: put the weights on it" if torch.cuda.is_available() else "none is here"
            return Support.no(f"{support.reason}: FlashInfer's MXFP4 MoE kernels need a CUDA GPU (SM90/SM100); {here}")
        return support

    @classmethod
    def probe(cls, problem: MoeProblem | None) -> Support:
        """The device's kernel path and the flashinfer-python version (metadata); then, for an SM90 problem that
        passed everything else, whether the module it needs is built (``warmup.first_use_support``).

        That last step imports FlashInfer's JIT environment (``import flashinfer``, a few seconds) to find its
        cache and prebuilt modules; it reads files and generates nothing. Acceptable there because only a process
        that has an SM90 GPU, this plugin installed and an MXFP4 problem this backend can run pays it, once (Python
        keeps the module; the bind that follows imports flashinfer anyway). Every cheaper refusal comes first, a
        CPU or SM100 problem never gets there, and ``available()`` (``problem`` None) never does. Nothing about
        "built" is cached, so the plain yes returns as soon as ``moe warmup flashinfer_mxfp4`` has built a module.
        """
        if problem is None:
            paths, reasons = devices.machine_paths()
            if not paths:
                return Support.no("; ".join(reasons) or "no CUDA device is visible")
            return requirements.check()
        path, reason = devices.path_for_device(problem.device)
        if path is None:
            return Support.no(reason)
        support = requirements.check()
        if not support or path != devices.SM90_CUTLASS:
            return support
        from moe_flashinfer_mxfp4.warmup import first_use_support

        return first_use_support()

    @classmethod
    def priority_for(cls, problem: MoeProblem) -> float:
        path, _ = devices.path_for_device(problem.device)
        return cls.sm90_priority if path == devices.SM90_CUTLASS else cls.priority

    @classmethod
    def path(cls, device: torch.device) -> str:
        """The kernel path this op uses on ``device`` (``devices.SM90_CUTLASS`` / ``SM100_TRTLLM``)."""
        path, reason = devices.path_for_device(torch.device(device))
        if path is None:
            raise BackendUnavailableError(f"flashinfer_mxfp4: {reason}")
        return path

    # ---- bind ---------------------------------------------------------------------------------
    def __init__(self, problem: MoeProblem) -> None:
        super().__init__(problem)
        support = type(self).check(problem)
        if not support:
            raise BackendUnavailableError(f"flashinfer_mxfp4 cannot run this problem: {support.reason}")
        self.kernel_path = type(self).path(problem.device)
        self._fi = kernel.load()
        #: the layer at FlashInfer's 128-multiples (``padding``); equal to ``self.config`` when already aligned
        self._padded = padding.padded_config(self.config)
        #: SM90 only: which FlashInfer module runs the kernels (slim W4A16 or full fused_moe_90), and why
        self.sm90_engine: sm90_engine.Engine | None = None
        if self.kernel_path == devices.SM90_CUTLASS:
            self.layout = kernel.verify_sm90_layout(self._fi)
            self.sm90_engine = sm90_engine.choose(self._fi)
            self._cold_build_notice()
        else:
            self.layout = kernel.verify_trtllm_rows(self._fi)

    def _cold_build_notice(self) -> None:
        try:
            from moe_flashinfer_mxfp4.warmup import cold_build_notice

            notice = cold_build_notice(self._fi, self.kernel_path, self.sm90_engine)
        except Exception:  # a notice must never stop a runner
            notice = None
        if notice:
            warnings.warn(notice, RuntimeWarning, stacklevel=3)

    # ---- prepare ------------------------------------------------------------------------------
    def prepare(self, weights: MoeWeights):
        try:
            config = self._padded
            weights = padding.pad_weights(self.config, weights)
            if self.kernel_path == devices.SM90_CUTLASS:
                if self.sm90_engine is not None and self.sm90_engine.kind == sm90_engine.SLIM:
                    if not hasattr(self._fi, "slim_module"):  # build (if needed) and load once per op
                        self._fi = sm90_engine.slim_namespace(self._fi)
                return kernel.prepare_sm90(config, weights, self._fi)
            return kernel.prepare_sm100(config, weights, self._fi)
        except Exception as exc:
            if type(exc).__name__ == "MissingJITCacheError":
                raise BackendUnavailableError(
                    "flashinfer_mxfp4: FLASHINFER_DISABLE_JIT is set and the FlashInfer kernel module this path needs "
                    "is not built or prebuilt; run `moe warmup flashinfer_mxfp4` (or install flashinfer-jit-cache "
                    f"{self._fi.version} for your CUDA) first"
                ) from exc
            raise

    # ---- forward ------------------------------------------------------------------------------
    def apply(self, hidden_states, topk_ids, topk_weights, prepared, out=None):
        m = hidden_states.shape[0]
        if out is None:
            out = torch.empty(m, self.config.hidden_size, dtype=torch.bfloat16, device=hidden_states.device)
        if m == 0:
            return out
        x, ids, w = hidden_states.contiguous(), topk_ids.contiguous(), topk_weights.contiguous()
        hidden_p = self._padded.hidden_size
        target = out
        if hidden_p != self.config.hidden_size:  # padded layer: zero-extended input, output cut back
            x = padding.pad_input(x, hidden_p)
            target = torch.empty(m, hidden_p, dtype=torch.bfloat16, device=x.device)
        if self.kernel_path == devices.SM90_CUTLASS:
            result = self._fi.cutlass_fused_moe(**kernel.sm90_kwargs(self._fi, prepared, x, ids, w, target))
        else:
            kwargs = kernel.sm100_kwargs(self._fi, prepared, self._padded, x, ids, w, target)
            result = self._fi.trtllm_fp4_block_scale_routed_moe(**kwargs)
        _into(target, result)
        if target is not out:
            out.copy_(target[:, : self.config.hidden_size])
        return out

    # ---- moe warmup ---------------------------------------------------------------------------
    @classmethod
    def warmup(cls, progress=None) -> Support:
        from moe_flashinfer_mxfp4.warmup import warmup

        return warmup(cls, progress or (lambda message: None))


def _into(out: torch.Tensor, result) -> None:
    """Both kernels write ``output=out`` in place; copy if a release ever returns a fresh tensor instead."""
    first = result if isinstance(result, torch.Tensor) else (result[0] if result else None)
    if isinstance(first, torch.Tensor) and first.data_ptr() != out.data_ptr():
        out.copy_(first)
