"""Which sources the slim SM90 W4A16 module compiles, all taken from the installed FlashInfer.

Starting point is FlashInfer's own spec for ``fused_moe_90`` (so its nvcc
flags, include paths and link flags are the installed version's), then:

* generated CUTLASS instantiations: only the SM90 mixed-input grouped GEMMs
  with bf16 activations and E2M1 (MXFP4) weights, produced by FlashInfer's
  generator (``generate_sm90_mixed_type_grouped_gemm_operations``) and written
  with its ``write_file``; 184 instantiations instead of ~1800;
* fixed sources: the per-dtype GEMM runner files are dropped except
  ``moe_gemm_kernels_bf16_fp4.cu``, FlashInfer's all-dtype runner
  instantiation is replaced by ours (``csrc/w4a16_runner_instantiation.cu``),
  the DeepSeek FP8 block-scale GEMM is dropped; everything else (binding,
  weight interleave kernels, TMA input helpers, common utilities) is kept, so
  a source a later FlashInfer adds is compiled rather than silently missed.

Anything that does not look as expected raises ``SlimUnsupported`` with the
reason; callers then use FlashInfer's full module.
"""

from __future__ import annotations

import dataclasses
import re
from collections import defaultdict
from pathlib import Path

SLIM_MODULE_NAME = "moe_w4a16_fused_moe_90"
#: instantiations per generated file (FlashInfer uses 8): more files spread better over many cores
GROUP_SIZE = 4
OUR_INSTANTIATION = Path(__file__).with_name("csrc") / "w4a16_runner_instantiation.cu"
MIXED_LAUNCHER_INL = "tensorrt_llm/kernels/cutlass_kernels/moe_gemm/launchers/moe_gemm_tma_ws_mixed_input_launcher.inl"

_RUNNER_FILE = re.compile(r"^moe_gemm_kernels_(\w+?)_(\w+)\.cu$")
KEEP_RUNNER = "moe_gemm_kernels_bf16_fp4.cu"
REPLACED = "cutlass_fused_moe_instantiation.cu"
DROPPED = frozenset({"fp8_blockscale_gemm.cu"})


class SlimUnsupported(RuntimeError):
    """The installed FlashInfer does not have the shape the slim build relies on (the reason says what)."""


@dataclasses.dataclass(frozen=True)
class SlimSources:
    spec: object  # flashinfer JitSpecNvcc (without the stubs source)
    generated: tuple[Path, ...]
    kept: tuple[Path, ...]
    dropped: tuple[Path, ...]
    instantiations: int


def _fi():
    import flashinfer
    from flashinfer.jit import env as jit_env
    from flashinfer.jit.gemm.cutlass import generate_kernels

    return flashinfer, jit_env, generate_kernels


def w4a16_operations(generate_kernels) -> list:
    """FlashInfer's SM90 mixed-input grouped-GEMM operations for bf16 x E2M1, as its generator lists them."""
    ops = generate_kernels.generate_sm90_mixed_type_grouped_gemm_operations(True)
    bf16, e2m1 = generate_kernels.DataType.bf16, generate_kernels.e2m1
    mine = [op for op in ops if op.act_type == bf16 and op.weight_type == e2m1 and op.output_type == bf16]
    if not mine:
        raise SlimUnsupported(
            "FlashInfer's SM90 mixed-input generator lists no bf16 x E2M1 grouped GEMM; nothing to build"
        )
    return mine


def write_generated(generate_kernels, out_dir: Path, operations: list, group_size: int = GROUP_SIZE) -> list[Path]:
    """Write the operations with FlashInfer's ``write_file``, grouped by CTA M like FlashInfer groups them."""
    by_m = defaultdict(list)
    for op in operations:
        by_m[op.cta_shape[0]].append(op)
    out_dir.mkdir(parents=True, exist_ok=True)
    files = []
    for m, ops in sorted(by_m.items()):
        for i in range(0, len(ops), group_size):
            path = out_dir / f"moe_w4a16_sm90_M{m}_group{i // group_size}.generated.cu"
            generate_kernels.write_file([MIXED_LAUNCHER_INL], ops[i : i + group_size], str(path))
            files.append(path)
    for stale in set(out_dir.glob("*.generated.cu")) - set(files):
        stale.unlink()
    return files


def slim_sources(group_size: int = GROUP_SIZE) -> SlimSources:
    """The slim module's JitSpec (stubs not yet added) and what it kept, dropped and generated."""
    flashinfer, jit_env, generate_kernels = _fi()
    from flashinfer.fused_moe import gen_cutlass_fused_moe_sm90_module

    full = gen_cutlass_fused_moe_sm90_module()
    csrc = Path(jit_env.FLASHINFER_CSRC_DIR)
    if not (csrc / "nv_internal" / MIXED_LAUNCHER_INL).exists():
        raise SlimUnsupported(f"flashinfer {flashinfer.__version__} has no {MIXED_LAUNCHER_INL} under {csrc}")
    full_generated_dir = Path(jit_env.FLASHINFER_GEN_SRC_DIR)
    kept, dropped, seen = [], [], set()
    for source in map(Path, full.sources):
        name = source.name
        if name.endswith(".generated.cu") or full_generated_dir in source.parents:
            dropped.append(source)
            continue
        seen.add(name)
        if (_RUNNER_FILE.match(name) and name != KEEP_RUNNER) or name in DROPPED or name == REPLACED:
            dropped.append(source)
        else:
            kept.append(source)
    for needed in (KEEP_RUNNER, REPLACED, "flashinfer_cutlass_fused_moe_binding.cu", "moe_gemm_mixed_utils.cu"):
        if needed not in seen:
            raise SlimUnsupported(
                f"flashinfer {flashinfer.__version__}'s fused_moe_90 spec has no {needed}; the slim W4A16 build "
                "was written against 0.6.18-0.7.x sources"
            )
    operations = w4a16_operations(generate_kernels)
    out_dir = full_generated_dir / "moe_w4a16_instantiations" / "90"
    generated = write_generated(generate_kernels, out_dir, operations, group_size)
    binding = next(p for p in kept if p.name == "flashinfer_cutlass_fused_moe_binding.cu")
    # heaviest first: ninja starts units in this order, so the short ones fill the last wave
    sources = [OUR_INSTANTIATION, binding, *generated, *(p for p in kept if p != binding)]
    binding_dir = binding.parent
    includes = [*(full.extra_include_dirs or []), binding_dir]  # our TU includes cutlass_fused_moe_kernels.cuh
    spec = dataclasses.replace(full, name=SLIM_MODULE_NAME, sources=sources, extra_include_dirs=includes)
    return SlimSources(
        spec=spec,
        generated=tuple(generated),
        kept=tuple(kept),
        dropped=tuple(dropped),
        instantiations=len(operations),
    )


def with_extra_source(spec, source: Path):
    """The same spec with one more source (the stubs), keeping everything else."""
    return dataclasses.replace(spec, sources=[*spec.sources, Path(source)])
