"""The tuner's compile workers (``moe_triton.compile_pool``): the number of workers, a candidate launched
once in a worker (and in-process), failures reported instead of raised, a broken pool giving up with a
warning, and on CUDA the point of it all: the tuner's own launch of a candidate a worker built compiles
nothing (Triton's on-disk cache holds it)."""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures.process import BrokenProcessPool

import pytest
import torch

from moe_core.presets import PRESETS
from moe_triton import compile_pool, tune
from moe_triton.kernel_configs import GemmConfig
from moe_triton.layout import TritonWeights

pytest.importorskip("triton")
CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
SCHEME, DTYPE = ("bf16", torch.bfloat16) if CUDA else ("fp32", torch.float32)
CONFIG = PRESETS["tiny"].config(SCHEME, DTYPE)
GOOD = GemmConfig(block_n=64, block_k=32, group_m=1, num_warps=4, num_stages=2)
SHAPES = tune.prepare_weights_for(CONFIG, DEVICE).shapes()


def test_default_jobs_reads_the_variable_and_rejects_nonsense(monkeypatch):
    monkeypatch.delenv(compile_pool.JOBS_VAR, raising=False)
    assert compile_pool.default_jobs("cpu") == 0  # the interpreter compiles nothing
    monkeypatch.setenv(compile_pool.JOBS_VAR, "3")
    assert compile_pool.default_jobs("cpu") == 3
    for bad in ("many", "-1"):
        monkeypatch.setenv(compile_pool.JOBS_VAR, bad)
        with pytest.raises(ValueError, match=compile_pool.JOBS_VAR):
            compile_pool.default_jobs("cpu")


def test_warm_one_launches_a_candidate_and_reports_a_failure():
    job = (CONFIG, SHAPES, 5, 16, "gemm1", GOOD, 1, DEVICE)
    assert compile_pool.warm_one(job) is None
    assert compile_pool.warm_one((CONFIG, SHAPES, 5, 16, "gemm2", GOOD, 2, DEVICE)) is None  # split-K scratch too
    bad = GemmConfig(block_n=48, block_k=32, group_m=1, num_warps=4, num_stages=2)  # not a power of two
    err = compile_pool.warm_one((CONFIG, SHAPES, 5, 16, "gemm1", bad, 1, DEVICE))
    assert err is not None and err.startswith("gemm1 ") and "split 1" in err


@pytest.mark.parametrize("scheme", ["mxfp4", SCHEME])
def test_a_worker_builds_zeros_of_the_tuners_layout_not_random_weights(scheme, monkeypatch):
    """Workers compile from zero weights of the prepared layout (the values never reach compilation):
    same fields, shapes, strides and dtypes; drawing random weights (float32 first) is never asked for."""
    dtype = torch.float16 if scheme == "mxfp4" and not CUDA else DTYPE
    config = PRESETS["tiny"].config(scheme, dtype)
    prepared = tune.prepare_weights_for(config, DEVICE)
    zeros = TritonWeights.zeros(prepared.shapes(), DEVICE)
    assert zeros.shapes() == prepared.shapes() and zeros.scheme == scheme
    assert not zeros.w13.any() and (scheme != "mxfp4" or zeros.w13_scale.dtype == torch.int32)

    def no_random(*a, **k):
        raise AssertionError("a worker drew random weights")

    monkeypatch.setattr(tune, "prepare_weights_for", no_random)
    monkeypatch.setattr(compile_pool, "_STATE", {})
    assert compile_pool.warm_one((config, prepared.shapes(), 5, 16, "gemm1", GOOD, 1, DEVICE)) is None


def test_a_pool_of_no_workers_does_nothing():
    with compile_pool.Compiler(1, DEVICE) as c:
        assert c.pool is None and c.warm(CONFIG, SHAPES, 5, 16, "gemm1", [(GOOD, 1)]) == []


def test_workers_launch_each_pair_and_return_the_failures():
    bad = GemmConfig(block_n=48, block_k=32, group_m=1, num_warps=4, num_stages=2)
    lines = []
    with compile_pool.Compiler(2, DEVICE, log=lines.append) as c:
        assert c.pool is not None and compile_pool.JOBS_VAR in lines[0]
        errors = c.warm(CONFIG, SHAPES, 5, 16, "gemm1", [(GOOD, 1), (bad, 1), (GOOD, 2)])
    assert len(errors) == 1 and "block_n=48" in errors[0]
    assert c.pool is None  # closed on exit


def test_a_broken_pool_warns_and_tuning_goes_on_without_it(monkeypatch):
    c = compile_pool.Compiler(2, DEVICE, log=lambda line: None)

    def broken(*a, **k):
        raise BrokenProcessPool("a worker died")

    monkeypatch.setattr(c.pool, "map", broken)
    with pytest.warns(RuntimeWarning, match="without compile workers"):
        assert c.warm(CONFIG, SHAPES, 5, 16, "gemm1", [(GOOD, 1)]) == []
    assert c.pool is None and c.warm(CONFIG, SHAPES, 5, 16, "gemm1", [(GOOD, 1)]) == []


def test_a_worker_out_of_memory_ends_the_pool_not_the_tuning(monkeypatch):
    """The tuner's own memory comes first: one worker out of its share closes the pool with a warning."""
    c = compile_pool.Compiler(2, DEVICE, log=lambda line: None)

    def out_of_memory(*a, **k):  # what the pool re-raises from a worker
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.63 GiB.")

    monkeypatch.setattr(c.pool, "map", out_of_memory)
    with pytest.warns(RuntimeWarning, match=f"share of GPU memory.*{compile_pool.JOBS_VAR}"):
        assert c.warm(CONFIG, SHAPES, 5, 16, "gemm2", [(GOOD, 1), (GOOD, 8)]) == []
    assert c.pool is None


def test_a_worker_bounds_its_memory_on_an_indexed_device(monkeypatch):
    """torch's ``set_per_process_memory_fraction`` rejects a bare "cuda": the worker passes an index."""
    calls = []
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", lambda f, d: calls.append((f, d)))
    compile_pool._start_worker("cuda", 0.25)
    compile_pool._start_worker("cuda:1", 0.25)
    compile_pool._start_worker("cpu", 0.25)  # nothing to bound
    assert calls == [(0.25, 0), (0.25, 1)]


def test_a_worker_out_of_memory_is_raised_not_reported(monkeypatch):
    """``warm_one`` reports a candidate's failure but raises the worker's own: ``Compiler.warm`` ends the pool."""

    def no_memory(*a, **k):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.63 GiB.")

    monkeypatch.setattr(compile_pool, "_STATE", {})
    monkeypatch.setattr(TritonWeights, "zeros", no_memory)
    with pytest.raises(torch.OutOfMemoryError, match="2.63 GiB"):
        compile_pool.warm_one((CONFIG, SHAPES, 5, 16, "gemm1", GOOD, 1, DEVICE))


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA: Triton's interpreter compiles nothing, so nothing is cached")
def test_a_candidate_a_worker_built_compiles_nothing_in_the_tuner(tmp_path, monkeypatch):
    """Workers fill a fresh Triton cache; a fresh process (no in-memory kernels) then launching the same
    candidates through the tuner's own launches adds no file to it: every kernel was a cache hit."""
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))  # inherited by the spawned workers
    g = GemmConfig(block_n=64, block_k=64, group_m=1, num_warps=4, num_stages=3, swap_ab=True)
    with compile_pool.Compiler(2, DEVICE, log=lambda line: None) as c:
        assert c.warm(CONFIG, SHAPES, 7, 16, "gemm1", [(g, 1), (g, 2)]) == []
        assert c.warm(CONFIG, SHAPES, 7, 16, "gemm2", [(g, 1)]) == []

    def files():
        return sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())

    built = files()
    assert any(name.endswith(".cubin") for name in built)
    code = (
        "import torch\n"
        "from moe_core.presets import PRESETS\n"
        "from moe_triton import tune\n"
        "from moe_triton.kernel_configs import GemmConfig\n"
        "cfg = PRESETS['tiny'].config('bf16', torch.bfloat16)\n"
        "g = GemmConfig(block_n=64, block_k=64, group_m=1, num_warps=4, num_stages=3, swap_ab=True)\n"
        "makes = tune._launches(cfg, tune.prepare_weights_for(cfg, 'cuda'), tune._inputs(cfg, 7, 'cuda'), 16, 'cuda')\n"
        "makes['gemm1'](g, 1)(); makes['gemm1'](g, 2)(); makes['gemm2'](g, 1)()\n"
        "torch.cuda.synchronize()\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert files() == built
