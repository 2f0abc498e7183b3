"""Tile configurations: a heuristic default plus tuned tables shipped as JSON.

A table file ``<device>.json`` (device name with non-alphanumerics replaced by
``_``, e.g. ``NVIDIA_H200.json``) holds entries keyed by the layer shape and
scheme, each mapping token counts M to a ``KernelConfig``; a forward with M
tokens uses the entry whose M is nearest (as vLLM's tables do). Shapes that
no table covers get ``heuristic_config``. ``moe tune triton`` writes tables.

``split_k`` (GEMM1's K split) is 0 = "decide at launch" (``resolve_split_k``)
in the heuristic and in table entries written before the knob existed; a tuned
entry may pin it (1 = off). ``split_k2`` is GEMM2's (1 = off, the default).
"""

from __future__ import annotations

import functools
import json
import os
import re
from dataclasses import asdict, dataclass, field, replace
from importlib import resources
from pathlib import Path

import torch


@dataclass(frozen=True)
class GemmConfig:
    """One GEMM's tiles. ``swap_ab`` (MXFP4 only): compute the transposed product, weights as the MMA's
    first operand — on Hopper that operand may live in registers, so the decoded tile feeds ``wgmma``
    without a trip through shared memory, and the token rows become the MMA's N (8-wide steps instead
    of a 64-row minimum); elsewhere it is reset to False (``sanitize``)."""

    block_n: int = 64
    block_k: int = 64
    group_m: int = 8
    num_warps: int = 4
    num_stages: int = 3
    swap_ab: bool = False


@dataclass(frozen=True)
class KernelConfig:
    """BLOCK_M is shared (the alignment pads to it); each GEMM has its own tiles.

    ``split_k``: GEMM1's K split (0 = auto at launch, 1 = off); ``split_k2``: GEMM2's (1 = off). Each
    GEMM reduces its own partials in the same launch (``kernels.split``); they sit here beside the tiles
    because the tuner and the tables treat them per layer shape and token count.
    """

    block_m: int = 64
    gemm1: GemmConfig = field(default_factory=GemmConfig)
    gemm2: GemmConfig = field(default_factory=GemmConfig)
    split_k: int = 0
    split_k2: int = 1

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> KernelConfig:
        gemm1, gemm2 = GemmConfig(**d["gemm1"]), GemmConfig(**d["gemm2"])
        return cls(d["block_m"], gemm1, gemm2, int(d.get("split_k", 0)), int(d.get("split_k2", 1)))


@functools.cache
def device_slug(device: torch.device) -> str:
    """Table name of a device; cached (every forward selects a config, and the name query is a driver call)."""
    if device.type != "cuda":
        return "cpu"
    return re.sub(r"[^A-Za-z0-9]+", "_", torch.cuda.get_device_name(device)).strip("_")


def table_key(scheme: str, num_experts: int, hidden: int, inter: int, top_k: int) -> str:
    return f"{scheme},E={num_experts},H={hidden},I={inter},k={top_k}"


#: split-K applies only while the (token, slot) pairs are this few (decode); above it the
#: partials' traffic grows with the rows and GEMM1 has enough programs anyway
SPLIT_K_MAX_PAIRS = 128
#: largest K split tried
SPLIT_K_MAX = 8
#: ``MOE_TRITON_SPLIT_K=N`` forces GEMM1's K split for every forward of the process (1 = off), for
#: A/B timing; unset or 0 = as configured. Read once at import.
SPLIT_K_OVERRIDE = int(os.environ.get("MOE_TRITON_SPLIT_K", "0") or 0)
#: decode MXFP4 with inline PTX (CUDA, bf16 activations; elsewhere the Triton bit-op path). On by default: on the
#: H200 (2026-11-30, gpt-oss-120b) 107.6 / 240.7 / 764.2 us at M = 1 / 8 / 64 against 122.4 / 328.2 / 1086.2 us
#: with the bit-op path, bitwise the same result (GPU test). ``MOE_TRITON_MXFP4_ASM=0`` turns it off; read at import.
MXFP4_DECODE_ASM = os.environ.get("MOE_TRITON_MXFP4_ASM", "1") != "0"
#: fp8_block: quantize the activations once per forward (``launch.quantize_fp8_groups``, one more launch) instead of
#: inside GEMM1's K loop in every N-tile program. Same codes and scales, same result (GPU test). On by default: on
#: the H200 (2026-11-30, deepseek-v3-tp8) 35.4 / 120.5 / 397.6 us at M = 1 / 8 / 64 against 39.0 / 127.4 / 403.4 us
#: in-loop (``tools/ab_flags.py``). ``MOE_TRITON_FP8_PREQUANT=0`` turns it off; read at import.
FP8_PREQUANT = os.environ.get("MOE_TRITON_FP8_PREQUANT", "1") != "0"
#: programmatic dependent launch between the forward's kernels (SM90+, ``launch.pdl_kwargs``): each kernel may start
#: while its predecessor finishes and waits in its first statement for that kernel's writes. Off by default: on the
#: H200 (2026-11-30, ``tools/ab_flags.py``) it gained 0-7% on most decode rows but cost 22% on gpt-oss-120b mxfp4
#: M=1 (83.3 against 64.7 us) and 4% on mixtral-8x7b M=1. ``MOE_TRITON_PDL=1`` turns it on; read at import.
PDL = os.environ.get("MOE_TRITON_PDL", "0") == "1"
#: automatic split-K (``split_k_for``) where a config leaves it open. Off by default: on the H200 (2026-11-30) it
#: made deepseek-v3-tp8 bf16 M=1 slower (74.4 us against 41.2 us unsplit, when GEMM2 still reduced the partials).
#: The tuner measures splits per shape instead. ``MOE_TRITON_AUTO_SPLIT_K=1`` turns it on; a tuned entry may still
#: pin a split that measured faster.
AUTO_SPLIT_K = os.environ.get("MOE_TRITON_AUTO_SPLIT_K", "0") == "1"


def min_block_k(scheme: str) -> int:
    """fp8_block quantizes activations per 128 columns inside one K tile; mxfp4 walks 64-wide prepared chunks."""
    return 128 if scheme == "fp8_block" else 64 if scheme == "mxfp4" else 16


def swap_ab_supported(scheme: str) -> bool:
    """``GemmConfig.swap_ab`` is implemented for the MXFP4 main loop only."""
    return scheme == "mxfp4"


def legal_block_k(scheme: str, block_k: int) -> int:
    """The nearest BLOCK_K at or above ``block_k`` the scheme's kernels accept (fp8_block: 128; mxfp4: a
    multiple of 64; others: at least 16)."""
    if scheme == "fp8_block":
        return 128
    step = min_block_k(scheme)
    return max(step, -(-block_k // step) * step)


def sanitize(cfg: KernelConfig, scheme: str) -> KernelConfig:
    """Make BLOCK_K legal for the scheme (``legal_block_k``), e.g. for an older table; ``swap_ab`` only
    where it is implemented (mxfp4); GEMM2's split at least 1 (it has no automatic choice, so 0 = off)."""

    def fix(g: GemmConfig) -> GemmConfig:
        bk = legal_block_k(scheme, g.block_k)
        swap = g.swap_ab and swap_ab_supported(scheme)
        return g if (bk, swap) == (g.block_k, g.swap_ab) else replace(g, block_k=bk, swap_ab=swap)

    return replace(cfg, gemm1=fix(cfg.gemm1), gemm2=fix(cfg.gemm2), split_k2=max(cfg.split_k2, 1))


@functools.cache
def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device; 0 elsewhere (no automatic split-K on the CPU)."""
    if device.type != "cuda":
        return 0
    return torch.cuda.get_device_properties(device).multi_processor_count


def split_k_for(pairs: int, num_experts: int, hidden: int, inter: int, block_n: int, block_k: int, sms: int) -> int:
    """Automatic GEMM1 K split: >1 only at decode when GEMM1 would not fill the SMs.

    GEMM1 runs about ``min(E, pairs) x ceil(I / BLOCK_N)`` programs with work; if
    that is below the SM count the smallest power of two that reaches it is
    chosen, capped at ``SPLIT_K_MAX`` and at two BLOCK_K tiles of K per split.
    """
    if sms <= 0 or pairs > SPLIT_K_MAX_PAIRS:
        return 1
    programs = min(num_experts, pairs) * -(-inter // block_n)
    split = 1
    while programs * split < sms and split < SPLIT_K_MAX and hidden // (2 * split) >= 2 * block_k:
        split *= 2
    return split


def resolve_split_k(scheme: str, num_experts: int, hidden: int, inter: int, top_k: int, m: int, cfg, device) -> int:
    """The split this forward runs: the override, else the config's, else 1 (``split_k_for`` if AUTO_SPLIT_K)."""
    if SPLIT_K_OVERRIDE > 0:
        return SPLIT_K_OVERRIDE
    if cfg.split_k > 0:
        return cfg.split_k
    if not AUTO_SPLIT_K:
        return 1
    g = cfg.gemm1
    return split_k_for(m * top_k, num_experts, hidden, inter, g.block_n, g.block_k, sm_count(torch.device(device)))


def heuristic_config(scheme: str, num_experts: int, hidden: int, inter: int, top_k: int, m: int) -> KernelConfig:
    """A reasonable default from the rows each expert sees on average."""
    rows_per_expert = m * top_k / num_experts
    block_m = 16 if rows_per_expert <= 16 else 32 if rows_per_expert <= 48 else 64 if rows_per_expert <= 192 else 128
    block_k = max(64, min_block_k(scheme))
    warps = 4 if block_m <= 32 else 8
    gemm = GemmConfig(block_n=64 if block_m <= 64 else 128, block_k=block_k, group_m=8, num_warps=warps, num_stages=3)
    return KernelConfig(block_m, gemm, gemm)


@functools.cache
def _load_table(slug: str, directory: str | None) -> dict:
    if directory is not None:
        path = Path(directory) / f"{slug}.json"
        return json.loads(path.read_text()) if path.exists() else {}
    ref = resources.files("moe_triton.kernel_configs") / f"{slug}.json"
    return json.loads(ref.read_text()) if ref.is_file() else {}


def tuned_entry(slug: str, key: str, directory: str | None = None) -> dict[int, KernelConfig] | None:
    table = _load_table(slug, directory)
    entry = table.get("entries", {}).get(key)
    if entry is None:
        return None
    return {int(m): KernelConfig.from_dict(c) for m, c in entry.items()}


@functools.lru_cache(maxsize=4096)
def _select(scheme, num_experts, hidden, inter, top_k, m, slug) -> KernelConfig:
    entry = tuned_entry(slug, table_key(scheme, num_experts, hidden, inter, top_k))
    if entry:
        nearest = min(entry, key=lambda k: (abs(k - m), k))
        return sanitize(entry[nearest], scheme)  # an older table's tiles made legal once, here, not per forward
    return heuristic_config(scheme, num_experts, hidden, inter, top_k, m)


def select_config(scheme: str, num_experts: int, hidden: int, inter: int, top_k: int, m: int, device) -> KernelConfig:
    """The tuned config for this shape on this device, else the heuristic."""
    return _select(scheme, num_experts, hidden, inter, top_k, m, device_slug(torch.device(device)))


def config_source(scheme: str, num_experts: int, hidden: int, inter: int, top_k: int, device) -> str:
    """'tuned (<file>)' or 'heuristic' — for reports."""
    slug = device_slug(torch.device(device))
    found = tuned_entry(slug, table_key(scheme, num_experts, hidden, inter, top_k))
    return f"tuned ({slug}.json)" if found else "heuristic"
