"""moe-sglang's tests run against an installed SGLang on a CPU (nox -s sglang).

``cpu_site/sitecustomize.py`` is the documented torchvision workaround (see that file). It goes on
``PYTHONPATH`` here, before anything imports SGLang, so the interpreters the tests start run it at start-up,
and it runs in this process unless this interpreter already ran it.
"""

import os
import runpy
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
CPU_SITE = HERE / "cpu_site"
os.environ["PYTHONPATH"] = os.pathsep.join([str(CPU_SITE), str(HERE), *filter(None, [os.environ.get("PYTHONPATH")])])
if not getattr(sys.modules.get("sitecustomize"), "__file__", "").startswith(str(CPU_SITE)):
    # this interpreter started without it on PYTHONPATH; keep its namespace: the Library object holds the definitions
    _CPU_SITE = runpy.run_path(str(CPU_SITE / "sitecustomize.py"))


@pytest.fixture(scope="session")
def sglang_with_moe():
    """This process, once: SGLang's plugins loaded (moe-sglang among them), ``--moe-runner-backend moe``
    published with single-process TP groups (``sgl_setup``)."""
    import sgl_setup

    sgl_setup.load_plugins()
    sgl_setup.publish("moe", port=29611)


@pytest.fixture
def torch_calls(monkeypatch):
    """How many times moe's torch backend ran a forward (patched on the class before any runner binds it)."""
    from moe_core.testing.counting import count_forwards

    return count_forwards(monkeypatch)
