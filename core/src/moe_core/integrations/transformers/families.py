"""Which converter takes which transformers MoE block: ``SUPPORTED_BLOCKS``, ``from_hf_block``, ``find_moe_blocks``.

The converters live by routing style: ``routed_softmax`` (softmax top-k, top-k softmax, SparseMixer),
``routed_grouped`` (DeepSeek's group-limited top-k, Mistral 4), ``routed_sigmoid`` (Llama 4; sigmoid top-k).

Blocks whose experts hold a quantized checkpoint's own tensors (gpt-oss's MXFP4: ``Mxfp4GptOssExperts``) are
matched first, in ``MXFP4_CHECKPOINT_BLOCKS``: their converter ``from_gpt_oss_mxfp4`` returns ``mxfp4`` weights
made of the checkpoint's bytes (``checkpoint_scheme(block)`` says which blocks those are).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch

from moe_core import routing
from moe_core.config import MoeConfig
from moe_core.errors import InvalidInputError
from moe_core.integrations.transformers.experts import first_attr, require_attr
from moe_core.integrations.transformers.mxfp4_checkpoint import holds_mxfp4_checkpoint, read_mxfp4_experts
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
from moe_core.integrations.transformers.router import HFMoe, HFRouter
from moe_core.weights import validate_weights

__all__ = [
    "MXFP4_CHECKPOINT_BLOCKS",
    "SUPPORTED_BLOCKS",
    "checkpoint_scheme",
    "find_moe_blocks",
    "from_aria",
    "from_deepseek_v2",
    "from_deepseek_v3",
    "from_dots3_note_vision",
    "from_ernie4_5_moe",
    "from_flint",
    "from_gpt_oss",
    "from_gpt_oss_mxfp4",
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


def from_gpt_oss_mxfp4(block, dtype: torch.dtype = torch.float32) -> HFMoe:
    """A gpt-oss block whose experts hold its MXFP4 checkpoint tensors -> ``HFMoe`` with ``quant_scheme="mxfp4"``.

    Blocks: transformers 5.24's ``Mxfp4GptOssMLP`` (what ``from_pretrained`` of an MXFP4 gpt-oss checkpoint with
    ``Mxfp4Config(dequantize=False)`` puts in place of ``GptOssMLP``), or a ``GptOssMLP`` whose ``experts`` is an
    ``Mxfp4GptOssExperts`` (transformers 4.55-4.57 swapped only the experts). The weights are the checkpoint's
    bytes and scales, de-interleaved into canonical order (``mxfp4_checkpoint.read_mxfp4_experts``), with the biases in
    ``dtype`` — the activation dtype, ``config.dtype`` (``patch_model`` passes the router's dtype: the module's
    biases are float32 whatever the model's dtype). Routing as ``from_gpt_oss``: top-k of the biased router
    logits, softmax over the k. Activation ``swiglu_oai`` with the experts' ``alpha`` / ``limit``: *not probed*
    here — the module has no gate function to call (its forward is triton_kernels' fused ``swiglu``, the same
    clamped ``(up + 1) * gate * sigmoid(alpha * gate)`` of interleaved gate/up columns that ``GptOssExperts``
    computes and ``from_gpt_oss`` probes).
    """
    router_mod = require_attr(block, "router", what="router")
    top_k = int(first_attr((router_mod, block), "top_k", "experts per token"))
    experts = require_attr(block, "experts", what="the routed experts")
    weights, form = read_mxfp4_experts(experts, dtype)
    config_of = getattr(experts, "config", None)
    alpha = float(getattr(experts, "alpha", None) or getattr(config_of, "swiglu_alpha", None) or 1.702)
    limit = float(getattr(experts, "limit", None) or getattr(config_of, "swiglu_limit", None) or 7.0)
    e, two_i, _ = weights.w13.shape
    h = weights.w2.shape[1]
    router = HFRouter(
        require_attr(router_mod, "weight", what="router weight"),
        getattr(router_mod, "bias", None),
        routing.SoftmaxTopK(int(top_k)),
    )
    if router.num_experts != e or router.hidden_size != h:
        raise InvalidInputError(
            f"gpt-oss MXFP4: router weight is [{router.num_experts}, {router.hidden_size}] but the experts ({form}) "
            f"are E={e}, H={h}"
        )
    config = MoeConfig(
        num_experts=e,
        top_k=top_k,
        hidden_size=h,
        intermediate_size=two_i // 2,
        quant_scheme="mxfp4",
        activation="swiglu_oai",
        dtype=dtype,
        has_bias=True,
        swiglu_alpha=alpha,
        swiglu_limit=limit,
    )
    validate_weights(config, weights)
    return HFMoe(config, weights, router, None)


#: blocks whose experts hold gpt-oss's MXFP4 checkpoint tensors (``holds_mxfp4_checkpoint``) -> converter;
#: matched before ``SUPPORTED_BLOCKS`` (a ``GptOssMLP`` with such experts goes here, not to ``from_gpt_oss``)
MXFP4_CHECKPOINT_BLOCKS: dict[str, Callable[..., HFMoe]] = {
    "Mxfp4GptOssMLP": from_gpt_oss_mxfp4,
    "GptOssMLP": from_gpt_oss_mxfp4,
}


def _by_class(module, table: dict[str, Callable[..., HFMoe]]) -> Callable[..., HFMoe] | None:
    for cls in type(module).__mro__:
        converter = table.get(cls.__name__)
        if converter is not None:
            return converter
    return None


def checkpoint_scheme(block) -> str | None:
    """``"mxfp4"`` when ``block`` is converted from its quantized checkpoint's own tensors (a gpt-oss block whose
    experts hold MXFP4 checkpoint tensors: ``from_gpt_oss_mxfp4``), else ``None``."""
    if _by_class(block, MXFP4_CHECKPOINT_BLOCKS) and holds_mxfp4_checkpoint(getattr(block, "experts", None)):
        return "mxfp4"
    return None


def converter_of(module) -> Callable[..., HFMoe] | None:
    """The converter ``from_hf_block`` uses for ``module`` (MXFP4 checkpoint blocks first), or ``None``."""
    if checkpoint_scheme(module) is not None:
        return _by_class(module, MXFP4_CHECKPOINT_BLOCKS)
    return _by_class(module, SUPPORTED_BLOCKS)


def from_hf_block(block, dtype: torch.dtype = torch.float32, **kwargs) -> HFMoe:
    """Convert any supported transformers MoE block, chosen by its class name (or a base class's).

    ``kwargs`` go to the converter (``shared_mlp=`` for GraniteMoeShared's layer-level shared MLP). A gpt-oss
    block whose experts hold MXFP4 checkpoint tensors goes to ``from_gpt_oss_mxfp4`` (``mxfp4`` weights from the
    checkpoint's bytes; ``dtype`` is then the activation dtype).
    """
    converter = converter_of(block)
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
        if converter_of(module) is not None:
            skip.append(name)
            yield name, module
