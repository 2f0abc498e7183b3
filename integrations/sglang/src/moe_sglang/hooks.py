"""The SGLang methods moe-sglang wraps (SGLang's ``HookRegistry``, AROUND hooks), each a thin door into
``binding``; for a runner backend that is not moe-sglang's, every hook calls SGLang's original unchanged.

Per quantization method it serves (unquantized, block fp8, MXFP4):

- ``create_moe_runner``: SGLang picks the method's runner here, and only from its own list (the unquantized
  method picks triton for any name it does not know; fp8 and MXFP4 raise). Planned layers get SGLang's
  ``MoeRunner`` for our registered name instead, which builds our runner core.
- ``process_weights_after_loading``: the moment the loaded weights are still the checkpoint's layout; moe
  binds here and SGLang's re-layout (VNNI packing, swizzles, which no moe backend reads) is skipped.
- ``apply``: on CPU (and XPU, NPU) the methods compute in their own code and never call ``self.runner``
  (``UnquantizedFusedMoEMethod.forward_cpu`` -> ``moe_forward_native``), so a registered runner core alone
  would never run; a bound layer's ``apply`` calls its runner on every device.

And ``FusedMoE.__init__``, to refuse a layer whose quantization method is none of those (``check_constructed``).
"""

from __future__ import annotations

from moe_sglang import binding

_METHODS = {
    "unquant.UnquantizedFusedMoEMethod": "sglang.srt.layers.quantization.unquant.UnquantizedFusedMoEMethod",
    "fp8.Fp8MoEMethod": "sglang.srt.layers.quantization.fp8.Fp8MoEMethod",
    "mxfp4.Mxfp4MoEMethod": "sglang.srt.layers.quantization.mxfp4.Mxfp4MoEMethod",
}
FUSED_MOE = "sglang.srt.layers.moe.fused_moe_triton.layer.FusedMoE"


def create_moe_runner(original, method, layer, moe_runner_config, *args, **kwargs):
    planned = binding.plan(method, layer)
    if planned is None or not planned.served:
        return original(method, layer, moe_runner_config, *args, **kwargs)
    from sglang.srt.layers.moe.moe_runner import MoeRunner
    from sglang.srt.layers.moe.utils import get_moe_runner_backend

    method.moe_runner_config = moe_runner_config
    method.runner = MoeRunner(get_moe_runner_backend(), moe_runner_config)
    planned.core = method.runner.runner_core
    return None


def process_weights_after_loading(original, method, layer, *args, **kwargs):
    planned = getattr(layer, binding.ATTR, None)
    if planned is None or not planned.served:
        return original(method, layer, *args, **kwargs)
    binding.bind(layer, planned)
    return None


def apply(original, method, layer, dispatch_output, *args, **kwargs):
    planned = getattr(layer, binding.ATTR, None)
    if planned is None or not planned.served:
        return original(method, layer, dispatch_output, *args, **kwargs)
    return method.runner.run(dispatch_output, None)


def fused_moe_init(original, layer, *args, **kwargs):
    original(layer, *args, **kwargs)
    binding.check_constructed(layer)


def targets() -> list[tuple[str, object]]:
    """``(dotted target, AROUND hook)`` for every SGLang callable moe-sglang wraps."""
    out = [(f"{FUSED_MOE}.__init__", fused_moe_init)]
    for path in _METHODS.values():
        for hook in (create_moe_runner, process_weights_after_loading, apply):
            out.append((f"{path}.{hook.__name__}", hook))
    return out
