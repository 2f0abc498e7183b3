"""One scenario in a fresh interpreter (the tests run ``python scenario.py NAME [ARG]`` and read its JSON line).

- ``seed ORDER``: the seed scenario — ``--moe-runner-backend moe:flashinfer_mxfp4``, pure TP, a gpt-oss MXFP4
  layer built on this CPU, with moe-flashinfer-mxfp4 installed; ORDER says what is imported before SGLang
  loads its plugins. Prints the exception the layer raised.
- ``stock-seed``: the same layer under SGLang's own ``--moe-runner-backend flashinfer_mxfp4`` (the "before").
- ``stock``: SGLang as it is with or without moe-sglang loaded (``SGLANG_PLUGINS`` decides): the runner-backend
  choices, whether the quantization methods are wrapped, and an unquantized layer's forward.
"""

from __future__ import annotations

import json
import sys

import sgl_setup
import torch


def _mxfp4_layer():
    from sglang.srt.layers.quantization.mxfp4 import Mxfp4Config

    return sgl_setup.fused_moe(
        4,
        64,
        64,
        2,
        torch.bfloat16,
        quant_config=Mxfp4Config(is_checkpoint_mxfp4_serialized=True),
        with_bias=True,
        gemm1_alpha=1.702,
        gemm1_clamp_limit=7.0,
    )


def _raised(build) -> dict:
    try:
        build()
    except Exception as exc:  # the scenario reports whatever was raised
        return {"type": type(exc).__name__, "module": type(exc).__module__, "message": str(exc)}
    return {"type": None}


def seed(order: str) -> dict:
    if order == "moe-first":
        import moe_core
        import moe_flashinfer_mxfp4.fused_op  # noqa: F401

        moe_core.default_registry().entries()
    elif order == "sglang-first":
        import sglang.srt.layers.moe.fused_moe_triton.layer
        import sglang.srt.layers.quantization.mxfp4  # noqa: F401
    sgl_setup.load_plugins()
    from sglang.srt.server_args import prepare_server_args

    args = prepare_server_args(["--model-path", "dummy", "--moe-runner-backend", "moe:flashinfer_mxfp4"])
    sgl_setup.publish(args.moe_runner_backend, port=29621)
    return {"parsed": args.moe_runner_backend, "raised": _raised(_mxfp4_layer)}


def stock_seed() -> dict:
    sgl_setup.load_plugins()
    sgl_setup.publish("flashinfer_mxfp4", port=29622)
    return {"raised": _raised(_mxfp4_layer)}


def stock() -> dict:
    sgl_setup.load_plugins()
    from sglang.srt.arg_groups.choices import MOE_RUNNER_BACKEND_CHOICES
    from sglang.srt.layers.moe.fused_moe_native import moe_forward_native
    from sglang.srt.layers.quantization.unquant import UnquantizedFusedMoEMethod

    sgl_setup.publish("auto", port=29623)
    layer = sgl_setup.fused_moe(4, 32, 64, 2, torch.float32)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        layer.w13_weight.copy_(torch.randn(layer.w13_weight.shape, generator=g))
        layer.w2_weight.copy_(torch.randn(layer.w2_weight.shape, generator=g))
    layer.quant_method.process_weights_after_loading(layer)
    x, topk = torch.randn(5, 32, generator=g), sgl_setup.routing(5, 4, 2)
    out = layer(x, topk)
    ref = moe_forward_native(layer, x, topk, layer.moe_runner_config)
    return {
        "choices": list(MOE_RUNNER_BACKEND_CHOICES),
        "wrapped": hasattr(UnquantizedFusedMoEMethod.apply, "__wrapped__"),
        "runner_backend": layer.runner_backend.value,
        "forward_equal": bool(torch.equal(out, ref)),
        "out": out.flatten()[:8].tolist(),
    }


if __name__ == "__main__":
    name, *rest = sys.argv[1:]
    result = {"seed": seed, "stock-seed": stock_seed, "stock": stock}[name](*rest)
    print("RESULT " + json.dumps(result))
