"""The flashinfer-python version policy: range, known-bad releases, layout family; metadata only."""

from __future__ import annotations

import pytest
from mxfp4_testing import cuda_problem
from packaging.specifiers import SpecifierSet
from packaging.version import Version

import moe_core.requirements
from moe_flashinfer_mxfp4 import requirements
from moe_flashinfer_mxfp4.fused_op import FlashInferMxfp4FusedOp as Op


@pytest.fixture
def installed(monkeypatch):
    """``installed("0.6.12")``: pretend that flashinfer-python version is installed (None: not installed)."""
    real = moe_core.requirements.distribution_version

    def pretend(version: str | None):
        def fake(name):
            if name == requirements.DISTRIBUTION:
                return None if version is None else Version(version)
            return real(name)

        monkeypatch.setattr(moe_core.requirements, "distribution_version", fake)

    return pretend


def test_installed_version_is_in_range():
    assert requirements.check(), requirements.check().reason
    assert requirements.installed() in SpecifierSet(requirements.SUPPORTED)


@pytest.mark.parametrize("version", ["0.6.18", "0.6.18.post1", "0.7.0", "0.7.2.post1", "0.7.4", "0.7.5.dev1"])
def test_accepted(installed, version):
    installed(version)
    assert requirements.check(), requirements.check().reason


@pytest.mark.parametrize(
    "version,words",
    [
        ("0.6.12", ["flashinfer-python 0.6.12 is installed", "#5438", "wrong tiles", ">=0.6.18,<0.8"]),
        ("0.6.10", ["#5438"]),
        ("0.6.15.post1", ["#5438"]),
        ("0.6.16.post3", ["#5438"]),
        ("0.6.17", ["#5438", "0.6.18 ships the fixed kernel"]),
        ("0.6.16", ["withdrawn", "#4411", "#4412"]),
        ("0.6.16.post2", ["withdrawn"]),
        ("0.6.9", ["predates", "0.6.10"]),
        ("0.8.0", ["0.8 is untested", "return-type"]),
        ("0.8.0rc1", ["0.8 is untested"]),
        ("1.0.0", ["0.8 is untested"]),
    ],
)
def test_refused_with_the_specific_reason(installed, version, words):
    installed(version)
    support = requirements.check()
    assert not support
    for word in words:
        assert word in support.reason, support.reason
    assert "pip install 'flashinfer-python>=0.6.18,<0.8'" in support.reason


def test_not_installed_names_the_pip_command(installed):
    installed(None)
    support = requirements.check()
    assert not support and "flashinfer-python is not installed" in support.reason
    assert "pip install 'flashinfer-python>=0.6.18,<0.8'" in support.reason


def test_the_support_check_refuses_a_racy_version_on_a_hopper(installed, fake_gpu):
    fake_gpu((9, 0))
    installed("0.6.14")
    support = Op.check(cuda_problem())
    assert not support and "#5438" in support.reason
    assert not Op.available() and "#5438" in Op.available().reason


@pytest.mark.parametrize(
    "version,family",
    [
        ("0.6.9", None),
        ("0.6.10", "v1"),
        ("0.6.15.post1", "v1"),
        ("0.6.16", "v2"),
        ("0.6.16.post2", "v2"),
        ("0.6.16.post3", "v1"),
        ("0.6.17", "v1"),
        ("0.6.18", "v2"),
        ("0.7.4", "v2"),
    ],
)
def test_layout_family_by_version(version, family):
    assert requirements.sm90_layout_family(Version(version)) == family


def test_pyproject_declares_the_same_range():
    import importlib.metadata as md

    from packaging.requirements import Requirement

    (req,) = [Requirement(r) for r in md.requires("moe-flashinfer-mxfp4") if r.startswith(requirements.DISTRIBUTION)]
    assert req.specifier == SpecifierSet(requirements.SUPPORTED)
