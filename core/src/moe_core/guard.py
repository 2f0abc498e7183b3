"""The one door into plugin code.

Every call core makes into a plugin goes through ``call``: importing it, its
hooks, a fused op's ``check`` / ``available`` / ``priority``, ``__init__``,
``prepare``, ``warmup`` and ``tune``. Whatever the plugin raises except
``KeyboardInterrupt`` — ``SystemExit`` included, since a plugin must never end
the process that hosts it — comes back as a ``PluginError`` naming the
distribution, its version and the step, with the traceback kept and the
original exception chained; an answer of the wrong type is refused the same
way. The callers decide what a failure means: a row with status ``error``, a
backend that ``auto`` skips with a warning, or an error for an explicit request.

``apply`` is the hot path and is not wrapped here: the runner converts only
process-ending exceptions from it and checks its result's metadata instead.
"""

from __future__ import annotations

import numbers
import traceback
from collections.abc import Callable
from typing import Any

from moe_core.errors import PluginError


def where(owner) -> str:
    """``distribution version`` of a ``PluginEntry``, or the module of a class given directly."""
    dist = getattr(owner, "distribution", None)
    if dist is not None:
        return f"{dist} {owner.version}"
    return f"{getattr(owner, '__module__', '?')}.{getattr(owner, '__qualname__', owner)!s}"


def failure(owner, step: str, what: str, exc: BaseException | None = None) -> PluginError:
    """A ``PluginError`` for ``owner``'s ``step`` (``exc``'s traceback kept, when there is one)."""
    tb = "".join(traceback.format_exception(exc)) if exc is not None else ""
    return PluginError(f"{where(owner)}: {step} {what}", step=step, traceback=tb)


def call(owner, step: str, fn: Callable[..., Any], *args, **kwargs) -> Any:
    """``fn(*args, **kwargs)``; any exception but ``KeyboardInterrupt`` becomes a ``PluginError``."""
    try:
        return fn(*args, **kwargs)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:
        raise failure(owner, step, f"raised {type(exc).__name__}: {exc}", exc) from exc


def forward_call(owner, step: str, fn: Callable[..., Any], *args) -> Any:
    """A per-forward call into plugin code (a fused op's ``apply``, a dispatcher's ``dispatch`` / ``combine``):
    its ``Exception`` reaches the caller as it is, so their own handling (out of memory, bad input) keeps
    working; any other ``BaseException`` but ``KeyboardInterrupt`` (``SystemExit`` and the like) becomes a
    ``PluginError`` naming the plugin, since it must not end the caller's process."""
    try:
        return fn(*args)
    except (Exception, KeyboardInterrupt):
        raise
    except BaseException as exc:
        raise failure(owner, step, f"raised {type(exc).__name__}: {exc}", exc) from exc


def support(owner, step: str, fn: Callable[..., Any], *args):
    """A guarded support answer (``check``, ``available``, ``warmup``): must be a ``Support``."""
    from moe_core.fused_op import Support

    answer = call(owner, step, fn, *args)
    if not isinstance(answer, Support):
        raise failure(owner, step, f"returned {answer!r}, not a moe_core.Support")
    return answer


def priority(owner, op: type, problem=None) -> float:
    """``op.priority`` (``op.priority_for(problem)`` for a problem), read through the door and required to be
    a real number (not a bool)."""
    if problem is None:
        value = call(owner, "priority", getattr, op, "priority")
    else:
        value = call(owner, "priority", op.priority_for, problem)
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise failure(owner, "priority", f"of {op.__name__} is {value!r}, not a number")
    return value
