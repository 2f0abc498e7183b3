"""Hugging Face transformers MoE blocks -> moe_core layers: converters, ``patch_model``, an experts implementation.

Each converter takes an *instantiated* transformers MoE block and returns an
``HFMoe`` named tuple ``(config, weights, router, shared)`` (four fields: unpack four
or use the attributes):

- ``config`` — a ``MoeConfig`` for the block's **routed** experts
  (``quant_scheme`` follows ``dtype``: fp32 / bf16 / fp16 — except a gpt-oss block holding its MXFP4
  checkpoint tensors, below: ``mxfp4``);
- ``weights`` — canonical ``MoeWeights`` (``w13`` ``[E, 2I, H]`` rows
  ``[gate; up]``, ``w2`` ``[E, H, I]``, biases ``b13`` ``[E, 2I]``,
  ``b2`` ``[E, H]``), copies in ``dtype`` (float32 by default), contiguous, on
  the block's device;
- ``router`` — an ``HFRouter``: ``hidden_states [M, H] -> (topk_ids int32
  [M, k], topk_weights float32 [M, k])``, the block's own gate linear for the
  logits and a ``moe_core.routing`` function for the choice.

- ``shared`` — the block's dense shared-expert MLP as ``moe_core.weights.SharedExperts``
  (copies in ``dtype``, activation probed like the routed experts', ``gate`` for Qwen2-MoE's
  sigmoid gate) or ``None``;

so that ``MoeRunner(config, weights)(x, *router(x))`` is the block's routed
expert output for ``x`` ``[M, H]`` and, with ``shared``, ``moe_core.MoeLayer(config, weights,
router, shared=shared)`` is the whole block.

Supported blocks (the converters are in ``families``; ``from_hf_block`` picks by class name, subclasses included;
``find_moe_blocks(model)`` lists a model's convertible blocks by qualified name):

- ``MixtralSparseMoeBlock``, ``MiniMaxSparseMoeBlock`` -> ``from_mixtral``; ``softmax_topk`` renormalised;
  no shared.
- ``Qwen3MoeSparseMoeBlock``, ``OlmoeSparseMoeBlock``, ``FlexOlmoSparseMoeBlock``, ``MellumSparseMoeBlock``,
  ``Qwen3OmniMoeThinkerTextSparseMoeBlock`` -> ``from_qwen3_moe``; ``softmax_topk(renormalize=norm_topk_prob)``;
  no shared.
- ``Qwen2MoeSparseMoeBlock``, ``Qwen3NextSparseMoeBlock``, ``Qwen3OmniMoeTalkerTextSparseMoeBlock``,
  ``Qwen4ExpTextSparseMoeBlock`` -> ``from_qwen2_moe``; as Qwen3-MoE; shared ``shared_expert`` scaled by
  ``sigmoid(shared_expert_gate(x))``.
- ``Qwen3VLMoeTextSparseMoeBlock``, ``Qwen3_5MoeSparseMoeBlock`` -> ``from_qwen3_vl_moe``; ``softmax_topk``
  always renormalised; Qwen3.5-MoE's gated ``shared_expert``, none for Qwen3-VL-MoE.
- ``JambaSparseMoeBlock`` -> ``from_jamba``; ``softmax_topk`` not renormalised (``router``); no shared.
- ``LaraMiniSparseMoeBlock`` -> ``from_lara_mini``; float32 logits, ``softmax_topk(renormalize=norm_topk_prob)``;
  shared ``shared_expert`` (no gate).
- ``HunYuanMoEV1Moe`` -> ``from_hunyuan_v1_moe``; ``softmax_topk`` renormalised on ``gate.wg``; shared ``shared_mlp``.
- ``AriaTextMoELayer`` -> ``from_aria``; ``topk_softmax`` (``router``), transposed experts; shared ``shared_experts``.
- ``Ernie4_5_MoeSparseMoeBlock`` -> ``from_ernie4_5_moe``; float32 softmax, ``moe_statics`` correction bias for
  the choice, weights over ``clamp(sum, min=norm_min)`` (``grouped_topk``, one group); shared ``shared_experts``.
- ``GptOssMLP`` -> ``from_gpt_oss``; ``topk_softmax`` of the biased logits; ``swiglu_oai``,
  expert biases; no shared. Loaded from its MXFP4 checkpoint without dequantizing (``Mxfp4GptOssMLP``, or a
  ``GptOssMLP`` whose experts hold ``*_blocks`` / triton_kernels tensors) -> ``from_gpt_oss_mxfp4``
  (``families.MXFP4_CHECKPOINT_BLOCKS``): the checkpoint's own bytes and scales, de-interleaved, scheme
  ``mxfp4``.
- ``DeepseekV3MoE``, ``DeepseekV32MoE``, ``BailingHybridMoE``, ``Glm4MoeMoE``, ``Glm4MoeLiteMoE``,
  ``Glm4vMoeTextMoE``, ``GlmMoeDsaMoE``, ``KimiLinearMoE``, ``Dots1MoE``, ``Dots3NoteTextMoE``,
  ``ExaoneMoeSparseMoEBlock``, ``SolarOpenMoE``, ``MiMoV2FlashMoE`` -> ``from_deepseek_v3``; ``grouped_topk``
  (sigmoid, correction bias, groups, scaling); shared ``shared_experts`` (none for MiMoV2Flash).
- ``DeepseekV2Moe``, ``DeepseekOcr2TextMoe``, ``UnlimitedOcrTextMoe`` -> ``from_deepseek_v2``; ``grouped_topk``
  (softmax, ``group_scoring="max"``, no renormalisation, scaling); shared ``shared_experts``.
- ``Mistral4MoE``, ``MistralLarge4TextMoE`` -> ``from_mistral4``; ``grouped_topk`` (softmax, groups by their two
  best experts, no bias, scaling; Large4: float32 logits, always renormalised); shared ``shared_experts``.
- ``MiniMaxM2SparseMoeBlock`` -> ``from_minimax_m2``; sigmoid top-k, the block's correction bias for the
  choice, renormalised; no shared. ``Dots3NoteVisionMoE`` -> ``from_dots3_note_vision``; the same with float32
  logits and ``router_scaling_factor``; no shared.
- ``FlintSparseMoeBlock`` -> ``from_flint``; float32 sigmoid top-k, renormalised iff ``norm_topk_prob``; shared
  ``shared_expert`` (no gate). ``Lfm2MoeSparseMoeBlock`` -> ``from_lfm2_moe``; sigmoid top-k, optional
  ``expert_bias`` for the choice, ``sum + 1e-6`` renormalisation, ``routed_scaling_factor``; no shared.
- ``Llama4TextMoe`` -> ``from_llama4``; ``sigmoid_top1`` with
  ``apply_router_weight_on_input``; shared ``shared_expert``.
- ``PhimoeSparseMoeBlock`` -> ``from_phimoe``; ``sparsemixer`` (eval form); no shared.
- ``GraniteMoeMoE``, ``GraniteMoeSharedMoE``, ``GraniteMoeSWAMoE``, ``GraniteMoeHybridMoE`` ->
  ``from_granite_moe``; ``topk_softmax``; shared: the decoder layer's ``shared_mlp`` when passed
  as ``shared_mlp=`` (see below).

(``families.SUPPORTED_BLOCKS`` is the authority.) GraniteMoeShared and
GraniteMoeHybrid keep their shared MLP in the *decoder layer* (``layer.shared_mlp``, added to
``layer.block_sparse_moe(x)``), so the block alone has none: ``from_hf_block(layer.block_sparse_moe,
shared_mlp=layer.shared_mlp)`` returns it. ``patch_model`` then folds it into the patched block and
replaces ``layer.shared_mlp`` by a ``FoldedSharedMlp`` that adds nothing.

Patching a model: ``patch_model(model, backend="auto", strict=True, quant_scheme=None, shared_backend=None,
cuda_graph_max_tokens=256)`` (``patch``) replaces every supported block of a model by a ``PatchedMoeBlock``
(a ``MoeLayer`` returning what the block returned) in place and returns a ``PatchReport``;
``register_experts_implementation(name="moe", backend="auto")`` (``experts_interface``) registers
moe_core as a transformers ``experts_implementation``, so that ``from_pretrained(...,
experts_implementation="moe")`` runs only the routed experts through a ``MoeRunner`` (routing and
shared experts stay transformers').

transformers 5.24 blocks behind ``@use_experts_implementation`` that are **not** converted, and why:

- AXK1MoE: an RMSNorm after the block (``post_mlp_layernorm``). AXK2MoE: dropped groups masked
  with ``0.0`` (differs from ``-inf`` for negative biased scores), optional groups.
- AfmoeSparseMoeBlock, Kolibri1, HYV3, Laguna, Inkling2(Loop), DeepseekV4: sigmoid top-k with a
  correction bias but no groups / other weight formulas (``route_scale``, logit-gather sigmoid,
  softcapped SwiGLU, hash routing) — expressible with new routing functions, not written yet;
  DeepseekV4, Glm5Next, HYV4, HYV4-VL: clamped SwiGLU without ``+1`` (no moe_core activation).
- Inkling: shared experts weighted by the router (``shared_gammas``). Beam: scaling after the
  experts, ``_apply_gate`` in float32. Cohere2Moe: ``average`` shared combination / sigmoid choice.
- Ernie4_5_VLMoe: modality-isolated (text and vision expert sets chosen per token by
  ``mm_token_type_ids``, the shared MLP in the outer block; the inner sparse block returns flattened
  ``(output, logits)``).
- MiniMaxM3VL: expressible (``swiglu_oai`` on ``[gate; up]``, M2's router, scaling after the experts)
  but its shared MLP is one fused ``gate_up_proj`` linear with an inline clamped SwiGLU, which
  ``read_shared_mlp`` does not read yet.
- Zaya: the router is an MLP (norm, two GELU layers) with state carried across layers and an extra
  "skip" expert.
- Gemma4, DiffusionGemma: no MoE block module; the decoder layer routes on an RMS-normed, scaled input,
  feeds the experts a differently normed input, applies per-expert scales and a post-norm.
- MuseSpark: a norm after each expert (``has_post_expert_norm``). NemotronH: no gate projection
  (``has_gate=False``). OpenAIPrivacyFilter: weights divided by ``top_k`` and the output multiplied
  back (expressible; not added).

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

Not converted (the caller must account for them): training-time router jitter
and sampling (Mixtral, PhiMoE: put the block in ``eval()``), and any
expert-parallel sharding (convert an unsharded block).

transformers itself is never imported here: the converters read the block's
attributes, so this module imports without transformers installed.
"""

from __future__ import annotations

from moe_core.integrations.transformers.experts_interface import register_experts_implementation
from moe_core.integrations.transformers.families import SUPPORTED_BLOCKS, find_moe_blocks, from_hf_block
from moe_core.integrations.transformers.patch import PatchedMoeBlock, PatchReport, patch_model
from moe_core.integrations.transformers.router import HFMoe, HFRouter

__all__ = [
    "SUPPORTED_BLOCKS",
    "HFMoe",
    "HFRouter",
    "PatchReport",
    "PatchedMoeBlock",
    "find_moe_blocks",
    "from_hf_block",
    "patch_model",
    "register_experts_implementation",
]
