"""Which converter takes which transformers MoE block: ``SUPPORTED_BLOCKS``, ``from_hf_block``, ``find_moe_blocks``.

The converters live by routing style: ``routed_softmax`` (softmax top-k, top-k softmax, SparseMixer),
``routed_grouped`` (DeepSeek's group-limited top-k), ``routed_sigmoid`` (Llama 4).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch

from moe_core.errors import InvalidInputError
from moe_core.integrations.transformers.routed_grouped import from_deepseek_v2, from_deepseek_v3
from moe_core.integrations.transformers.routed_sigmoid import from_llama4
from moe_core.integrations.transformers.routed_softmax import (
    from_gpt_oss,
    from_granite_moe,
    from_mixtral,
    from_phimoe,
    from_qwen2_moe,
    from_qwen3_moe,
)
from moe_core.integrations.transformers.router import HFMoe

__all__ = [
    "SUPPORTED_BLOCKS",
    "find_moe_blocks",
    "from_deepseek_v2",
    "from_deepseek_v3",
    "from_gpt_oss",
    "from_granite_moe",
    "from_hf_block",
    "from_llama4",
    "from_mixtral",
    "from_phimoe",
    "from_qwen2_moe",
    "from_qwen3_moe",
]

#: class name -> converter; ``from_hf_block`` matches the block's class or any base class.
SUPPORTED_BLOCKS: dict[str, Callable[..., HFMoe]] = {
    "MixtralSparseMoeBlock": from_mixtral,
    "Qwen3MoeSparseMoeBlock": from_qwen3_moe,
    "OlmoeSparseMoeBlock": from_qwen3_moe,
    "Qwen2MoeSparseMoeBlock": from_qwen2_moe,
    "GptOssMLP": from_gpt_oss,
    "DeepseekV3MoE": from_deepseek_v3,
    "DeepseekV32MoE": from_deepseek_v3,
    "BailingHybridMoE": from_deepseek_v3,
    "Glm4MoeMoE": from_deepseek_v3,
    "DeepseekV2Moe": from_deepseek_v2,
    "DeepseekOcr2TextMoe": from_deepseek_v2,
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
