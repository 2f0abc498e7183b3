"""The runner core SGLang's ``MoeRunner`` calls for ``--moe-runner-backend moe[:<backend>]``.

``register_moe_runner_core(name, factory)`` makes SGLang's ``MoeRunner`` build one of these per layer; its
``run_from_dispatch`` receives the dispatch output directly (a ``DispatchMoeRunnerCore``: no permute step). The
core starts unbound: the layer's weights are not loaded when SGLang builds it. ``binding.bind`` attaches one
``moe_core.MoeRunner`` once they are, and from then on a forward is: explicit top-k, moe's runner (which checks
what it is given and what the backend returns), SGLang's routed scaling factor, combine input.
"""

from __future__ import annotations

from sglang.srt.layers.moe.moe_runner.base import DispatchMoeRunnerCore

from moe_sglang import routing


class MoeBridgeRunnerCore(DispatchMoeRunnerCore):
    def __init__(self, choice: str, config) -> None:
        super().__init__(config)
        self.choice = choice
        #: the bound ``moe_core.MoeRunner`` (None until the layer's weights are loaded)
        self.runner = None
        #: multiply the output by SGLang's routed scaling factor, as SGLang's triton runner does (set at bind)
        self.output_scale: float | None = None

    @property
    def runner_backend(self):
        from sglang.srt.layers.moe.utils import resolve_moe_runner_backend

        return resolve_moe_runner_backend(self.choice)

    def run_from_dispatch(self, dispatch_output, quant_info, runner_config, hooks=None):
        if hooks is not None:
            raise RuntimeError("moe-sglang does not run LoRA adapters on MoE layers (SGLang passed LoRA hooks)")
        if self.runner is None:
            raise RuntimeError(
                f"--moe-runner-backend {self.choice}: this layer's moe runner is not bound yet "
                "(its weights were never processed after loading)"
            )
        hidden_states, topk_ids, topk_weights = routing.explicit_topk(dispatch_output)
        out = self.runner(hidden_states, topk_ids, topk_weights)
        if self.output_scale is not None:
            out.mul_(self.output_scale)
        return routing.combine_input(out)


def factory(choice: str):
    """The factory ``register_moe_runner_core`` takes for one SGLang runner-backend name."""

    def make(config) -> MoeBridgeRunnerCore:
        return MoeBridgeRunnerCore(choice, config)

    return make
