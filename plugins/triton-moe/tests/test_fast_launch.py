"""``moe_triton.fast_launch``: which launches take the kernel's launcher, what it is called with, and when the
plain ``fn[grid]`` runs instead (a stand-in JIT function and Triton internals on the CPU); on CUDA, the
forward with fast launches bitwise the forward without, misaligned inputs included."""

from __future__ import annotations

import inspect

import pytest
import torch

from moe_triton import fast_launch, switches
from moe_triton.sizes import cdiv, next_power_of_2


class _Param:
    def __init__(self, num, name, constexpr, default=inspect.Parameter.empty):
        self.num, self.name, self.default = num, name, default
        self.is_constexpr, self.is_const = constexpr, False
        self.do_not_specialize = self.do_not_specialize_on_alignment = False
        self.annotation = "constexpr" if constexpr else ""


class _Kernel:
    function, packed_metadata = "function", "metadata"

    def __init__(self, log):
        self.log = log

    def run(self, *args):
        self.log.append(("run", args))


class _Fn:
    """A stand-in ``@triton.jit`` function ``f(a, b, N, BLOCK: constexpr, FLAG: constexpr = 7)``."""

    def __init__(self):
        self.params = [_Param(0, "a", False), _Param(1, "b", False), _Param(2, "N", False),
                       _Param(3, "BLOCK", True), _Param(4, "FLAG", True, 7)]  # fmt: skip
        self.device_caches = {0: ({}, {}, "target", "backend", "binder")}
        self.log = []

    def __getitem__(self, grid):
        def run(*args, **kwargs):
            self.log.append(("plain", grid, args, kwargs))
            return _Kernel(self.log)

        return run


class _Driver:
    class active:  # mirrors triton.runtime.driver.driver.active
        get_current_device = staticmethod(lambda: 0)
        get_current_stream = staticmethod(lambda device: "stream")


class _Knobs:
    class runtime:
        launch_enter_hook = launch_exit_hook = None
        debug = False

    class compilation:
        instrumentation_mode = ""


@pytest.fixture
def fake(monkeypatch):
    """Triton's internals replaced: the specialization of an argument is (its type name, its value % 16)."""
    monkeypatch.setattr(fast_launch, "native_specialize_impl", lambda backend, a, c, s, al: (type(a).__name__, a % 16))
    monkeypatch.setattr(fast_launch, "driver", _Driver, raising=False)
    monkeypatch.setattr(fast_launch, "knobs", _Knobs, raising=False)
    monkeypatch.setattr(fast_launch, "broken", None)
    return _Fn()


def test_first_launch_of_a_key_is_plain_the_next_calls_the_launcher(fake):
    launcher = fast_launch.FastLaunch(fake)
    assert launcher.usable
    launcher((4,), (16, 32, 5), {"BLOCK": 64, "num_warps": 4})
    assert [e[0] for e in fake.log] == ["plain"]
    launcher((4, 2), (16, 32, 5), {"BLOCK": 64, "num_warps": 4})
    kind, args = fake.log[-1]
    # grid padded to 3 dims, the current stream, the kernel's handles, no hooks, runtime args, constexprs
    # in order with FLAG's default
    assert kind == "run" and args == (4, 2, 1, "stream", "function", "metadata", None, None, None, 16, 32, 5, 64, 7)
    assert launcher.hits == 1


@pytest.mark.parametrize(
    "args, kwargs",
    [((17, 32, 5), {"BLOCK": 64, "num_warps": 4}),  # another specialization of a runtime argument
     ((16, 32, 5), {"BLOCK": 128, "num_warps": 4}),  # another constexpr
     ((16, 32, 5), {"BLOCK": 64, "num_warps": 8})],  # another launch option
)  # fmt: skip
def test_a_new_specialization_goes_through_triton(fake, args, kwargs):
    launcher = fast_launch.FastLaunch(fake)
    launcher((1,), (16, 32, 5), {"BLOCK": 64, "num_warps": 4})
    launcher((1,), args, kwargs)
    assert [e[0] for e in fake.log] == ["plain", "plain"]
    launcher((1,), args, kwargs)
    assert fake.log[-1][0] == "run"


def test_switch_off_hooks_and_other_calls_take_the_plain_launch(fake, monkeypatch):
    launcher = fast_launch.FastLaunch(fake)
    call = ((1,), (16, 32, 5), {"BLOCK": 64})
    launcher(*call)
    with switches.override(fast_launch=False):
        launcher(*call)
    monkeypatch.setattr(_Knobs.runtime, "launch_enter_hook", lambda metadata: None)
    launcher(*call)
    monkeypatch.setattr(_Knobs.runtime, "launch_enter_hook", None)
    launcher((1,), (16, 32), {"N": 5, "BLOCK": 64})  # a runtime argument by keyword
    assert [e[0] for e in fake.log] == ["plain"] * 4
    launcher(*call)
    assert fake.log[-1][0] == "run"


def test_a_failing_fast_path_warns_once_and_stays_off(fake, monkeypatch):
    launcher = fast_launch.FastLaunch(fake)
    call = ((1,), (16, 32, 5), {"BLOCK": 64})
    launcher(*call)

    def broken_run(*args):
        raise RuntimeError("launcher changed")

    monkeypatch.setattr(_Kernel, "run", broken_run)
    with pytest.warns(RuntimeWarning, match="fast kernel launches off .*launcher changed"):
        launcher(*call)
    assert fast_launch.broken and fake.log[-1][0] == "plain"
    launcher(*call)
    assert fake.log[-1][0] == "plain"


def test_an_error_of_a_first_launch_raises_and_leaves_the_fast_path_on(fake, monkeypatch):
    """A launch Triton itself refuses (here: the stand-in raising for a bad argument) is the caller's error,
    not a reason to stop relaunching the kernels that work."""
    launcher = fast_launch.FastLaunch(fake)
    launcher((1,), (16, 32, 5), {"BLOCK": 64})
    working = _Fn.__getitem__

    def refuse(self, grid):
        def run(*args, **kwargs):
            raise ValueError("bad argument")

        return run

    monkeypatch.setattr(_Fn, "__getitem__", refuse)
    with pytest.raises(ValueError, match="bad argument"):
        launcher((1,), (16, 32, 6), {"BLOCK": 64})
    monkeypatch.setattr(_Fn, "__getitem__", working)
    assert fast_launch.broken is None
    launcher((1,), (16, 32, 5), {"BLOCK": 64})
    assert fake.log[-1][0] == "run"


def test_not_usable_for_annotated_runtime_args_or_constexprs_first():
    fn = _Fn()
    fn.params[0].annotation = "i32"
    assert not fast_launch.FastLaunch(fn).usable
    fn = _Fn()
    fn.params[0], fn.params[3] = fn.params[3], fn.params[0]
    assert not fast_launch.FastLaunch(fn).usable


def test_sizes_match_python_math():
    for a in range(0, 300):
        for b in (1, 3, 16, 128):
            assert cdiv(a, b) == -(-a // b) == (a + b - 1) // b
        assert next_power_of_2(a) == (1 if a <= 1 else 2 ** (a - 1).bit_length())
        assert next_power_of_2(a) >= a and (a <= 1 or next_power_of_2(a) < 2 * a)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (runs on the H200)")
@pytest.mark.parametrize("scheme, activation, m", [("bf16", "silu", 1), ("bf16", "silu", 600),
                                                   ("fp8_block", "silu", 64), ("mxfp4", "swiglu_oai", 8),
                                                   ("mxfp4", "swiglu_oai", 600)])  # fmt: skip
def test_cuda_forward_with_fast_launches_is_bitwise_the_plain_one(scheme, activation, m):
    from moe_core import MoeConfig, MoeRunner
    from moe_core.synthetic import random_inputs, random_weights

    if fast_launch.native_specialize_impl is None:
        pytest.skip("this Triton release is not in fast_launch.VERIFIED_TRITON: every launch is plain")
    cfg = MoeConfig(16, 4, 512, 256, quant_scheme=scheme, activation=activation, dtype=torch.bfloat16)
    runner = MoeRunner(cfg, random_weights(cfg, "cuda"), backend="triton")
    x, ids, tw = random_inputs(cfg, m, "cuda")
    buffer = torch.empty(x.numel() + 1, dtype=x.dtype, device="cuda")
    misaligned = buffer[1:].view_as(x)  # 2 bytes past a 16-byte boundary: another specialization of x's pointer
    misaligned.copy_(x)
    with switches.override(fast_launch=False):
        plain = runner(x, ids, tw)
        plain_misaligned = runner(misaligned, ids, tw)
    hits = sum(launcher.hits for launcher in fast_launch._launchers.values())
    for _ in range(3):  # the first launch of each specialization is plain, the later ones fast
        fast = runner(x, ids, tw)
        fast_misaligned = runner(misaligned, ids, tw)
    assert sum(launcher.hits for launcher in fast_launch._launchers.values()) > hits
    assert fast_launch.broken is None
    assert torch.equal(fast, plain) and torch.equal(fast_misaligned, plain_misaligned)
    assert torch.equal(plain_misaligned, plain)
