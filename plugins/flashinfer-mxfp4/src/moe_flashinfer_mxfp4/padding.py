"""Zero padding of hidden and intermediate sizes to FlashInfer's 128 multiples (gpt-oss: 2880 -> 2944).

FlashInfer's MXFP4 kernels fold scales in 64-row x 128-K blocks (SM90) and
tile rows by 128 (SM100), so both GEMM dimensions must be multiples of 128;
gpt-oss-120b's 2880 is not. As serving engines do for this model, the
prepared weights are padded once with zeros (E2M1 code 0 is +0.0, whatever
the block scale; padded scales are UE8M0 127 = 1.0) and zero biases: a padded
intermediate channel has gate = up = 0, and both gated activations map that
to 0 (``silu(0) * 0``; gpt-oss's ``min(g, l) * sigmoid(a * min(g, l)) * (u + 1)``
is 0 at g = 0), so it adds nothing; padded hidden columns of the input are
zero and the padded output columns are cut off. The cost is one copy of the
input into a padded buffer and one of the output back, per forward.
"""

from __future__ import annotations

import dataclasses

import torch

from moe_core.config import MoeConfig
from moe_core.weights import MoeWeights

ALIGN = 128
GROUP = 32
#: UE8M0 byte of 2**0
UNIT_SCALE = 127


def padded(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def needs_padding(config: MoeConfig) -> bool:
    return padded(config.hidden_size) != config.hidden_size or padded(config.intermediate_size) != (
        config.intermediate_size
    )


def padded_config(config: MoeConfig) -> MoeConfig:
    return dataclasses.replace(
        config, hidden_size=padded(config.hidden_size), intermediate_size=padded(config.intermediate_size)
    )


def _pad(t: torch.Tensor, sizes: tuple[int, ...], value: int | float = 0) -> torch.Tensor:
    out = torch.full(sizes, value, dtype=t.dtype, device=t.device)
    out[tuple(slice(0, s) for s in t.shape)] = t
    return out


def _pad_gated_rows(t: torch.Tensor, inter_p: int, cols: tuple[int, ...], value) -> torch.Tensor:
    """[E, 2I, *c] in [gate; up] order -> [E, 2Ip, *cols], each half padded on its own."""
    e, two_i = t.shape[:2]
    halves = t.reshape(e, 2, two_i // 2, *t.shape[2:])
    return _pad(halves, (e, 2, inter_p, *cols), value).reshape(e, 2 * inter_p, *cols)


def pad_weights(config: MoeConfig, weights: MoeWeights) -> MoeWeights:
    """Canonical mxfp4 weights of ``config`` -> the same layer at the padded sizes (identity if aligned)."""
    if not needs_padding(config):
        return weights
    e, h, i = config.num_experts, config.hidden_size, config.intermediate_size
    hp, ip = padded(h), padded(i)
    return MoeWeights(
        w13=_pad_gated_rows(weights.w13, ip, (hp // 2,), 0),
        w13_scale=_pad_gated_rows(weights.w13_scale, ip, (hp // GROUP,), UNIT_SCALE),
        w2=_pad(weights.w2, (e, hp, ip // 2)),
        w2_scale=_pad(weights.w2_scale, (e, hp, ip // GROUP), UNIT_SCALE),
        b13=None if weights.b13 is None else _pad_gated_rows(weights.b13, ip, (), 0),
        b2=None if weights.b2 is None else _pad(weights.b2, (e, hp)),
    )


def pad_input(x: torch.Tensor, hidden_p: int) -> torch.Tensor:
    if x.shape[1] == hidden_p:
        return x
    out = x.new_zeros(x.shape[0], hidden_p)
    out[:, : x.shape[1]] = x
    return out
