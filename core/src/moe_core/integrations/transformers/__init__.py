"""Hugging Face transformers MoE blocks -> ``(MoeConfig, MoeWeights, router)``.

Each converter takes an *instantiated* transformers MoE block and returns an
``HFMoe`` named tuple ``(config, weights, router)``:

- ``config`` — a ``MoeConfig`` for the block's **routed** experts
  (``quant_scheme`` follows ``dtype``: fp32 / bf16 / fp16);
- ``weights`` — canonical ``MoeWeights`` (``w13`` ``[E, 2I, H]`` rows
  ``[gate; up]``, ``w2`` ``[E, H, I]``, biases ``b13`` ``[E, 2I]``,
  ``b2`` ``[E, H]``), copies in ``dtype`` (float32 by default), contiguous, on
  the block's device;
- ``router`` — an ``HFRouter``: ``hidden_states [M, H] -> (topk_ids int32
  [M, k], topk_weights float32 [M, k])``, the block's own gate linear for the
  logits and a ``moe_core.routing`` function for the choice.

so that ``MoeRunner(config, weights)(x, *router(x))`` is the block's routed
expert output for ``x`` ``[M, H]``.

Supported blocks (``from_hf_block`` picks by class name, subclasses included):

- ``MixtralSparseMoeBlock`` -> ``from_mixtral``; routing ``softmax_topk``
  (renormalised; equal to ``topk_softmax``).
- ``Qwen3MoeSparseMoeBlock`` -> ``from_qwen3_moe``; routing
  ``softmax_topk(renormalize=norm_topk_prob)``.
- ``GptOssMLP`` -> ``from_gpt_oss``; routing ``topk_softmax`` of the biased
  router logits; activation ``swiglu_oai``; expert biases.
- ``DeepseekV3MoE`` -> ``from_deepseek_v3``; routing ``grouped_topk``
  (sigmoid, correction bias, groups, ``routed_scaling_factor``); routed
  experts only.

Expert storage forms:

- **fused** (transformers 5.x; checked against 5.0.0 and 5.24.0): one
  ``gate_up_proj`` and one ``down_proj`` 3-D parameter in the block's
  ``experts`` module. The layout is read from the flags transformers'
  ``@use_experts_implementation`` sets on the module (``is_transposed``,
  ``is_concatenated``, ``has_bias``), falling back to the family's known
  layout when the flags are absent: Mixtral, Qwen3-MoE and DeepSeek-V3 store
  ``gate_up_proj`` ``[E, 2I, H]`` with rows ``[gate; up]`` and ``down_proj``
  ``[E, H, I]``; gpt-oss (in every release since it appeared in 4.55) stores
  ``gate_up_proj`` ``[E, H, 2I]`` with *interleaved* columns
  ``[g0, u0, g1, u1, ...]``, ``down_proj`` ``[E, I, H]`` and biases
  ``gate_up_proj_bias`` ``[E, 2I]`` (interleaved too), ``down_proj_bias``
  ``[E, H]``.
- **per-expert** (transformers 4.x; checked against 4.57.6): ``experts`` is a
  ``ModuleList`` of MLPs with one ``nn.Linear`` per projection — Mixtral
  ``w1`` (gate), ``w3`` (up), ``w2`` (down); Qwen3-MoE and DeepSeek-V3
  ``gate_proj``, ``up_proj``, ``down_proj``. The router is then the block's
  ``gate`` ``nn.Linear`` (Mixtral, Qwen3-MoE) with ``top_k`` /
  ``norm_topk_prob`` on the block.

Shapes are checked against each other and against the router before anything
is trusted, and the activation is *probed*, not assumed: the experts' own gate
function (``_apply_gate`` in 5.x, ``act_fn`` in 4.x) is evaluated on a fixed
probe that crosses the swiglu clamps and compared with
``moe_core.activations``; a mismatch raises ``InvalidInputError`` rather than
producing a layer that is silently different.

Not converted (the caller must account for them): DeepSeek-V3's
``shared_experts`` (a dense MLP added to the routed output — compare against
``block(x) - block.shared_experts(x)``), Mixtral's training-time router jitter
(put the block in ``eval()`` mode or set ``router_jitter_noise=0``), and any
expert-parallel sharding (convert an unsharded block).

transformers itself is never imported here: the converters read the block's
attributes, so this module imports without transformers installed.
"""

from __future__ import annotations

from moe_core.integrations.transformers.families import (
    SUPPORTED_BLOCKS,
    from_deepseek_v3,
    from_gpt_oss,
    from_hf_block,
    from_mixtral,
    from_qwen3_moe,
)
from moe_core.integrations.transformers.router import HFMoe, HFRouter

__all__ = [
    "SUPPORTED_BLOCKS",
    "HFMoe",
    "HFRouter",
    "from_deepseek_v3",
    "from_gpt_oss",
    "from_hf_block",
    "from_mixtral",
    "from_qwen3_moe",
]
