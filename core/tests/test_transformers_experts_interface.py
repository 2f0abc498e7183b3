"""``register_experts_implementation``: transformers' own model with ``experts_implementation="moe"``.

Tiny models (hidden 64, two layers, vocab 128, fp32, seeded) built with ``from_config(cfg,
experts_implementation=...)``: the registered implementation must give the eager experts' logits to 1e-5;
routing, shared experts and everything else stay transformers' own.
"""

from __future__ import annotations

import pytest

transformers = pytest.importorskip("transformers")

import torch  # noqa: E402
from hf_tiny_models import TINY_MODEL  # noqa: E402

from moe_core.integrations.transformers.experts_interface import (  # noqa: E402
    CACHE_ATTR,
    register_experts_implementation,
)

TOL = 1e-5
BASE = dict(TINY_MODEL, head_dim=16)
CASES = {
    "qwen3_moe": dict(intermediate_size=64, moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2),
    "gpt_oss": dict(intermediate_size=32, num_local_experts=4, num_experts_per_tok=2),  # swiglu_oai, biases
    "qwen2_moe": dict(  # shared expert: transformers' own
        intermediate_size=64, moe_intermediate_size=32, shared_expert_intermediate_size=48, num_experts=8
    ),
}


@pytest.fixture(scope="module", autouse=True)
def registered():
    register_experts_implementation("moe", backend="torch")


def build(model_type: str, implementation: str):
    cfg = transformers.AutoConfig.for_model(model_type, **BASE, **CASES[model_type])
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(cfg, experts_implementation=implementation).eval()


def run(model, ids):
    with torch.no_grad():
        return model(ids).logits


def experts_modules(model):
    return [m for m in model.modules() if hasattr(m, "gate_up_proj") and hasattr(m, "is_transposed")]


@pytest.mark.parametrize("model_type", list(CASES))
def test_same_logits_as_eager(model_type):
    eager, ours = build(model_type, "eager"), build(model_type, "moe")
    assert ours.config._experts_implementation == "moe"
    ids = torch.randint(0, 128, (2, 7), generator=torch.Generator().manual_seed(1))
    ref = run(eager, ids)
    err = (run(ours, ids) - ref).abs().max().item()
    print(f"{model_type}: max abs logit error {err:.2e} (max |logit| {ref.abs().max().item():.2f})")
    assert err < TOL
    for experts in experts_modules(ours):
        [(_, runner)] = getattr(experts, CACHE_ATTR).values()
        assert runner.backend == "torch"
        assert runner.config.activation == ("swiglu_oai" if model_type == "gpt_oss" else "silu")


def test_runner_is_cached_views_the_parameters_and_is_rebuilt_after_an_in_place_change():
    model = build("qwen3_moe", "moe")
    ids = torch.randint(0, 128, (1, 5), generator=torch.Generator().manual_seed(2))
    first = run(model, ids)
    experts = experts_modules(model)[0]
    [(_, runner)] = getattr(experts, CACHE_ATTR).values()
    run(model, ids)
    assert next(iter(getattr(experts, CACHE_ATTR).values()))[1] is runner  # one build per module
    # the layout is canonical already: the torch backend's weights are the parameters themselves
    assert runner.prepared.w13.untyped_storage().data_ptr() == experts.gate_up_proj.untyped_storage().data_ptr()
    with torch.no_grad():
        experts.gate_up_proj.mul_(2)
    changed = run(model, ids)
    [(_, rebuilt)] = getattr(experts, CACHE_ATTR).values()
    assert rebuilt is not runner and not torch.allclose(changed, first)
    eager = build("qwen3_moe", "eager")
    with torch.no_grad():
        experts_modules(eager)[0].gate_up_proj.mul_(2)
    assert (run(eager, ids) - changed).abs().max() < TOL


def test_the_name_eager_is_refused():
    from moe_core.errors import InvalidInputError

    with pytest.raises(InvalidInputError):
        register_experts_implementation("eager")


def test_torch_compile_of_a_model_with_the_moe_implementation():
    """dynamo traces transformers' block around our function: the runner is built (and cached) on the first
    compiled call, then reused; logits equal eager's."""
    torch._dynamo.reset()
    eager, ours = build("qwen3_moe", "eager"), build("qwen3_moe", "moe")
    compiled = torch.compile(ours, backend="aot_eager")
    ids = torch.randint(0, 128, (1, 6), generator=torch.Generator().manual_seed(4))
    for _ in range(2):
        assert (run(compiled, ids) - run(eager, ids)).abs().max().item() < TOL
    for experts in experts_modules(ours):
        [(_, runner)] = getattr(experts, CACHE_ATTR).values()
        assert runner.backend == "torch"
    torch._dynamo.reset()
