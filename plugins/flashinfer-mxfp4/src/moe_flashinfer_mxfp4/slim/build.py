"""Build the slim SM90 W4A16 module with FlashInfer's JitSpec + ninja, with progress and a timing report.

Two ninja runs over one build directory: first every compile unit (the
objects), then — once ``stubs`` has read their symbol tables and written the
stub source — the stub unit and the link. Ninja skips what is up to date, so
a rerun after an interruption resumes, and a rerun on a built module only
checks. The report's timings come from ninja's own log (``.ninja_log``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from moe_flashinfer_mxfp4.slim import sources, stubs

STUB_SOURCE_NAME = "moe_w4a16_missing_symbols.cpp"
REPORT_NAME = "moe_slim_build.json"


@dataclass
class SlimBuildReport:
    module: str
    flashinfer: str
    library: str
    compile_units: int  # translation units in this module (FlashInfer's fused_moe_90: ~248)
    generated_units: int
    instantiations: int
    left_out: int
    stubs: int
    jobs: int
    wall_seconds: float  # this build: both ninja runs, including the link
    compiled_now: int  # units compiled by this call (0: it was built already)
    library_bytes: int
    slowest_units: list = field(default_factory=list)  # [(unit, seconds)] from .ninja_log

    def summary(self) -> str:
        return (
            f"{self.module}: {self.compile_units} compile units ({self.generated_units} generated, "
            f"{self.instantiations} W4A16 GEMM instantiations, {self.left_out} never-offered twins left out, "
            f"{self.stubs} stubs) + link, "
            f"{self.compiled_now} compiled now in {self.wall_seconds / 60:.1f} min with {self.jobs} jobs; "
            f"{self.library_bytes / 2**20:.1f} MiB"
        )


def library_path() -> Path:
    """Where the slim module's shared library lives for the installed FlashInfer (no sources generated)."""
    from flashinfer.jit import env as jit_env

    name = sources.SLIM_MODULE_NAME
    return Path(jit_env.FLASHINFER_JIT_DIR) / name / f"{name}.so"


def is_built() -> bool:
    return library_path().exists()


def _ninja() -> str:
    try:
        import ninja  # the pip package FlashInfer depends on

        candidate = Path(ninja.BIN_DIR) / "ninja"
        if candidate.exists():
            return str(candidate)
    except ImportError:
        pass
    path = shutil.which("ninja")
    if path is None:
        raise stubs.StubError("ninja is needed to build the slim module (pip install ninja)")
    return path


def _run_ninja(build_dir: Path, targets: list[str], jobs: int, progress: Callable[[str], None]) -> None:
    cmd = [_ninja(), "-C", str(build_dir), "-f", "build.ninja", f"-j{jobs}", *targets]
    env = dict(os.environ, NINJA_STATUS="[%f/%t done, %es] ")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    tail: list[str] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        line = line.rstrip()
        tail = [*tail, line][-40:]
        if line.startswith("[") and " done, " in line:
            status, _, command = line.partition("] ")
            out = command.rsplit(" -o ", 1)[-1].split()[0] if " -o " in command else command[:80]
            progress(f"{status}] {Path(out).name}")
        elif line.startswith("FAILED"):
            progress(line)
    if proc.wait() != 0:
        raise RuntimeError(f"ninja failed in {build_dir} (exit {proc.returncode}); last lines:\n" + "\n".join(tail))


def _slowest(build_dir: Path, top: int = 5) -> list:
    log = build_dir / ".ninja_log"
    if not log.exists():
        return []
    latest: dict[str, float] = {}
    for line in log.read_text().splitlines()[1:]:
        parts = line.split("\t")
        if len(parts) >= 4:
            latest[Path(parts[3]).name] = (int(parts[1]) - int(parts[0])) / 1000
    return sorted(latest.items(), key=lambda kv: -kv[1])[:top]


def build(
    progress: Callable[[str], None] = print, jobs: int | None = None, group_size: int = sources.GROUP_SIZE
) -> SlimBuildReport:
    """Generate, compile, stub, link; returns the report (also written next to the library as JSON)."""
    import flashinfer

    jobs = jobs or int(os.environ.get("MAX_JOBS") or 0) or (os.cpu_count() or 1)
    started = time.monotonic()
    found = sources.slim_sources(group_size)
    spec = found.spec
    spec.write_ninja()
    build_dir = Path(spec.build_dir)
    objects = stubs.compiled_objects(Path(spec.ninja_path))
    missing_before = sum(1 for o in objects if not o.exists())
    progress(
        f"{spec.name}: {len(objects)} compile units ({len(found.generated)} generated files holding "
        f"{found.instantiations} bf16 x MXFP4 grouped GEMMs; FlashInfer's full fused_moe_90 has "
        f"{len(found.dropped) + len(found.kept)}), {missing_before} without an object yet, {jobs} jobs"
    )
    _run_ninja(build_dir, [str(o) for o in objects], jobs, progress)
    stub_path = build_dir / STUB_SOURCE_NAME
    stubbed = stubs.write_stubs(objects, stub_path, found.left_out)
    progress(
        f"{len(stubbed)} symbols stubbed (they raise if ever called): other dtype combinations' runners and the "
        f"{found.left_out} GEMM schedule twins FlashInfer's SM90 heuristic never offers"
    )
    linked = sources.with_extra_source(spec, stub_path)
    linked.write_ninja()
    _run_ninja(build_dir, [], jobs, progress)
    library = Path(linked.jit_library_path)
    if not library.exists():
        raise RuntimeError(f"ninja finished but {library} is missing")
    report = SlimBuildReport(
        module=spec.name,
        flashinfer=str(flashinfer.__version__),
        library=str(library),
        compile_units=len(objects) + 1,
        generated_units=len(found.generated),
        instantiations=found.instantiations,
        left_out=found.left_out,
        stubs=len(stubbed),
        jobs=jobs,
        wall_seconds=round(time.monotonic() - started, 1),
        compiled_now=missing_before,
        library_bytes=library.stat().st_size,
        slowest_units=_slowest(build_dir),
    )
    (build_dir / REPORT_NAME).write_text(json.dumps(asdict(report), indent=2))
    progress(report.summary())
    return report


def last_report() -> dict | None:
    path = library_path().parent / REPORT_NAME
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None
