"""``moe warmup flashinfer_mxfp4``: build FlashInfer's JIT kernels ahead of the first runner.

FlashInfer compiles its fused-MoE kernels with nvcc on first use, into
``~/.cache/flashinfer/<version>/<arch>/cached_ops/`` (``FLASHINFER_WORKSPACE_BASE``
moves it). The SM90 CUTLASS module ``fused_moe_90`` is ~248 CUTLASS
translation units + a link step (~249 ninja edges) for every dtype combination
FlashInfer supports, not only W4A16; there is no supported way to build a
subset. Measured on an H200 host with 16 cores: a partial build compiled 36
units in 9.5 minutes, so a cold build takes about an hour. Without warm-up that
hour is spent inside the first ``MoeRunner`` (in ``prepare``: even the SM90
weight interleave helper lives in that module).

The prebuilt alternative: ``flashinfer-jit-cache`` (contains ``fused_moe_90``,
``fused_moe_100``, the trtllm-gen module) and ``flashinfer-cubin`` (the
trtllm-gen GEMM cubins the SM100 path otherwise downloads), each of EXACTLY
the installed flashinfer-python version (plus a ``+cuXYZ`` local tag for your
CUDA); FlashInfer ignores a mismatched one with a warning and compiles anyway.
They are published at https://flashinfer.ai/whl/<cuXYZ>/ (flashinfer-cubin
also on PyPI for some versions).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

from moe_core.errors import BackendUnavailableError
from moe_core.fused_op import Support
from moe_core.requirements import distribution_version
from moe_flashinfer_mxfp4 import devices, kernel, requirements, sm90_engine

#: measured on an H200 host, 16 cores, flashinfer 0.7.4, CUDA 13.0: 36 units in 9.5 min
SM90_UNITS_PER_MINUTE = 36 / 9.5
SM90_MEASURED = "36 of its units compiled in 9.5 min on an H200 host with 16 cores"
#: the slim module (moe_flashinfer_mxfp4.slim), measured on the H200 host: whole build (43 units, stubs,
#: link) in 390 s with 16 jobs
SLIM_ESTIMATE = "43 compile units + a stub unit and the link; 6.5 min on the H200 host's 16 cores"


def prebuilt_hint(version) -> str:
    return (
        f"prebuilt alternative: flashinfer-jit-cache=={version.public} (+cuXYZ for your CUDA) and, for SM100, "
        f"flashinfer-cubin=={version.public}, from https://flashinfer.ai/whl/<cuXYZ>/ — the exact same version as "
        "flashinfer-python, or FlashInfer ignores them"
    )


def _prebuilt_status(version, progress) -> None:
    for dist in ("flashinfer-jit-cache", "flashinfer-cubin"):
        have = distribution_version(dist)
        if have is None:
            continue
        if have.public != version.public:
            progress(f"{dist} {have} is installed but flashinfer-python is {version}: FlashInfer will ignore it")
        else:
            progress(f"{dist} {have} is installed (prebuilt kernels for this version)")


def _count(paths) -> int:
    return sum(1 for p in paths if p.exists())


def build_with_progress(
    spec,
    progress: Callable[[str], None],
    *,
    units_per_minute: float | None = None,
    measured: str = "",
    interval: float = 30.0,
) -> str:
    """``spec.build_and_load()`` with progress lines every ``interval`` s; returns how it went.

    Progress is the number of object files present in the module's build
    directory (ninja writes one per compile unit); the ETA comes from the
    measured rate until this build has its own.
    """
    name = getattr(spec, "name", "the module")
    if getattr(spec, "is_aot", False):
        progress(f"{name}: a prebuilt (AOT) copy is installed; loading it")
        spec.build_and_load()
        return f"{name} loaded from the prebuilt cache"
    objects = list(spec.get_object_paths()) if hasattr(spec, "get_object_paths") else []
    total = len(objects)
    done_before = _count(objects)
    built = bool(getattr(spec, "is_compiled", False)) and done_before == total
    if built:
        progress(f"{name}: already built ({total} units); ninja checks it is up to date")
    else:
        jobs = os.environ.get("MAX_JOBS", "ninja's default (cores + 2)")
        estimate = ""
        if units_per_minute:
            minutes = (total - done_before + 1) / units_per_minute
            estimate = f"; estimate ~{minutes:.0f} min ({measured})"
        progress(
            f"{name}: JIT build of {total} compile units + link, {done_before} already compiled, "
            f"MAX_JOBS={jobs}{estimate}"
        )
    stop = threading.Event()
    started = time.monotonic()

    def report() -> None:
        while not stop.wait(interval):
            done = _count(objects)
            elapsed = (time.monotonic() - started) / 60
            rate = (done - done_before) / elapsed if elapsed > 0 else 0.0
            eta = ""
            if rate > 0:
                eta = f", ~{(total - done) / rate:.0f} min left at this build's rate"
            elif units_per_minute:
                eta = f", ~{(total - done) / units_per_minute:.0f} min left at the measured rate"
            progress(f"{name}: {done}/{total} units compiled after {elapsed:.1f} min{eta}")

    thread = threading.Thread(target=report, name=f"moe-warmup-{name}", daemon=True)
    if not built and total:
        thread.start()
    try:
        spec.build_and_load()
    finally:
        stop.set()
        if thread.is_alive():
            thread.join(timeout=1)
    minutes = (time.monotonic() - started) / 60
    return f"{name} built and loaded in {minutes:.1f} min" if not built else f"{name} is built and loads"


def warmup(op_cls, progress: Callable[[str], None]) -> Support:
    try:
        return _warmup(op_cls, progress)
    except BackendUnavailableError as exc:  # flashinfer import, symbols, layout probe: the reason, no traceback
        return Support.no(str(exc))


def _warmup(op_cls, progress: Callable[[str], None]) -> Support:
    here = op_cls.available()
    if not here:
        return Support.no(here.reason)
    paths, reasons = devices.machine_paths()
    for reason in reasons:
        progress(f"skipped {reason}")
    progress("importing flashinfer (a few seconds)")
    fi = kernel.load()
    _prebuilt_status(fi.version, progress)
    done = []
    if devices.SM90_CUTLASS in paths:
        kernel.verify_sm90_layout(fi)
        progress(f"flashinfer {fi.version}: SM90 W4A16 layout verified (v2 by version and by probe)")
        engine = sm90_engine.choose(fi)
        progress(f"SM90 kernels: {engine.describe()}")
        if engine.kind == sm90_engine.SLIM:
            done.append(_warm_slim(progress))
        else:
            progress(f"{prebuilt_hint(fi.version)}")
            spec = fi.gen_cutlass_fused_moe_sm90_module()
            done.append(
                build_with_progress(spec, progress, units_per_minute=SM90_UNITS_PER_MINUTE, measured=SM90_MEASURED)
            )
    if devices.SM100_TRTLLM in paths:
        kernel.verify_trtllm_rows(fi)
        progress("generating the trtllm-gen module spec (fetches kernel cubins unless flashinfer-cubin is installed)")
        try:
            spec = fi.gen_trtllm_gen_fused_moe_sm100_module()
        except Exception as exc:
            return Support.no(
                f"could not prepare FlashInfer's trtllm-gen MoE module ({type(exc).__name__}: {exc}); on a machine "
                f"without network install flashinfer-cubin=={fi.version.public} or point FLASHINFER_CUBIN_DIR at a "
                f"populated cubin directory; {prebuilt_hint(fi.version)}"
            )
        done.append(build_with_progress(spec, progress))
        progress("the small fp4_quantization module (block-scale interleave used by prepare) builds on first use")
    return Support(True, "; ".join(done))


def _warm_slim(progress) -> str:
    module = sm90_engine.load_slim(progress, warmup=True)  # loads: a broken library fails here, not in a runner
    return f"slim SM90 W4A16 module built and loads ({module.library})"


WARMUP_OR_NAME = "run `moe warmup flashinfer_mxfp4`, or name the backend to build it on first use"


def first_use_support() -> Support:
    """The support check's last word on the SM90 path (everything else supported): ``yes`` when the module the
    bound op will run (``sm90_engine.expected``) is built or prebuilt, ``explicit_only`` when its first use would
    build it, ``no`` when that cannot be found out or may not happen (``build_support``). Nothing is cached."""
    try:
        engine = sm90_engine.expected()
    except BackendUnavailableError as exc:  # importing flashinfer, a bad MOE_FLASHINFER_MXFP4_SM90_MODULE, ...
        return Support.no(str(exc).removeprefix("flashinfer_mxfp4: "))
    except Exception as exc:  # finding out must never break ``auto``: refuse with what went wrong
        return Support.no(
            f"could not find out whether FlashInfer's SM90 MoE module is built ({type(exc).__name__}: {exc})"
        )
    return build_support(engine)


def build_support(engine: sm90_engine.Engine) -> Support:
    """``Support`` for an SM90 problem whose op would bind ``engine``: plain yes once it is built."""
    if engine.built:
        return Support.yes()
    slim = engine.kind == sm90_engine.SLIM
    module = "the slim SM90 W4A16 module" if slim else "FlashInfer's full SM90 module fused_moe_90"
    version = requirements.installed()
    if os.environ.get("FLASHINFER_DISABLE_JIT"):  # prepare would refuse to build it: say so now
        prebuilt = ""
        if not slim and version is not None:
            prebuilt = f" (or install flashinfer-jit-cache {version.public} for your CUDA)"
        return Support.no(
            f"FLASHINFER_DISABLE_JIT is set and {module} is not built ({engine.reason}); run "
            f"`moe warmup flashinfer_mxfp4`{prebuilt} first"
        )
    if slim:
        return Support.explicit_only(f"would build {module} first ({SLIM_ESTIMATE}); {WARMUP_OR_NAME}")
    hint = f"; {prebuilt_hint(version)}" if version is not None else ""
    return Support.explicit_only(
        f"would build {module} first (about an hour on 16 cores: {SM90_MEASURED}; {engine.reason}); "
        f"{WARMUP_OR_NAME}{hint}"
    )


def cold_build_notice(fi, path: str, engine=None) -> str | None:
    """A warning text when the first prepare is about to compile a FlashInfer module (minutes or an hour)."""
    if path != devices.SM90_CUTLASS:
        return None
    if engine is not None and engine.built:
        return None
    if engine is not None and engine.kind == sm90_engine.SLIM:
        return (
            f"flashinfer_mxfp4: the slim SM90 W4A16 module is not built; this runner's prepare builds it now "
            f"({SLIM_ESTIMATE}). Run `moe warmup flashinfer_mxfp4` ahead of time. Chosen because {engine.reason}."
        )
    spec = fi.gen_cutlass_fused_moe_sm90_module()
    if getattr(spec, "is_aot", False) or getattr(spec, "is_compiled", False):
        return None
    if os.environ.get("FLASHINFER_DISABLE_JIT"):
        return None  # prepare raises with the reason instead
    units = len(spec.get_object_paths()) + 1
    return (
        f"flashinfer_mxfp4: FlashInfer's JIT module {spec.name} is not built; this runner's prepare builds it now "
        f"({units} ninja steps, about {units / SM90_UNITS_PER_MINUTE:.0f} min on 16 cores). Run "
        f"`moe warmup flashinfer_mxfp4` ahead of time, or {prebuilt_hint(fi.version)}"
    )
