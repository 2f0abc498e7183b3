"""Tiny transformers configs of the MoE families covered since transformers 5.24's hooked blocks were reviewed,
shared by ``test_transformers_families`` (one layer, the block alone) and ``test_transformers_patch`` (whole
models): config overrides on top of each file's ``BASE`` (hidden 64, vocab 128, 4 heads, 2 KV heads).
Per-layer lists (``layer_types``, ``mlp_layer_types``) are written for one layer.
"""

from __future__ import annotations

#: what every tiny config shares: hidden 64, vocab 128, 4 heads, 2 KV heads (each file adds layers and the rest)
TINY = dict(hidden_size=64, vocab_size=128, num_attention_heads=4, num_key_value_heads=2)
#: whole models: two layers, and an initialisation wide enough that the experts move the logits
TINY_MODEL = dict(TINY, num_hidden_layers=2, initializer_range=0.1)

_MLA = dict(kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8, num_key_value_heads=4)
_DEEPSEEK = dict(intermediate_size=64, moe_intermediate_size=32, n_routed_experts=8, num_experts_per_tok=2)
#: DeepSeek-V3-style routers with groups (a clone's config names the expert count num_local_experts or n_routed_experts)
_GROUPS = dict(n_shared_experts=1, first_k_dense_replace=0, n_group=4, topk_group=2, routed_scaling_factor=2.5)
_QWEN = dict(intermediate_size=64, moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2)
_SHARED = dict(_QWEN, shared_expert_intermediate_size=48)
_FULL = dict(layer_types=["full_attention"])
_SPARSE = dict(mlp_layer_types=["sparse"])

#: model_type -> (config overrides, the block class, has shared experts)
NEW_CASES = {
    "qwen3_next": (dict(_SHARED, **_FULL, head_dim=16), "Qwen3NextSparseMoeBlock", True),
    "qwen3_vl_moe_text": (dict(_QWEN, head_dim=16), "Qwen3VLMoeTextSparseMoeBlock", False),
    "qwen3_omni_moe_text": (dict(_QWEN, head_dim=16), "Qwen3OmniMoeThinkerTextSparseMoeBlock", False),
    "qwen3_omni_moe_talker_text": (dict(_SHARED, head_dim=16), "Qwen3OmniMoeTalkerTextSparseMoeBlock", True),
    "qwen3_5_moe_text": (dict(_SHARED, **_FULL, head_dim=16), "Qwen3_5MoeSparseMoeBlock", True),
    "qwen4_exp_text": (dict(_SHARED, **_FULL, head_dim=16, norm_topk_prob=False), "Qwen4ExpTextSparseMoeBlock", True),
    "flex_olmo": (
        dict(intermediate_size=32, num_experts=8, num_experts_per_tok=2, pad_token_id=0),
        "FlexOlmoSparseMoeBlock",
        False,
    ),
    "mellum": (dict(_QWEN, head_dim=16), "MellumSparseMoeBlock", False),
    "lara_mini": (dict(_SHARED, **_FULL, head_dim=16, norm_topk_prob=False), "LaraMiniSparseMoeBlock", True),
    "minimax": (
        dict(intermediate_size=32, num_local_experts=4, num_experts_per_tok=2, **_FULL),
        "MiniMaxSparseMoeBlock",
        False,
    ),
    "jamba": (
        dict(intermediate_size=32, num_experts=4, num_experts_per_tok=2, expert_layer_period=1, expert_layer_offset=0),
        "JambaSparseMoeBlock",
        False,
    ),
    "hunyuan_v1_moe": (dict(intermediate_size=32, num_experts=8, moe_topk=2, head_dim=16), "HunYuanMoEV1Moe", True),
    "aria_text": (
        dict(intermediate_size=32, moe_num_experts=8, moe_topk=2, moe_num_shared_experts=2),
        "AriaTextMoELayer",
        True,
    ),
    "ernie4_5_moe": (
        dict(_QWEN, moe_num_shared_experts=1, moe_layer_start_index=0, moe_layer_interval=1),
        "Ernie4_5_MoeSparseMoeBlock",
        True,
    ),
    "minimax_m2": (
        dict(intermediate_size=32, num_local_experts=8, num_experts_per_tok=2, head_dim=16),
        "MiniMaxM2SparseMoeBlock",
        False,
    ),
    "flint": (dict(_SHARED, head_dim=16, mlp_only_layers=[]), "FlintSparseMoeBlock", True),
    "lfm2_moe": (
        dict(_QWEN, num_dense_layers=0, use_expert_bias=True, routed_scaling_factor=1.5, **_FULL),
        "Lfm2MoeSparseMoeBlock",
        False,
    ),
    "glm4_moe_lite": (dict(_DEEPSEEK, **_MLA, **_GROUPS, **_SPARSE, q_lora_rank=None), "Glm4MoeLiteMoE", True),
    "glm4v_moe_text": (dict(_DEEPSEEK, **_GROUPS, head_dim=16), "Glm4vMoeTextMoE", True),
    "glm_moe_dsa": (dict(_DEEPSEEK, **_MLA, **_GROUPS, q_lora_rank=32), "GlmMoeDsaMoE", True),
    "kimi_linear": (
        dict(_DEEPSEEK, **_MLA, **_GROUPS, **_FULL, q_lora_rank=None, pad_token_id=0),
        "KimiLinearMoE",
        True,
    ),
    "dots1": (dict(_DEEPSEEK, **_GROUPS, head_dim=16), "Dots1MoE", True),
    "dots3_note_text": (dict(_DEEPSEEK, **_MLA, **_GROUPS, q_lora_rank=32, pad_token_id=0), "Dots3NoteTextMoE", True),
    "dots3_note_vision_encoder": (
        dict(adapter_in_dim=64, moe_intermediate_size=32, pyramid_num_routed=[8], router_scaling_factor=1.5),
        "Dots3NoteVisionMoE",
        False,
    ),
    "exaone_moe": (
        dict(_QWEN, num_shared_experts=1, first_k_dense_replace=0, n_group=4, topk_group=2, head_dim=16),
        "ExaoneMoeSparseMoEBlock",
        True,
    ),
    "solar_open": (dict(_DEEPSEEK, **_GROUPS, head_dim=16), "SolarOpenMoE", True),
    "mimo_v2_flash": (dict(_DEEPSEEK, **_GROUPS, **_SPARSE, head_dim=16, v_head_dim=16), "MiMoV2FlashMoE", False),
    "mistral4": (dict(_DEEPSEEK, **_MLA, **_GROUPS, q_lora_rank=32), "Mistral4MoE", True),
    "mistral_large4_text": (dict(_DEEPSEEK, **_MLA, **_GROUPS, q_lora_rank=32), "MistralLarge4TextMoE", True),
    "unlimited_ocr_text": (
        dict(_DEEPSEEK, **_MLA, **_GROUPS, topk_method="group_limited_greedy", q_lora_rank=None),
        "UnlimitedOcrTextMoe",
        True,
    ),
}


#: model_type -> (config overrides, the block class, has shared experts): the blocks covered first
FIRST_CASES = {
    "qwen2_moe": (
        dict(
            intermediate_size=64,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=48,
            num_experts=8,
            num_experts_per_tok=2,
            norm_topk_prob=False,
        ),
        "Qwen2MoeSparseMoeBlock",
        True,
    ),
    "olmoe": (dict(intermediate_size=32, num_experts=8, num_experts_per_tok=2), "OlmoeSparseMoeBlock", False),
    "deepseek_v2": (
        dict(
            **_DEEPSEEK,
            **_MLA,
            n_shared_experts=2,
            first_k_dense_replace=0,
            topk_method="group_limited_greedy",
            n_group=4,
            topk_group=2,
            routed_scaling_factor=1.5,
            q_lora_rank=None,
        ),
        "DeepseekV2Moe",
        True,
    ),
    "deepseek_v2_greedy": (
        dict(**_DEEPSEEK, **_MLA, n_shared_experts=1, first_k_dense_replace=0, topk_method="greedy", q_lora_rank=None),
        "DeepseekV2Moe",
        True,
    ),
    "deepseek_v3": (
        dict(
            **_DEEPSEEK,
            **_MLA,
            n_shared_experts=1,
            first_k_dense_replace=0,
            n_group=4,
            topk_group=2,
            routed_scaling_factor=2.5,
            q_lora_rank=32,
        ),
        "DeepseekV3MoE",
        True,
    ),
    "deepseek_v32": (
        dict(**_DEEPSEEK, **_MLA, n_shared_experts=1, first_k_dense_replace=0, n_group=4, topk_group=2, q_lora_rank=32),
        "DeepseekV32MoE",
        True,
    ),
    "bailing_hybrid": (
        dict(
            intermediate_size=64,
            moe_intermediate_size=32,
            num_experts=8,
            num_experts_per_tok=2,
            n_shared_experts=1,
            first_k_dense_replace=0,
            n_group=4,
            topk_group=2,
            pad_token_id=0,
        ),
        "BailingHybridMoE",
        True,
    ),
    "glm4_moe": (
        dict(**_DEEPSEEK, n_shared_experts=1, first_k_dense_replace=0, n_group=4, topk_group=2, head_dim=16),
        "Glm4MoeMoE",
        True,
    ),
    "llama4_text": (
        dict(
            intermediate_size=32,
            intermediate_size_mlp=64,
            num_local_experts=4,
            num_experts_per_tok=1,
            interleave_moe_layer_step=1,
            head_dim=16,
        ),
        "Llama4TextMoe",
        True,
    ),
    "phimoe": (dict(intermediate_size=32, num_local_experts=4, num_experts_per_tok=2), "PhimoeSparseMoeBlock", False),
    "granitemoe": (dict(intermediate_size=32, num_local_experts=4, num_experts_per_tok=2), "GraniteMoeMoE", False),
    "granitemoeshared": (
        dict(intermediate_size=32, shared_intermediate_size=48, num_local_experts=4, num_experts_per_tok=2),
        "GraniteMoeSharedMoE",
        True,
    ),
    "granitemoe_swa": (
        dict(intermediate_size=32, num_local_experts=4, num_experts_per_tok=2),
        "GraniteMoeSWAMoE",
        False,
    ),
    "granitemoehybrid": (
        dict(
            intermediate_size=32,
            shared_intermediate_size=48,
            num_local_experts=4,
            num_experts_per_tok=2,
            layer_types=["attention"],
        ),
        "GraniteMoeHybridMoE",
        True,
    ),
    "mixtral": (dict(intermediate_size=32, num_local_experts=4, num_experts_per_tok=2), "MixtralSparseMoeBlock", False),
    "qwen3_moe": (
        dict(intermediate_size=64, moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2, head_dim=16),
        "Qwen3MoeSparseMoeBlock",
        False,
    ),
}
#: every covered family's tiny config (``_greedy`` suffix: a second routing method of the same model type)
FAMILY_CASES = {**FIRST_CASES, **NEW_CASES}
