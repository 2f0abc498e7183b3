"""SGLang MoE layers with real shapes on a GPU: SGLang's own runner against ``--moe-runner-backend moe:<backend>``.

Why: the CPU tests (``nox -s sglang``) prove the bridge computes what SGLang computes; an operator also needs to
know what switching costs or gains on their GPU. One process, as a scheduler has it: SGLang's plugins loaded,
then for each runner choice the server arguments published again and a fresh ``FusedMoE`` built on the GPU,
filled with the same weights, ``process_weights_after_loading`` run, and called with the same routing
(``StandardTopKOutput``) at each token count. Per (case, runner, M): eager time (CUDA events around back-to-back
calls: host-bound at decode, as SGLang runs without graphs), CUDA-graph replay time where the layer can be
captured, and the relative L2 error against moe's float64 reference on the canonical weights. A runner that
cannot be built or run here (SGLang's kernels needing ``sgl_kernel``, a backend without its library) is
recorded with its error, and the rest go on.

    python integrations/sglang/tools/gpu_bench.py --json OUT.json [--cases qwen3-bf16,gpt-oss-mxfp4]
        [--tokens 1,64,2048] [--runners triton,moe:triton] [--repeat 20]
    python integrations/sglang/tools/gpu_bench.py --smoke --json OUT.json   # toy shapes on the CPU: the script's
                                                                            # own check (SGLang's native path)

Run by ``bash tools/gpu.sh sglang``; the results are recorded under ``results/``.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
import traceback
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))  # sgl_setup: building SGLang layers as SGLang's layer tests do

#: case -> (moe preset, scheme, the runner choices timed; SGLang's own first)
CASES = {
    "qwen3-bf16": ("qwen3-30b-a3b", "bf16", ("triton", "moe:triton", "moe")),
    "gpt-oss-mxfp4": ("gpt-oss-120b", "mxfp4", ("auto", "moe:triton", "moe:flashinfer_mxfp4", "moe")),
}


def _config(preset: str, scheme: str, smoke: bool):
    from moe_core.config import MoeConfig
    from moe_core.presets import PRESETS

    p = PRESETS[preset]
    return MoeConfig(
        8 if smoke else p.num_experts,
        2 if smoke else p.top_k,
        128 if smoke else p.hidden_size,
        64 if smoke else p.intermediate_size,
        quant_scheme=scheme,
        activation=p.activation,
        has_bias=p.has_bias,
        dtype=torch.bfloat16,
    )


def _sglang_tensors(cfg, w) -> dict[str, torch.Tensor]:
    """The canonical weights in SGLang's checkpoint layout for the scheme (gpt-oss MXFP4: interleaved gate/up)."""
    if cfg.quant_scheme == "bf16":
        return {"w13_weight": w.w13, "w2_weight": w.w2}
    i = cfg.intermediate_size
    order = torch.stack([torch.arange(i), torch.arange(i) + i], dim=1).reshape(-1).to(w.w13.device)
    return {
        "w13_weight": w.w13[:, order],
        "w13_weight_scale": w.w13_scale[:, order],
        "w2_weight": w.w2,
        "w2_weight_scale": w.w2_scale,
        "w13_weight_bias": w.b13[:, order],
        "w2_weight_bias": w.b2,
    }


def _fill(layer, tensors: dict[str, torch.Tensor]) -> list[str]:
    """Copy each tensor into the layer's parameter; a larger (padded) parameter gets it in its leading corner
    and zeros elsewhere, as SGLang's loader leaves padding. Returns the names that were padded."""
    padded = []
    with torch.no_grad():
        for name, value in tensors.items():
            param = getattr(layer, name)
            if tuple(param.shape) == tuple(value.shape):
                param.data.copy_(value)
                continue
            if param.dim() != value.dim() or any(p < v for p, v in zip(param.shape, value.shape)):
                raise ValueError(f"{name}: layer holds {tuple(param.shape)}, weights are {tuple(value.shape)}")
            param.data.zero_()
            param.data[tuple(slice(0, n) for n in value.shape)].copy_(value)
            padded.append(f"{name} {tuple(value.shape)} -> {tuple(param.shape)}")
    return padded


def _layer(cfg, runner: str, layer_id: int, device: torch.device):
    import sgl_setup

    sgl_setup.use_runner_backend(runner)
    kwargs = {}
    if cfg.quant_scheme == "mxfp4":
        from sglang.srt.layers.quantization.mxfp4 import Mxfp4Config

        kwargs = dict(
            quant_config=Mxfp4Config(is_checkpoint_mxfp4_serialized=True),
            with_bias=True,
            gemm1_alpha=1.702,
            gemm1_clamp_limit=7.0,
        )
    with device:
        return sgl_setup.fused_moe(
            cfg.num_experts, cfg.hidden_size, cfg.intermediate_size, cfg.top_k, cfg.dtype, layer_id, **kwargs
        )


def _routing(m: int, e: int, k: int, seed: int, device: torch.device):
    from sglang.srt.layers.moe.topk import StandardTopKOutput

    g = torch.Generator(device=device).manual_seed(seed)
    logits = torch.randn(m, e, generator=g, device=device)
    weights, ids = torch.topk(logits.softmax(-1), k)
    return StandardTopKOutput(weights.float(), ids.to(torch.int32), logits)


class _Missing:
    """A name of the ``sgl_kernel`` stand-in: its attributes are stand-ins too (module-level constants such as
    ``scalar_types.uint4b8`` resolve), calling it raises."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Missing(f"{self._name}.{attr}")

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"{self._name} is the --stub-sgl-kernel stand-in: SGLang called it")


class _StandIn:
    """``--stub-sgl-kernel``: every ``sgl_kernel`` module imports and every name in it resolves, but calling one
    raises. SGLang 0.5.23 imports ``sgl_kernel`` at module level on CUDA (its quantization package) even where a
    layer never calls it; with the stand-in, what a layer really calls fails loudly and is recorded, and what it
    does not call no longer blocks the import. A measurement aid, never a way to run SGLang."""

    def find_spec(self, name, path=None, target=None):
        import importlib.machinery

        if name == "sgl_kernel" or name.startswith("sgl_kernel."):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        import types

        module = types.ModuleType(spec.name)
        module.__path__ = []

        def missing(attr: str):
            if attr.startswith("__"):
                raise AttributeError(attr)
            return _Missing(f"{spec.name}.{attr}")

        module.__getattr__ = missing
        return module

    def exec_module(self, module) -> None:
        pass


def _error(exc: BaseException) -> dict:
    return {"error": f"{type(exc).__name__}: {exc}"[:2000], "traceback": traceback.format_exc()[-3000:]}


def run_case(name: str, tokens: list[int], runners: list[str] | None, repeat: int, smoke: bool) -> dict:
    from moe_core.reference import reference_for
    from moe_core.synthetic import random_weights
    from moe_core.timing import time_forward
    from moe_core.tolerances import relative_l2, tolerance
    from moe_sglang.binding import ATTR

    preset, scheme, default_runners = CASES[name]
    device = torch.device("cpu" if smoke else "cuda")
    cfg = _config(preset, scheme, smoke)
    w = random_weights(cfg, device, seed=0)
    tensors = _sglang_tensors(cfg, w)
    inputs = {}
    for m in tokens:
        x = torch.randn(m, cfg.hidden_size, device=device, generator=torch.Generator(device).manual_seed(m))
        x = x.to(cfg.dtype)
        topk = _routing(m, cfg.num_experts, cfg.top_k, m + 1, device)
        ref = reference_for(cfg, w, x, topk.topk_ids.long(), topk.topk_weights)
        inputs[m] = (x, topk, ref)
    limit = tolerance(scheme, cfg.dtype)
    rows = []
    for n, runner in enumerate(runners or default_runners):
        row = {"runner": runner, "by_tokens": {}}
        rows.append(row)
        print(f"--- {name}: --moe-runner-backend {runner}", flush=True)
        t0 = time.perf_counter()
        try:
            layer = _layer(cfg, runner, n, device)
            row["padded"] = _fill(layer, tensors)
            layer.quant_method.process_weights_after_loading(layer)
            row["bind_s"] = round(time.perf_counter() - t0, 2)
            binding = getattr(layer, ATTR, None)
            bound = getattr(binding, "runner", None)
            row["bound"] = None if bound is None else f"{bound.backend} ({bound.distribution})"
            if bound is not None:  # where a wrong output would come from: the weights moe read, the scale
                from moe_sglang import convert

                seen = convert.canonical_weights(layer, binding.shape)
                row["weights_match"] = all(
                    torch.equal(getattr(seen, f), getattr(w, f)) for f in ("w13", "w2") if getattr(w, f) is not None
                )
                row["output_scale"] = binding.core.output_scale
            print(f"    bound: {row['bound'] or 'SGLang own path'}; padded: {row['padded'] or 'nothing'}", flush=True)
        except Exception as exc:  # recorded: the next runner still runs
            row.update(_error(exc))
            print(f"    not built: {row['error'][:300]}", flush=True)
            continue
        for m in tokens:
            # SGLang's own triton runner writes its output into the hidden states it is given (inplace fused
            # experts): every call gets its own copy, or one runner's output becomes the next one's input
            x, topk, ref = inputs[m]
            x_timed = x.clone()
            cell = {}
            row["by_tokens"][m] = cell
            try:
                with torch.no_grad():
                    out = layer(x.clone(), topk)
                    if device.type == "cuda":
                        torch.cuda.synchronize()
                    cell["rel_l2"] = float(relative_l2(out, ref))
                    cell["within_tolerance"] = cell["rel_l2"] <= limit
                    call = functools.partial(layer, x_timed, topk)
                    cell["eager_us"], _ = time_forward(call, device, repeat, 3, False)
                    graph_us, how = time_forward(call, device, repeat, 3, True)
                    # the same call once more after the timed ones: a first call that differs from later ones
                    # (lazily made state) shows as rel_l2 != rel_l2_after
                    cell["rel_l2_after"] = float(relative_l2(layer(x.clone(), topk), ref))
                    if bound is not None:  # the bound moe runner called directly: the bridge's part or moe's
                        direct = bound(x.clone(), topk.topk_ids, topk.topk_weights)
                        cell["rel_l2_runner"] = float(relative_l2(direct, ref))
                    if how == "cpu":
                        pass
                    elif how == "cuda-graph":
                        cell["graph_us"] = graph_us
                    else:
                        cell["graph_us"] = None
                        cell["graph_note"] = "capture failed: timed eagerly instead"
            except Exception as exc:  # recorded per token count
                cell.update(_error(exc))
            shown = {k: v for k, v in cell.items() if k != "traceback"}
            print(f"    M={m}: {shown}", flush=True)
        layer = call = None  # freed before the next runner's layer
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return {"case": name, "preset": preset, "scheme": scheme, "tolerance": limit, "runners": rows}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", required=True, help="where the results go")
    ap.add_argument("--cases", default=",".join(CASES), help=f"comma list of {', '.join(CASES)}")
    ap.add_argument("--tokens", default="1,64,2048", help="comma list of token counts")
    ap.add_argument("--runners", help="comma list of --moe-runner-backend values (default: each case's own)")
    ap.add_argument("--repeat", type=int, default=20, help="timed samples per cell")
    ap.add_argument("--smoke", action="store_true", help="toy shapes on the CPU (tokens 1,5): checks this script")
    ap.add_argument(
        "--stub-sgl-kernel",
        action="store_true",
        help="without sgl_kernel installed: a stand-in whose every name imports and raises when called (SGLang "
        "imports it at module level on CUDA; what a layer really calls is then recorded as that error)",
    )
    args = ap.parse_args(argv)
    if args.stub_sgl_kernel:
        import importlib.util

        if importlib.util.find_spec("sgl_kernel") is None:
            sys.meta_path.append(_StandIn())
    if args.smoke:
        args.tokens = "1,5"
    elif not torch.cuda.is_available():
        print("gpu_bench.py needs a CUDA device", file=sys.stderr)
        return 2
    import logging

    import sgl_setup

    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    sgl_setup.load_plugins()
    sgl_setup.publish("auto", port=29700)  # one world of one process; runner backends are switched per layer
    from importlib.metadata import version

    doc = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "gpu": "cpu (smoke)" if args.smoke else torch.cuda.get_device_name(),
        "versions": {p: version(p) for p in ("sglang", "moe-sglang", "moe-core", "moe-triton", "torch", "triton")},
        "command": " ".join(sys.argv),
        "sgl_kernel": "stand-in (--stub-sgl-kernel)" if any(isinstance(f, _StandIn) for f in sys.meta_path) else None,
        "cases": [],
    }
    tokens = [int(t) for t in args.tokens.split(",")]
    runners = args.runners.split(",") if args.runners else None
    for name in args.cases.split(","):
        try:
            doc["cases"].append(run_case(name, tokens, runners, args.repeat, args.smoke))
        except Exception as exc:  # a case that cannot even start is recorded
            doc["cases"].append({"case": name, **_error(exc)})
            print(f"case {name} failed: {exc}", flush=True)
        Path(args.json).write_text(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
