"""The measured selection table: which backend ran a problem fastest on this device (``moe select``).

``backend="auto"`` consults it before priorities: fixed priorities cannot know that a tuned Triton kernel
beats a library kernel on one GPU and loses on another, or that a third-party plugin is slower than the
reference. ``moe select record`` times every usable backend for a problem and stores the times here;
``moe select show`` / ``clear`` manage the file.

**Where.** ``moe_core.paths.user_dir("selection", "MOE_SELECTION_DIR") / "table.json"``: a record learned on
this machine, never inside a package.

**Key.** A record holds the device (name and compute capability), the torch version, the problem (scheme,
activation, dtype, E, k, H, I, bias) and, per backend, its distribution and version, the token counts and
the µs at each (the median on a GPU, the fastest sample on a CPU: ``moe_core.bench_rows.rank_by``), ``hot``
(the same weights every call) and, where measured, ``cold`` (weights rotated past the GPU's L2, as in a
model of many layers). A record applies only when all of that matches what is installed now; one whose
torch or backend version changed is *stale*: ignored with a warning (record it again). An unreadable file is
ignored with a warning, never an error. A backend recorded but no longer installed is simply not a
candidate.

**Rule** (``MOE_SELECTION_RULE``, default ``decode``). For the candidates with a record, over the token counts
all of them were timed at (cold times when every one has them, else hot), each backend's score is the
weighted mean of its time divided by the fastest time at that count — relative, so a prefill count's large
absolute times do not drown decode. ``decode`` weighs counts of at most ``DECODE_TOKENS`` four times the
others, ``prefill`` the reverse, ``uniform`` all alike. The lowest score wins; scores within ``TIE`` (1 %)
of the best are a tie, which priority (then name) breaks. Candidates without a record rank after every
measured one, by priority.
"""

from __future__ import annotations

import copy
import datetime
import json
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch

from moe_core.config import MoeConfig, MoeProblem
from moe_core.dtypes import short_name
from moe_core.paths import user_dir

FORMAT = 1
DIR_VAR = "MOE_SELECTION_DIR"
RULE_VAR = "MOE_SELECTION_RULE"
FILE_NAME = "table.json"
#: token counts up to this are "decode" for the rules
DECODE_TOKENS = 64
#: relative score difference below which two backends tie (priority decides)
TIE = 0.01
RULES = {
    "decode": lambda m: 4.0 if m <= DECODE_TOKENS else 1.0,
    "prefill": lambda m: 1.0 if m <= DECODE_TOKENS else 4.0,
    "uniform": lambda m: 1.0,
}
DEFAULT_RULE = "decode"


class SelectionTableWarning(UserWarning):
    """A selection table or record that ``auto`` ignores (unreadable, stale)."""


def table_path() -> Path:
    return user_dir("selection", DIR_VAR) / FILE_NAME


def rule_name(rule: str | None = None) -> str:
    """``rule``, else ``$MOE_SELECTION_RULE``, else ``decode``; an unknown name is a ``ValueError``."""
    name = rule or os.environ.get(RULE_VAR) or DEFAULT_RULE
    if name not in RULES:
        raise ValueError(f"unknown selection rule {name!r} ({RULE_VAR}); known: {', '.join(RULES)}")
    return name


def device_key(device: torch.device) -> dict:
    device = torch.device(device)
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        return {"type": "cuda", "name": torch.cuda.get_device_name(device), "capability": f"{major}.{minor}"}
    return {"type": device.type, "name": device.type, "capability": None}


def problem_key(config: MoeConfig) -> dict:
    return {
        "scheme": config.quant_scheme,
        "activation": config.activation,
        "dtype": short_name(config.dtype),
        "experts": config.num_experts,
        "top_k": config.top_k,
        "hidden": config.hidden_size,
        "intermediate": config.intermediate_size,
        "bias": config.has_bias,
        "a2a": config.a2a_backend,
    }


def torch_version() -> str:
    return torch.__version__.split("+")[0]


@dataclass(frozen=True)
class Measurement:
    """One backend's times for one problem: µs by token count, hot and (where measured) cold."""

    backend: str
    distribution: str
    version: str
    hot_us: dict[int, float]
    cold_us: dict[int, float] = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {
            "backend": self.backend,
            "distribution": self.distribution,
            "version": self.version,
            "hot_us": {str(m): t for m, t in sorted(self.hot_us.items())},
            "cold_us": {str(m): t for m, t in sorted(self.cold_us.items())},
        }

    @classmethod
    def from_dict(cls, d: dict) -> Measurement:
        times = lambda key: {int(m): float(t) for m, t in (d.get(key) or {}).items()}
        return cls(str(d["backend"]), str(d["distribution"]), str(d["version"]), times("hot_us"), times("cold_us"))


# --- the file ---------------------------------------------------------------------------------------------------


#: path -> ((mtime_ns, size), records): every runner built with backend="auto" consults the table, and a model
#: builds one per layer; the file is read and parsed again only when it changed (an unreadable one warns once)
_READ: dict[Path, tuple[tuple[int, int], list[dict]]] = {}


def load(path: Path | None = None) -> list[dict]:
    """The records of the table (``[]`` where there is no file), a copy the caller may change; an unreadable
    file is warned about and ignored."""
    path = path or table_path()
    try:
        stat = path.stat()
    except FileNotFoundError:
        return []
    except OSError as exc:
        _warn(f"cannot read {path}: {exc}; backend='auto' ignores it")
        return []
    stamp = (stat.st_mtime_ns, stat.st_size)
    if path not in _READ or _READ[path][0] != stamp:
        _READ[path] = (stamp, _parse(path))
    return copy.deepcopy(_READ[path][1])


def _parse(path: Path) -> list[dict]:
    try:
        text = path.read_text()
    except OSError as exc:
        _warn(f"cannot read {path}: {exc}; backend='auto' ignores it")
        return []
    try:
        data = json.loads(text)
        if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("records"), list):
            raise ValueError(f"not a format-{FORMAT} selection table")
        for r in data["records"]:
            _check_record(r)
    except (ValueError, KeyError, TypeError) as exc:
        _warn(f"{path} is not a readable selection table ({exc}); backend='auto' ignores it (moe select clear)")
        return []
    return data["records"]


def _check_record(r) -> None:
    if not isinstance(r, dict) or not all(k in r for k in ("device", "torch", "problem", "backends")):
        raise ValueError("a record lacks device/torch/problem/backends")
    for b in r["backends"]:
        Measurement.from_dict(b)


def save(records: list[dict], path: Path | None = None) -> Path:
    """Write the table atomically (a reader never sees half a file)."""
    path = path or table_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps({"format": FORMAT, "records": records}, indent=1) + "\n")
    tmp.replace(path)
    return path


def record(problem: MoeProblem, measurements: list[Measurement], path: Path | None = None) -> Path:
    """Store ``measurements`` for ``problem`` on this device: they replace the same backends' earlier times for
    the same key (device, torch, problem); other backends' times in that record stay."""
    path = path or table_path()
    key = _key(problem)
    names = {m.backend for m in measurements}
    records = []
    for r in load(path):  # these backends' older times for this device and problem go, whatever their torch
        if _matches(r, key, torch_too=False):
            r["backends"] = [b for b in r["backends"] if b["backend"] not in names]
        if r["backends"]:
            records.append(r)
    mine = next((r for r in records if _matches(r, key)), None)
    if mine is None:
        mine = {**key, "backends": []}
        records.append(mine)
    mine["backends"] += [m.as_dict() for m in measurements]
    mine["recorded"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    return save(records, path)


def clear(path: Path | None = None) -> Path | None:
    """Remove the table; the path removed, or None when there was none."""
    path = path or table_path()
    try:
        path.unlink()
    except FileNotFoundError:
        return None
    return path


def _key(problem: MoeProblem) -> dict:
    return {"device": device_key(problem.device), "torch": torch_version(), "problem": problem_key(problem.config)}


def _matches(r: dict, key: dict, *, torch_too: bool = True) -> bool:
    return (
        r["device"] == key["device"]
        and r["problem"] == key["problem"]
        and (not torch_too or r["torch"] == key["torch"])
    )


def _warn(message: str) -> None:
    warnings.warn(f"moe selection table: {message}", SelectionTableWarning, stacklevel=4)


# --- ranking ----------------------------------------------------------------------------------------------------


@dataclass
class Ranking:
    """What the table says about some candidates: scores (lower is faster), the times compared, why others
    were left out. ``order`` is the measured candidates best first (ties broken by ``priorities``)."""

    rule: str
    mode: str | None = None
    counts: list[int] = field(default_factory=list)
    times: dict[str, dict[int, float]] = field(default_factory=dict)
    scores: dict[str, float] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)
    notes: dict[str, str] = field(default_factory=dict)


def rank(
    problem: MoeProblem,
    installed: dict[str, tuple[str, str]],
    priorities: dict[str, float],
    rule: str | None = None,
    path: Path | None = None,
) -> Ranking:
    """Rank the candidates ``installed`` (backend -> (distribution, version)) from the table (see the module
    docstring). Stale records are warned about and left out (``notes`` says so per backend)."""
    ranking = Ranking(rule_name(rule))
    key = _key(problem)
    usable: dict[str, Measurement] = {}
    stale: dict[str, str] = {}
    for r in load(path):
        if not _matches(r, key, torch_too=False):
            continue
        for b in r["backends"]:
            m = Measurement.from_dict(b)
            if m.backend not in installed:
                continue
            dist, version = installed[m.backend]
            if r["torch"] != key["torch"]:
                stale[m.backend] = f"recorded with torch {r['torch']}, torch {key['torch']} is installed"
            elif (m.distribution, m.version) != (dist, version):
                stale[m.backend] = f"recorded with {m.distribution} {m.version}, {dist} {version} is installed"
            else:
                usable[m.backend] = m
    for name, why in sorted(stale.items()):
        if name not in usable:
            ranking.notes[name] = f"stale record ignored: {why}"
            _warn(f"the record of backend {name!r} is stale ({why}); run `moe select record` again")
    if not usable:
        return ranking
    cold = all(m.cold_us for m in usable.values())
    ranking.mode = "cold" if cold else "hot"
    times = {name: (m.cold_us if cold else m.hot_us) for name, m in usable.items()}
    counts = sorted(set.intersection(*(set(t) for t in times.values())))
    if not counts:
        for name in times:
            ranking.notes[name] = "recorded, but at no token count that every measured backend shares"
        return ranking
    ranking.counts = counts
    ranking.times = {name: {c: t[c] for c in counts} for name, t in times.items()}
    weight = RULES[ranking.rule]
    best = {c: min(t[c] for t in ranking.times.values()) for c in counts}
    total = sum(weight(c) for c in counts)
    ranking.scores = {
        name: sum(weight(c) * t[c] / max(best[c], 1e-12) for c in counts) / total for name, t in ranking.times.items()
    }
    left = sorted(ranking.scores, key=lambda n: (ranking.scores[n], n))
    while left:
        top = ranking.scores[left[0]]
        tied = [n for n in left if ranking.scores[n] <= top * (1 + TIE)]
        pick = min(tied, key=lambda n: (-priorities.get(n, 0), n))
        ranking.order.append(pick)
        left.remove(pick)
    return ranking
