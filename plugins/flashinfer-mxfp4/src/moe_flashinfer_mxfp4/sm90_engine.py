"""Which FlashInfer module runs the SM90 W4A16 path: the slim one (``moe_flashinfer_mxfp4.slim``) or the full one.

FlashInfer's ``fused_moe_90`` serves every dtype combination and takes about
an hour to compile; the slim module holds only the bf16 x MXFP4 kernels and
compiles in minutes (numbers in the plugin README). Both run FlashInfer's
same binding and kernels on the same prepared weights. ``auto`` (default)
takes whichever is already built — slim first — and, when neither is, the
slim one, because it builds an order of magnitude faster. The choice and its
reason are reported (bind-time warning when a build is due, ``moe warmup``,
``op.sm90_engine``), and ``MOE_FLASHINFER_MXFP4_SM90_MODULE=slim|full``
overrides it. ``expected`` makes the same choice before binding, from files on
disk alone (no kernel import, no generated sources): the support check uses it
to keep ``backend="auto"`` off a backend whose first use would build.
"""

from __future__ import annotations

import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

from moe_core.errors import BackendUnavailableError

ENV = "MOE_FLASHINFER_MXFP4_SM90_MODULE"
SLIM, FULL, AUTO = "slim", "full", "auto"
CHOICES = (AUTO, SLIM, FULL)

log = logging.getLogger("moe_flashinfer_mxfp4.slim")


@dataclass(frozen=True)
class Engine:
    kind: str  # SLIM or FULL
    built: bool
    reason: str

    def describe(self) -> str:
        name = "slim W4A16 module" if self.kind == SLIM else "FlashInfer's full fused_moe_90 module"
        return f"{name} ({'built' if self.built else 'not built yet'}): {self.reason}"


def requested() -> str:
    value = os.environ.get(ENV, "").strip().lower() or AUTO
    if value not in CHOICES:
        raise BackendUnavailableError(f"flashinfer_mxfp4: {ENV}={value!r} is not one of {', '.join(CHOICES)}")
    return value


def full_module_ready(fi) -> bool:
    spec = fi.gen_cutlass_fused_moe_sm90_module()
    return bool(getattr(spec, "is_aot", False) or getattr(spec, "is_compiled", False))


def jit_env():
    """FlashInfer's JIT environment module (``import flashinfer``: seconds, once per process); the import's
    failure as ``BackendUnavailableError`` with the reason."""
    try:
        from flashinfer.jit import env
    except Exception as exc:  # ImportError, or a CUDA library problem surfacing at import (as ``kernel.load``)
        raise BackendUnavailableError(
            f"flashinfer_mxfp4: importing flashinfer failed ({type(exc).__name__}: {exc})"
        ) from exc
    return env


def full_module_name() -> str:
    """The name ``gen_cutlass_fused_moe_sm90_module`` gives FlashInfer's full SM90 module, without calling it
    (it generates the CUTLASS instantiation sources): ``fused_moe_90``, or the H20 variant of releases that have
    one."""
    try:
        from flashinfer.jit import fused_moe as jit_fused_moe
    except ImportError:
        return "fused_moe_90"
    h20 = getattr(jit_fused_moe, "_should_enable_sm90_moe_prebuilt_d_descriptor", None)
    return "fused_moe_90_h20_prebuilt_d" if callable(h20) and h20() else "fused_moe_90"


def full_module_on_disk() -> bool:
    """``full_module_ready`` from files alone: a prebuilt (AOT) copy FlashInfer would load, or its JIT library."""
    env = jit_env()
    name = full_module_name()
    if hasattr(env, "get_aot_artifacts"):  # flashinfer 0.7: per-architecture providers (flashinfer-jit-cache)
        prebuilt = bool(env.get_aot_artifacts(name))
    elif hasattr(env, "get_aot_path"):
        prebuilt = Path(env.get_aot_path(name)).exists()
    else:
        prebuilt = (Path(env.FLASHINFER_AOT_DIR) / name / f"{name}.so").exists()
    return prebuilt or (Path(env.FLASHINFER_JIT_DIR) / name / f"{name}.so").exists()


def slim_problem() -> str | None:
    """Why the slim module cannot be built or called here (None: it can)."""
    from moe_flashinfer_mxfp4.slim import SlimUnsupported
    from moe_flashinfer_mxfp4.slim.module import check_binding, read_binding_source

    try:
        check_binding(read_binding_source())
    except (SlimUnsupported, OSError) as exc:
        return str(exc)
    if shutil.which("nm") is None or shutil.which("c++filt") is None:
        return "binutils (nm, c++filt) are not on PATH"
    return None


def slim_built() -> bool:
    from moe_flashinfer_mxfp4.slim.build import is_built

    return is_built()


def choose(fi) -> Engine:
    """The module that runs the kernels for a bound op (``fi``: ``kernel.load()``)."""
    return _decide(lambda: full_module_ready(fi))


def expected() -> Engine:
    """What ``choose`` will answer at bind time, found out before: from files on disk and FlashInfer's JIT
    environment (imported), without loading kernels or generating sources. Nothing is cached: after
    ``moe warmup`` the next call sees the built module. ``BackendUnavailableError`` as ``choose``'s."""
    jit_env()
    return _decide(full_module_on_disk)


def _decide(full_ready) -> Engine:
    wanted = requested()
    if wanted == FULL:
        return Engine(FULL, full_ready(), f"{ENV}=full")
    problem = slim_problem()
    if wanted == SLIM:
        if problem:
            raise BackendUnavailableError(
                f"flashinfer_mxfp4: {ENV}=slim, but the slim module cannot be used: {problem}"
            )
        return Engine(SLIM, slim_built(), f"{ENV}=slim")
    if problem is None and slim_built():
        return Engine(SLIM, True, "the slim module is built")
    if full_ready():
        return Engine(FULL, True, "FlashInfer's fused_moe_90 is built or prebuilt")
    if problem is None:
        return Engine(SLIM, False, "neither module is built; the slim one compiles in minutes, the full one in ~1 h")
    return Engine(FULL, False, f"the slim module cannot be used here ({problem})")


def load_slim(progress=log.info, *, warmup: bool = False):
    """The slim library, loaded; built first if missing (refused under FLASHINFER_DISABLE_JIT unless warming up)."""
    from moe_flashinfer_mxfp4.slim import build
    from moe_flashinfer_mxfp4.slim.module import SlimW4A16Module

    if build.is_built():
        if warmup:
            report = build.last_report() or {}
            progress(f"slim module already built: {build.library_path()} ({report.get('compile_units', '?')} units)")
    elif os.environ.get("FLASHINFER_DISABLE_JIT") and not warmup:
        raise BackendUnavailableError(
            "flashinfer_mxfp4: FLASHINFER_DISABLE_JIT is set and the slim SM90 W4A16 module is not built; run "
            f"`moe warmup flashinfer_mxfp4` first (or set {ENV}=full to use a prebuilt fused_moe_90)"
        )
    else:
        build.build(progress=progress)
    return SlimW4A16Module(Path(build.library_path()))


def slim_namespace(fi, progress=log.info) -> SimpleNamespace:
    """``fi`` with the two calls that need the compiled module bound to the slim library (built if needed)."""
    module = load_slim(progress)
    return SimpleNamespace(
        **{
            **vars(fi),
            "interleave_moe_weights_for_sm90_mixed_gemm": module.interleave_moe_weights_for_sm90_mixed_gemm,
            "cutlass_fused_moe": module.cutlass_fused_moe,
            "slim_module": module,
        }
    )
