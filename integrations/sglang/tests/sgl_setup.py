"""Building SGLang MoE layers on a CPU, as SGLang's own layer tests do, with nothing faked but the world size.

A ``FusedMoE`` reads SGLang's published runtime context (server arguments, parallel widths) and its TP group, so
``publish`` does what SGLang's ``sglang.test.layer_ut_utils.init_single_process_dist`` does (a world of one
process over gloo, model-parallel groups of size 1, the server arguments published) — that helper itself is not
imported because ``sglang.test.test_utils`` pulls in the benchmark datasets. ``initialize_moe_config`` then
seeds the MoE flags (runner backend, a2a backend) from the published arguments, as a scheduler process does.
"""

from __future__ import annotations

import os

import torch


def load_plugins() -> None:
    """SGLang's own plugin loading (entry-point group ``sglang.srt.plugins``), as its launcher does first."""
    from sglang.srt.plugins import load_plugins as sglang_load_plugins

    sglang_load_plugins()


def publish(moe_runner_backend: str = "auto", port: int = 29600, **server_args) -> None:
    """Publish ``ServerArgs`` with ``moe_runner_backend`` and build the single-process TP/EP groups (once)."""
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(port))
    from sglang.srt.distributed import parallel_state
    from sglang.srt.distributed.parallel_state import (
        init_distributed_environment,
        initialize_model_parallel,
        model_parallel_is_initialized,
    )
    from sglang.srt.layers.moe.utils import initialize_moe_config
    from sglang.srt.runtime_context import SpawnRanks, get_parallel, reset_context
    from sglang.srt.runtime_context import publish as sglang_publish
    from sglang.srt.server_args import ServerArgs

    if not torch.distributed.is_initialized():
        init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo")
    reset_context()
    args = ServerArgs(model_path="dummy", tp_size=1, ep_size=1, pp_size=1, moe_runner_backend=moe_runner_backend)
    for name, value in server_args.items():
        setattr(args, name, value)
    sglang_publish(args, role="test", ranks=SpawnRanks(world_rank=0))
    get_parallel().override_permanently(world_group=parallel_state._WORLD)
    if not model_parallel_is_initialized():
        initialize_model_parallel(backend="gloo")
    initialize_moe_config()


def use_runner_backend(name: str) -> None:
    """Switch ``--moe-runner-backend`` for layers built from now on, in a process ``publish`` set up (publishing
    again would reset the parallel groups its first call built)."""
    from sglang.srt.layers.moe.utils import get_flags, resolve_moe_runner_backend

    get_flags().moe.runner_backend = resolve_moe_runner_backend(name)


def fused_moe(e: int, h: int, i: int, top_k: int, dtype: torch.dtype, layer_id: int = 0, **kwargs):
    from sglang.srt.layers.moe.fused_moe_triton.layer import FusedMoE

    return FusedMoE(
        num_experts=e,
        hidden_size=h,
        intermediate_size=i,
        layer_id=layer_id,
        top_k=top_k,
        params_dtype=dtype,
        prefix=f"model.layers.{layer_id}.mlp.experts",
        **kwargs,
    )


def routing(m: int, e: int, top_k: int, seed: int = 0):
    """SGLang's ``StandardTopKOutput`` for ``m`` tokens: distinct experts per token, softmax weights."""
    from sglang.srt.layers.moe.topk import StandardTopKOutput

    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(m, e, generator=g)
    weights, ids = torch.topk(logits.softmax(-1), top_k)
    return StandardTopKOutput(weights.float(), ids.to(torch.int32), logits)
