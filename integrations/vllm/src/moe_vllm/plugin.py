"""vLLM's entry point (group ``vllm.general_plugins``): ``register`` runs in vLLM's ``load_general_plugins``, in
every vLLM process before a model is built. It leaves a vLLM it was not tested against (``versions``) alone with
one log line, and otherwise registers ``hooks.MoeUnquantizedFusedMoEMethod`` in vLLM's out-of-tree op registry.
Registering changes nothing by itself: a layer runs through moe only when the switch (``choices``) is on where the
layer is built. vLLM may call ``register`` more than once in a process; it registers once.
"""

from __future__ import annotations

import logging

from moe_vllm import versions

logger = logging.getLogger("vllm.moe_vllm")

_registered = False


def register() -> None:
    global _registered
    if _registered:
        return
    refusal = versions.refusal(versions.installed())
    if refusal is not None:
        logger.warning("moe-vllm: %s", refusal)
        return
    from vllm.model_executor.custom_op import CustomOp, op_registry_oot

    from moe_vllm import choices, hooks

    taken = op_registry_oot.get(hooks.REPLACES)
    if taken is not None and taken is not hooks.MoeUnquantizedFusedMoEMethod:
        logger.warning(
            "moe-vllm: %s is already replaced by %s.%s (another vLLM plugin), so moe-vllm registers nothing and "
            "every MoE layer stays on that plugin's path.",
            hooks.REPLACES,
            taken.__module__,
            taken.__qualname__,
        )
        return
    if taken is None:
        CustomOp.register_oot(hooks.MoeUnquantizedFusedMoEMethod, name=hooks.REPLACES)
    # register_oot renames the class to the registry key; keep vLLM's op name ("unquantized_fused_moe"), which its
    # compilation config's custom_ops (+/-unquantized_fused_moe) matches, so layers left on vLLM's path dispatch
    # exactly as without the plugin
    hooks.MoeUnquantizedFusedMoEMethod.name = hooks.UnquantizedFusedMoEMethod.name
    _registered = True
    logger.info(
        "moe-vllm: vLLM's unquantized MoE method is moe-vllm's; layers run through moe when %s (additional_config) "
        "or %s is auto or a backend (installed: %s)",
        choices.KEY,
        choices.ENV,
        ", ".join(choices.backends()),
    )
