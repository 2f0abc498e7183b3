"""Helpers for the moe-cutlass-fp4 tests (a uniquely named module, importable next to other packages' tests)."""

from __future__ import annotations

import pytest
import torch

from moe_core import MoeConfig, MoeProblem


def nvfp4_config(**kw) -> MoeConfig:
    fields = dict(num_experts=4, top_k=2, hidden_size=256, intermediate_size=128, quant_scheme="nvfp4")
    fields.update(kw)
    fields.setdefault("dtype", torch.bfloat16)
    return MoeConfig(**fields)


def on_cuda(**kw) -> MoeProblem:
    return MoeProblem(nvfp4_config(**kw), "cuda")


#: for tests that assert what THIS (GPU-less) machine answers; they skip where CUDA is real
#: (``bash tools/gpu.sh cutlass:check``)
no_cuda_here = pytest.mark.skipif(torch.cuda.is_available(), reason="asserts the answers of a machine without CUDA")
