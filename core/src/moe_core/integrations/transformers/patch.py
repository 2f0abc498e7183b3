"""``patch_model``: replace every supported MoE block of a transformers model by a ``MoeLayer``, in place.

>>> report = patch_model(model, backend="auto")   # doctest: +SKIP
>>> print(report)                                  # doctest: +SKIP
>>> model.generate(input_ids, max_new_tokens=32)   # doctest: +SKIP

For each block ``find_moe_blocks(model)`` yields: ``from_hf_block(block, dtype=<the experts' parameter
dtype>)`` copies the routed (and shared) experts into canonical weights, a ``PatchedMoeBlock`` (a
``MoeLayer`` that returns what the original block returned) is built from them and set on the block's
parent (attribute, ``ModuleList`` index or ``ModuleDict`` key), and the original block is dropped.

- **Return form.** Most blocks return the hidden states; a few return a tuple and their decoder layer
  unpacks it (gpt-oss ``GptOssMLP``: ``(hidden, router_scores)``; Llama 4 ``Llama4TextMoe``: ``(out [M, H],
  router_logits)``, its output *flattened* to ``[M, H]``). The form is read by **calling the original block
  once** on a one-token zero input (``[1, 1, H]``, under ``no_grad``) before it is replaced, not from a table
  of classes: a future family that returns a tuple, or changes its output shape, is then handled without a
  new entry. The replacement returns ``(out, None, ...)`` of the same length (every transformers 5.24
  decoder layer of a supported family discards the second element: gpt-oss ``hidden_states, _ =
  self.mlp(...)``, Llama 4 ``hidden_states, _ = hidden_states``) and flattens ``out`` to ``[M, H]`` where
  the block did. When the probe cannot run (parameters on the meta device, a block that needs more than
  ``hidden_states``), the class table ``TUPLE_BLOCKS`` decides and the report says so.
- **Layer-level shared MLPs** (GraniteMoeShared, GraniteMoeHybrid keep ``shared_mlp`` in the decoder layer):
  when the converter takes ``shared_mlp=`` and the parent has a non-``None`` ``shared_mlp``, it is folded
  into the layer's shared experts and the parent's ``shared_mlp`` becomes a ``FoldedSharedMlp`` that adds
  nothing (``0``): right whether the layer's forward calls it unconditionally (GraniteMoeHybrid) or only
  when it is not ``None`` (GraniteMoeShared), with no reading of transformers' source.
- **Memory.** The converters copy the experts; the original block (and a folded ``shared_mlp``) is
  unreferenced after its replacement, so its expert weights are freed as each block is patched (peak: one
  block's weights twice). The router keeps the block's gate weight tensor (not the module).
- **Unsupported blocks.** A module with an ``experts`` submodule whose class is not in ``SUPPORTED_BLOCKS``
  (and that is not inside a supported block) looks like a MoE block without a converter: ``strict=True``
  raises ``InvalidInputError`` naming every such module, its class and the supported classes, before
  anything is replaced; ``strict=False`` leaves it as it is and records it in ``report.skipped``. A
  supported block whose conversion fails (an activation that matches none of moe_core's) raises with
  ``strict=True`` (blocks already replaced stay replaced; the message names them) and is skipped otherwise.
  Backend errors (an explicit backend that cannot run the problem) are always raised.
- **quant_scheme** — where the routed experts' weights come from (``Replaced.weights``):

  - ``None``: the block's float weights, copied (``"copied"``); the config's scheme follows their dtype.
  - ``"mxfp4"``, ``"fp8_block"``, ``"nvfp4"``: those copies quantized with ``moe_core.quant.quantize_weights``
    and the config's ``quant_scheme`` set to it (``"quantized"``; the activations stay in the block's dtype,
    the shared MLP unquantized, as ``MoeLayer`` does).
  - a gpt-oss block holding its **MXFP4 checkpoint** tensors (transformers' ``Mxfp4GptOssMLP`` /
    ``Mxfp4GptOssExperts``: ``from_pretrained`` of an MXFP4 gpt-oss checkpoint with
    ``Mxfp4Config(dequantize=False)``): the checkpoint's own bytes and scales are read as they are
    (``families.from_gpt_oss_mxfp4``: de-interleaved, unswizzled from triton_kernels' layout, never
    dequantized or re-encoded) and the config's scheme is ``"mxfp4"`` (``"checkpoint"``), with
    ``quant_scheme=None`` or ``"mxfp4"``; any other ``quant_scheme`` raises ``InvalidInputError`` naming
    those blocks before anything is replaced, whatever ``strict`` says (re-encoding MXFP4 codes in another
    scheme would lose precision silently). The activation dtype is then the router's (the module keeps its
    biases in float32 whatever the model's dtype); the return form comes from the class table when the
    probe cannot run (no triton_kernels).

What a patched model no longer does: record ``router_logits`` (``output_router_logits=True``, the
auxiliary load-balancing loss: transformers records them on the router modules, which are gone), train the
experts (their weights are a backend's prepared layout, not parameters), or move with ``model.to()`` to
another device or dtype (``MoeLayer`` refuses; patch after moving). Save the original checkpoint, not the
patched ``state_dict``.

transformers is not imported here: everything is read from the modules themselves.
"""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass, field

import torch

from moe_core.errors import InvalidInputError
from moe_core.graphs import ForwardGraphs
from moe_core.integrations.transformers.families import (
    SUPPORTED_BLOCKS,
    checkpoint_scheme,
    converter_of,
    find_moe_blocks,
    from_hf_block,
)
from moe_core.layer import CUDA_GRAPH_MAX_TOKENS, MoeLayer
from moe_core.schemes import SCHEMES

__all__ = ["TUPLE_BLOCKS", "FoldedSharedMlp", "PatchReport", "PatchedMoeBlock", "Replaced", "Skipped", "patch_model"]

#: class name -> length of the tuple the block returns, used only when the probe call cannot run
TUPLE_BLOCKS: dict[str, int] = {"GptOssMLP": 2, "Mxfp4GptOssMLP": 2, "Llama4TextMoe": 2}
#: blocks whose probe-less fallback output is flattened to [M, H]
_FLAT_BLOCKS = frozenset({"Llama4TextMoe"})


@dataclass(frozen=True)
class Replaced:
    """A block that was replaced: its qualified name, class, the backends the new layer runs on, its scheme, and
    where the routed experts' weights came from (``weights``): ``"copied"`` (the block's float weights),
    ``"quantized"`` (those, quantized by ``moe_core.quant.quantize_weights``) or ``"checkpoint"`` (the
    quantized checkpoint's own tensors, e.g. gpt-oss's MXFP4 bytes and scales, read as stored); ``routing``: what
    chooses the experts — the routed backend's name where it runs the router's choice in its own kernel
    (``MoeLayer.fused_router``), else ``"torch"`` (the router's torch ops)."""

    name: str
    block_class: str
    backend: str
    shared_backend: str | None
    quant_scheme: str
    #: how the return form was found: "probe" (the block was called once) or "class table"
    returns: str = "tensor"
    detected_by: str = "probe"
    weights: str = "copied"
    routing: str = "torch"


@dataclass(frozen=True)
class Skipped:
    """A module left as it was, and why."""

    name: str
    block_class: str
    reason: str


@dataclass
class PatchReport:
    """What ``patch_model`` did: ``replaced`` and ``skipped`` entries; ``str()`` is a table, ``to_dict()``
    plain data for JSON."""

    replaced: list[Replaced] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {
            "replaced": [dataclasses.asdict(r) for r in self.replaced],
            "skipped": [dataclasses.asdict(s) for s in self.skipped],
        }

    def __str__(self) -> str:
        lines = [f"replaced {len(self.replaced)} MoE block(s), skipped {len(self.skipped)}"]
        if self.replaced:
            rows = [
                (r.name, r.block_class, r.backend, r.shared_backend or "-", r.quant_scheme, r.weights, r.routing,
                 r.returns)
                for r in self.replaced
            ]  # fmt: skip
            header = ("module", "class", "backend", "shared backend", "scheme", "weights", "routing", "returns")
            lines += _table(header, rows)
        if self.skipped:
            lines += _table(
                ("skipped module", "class", "reason"), [(s.name, s.block_class, s.reason) for s in self.skipped]
            )
        return "\n".join(lines)


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)]
    fmt = lambda row: "  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip()
    return [fmt(header), fmt(tuple("-" * w for w in widths)), *(fmt(r) for r in rows)]


class PatchedMoeBlock(MoeLayer):
    """A ``MoeLayer`` standing in for a transformers MoE block: the same forward, returning what the
    block returned — ``out`` shaped like the input (or ``[M, H]`` where the block flattened it), or
    ``(out, None, ...)`` where the block returned a tuple of ``tuple_len``. ``source_class`` is the
    replaced block's class name."""

    def __init__(self, *args, source_class: str, tuple_len: int = 0, flat: bool = False, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.source_class = source_class
        self.tuple_len = tuple_len
        self.flat = flat

    def forward(self, hidden_states: torch.Tensor):
        out = super().forward(hidden_states)
        if self.flat:
            out = out.view(-1, self.config.hidden_size)
        if self.tuple_len:
            return (out,) + (None,) * (self.tuple_len - 1)
        return out

    def extra_repr(self) -> str:
        return f"replaces={self.source_class}, " + super().extra_repr()


class FoldedSharedMlp(torch.nn.Module):
    """Stands in for a decoder layer's ``shared_mlp`` folded into the ``PatchedMoeBlock`` beside it: the
    layer adds its output to the block's, so it returns ``0``."""

    def forward(self, hidden_states: torch.Tensor) -> int:
        return 0


def patch_model(
    model: torch.nn.Module,
    backend: str | type = "auto",
    *,
    strict: bool = True,
    quant_scheme: str | None = None,
    shared_backend: str | type | None = None,
    cuda_graph_max_tokens: int = CUDA_GRAPH_MAX_TOKENS,
) -> PatchReport:
    """Replace every MoE block of ``model`` that ``from_hf_block`` converts by a ``PatchedMoeBlock`` (a
    ``MoeLayer`` on ``backend``, its shared experts on ``shared_backend``), in place; return a
    ``PatchReport``. ``strict``: a module that looks like a MoE block without a converter, or a supported
    block that fails to convert, raises ``InvalidInputError`` (else it is skipped and reported).
    ``quant_scheme``: quantize the routed experts (``"mxfp4"``, ``"fp8_block"``, ``"nvfp4"``); gpt-oss blocks
    holding their MXFP4 checkpoint tensors use those as they are (``None`` or ``"mxfp4"``; another scheme
    raises ``InvalidInputError``). Put the model in ``eval()`` first (router jitter and sampling are
    training-only and not reproduced). ``cuda_graph_max_tokens``: each layer's ``MoeLayer`` option — on CUDA,
    forwards of at most that many tokens replay CUDA graphs of the layer's own (``moe_core.graphs``; 0: every
    forward eager). See the module docstring for return forms, layer-level shared MLPs, memory and where the
    weights come from."""
    if not isinstance(model, torch.nn.Module):
        raise InvalidInputError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    try:
        ForwardGraphs(cuda_graph_max_tokens, "patch_model")
    except ValueError as exc:
        raise InvalidInputError(f"cuda_graph_max_tokens: {exc}") from None
    if quant_scheme is not None and (quant_scheme not in SCHEMES or not SCHEMES[quant_scheme].quantized):
        quantized = [name for name, spec in SCHEMES.items() if spec.quantized]
        raise InvalidInputError(f"quant_scheme must be one of {', '.join(quantized)} or None, got {quant_scheme!r}")
    report = PatchReport()
    names = [name for name, _ in find_moe_blocks(model)]  # names only: the loop must not keep blocks alive
    unsupported = _unsupported_blocks(model, names)
    if unsupported and strict:
        listed = "\n".join(f"  - {name} ({cls})" for name, cls in unsupported)
        raise InvalidInputError(
            f"{len(unsupported)} module(s) look like MoE blocks (an `experts` submodule) but have no converter:\n"
            f"{listed}\nsupported transformers MoE blocks: {', '.join(SUPPORTED_BLOCKS)}. Pass strict=False to "
            "leave them as they are."
        )
    _check_checkpoint_schemes(model, names, quant_scheme)
    for name, cls in unsupported:
        report.skipped.append(Skipped(name, cls, "no converter (an `experts` submodule, class not supported)"))
    for name in names:
        try:
            report.replaced.append(
                _patch_one(model, name, backend, shared_backend, quant_scheme, cuda_graph_max_tokens)
            )
        except InvalidInputError as exc:
            if strict:
                done = ", ".join(r.name for r in report.replaced) or "none"
                raise InvalidInputError(
                    f"{name} ({type(model.get_submodule(name)).__name__}) could not be converted: {exc}\n"
                    f"(blocks already replaced: {done}; pass strict=False to skip this one)"
                ) from exc
            report.skipped.append(Skipped(name, type(model.get_submodule(name)).__name__, f"conversion failed: {exc}"))
    return report


def _check_checkpoint_schemes(model: torch.nn.Module, names: list[str], quant_scheme: str | None) -> None:
    """Raise, before anything is replaced, when ``quant_scheme`` asks for another scheme than the one blocks
    holding a quantized checkpoint's tensors are in (gpt-oss MXFP4)."""
    if quant_scheme is None:
        return
    held = []
    for name in names:
        block = model.get_submodule(name)
        scheme = checkpoint_scheme(block)
        if scheme is not None and scheme != quant_scheme:
            held.append(f"  - {name} ({type(block).__name__}: its experts hold {scheme} checkpoint tensors)")
    if held:
        listed = "\n".join(held)
        raise InvalidInputError(
            f"quant_scheme={quant_scheme!r} cannot be applied to {len(held)} block(s):\n{listed}\nthese weights are "
            "used as the checkpoint stores them; converting them to another scheme would dequantize and re-encode "
            "them, losing precision. Pass quant_scheme=None (or the checkpoint's scheme), or load the model "
            "dequantized (transformers: Mxfp4Config(dequantize=True)) to quantize it yourself."
        )


def _unsupported_blocks(model: torch.nn.Module, supported: list[str]) -> list[tuple[str, str]]:
    """``(name, class)`` of modules with an ``experts`` submodule, outside every supported block and every
    module already listed (so a block's own children are not listed again)."""
    if "" in supported:  # the model itself is a supported block
        return []
    found: list[tuple[str, str]] = []
    covered = [*supported]
    for name, module in model.named_modules():
        if any(name == p or name.startswith(p + ".") for p in covered):
            continue
        if isinstance(getattr(module, "experts", None), torch.nn.Module):
            found.append((name, type(module).__name__))
            covered.append(name)
    return found


def _parent_of(model: torch.nn.Module, name: str) -> tuple[torch.nn.Module, str]:
    if not name:
        raise InvalidInputError(
            f"the model itself is a MoE block ({type(model).__name__}): build a MoeLayer with from_hf_block "
            "instead of patching it"
        )
    parent_name, _, attr = name.rpartition(".")
    return model.get_submodule(parent_name), attr


def _set_child(parent: torch.nn.Module, attr: str, module: torch.nn.Module) -> None:
    if isinstance(parent, (torch.nn.ModuleList, torch.nn.Sequential)) and attr.lstrip("-").isdigit():
        parent[int(attr)] = module
    elif isinstance(parent, torch.nn.ModuleDict):
        parent[attr] = module
    else:
        setattr(parent, attr, module)


def _block_dtype(block: torch.nn.Module) -> torch.dtype:
    """The routed experts' parameter dtype (else the block's first floating parameter's). Experts holding MXFP4
    checkpoint tensors have only their biases as floating parameters, float32 whatever the model's dtype: the
    block's other parameters (the router's) give the dtype then."""
    experts = getattr(block, "experts", None)
    if checkpoint_scheme(block) is not None:
        params = [p for n, p in block.named_parameters() if not n.startswith("experts.")]
        sources = [params, experts.parameters()]
    else:
        sources = [m.parameters() for m in (experts, block) if isinstance(m, torch.nn.Module)]
    for source in sources:
        for p in source:
            if p.is_floating_point():
                return p.dtype
    raise InvalidInputError(f"{type(block).__name__} has no floating-point parameters to read a dtype from")


def _return_form(block: torch.nn.Module, hidden_size: int, dtype: torch.dtype, device) -> tuple[int, bool, str]:
    """``(tuple_len, flat, how)``: call the block once on a ``[1, 1, H]`` zero input; if it cannot run, the
    class table ``TUPLE_BLOCKS``."""
    try:
        with torch.no_grad():
            out = block(torch.zeros(1, 1, hidden_size, dtype=dtype, device=device))
    except Exception as exc:  # meta tensors, a block that needs more arguments: fall back to the table
        names = [c.__name__ for c in type(block).__mro__]
        tuple_len = next((TUPLE_BLOCKS[n] for n in names if n in TUPLE_BLOCKS), 0)
        flat = any(n in _FLAT_BLOCKS for n in names)
        return tuple_len, flat, f"class table (probe failed: {type(exc).__name__})"
    tuple_len = len(out) if isinstance(out, (tuple, list)) else 0
    first = out[0] if tuple_len else out
    if not isinstance(first, torch.Tensor) or first.shape[-1] != hidden_size:
        raise InvalidInputError(
            f"{type(block).__name__} returned {type(first).__name__} "
            f"{list(getattr(first, 'shape', []))} for a [1, 1, {hidden_size}] input; expected [..., {hidden_size}]"
        )
    return tuple_len, first.dim() == 2, "probe"


def _fold_shared_mlp(converter, parent: torch.nn.Module) -> dict:
    """``{"shared_mlp": parent.shared_mlp}`` when the converter takes a layer-level shared MLP and the
    parent has one, else ``{}``."""
    mlp = getattr(parent, "shared_mlp", None)
    if mlp is None or "shared_mlp" not in inspect.signature(converter).parameters:
        return {}
    return {"shared_mlp": mlp}


def _converter(block):
    converter = converter_of(block)
    if converter is None:
        raise InvalidInputError(f"no converter for {type(block).__name__}")
    return converter


def _patch_one(model, name: str, backend, shared_backend, quant_scheme: str | None, graph_tokens: int) -> Replaced:
    parent, attr = _parent_of(model, name)
    block = model.get_submodule(name)
    block_class = type(block).__name__
    dtype = _block_dtype(block)
    extra = _fold_shared_mlp(_converter(block), parent)
    moe = from_hf_block(block, dtype=dtype, **extra)
    config, weights = moe.config, moe.weights
    tuple_len, flat, how = _return_form(block, config.hidden_size, dtype, weights.w13.device)
    if config.scheme.quantized:  # the checkpoint's own quantized tensors (quant_scheme checked to match)
        source = "checkpoint"
    elif quant_scheme is not None:
        from moe_core.quant import quantize_weights

        weights = quantize_weights(weights, quant_scheme)
        config = dataclasses.replace(config, quant_scheme=quant_scheme)
        source = "quantized"
    else:
        source = "copied"
    layer = PatchedMoeBlock(
        config,
        weights,
        moe.router,
        shared=moe.shared,
        backend=backend,
        shared_backend=shared_backend,
        source_class=block_class,
        tuple_len=tuple_len,
        flat=flat,
        cuda_graph_max_tokens=graph_tokens,
    )
    del moe, weights, block  # the layer holds the backend's prepared weights only
    _set_child(parent, attr, layer)
    if extra:
        parent.shared_mlp = FoldedSharedMlp()
    returns = "tensor" if not tuple_len else f"tuple of {tuple_len}"
    if flat:
        returns += " (flat [M, H])"
    return Replaced(
        name,
        block_class,
        layer.backend,
        layer.shared_backend,
        config.quant_scheme,
        returns=returns,
        detected_by=how,
        weights=source,
        routing="torch" if layer.fused_router is None else layer.fused_router.backend,
    )
