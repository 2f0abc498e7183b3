"""Host-side size arithmetic of the launches: ``cdiv`` and ``next_power_of_2`` in plain Python.

Why not ``triton.cdiv`` / ``triton.next_power_of_2``: in Triton 3.5+ they are constexpr functions, and a
call from host code unwraps its arguments through Triton's constexpr machinery — a few µs each, and a
forward computes a dozen grid and scratch sizes. Inside ``@triton.jit`` code Triton's own stay in use.
"""

from __future__ import annotations


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for integers."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= ``n`` (1 for ``n <= 1``)."""
    return 1 if n <= 1 else 1 << (n - 1).bit_length()
