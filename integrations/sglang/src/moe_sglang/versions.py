"""The SGLang releases this bridge's hooks were written and tested against.

The hooks wrap private methods of SGLang's quantization methods (README: "What it hooks"); their signatures and
the weight layouts they leave behind change between releases without notice. So any release not listed here is
refused with a sentence at plugin load, instead of patching code whose shape is unknown. Read from package
metadata, never by importing SGLang.
"""

from __future__ import annotations

import importlib.metadata as metadata

#: SGLang versions the hooks were tested against (exact releases)
TESTED = ("0.5.23",)


def installed() -> str | None:
    """The installed SGLang version, or None when SGLang is not installed."""
    try:
        return metadata.version("sglang")
    except metadata.PackageNotFoundError:
        return None


def refusal(version: str | None) -> str | None:
    """Why moe-sglang will not hook this SGLang ``version`` (None: it will)."""
    if version in TESTED:
        return None
    found = "is not installed" if version is None else f"{version} is installed"
    return (
        f"moe-sglang {__import__('moe_sglang').__version__} hooks SGLang internals and was tested against "
        f"sglang {', '.join(TESTED)} only; sglang {found}, so it registers nothing and "
        "--moe-runner-backend moe is not offered. Install a tested SGLang or a moe-sglang release made for yours."
    )
