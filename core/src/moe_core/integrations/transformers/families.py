"""Which converter takes which transformers MoE block: ``SUPPORTED_BLOCKS``, ``from_hf_block``, ``find_moe_blocks``.

The converters live by routing style: ``routed_softmax`` (softmax top-k, top-k softmax, SparseMixer),
``routed_grouped`` (DeepSeek's group-limited top-k, Mistral 4), ``routed_sigmoid`` (Llama 4; sigmoid top-k).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch

from moe_core.errors import InvalidInputError
from moe_core.integrations.transformers.routed_grouped import from_deepseek_v2, from_deepseek_v3, from_mistral4
from moe_core.integrations.transformers.routed_sigmoid import (
    from_dots3_note_vision,
    from_flint,
    from_lfm2_moe,
    from_llama4,
    from_minimax_m2,
)
from moe_core.integrations.transformers.routed_softmax import (
    from_aria,
    from_ernie4_5_moe,
    from_gpt_oss,
    from_granite_moe,
    from_hunyuan_v1_moe,
    from_jamba,
    from_lara_mini,
    from_mixtral,
    from_phimoe,
    from_qwen2_moe,
    from_qwen3_moe,
    from_qwen3_vl_moe,
)
from moe_core.integrations.transformers.router import HFMoe

__all__ = [
    "SUPPORTED_BLOCKS",
    "find_moe_blocks",
    "from_aria",
    "from_deepseek_v2",
    "from_deepseek_v3",
    "from_dots3_note_vision",
    "from_ernie4_5_moe",
    "from_flint",
    "from_gpt_oss",
    "from_granite_moe",
    "from_hf_block",
    "from_hunyuan_v1_moe",
    "from_jamba",
    "from_lara_mini",
    "from_lfm2_moe",
    "from_llama4",
    "from_minimax_m2",
    "from_mistral4",
    "from_mixtral",
    "from_phimoe",
    "from_qwen2_moe",
    "from_qwen3_moe",
    "from_qwen3_vl_moe",
]

#: class name -> converter; ``from_hf_block`` matches the block's class or any base class.
SUPPORTED_BLOCKS: dict[str, Callable[..., HFMoe]] = {
    "MixtralSparseMoeBlock": from_mixtral,
    "MiniMaxSparseMoeBlock": from_mixtral,
    "Qwen3MoeSparseMoeBlock": from_qwen3_moe,
    "OlmoeSparseMoeBlock": from_qwen3_moe,
    "FlexOlmoSparseMoeBlock": from_qwen3_moe,
    "MellumSparseMoeBlock": from_qwen3_moe,
    "Qwen3OmniMoeThinkerTextSparseMoeBlock": from_qwen3_moe,
    "Qwen3VLMoeTextSparseMoeBlock": from_qwen3_vl_moe,
    "Qwen3_5MoeSparseMoeBlock": from_qwen3_vl_moe,
    "Qwen2MoeSparseMoeBlock": from_qwen2_moe,
    "Qwen3NextSparseMoeBlock": from_qwen2_moe,
    "Qwen3OmniMoeTalkerTextSparseMoeBlock": from_qwen2_moe,
    "Qwen4ExpTextSparseMoeBlock": from_qwen2_moe,
    "JambaSparseMoeBlock": from_jamba,
    "LaraMiniSparseMoeBlock": from_lara_mini,
    "HunYuanMoEV1Moe": from_hunyuan_v1_moe,
    "AriaTextMoELayer": from_aria,
    "Ernie4_5_MoeSparseMoeBlock": from_ernie4_5_moe,
    "GptOssMLP": from_gpt_oss,
    "DeepseekV3MoE": from_deepseek_v3,
    "DeepseekV32MoE": from_deepseek_v3,
    "BailingHybridMoE": from_deepseek_v3,
    "Glm4MoeMoE": from_deepseek_v3,
    "Glm4MoeLiteMoE": from_deepseek_v3,
    "Glm4vMoeTextMoE": from_deepseek_v3,
    "GlmMoeDsaMoE": from_deepseek_v3,
    "KimiLinearMoE": from_deepseek_v3,
    "Dots1MoE": from_deepseek_v3,
    "Dots3NoteTextMoE": from_deepseek_v3,
    "ExaoneMoeSparseMoEBlock": from_deepseek_v3,
    "SolarOpenMoE": from_deepseek_v3,
    "MiMoV2FlashMoE": from_deepseek_v3,
    "DeepseekV2Moe": from_deepseek_v2,
    "DeepseekOcr2TextMoe": from_deepseek_v2,
    "UnlimitedOcrTextMoe": from_deepseek_v2,
    "Mistral4MoE": from_mistral4,
    "MistralLarge4TextMoE": from_mistral4,
    "MiniMaxM2SparseMoeBlock": from_minimax_m2,
    "Dots3NoteVisionMoE": from_dots3_note_vision,
    "FlintSparseMoeBlock": from_flint,
    "Lfm2MoeSparseMoeBlock": from_lfm2_moe,
    "Llama4TextMoe": from_llama4,
    "PhimoeSparseMoeBlock": from_phimoe,
    "GraniteMoeMoE": from_granite_moe,
    "GraniteMoeSharedMoE": from_granite_moe,
    "GraniteMoeSWAMoE": from_granite_moe,
    "GraniteMoeHybridMoE": from_granite_moe,
}


def _converter(module) -> Callable[..., HFMoe] | None:
    for cls in type(module).__mro__:
        converter = SUPPORTED_BLOCKS.get(cls.__name__)
        if converter is not None:
            return converter
    return None


def from_hf_block(block, dtype: torch.dtype = torch.float32, **kwargs) -> HFMoe:
    """Convert any supported transformers MoE block, chosen by its class name (or a base class's).

    ``kwargs`` go to the converter (``shared_mlp=`` for GraniteMoeShared's layer-level shared MLP).
    """
    converter = _converter(block)
    if converter is None:
        raise InvalidInputError(
            f"no converter for {type(block).__name__}; supported transformers MoE blocks: {', '.join(SUPPORTED_BLOCKS)}"
        )
    return converter(block, dtype=dtype, **kwargs)


def find_moe_blocks(model: torch.nn.Module) -> Iterator[tuple[str, torch.nn.Module]]:
    """``(qualified name, block)`` for every module of ``model`` that ``from_hf_block`` converts, in
    ``named_modules`` order (a supported block's own submodules are not searched)."""
    skip: list[str] = []
    for name, module in model.named_modules():
        if any(name.startswith(prefix + ".") for prefix in skip):
            continue
        if _converter(module) is not None:
            skip.append(name)
            yield name, module
