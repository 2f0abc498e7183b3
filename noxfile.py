"""Test sessions: core alone, each plugin with core, all plugins together, the
example plugin's wheel, the ``moe new-plugin`` skeleton against our wheels, the SGLang
integration inside SGLang and the vLLM integration inside vLLM on CPU, lint;
and two that a plain ``nox`` leaves out: ``build`` (our wheels into ``dist/``) and
``gpu`` (on a CUDA machine, in its installed environment: ``tools/gpu.sh``).

Every test session installs packages from the working tree into a fresh virtualenv,
with ``constraints/cpu.txt`` pinning torch (an unpinned torch would pull a multi-GB
CUDA build; see the README for PyTorch's CPU index). ``all_plugins``,
``example_wheel`` and ``new_plugin`` install *wheels* built with the standard build
frontend (``python -m build --wheel``), each folder built once per ``nox`` run and
shared by the sessions; pip's download cache is shared by every session.
Run everything with ``nox``; one session with ``nox -s core``; ``nox --list``.
"""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from pathlib import Path

import nox
import tomllib

ROOT = Path(__file__).parent
CONSTRAINTS = ("-c", str(ROOT / "constraints" / "cpu.txt"))
#: checks run inside a session's environment against what was installed there
CHECKS = str(ROOT / "tests" / "installed" / "checks.py")

nox.options.reuse_existing_virtualenvs = False
nox.options.error_on_missing_interpreters = True


def _plugins() -> dict[str, str]:
    """Session name (the backend a plugin folder declares in ``moe.fused_ops``) -> plugin folder: read from
    ``plugins/*/pyproject.toml``, so a new first-party plugin gets its session without an edit here."""
    out = {}
    for pyproject in sorted(ROOT.glob("plugins/*/pyproject.toml")):
        backends = tomllib.loads(pyproject.read_text())["project"]["entry-points"]["moe.fused_ops"]
        out["_".join(backends)] = str(pyproject.parent.relative_to(ROOT))
    return out


#: session name -> plugin folder
PLUGINS = _plugins()


#: the out-of-tree example plugin, written as a third party would
EXAMPLE = "examples/moe-torch-grouped"

#: the SGLang integration (distribution moe-sglang) and the one list of the SGLang it is tested against
SGLANG = "integrations/sglang"
SGLANG_REQUIREMENTS = ROOT / SGLANG / "requirements-sglang-cpu.txt"

#: the vLLM integration (distribution moe-vllm) and the one list of the vLLM it is tested against
VLLM = "integrations/vllm"
VLLM_REQUIREMENTS = ROOT / VLLM / "requirements-vllm-cpu.txt"
#: the lines of that list installed --no-deps (vllm pins a CUDA torch; xgrammar would bring triton)
VLLM_NO_DEPS = ("vllm==", "xgrammar==")


def _session(func=None, **options):
    """``@nox.session`` whose environment is removed when the session ends, pass or fail, unless nox was asked to
    reuse environments (``-R``/``-r``). A plain ``nox`` never reuses them (``reuse_existing_virtualenvs = False``), and
    together they hold several GB (torch in each, triton, FlashInfer's dependencies): more than a CI machine may have
    free, where the sessions run one after another and each needs only its own."""

    def decorate(func):
        @nox.session(**options)
        @functools.wraps(func)
        def run(session: nox.Session) -> None:
            try:
                func(session)
            finally:
                if not session.virtualenv.reuse_existing:
                    shutil.rmtree(session.virtualenv.location, ignore_errors=True)

        return run

    return decorate(func) if func is not None else decorate


def _pytest(session: nox.Session, *tests_and_options: str, **kwargs):
    return session.run("python", "-m", "pytest", *tests_and_options, "-q", "-rs", *session.posargs, **kwargs)


_wheels: dict[str, str] = {}
_wheel_root: list[Path] = []
_has_build: set[str] = set()
_NOT_SOURCE = shutil.ignore_patterns("build", "dist", "*.egg-info", "__pycache__", ".pytest_cache", ".nox")


def _wheel(session: nox.Session, folder: str) -> str:
    """The wheel of ``folder`` (relative to the repository, or absolute), built with
    ``python -m build --wheel`` once per nox run and reused by later sessions."""
    if folder not in _wheels:
        if not _wheel_root:
            _wheel_root.append(Path(tempfile.mkdtemp(prefix="moe-nox-wheels-")))
            atexit.register(shutil.rmtree, _wheel_root[0], ignore_errors=True)
        outdir = _wheel_root[0] / str(len(_wheels))
        # build from a clean copy: setuptools reuses <folder>/build, so a module deleted from src/
        # would otherwise still ship; and the working tree stays free of build artifacts
        source = outdir / "src" / Path(folder).name
        shutil.copytree(ROOT / folder, source, ignore=_NOT_SOURCE)
        if session.virtualenv.location not in _has_build:
            session.install(*CONSTRAINTS, "build")
            _has_build.add(session.virtualenv.location)
        session.run("python", "-m", "build", "--wheel", "--outdir", str(outdir), str(source), silent=True)
        wheels = sorted(outdir.glob("*.whl"))
        if len(wheels) != 1:
            session.error(f"building {folder} gave {len(wheels)} wheels: {wheels}")
        _wheels[folder] = str(wheels[0])
    return _wheels[folder]


def _install_wheels(session: nox.Session, *folders: str, extras: str = "[test]") -> None:
    session.install(*CONSTRAINTS, *(_wheel(session, f) + extras for f in folders))


@_session
def core(session: nox.Session) -> None:
    """moe-core's own tests (plugin machinery, runner, CLI, numerics)."""
    session.install(*CONSTRAINTS, "./core[test]")
    _pytest(session, "core/tests")


@_session
def transformers(session: nox.Session) -> None:
    """transformers' MoE blocks: converters, routing and patched models against transformers (random weights)."""
    session.install(*CONSTRAINTS, "./core[test,transformers]", "./plugins/triton-moe[test]")  # + triton interpreted
    _pytest(session, *sorted(str(p.relative_to(ROOT)) for p in ROOT.glob("core/tests/test_transformers_*.py")))


def _plugin_session(name: str, folder: str):
    @_session(name=name)
    def plugin(session: nox.Session) -> None:
        session.install(*CONSTRAINTS, "./core[test]", f"./{folder}[test]")
        _pytest(session, f"{folder}/tests")

    plugin.__doc__ = f"{folder} installed with core into a fresh environment, its tests against core."
    return plugin


for _name, _folder in PLUGINS.items():
    globals()[f"plugin_{_name}"] = _plugin_session(_name, _folder)


@_session
def all_plugins(session: nox.Session) -> None:
    """Every first-party plugin + the example plugin together (wheels): listing, duplicates, auto order.

    One fresh environment: every declared backend listed with its distribution, truthful statuses on
    this machine, no duplicate keys, duplicates resolved as documented, auto-selection by priority.
    """
    _install_wheels(session, "core", *PLUGINS.values(), EXAMPLE)
    session.run("moe", "backends", "--check")  # the table, for whoever reads the log
    _pytest(session, "tests/integration")
    _pytest(session, f"{EXAMPLE}/tests")


@_session
def example_wheel(session: nox.Session) -> None:
    """examples/moe-torch-grouped as shipped: its built wheel installed and tested (not the source tree).

    The wheel comes from python -m build and is installed beside moe-core's wheel into a fresh
    environment; then moe backends --check, moe check torch_grouped and its tests run against it.
    """
    _install_wheels(session, "core", EXAMPLE)
    session.run("python", CHECKS, "from-wheel", "moe_torch_grouped")
    session.run("moe", "backends", "--check")
    session.run("moe", "check", "torch_grouped")
    _pytest(session, f"{EXAMPLE}/tests")


@_session
def new_plugin(session: nox.Session) -> None:
    """A third party's path: moe new-plugin against our wheels alone, built, installed, listed, tested.

    moe-core is on no package index: it is installed *by name* from a folder holding only its wheel
    (``--find-links``, as a user would with ``nox -s build``'s ``dist/``), then ``moe new-plugin`` writes a
    skeleton into a temp folder, which pip builds and installs against that same folder. moe backends
    must list it (unavailable: not implemented yet) and its conformance cases must skip with that reason.
    """
    links = str(Path(_wheel(session, "core")).parent)
    session.install(*CONSTRAINTS, "--find-links", links, "moe-core")
    session.run("python", CHECKS, "from-wheel", "moe_core")
    folder = Path(session.create_tmp()) / "nox_skeleton"
    shutil.rmtree(folder, ignore_errors=True)
    session.run("moe", "new-plugin", "nox_skeleton", "--dir", str(folder))
    session.install(*CONSTRAINTS, "--find-links", links, f"{folder}[test]")
    session.run("python", CHECKS, "from-wheel", "moe_nox_skeleton")
    session.run("moe", "backends", "--check")
    session.run("python", CHECKS, "skeleton-listed", "nox_skeleton", "moe-nox-skeleton")
    output = _pytest(session, str(folder / "tests"), "-p", "no:cacheprovider", silent=True)
    print(output)
    if "its kernel is not implemented yet" not in output or "1 passed" not in output:
        session.error("the skeleton's conformance cases did not skip with its not-implemented reason")


def _pins(requirements: Path) -> list[str]:
    """The pinned lines of an engine's requirements file (comments and blank lines left out)."""
    lines = [line.strip() for line in requirements.read_text().splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


@_session
def sglang(session: nox.Session) -> None:
    """integrations/sglang (moe-sglang) inside SGLang on CPU: seed scenario, layers against SGLang's forward.

    SGLang from its pinned list (``requirements-sglang-cpu.txt``: the ``sglang==`` line ``--no-deps``, because its
    wheel pins a CUDA torch and GPU kernels, then what its MoE modules import on a CPU); moe-flashinfer-mxfp4
    ``--no-deps`` for the seed scenario (on a CPU its support check refuses on the device before flashinfer-python,
    ~2.3 GB with its CUDA libraries, would be read); core and the bridge from the working tree.
    """
    pins = _pins(SGLANG_REQUIREMENTS)
    engine = [pin for pin in pins if pin.startswith("sglang==")]
    session.install(*CONSTRAINTS, *(pin for pin in pins if pin not in engine))
    session.install(*CONSTRAINTS, "--no-deps", *engine)
    session.install(*CONSTRAINTS, "./core[test]", f"./{SGLANG}[test]")
    session.install(*CONSTRAINTS, "--no-deps", "./plugins/flashinfer-mxfp4")
    _pytest(session, f"{SGLANG}/tests")


@_session
def vllm(session: nox.Session) -> None:
    """integrations/vllm (moe-vllm) inside vLLM on CPU: layers through moe's runner, fresh interpreters, policy.

    vLLM from its pinned list (``requirements-vllm-cpu.txt``: the ``vllm==`` and ``xgrammar==`` lines ``--no-deps``,
    because vLLM's wheel pins a CUDA torch and GPU kernels and xgrammar would bring triton, then what vLLM's MoE
    layer modules import on a CPU); core and the bridge from the working tree. ``VLLM_TARGET_DEVICE=cpu`` selects
    vLLM's CPU platform (set by the tests' conftest).
    """
    pins = _pins(VLLM_REQUIREMENTS)
    no_deps = [pin for pin in pins if pin.startswith(VLLM_NO_DEPS)]
    session.install(*CONSTRAINTS, *(pin for pin in pins if pin not in no_deps))
    session.install(*CONSTRAINTS, "--no-deps", *no_deps)
    session.install(*CONSTRAINTS, "./core[test]", f"./{VLLM}[test]")
    _pytest(session, f"{VLLM}/tests")


@_session
def lint(session: nox.Session) -> None:
    """ruff over every package."""
    session.install(*CONSTRAINTS, "ruff")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@_session(default=False)
def build(session: nox.Session) -> None:
    """Wheels of moe-core, every first-party plugin, the example, moe-sglang and moe-vllm into dist/ (not run by a
    plain nox).

    moe-core is on no package index; install from these with ``pip install --find-links dist moe-core
    moe-triton`` (and a third-party plugin: ``pip install --find-links dist ./my-plugin``).
    """
    dist = ROOT / "dist"
    dist.mkdir(exist_ok=True)
    for folder in ("core", *PLUGINS.values(), EXAMPLE, SGLANG, VLLM):
        wheel = Path(_wheel(session, folder))
        shutil.copy2(wheel, dist / wheel.name)
        session.log(f"dist/{wheel.name}")


@nox.session(venv_backend="none", default=False)
def gpu(session: nox.Session) -> None:
    """On a CUDA machine, in its installed environment (no virtualenv; not run by a plain nox): every
    GPU-marked test and ``moe check`` of each available backend through ``tools/gpu.sh`` (``nox -s gpu --
    bench door-cost`` runs other steps; ``bash tools/gpu.sh --help`` lists them)."""
    if shutil.which("nvidia-smi") is None:
        session.error("no GPU here (nvidia-smi not found): the gpu session runs on a CUDA machine")
    session.run("bash", str(ROOT / "tools" / "gpu.sh"), *(session.posargs or ("tests", "check")), external=True)
