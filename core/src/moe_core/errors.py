"""Every error moe-core raises on purpose, in one place.

Each class says *what kind of thing went wrong* so callers can catch narrowly,
and each message says *what to do about it*. All derive from ``MoeError``;
errors about the caller's input also derive from ``ValueError`` / ``TypeError``
so generic handlers keep working.
"""

from __future__ import annotations


class MoeError(Exception):
    """Base class of every error raised by moe-core."""


class InvalidInputError(MoeError, ValueError):
    """A tensor, shape, dtype, device or config value the caller passed is wrong."""


class PluginWarning(UserWarning):
    """Something about the installed plugins deserves attention but is not fatal."""


class BackendError(MoeError):
    """A runner backend could not be found, loaded or used."""


class BackendNotInstalledError(BackendError, LookupError):
    """No installed distribution provides the requested runner backend."""


class BackendDisabledError(BackendError):
    """The backend is installed but filtered out by MOE_PLUGINS / MOE_DISABLE_PLUGINS."""


class DuplicateBackendError(BackendError):
    """Two distributions provide the same (a2a_backend, runner_backend) key."""


class PluginLoadError(BackendError):
    """Importing or registering a plugin failed (the original error is chained)."""


class IncompatiblePluginError(PluginLoadError):
    """A plugin targets another major version of the moe-core plugin API."""


class BackendUnavailableError(BackendError):
    """The backend loaded but cannot run this problem on this machine."""


class PluginError(BackendError):
    """Plugin code raised, or answered something the contract forbids, in one step.

    Raised by the one guarded path into plugin code (``moe_core.guard``): the
    message names the distribution, its version and the step; ``step`` and
    ``traceback`` keep them for reports, and the original exception is chained.
    """

    def __init__(self, message: str, *, step: str = "", traceback: str = "") -> None:
        super().__init__(message)
        self.step = step
        self.traceback = traceback


class RankError(MoeError):
    """A rank of a run over several processes raised, died or stopped answering; the message names it."""
