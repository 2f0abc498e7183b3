"""Tuned tables: the user's table of a device first, per shape key and token count, then the shipped one; a
bad user table is ignored with a warning; tuning writes into the user directory and the next lookup sees it."""

from __future__ import annotations

import json
import warnings
from dataclasses import asdict

import pytest

from moe_triton import kernel_configs
from moe_triton.kernel_configs import GemmConfig, KernelConfig

SHIPPED = "NVIDIA_H200"
MINE = KernelConfig(16, GemmConfig(16, 32, 1, 2, 2), GemmConfig(16, 32, 1, 2, 2), 1, 1)


@pytest.fixture
def table_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("MOE_TRITON_TABLE_DIR", str(tmp_path / "tables"))
    kernel_configs.clear_cache()
    return tmp_path / "tables"


def _write(path, entries: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"entries": entries}))


def test_user_table_location_follows_the_variables(tmp_path, monkeypatch):
    monkeypatch.setenv("MOE_CACHE_DIR", str(tmp_path / "cache"))
    assert kernel_configs.user_table_path("cpu") == tmp_path / "cache" / "triton" / "cpu.json"
    monkeypatch.setenv("MOE_TRITON_TABLE_DIR", str(tmp_path / "mine"))
    assert kernel_configs.user_table_path("cpu") == tmp_path / "mine" / "cpu.json"


def test_a_user_entry_replaces_the_shipped_configs_of_its_key_and_token_counts_only(table_dir):
    shipped = kernel_configs.shipped_table(SHIPPED)
    mine_key, other_key = sorted(shipped)[:2]
    new_key = kernel_configs.table_key("fp32", 8, 64, 32, 2)
    replaced = min(shipped[mine_key])
    _write(table_dir / f"{SHIPPED}.json", {mine_key: {"3": MINE.as_dict(), str(replaced): MINE.as_dict()},
                                           new_key: {"1": MINE.as_dict()}})  # fmt: skip
    # the shipped token counts of the key stay, except the one the user's table has too
    assert kernel_configs.tuned_entry(SHIPPED, mine_key) == {**shipped[mine_key], 3: MINE, replaced: MINE}
    assert shipped[mine_key][replaced] != MINE
    assert kernel_configs.tuned_entry(SHIPPED, other_key) == shipped[other_key]
    assert kernel_configs.tuned_entry(SHIPPED, new_key) == {1: MINE}
    assert set(kernel_configs.tables(SHIPPED)) == {*shipped, new_key}


@pytest.mark.parametrize(
    "text",
    ["{not json", json.dumps([1, 2]), json.dumps({"entries": {"k": {"1": {"block_m": 16}}}}),
     json.dumps({"entries": {"k": {"one": MINE.as_dict()}}}),
     json.dumps({"entries": {"k": {"1": {**MINE.as_dict(), "gemm1": {**asdict(MINE.gemm1), "whole_chunk": "yes"}}}}})],
)  # fmt: skip
def test_a_corrupt_user_table_warns_once_naming_it_and_the_shipped_table_applies(table_dir, text):
    path = table_dir / f"{SHIPPED}.json"
    path.parent.mkdir(parents=True)
    path.write_text(text)
    shipped = kernel_configs.shipped_table(SHIPPED)
    key = sorted(shipped)[0]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert kernel_configs.tuned_entry(SHIPPED, key) == shipped[key]
        assert kernel_configs.tuned_entry(SHIPPED, key) == shipped[key]
    assert len(caught) == 1 and str(path) in str(caught[0].message)
    assert issubclass(caught[0].category, RuntimeWarning)


def test_a_user_table_that_is_a_directory_is_ignored_with_a_warning(table_dir):
    (table_dir / f"{SHIPPED}.json").mkdir(parents=True)
    with pytest.warns(RuntimeWarning, match="cannot read"):
        assert kernel_configs.tables(SHIPPED) == kernel_configs.shipped_table(SHIPPED)


def _tune_shape_choosing_mine(config, weights, tokens, device, log, on_result, compiler=None):
    """``tune.tune_shape`` with the measuring replaced: ``MINE`` at every token count, saved as it goes."""
    for m in tokens:
        on_result(m, MINE)
    return dict.fromkeys(tokens, MINE)


def test_tuning_writes_into_the_user_directory_and_the_next_forward_sees_it(tmp_path, monkeypatch):
    """``tune_presets`` with the measuring replaced by a fixed result: the default output is the user's
    table under ``MOE_CACHE_DIR``, merged with what is there, and a config selected before the write is
    not served from the cache afterwards."""
    pytest.importorskip("triton")
    from moe_triton import tune

    monkeypatch.setenv("MOE_CACHE_DIR", str(tmp_path))
    kernel_configs.clear_cache()
    key = kernel_configs.table_key("fp32", 8, 128, 256, 2)  # the "tiny" preset
    before = kernel_configs.select_config("fp32", 8, 128, 256, 2, 1, "cpu")
    assert before == kernel_configs.heuristic_config("fp32", 8, 128, 256, 2, 1)
    kept = kernel_configs.table_key("fp32", 4, 64, 64, 1)
    _write(tmp_path / "triton" / "cpu.json", {kept: {"8": MINE.as_dict()}})

    monkeypatch.setattr(tune, "tune_shape", _tune_shape_choosing_mine)
    lines = []
    path = tune.tune_presets(["tiny"], "fp32", [1, 64], None, device="cpu", log=lines.append)
    assert path == tmp_path / "triton" / "cpu.json" == kernel_configs.user_table_path("cpu")
    assert any(str(path) in line for line in lines)
    table = json.loads(path.read_text())
    assert table["entries"][key] == {"1": MINE.as_dict(), "64": MINE.as_dict()}
    assert kernel_configs.tuned_entry("cpu", kept) == {8: MINE}  # merged, not replaced
    assert kernel_configs.select_config("fp32", 8, 128, 256, 2, 1, "cpu") == MINE
    assert not list(path.parent.glob(".*tmp"))

    output = tmp_path / "elsewhere" / "table.json"
    assert tune.tune_presets(["tiny"], "fp32", [8], output, device="cpu", log=lines.append) == output
    assert list(json.loads(output.read_text())["entries"][key]) == ["8"]


def test_tuning_checks_the_boundaries_of_the_entries_a_forward_would_choose_from(tmp_path, monkeypatch):
    """After a preset's token counts, ``tune_presets`` hands ``boundary_entries`` the entries a forward would
    choose from — the shipped table's, with the token counts just written replacing its own — and the counts
    it tuned, and merges what comes back into the table it writes."""
    pytest.importorskip("triton")
    from dataclasses import replace

    from moe_triton import tune

    key = kernel_configs.table_key("fp32", 8, 128, 256, 2)  # the "tiny" preset
    shipped_cfg, added_cfg = replace(MINE, block_m=32), replace(MINE, block_m=64)
    monkeypatch.setattr(kernel_configs, "shipped_table", lambda slug: {key: {1: shipped_cfg, 512: shipped_cfg}})

    monkeypatch.setattr(tune, "tune_shape", _tune_shape_choosing_mine)
    seen = []

    def boundaries(config, weights, entry, tuned, device, bench=None, log=print):
        seen.append((entry, set(tuned)))
        return {16: added_cfg}

    monkeypatch.setattr(tune, "boundary_entries", boundaries)
    lines = []
    output = tmp_path / "table.json"
    tune.tune_presets(["tiny"], "fp32", [1, 64], output, device="cpu", log=lines.append)
    assert seen == [({1: MINE, 64: MINE, 512: shipped_cfg}, {1, 64})]
    written = kernel_configs.parse_table(output.read_text())[key]
    assert written == {1: MINE, 16: added_cfg, 64: MINE}
    assert any("entries added at M = 16" in line for line in lines)


def test_writing_over_a_corrupt_table_warns_and_replaces_it(tmp_path):
    pytest.importorskip("triton")
    from moe_triton.tune import write_table

    path = tmp_path / "cpu.json"
    path.write_text("{broken")
    key = kernel_configs.table_key("fp32", 8, 64, 32, 2)
    with pytest.warns(RuntimeWarning, match="unreadable"):
        write_table(path, "cpu", {key: {1: MINE}})
    assert json.loads(path.read_text())["entries"] == {key: {"1": MINE.as_dict()}}
