"""Tile configurations: a heuristic default plus tuned tables as JSON.

A table file ``<device>.json`` (device name with non-alphanumerics replaced by
``_``, e.g. ``NVIDIA_H200.json``) holds entries keyed by the layer shape and
scheme, each mapping token counts M to a ``KernelConfig``; a forward with M
tokens uses the entry whose M is nearest (as vLLM's tables do).

Two tables are read per device: the user's, written by ``moe tune triton``
into ``user_table_path`` (``$MOE_TRITON_TABLE_DIR``, else
``$MOE_CACHE_DIR/triton``, else the user cache directory's ``moe/triton``;
never the installed package, which may be read-only and is replaced on
upgrade), and the one shipped in this package. The user's token counts of a
shape key replace the shipped ones at the same M; the shipped table's other
Ms stay; shapes neither covers get ``heuristic_config``. A user table that
cannot be read or parsed is ignored with a warning naming it. Tables are read once per process and device;
``clear_cache()`` makes the next forward read them again (the tuner calls it
after every write).

``split_k`` (GEMM1's K split) is 0 = "decide at launch" (``resolve_split_k``)
in the heuristic and in table entries without the field; a tuned entry may pin
it (1 = off). ``split_k2`` is GEMM2's (1 = off, the default). The runtime
switches (``moe_triton.switches``) may force GEMM1's split or let a heuristic
choose it.
"""

from __future__ import annotations

import functools
import json
import re
import warnings
from dataclasses import asdict, dataclass, field, replace
from importlib import resources
from pathlib import Path

import torch

from moe_core.paths import user_dir
from moe_triton.switches import Switches, current_switches


@dataclass(frozen=True)
class GemmConfig:
    """One GEMM's tiles. ``swap_ab``: compute the transposed product, weights as the MMA's first operand,
    so the token rows become the MMA's N (Hopper's ``wgmma`` takes 8-wide steps there but needs 64 rows on
    its first operand: a 16-row decode tile in the plain order compiles to Ampere-style ``mma.sync``);
    for MXFP4 that operand may live in registers, so the decoded tile feeds ``wgmma`` without a trip
    through shared memory.

    ``tma`` (bf16/fp16 and fp8_block on SM90+, ``launch.tma_applies``): the weight tiles, and GEMM2's
    intermediate tiles where its rows are the aligned blocks, come in through tensor descriptors (the
    tensor memory accelerator's bulk copies): no per-element address registers, which the plain loads'
    pointer tiles spend at large tiles, and copies the software pipeline overlaps with the MMAs. Where
    it does not apply the plain loads run; the tiles are the same.

    ``persistent`` (aligned routing, unsplit; else ignored): that many programs per SM, each walking the
    tiles in use in turn, instead of one program per tile — at large M a program's setup and epilogue
    overlap the next tile's loads and no program waits to be scheduled; 0 = one program per tile.

    ``tail_m`` (persistent walks only; 0 = off): a row block whose pairs fit in its first ``tail_m`` rows
    runs a ``tail_m``-row tile instead of a BLOCK_M one (swapped operands below 64 rows where BLOCK_N
    allows ``wgmma`` there). Each expert's rows end in such a block — at 1-2 blocks per expert most of
    the last one is padding — so large BLOCK_M keeps its few weight reads without computing the padding;
    a power of two in ``[16, BLOCK_M)``.

    ``whole_chunk`` (MXFP4 tiles that take K in order, ``whole_chunk_applies``; else ignored): one 64-deep MMA
    per 64-value chunk instead of one per 32-value half (``kernels.gemm._cat_k``), so no MMA of a K step
    waits for another into the same accumulator; the same products in the same order. What it gains depends
    on the tile (it frees the K loop's waits but holds a chunk's whole decoded tile in registers), so the
    tuner times it per GEMM; the ``mxfp4_whole_chunk`` switch, when set, overrides it."""

    block_n: int = 64
    block_k: int = 64
    group_m: int = 8
    num_warps: int = 4
    num_stages: int = 3
    swap_ab: bool = False
    tma: bool = False
    persistent: int = 0
    tail_m: int = 0
    whole_chunk: bool = False

    def __post_init__(self) -> None:
        for name in ("swap_ab", "tma", "whole_chunk"):  # a table's "yes" or 1 would reach a kernel as a constexpr
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false, got {getattr(self, name)!r}")


def whole_chunk_applies(scheme: str, block_m: int, tiles: GemmConfig) -> bool:
    """Whether ``GemmConfig.whole_chunk`` changes a tile: MXFP4 whose MMA takes K in the order the chunk
    stores it — swapped operands, or at least 64 rows (``kernels.gemm``'s ``in_order``)."""
    return scheme == "mxfp4" and (tiles.swap_ab or block_m >= 64)


@dataclass(frozen=True)
class KernelConfig:
    """BLOCK_M is shared (the alignment pads to it); each GEMM has its own tiles.

    ``split_k``: GEMM1's K split (0 = auto at launch, 1 = off); ``split_k2``: GEMM2's (1 = off). Each
    GEMM reduces its own partials in the same launch (``kernels.split``); they sit here beside the tiles
    because the tuner and the tables treat them per layer shape and token count.

    ``pdl``: launch the forward's kernels with programmatic dependent launch (CUDA SM90+; the ``pdl``
    switch, when set, overrides it). Whether it pays depends on the shape and token count (it moves a
    forward either way by a few percent), so the tuner measures the whole forward both ways and sets it
    where it was faster.
    """

    block_m: int = 64
    gemm1: GemmConfig = field(default_factory=GemmConfig)
    gemm2: GemmConfig = field(default_factory=GemmConfig)
    split_k: int = 0
    split_k2: int = 1
    pdl: bool = False

    def __post_init__(self) -> None:
        for name, g in (("gemm1", self.gemm1), ("gemm2", self.gemm2)):
            t = g.tail_m
            if t and (t & (t - 1) or not 16 <= t < self.block_m):
                raise ValueError(f"{name}.tail_m={t} must be 0 or a power of two in [16, block_m={self.block_m})")

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> KernelConfig:
        gemm1, gemm2 = GemmConfig(**d["gemm1"]), GemmConfig(**d["gemm2"])
        pdl = d.get("pdl", False)
        if not isinstance(pdl, bool):
            raise ValueError(f"pdl must be true or false, got {pdl!r}")
        return cls(d["block_m"], gemm1, gemm2, int(d.get("split_k", 0)), int(d.get("split_k2", 1)), pdl)


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


#: direct routing while the pairs are at most this fraction of the experts (or M == 1)
DIRECT_EXPERTS_PER_PAIR = 8


def direct_decode(m: int, top_k: int, num_experts: int) -> bool:
    """Whether a forward of ``m`` tokens skips the alignment (``launch`` direct routing: one row block per
    (token, slot) pair). A pair's block reads its expert's weights even when another pair has the same
    expert, so this holds only while such repeats are rare: one token (its k experts are distinct), or at
    most one pair per ``DIRECT_EXPERTS_PER_PAIR`` experts. It saves the alignment and slot-sum launches."""
    return m == 1 or m * top_k * DIRECT_EXPERTS_PER_PAIR <= num_experts


def min_block_k(scheme: str) -> int:
    """fp8_block quantizes activations per 128 columns inside one K tile; mxfp4 walks 64-wide prepared chunks."""
    return 128 if scheme == "fp8_block" else 64 if scheme == "mxfp4" else 16


def legal_block_k(scheme: str, block_k: int) -> int:
    """The nearest BLOCK_K at or above ``block_k`` the scheme's kernels accept (fp8_block: 128; mxfp4: a
    multiple of 64; others: at least 16)."""
    if scheme == "fp8_block":
        return 128
    step = min_block_k(scheme)
    return max(step, -(-block_k // step) * step)


def sanitize(cfg: KernelConfig, scheme: str) -> KernelConfig:
    """Make BLOCK_K legal for the scheme (``legal_block_k``), e.g. for an older table; GEMM2's split at
    least 1 (it has no automatic choice, so 0 = off)."""

    def fix(g: GemmConfig) -> GemmConfig:
        bk = legal_block_k(scheme, g.block_k)
        return g if bk == g.block_k else replace(g, block_k=bk)

    return replace(cfg, gemm1=fix(cfg.gemm1), gemm2=fix(cfg.gemm2), split_k2=max(cfg.split_k2, 1))


#: the SMs a launch that sizes itself by the SM count assumes in the CPU interpreter (which has none): few, so
#: that tests exercise a persistent walk over several tiles and the gated router's K split beside its unsplit form
INTERPRETER_SMS = 2


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


def resolve_split_k(
    scheme: str, num_experts: int, hidden: int, inter: int, top_k: int, m: int, cfg, device,
    switches: Switches | None = None,
) -> int:  # fmt: skip
    """The split this forward runs: the ``split_k`` switch if set, else the config's, else 1
    (``split_k_for`` with the ``auto_split_k`` switch). ``switches``: None reads ``current_switches()``."""
    sw = switches or current_switches()
    if sw.split_k > 0:
        return sw.split_k
    if cfg.split_k > 0:
        return cfg.split_k
    if not sw.auto_split_k:
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


#: moves the user's tuned tables (default ``$MOE_CACHE_DIR/triton`` or the user cache directory's ``moe/triton``)
TABLE_DIR_VAR = "MOE_TRITON_TABLE_DIR"
#: the package folder of the shipped tables
SHIPPED_PACKAGE = "moe_triton.kernel_configs"


def user_table_path(slug: str) -> Path:
    """Where ``moe tune triton`` writes this device's table and where a forward looks first (read now)."""
    return user_dir("triton", TABLE_DIR_VAR) / f"{slug}.json"


def parse_table(text: str) -> dict[str, dict[int, KernelConfig]]:
    """A table file's entries: shape key -> token count -> config. Raises on anything malformed, so a bad
    file is refused whole rather than failing a forward that reaches its bad entry."""
    table = json.loads(text)
    entries = table.get("entries", {}) if isinstance(table, dict) else None
    if not isinstance(entries, dict):
        raise ValueError("not a table: no 'entries' object")
    return {key: {int(m): KernelConfig.from_dict(c) for m, c in per_m.items()} for key, per_m in entries.items()}


@functools.cache
def shipped_table(slug: str) -> dict[str, dict[int, KernelConfig]]:
    """The entries of the table shipped for this device (empty where none is)."""
    ref = resources.files(SHIPPED_PACKAGE) / f"{slug}.json"
    return parse_table(ref.read_text()) if ref.is_file() else {}


def shipped_slugs() -> list[str]:
    """The devices a table is shipped for (their ``device_slug``)."""
    files = resources.files(SHIPPED_PACKAGE).iterdir()
    return sorted(f.name.removesuffix(".json") for f in files if f.name.endswith(".json"))


def user_table(slug: str) -> dict[str, dict[int, KernelConfig]]:
    """The entries of the user's table for this device; empty if there is none, and empty with a warning
    naming the file if it cannot be read or parsed (the shipped table then applies alone)."""
    path = user_table_path(slug)
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    except OSError as exc:
        warnings.warn(f"ignoring the tuned table {path}: cannot read it ({exc}); using the shipped table",
                      RuntimeWarning, stacklevel=2)  # fmt: skip
        return {}
    try:
        return parse_table(text)
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        warnings.warn(f"ignoring the tuned table {path}: it is not a valid table ({type(exc).__name__}: {exc}); "
                      f"using the shipped table (delete or re-tune it)", RuntimeWarning, stacklevel=2)  # fmt: skip
        return {}


@functools.cache
def tables(slug: str) -> dict[str, dict[int, KernelConfig]]:
    """The entries a forward on this device uses: per shape key, the shipped table's token counts with the
    user's table's over them (a tune of one M leaves the shipped configs of the other Ms in force). Read
    once per process (``clear_cache``)."""
    return merge_tables(shipped_table(slug), user_table(slug))


def merge_tables(shipped: dict, user: dict) -> dict[str, dict[int, KernelConfig]]:
    """Per shape key, the shipped entries' token counts with the user's over them."""
    return {key: {**shipped.get(key, {}), **user.get(key, {})} for key in {**shipped, **user}}


def tuned_entry(slug: str, key: str) -> dict[int, KernelConfig] | None:
    """Token count -> config of one shape key on this device (user table first, then shipped), or None."""
    return tables(slug).get(key)


def clear_cache() -> None:
    """Forget the tables read and the configs selected, so the next forward reads the tables again: after
    a table was written in this process, or ``MOE_TRITON_TABLE_DIR`` / ``MOE_CACHE_DIR`` changed."""
    tables.cache_clear()
    _select.cache_clear()


def entry_at(entry: dict[int, KernelConfig], m: int, scheme: str) -> KernelConfig:
    """The config of one table entry (token count -> config) a forward of ``m`` tokens uses: the nearest
    token count's (a tie goes to the smaller), its tiles made legal for ``scheme`` (``sanitize``)."""
    return sanitize(entry[min(entry, key=lambda k: (abs(k - m), k))], scheme)


@functools.lru_cache(maxsize=4096)
def _select(scheme, num_experts, hidden, inter, top_k, m, slug) -> KernelConfig:
    entry = tuned_entry(slug, table_key(scheme, num_experts, hidden, inter, top_k))
    if entry:
        return entry_at(entry, m, scheme)  # an older table's tiles made legal once, here, not per forward
    return heuristic_config(scheme, num_experts, hidden, inter, top_k, m)


def select_config(scheme: str, num_experts: int, hidden: int, inter: int, top_k: int, m: int, device) -> KernelConfig:
    """The tuned config for this shape on this device (user table, then shipped), else the heuristic."""
    return _select(scheme, num_experts, hidden, inter, top_k, m, device_slug(torch.device(device)))
