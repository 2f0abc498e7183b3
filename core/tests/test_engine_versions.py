"""The version guard shared by the engine integrations (moe-sglang, moe-vllm)."""

from __future__ import annotations

import importlib.metadata

from moe_core.integrations import engine_versions

CORE = importlib.metadata.version("moe-core")


def test_a_tested_release_is_served():
    assert engine_versions.refusal("moe-core", "engine", "1.2.3", ("1.2.3",), "hooks X", "nothing changes") is None


def test_another_release_or_none_is_refused_in_one_sentence():
    message = engine_versions.refusal("moe-core", "engine", "1.2.4", ("1.2.3",), "hooks X", "X runs as before")
    assert message.startswith(f"moe-core {CORE} hooks X and was tested against engine 1.2.3 only; engine 1.2.4 is ")
    assert "registers nothing and X runs as before. Install a tested engine" in message
    missing = engine_versions.refusal("moe-nowhere", "engine", None, ("1",), "hooks X", "X runs")
    assert missing.startswith("moe-nowhere hooks X") and "engine is not installed" in missing


def test_installed_reads_metadata():
    assert engine_versions.installed("moe-core") == CORE
    assert engine_versions.installed("no-such-distribution-here") is None
