"""Random layers and inputs for ``moe run``, ``moe bench``, tests and examples.

Weights are scaled by 1/sqrt(fan_in) so activations stay O(1) through both
GEMMs at any shape (errors are then comparable across presets). Routing picks
``top_k`` distinct experts per token uniformly at random, which is what the
benchmark tables of vLLM and SGLang assume (``balanced_routing``: evenly).
"""

from __future__ import annotations

import torch

from moe_core.config import MoeConfig
from moe_core.weights import MoeWeights


def random_canonical_weights(
    config: MoeConfig, device="cpu", seed: int = 0, dtype: torch.dtype | None = None
) -> MoeWeights:
    """Unquantized canonical weights (``dtype`` defaults to the config's dtype).

    Drawn on ``device`` itself (a CPU draw of a 100-GB-class layer would take
    minutes), so the same seed gives different values on CPU and CUDA.
    """
    device = torch.device(device)
    gen = torch.Generator(device=device).manual_seed(seed)
    e, h, i = config.num_experts, config.hidden_size, config.intermediate_size
    dtype = dtype or config.dtype

    def draw(*shape, scale):
        return (torch.randn(*shape, generator=gen, device=device) * scale).to(dtype)

    w = MoeWeights(w13=draw(e, 2 * i, h, scale=h**-0.5), w2=draw(e, h, i, scale=i**-0.5))
    if config.has_bias:
        w.b13 = draw(e, 2 * i, scale=0.1)
        w.b2 = draw(e, h, scale=0.1)
    return w


def random_weights(config: MoeConfig, device="cpu", seed: int = 0) -> MoeWeights:
    """Random weights in the config's quant scheme (quantized from bf16 draws)."""
    if not config.scheme.quantized:
        return random_canonical_weights(config, device, seed)
    from moe_core.quant import quantize_weights

    dense = random_canonical_weights(config, device, seed, dtype=torch.bfloat16)
    if dense.b13 is not None:
        dense.b13, dense.b2 = dense.b13.to(config.dtype), dense.b2.to(config.dtype)
    return quantize_weights(dense, config.quant_scheme)


def random_routing(
    num_tokens: int, num_experts: int, top_k: int, device="cpu", seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """``top_k`` distinct experts per token, uniform; weights softmax-normalised."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    scores = torch.rand(num_tokens, num_experts, generator=gen)
    ids = scores.topk(top_k, dim=1).indices
    weights = torch.softmax(torch.randn(num_tokens, top_k, generator=gen), dim=1)
    return ids.to(device=device, dtype=torch.int32), weights.to(device=device, dtype=torch.float32)


def balanced_routing(
    num_tokens: int, num_experts: int, top_k: int, device="cpu", seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """``top_k`` distinct experts per token, each expert taking exactly ``num_tokens * top_k / num_experts``
    pairs where ``num_tokens`` is a multiple of ``num_experts`` (else within ``top_k`` of that); weights as
    ``random_routing``'s.

    Why: the same forward on this routing and on ``random_routing`` shows what the blocks padded for uneven
    expert loads cost, since here every expert's rows fill its blocks as evenly as they can."""
    if not 0 < top_k <= num_experts:
        raise ValueError(f"top_k={top_k} must be in [1, num_experts={num_experts}]")
    token = torch.arange(num_tokens)[:, None]
    slot = torch.arange(top_k)[None, :]
    ids = (token + slot * (num_experts // top_k)) % num_experts  # the k offsets are distinct modulo E
    gen = torch.Generator(device="cpu").manual_seed(seed)
    weights = torch.softmax(torch.randn(num_tokens, top_k, generator=gen), dim=1)
    return ids.to(device=device, dtype=torch.int32), weights.to(device=device, dtype=torch.float32)


def random_inputs(config: MoeConfig, num_tokens: int, device="cpu", seed: int = 1):
    """(hidden_states, topk_ids, topk_weights) for a forward of ``num_tokens``."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    x = torch.randn(num_tokens, config.hidden_size, generator=gen).to(device=device, dtype=config.dtype)
    ids, weights = random_routing(num_tokens, config.num_experts, config.top_k, device, seed + 1)
    return x, ids, weights
