"""The version guard every engine integration applies before touching the engine's internals.

An integration (moe-sglang, moe-vllm) reaches into an engine's private classes, whose shapes change between
releases without notice, so it serves only the exact releases it was tested against and, for any other, says
so in one sentence and leaves the engine alone. The sentence and the metadata lookup are the same for every
engine: they live here, and each integration keeps its own list of releases and what happens instead. Reads
package metadata only; imports no engine.
"""

from __future__ import annotations

import importlib.metadata as metadata


def installed(distribution: str) -> str | None:
    """The installed version of ``distribution``, or None when it is not installed."""
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def refusal(
    bridge: str, engine: str, version: str | None, tested: tuple[str, ...], touches: str, instead: str
) -> str | None:
    """Why ``bridge`` will not serve ``engine`` at ``version`` (None: ``version`` is one of ``tested``).

    ``touches``: what the bridge does to the engine ("hooks SGLang internals"); ``instead``: what happens in
    its place ("every MoE layer stays on vLLM's own path")."""
    if version in tested:
        return None
    found = "is not installed" if version is None else f"{version} is installed"
    own = installed(bridge)
    return (
        f"{bridge}{f' {own}' if own else ''} {touches} and was tested against {engine} {', '.join(tested)} "
        f"only; {engine} {found}, so it registers nothing and {instead}. Install a tested {engine} or a "
        f"{bridge} release made for yours."
    )
