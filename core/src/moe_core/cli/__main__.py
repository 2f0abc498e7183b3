"""``python -m moe_core.cli`` is the ``moe`` command."""

import sys

from moe_core.cli import main

sys.exit(main())
