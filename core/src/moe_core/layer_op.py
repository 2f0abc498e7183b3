"""A ``MoeLayer``'s forward as one opaque ``torch.library`` op for ``torch.compile``: ``moe::layer``.

Why: traced by Dynamo, a layer's forward is the router's ops, the runner's checks and a backend's launches
spread through the caller's compiled graph. The backend's code must then be traceable (a third-party
backend that reads a value on the host breaks the graph; so does the CPU id check), and the layer cannot
replay its own CUDA graphs (``moe_core.graphs``: nothing is captured while Dynamo traces), so a compiled
model pays every launch on the host at decode — slower than the same model eager. As one op the compiled
graph calls the layer exactly as eager code does: its checks, its backend, its graphs; compiling a model
whose experts run through any backend then traces nothing of that backend, and ``fullgraph=True`` holds.

The op takes the flat input ``[M, H]`` and the layer's key, an int that names the layer in a registry of
this process (weak references: a dropped layer leaves it). A graph that calls the op therefore runs only in
the process whose layers it names: ``torch.export`` of a patched model is not portable, and its op says so.
The op has no autograd formula, so a forward that autograd would record (grad mode on and the input or a
layer parameter requiring grad) is traced as before instead (``MoeLayer.forward``). Under
``mode="reduce-overhead"`` the caller's graph captures the op's kernels; the layer sees the capture and
runs its plain forward inside it.
"""

from __future__ import annotations

import itertools
import weakref

import torch

_layers: dict[int, weakref.ref] = {}
_keys = itertools.count(1)


def register(layer) -> int:
    """A new key for ``layer`` (``MoeLayer._flat``), dropped from the registry when the layer is collected."""
    key = next(_keys)
    _layers[key] = weakref.ref(layer, lambda _ref, key=key: _layers.pop(key, None))
    return key


@torch.library.custom_op("moe::layer", mutates_args=())
def layer(x: torch.Tensor, key: int) -> torch.Tensor:
    """The registered layer's flat forward of ``x`` (its graphs, its backends), as eager code runs it."""
    ref = _layers.get(key)
    target = None if ref is None else ref()
    if target is None:
        raise RuntimeError(
            f"moe::layer: no MoeLayer with key {key} in this process (a compiled or exported graph that calls "
            "moe::layer runs only in the process that built its layers, while they are alive)"
        )
    return target._flat(x)


@layer.register_fake
def _(x: torch.Tensor, key: int) -> torch.Tensor:
    return torch.empty_like(x)
