"""The ``moe`` command: output shapes, statuses and exit codes."""

from __future__ import annotations

import json

import pytest

from moe_core.cli import main
from moe_core.known_backends import FIRST_PARTY


def run_cli(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_backends_json_without_check(site, capsys):
    site.add("moe-one", "one")
    code, out, _ = run_cli(capsys, "backends", "--json")
    rows = {r["name"]: r for r in json.loads(out)}
    assert code == 0
    assert rows["one"]["status"] == "discovered" and rows["one"]["distribution"] == "moe-one"
    assert rows["one"]["version"] == "1.0"


def test_backends_check_statuses(site, capsys, monkeypatch):
    site.add("moe-one", "one")
    site.add("moe-gpu", "gpu", device_types=("cuda",))
    site.add("moe-broken", "broken", source="raise ValueError('bad plugin')\n")
    site.add("moe-old", "old", api_version=0)
    site.add("moe-off", "off")
    monkeypatch.setenv("MOE_DISABLE_PLUGINS", "moe-off")
    code, out, _ = run_cli(capsys, "backends", "--check", "--json")
    status = {r["name"]: (r["status"], r["reason"]) for r in json.loads(out)}
    assert code == 0
    assert status["one"][0] == "available" and status["torch"][0] == "available"
    assert status["gpu"][0] == "unavailable" and "CUDA" in status["gpu"][1]
    assert status["broken"][0] == "error" and "bad plugin" in status["broken"][1]
    assert status["old"][0] == "incompatible"
    assert status["off"][0] == "disabled" and "MOE_DISABLE_PLUGINS" in status["off"][1]
    # strict mode: same listing, non-zero exit
    monkeypatch.setenv("MOE_STRICT_PLUGINS", "1")
    code, out, err = run_cli(capsys, "backends", "--check", "--json")
    assert code == 1 and "moe-broken:broken" in err and json.loads(out)


def test_backends_table(site, capsys, monkeypatch):
    code, out, _ = run_cli(capsys, "backends")
    assert code == 0 and "torch" in out and "moe-core" in out


def test_run_json_verify(capsys):
    code, out, _ = run_cli(capsys, "run", "--json", "--verify", "--tokens", "8", "--repeat", "1", "--backend", "torch")
    report = json.loads(out)
    assert code == 0 and report["backend"] == "torch" and report["verified"] is True
    assert report["rel_l2_error"] <= report["tolerance"] and report["tokens"] == 8


def test_run_explicit_sizes(capsys):
    _, out, _ = run_cli(
        capsys,
        "run",
        "--json",
        "--experts",
        "4",
        "--top-k",
        "1",
        "--hidden",
        "16",
        "--intermediate",
        "8",
        "--dtype",
        "fp32",
        "--activation",
        "gelu",
        "--repeat",
        "1",
    )
    report = json.loads(out)
    assert (report["experts"], report["top_k"], report["hidden"], report["intermediate"]) == (4, 1, 16, 8)
    assert report["activation"] == "gelu"


def test_run_missing_backend_is_a_clean_error(capsys, monkeypatch):
    # a first-party name that is surely not installed, whatever environment runs the tests
    monkeypatch.setitem(FIRST_PARTY, "fancy_kernels", "moe-fancy-kernels")
    code, _, err = run_cli(capsys, "run", "--backend", "fancy_kernels", "--repeat", "1")
    assert code == 2 and "pip install moe-fancy-kernels" in err


def test_run_bad_sizes_are_a_clean_error(capsys):
    code, _, err = run_cli(capsys, "run", "--experts", "2", "--top-k", "3")
    assert code == 2 and "top_k=3 is larger than num_experts=2" in err


def test_help_lists_commands(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert "backends" in out and "run" in out and "MOE_PLUGINS" in out


def test_check_torch_json(capsys):
    code, out, _ = run_cli(capsys, "check", "torch", "--json", "-k", "reference[bf16")
    report = json.loads(out)
    assert code == 0 and report["backend"] == "torch"
    assert report["passed"] == 3 and report["failed"] == 0 and report["skipped"] == 0
    assert {c["id"] for c in report["cases"]} == {"bf16-bf16-silu", "bf16-bf16-gelu", "bf16-bf16-swiglu_oai"}


def test_check_reports_failures_with_exit_code(site, capsys):
    from test_conformance_catches_bugs import BUGGY

    site.add("moe-swapped", "swapped", body=BUGGY["swapped"])
    code, out, _ = run_cli(capsys, "check", "swapped", "--json", "-k", "reference[fp32")
    report = json.loads(out)
    assert code == 1 and report["failed"] == 3


def test_check_missing_backend_is_an_error(capsys, monkeypatch):
    monkeypatch.setitem(FIRST_PARTY, "fancy_kernels", "moe-fancy-kernels")
    code, _, err = run_cli(capsys, "check", "fancy_kernels")
    assert code == 2 and "pip install moe-fancy-kernels" in err


@pytest.mark.parametrize("command", ["run", "bench", "tune"])
def test_tokens_is_the_same_option_everywhere(capsys, command):
    with pytest.raises(SystemExit) as info:
        main([command, *(["torch"] if command == "tune" else []), "--tokens", "1,x"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and "--tokens" in err and "comma-separated integers" in err


def test_run_takes_one_token_count(capsys):
    code, _, err = run_cli(capsys, "run", "--tokens", "1,8")
    assert code == 2 and "one token count" in err


def test_preset_config_carries_the_whole_shape():
    import torch

    from moe_core.presets import PRESETS

    cfg = PRESETS["gpt-oss-120b"].config("mxfp4", torch.bfloat16)
    assert (cfg.num_experts, cfg.top_k, cfg.hidden_size, cfg.intermediate_size) == (128, 4, 2880, 2880)
    assert cfg.activation == "swiglu_oai" and cfg.has_bias and cfg.quant_scheme == "mxfp4"
    assert cfg.dtype == torch.bfloat16


def test_plugin_options_match_their_environment_variables(site, capsys, monkeypatch):
    site.add("moe-one", "one")
    site.add("moe-broken", "broken", source="raise RuntimeError('broken on purpose')\n")

    def statuses(*options):
        code, out, _ = run_cli(capsys, *options, "backends", "--check", "--json")
        return code, {r["name"]: r["status"] for r in json.loads(out)}

    code, rows = statuses("--disable-plugins", "one")
    assert code == 0 and rows["one"] == "disabled" and rows["broken"] == "error"
    code, rows = statuses("--plugins", "one")
    assert rows["one"] == "available" and rows["broken"] == "disabled" and rows["torch"] == "available"
    code, rows = statuses("--strict-plugins")
    assert code == 1
    assert "MOE_STRICT_PLUGINS" not in __import__("os").environ  # the option held for that command only
