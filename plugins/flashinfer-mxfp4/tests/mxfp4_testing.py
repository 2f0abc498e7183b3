"""Helpers for the moe-flashinfer-mxfp4 tests: small mxfp4 layers, signature-binding stand-ins."""

from __future__ import annotations

import pytest
import torch

from moe_core import MoeConfig, MoeProblem
from moe_core.synthetic import random_weights


def config(**kw) -> MoeConfig:
    base = dict(
        num_experts=4,
        top_k=2,
        hidden_size=256,
        intermediate_size=128,
        quant_scheme="mxfp4",
        activation="silu",
        dtype=torch.bfloat16,
    )
    base.update(kw)
    return MoeConfig(**base)


def cuda_problem(**kw) -> MoeProblem:
    return MoeProblem(config(**kw), torch.device("cuda"))


def weights(cfg: MoeConfig, seed: int = 0):
    return random_weights(cfg, "cpu", seed=seed)


def bound(real, impl=None, calls: list | None = None):
    """A stand-in for FlashInfer function ``real`` that first binds its arguments to ``real``'s signature.

    So every call the plugin makes is checked against the installed
    FlashInfer's real parameter names; ``impl`` (default: ``real`` itself)
    computes the result, ``calls`` records the bound arguments.
    """
    import inspect

    signature = inspect.signature(real)

    def stand_in(*args, **kwargs):
        arguments = signature.bind(*args, **kwargs).arguments
        if calls is not None:
            calls.append(dict(arguments))
        return (impl or real)(*args, **kwargs)

    return stand_in


#: for tests that assert what THIS (GPU-less) machine answers; they skip where CUDA is real
#: (``bash tools/gpu.sh flashinfer:check``)
no_cuda_here = pytest.mark.skipif(torch.cuda.is_available(), reason="asserts the answers of a machine without CUDA")
