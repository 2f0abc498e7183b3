"""moe-torch-grouped: the ``torch_grouped`` runner backend for moe-core.

An out-of-tree plugin written as a third party would write one: it depends on
moe-core's public API only and registers through the entry-point group
``moe.fused_ops`` (see ``pyproject.toml``). ``import moe_torch_grouped``
imports neither torch nor moe-core; the fused op lives in
``moe_torch_grouped.fused_op``.
"""

__version__ = "0.1.0"
