"""The float dtypes by their short names (``"bf16"``): one table, torch-free.

The short names are also the names of the unquantized schemes, which compute
in exactly that dtype. Torch is imported only by the functions that need it,
so the command line can offer the names without importing torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    import torch

#: short name -> the ``torch`` attribute of that dtype
FLOAT_DTYPE_NAMES: dict[str, str] = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def float_dtype(name: str) -> torch.dtype:
    """``"bf16"`` -> ``torch.bfloat16``."""
    import torch

    return getattr(torch, FLOAT_DTYPE_NAMES[name])


def float_dtypes() -> dict[str, torch.dtype]:
    """Every short name with its dtype."""
    return {name: float_dtype(name) for name in FLOAT_DTYPE_NAMES}


def short_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bf16"``."""
    return next(name for name, attr in FLOAT_DTYPE_NAMES.items() if dtype_label(dtype) == attr)


def dtype_label(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"``, for messages."""
    return str(dtype).removeprefix("torch.")
