"""The conformance suite can fail: stand-in backends with planted bugs are caught."""

from __future__ import annotations

import pytest

from moe_core.testing.cases import FAILED, PASSED, SKIPPED, Case, Conformance, all_cases, summarize

BUGGY = {
    # gate and up halves swapped: the classic [up; gate] layout mistake
    "swapped": """
        def prepare(self, weights):
            import torch
            from moe_core.weights import MoeWeights
            i = self.config.intermediate_size
            if self.config.scheme.quantized:
                return weights
            w13 = torch.cat([weights.w13[:, i:], weights.w13[:, :i]], dim=1)
            return MoeWeights(w13, weights.w2, weights.b13, weights.b2)
    """,
    # declares biases but drops them
    "nobias": """
        def prepare(self, weights):
            from moe_core.weights import MoeWeights
            return MoeWeights(weights.w13, weights.w2, None, None, weights.w13_scale, weights.w2_scale,
                              weights.w13_global_scale, weights.w2_global_scale)
    """,
    # ignores out= and returns a fresh tensor
    "noout": """
        def apply(self, hidden_states, topk_ids, topk_weights, prepared, out=None):
            return super().apply(hidden_states, topk_ids, topk_weights, prepared, None)
    """,
    # changes one byte of the caller's canonical w13 in place while preparing
    "mutates": """
        def prepare(self, weights):
            import torch
            weights.w13.view(torch.uint8).view(-1)[:1].add_(1)
            return super().prepare(weights)
    """,
    # declares biases but applies them only with swiglu_oai (the one activation the suite used to try)
    "oaibias": """
        def prepare(self, weights):
            from moe_core.weights import MoeWeights
            if self.config.activation == "swiglu_oai":
                return weights
            return MoeWeights(weights.w13, weights.w2, None, None, weights.w13_scale, weights.w2_scale,
                              weights.w13_global_scale, weights.w2_global_scale)
    """,
    # claims to handle out-of-range ids but clamps them into range: -1 becomes expert 0
    "clamps": """
        handles_invalid_ids = True
        def apply(self, hidden_states, topk_ids, topk_weights, prepared, out=None):
            ids = topk_ids.clamp(0, self.config.num_experts - 1)
            return super().apply(hidden_states, ids, topk_weights, prepared, out)
    """,
    # adds noise on every call: not deterministic, and wrong
    "noisy": """
        def apply(self, hidden_states, topk_ids, topk_weights, prepared, out=None):
            import torch
            y = super().apply(hidden_states, topk_ids, topk_weights, prepared, out)
            return y.add_(torch.randn_like(y) * 1e-3 * y.abs().max().clamp(min=1))
    """,
    # a router that routes in torch, and its gated form: right (the suite must pass it)
    "goodrouter": """
        def router(self, routing):
            return routing
        def gated_router(self, routing):
            import torch.nn.functional as F
            return lambda x, weight, bias: routing(F.linear(x, weight, bias))
    """,
    # picks the k experts with the lowest logits
    "lowrouter": """
        def router(self, routing):
            return lambda logits: routing(-logits)
    """,
    # the gated router drops the gate's bias
    "gatenobias": """
        def router(self, routing):
            return routing
        def gated_router(self, routing):
            import torch.nn.functional as F
            return lambda x, weight, bias: routing(F.linear(x, weight))
    """,
    # the gated hook raises: a layer would warn and route on the logits, the suite fails the case
    "raisinggate": """
        def router(self, routing):
            return routing
        def gated_router(self, routing):
            raise RuntimeError("gate kernel missing")
    """,
}


def run_kind(site, name, kinds):
    site.add(f"moe-{name}", name, body=BUGGY[name])
    return run_installed(site, name, kinds)


def run_installed(site, name, kinds):
    conf = Conformance(name, "cpu", registry=site.registry())
    return {c.id: conf.run(c) for c in all_cases() if c.kind in kinds}


def test_swapped_gate_up_fails_reference(site):
    results = run_kind(site, "swapped", {"reference"})
    failed = [r for r in results.values() if r.status == FAILED]
    assert len(failed) >= 6 and all("relative L2 error" in r.reason for r in failed)
    # quantized schemes are untouched by this bug and still pass
    assert results["mxfp4-bf16-silu"].status == PASSED


def test_dropped_bias_fails_bias_cases(site):
    results = run_kind(site, "nobias", {"bias", "reference"})
    assert {r.status for cid, r in results.items() if r.case.kind == "bias"} == {FAILED}
    assert {r.status for cid, r in results.items() if r.case.kind == "reference"} == {PASSED}


def test_ignored_out_buffer_fails(site):
    results = run_kind(site, "noout", {"out_buffer"})
    assert all(r.status == FAILED and "apply was given out= and returned" in r.reason for r in results.values())


def test_prepare_that_modifies_the_callers_weights_fails(site):
    results = run_kind(site, "mutates", {"reference"})
    assert results and all(
        r.status == FAILED and "prepare modified the caller's canonical weights" in r.reason for r in results.values()
    )


def test_bias_ignored_with_some_activations_fails(site):
    results = run_kind(site, "oaibias", {"bias"})
    by_act = {r.case.activation: r.status for r in results.values() if r.case.scheme == "fp32"}
    assert by_act == {"silu": FAILED, "gelu": FAILED, "swiglu_oai": PASSED}


def test_invalid_ids_mapped_to_a_real_expert_fail(site):
    results = run_kind(site, "clamps", {"expert_ids"})
    unassigned = [r for r in results.values() if r.case.bad == "unassigned"]
    assert unassigned and all(r.status == FAILED for r in unassigned)


def test_noise_fails_determinism(site):
    results = run_kind(site, "noisy", {"deterministic"})
    assert all(r.status == FAILED for r in results.values())


def test_undeclared_cases_are_skipped_with_the_check_reason(site):
    site.add("moe-gpu-only", "gpuonly", device_types=("cuda",))
    conf = Conformance("gpuonly", "cpu", registry=site.registry())
    result = conf.run(Case("reference", "bf16", None))
    assert result.status == SKIPPED and "device type 'cpu' not supported" in result.reason


def test_missing_backend_fails_rather_than_skips(site):
    conf = Conformance("not-installed-anywhere", "cpu", registry=site.registry())
    result = conf.run(Case("reference", "bf16", None))
    assert result.status == FAILED and "not installed" in result.reason


def test_summary_counts():
    from moe_core.testing.cases import CaseResult

    c = Case("reference", "bf16")
    counts = summarize([CaseResult(c, PASSED), CaseResult(c, FAILED), CaseResult(c, SKIPPED), CaseResult(c, PASSED)])
    assert counts == {"passed": 2, "failed": 1, "skipped": 1}


def test_a_right_router_passes_and_wrong_ones_fail(site):
    good = run_kind(site, "goodrouter", {"router"})
    good_gated = run_installed(site, "goodrouter", {"gated_router"})  # (a case's id is its route: one kind a dict)
    for results in (good, good_gated):
        assert len(results) == 4 and {r.status for r in results.values()} == {PASSED}, results
    low = run_kind(site, "lowrouter", {"router"})
    assert all(r.status == FAILED and "are not the top" in r.reason for r in low.values()), low
    assert {r.status for r in run_installed(site, "lowrouter", {"gated_router"}).values()} == {SKIPPED}  # none
    nobias = run_kind(site, "gatenobias", {"gated_router"})
    assert {r.status for r in nobias.values()} == {FAILED}
    raising = run_kind(site, "raisinggate", {"gated_router"})
    assert all(r.status == FAILED and "gate kernel missing" in r.reason for r in raising.values())


@pytest.mark.parametrize("kind", ["reference", "bias", "shapes", "bad_input", "router", "gated_router"])
def test_every_kind_has_cases(kind):
    assert any(c.kind == kind for c in all_cases())
