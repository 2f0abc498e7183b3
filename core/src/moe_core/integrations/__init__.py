"""Bridges from other libraries' MoE layers to moe-core's canonical layer.

Each submodule imports its library lazily on use and is optional: nothing in
``moe_core`` imports this package. ``moe_core.integrations.transformers``
converts an instantiated Hugging Face transformers MoE block into
``(MoeConfig, MoeWeights, router)``.
"""
