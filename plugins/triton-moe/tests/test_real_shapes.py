"""The model presets' real shapes on CUDA: a fresh runner's first forwards equal the float64 reference.

Why: the conformance suite runs toy shapes, and the tuned tables hold other tiles for every real shape and
token count; a tile that computes wrong at one (shape, M) would pass everything else. The routing is what
an engine hands over (softmax then top-k, float32 weights not renormalised, int32 ids), and the first call
of a runner is checked on its own: lazily made state (scratch, counters, compiled kernels) is where a first
forward differs from the later ones.
"""

from __future__ import annotations

import pytest
import torch

from moe_core import MoeRunner
from moe_core.presets import MODEL_PRESETS, PRESETS
from moe_core.reference import reference_for
from moe_core.synthetic import random_weights
from moe_core.tolerances import relative_l2, tolerance

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (runs on the H200)"),
]

SCHEMES = [(p, "bf16") for p in MODEL_PRESETS] + [("deepseek-v3-tp8", "fp8_block"), ("gpt-oss-120b", "mxfp4")]
TOKENS = (1, 8, 64)


def _engine_inputs(cfg, m: int, seed: int):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(m, cfg.hidden_size, device="cuda", generator=g).to(torch.bfloat16)
    logits = torch.randn(m, cfg.num_experts, device="cuda", generator=g)
    weights, ids = torch.topk(logits.softmax(-1), cfg.top_k)
    return x, ids.to(torch.int32), weights.float()


@pytest.mark.parametrize("pdl", [True, False], ids=["pdl", "plain"])
@pytest.mark.parametrize("preset,scheme", SCHEMES, ids=[f"{p}-{s}" for p, s in SCHEMES])
def test_first_forwards_of_a_fresh_runner_equal_the_reference(preset, scheme, pdl):
    from moe_triton import switches

    cfg = PRESETS[preset].config(scheme, torch.bfloat16)
    weights = random_weights(cfg, "cuda", seed=0)
    limit = tolerance(scheme, torch.bfloat16)
    inputs = {m: _engine_inputs(cfg, m, seed=m + 1) for m in TOKENS}
    with switches.override(pdl=pdl):
        runner = MoeRunner(cfg, weights, backend="triton")
        errors = {}
        for m in (*TOKENS, TOKENS[0]):  # the first count again: the first call of it against a later one
            x, ids, tw = inputs[m]
            out = runner(x, ids, tw)
            torch.cuda.synchronize()
            errors.setdefault(m, []).append(relative_l2(out, reference_for(cfg, weights, x, ids.long(), tw)))
    bad = {m: e for m, e in errors.items() if max(e) > limit}
    assert not bad, f"{preset} {scheme}: relative L2 above {limit} at M -> [first call, ...]: {bad}"
