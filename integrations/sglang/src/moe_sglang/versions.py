"""The SGLang releases this bridge's hooks were written and tested against.

The hooks wrap private methods of SGLang's quantization methods (README: "What it hooks"); their signatures and
the weight layouts they leave behind change between releases without notice. So any release not listed here is
refused with a sentence at plugin load, instead of patching code whose shape is unknown. Read from package
metadata (``moe_core.integrations.engine_versions``, the guard every bridge shares), never by importing SGLang.
"""

from __future__ import annotations

from moe_core.integrations import engine_versions

#: SGLang versions the bridge was tested against (exact releases)
TESTED = ("0.5.23",)


def installed() -> str | None:
    """The installed SGLang version, or None when it is not installed."""
    return engine_versions.installed("sglang")


def refusal(version: str | None) -> str | None:
    """Why moe-sglang will not hook this version (None: it will)."""
    return engine_versions.refusal(
        "moe-sglang", "sglang", version, TESTED, "hooks SGLang internals", "--moe-runner-backend moe is not offered"
    )
