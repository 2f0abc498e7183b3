"""When the GEMMs read tiles through tensor descriptors (``GemmConfig.tma``), and the scratch they need.

A descriptor built inside a kernel (``tl.make_tensor_descriptor``) describes a K-contiguous matrix whose
row stride and base are 16-byte aligned; the GEMMs build one over all experts' weights as ``[E * N, K]``,
so the experts must be stored back to back. The float schemes and fp8_block qualify; mxfp4's packed
chunks do not take this path. On CUDA it needs an SM90+ GPU (the tensor memory accelerator) and Triton
writes each program's descriptor into global scratch that its launcher asks Triton's allocator for: the
process gets one (``ensure_allocator``, a torch allocation on the launch's stream) unless the
application set its own. On the CPU the kernels run in Triton's interpreter, which reads descriptors
without scratch, so the path is tested there too.
"""

from __future__ import annotations

import functools

import torch
import triton

try:  # Triton's own record of the allocator (3.4-3.6); another layout: ours is set when none is known
    from triton.runtime import _allocation
except ImportError:  # pragma: no cover
    _allocation = None

#: the schemes whose weight tiles may come through a descriptor
SCHEMES = frozenset({"fp32", "bf16", "fp16", "fp8_block"})


def rows_ok(t: torch.Tensor) -> bool:
    """Whether a descriptor can describe ``t`` as a K-contiguous matrix of its rows (the last axis; all
    leading axes folded into rows, which needs them stored back to back)."""
    if not t.is_contiguous() or t.data_ptr() % 16:
        return False
    return (t.shape[-1] * t.element_size()) % 16 == 0


def applies(requested: bool, scheme: str, weight: torch.Tensor) -> bool:
    """Whether a GEMM asked for ``tma`` reads ``weight`` through a descriptor: a scheme of ``SCHEMES``,
    ``rows_ok`` weights, and the interpreter or an SM90+ GPU."""
    if not requested or scheme not in SCHEMES or not rows_ok(weight):
        return False
    if weight.device.type == "cuda":
        if not _sm90(weight.device):
            return False
        ensure_allocator()
        return True
    return weight.device.type == "cpu"


@functools.cache
def _sm90(device: torch.device) -> bool:
    return torch.cuda.get_device_capability(device) >= (9, 0)


def _scratch(size: int, alignment: int, stream) -> torch.Tensor:
    """Triton's allocator protocol: ``size`` bytes on the current device (torch's blocks are 512-byte
    aligned, above any alignment Triton asks for); inside a CUDA-graph capture they come from the graph's
    pool, as the forward's other buffers do."""
    return torch.empty(size, dtype=torch.int8, device="cuda")


def ensure_allocator() -> None:
    """Give Triton ``_scratch`` as its allocator unless one is set in this context (Triton's default
    raises at the launch of a kernel that needs scratch). Triton keeps the allocator in a context
    variable, so each thread that launches gets its own check."""
    try:
        current = _allocation._allocator.get()
        unset = isinstance(current, _allocation.NullAllocator)
    except AttributeError:
        current, unset = None, True
    if current is not _scratch and unset:
        triton.set_allocator(_scratch)
