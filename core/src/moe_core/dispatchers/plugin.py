"""Entry point of core's own dispatchers (group ``moe.a2a``).

Core registers them through the same door as every dispatcher plugin, so the machinery that finds
third-party dispatchers is exercised by core itself.
"""

from __future__ import annotations

from moe_core.hookspecs import API_VERSION, hookimpl


@hookimpl
def moe_api_version() -> int:
    return API_VERSION


@hookimpl
def moe_dispatchers() -> list:
    from moe_core.dispatchers.all_to_all import AllToAllDispatcher
    from moe_core.dispatchers.replicate import ReplicateDispatcher

    return [ReplicateDispatcher, AllToAllDispatcher]
