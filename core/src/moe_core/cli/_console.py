"""One place that decides how wide tables are when stdout is not a terminal."""

from __future__ import annotations

import sys


def stdout_console():
    """A rich Console on stdout; 200 columns when piped, so tables are not squeezed into 80."""
    from rich.console import Console

    return Console() if sys.stdout.isatty() else Console(width=200)
