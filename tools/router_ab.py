"""A/B of the fused router on CUDA: ``MoeLayer`` on triton with its backend's routing kernel taking the gate too
(``FusedOp.gated_router``: "gated", where the routing has one), with the routing kernel on cuBLAS's logits
(``FusedOp.router``, the ``fused_gate`` switch off: "fused") and routing in torch ops (``fused_routing=False``:
"torch") — same weights, gate and inputs, one process — for Qwen3-30B-A3B (bf16), gpt-oss-120b (bf16, mxfp4;
softmax top-k) and DeepSeek-V3 at TP8 (bf16; grouped top-k of float32 logits with a correction bias) at
M = 1, 64, 256, 2048: µs per CUDA-graph replay and eager wall (medians), the router alone each way (gate
GEMM included), the outputs' relative L2 against "torch" and the share of tokens given the same experts
(bf16 logits tie often, so not always 1).

    python tools/router_ab.py --json router_ab.json [--cases deepseek-v3-tp8:bf16,qwen3-30b-a3b:bf16]
"""

import argparse
import functools
import json
import time

import torch
from transformers_bench import _graph_us, _median_us  # this folder: the timing both tools use

from moe_core import MoeLayer
from moe_core.integrations.transformers.router import HFRouter
from moe_core.presets import PRESETS
from moe_core.routing import GroupedTopK, SoftmaxTopK
from moe_core.synthetic import random_weights
from moe_core.tolerances import relative_l2
from moe_triton import switches

parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
CASES = ("qwen3-30b-a3b:bf16", "gpt-oss-120b:bf16", "gpt-oss-120b:mxfp4", "deepseek-v3-tp8:bf16")
parser.add_argument("--json", required=True, help="where to write the rows")
parser.add_argument("--cases", default=",".join(CASES), help=f"PRESET:SCHEME rows to run (default: {','.join(CASES)})")
args = parser.parse_args()
OUT = args.json
cases = [tuple(c.split(":")) for c in args.cases.split(",")]
if not all(len(c) == 2 and ":".join(c) in CASES for c in cases):
    parser.error(f"--cases takes some of {', '.join(CASES)}")
if not torch.cuda.is_available():
    parser.exit(1, "router_ab.py needs a CUDA device\n")
dev = torch.device("cuda")


def measure(layers: dict, route, x: torch.Tensor) -> dict:
    """One row's numbers: the layers on ``x``, and the router alone (from ``x``, gate GEMM included) each way."""
    row = {}
    outs = {key: layer(x).clone() for key, layer in layers.items()}
    router = layers["torch"].router
    logits = router.logits(x)
    ref_ids, _ = route(logits)
    fused = layers["fused"].fused_router
    gated = layers["gated"].fused_router
    choices = {"fused": functools.partial(lambda x: fused(router.logits(x)), x)}
    if gated.takes_gate:
        choices["gated"] = functools.partial(gated.gated, x, *router.gate)
    for key in ("fused", "gated"):
        row[f"rel_l2_{key}_vs_torch"] = float(f"{relative_l2(outs[key], outs['torch']):.2e}")
        if key in choices:
            ids, _ = choices[key]()
            same = (ids.sort(1).values == ref_ids.sort(1).values).all(1)
            row[f"same_experts_tokens_{key}"] = float(same.float().mean())
    for key, layer in layers.items():
        row[f"{key}_graph_us"] = _graph_us(functools.partial(layer, x), 200)
        row[f"{key}_eager_us"] = _median_us(functools.partial(layer, x), 50, dev)
    row["router_torch_graph_us"] = _graph_us(functools.partial(router, x), 200)
    for key, choice in choices.items():
        row[f"router_{key}_graph_us"] = _graph_us(choice, 200)
    return row


rows = []
t0 = time.time()
for name, scheme in cases:
    cfg = PRESETS[name].config(scheme, torch.bfloat16)
    w = random_weights(cfg, dev)
    gate = torch.randn(cfg.num_experts, cfg.hidden_size, device=dev, dtype=torch.bfloat16) * cfg.hidden_size**-0.5
    deepseek = name.startswith("deepseek")  # DeepSeek-V3's router: 8 groups, 4 kept, float32 logits
    bias = torch.rand(cfg.num_experts, device=dev) * 0.1
    route = (GroupedTopK(cfg.top_k, n_group=8, topk_group=4, routed_scaling_factor=2.5, correction_bias=bias)
             if deepseek else SoftmaxTopK(cfg.top_k))  # fmt: skip
    layer = functools.partial(MoeLayer, cfg, w, HFRouter(gate, None, route, float32_logits=deepseek), backend="triton")
    with switches.override(fused_gate=False):
        layers = {"fused": layer()}
    layers["gated"] = layer()
    layers["torch"] = layer(fused_routing=False)
    del layer
    del w
    assert layers["fused"].fused_router is not None and layers["torch"].fused_router is None
    assert not layers["fused"].fused_router.takes_gate and layers["gated"].fused_router.takes_gate != deepseek
    for m in (1, 64, 256, 2048):
        x = torch.randn(m, cfg.hidden_size, device=dev, dtype=torch.bfloat16)
        row = {"preset": name, "scheme": scheme, "M": m}
        with torch.no_grad():
            row.update(measure(layers, route, x))
        print(json.dumps(row), f"t={time.time() - t0:.0f}s", flush=True)
        rows.append(row)
    del layers
    torch.cuda.empty_cache()
json.dump({"rows": rows, "torch": torch.__version__}, open(OUT, "w"), indent=1)
