"""moe-sglang: SGLang's MoE layers through moe's runner (``--moe-runner-backend moe`` / ``moe:<backend>``).

SGLang loads ``moe_sglang.plugin:register`` from its entry-point group ``sglang.srt.plugins``; nothing here
is imported by moe-core (core never imports an engine). The modules, one job each:

- ``versions``: which SGLang releases the hooks were written against; any other is refused.
- ``choices``: the ``--moe-runner-backend`` names, read from installed metadata without importing a plugin.
- ``convert``: an SGLang MoE layer's weights -> moe's canonical ``MoeConfig`` / ``MoeWeights``.
- ``routing``: SGLang's dispatch output -> explicit top-k (int32 ids, float32 weights).
- ``runner_core``: the runner core SGLang's ``MoeRunner`` calls, bound to one ``moe_core.MoeRunner`` per layer.
- ``binding``: per layer, whether moe serves it (and through which backend, and why) or what happens instead.
- ``hooks``: the SGLang methods wrapped, each a thin door into ``binding``.
- ``plugin``: the entry point: version guard, choices, runner cores, hooks.
"""

__version__ = "0.1.0"
