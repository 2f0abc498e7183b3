"""moe-vllm's tests run against an installed vLLM on a CPU (nox -s vllm).

``VLLM_TARGET_DEVICE=cpu`` selects vLLM's CPU platform (the wheel on the package index is a CUDA build, which
would otherwise look for a GPU); it is set here, before anything imports vLLM, so the interpreters the tests start
inherit it. ``tests/`` goes on ``PYTHONPATH`` for them too (``vllm_setup``, ``scenario``).
"""

import os
from pathlib import Path

import pytest

HERE = Path(__file__).parent
os.environ["VLLM_TARGET_DEVICE"] = "cpu"
os.environ.pop("MOE_VLLM_BACKEND", None)  # each test says what it asks for
os.environ["PYTHONPATH"] = os.pathsep.join([str(HERE), *filter(None, [os.environ.get("PYTHONPATH")])])


@pytest.fixture(scope="session")
def vllm_with_moe():
    """This process, once: vLLM's general plugins loaded (moe-vllm among them)."""
    import vllm_setup

    vllm_setup.load_plugins()


@pytest.fixture
def torch_calls(monkeypatch):
    """How many times moe's torch backend ran a forward (patched on the class before any runner binds it)."""
    from moe_core.testing.counting import count_forwards

    return count_forwards(monkeypatch)


@pytest.fixture
def moe_log():
    """The records of logger ``vllm.moe_vllm`` (a handler on it: vLLM's ``vllm`` logger may not propagate)."""
    import logging

    class Keep(logging.Handler):
        def __init__(self):
            super().__init__(logging.DEBUG)
            self.records = []

        def emit(self, record):
            self.records.append(record)

    logger = logging.getLogger("vllm.moe_vllm")
    keep, level = Keep(), logger.level
    logger.addHandler(keep)
    logger.setLevel(logging.DEBUG)
    yield keep.records
    logger.removeHandler(keep)
    logger.setLevel(level)
