"""The two kinds of plugin: kernel backends (group ``moe.fused_ops``) and token dispatchers (group ``moe.a2a``).

A kind is what discovery, loading and listing must know to treat its group the way they treat the other: the
entry-point group, the hook whose answer lists the classes, their base class, what each class declares beyond
its ``name`` (checked at load, summarised on its row of ``moe backends``) and the words messages use. The
rest — the guarded import, registration, API version, filters, strict mode, the rows — is one code path for
both, so a dispatcher plugin is held to exactly what a kernel plugin is held to.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from moe_core import guard
from moe_core.discovery import GROUP, PluginEntry

A2A_GROUP = "moe.a2a"


@dataclass(frozen=True)
class PluginKind:
    #: the rows' ``kind`` in ``moe backends --json``
    key: str
    group: str
    #: the hook returning the classes (``moe_core.hookspecs``)
    hook: str
    #: what one provided class is called in load messages ("fused op")
    thing: str
    #: what an entry-point name is called in selection messages ("runner backend")
    noun: str
    #: the base class every provided class subclasses (imported on first load, not at discovery)
    base: Callable[[], type]
    #: ``(entry, classes) -> ""`` or why the declarations are refused; reads them through ``moe_core.guard``
    check: Callable[[PluginEntry, tuple[type, ...]], str]
    #: ``classes -> {field: value}``: what the row of a loaded entry shows besides its status
    summary: Callable[[tuple[type, ...]], dict]


def _names(entry: PluginEntry, cls: type, attr: str) -> str:
    """Nothing ("") when ``cls.attr`` is a tuple of names, else why not."""
    value = guard.call(entry, attr, getattr, cls, attr)
    if isinstance(value, str) or not all(isinstance(v, str) for v in value):
        return f"{cls.__name__}.{attr} must be a tuple of names, got {value!r}"
    return ""


def _check_fused_ops(entry: PluginEntry, ops: tuple[type, ...]) -> str:
    keys = []
    for op in ops:
        wrong = _names(entry, op, "a2a_backends") or _names(entry, op, "dispatch_formats")
        if wrong:
            return wrong
        guard.priority(entry, op)
        keys += [(a, op.name) for a in op.a2a_backends]
    repeated = sorted({k for k in keys if keys.count(k) > 1})
    return f"two fused ops for the same (a2a, runner) key: {repeated}" if repeated else ""


def _summarise_fused_ops(ops: tuple[type, ...]) -> dict:
    return dict(
        a2a_backends=tuple(sorted({a for op in ops for a in op.a2a_backends})),
        formats=tuple(sorted({f for op in ops for f in op.dispatch_formats})),
        priority=max(op.priority for op in ops),
    )


def _check_dispatchers(entry: PluginEntry, classes: tuple[type, ...]) -> str:
    from moe_core.dispatch import FORMATS

    if len(classes) > 1:
        return f"provides {len(classes)} dispatchers named {entry.name!r}; a name selects one dispatcher"
    value = guard.call(entry, "format", getattr, classes[0], "format", None)
    if value not in FORMATS:
        return f"{classes[0].__name__}.format is {value!r}, not one of {', '.join(FORMATS)}"
    return ""


def _fused_op_base() -> type:
    from moe_core.fused_op import FusedOp

    return FusedOp


def _dispatcher_base() -> type:
    from moe_core.dispatch import Dispatcher

    return Dispatcher


FUSED_OPS = PluginKind(
    "fused_op", GROUP, "moe_fused_ops", "fused op", "runner backend", _fused_op_base, _check_fused_ops,
    _summarise_fused_ops,
)  # fmt: skip
DISPATCHERS = PluginKind(
    "dispatcher", A2A_GROUP, "moe_dispatchers", "dispatcher", "dispatcher", _dispatcher_base, _check_dispatchers,
    lambda classes: dict(formats=(classes[0].format,)),
)  # fmt: skip
KINDS = (FUSED_OPS, DISPATCHERS)


def kind_of(group: str) -> PluginKind:
    """The kind whose entry-point group is ``group``."""
    for kind in KINDS:
        if kind.group == group:
            return kind
    raise ValueError(f"no moe plugin kind has entry-point group {group!r} (kinds: {[k.group for k in KINDS]})")
