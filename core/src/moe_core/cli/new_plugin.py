"""``moe new-plugin NAME``: write the skeleton of a runner-backend plugin.

The skeleton installs as it is (``pip install ./NAME``) and is discovered at
once by ``moe backends``. Its fused op fails closed with a not-implemented
reason until its author flips ``IMPLEMENTED``, so no runner ever selects it
and its conformance tests skip with that reason instead of failing.
"""

from __future__ import annotations

import keyword
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from string import Template

from moe_core.errors import InvalidInputError

#: runner backend names: lower-case Python identifiers (they become entry-point names)
_NAME_RE = re.compile(r"^[a-z][a-z0-9_]*$")
#: PEP 508 distribution names
_DIST_RE = re.compile(r"^([A-Za-z0-9]|[A-Za-z0-9][A-Za-z0-9._-]*[A-Za-z0-9])$")
#: names the runner reserves
_RESERVED = {"auto"}


def register(sub) -> None:
    p = sub.add_parser(
        "new-plugin",
        help="write the skeleton of a runner-backend plugin",
        description=(
            "Write a working plugin skeleton for runner backend NAME: pyproject.toml declaring the "
            "'moe.fused_ops' entry point, the pluggy hooks, a FusedOp subclass stub and a test module "
            "that runs moe-core's conformance suite, plus a README. The stub's support check fails "
            "closed with a not-implemented reason, so runners never select it, 'moe backends --check' "
            "lists it as unavailable with that reason, and its conformance cases skip with it. "
            "Install it with 'pip install ./NAME' (or 'pip install -e ./NAME') and it is discovered at once."
        ),
        epilog=(
            "NAME is a lower-case Python identifier (letters, digits, '_'), e.g. my_kernels; it is the "
            "entry-point name users pass as MoeRunner(..., backend=NAME). A name that a first-party or an "
            "installed distribution already provides is refused (two providers of one name make "
            "backend='auto' fail with a duplicate error). Defaults: distribution "
            "moe-NAME (underscores become '-'), package the distribution name with '-' and '.' as '_', "
            "folder ./NAME. An existing non-empty folder is refused unless --force, which overwrites the "
            "skeleton's files there and leaves any other file alone."
        ),
    )
    p.add_argument("name", metavar="NAME", help="runner backend name, e.g. my_kernels")
    p.add_argument("--dir", metavar="PATH", help="folder to write the plugin into (default: ./NAME)")
    p.add_argument("--distribution", metavar="DIST", help="distribution name (default: moe-NAME)")
    p.add_argument("--force", action="store_true", help="write into an existing non-empty folder, overwriting")
    p.set_defaults(handler=run)


@dataclass(frozen=True)
class PluginNames:
    backend: str
    distribution: str
    package: str
    class_name: str


def validate_backend_name(name: str) -> str:
    """Return ``name`` if it is usable as a runner backend name; raise ``InvalidInputError`` saying why not."""
    if not _NAME_RE.match(name or ""):
        raise InvalidInputError(
            f"backend name {name!r} is not valid: use a lower-case Python identifier "
            "(a letter, then letters, digits or '_'), e.g. 'my_kernels'"
        )
    if keyword.iskeyword(name):
        raise InvalidInputError(f"backend name {name!r} is a Python keyword; pick another name")
    if name in _RESERVED:
        raise InvalidInputError(f"backend name {name!r} is reserved (backend='auto' means 'pick for me')")
    return name


def plugin_names(name: str, distribution: str | None = None) -> PluginNames:
    """The names a plugin for backend ``name`` gets (validated)."""
    backend = validate_backend_name(name)
    dist = distribution if distribution is not None else "moe-" + backend.replace("_", "-")
    if not _DIST_RE.match(dist):
        raise InvalidInputError(
            f"distribution name {dist!r} is not valid (PEP 508: letters, digits, '-', '_', '.', "
            "starting and ending with a letter or digit)"
        )
    package = re.sub(r"[^a-z0-9]+", "_", dist.lower()).strip("_")
    if package[0].isdigit():
        package = "moe_" + package
    if keyword.iskeyword(package):
        package += "_"
    class_name = "".join(part.capitalize() for part in backend.split("_") if part) + "FusedOp"
    return PluginNames(backend, dist, package, class_name)


def core_requirement() -> str:
    """``moe-core>=X.Y,<...``: the API range a plugin written against this moe-core accepts."""
    from packaging.version import Version

    from moe_core import __version__

    v = Version(__version__)
    upper = f"0.{v.minor + 1}" if v.major == 0 else f"{v.major + 1}"
    return f"moe-core>={v.major}.{v.minor},<{upper}"


def render(names: PluginNames) -> dict[str, str]:
    """Relative path -> text of every file of the skeleton."""
    from moe_core.hookspecs import API_VERSION

    values = {
        "backend": names.backend,
        "distribution": names.distribution,
        "package": names.package,
        "class_name": names.class_name,
        "core_requirement": core_requirement(),
        "api_version": str(API_VERSION),
    }
    pkg = f"src/{names.package}"
    where = {
        "pyproject.toml": "pyproject.toml",
        "README.md": "README.md",
        "__init__.py": f"{pkg}/__init__.py",
        "plugin.py": f"{pkg}/plugin.py",
        "fused_op.py": f"{pkg}/fused_op.py",
        "test_conformance.py": "tests/test_conformance.py",
    }
    templates = resources.files("moe_core.cli") / "skeleton"
    return {
        path: Template((templates / f"{name}.tmpl").read_text(encoding="utf-8")).substitute(values)
        for name, path in where.items()
    }


def write_plugin(
    name: str, folder: str | Path | None = None, *, distribution: str | None = None, force: bool = False
) -> tuple[PluginNames, Path, list[str]]:
    """Write the skeleton for backend ``name`` into ``folder`` (default ``./name``).

    Returns the names, the folder and the files written (relative paths).
    Raises ``InvalidInputError`` for a bad name or an existing non-empty folder
    without ``force``.
    """
    names = plugin_names(name, distribution)
    root = Path(folder) if folder is not None else Path.cwd() / names.backend
    if root.exists() and not root.is_dir():
        raise InvalidInputError(f"{root} exists and is not a folder")
    if root.is_dir() and any(root.iterdir()) and not force:
        raise InvalidInputError(
            f"{root} already exists and is not empty; choose another --dir, or pass --force to overwrite "
            "the skeleton's files in it"
        )
    files = render(names)
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return names, root, list(files)


def check_name_free(backend: str) -> None:
    """Refuse a name a first-party or an installed distribution already provides.

    Two distributions providing one runner backend make ``backend="auto"`` fail
    with a duplicate error for everyone who installs both.
    """
    from moe_core.known_backends import FIRST_PARTY
    from moe_core.plugins import default_registry

    providers = {e.distribution for e in default_registry().entries() if e.name == backend}
    if backend in FIRST_PARTY:
        providers.add(FIRST_PARTY[backend])
    if providers:
        raise InvalidInputError(
            f"backend name {backend!r} is already provided by {', '.join(sorted(providers))}; two distributions "
            f"providing one name make backend='auto' fail with a duplicate error wherever both are installed. "
            "Pick another name."
        )


def run(args) -> int:
    check_name_free(validate_backend_name(args.name))
    names, root, files = write_plugin(args.name, args.dir, distribution=args.distribution, force=args.force)
    shown = _display(root)
    print(f"wrote plugin {names.distribution} (backend {names.backend!r}, package {names.package}) in {shown}:")
    for rel in files:
        print(f"  {rel}")
    steps = [
        (f"pip install -e {shown}", "discovered at once, nothing to register"),
        ("moe backends --check", f"{names.backend}: unavailable, not implemented yet"),
        (f"pytest {shown}/tests", "conformance cases skip until the kernel exists"),
    ]
    width = max(len(cmd) for cmd, _ in steps)
    print("next:")
    for cmd, comment in steps:
        print(f"  {cmd.ljust(width)}  # {comment}")
    print(
        f"then implement {shown}/src/{names.package}/fused_op.py, set IMPLEMENTED = True there, "
        f"and run 'moe check {names.backend}'."
    )
    return 0


def _display(path: Path) -> str:
    """``./rel`` for a folder below the working directory, else the absolute path."""
    resolved = path.resolve()
    try:
        return f"./{resolved.relative_to(Path.cwd().resolve()).as_posix()}"
    except ValueError:
        return str(resolved)
