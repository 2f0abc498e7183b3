"""Tile configurations: a heuristic default plus tuned tables shipped as JSON.

A table file ``<device>.json`` (device name with non-alphanumerics replaced by
``_``, e.g. ``NVIDIA_H200.json``) holds entries keyed by the layer shape and
scheme, each mapping token counts M to a ``KernelConfig``; a forward with M
tokens uses the entry whose M is nearest (as vLLM's tables do). Shapes that
no table covers get ``heuristic_config``. ``moe tune triton`` writes tables.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path

import torch


@dataclass(frozen=True)
class GemmConfig:
    block_n: int = 64
    block_k: int = 64
    group_m: int = 8
    num_warps: int = 4
    num_stages: int = 3


@dataclass(frozen=True)
class KernelConfig:
    """BLOCK_M is shared (the alignment pads to it); each GEMM has its own tiles."""

    block_m: int = 64
    gemm1: GemmConfig = field(default_factory=GemmConfig)
    gemm2: GemmConfig = field(default_factory=GemmConfig)

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> KernelConfig:
        return cls(d["block_m"], GemmConfig(**d["gemm1"]), GemmConfig(**d["gemm2"]))


def device_slug(device: torch.device) -> str:
    if device.type != "cuda":
        return "cpu"
    return re.sub(r"[^A-Za-z0-9]+", "_", torch.cuda.get_device_name(device)).strip("_")


def table_key(scheme: str, num_experts: int, hidden: int, inter: int, top_k: int) -> str:
    return f"{scheme},E={num_experts},H={hidden},I={inter},k={top_k}"


def min_block_k(scheme: str) -> int:
    """fp8_block quantizes activations per 128 columns inside one K tile."""
    return 128 if scheme == "fp8_block" else 32 if scheme == "mxfp4" else 16


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
    ref = resources.files("moe_triton.configs") / f"{slug}.json"
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
        return entry[nearest]
    return heuristic_config(scheme, num_experts, hidden, inter, top_k, m)


def select_config(scheme: str, num_experts: int, hidden: int, inter: int, top_k: int, m: int, device) -> KernelConfig:
    """The tuned config for this shape on this device, else the heuristic."""
    return _select(scheme, num_experts, hidden, inter, top_k, m, device_slug(torch.device(device)))


def config_source(scheme: str, num_experts: int, hidden: int, inter: int, top_k: int, device) -> str:
    """'tuned (<file>)' or 'heuristic' — for reports."""
    slug = device_slug(torch.device(device))
    found = tuned_entry(slug, table_key(scheme, num_experts, hidden, inter, top_k))
    return f"tuned ({slug}.json)" if found else "heuristic"
