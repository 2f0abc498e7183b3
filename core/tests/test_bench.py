"""``moe bench``: the JSON document, the table, spread, versions, cold weights, threads, the plot."""

from __future__ import annotations

import importlib.metadata as md
import json

import pytest
import torch

from moe_core.bench_rows import BenchRow
from moe_core.cli import main
from moe_core.cli.bench import plot_series

#: a stand-in backend doing the torch reference's whole forward three times: clearly slower, same result
TRIPLE = """
def apply(self, hidden_states, topk_ids, topk_weights, prepared, out=None):
    for _ in range(3):
        result = super().apply(hidden_states, topk_ids, topk_weights, prepared, out)
    return result
"""


def run_cli(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_bench_json_and_output_file(capsys, tmp_path):
    path = tmp_path / "bench.json"
    code, out, _ = run_cli(
        capsys, "bench", "--preset", "tiny", "--tokens", "1,4", "--repeat", "3", "--json", "--output", str(path)
    )
    doc = json.loads(out)
    assert code == 0 and json.loads(path.read_text()) == doc
    assert [(r["preset"], r["tokens"], r["backend"]) for r in doc["rows"]] == [
        ("tiny", 1, "torch"),
        ("tiny", 4, "torch"),
    ]
    row = doc["rows"][1]
    # 4 tokens x top-2 over 8 experts: bytes = experts hit x one expert's bytes + input/output
    expert = (2 * 256 * 128 + 128 * 256) * 2
    assert row["bytes_moved"] == row["experts_hit"] * expert + 2 * 4 * 128 * 2
    assert row["reuse_bytes"] == row["experts_hit"] * expert
    assert row["flops"] == 2 * 4 * 2 * 3 * 128 * 256
    assert doc["device"] == "cpu" and doc["torch"] == torch.__version__ and "triton" in doc
    # the spread, next to the median
    assert row["samples"] == 3 and 0 < row["min_us"] <= row["time_us"] <= row["p90_us"]
    assert row["timing"] == "cpu" and row["weights"] == "hot" and row["weight_copies"] == 1
    assert row["vs_fastest"] == 1.0 and row["within_noise"] is True and doc["rank_by"] == "min_us"
    # no ceilings and no roofline on a CPU, and the document says why
    assert doc["copy_bandwidth_gb_s"] is None and doc["matmul_tflops"] is None and "CPU" in doc["roofline"]
    assert row["floor_us"] is None and row["roofline_fraction"] is None
    # which distribution ran each backend, and its version
    assert row["distribution"] == "moe-core"
    assert doc["backends"] == {
        "torch": {"name": "torch", "distribution": "moe-core", "version": md.version("moe-core")}
    }
    assert doc["threads"] == torch.get_num_threads() and doc["cache_bytes"] == 64 << 20
    assert doc["options"]["repeat"] == 3 and doc["options"]["cold"] is False


def test_bench_table_on_a_cpu_has_spread_and_no_roofline(capsys):
    code, out, _ = run_cli(capsys, "bench", "--preset", "tiny", "--tokens", "2", "--repeat", "2")
    assert code == 0
    assert "no roofline on a CPU" in out and "TFLOP/s" not in out
    header = next(line for line in out.splitlines() if "preset" in line)
    for column in ("median µs", "min µs", "p90 µs", "vs fastest", "weights", "GB/s"):
        assert column in header
    assert "roofline" not in header
    assert "fastest" in out and "hot" in out


def test_plugin_versions_and_a_stable_ranking(site, capsys):
    site.add("moe-triple", "triple", version="2.5", body=TRIPLE)
    argv = ("bench", "--preset", "tiny", "--tokens", "16", "--repeat", "10", "--json")
    ranks = []
    for _ in range(2):
        code, out, _ = run_cli(capsys, *argv, "--backend", "triple", "--backend", "torch")
        doc = json.loads(out)
        assert code == 0
        assert doc["backends"]["triple"] == {"name": "triple", "distribution": "moe-triple", "version": "2.5"}
        assert doc["backends"]["torch"]["distribution"] == "moe-core"
        rows = {r["backend"]: r for r in doc["rows"]}
        assert rows["triple"]["distribution"] == "moe-triple"
        ranks.append(sorted(rows, key=lambda b: rows[b]["vs_fastest"]))
        assert rows["torch"]["vs_fastest"] == 1.0 and rows["triple"]["vs_fastest"] > 1.5
    assert ranks == [["torch", "triple"], ["torch", "triple"]]


def test_bench_cold_on_a_cpu(capsys):
    code, out, err = run_cli(
        capsys, "bench", "--preset", "tiny", "--tokens", "1", "--repeat", "2", "--cold", "--max-copies", "4", "--json"
    )
    doc = json.loads(out)
    (row,) = doc["rows"]
    assert code == 0 and doc["options"]["cold"] is True and doc["options"]["max_copies"] == 4
    # 2 experts x 196 kB a call: 64 MiB x 2 would need hundreds of copies; --max-copies keeps 4 and says so
    assert row["weights"] == "cold" and row["weight_copies"] == 4 and "max_copies=4" in row["note"]
    assert row["reuse_bytes"] == 4 * row["experts_hit"] * (2 * 256 * 128 + 128 * 256) * 2
    assert "max_copies=4" in err


def test_bench_threads_are_set_for_the_run_and_restored(capsys):
    before = torch.get_num_threads()
    code, out, _ = run_cli(capsys, "bench", "--preset", "tiny", "--tokens", "1", "--repeat", "1", "--threads", "1",
                           "--json")  # fmt: skip
    assert code == 0 and json.loads(out)["threads"] == 1 and torch.get_num_threads() == before


@pytest.mark.parametrize("option", [("--repeat", "0"), ("--threads", "0"), ("--max-copies", "0"), ("--tokens", "0")])
def test_bench_rejects_nonsense(capsys, option):
    code, _, err = run_cli(capsys, "bench", "--preset", "tiny", *option)
    assert code == 2 and option[0] in err


def test_bench_help_names_the_new_options(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    out = capsys.readouterr().out
    for text in ("--cold", "--max-copies", "--threads", "min", "p90", "L2", "--plot"):
        assert text in out


def rows_for_plot():
    def row(backend, tokens, median, weights="hot", floor=None):
        r = BenchRow("small", backend, "bf16", tokens, median, "cpu", 1, 1, 1, 1.0, floor, None)
        r.min_us, r.p90_us, r.weights = median * 0.9, median * 1.2, weights
        return r

    return [row(b, m, m * k, w, floor=m / 10) for w in ("hot", "cold") for b, k in (("torch", 2), ("x", 1))
            for m in (1, 16, 64)]  # fmt: skip


def test_plot_series():
    (spec,) = plot_series(rows_for_plot()).values()
    assert spec["title"] == "small (bf16)" and spec["tokens"] == [1, 16, 64]
    labels = [line["label"] for line in spec["lines"]]
    assert labels == ["torch (hot weights)", "x (hot weights)", "torch (cold weights)", "x (cold weights)"]
    torch_hot = spec["lines"][0]
    assert torch_hot["median"] == [2, 32, 128] and torch_hot["min"] == [1.8, 28.8, 115.2] and not torch_hot["cold"]
    assert spec["lines"][2]["cold"] and spec["roofline"] == [(1, 0.1), (16, 1.6), (64, 6.4)]


def test_plot_axes(tmp_path):
    pytest.importorskip("matplotlib", reason="--plot is the optional extra moe-core[plot]")
    import matplotlib

    matplotlib.use("Agg")
    from moe_core.cli.bench import _plot, plot

    document = {"device": "H200", "torch": "2.11", "date": "2026-12-02"}
    (ax,) = plot(rows_for_plot(), document).axes
    assert ax.get_xscale() == "log" and ax.xaxis.get_transform().base == 2 and ax.get_yscale() == "log"
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "16", "64"]
    assert "small" in ax.get_title() and "H200" in ax.get_title() and "µs" in ax.get_ylabel()
    assert len(ax.get_legend().get_texts()) == 5  # four lines and the roofline
    _plot(rows_for_plot(), tmp_path / "b.png", document)
    assert (tmp_path / "b.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_over_ranks_times_each_dispatcher_against_the_single_process_layer(tmp_path):
    """``moe bench --ep 2``: two spawned gloo ranks, both core dispatchers in one world; structure and sanity of
    the numbers, never their ratios."""
    import math
    import subprocess
    import sys

    path = tmp_path / "ranks.json"
    proc = subprocess.run(
        [sys.executable, "-m", "moe_core.cli", "bench", "--preset", "tiny", "--tokens", "1,5", "--repeat", "3",
         "--dtype", "fp32", "--ep", "2", "--a2a", "replicate", "--a2a", "all_to_all", "--device", "cpu", "--json",
         "--output", str(path)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert json.loads(path.read_text()) == doc
    assert (doc["tp"], doc["ep"], doc["ranks"], doc["device"]) == (1, 2, 2, "cpu")
    assert doc["options"]["dispatchers"] == ["replicate", "all_to_all"] and doc["options"]["repeat"] == 3
    assert [(r["dispatcher"], r["tokens"]) for r in doc["rows"]] == [
        ("replicate", 1), ("replicate", 5), ("all_to_all", 1), ("all_to_all", 5)
    ]  # fmt: skip
    for r in doc["rows"]:
        times = [r["time_us"], r["min_us"], r["single_us"], r["vs_single"], *r["rank_time_us"]]
        assert all(math.isfinite(t) and t > 0 for t in times), r
        assert len(r["rank_time_us"]) == 2 and r["time_us"] == max(r["rank_time_us"]) and r["min_us"] <= r["time_us"]
        assert r["samples"] == 3 and r["calls_per_sample"] >= 1 and r["backend"] == "torch"
        assert r["rel_l2_error"] < 1e-5 and r["dispatch_format"] == "token_major_local_ids"
        # which rows each rank brought: the whole batch (replicate) or its share (all_to_all)
        shares = [r["tokens"]] * 2 if r["dispatcher"] == "replicate" else [(r["tokens"] + 1) // 2, r["tokens"] // 2]
        assert r["rank_tokens"] == shares
        # where the time went, and what the collectives moved (core's dispatchers say their bytes)
        assert set(r["phase_us"]) == {"dispatch", "experts", "combine"} and all(v > 0 for v in r["phase_us"].values())
        assert 0 < r["comm_share"] < 1 and len(r["wire_bytes"]) == 2
        assert r["wire_gbps"] > 0 and r["of_link_peak"] > 0
    h = 128  # the tiny preset: replicate all-reduces every token's float32 row, 2 (n - 1) / n of it per rank
    assert [r["wire_bytes"] for r in doc["rows"][:2]] == [[m * h * 4] * 2 for m in (1, 5)]
    assert all(b > 0 for b in doc["rows"][3]["wire_bytes"])  # all_to_all, 5 tokens: both ranks send pairs
    assert doc["link"]["buffer_bytes"] == 8 * 2**20
    assert doc["link"]["all_reduce_bus_gbps"] > 0 and doc["link"]["all_to_all_gbps"] > 0
    # the single-process layer is timed once per token count and shared by the dispatchers' rows
    assert doc["rows"][0]["single_us"] == doc["rows"][2]["single_us"]


def test_bench_over_ranks_refuses_what_times_one_process(capsys):
    code = main(["bench", "--preset", "tiny", "--ep", "2", "--cold", "--device", "cpu"])
    assert code == 2 and "--cold and --plot time one process" in capsys.readouterr().err
