"""gpt-oss's MXFP4 checkpoint tensors, read as canonical MXFP4 weights (never dequantized).

transformers keeps a gpt-oss checkpoint's experts as ``Mxfp4GptOssExperts``: ``*_blocks`` (packed e2m1
bytes) and ``*_scales`` (UE8M0), or triton_kernels tensors once they are swizzled for its kernels. The family
converter ``families.from_gpt_oss_mxfp4`` takes them from here: unswizzled through the tensors' own layout,
gate/up de-interleaved into canonical order, bytes and scales copied as they are.
"""

from __future__ import annotations

import torch

from moe_core.errors import InvalidInputError
from moe_core.integrations.transformers.experts import canonical_rows, copied, float_scheme, require_attr
from moe_core.schemes import SCHEMES
from moe_core.weights import MoeWeights

#: the transformers class that holds gpt-oss's MXFP4 checkpoint tensors (``transformers.integrations.mxfp4``)
MXFP4_EXPERTS_CLASS = "Mxfp4GptOssExperts"
#: inputs per UE8M0 scale byte (``moe_core.quant.mxfp4.MXFP4_BLOCK``; read from the scheme table, no quant import)
MXFP4_BLOCK = SCHEMES["mxfp4"].scale_block[1]


def holds_mxfp4_checkpoint(experts) -> bool:
    """Whether ``experts`` holds gpt-oss's MXFP4 checkpoint tensors instead of float weights: transformers'
    ``Mxfp4GptOssExperts`` (by class name, subclasses included) or any module with ``gate_up_proj_blocks``.
    Says nothing about whether its weights are loaded yet (``read_mxfp4_experts`` does)."""
    if experts is None:
        return False
    return any(c.__name__ == MXFP4_EXPERTS_CLASS for c in type(experts).__mro__) or hasattr(
        experts, "gate_up_proj_blocks"
    )


def _unswizzled(t, what: str) -> torch.Tensor:
    """The plain torch tensor of a triton_kernels ``Tensor`` (``t.storage.data`` in ``t.storage.layout``),
    read back with the layout's own ``unswizzle_data`` — what transformers' ``Mxfp4ReverseDeserialize`` does to
    save such a module. Only the objects' methods are called: triton_kernels is not imported here."""
    storage = getattr(t, "storage", None)
    data, layout = getattr(storage, "data", None), getattr(storage, "layout", None)
    unswizzle = getattr(layout, "unswizzle_data", None)
    if not isinstance(data, torch.Tensor) or not callable(unswizzle):
        raise InvalidInputError(
            f"{what} is a {type(t).__name__} whose storage layout ({type(layout).__name__}) has no unswizzle_data: "
            "not the triton_kernels form transformers 5.24 writes (Storage(data, layout) with the layout's "
            "swizzle_data / unswizzle_data), so its bytes cannot be read back"
        )
    out = unswizzle(data)
    if not isinstance(out, torch.Tensor):
        raise InvalidInputError(f"{what}: unswizzle_data returned {type(out).__name__}, not a torch.Tensor")
    return out


def _mxfp4_projection(experts, proj: str, e: int, n: int, k: int) -> tuple[torch.Tensor, torch.Tensor, str]:
    """``(packed uint8 [E, n, k/2], scales uint8 [E, n, k/32], form)`` of ``proj`` as gpt-oss stores it:
    one row per output (``n``), the input (``k``) packed two E2M1 codes a byte, even index in the low nibble,
    one UE8M0 scale byte per 32 inputs."""
    name = type(experts).__name__
    blocks, scales = getattr(experts, f"{proj}_blocks", None), getattr(experts, f"{proj}_scales", None)
    weight = getattr(experts, proj, None)
    precision = getattr(experts, f"{proj}_precision_config", None)
    if blocks is not None or scales is not None:
        # the checkpoint's own tensors: blocks [E, n, k/32, 16], scales [E, n, k/32]
        if blocks is None or scales is None:
            raise InvalidInputError(f"{name} has only one of {proj}_blocks / {proj}_scales; is it half loaded?")
        blocks, scales = blocks.detach(), scales.detach()
        if blocks.dim() == 4:
            blocks = blocks.flatten(-2)
        form = "checkpoint tensors (_blocks / _scales)"
    elif isinstance(weight, torch.Tensor):  # first: a torch.Tensor has a .storage() method too
        raise InvalidInputError(
            f"{name}.{proj} is a plain {weight.dtype} tensor {list(weight.shape)} and there are no scales "
            f"({proj}_precision_config is {precision!r}): the module as transformers builds it before loading; its "
            "weights arrive (as swizzled triton_kernels tensors) only when an MXFP4 checkpoint is loaded into it"
        )
    elif weight is not None and hasattr(weight, "storage"):
        # transformers 5.24 after loading: triton_kernels tensors made from the transposed [E, k/2, n] blocks and
        # [E, k/32, n] scales (swizzle_mxfp4); read back as Mxfp4ReverseDeserialize does, then transposed back
        scale = getattr(precision, "weight_scale", None)
        if scale is None:
            raise InvalidInputError(
                f"{name}.{proj} is a triton_kernels tensor but {proj}_precision_config has no scale"
            )
        blocks = _unswizzled(weight, f"{name}.{proj}").transpose(-1, -2)
        raw = scale if isinstance(scale, torch.Tensor) else _unswizzled(scale, f"{name}.{proj} scales")
        scales = raw.detach().transpose(-1, -2)
        layouts = [type(t.storage.layout).__name__ for t in (weight, scale) if not isinstance(t, torch.Tensor)]
        form = f"triton_kernels tensors ({' / '.join(layouts)})"
    else:
        raise InvalidInputError(f"{name} has no {proj}_blocks / {proj}_scales nor a loaded {proj}")
    for what, t, shape in (("packed", blocks, (e, n, k // 2)), ("scales", scales, (e, n, k // MXFP4_BLOCK))):
        if not isinstance(t, torch.Tensor) or t.dtype != torch.uint8 or tuple(t.shape) != shape:
            got = f"{t.dtype} {list(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
            raise InvalidInputError(f"{name}.{proj} {what} ({form}): {got}, expected uint8 {list(shape)}")
        if t.is_meta:
            raise InvalidInputError(f"{name}.{proj} is on the meta device: its checkpoint is not loaded")
    return blocks, scales, form


def read_mxfp4_experts(experts, dtype: torch.dtype) -> tuple[MoeWeights, str]:
    """gpt-oss experts holding MXFP4 checkpoint tensors -> ``(weights, form)``: canonical ``mxfp4``
    ``MoeWeights`` made of the checkpoint's own bytes and scales (no dequantization), biases in ``dtype``
    (the activation dtype), on the experts' device; ``form`` says which form was read.

    The result is what ``moe_core.quant.quantize_weights(w, "mxfp4")`` gives for the float experts the
    checkpoint encodes: gpt-oss stores each projection with one row per output and the packing, nibble
    order (even index low), E2M1 codes and UE8M0 scale bytes (bias 127) of ``moe_core.quant.mxfp4``, one
    scale per 32 inputs — ``w13`` ``[E, 2I, H/2]`` / scales ``[E, 2I, H/32]``, ``w2`` ``[E, H, I/2]`` /
    ``[E, H, I/32]`` — so only the gate/up rows (and the ``gate_up_proj_bias`` columns) are de-interleaved,
    ``[g0, u0, g1, u1, ...]`` -> ``[gate; up]``, as ``from_gpt_oss`` does for float weights; bytes and
    scale bytes are copied, never re-encoded.

    Forms read (transformers' ``Mxfp4GptOssExperts``, or any module with the same attributes):

    - ``gate_up_proj_blocks`` ``[E, 2I, H/32, 16]`` / ``gate_up_proj_scales`` ``[E, 2I, H/32]`` (and
      ``down_proj_*``): the checkpoint's tensors as the module held them before transformers 4.55-4.57
      swizzled them (``load_and_swizzle_mxfp4``), or as a caller set them.
    - ``gate_up_proj`` / ``down_proj`` as triton_kernels ``Tensor`` s with ``*_precision_config.weight_scale``:
      what transformers 5.24 holds once an MXFP4 checkpoint is loaded with ``Mxfp4Config(dequantize=False)``
      (``swizzle_mxfp4_convertops``: the transposed blocks in the layout ``make_default_matmul_mxfp4_w_layout``
      picks for the device — strided on CPU and before Hopper, ``HopperMXValueLayout`` on sm90, strided or
      ``BlackwellMXValueLayout`` on sm100 by triton_kernels version — and the scales always strided). They are
      **unswizzled**, not refused: through each tensor's own ``storage.layout.unswizzle_data``, the way
      transformers' ``Mxfp4ReverseDeserialize`` reads them back to save the checkpoint; a layout without
      that method (another triton_kernels API) raises ``InvalidInputError``.

    The module as transformers 5.24 builds it before loading (``gate_up_proj`` a zero ``uint8`` parameter,
    no scales, precision configs ``None``), meta tensors and shapes that do not fit the module's
    ``num_experts`` / ``hidden_size`` / ``intermediate_size`` raise ``InvalidInputError``.
    """
    name = type(experts).__name__
    e = int(require_attr(experts, "num_experts", what="expert count"))
    h = int(require_attr(experts, "hidden_size", what="hidden size"))
    i = int(require_attr(experts, "intermediate_size", what="expert intermediate size"))
    if h % MXFP4_BLOCK or i % MXFP4_BLOCK:
        raise InvalidInputError(f"{name}: hidden {h} and intermediate {i} must be multiples of {MXFP4_BLOCK} for MXFP4")
    float_scheme(dtype)  # an unquantized activation dtype
    gate_up, gate_up_scales, form = _mxfp4_projection(experts, "gate_up_proj", e, 2 * i, h)
    down, down_scales, _ = _mxfp4_projection(experts, "down_proj", e, h, i)
    b13 = require_attr(experts, "gate_up_proj_bias", what="gate/up expert biases").detach()
    b2 = require_attr(experts, "down_proj_bias", what="down expert biases").detach()
    if tuple(b13.shape) != (e, 2 * i) or tuple(b2.shape) != (e, h):
        raise InvalidInputError(
            f"{name}: bias shapes {list(b13.shape)} / {list(b2.shape)}, expected [{e}, {2 * i}] / [{e}, {h}]"
        )
    rows = canonical_rows(i, concatenated=False, device=gate_up.device)  # interleaved -> [gate; up]
    weights = MoeWeights(
        w13=gate_up[:, rows].contiguous(),  # indexing copies
        w2=copied(down, torch.uint8),
        b13=b13[:, rows].to(dtype).contiguous(),
        b2=copied(b2, dtype),
        w13_scale=gate_up_scales[:, rows].contiguous(),
        w2_scale=copied(down_scales, torch.uint8),
    )
    return weights, form
