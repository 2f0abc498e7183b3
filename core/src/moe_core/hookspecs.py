"""The pluggy hooks a plugin implements (project name ``moe``).

A plugin's entry point (group ``moe.fused_ops`` for a kernel backend, ``moe.a2a``
for a token dispatcher) names an object — usually a module — carrying functions
marked with ``moe_core.hookimpl``: ``moe_api_version`` and the hook of its kind. pluggy checks
their argument names against these specs at registration, and
``check_pending()`` rejects a marked function whose name matches no spec (a
misspelled hook). Hooks answer registration questions only; nothing here is
called per forward.
"""

from __future__ import annotations

import pluggy

PROJECT_NAME = "moe"

#: Major version of the plugin API this moe-core provides. A plugin returns the
#: version it targets from its ``moe_api_version`` hook; a mismatch is refused.
API_VERSION = 1

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


@hookspec
def moe_api_version() -> int:
    """Return the major version of the moe-core plugin API this plugin targets.

    moe-core refuses a plugin whose answer differs from ``moe_core.API_VERSION``.
    """


@hookspec
def moe_fused_ops() -> list:
    """Return the ``FusedOp`` subclasses this plugin provides.

    Each class's ``name`` must equal the entry-point name it was loaded
    through; one class per (a2a backend, runner backend) key.
    """


@hookspec
def moe_dispatchers() -> list:
    """Return the ``moe_core.dispatch.Dispatcher`` subclasses this plugin provides (entry-point group ``moe.a2a``).

    The class whose ``name`` equals the entry-point name it was loaded through is that name's dispatcher; its
    ``format`` must be one of ``moe_core.dispatch.FORMATS``.
    """
