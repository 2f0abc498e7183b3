"""SGLang's dispatch output -> the explicit top-k moe's runner takes, and moe's result -> SGLang's combine input.

SGLang's standard dispatcher hands a runner ``StandardDispatchOutput(hidden_states, hidden_states_scale,
topk_output)`` whose ``StandardTopKOutput`` holds ``topk_weights`` and ``topk_ids`` already mapped to this rank's
local experts (``-1``: an expert on another rank, which moe's contract gives zero). moe wants int32 ids and
float32 weights, so they are cast (no copy when they already are). The other top-k formats (triton_kernels'
packed routing, a bypassed top-k that leaves routing to a fused kernel) carry no explicit top-k to read.
"""

from __future__ import annotations

import torch


def explicit_topk(dispatch_output) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(hidden_states [M, H], topk_ids int32 [M, k], topk_weights float32 [M, k])`` of a standard dispatch."""
    from sglang.srt.layers.moe.token_dispatcher import DispatchOutputChecker
    from sglang.srt.layers.moe.topk import TopKOutputChecker

    if not DispatchOutputChecker.format_is_standard(dispatch_output):
        raise RuntimeError(
            f"moe-sglang reads SGLang's standard dispatch output only, got {dispatch_output.format}: "
            "run with --moe-a2a-backend none"
        )
    if dispatch_output.hidden_states_scale is not None:
        raise RuntimeError("moe-sglang got pre-quantized hidden states from the dispatcher; moe quantizes its own")
    topk = dispatch_output.topk_output
    if not TopKOutputChecker.format_is_standard(topk):
        raise RuntimeError(f"moe-sglang needs an explicit top-k (SGLang's standard format), got {topk.format}")
    topk_weights, topk_ids = topk.topk_weights, topk.topk_ids
    return dispatch_output.hidden_states, topk_ids.to(torch.int32), topk_weights.to(torch.float32)


def combine_input(output: torch.Tensor):
    """What SGLang's standard dispatcher combines: the routed experts' summed output ``[M, H]``."""
    from sglang.srt.layers.moe.token_dispatcher import StandardCombineInput

    return StandardCombineInput(hidden_states=output)
