"""Every kernel variant compiles for Hopper (sm90) — checked on a CPU, no GPU needed.

Triton's frontend and its bundled ptxas run anywhere; this catches what the
CPU interpreter lets through (it is more permissive than the compiler) before
a GPU lease is spent on it.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[1] / "tools" / "compile_sm90.py"


def test_kernels_compile_for_sm90():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, env=env, timeout=600)
    if proc.returncode != 0 and "ptxas" in proc.stderr and "not found" in proc.stderr.lower():
        pytest.skip("this triton build ships no ptxas")
    assert proc.returncode == 0, proc.stderr[-3000:]
    # The exact count: a variant dropped from the list (or a loop that stops
    # early) must fail here, not pass with fewer kernels checked.
    assert "compiled 267 kernels for sm90" in proc.stdout


LOOP_TOOL = Path(__file__).parents[1] / "tools" / "sm90_loop.py"


def loop_of(*args: str) -> str:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, str(LOOP_TOOL), *args], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


@pytest.mark.parametrize(
    "args,mma",
    [  # the shipped H200 mxfp4 tiles at M=4096 (swapped GEMM1: a register operand of wgmma) and M=8 (mma.sync)
        (("gemm1", "BLOCK_M=128", "BLOCK_N=64", "BLOCK_K=64", "SWAP_AB=True", "--stages", "4"), "wgmma.mma_async"),
        (("gemm2", "BLOCK_M=16", "BLOCK_N=256", "BLOCK_K=64", "--stages", "4"), "mma.sync"),
    ],
)
def test_mxfp4_k_loops_read_weight_bytes_wide_and_stage_every_load(args, mma):
    """The fragment order of the MXFP4 bytes (``moe_triton.layout``), read off the sm90 build of the K loop:
    no 2-byte shared-memory loads (what chunk order cost the swapped GEMMs) and no global load left in the
    loop (the activations permuted to the bytes' order must still be staged through shared memory)."""
    out = loop_of(*args, "--scheme", "mxfp4")
    assert mma in out, out
    assert "ld.shared.v2.b8" not in out and "ld.shared.b16" not in out and "ld.shared.u8" not in out, out
    assert "ld.global" not in out, out


def test_loop_tool_builds_a_walk_with_the_constexprs_it_does_not_name():
    """``sm90_loop.py`` names some of the kernels' constexprs; the rest (a walk's ``TAIL_M``, ``TAIL_SWAP``)
    take their defaults (``compile_sm90.with_defaults``) instead of being compiled as runtime arguments, which
    the walk's few-row branch cannot build with."""
    out = loop_of("gemm2", "PERSISTENT=True", "BLOCK_M=128", "BLOCK_N=128", "BLOCK_K=64")
    assert "wgmma.mma_async" in out, out


@pytest.mark.parametrize(
    "args",
    [  # the shipped H200 mxfp4 tiles at M=2048: GEMM1 walking 128-row blocks with 64-row tails, GEMM2 8 warps
        ("gemm1", "BLOCK_M=128", "BLOCK_N=64", "BLOCK_K=64", "SWAP_AB=True", "PERSISTENT=True", "TAIL_M=64",
         "TAIL_SWAP=True", "--stages", "4"),
        ("gemm2", "BLOCK_M=128", "BLOCK_N=256", "BLOCK_K=64", "SWAP_AB=True", "PERSISTENT=True", "--warps", "8",
         "--stages", "4"),
    ],
)  # fmt: skip
def test_mxfp4_whole_chunks_leave_no_mma_waiting_inside_a_k_step(args):
    """The ``mxfp4_whole_chunk`` switch's reason, read off the sm90 build: with two 32-deep MMAs per chunk the
    K loop waits for every MMA in flight (``wgmma.wait_group 0``) between the two halves; with one 64-deep MMA
    (``kernels.gemm._cat_k``) it leaves them in flight."""
    halves = loop_of(*args, "--scheme", "mxfp4", "WHOLE_CHUNK=False")
    whole = loop_of(*args, "--scheme", "mxfp4", "WHOLE_CHUNK=True")
    assert "wgmma.wait_group.sync.aligned 0" in halves, halves
    assert "wgmma.wait_group.sync.aligned 0" not in whole and "wgmma.mma_async" in whole, whole
