"""Stubs for the symbols the slim module leaves out, so it links and loads without them.

FlashInfer's binding constructs a runner for every dtype combination it knows,
so its object file names constructors and methods of runners the slim build
does not compile. Those are found by reading the compiled objects' symbol
tables (``nm``): undefined in some object, defined in none, and in
TensorRT-LLM's ``tensorrt_llm`` namespace (everything else — libc++, CUDA,
TVM-FFI — comes from shared libraries at load time). Each gets a one-line
C++ definition, bound to the exact mangled name with an asm label, that
throws ``std::runtime_error`` naming the symbol: reaching one means a dtype
combination the slim module does not serve, and the caller gets an error
rather than an unresolved symbol at load or a crash.

Fail closed: if a missing symbol belongs to the W4A16 path itself (its
runner, or a grouped GEMM other than the never-offered schedule twins
``sources`` leaves out on purpose, counted), the build stops — stubbing it would compile a
module that raises on the very path it exists for.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from moe_flashinfer_mxfp4.slim.sources import supports_cooperative

#: mangled names in TensorRT-LLM's namespace: functions/members (_ZN / _ZNK), vtables, typeinfo, thunks
_TRTLLM = re.compile(r"^_Z(?:T[VIS]|Th[n\d_]*?)?N[KVr]*12tensorrt_llm")
#: demangled fragments of the W4A16 path: if any stub matches, the subset is wrong
W4A16_MARKERS = (
    "CutlassMoeFCRunner<__nv_bfloat16, cutlass::float_e2m1_t",
    "MoeGemmRunner<__nv_bfloat16, cutlass::float_e2m1_t",
    "kernelLauncher<__nv_bfloat16, cutlass::float_e2m1_t",
)
_DEFINED_TYPES = set("ABCDGRSTVWiu")  # nm -P types that define a symbol (U, w, v: undefined / weak undefined)


class StubError(RuntimeError):
    """The slim subset would stub a symbol of the W4A16 path itself, or the symbol tools are missing."""


@dataclass(frozen=True)
class Stub:
    mangled: str
    demangled: str
    is_data: bool


def compiled_objects(build_ninja: Path) -> list[Path]:
    """The object files a FlashInfer ``build.ninja`` compiles (its naming differs between releases)."""
    objects = []
    for line in Path(build_ninja).read_text().splitlines():
        match = re.match(r"^build (\S+): (?:cuda_compile|compile) ", line)
        if match:
            objects.append(Path(match.group(1)))
    return objects


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise StubError(f"`{name}` (binutils) is needed to find the symbols the slim module leaves out; not on PATH")
    return path


def symbol_tables(objects: list[Path]) -> tuple[set[str], set[str]]:
    """(defined, undefined) global symbols over all objects."""
    nm = _tool("nm")
    defined, undefined = set(), set()
    for obj in objects:
        out = subprocess.run([nm, "-P", "-g", str(obj)], check=True, capture_output=True, text=True).stdout
        for line in out.splitlines():
            parts = line.split()
            if len(parts) < 2:
                continue
            name, kind = parts[0], parts[1]
            (defined if kind in _DEFINED_TYPES else undefined).add(name)
    return defined, undefined


def demangle(names: list[str]) -> list[str]:
    if not names:
        return []
    out = subprocess.run([_tool("c++filt")], input="\n".join(names), check=True, capture_output=True, text=True)
    lines = out.stdout.splitlines()
    return lines if len(lines) == len(names) else list(names)


def missing_symbols(objects: list[Path]) -> list[Stub]:
    """TensorRT-LLM symbols some object needs and none defines."""
    defined, undefined = symbol_tables(objects)
    names = sorted(n for n in undefined - defined if _TRTLLM.match(n))
    stubs = []
    for mangled, pretty in zip(names, demangle(names), strict=True):
        is_data = mangled.startswith(("_ZTV", "_ZTI", "_ZTS")) or "(" not in pretty
        stubs.append(Stub(mangled, pretty, is_data))
    return stubs


_LAUNCHER_TILE = re.compile(
    r"kernelLauncher<.*?cute::tuple<cute::C<(\d+)>, cute::C<(\d+)>, cute::C<(\d+)> >.*?cutlass::gemm::Kernel(\w+)"
)


def never_offered(demangled: str) -> bool:
    """A W4A16 GEMM launcher whose (tile, schedule) FlashInfer's SM90 heuristic never offers (``sources``)."""
    match = _LAUNCHER_TILE.search(demangled)
    if not match:
        return False
    m, n, k = (int(g) for g in match.groups()[:3])
    return ("Cooperative" in match.group(4)) != supports_cooperative(m, n, k)


def check_not_w4a16(stubs: list[Stub], left_out: int = 0) -> None:
    """Refuse stubs on the W4A16 path, except exactly ``left_out`` launchers the heuristic never offers."""
    w4a16 = [s.demangled for s in stubs if any(marker in s.demangled for marker in W4A16_MARKERS)]
    twins = [d for d in w4a16 if never_offered(d)]
    if len(twins) == left_out:
        w4a16 = [d for d in w4a16 if d not in twins]
    bad = w4a16
    if bad:
        shown = "\n  ".join(bad[:5])
        raise StubError(
            f"the slim W4A16 subset misses {len(bad)} symbol(s) of the W4A16 path itself, e.g.\n  {shown}\n"
            "refusing to stub them (the installed FlashInfer's sources differ from what the slim build expects)"
        )


def _c_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def stub_source(stubs: list[Stub]) -> str:
    """C++ defining every stub: functions throw naming the symbol; data symbols are zero-filled, never read."""
    lines = [
        "// Generated by moe-flashinfer-mxfp4 (moe_flashinfer_mxfp4/slim/stubs.py): symbols that FlashInfer's",
        "// binding names but the slim SM90 W4A16 module does not compile. Reaching one raises.",
        "#include <stdexcept>",
        "#include <string>",
        "",
        "namespace {",
        "[[noreturn]] void moe_slim_missing(const char* symbol) {",
        '  throw std::runtime_error(std::string("moe-flashinfer-mxfp4 slim SM90 W4A16 module: ") + symbol +',
        '                           " is not compiled into it (it serves bf16 activations x MXFP4 weights only)");',
        "}",
        "}  // namespace",
        "",
    ]
    for i, stub in enumerate(stubs):
        label = _c_string(stub.mangled)
        if stub.is_data:
            lines.append(f'extern "C" __attribute__((used)) const char moe_slim_data_{i}[256] __asm__({label}) = {{}};')
        else:
            lines.append(f"void moe_slim_stub_{i}() __asm__({label});")
            lines.append(f"void moe_slim_stub_{i}() {{ moe_slim_missing({_c_string(stub.demangled)}); }}")
    return "\n".join(lines) + "\n"


def write_stubs(objects: list[Path], out: Path, left_out: int = 0) -> list[Stub]:
    """Find what is missing, refuse W4A16 symbols, write the stub source to ``out``; returns the stubs."""
    stubs = missing_symbols(objects)
    check_not_w4a16(stubs, left_out)
    text = stub_source(stubs)
    out = Path(out)
    if not out.exists() or out.read_text() != text:  # keep the mtime when unchanged: ninja then skips it
        out.write_text(text)
    return stubs
