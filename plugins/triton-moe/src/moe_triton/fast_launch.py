"""Launch a compiled Triton kernel again without ``JITFunction.run``'s per-call work: ``launch(fn, grid, ...)``.

Why: an eager forward at decode, or a prefill's host work before its first GEMM starts, is bound by the
host, and ``fn[grid](*args)`` costs tens of µs per launch in Triton 3.6 (the kernels' ~45 arguments
bound into a dict, a string of the options for every cache key, a comparison of each global the kernel
reads, launch metadata), around a few µs of GPU work at decode.

``launch(fn, grid, *args, **kwargs)`` is ``fn[grid](*args, **kwargs)``. The first launch of each
specialization goes through ``fn[grid]`` (compiling as usual) and keeps the compiled kernel under a key
of what Triton specializes a kernel on: each runtime argument's ``native_specialize_impl`` (Triton's own
function: dtype, 16-byte alignment, integer divisibility and size), every constexpr and launch option
(``kwargs``), the device. A later launch with the same key calls that kernel's launcher directly, on the
current stream (so CUDA-graph capture sees the same launch). Because the key is built with Triton's own
specialization, a key never maps to a kernel compiled for other argument properties.

Used only where what it reads of Triton holds: a Triton release it was checked against
(``VERIFIED_TRITON``), compiled kernels (not the interpreter), runtime arguments before constexprs and none
annotated, no launch hooks (a profiler such as proton sees every launch through ``fn[grid]``), no debug or
instrumentation mode, and the ``fast_launch`` switch on (``MOE_TRITON_FAST_LAUNCH``). Anything else, or any
failure of the fast path, takes ``fn[grid]`` — a failure for good, with one warning naming it.
"""

from __future__ import annotations

import warnings

from moe_triton.switches import current_switches

#: the Triton releases (major, minor) whose launch internals this module was written and checked against
VERIFIED_TRITON = frozenset({(3, 6)})

try:  # Triton's internals read here; with another release every launch is a plain fn[grid]
    import triton
    from triton import knobs
    from triton._C.libtriton import native_specialize_impl
    from triton.runtime.driver import driver

    if tuple(int(p) for p in triton.__version__.split(".")[:2]) not in VERIFIED_TRITON:
        native_specialize_impl = None
except (ImportError, ValueError):  # pragma: no cover - another Triton: the plain launch
    native_specialize_impl = None

#: why the fast path is off for this process (after a failure), else None
broken: str | None = None
_launchers: dict = {}


def launch(fn, grid: tuple, *args, **kwargs):
    """``fn[grid](*args, **kwargs)``, through the kernel's ``FastLaunch`` where it applies."""
    launcher = _launchers.get(fn)
    if launcher is None:
        launcher = _launchers[fn] = FastLaunch(fn)
    return launcher(grid, args, kwargs)


class FastLaunch:
    """The launches of one ``@triton.jit`` function (see the module docstring); ``usable`` says whether the
    fast path can apply to it at all, ``hits`` counts the launches that took it."""

    def __init__(self, fn) -> None:
        self.fn = fn
        self.hits = 0
        self._kernels: dict = {}
        params = getattr(fn, "params", None)
        self.usable = native_specialize_impl is not None and hasattr(fn, "device_caches") and params is not None
        if self.usable:
            runtime = [p for p in params if not p.is_constexpr]
            constexprs = params[len(runtime) :]
            self.usable = all(p.is_constexpr for p in constexprs) and not any(p.annotation for p in runtime)
            self._flags = [(p.is_const, not p.do_not_specialize, not p.do_not_specialize_on_alignment) for p in runtime]
            self._constexprs = [(p.name, p.default) for p in constexprs]

    def __call__(self, grid: tuple, args: tuple, kwargs: dict):
        if (not self.usable or broken is not None or len(args) != len(self._flags) or _hooked()
                or not current_switches().fast_launch):  # fmt: skip
            return self.fn[grid](*args, **kwargs)
        try:
            device = driver.active.get_current_device()
            backend = self.fn.device_caches[device][3]
            specs = tuple([native_specialize_impl(backend, a, c, s, al) for a, (c, s, al) in zip(args, self._flags)])
            key = (device, tuple(kwargs.items()), specs)
            kernel = self._kernels.get(key)
        except Exception as exc:  # Triton is not what this module read: the plain launch from now on
            _give_up(f"{type(exc).__name__}: {exc}")
            return self.fn[grid](*args, **kwargs)
        if kernel is None:  # first launch of this key: Triton's own path (a bad argument raises from there)
            kernel = self.fn[grid](*args, **kwargs)
            if hasattr(kernel, "result"):  # compiled asynchronously
                kernel = kernel.result()
            self._kernels[key] = kernel
            return kernel
        try:
            tail = [kwargs.get(name, default) for name, default in self._constexprs]
            grid_1 = grid[1] if len(grid) > 1 else 1
            grid_2 = grid[2] if len(grid) > 2 else 1
            stream = driver.active.get_current_stream(device)
            kernel.run(grid[0], grid_1, grid_2, stream, kernel.function, kernel.packed_metadata, None, None, None,
                       *args, *tail)  # fmt: skip
        except Exception as exc:  # the plain launch from now on; a real error raises again from there
            _give_up(f"{type(exc).__name__}: {exc}")
            return self.fn[grid](*args, **kwargs)
        self.hits += 1
        return kernel


def _hooked() -> bool:
    """Whether Triton would do more per launch than launch: hooks (profilers), debug, instrumentation."""
    rt = knobs.runtime
    return (
        _active(rt.launch_enter_hook)
        or _active(rt.launch_exit_hook)
        or bool(rt.debug)
        or bool(knobs.compilation.instrumentation_mode)
    )


def _active(hook) -> bool:
    """A launch hook that would run: a function, or a ``HookChain`` (Triton 3.6) holding one."""
    return hook is not None and bool(getattr(hook, "calls", True))


def _give_up(why: str) -> None:
    global broken
    broken = why
    warnings.warn(f"moe_triton: fast kernel launches off for this process ({why}); launching through "
                  f"Triton's JITFunction.run", RuntimeWarning, 3)  # fmt: skip
