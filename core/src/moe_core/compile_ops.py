"""moe's layers and runners as opaque ``torch.library`` ops for ``torch.compile``: ``moe::layer``, ``moe::runner``.

Why: traced by Dynamo, a forward is the router's ops, the runner's checks and a backend's launches spread
through the caller's compiled graph. The backend's code must then be traceable (a third-party backend that
reads a value on the host breaks the graph; so does the CPU id check), and a ``MoeLayer`` cannot replay its
own CUDA graphs (``moe_core.graphs``: nothing is captured while Dynamo traces), so a compiled model pays every
launch on the host at decode — slower than the same model eager. As one op the compiled graph calls the
layer or runner exactly as eager code does: its checks, its backend, its graphs; compiling a model whose
experts run through any backend then traces nothing of that backend, and ``fullgraph=True`` holds.

- ``moe::layer(x [M, H], key) -> [M, H]``: ``MoeLayer``'s flat forward (``MoeLayer._flat``).
- ``moe::runner(hidden_states, topk_ids, topk_weights, out, key)``: ``MoeRunner``'s call writing into
  ``out`` (allocated in the traced code when the caller gave none), so that the runner's own checks of
  ``out`` — shape, dtype, no overlap with the inputs — run on the real tensors.

``key`` is an int naming the object in a registry of this process (weak references: a dropped object leaves
it; a copy registers anew). A graph that calls these ops therefore runs only in the process whose objects it
names: ``torch.export`` of a patched model is not portable, and the op says so. The ops have no autograd
formula, so a forward that autograd would record is traced as before instead (the callers check). Under
``mode="reduce-overhead"`` the caller's graph captures the ops' kernels; a layer sees the capture and runs
its plain forward inside it.
"""

from __future__ import annotations

import itertools
import weakref

import torch

_objects: dict[int, weakref.ref] = {}
_keys = itertools.count(1)


def register(obj) -> int:
    """A new key for ``obj`` (a ``MoeLayer`` or ``MoeRunner``), dropped from the registry when it is collected."""
    key = next(_keys)
    _objects[key] = weakref.ref(obj, lambda _ref, key=key: _objects.pop(key, None))
    return key


def records_grad(*tensors: torch.Tensor) -> bool:
    """Whether autograd would record a forward on ``tensors`` (the ops have no backward: then it is traced)."""
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def _target(op: str, key: int):
    ref = _objects.get(key)
    target = None if ref is None else ref()
    if target is None:
        raise RuntimeError(
            f"moe::{op}: no object with key {key} in this process (a compiled or exported graph that calls "
            f"moe::{op} runs only in the process that built its layers and runners, while they are alive)"
        )
    return target


@torch.library.custom_op("moe::layer", mutates_args=())
def layer(x: torch.Tensor, key: int) -> torch.Tensor:
    """The registered layer's flat forward of ``x`` (its graphs, its backends), as eager code runs it."""
    return _target("layer", key)._flat(x)


@layer.register_fake
def _(x: torch.Tensor, key: int) -> torch.Tensor:
    return torch.empty_like(x)


@torch.library.custom_op("moe::runner", mutates_args=("out",))
def runner(
    hidden_states: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, out: torch.Tensor, key: int
) -> None:
    """The registered runner's call into ``out``, as eager code runs it (its checks, its backend)."""
    _target("runner", key)._run(hidden_states, topk_ids, topk_weights, out)


@runner.register_fake
def _(hidden_states, topk_ids, topk_weights, out, key) -> None:
    return None
