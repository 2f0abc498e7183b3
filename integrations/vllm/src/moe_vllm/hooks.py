"""The vLLM method moe-vllm replaces: ``UnquantizedFusedMoEMethod``, through vLLM's out-of-tree op registry.

``CustomOp.register_oot(name="UnquantizedFusedMoEMethod")`` makes every ``UnquantizedFusedMoEMethod(...)`` vLLM
builds afterwards an instance of ``MoeUnquantizedFusedMoEMethod`` (``CustomOp.__new__`` looks the class name up).
It is vLLM's own class with four overrides, each a thin door into ``binding``, and each calls vLLM's original
unchanged for a layer moe does not serve (switch off, or declined):

- ``create_weights``: the weights exist (not loaded) — moe plans the layer here, before minutes of loading;
- ``process_weights_after_loading``: the last moment the weights are the checkpoint's layout; moe binds here and
  vLLM's conversion to its kernel's format (and its kernel, ``moe_kernel``) is skipped for a bound layer;
- ``apply``: vLLM's runner routes (``router.select_experts``) and hands the top-k here; a bound layer runs its
  moe runner;
- ``is_monolithic``: a bound layer is modular (routing stays vLLM's), whatever kernel vLLM would have picked.

A bound layer has no ``moe_kernel``, so vLLM's runner treats it as it treats methods outside its modular-kernel
framework: shared experts run beside it (not inside the kernel), and the output is all-reduced by the runner.
"""

from __future__ import annotations

from vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method import UnquantizedFusedMoEMethod

from moe_vllm import binding, routing

#: the name vLLM's out-of-tree registry looks the class up by (``CustomOp.__new__``: the in-tree class's name)
REPLACES = UnquantizedFusedMoEMethod.__name__


class MoeUnquantizedFusedMoEMethod(UnquantizedFusedMoEMethod):
    """vLLM's unquantized MoE method, whose layer runs through one ``moe_core.MoeRunner`` when moe serves it."""

    def __init__(self, moe) -> None:
        super().__init__(moe)
        #: the layer's ``binding.Binding`` (None: the switch was off when the layer was built)
        self.moe_binding: binding.Binding | None = None

    def _served(self) -> binding.Binding | None:
        planned = self.moe_binding
        return planned if planned is not None and planned.served else None

    def create_weights(self, layer, *args, **kwargs):
        super().create_weights(layer, *args, **kwargs)
        self.moe_binding = binding.plan(layer)

    def process_weights_after_loading(self, layer) -> None:
        planned = self._served()
        if planned is None or not binding.bind(layer, planned):
            return super().process_weights_after_loading(layer)
        # the base method's own step (a no-op in vLLM 0.33), without vLLM's kernel setup
        return super(UnquantizedFusedMoEMethod, self).process_weights_after_loading(layer)

    @property
    def is_monolithic(self) -> bool:
        if self._served() is not None:
            return False
        return super().is_monolithic

    def apply(self, layer, x, topk_weights, topk_ids, shared_experts, shared_experts_input):
        planned = self._served()
        if planned is None:
            return super().apply(layer, x, topk_weights, topk_ids, shared_experts, shared_experts_input)
        if planned.runner is None:
            raise RuntimeError(
                f"moe-vllm ({planned.request}): {layer.layer_name}'s moe runner is not bound yet "
                "(its weights were never processed after loading)"
            )
        topk_ids, topk_weights = routing.explicit_topk(layer, topk_ids, topk_weights)
        return planned.runner(x, topk_ids, topk_weights)
