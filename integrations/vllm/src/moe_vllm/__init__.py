"""moe-vllm: vLLM's unquantized MoE layers through moe's runner (``moe_vllm_backend`` = ``auto`` / ``<backend>``).

vLLM loads ``moe_vllm.plugin:register`` from its entry-point group ``vllm.general_plugins``; nothing here is
imported by moe-core (core never imports an engine). The modules, one job each (the same names as moe-sglang's
where the job is the same):

- ``versions``: which vLLM releases the bridge was written against; any other is left alone.
- ``choices``: the one switch (vLLM's ``additional_config`` or ``MOE_VLLM_BACKEND``) and the installed backends,
  read from metadata without importing a plugin.
- ``convert``: a vLLM MoE layer's weights -> moe's canonical ``MoeConfig`` / ``MoeWeights``.
- ``routing``: vLLM's top-k -> explicit top-k (int32 local ids, float32 weights).
- ``binding``: per layer, whether moe serves it (and through which backend, and why) or why not.
- ``hooks``: the vLLM method replaced (``UnquantizedFusedMoEMethod``), each override a thin door into ``binding``.
- ``plugin``: the entry point: version guard, out-of-tree registration.
"""

__version__ = "0.1.0"
