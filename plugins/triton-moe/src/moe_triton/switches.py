"""The forward's runtime switches: one table of what each does, its environment variable and its default.

Each switch chooses between launch variants that compute the same result (or, for the split-K ones,
how K is split); none changes the kernels' arguments' meaning. They exist for A/B timing and for
turning a variant off on a machine where it does not pay; the measurements behind the defaults are in
``results/README.md``.

``current_switches()`` is what a forward reads: the innermost ``override(...)`` if one is active, else the
environment as last read. The environment is read on the first call and again on ``refresh()``, not on
every forward: a lookup in ``os.environ`` costs far more per variable than the rest of the host-side
launch bookkeeping, so a process that changes a ``MOE_TRITON_*`` variable after its first forward calls
``refresh()`` (or uses ``override``, which needs no environment at all). A forward captured in a CUDA
graph keeps the switches it was captured with.

Overrides are process-wide (not per thread): they are for tools and tests that time or check the
variants one after another in one process (``tools/ab_flags.py``).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields, replace

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


def _switch(default, variable: str, doc: str):
    return field(default=default, metadata={"variable": variable, "doc": doc})


@dataclass(frozen=True)
class Switches:
    """The switches in force for a forward (``current_switches()``). Each field's metadata holds its environment
    variable and what it does: this class is the table (``describe()`` renders it)."""

    split_k: int = _switch(
        0,
        "MOE_TRITON_SPLIT_K",
        "force GEMM1's K split for every forward (1 = never split); 0 = as the tile config says",
    )
    mxfp4_asm: bool = _switch(
        True,
        "MOE_TRITON_MXFP4_ASM",
        "decode MXFP4 weights with inline PTX (CUDA, bf16 activations) instead of Triton bit operations; "
        "bitwise the same result",
    )
    mxfp4_whole_chunk: bool | None = _switch(
        None,
        "MOE_TRITON_MXFP4_WHOLE_CHUNK",
        "MXFP4 tiles that take K in order (swapped operands, or at least 64 rows): one 64-deep MMA per "
        "64-value chunk instead of one per 32-value half, so no MMA of a K step waits for another into the "
        "same accumulator (kernels.gemm._cat_k); the same products in the same order; unset = as the tile "
        "config says (GemmConfig.whole_chunk, set by the tuner per GEMM where it measured faster), 1 / 0 = "
        "on / off everywhere",
    )
    fp8_prequant: bool = _switch(
        True,
        "MOE_TRITON_FP8_PREQUANT",
        "fp8_block: quantize the activations once per forward (one more launch) instead of inside GEMM1's "
        "K loop in every N-tile program, and GEMM2's input in GEMM1's epilogue where GEMM1's N tile covers "
        "whole 128-column groups; the same codes and scales",
    )
    fp8_scale_prefetch: bool = _switch(
        True,
        "MOE_TRITON_FP8_SCALE_PREFETCH",
        "fp8_block: in 16-row (decode) tiles load each K step's weight and activation scales one step ahead, "
        "so the step's wait for them overlaps the previous step's work; larger tiles load them in the step "
        "(launch.PREFETCH_MAX_BLOCK_M: there the extra registers cost more than the wait); the same result",
    )
    pdl: bool | None = _switch(
        None,
        "MOE_TRITON_PDL",
        "launch every kernel of the forward with programmatic dependent launch (CUDA SM90+): each may start "
        "while its predecessor finishes and waits for its writes in its first statement; unset = as the tile "
        "config says (KernelConfig.pdl, set by the tuner where it measured faster), 1 / 0 = on / off everywhere",
    )
    direct: bool = _switch(
        True,
        "MOE_TRITON_DIRECT",
        "at decode (kernel_configs.direct_decode) skip the alignment: one GEMM row block per (token, slot) "
        "pair, GEMM2 summing the slots itself, two launches in all; the same result",
    )
    fast_launch: bool = _switch(
        True,
        "MOE_TRITON_FAST_LAUNCH",
        "relaunch each compiled kernel through its launcher, keyed by Triton's own specialization of the "
        "arguments, instead of JITFunction.run's per-call binding (moe_triton.fast_launch); the same kernels",
    )
    fused_router: bool = _switch(
        True,
        "MOE_TRITON_FUSED_ROUTER",
        "offer a layer routed by softmax or grouped top-k (moe_core.routing.SoftmaxTopK, GroupedTopK) one kernel "
        "for the choice (moe_triton.router) instead of torch's top-k, softmax, group and cast ops; read when a "
        "layer is built; the same experts and weights up to float32 rounding",
    )
    fused_gate: bool = _switch(
        True,
        "MOE_TRITON_FUSED_GATE",
        "with fused_router, compute a softmax top-k layer's gate GEMM in the routing kernel too, up to "
        "gate_max_tokens tokens (TritonFusedOp.gated_router), instead of a cuBLAS GEMM and a round trip "
        "of the logits; read when a layer is built; the same experts and weights up to float32 rounding of the "
        "logits before their rounding to the input's dtype",
    )
    gate_max_tokens: int = _switch(
        256,
        "MOE_TRITON_GATE_MAX_TOKENS",
        "the most tokens the gated router (fused_gate) computes in its one kernel; more take cuBLAS's gate GEMM "
        "and the logits kernel; read at each call",
    )
    auto_split_k: bool = _switch(
        False,
        "MOE_TRITON_AUTO_SPLIT_K",
        "choose GEMM1's K split with a heuristic where the tile config leaves it open (split_k 0); "
        "otherwise such configs run unsplit",
    )

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type == "int":
                if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                    raise ValueError(f"switch {f.name} ({f.metadata['variable']}) must be an integer >= 0, "
                                     f"got {value!r}")  # fmt: skip
            elif not isinstance(value, bool) and not (value is None and f.default is None):
                allowed = "True, False or None" if f.default is None else "True or False"  # None: left unset
                raise ValueError(f"switch {f.name} ({f.metadata['variable']}) must be {allowed}, got {value!r}")


#: the environment variable of each switch, by field name
VARIABLES: dict[str, str] = {f.name: f.metadata["variable"] for f in fields(Switches)}


def _parse(f, text: str):
    """One switch's value from its environment variable's text; empty means the default."""
    word = text.strip().lower()
    if not word:
        return f.default
    if f.type == "int":
        if word.isdigit():
            return int(word)
        expected = "an integer >= 0"
    elif word in _TRUE or word in _FALSE:
        return word in _TRUE
    else:
        expected = "one of 1/0, true/false, yes/no, on/off"
    raise ValueError(f"{f.metadata['variable']}={text!r} is not valid: expected {expected} ({f.metadata['doc']}; "
                     f"default {f.default!r})")  # fmt: skip


def from_environ(environ: Mapping[str, str] | None = None) -> Switches:
    """The switches as ``environ`` (default: ``os.environ``, read now) sets them; unset ones keep their
    defaults. A value that does not parse raises ``ValueError`` naming the variable."""
    env = os.environ if environ is None else environ
    values = {f.name: _parse(f, env[f.metadata["variable"]]) for f in fields(Switches) if f.metadata["variable"] in env}
    return Switches(**values)


_from_env: Switches | None = None
_override: Switches | None = None


def refresh() -> Switches:
    """Read the environment again now (after a ``MOE_TRITON_*`` variable changed in this process)."""
    global _from_env
    _from_env = from_environ()
    return _from_env


def current_switches() -> Switches:
    """The switches a forward runs with: the innermost ``override``, else the environment as last read
    (read on the first call; ``refresh()`` reads it again)."""
    if _override is not None:
        return _override
    return _from_env if _from_env is not None else refresh()


@contextlib.contextmanager
def override(**changes) -> Iterator[Switches]:
    """Run the block with some switches changed, the others as ``current_switches()`` has them, e.g.
    ``with switches.override(pdl=True, split_k=1): ...``; nested overrides stack. Process-wide."""
    global _override
    unknown = set(changes) - set(VARIABLES)
    if unknown:
        raise TypeError(f"unknown switch(es) {sorted(unknown)}; the switches are {sorted(VARIABLES)}")
    previous = _override
    _override = replace(current_switches(), **changes)
    try:
        yield _override
    finally:
        _override = previous


def describe() -> list[tuple[str, str, object, str]]:
    """(name, environment variable, default, what it does) of every switch, for documentation and tools."""
    return [(f.name, f.metadata["variable"], f.default, f.metadata["doc"]) for f in fields(Switches)]
