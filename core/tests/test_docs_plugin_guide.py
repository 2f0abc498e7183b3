"""docs/plugin-authors.md cannot rot: every fenced block in it runs here.

Convention (also stated at the top of the guide):

- only ``python``, ``toml`` and ``bash`` blocks are allowed, and none is skipped;
- a block whose first line is ``# file: PATH`` is written to ``PATH`` (a later
  block naming the same ``PATH`` appends to it); ``toml`` blocks must be files
  and are parsed with ``tomllib``;
- every other ``python`` block runs as a script with the Python of a fresh
  virtualenv, and every ``bash`` block with ``bash -euo pipefail``, in document
  order, in the folder that holds the written files. ``moe``, ``pip`` and
  ``python`` there are the fresh virtualenv's.
"""

from __future__ import annotations

import ast
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
from fresh_venv import FreshVenv

from moe_core.cli import COMMANDS

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "plugin-authors.md"
LANGUAGES = ("python", "toml", "bash")
_FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
_FILE = re.compile(r"^# file: (\S+)[ \t]*$")


@dataclass(frozen=True)
class Block:
    lang: str
    text: str
    line: int  # of the opening fence

    @property
    def file(self) -> str | None:
        first = self.text.split("\n", 1)[0]
        match = _FILE.match(first)
        return match.group(1) if match else None

    def where(self) -> str:
        return f"{GUIDE.name}:{self.line} ({self.lang} block)"


def guide_blocks() -> list[Block]:
    text = GUIDE.read_text()
    return [Block(m.group(1).strip(), m.group(2), text.count("\n", 0, m.start()) + 1) for m in _FENCE.finditer(text)]


def guide_files() -> dict[str, str]:
    files: dict[str, str] = {}
    for block in guide_blocks():
        if block.file:
            files[block.file] = files.get(block.file, "") + block.text
    return files


# ---- static checks (fast) ------------------------------------------------------------


def test_the_guide_exists_and_has_blocks():
    assert GUIDE.is_file(), f"{GUIDE} is missing"
    assert len(guide_blocks()) >= 10
    # no fence left unclosed or opened inside another block
    assert GUIDE.read_text().count("```") == 2 * len(guide_blocks())


@pytest.mark.parametrize("block", guide_blocks(), ids=lambda b: f"line{b.line}")
def test_every_block_is_runnable(block):
    assert block.lang in LANGUAGES, f"{block.where()}: only {LANGUAGES} blocks are allowed (every block runs)"
    if block.lang == "toml":
        assert block.file, f"{block.where()}: a toml block must start with '# file: PATH'"
        tomllib.loads(block.text)
    if block.lang == "python":
        ast.parse(guide_files()[block.file] if block.file else block.text, filename=block.where())
    if block.lang == "bash":
        for cmd in re.findall(r"(?:^|[\s;|&(])moe\s+([a-z][a-z-]*)", block.text):
            assert cmd in COMMANDS, f"{block.where()}: 'moe {cmd}' is not a moe command ({', '.join(COMMANDS)})"


def test_the_example_pyproject_points_at_the_example_hooks():
    files = guide_files()
    (pyproject,) = [path for path in files if path.endswith("pyproject.toml")]
    meta = tomllib.loads(files[pyproject])
    entry_points = meta["project"]["entry-points"]["moe.fused_ops"]
    assert len(entry_points) == 1
    ((name, target),) = entry_points.items()
    root = pyproject.rsplit("/", 1)[0]
    module_file = f"{root}/src/{target.replace('.', '/')}.py"
    assert module_file in files, f"the entry point targets {target}, which no '# file:' block writes"
    hooks = files[module_file]
    assert "def moe_api_version" in hooks and "def moe_fused_ops" in hooks
    assert any(f'name = "{name}"' in text for text in files.values()), "no FusedOp declares the entry-point name"
    assert any(f'backend = "{name}"' in text for path, text in files.items() if "/tests/" in path)


@pytest.mark.parametrize(
    "topic",
    [
        'entry-points."moe.fused_ops"',
        "moe_api_version",
        "moe_fused_ops",
        "API_VERSION",
        "incompatible",
        "check(problem)",
        "probe(problem)",
        "available()",
        "Fail closed",
        "prepare",
        "apply",
        "[gate; up]",
        "BackendConformance",
        "moe check example",
        "priority",
        "moe-example:example",
        "DuplicateBackendError",
        "MOE_PLUGINS",
        "MOE_DISABLE_PLUGINS",
        "MOE_STRICT_PLUGINS",
        "moe backends --check",
        "--traceback",
        "moe new-plugin",
    ],
)
def test_the_guide_covers(topic):
    assert topic in GUIDE.read_text()


# ---- the whole guide, run ------------------------------------------------------------


def _run(block: Block, argv: list[str], cwd: Path, env: dict[str, str]) -> str:
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    output = proc.stdout + proc.stderr
    if proc.returncode:
        pytest.fail(
            f"{block.where()} exited {proc.returncode}:\n--- block ---\n{block.text}--- output ---\n{output}",
            pytrace=False,
        )
    return output


def test_the_guide_runs_end_to_end(tmp_path):
    venv = FreshVenv(tmp_path / "venv")
    work = tmp_path / "work"
    work.mkdir()
    env = venv.env()
    outputs: list[tuple[Block, str]] = []
    for n, block in enumerate(guide_blocks()):
        if block.file:
            path = work / block.file
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("a") as f:
                f.write(block.text)
            continue
        if block.lang == "python":
            script = tmp_path / f"block_{n:02d}_line{block.line}.py"
            script.write_text(block.text)
            outputs.append((block, _run(block, [venv.python, str(script)], work, env)))
        elif block.lang == "bash":
            outputs.append((block, _run(block, ["bash", "-euo", "pipefail", "-c", block.text], work, env)))
        else:
            pytest.fail(f"{block.where()}: cannot run a {block.lang!r} block")

    def output_of(marker: str) -> str:
        (found,) = [out for block, out in outputs if marker in block.text]
        return found

    # what the guide's comments claim, checked
    listed = output_of("pip install --quiet -e './moe-example[test]'")
    assert "example" in listed and "moe-example" in listed and "discovered" in listed and "available" in listed
    assert "quant scheme 'bf16' not supported (supports: fp32)" in output_of("ExampleFusedOp.check")
    assert "passed" in output_of("python -m pytest -q -rs tests")
    duplicate = output_of("moe-example-fork")
    assert "moe-example" in duplicate and "moe-example-fork" in duplicate
    broken = output_of("moe_broken_plugin")
    assert "error" in broken and "kernels_that_are_not_installed" in broken
    assert "strict mode: exit code 1" in broken
    assert "not implemented yet" in output_of("moe new-plugin my_kernels")
