"""On a machine without CUDA the tests run under Triton's CPU interpreter.

``TRITON_INTERPRET`` must be set before any kernel module is imported (triton
reads it when a ``@triton.jit`` function is created); the plugin imports its
kernels only when a runner binds, so setting it here is early enough.
"""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (runs on the H200)")
