"""The ``triton`` runner backend: declared capabilities, support check, binding.

Importing this module does not import triton (the plugin entry point must stay
cheap); kernels load when a runner binds (``__init__``). On a CPU the backend
runs only under Triton's interpreter (``TRITON_INTERPRET=1``), slowly, for
tests: there numpy has no bfloat16, so bf16 is refused with that reason.
"""

from __future__ import annotations

import torch

from moe_core import FusedOp, MoeWeights, Support
from moe_core.requirements import env_flag, require_distribution

TRITON_SPEC = ">=3.3"


def interpreter_enabled() -> bool:
    return env_flag("TRITON_INTERPRET")


class TritonFusedOp(FusedOp):
    name = "triton"
    a2a_backends = ("none",)
    priority = 50
    quant_schemes = frozenset({"fp32", "bf16", "fp16", "fp8_block", "mxfp4"})
    activations = frozenset({"silu", "gelu", "swiglu_oai"})
    activation_dtypes = frozenset({torch.bfloat16, torch.float16, torch.float32})
    device_types = frozenset({"cuda", "cpu"})
    supports_bias = True
    supports_router_weight_on_input = True
    handles_invalid_ids = True  # align puts ids outside [0, E) in a null segment: no weight read, zero output

    @classmethod
    def _device_present(cls) -> Support:
        if torch.cuda.is_available():
            return Support.yes()
        if interpreter_enabled():
            return Support.yes()
        return Support.no(
            "no CUDA device is available (set TRITON_INTERPRET=1 to run on the CPU with Triton's "
            "interpreter: slow, fp32/fp16 only, for tests)"
        )

    @classmethod
    def probe(cls, problem) -> Support:
        found = require_distribution("triton", TRITON_SPEC, why="the triton backend's kernels")
        if not found:
            return found
        if problem is None:
            return Support.yes()
        cfg, device = problem.config, problem.device
        if device.type == "cpu":
            if not interpreter_enabled():
                return Support.no("CPU tensors need TRITON_INTERPRET=1 (Triton's interpreter; slow, for tests)")
            if cfg.dtype == torch.bfloat16:
                return Support.no(
                    "the Triton CPU interpreter cannot run bf16 tl.dot (numpy has no bfloat16); "
                    "use fp16/fp32 on the CPU, bf16 on CUDA"
                )
            if cfg.quant_scheme == "fp8_block":
                return Support.no(
                    "the Triton CPU interpreter's fp8 tl.dot is inexact (about 5% relative error on a 16x16 "
                    "product, measured with triton 3.9); fp8_block runs on CUDA (SM89+)"
                )
        if device.type == "cuda":
            major, minor = torch.cuda.get_device_capability(device)
            if (major, minor) < (8, 0):
                return Support.no(f"compute capability SM{major}{minor} is too old (needs SM80+)")
            if cfg.quant_scheme == "fp8_block" and (major, minor) < (8, 9):
                return Support.no(f"fp8_block needs fp8 tensor cores (SM89+), this GPU is SM{major}{minor}")
        return Support.yes()

    def __init__(self, problem) -> None:
        super().__init__(problem)
        from moe_triton import launch  # imports triton and compiles nothing yet

        self._compiled_op, self._eager_op = launch.fused_moe, launch.fused_moe_flat

    def prepare(self, weights: MoeWeights):  # -> moe_triton.layout.TritonWeights
        """Contiguous copies; MXFP4 is re-laid out for the kernels once here (``moe_triton.layout``)."""
        from moe_triton.layout import prepare_weights

        return prepare_weights(self.config.quant_scheme, weights)

    def apply(self, hidden_states, topk_ids, topk_weights, prepared, out=None):
        cfg = self.config
        if out is None:
            out = torch.empty(hidden_states.shape[0], cfg.hidden_size, dtype=cfg.dtype, device=hidden_states.device)
        (self._compiled_op if torch.compiler.is_compiling() else self._eager_op)(
            hidden_states, topk_ids, topk_weights, prepared.w13, prepared.w2, prepared.w13_scale,
            prepared.w2_scale, prepared.b13, prepared.b2, out, cfg.quant_scheme, cfg.activation,
            cfg.swiglu_alpha, cfg.swiglu_limit, cfg.apply_router_weight_on_input, prepared.w13_mult, prepared.w2_mult,
        )  # fmt: skip
        return out

    def router(self, routing):
        """One kernel for ``SoftmaxTopK`` (the softmax families: Mixtral, Qwen, OLMoE, gpt-oss, ...),
        ``GroupedTopK`` (DeepSeek and its clones, Mistral 4, the one-group sigmoid routers) or ``SigmoidTop1``
        (Llama 4) with at most ``router.MAX_EXPERTS`` experts, unless the ``fused_router`` switch is off;
        ``None`` otherwise, and for a grouping torch would refuse (its torch ops then raise the error)."""
        from moe_core.routing import GroupedTopK, SigmoidTop1, SoftmaxTopK
        from moe_triton.switches import current_switches

        if type(routing) not in (SoftmaxTopK, GroupedTopK, SigmoidTop1) or not current_switches().fused_router:
            return None
        from moe_triton.router import MAX_EXPERTS, GroupedTopKRouter, SoftmaxTopKRouter

        e = self.config.num_experts
        if e > MAX_EXPERTS:
            return None
        if type(routing) is SoftmaxTopK:
            return SoftmaxTopKRouter(routing.top_k, routing.renormalize)
        if type(routing) is SigmoidTop1:
            return SoftmaxTopKRouter(1, True, sigmoid_weight=True)
        return None if routing.problem(e) else GroupedTopKRouter(routing)

    def gated_router(self, routing):
        """``router(routing)``'s softmax top-k (or ``SigmoidTop1``) with the gate GEMM in the same kernel, for at
        most ``router.MAX_GATE_EXPERTS`` experts, unless the ``fused_gate`` switch is off; ``None`` otherwise
        (grouped top-k: DeepSeek's gate computes float32 logits)."""
        from moe_core.routing import SigmoidTop1, SoftmaxTopK
        from moe_triton.switches import current_switches

        sw = current_switches()
        if type(routing) not in (SoftmaxTopK, SigmoidTop1) or not (sw.fused_router and sw.fused_gate):
            return None
        from moe_triton.router import MAX_GATE_EXPERTS, GatedSoftmaxTopKRouter

        if self.config.num_experts > MAX_GATE_EXPERTS:
            return None
        if type(routing) is SigmoidTop1:
            return GatedSoftmaxTopKRouter(1, True, sigmoid_weight=True)
        return GatedSoftmaxTopKRouter(routing.top_k, routing.renormalize)

    @classmethod
    def tune(cls, presets, scheme, tokens, output=None, device="cuda"):
        """``moe tune triton``: time candidate tiles on this GPU and merge them into the user's table of this
        device (``output`` elsewhere); returns the path written (see ``moe_triton.tune``)."""
        from moe_triton.tune import tune_presets

        return tune_presets(presets, scheme, tokens, output, device)
