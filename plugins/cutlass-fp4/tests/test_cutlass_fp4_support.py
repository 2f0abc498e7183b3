"""Support reasons: this CPU machine, a pretend Hopper, pretend Blackwells, the opt-in, versions, 4over6."""

from __future__ import annotations

import pytest
import torch
from cutlass_fp4_testing import no_cuda_here, nvfp4_config, on_cuda
from packaging.version import Version

import moe_core.requirements
from moe_core import MoeProblem, MoeRunner
from moe_core.errors import BackendUnavailableError
from moe_core.selection import select
from moe_core.synthetic import random_weights
from moe_cutlass_fp4 import requirements
from moe_cutlass_fp4.fused_op import CutlassFp4FusedOp as Op


@no_cuda_here
def test_on_this_cpu_machine():
    assert "device type 'cpu' not supported" in Op.check(MoeProblem(nvfp4_config(), "cpu")).reason
    assert "no CUDA device is available" in Op.check(on_cuda()).reason
    assert "no CUDA device is available" in Op.available().reason


def test_runner_on_cpu_names_every_backend_and_the_torch_one_is_usable():
    cfg = nvfp4_config()
    with pytest.raises(BackendUnavailableError) as info:
        MoeRunner(cfg, random_weights(cfg), backend="cutlass_fp4")
    assert "moe-core:torch: usable" in str(info.value) and "not installed" not in str(info.value)


def test_hopper_is_refused_precisely_and_the_error_lists_who_can(gpu, opt_in):
    gpu(9, 0)
    opt_in()
    support = Op.check(on_cuda())
    assert not support
    assert "SM90 not supported (needs SM100, SM103, SM110, SM120)" in support.reason
    assert "Hopper (SM90) has no NVFP4 path in FlashInfer's CUTLASS fused MoE" in support.reason
    with pytest.raises(BackendUnavailableError) as info:
        select(on_cuda(), "cutlass_fp4")
    listing = str(info.value).split("Every installed backend for this problem:")[1]
    assert "moe-core:torch: usable" in listing and "moe-cutlass-fp4:cutlass_fp4: compute capability SM90" in listing
    assert not Op.available()


@pytest.mark.parametrize("cap", [(10, 0), (10, 3), (11, 0), (12, 0)])
def test_blackwell_family_needs_the_fc2_scale_opt_in(gpu, opt_in, cap):
    gpu(*cap)
    support = Op.check(on_cuda())
    assert not support and requirements.FC2_SCALE_VAR in support.reason
    assert "dynamic global scale" in support.reason and "static fc2 input scale" in support.reason
    opt_in()
    assert Op.check(on_cuda()), Op.check(on_cuda()).reason
    assert Op.check(on_cuda(dtype=torch.float16))
    assert Op.check(on_cuda(has_bias=True, activation="swiglu_oai"))
    assert Op.available()


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "abc"])
def test_bad_opt_in_values(gpu, opt_in, value):
    gpu(10, 0)
    opt_in(value)
    support = Op.check(on_cuda())
    assert not support and "is not a finite positive number" in support.reason


@pytest.mark.parametrize("cap,word", [((8, 0), "NVFP4 needs Blackwell"), ((10, 7), "not been run there")])
def test_other_capabilities(gpu, opt_in, cap, word):
    gpu(*cap)
    opt_in()
    support = Op.check(on_cuda())
    assert not support and word in support.reason


@pytest.mark.parametrize(
    "kw,word",
    [
        (dict(quant_scheme="mxfp4"), "quant scheme 'mxfp4' not supported"),
        (dict(activation="gelu"), "activation 'gelu'"),
        (dict(dtype=torch.float32), "activation dtype float32"),
        (dict(hidden_size=320), "hidden_size=320 is not a multiple of 128"),
    ],
)
def test_declarations(gpu, opt_in, kw, word):
    gpu(10, 0)
    opt_in()
    assert word in Op.check(on_cuda(**kw)).reason


@pytest.fixture
def flashinfer_is(monkeypatch):
    real = moe_core.requirements.distribution_version

    def pretend(version):
        monkeypatch.setattr(
            moe_core.requirements,
            "distribution_version",
            lambda name: (
                (None if version is None else Version(version)) if name == requirements.DISTRIBUTION else real(name)
            ),
        )

    return pretend


@pytest.mark.parametrize(
    "version,words",
    [
        (None, ["flashinfer-python is not installed", "pip install 'flashinfer-python>=0.6.18,<0.8'"]),
        ("0.6.17", ["0.6.17 is installed, but this backend supports flashinfer-python>=0.6.18,<0.8"]),
        ("0.8.0", ["0.8 is untested", "return-type"]),
    ],
)
def test_flashinfer_versions(gpu, opt_in, flashinfer_is, version, words):
    gpu(10, 0)
    opt_in()
    flashinfer_is(version)
    support = Op.check(on_cuda())
    assert not support
    for word in words:
        assert word in support.reason


def test_four_over_six_switch_with_a_release_that_cannot_ignore_it(gpu, opt_in, flashinfer_is, monkeypatch):
    gpu(10, 0)
    opt_in()
    monkeypatch.setenv("FLASHINFER_NVFP4_4OVER6", "1")
    flashinfer_is("0.7.2")
    support = Op.check(on_cuda())
    assert not support and "FLASHINFER_NVFP4_4OVER6 set" in support.reason and ">=0.7.4" in support.reason
    flashinfer_is("0.7.4")
    assert Op.check(on_cuda())  # passed as nvfp4_4over6=None per call (test_kernel)


def test_same_range_in_pyproject():
    import importlib.metadata as md

    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet

    reqs = [Requirement(r) for r in md.requires("moe-cutlass-fp4")]
    (fi,) = [r for r in reqs if r.name == requirements.DISTRIBUTION]
    assert fi.specifier == SpecifierSet(requirements.SUPPORTED)
