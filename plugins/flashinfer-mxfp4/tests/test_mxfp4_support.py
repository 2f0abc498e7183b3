"""The support check: on this CPU machine, and on pretend SM80/SM90/SM100/SM103 devices."""

from __future__ import annotations

import sys

import pytest
import torch
from mxfp4_testing import config, cuda_problem, no_cuda_here, weights

from moe_core import MoeProblem, MoeRunner
from moe_core.errors import BackendUnavailableError
from moe_flashinfer_mxfp4 import devices
from moe_flashinfer_mxfp4.fused_op import FlashInferMxfp4FusedOp as Op


def test_cpu_problem_says_it_needs_a_cuda_gpu():
    support = Op.check(MoeProblem(config(), torch.device("cpu")))
    assert not support
    assert "device type 'cpu' not supported" in support.reason
    assert "CUDA GPU (SM90/SM100)" in support.reason


@no_cuda_here
def test_cuda_problem_without_cuda_says_so():
    support = Op.check(cuda_problem())
    assert not support and "no CUDA device is available" in support.reason


@no_cuda_here
def test_machine_without_cuda_is_unavailable_with_the_reason():
    support = Op.available()
    assert not support and "no CUDA device is available" in support.reason


def test_explicit_runner_on_cpu_fails_only_with_the_support_reason():
    cfg = config()
    with pytest.raises(BackendUnavailableError) as info:
        MoeRunner(cfg, weights(cfg), backend="flashinfer_mxfp4")
    message = str(info.value)
    assert "cannot run this problem" in message and "CUDA" in message
    assert "moe-core:torch: usable" in message  # every backend's reason is listed
    assert "not installed" not in message and "not registered" not in message


@pytest.mark.parametrize(
    "cap,path",
    [((9, 0), devices.SM90_CUTLASS), ((10, 0), devices.SM100_TRTLLM)],
    ids=["sm90", "sm100"],
)
def test_supported_capabilities_choose_their_path(fake_gpu, cap, path):
    fake_gpu(cap)
    assert Op.check(cuda_problem()), Op.check(cuda_problem()).reason
    assert Op.available()
    assert Op.path(torch.device("cuda")) == path


@pytest.mark.parametrize(
    "cap,words",
    [
        ((8, 0), ["SM80 not supported", "needs SM90", "SM100"]),
        ((8, 9), ["SM89 not supported"]),
        ((10, 3), ["SM103 not supported", "#1754"]),
        ((12, 0), ["SM120 not supported", "SM90-only"]),
    ],
)
def test_unsupported_capabilities_say_why(fake_gpu, cap, words):
    fake_gpu(cap)
    support = Op.check(cuda_problem())
    assert not support
    for word in words:
        assert word in support.reason
    assert not Op.available() and "cuda:0: compute capability" in Op.available().reason
    with pytest.raises(BackendUnavailableError, match="not supported"):
        Op.path(torch.device("cuda"))


def test_one_supported_device_among_others_makes_the_machine_available(fake_gpu, monkeypatch):
    fake_gpu((9, 0), count=2)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: (8, 0) if d == 1 else (9, 0))
    assert Op.available()


@pytest.mark.parametrize(
    "kw,words",
    [
        (dict(dtype=torch.float16), "activation dtype float16 not supported"),
        (dict(activation="gelu"), "activation 'gelu' not supported"),
        (dict(quant_scheme="nvfp4"), "quant scheme 'nvfp4' not supported"),
        (dict(top_k=1, apply_router_weight_on_input=True), "router weight applied on the input"),
        (dict(a2a_backend="deepep"), "a2a backend 'deepep' not served"),
    ],
)
def test_declared_capabilities(fake_gpu, kw, words):
    fake_gpu((9, 0))
    support = Op.check(cuda_problem(**kw))
    assert not support and words in support.reason


def test_bias_and_swiglu_oai_are_supported(fake_gpu):
    fake_gpu((9, 0))
    assert Op.check(cuda_problem(has_bias=True, activation="swiglu_oai"))


def test_check_imports_flashinfer_only_for_the_sm90_build_state():
    """Cheap refusals, SM100 and ``available()`` never import flashinfer; an SM90 problem that passed everything
    else does (FlashInfer's JIT environment, to see whether a module is built), and is still answered ok."""
    import subprocess
    import textwrap

    code = textwrap.dedent(
        """
        import sys, torch
        cap = [(10, 0)]
        torch.cuda.is_available = lambda: True
        torch.cuda.device_count = lambda: 1
        torch.cuda.get_device_capability = lambda d=None: cap[0]
        from moe_core import MoeConfig, MoeProblem
        from moe_flashinfer_mxfp4.fused_op import FlashInferMxfp4FusedOp as Op
        cfg = MoeConfig(4, 2, 256, 128, quant_scheme="mxfp4", dtype=torch.bfloat16)
        fp16 = MoeConfig(4, 2, 256, 128, quant_scheme="mxfp4", dtype=torch.float16)
        answers = [bool(Op.check(MoeProblem(cfg, torch.device("cuda")))), bool(Op.available())]
        cap[0] = (9, 0)
        answers += [bool(Op.check(MoeProblem(fp16, torch.device("cuda")))), bool(Op.available())]
        print(answers, "flashinfer" in sys.modules)
        answers = [bool(Op.check(MoeProblem(cfg, torch.device("cuda"))))]
        print(answers, "flashinfer" in sys.modules)
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[:2] == ["[True, True, False, True] False", "[True] True"], proc.stdout
