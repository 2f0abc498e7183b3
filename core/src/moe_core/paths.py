"""Where moe writes on a user's machine: one directory per kind of record, under the user's cache directory.

Anything moe or a plugin learns on a machine (a tuned tile table, a measured selection) is written here,
never into an installed package: site-packages may be read-only, is shared by every user of an
environment, and is replaced on upgrade. ``MOE_CACHE_DIR`` moves the whole tree (CI, containers); a
kind may have its own variable that moves just that kind. Read on each call, not at import.
"""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

CACHE_VAR = "MOE_CACHE_DIR"


def user_dir(kind: str, env_var: str | None = None) -> Path:
    """``$<env_var>`` if set, else ``$MOE_CACHE_DIR/<kind>``, else ``<user cache dir>/moe/<kind>``.

    The directory is not created here: a reader of a missing directory finds nothing, a writer
    creates it (``mkdir(parents=True, exist_ok=True)``).
    """
    if env_var and os.environ.get(env_var):
        return Path(os.environ[env_var]).expanduser()
    root = os.environ.get(CACHE_VAR)
    base = Path(root).expanduser() if root else Path(platformdirs.user_cache_dir("moe", appauthor=False))
    return base / kind
