"""Discovery, support reasons, alignment and configs of the triton plugin."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from moe_core import MoeConfig, MoeProblem
from moe_core.selection import resolve_backend

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # the interpreter on the CPU (conftest)


def _python(code: str, **env) -> str:
    full = {**os.environ, **env}
    for k, v in env.items():
        if v is None:
            full.pop(k)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_discovery_and_plugin_import_do_not_import_triton():
    out = _python(
        "import io, json, sys, contextlib\n"
        "from moe_core.cli import main\n"
        "buf = io.StringIO()\n"
        "with contextlib.redirect_stdout(buf):\n"
        "    main(['backends', '--json'])\n"
        "import moe_triton.plugin, moe_triton.fused_op\n"
        "rows = {r['name']: r for r in json.loads(buf.getvalue())}\n"
        "print(json.dumps([rows['triton']['distribution'], 'triton' in sys.modules]))\n"
    )
    assert json.loads(out) == ["moe-triton", False]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only reasons")
def test_cpu_reasons():
    out = _python(
        "import json\n"
        "from moe_core.plugins import default_registry\n"
        "print(json.dumps({r.name: [r.status, r.reason] for r in default_registry().describe(check=True)}))\n",
        TRITON_INTERPRET=None,
    )
    status, reason = json.loads(out)["triton"]
    assert status == "unavailable" and "TRITON_INTERPRET=1" in reason
    op = resolve_backend("triton").fused_ops[0]
    bf16 = MoeConfig(8, 2, 64, 64, quant_scheme="bf16", dtype=torch.bfloat16)
    assert "numpy has no bfloat16" in op.check(MoeProblem(bf16, "cpu")).reason
    fp8 = MoeConfig(8, 2, 128, 128, quant_scheme="fp8_block", dtype=torch.float16)
    assert "fp8 tl.dot is inexact" in op.check(MoeProblem(fp8, "cpu")).reason
    nv = MoeConfig(8, 2, 64, 64, quant_scheme="nvfp4", dtype=torch.float16)
    assert "'nvfp4' not supported" in op.check(MoeProblem(nv, "cpu")).reason


@pytest.mark.parametrize(
    "num_experts,top_k,m,block_m",
    [
        (8, 2, 1, 16), (8, 2, 37, 16), (16, 4, 100, 32), (5, 1, 9, 64), (16, 4, 600, 64),
        # decode widths of the loops (16/32-wide steps against 256 expert bins), several 64-wide steps (E=300)
        (128, 8, 1, 16), (128, 8, 3, 16), (300, 8, 40, 16),
    ],
)  # fmt: skip
def test_align_places_every_pair_once_in_its_padded_segment(num_experts, top_k, m, block_m):
    from moe_triton.kernels.align import align, max_blocks

    gen = torch.Generator().manual_seed(m)
    ids = torch.randint(0, num_experts, (m, top_k), generator=gen, dtype=torch.int32)
    ids[0, :] = 0  # at least one expert with several pairs, some experts empty
    sorted_ids, block_expert, offsets = (t.cpu() for t in align(ids.to(DEVICE), num_experts, block_m))
    flat = ids.reshape(-1).tolist()
    counts = [flat.count(e) for e in range(num_experts)]
    padded = [-(-c // block_m) * block_m for c in counts]
    starts = [sum(padded[:e]) for e in range(num_experts)]
    total = sum(padded)
    assert offsets.tolist() == [*starts, total, total]  # the null segment (ids outside [0, E)) is empty
    assert block_expert.numel() == max_blocks(m * top_k, num_experts, block_m) >= total // block_m
    for e in range(num_experts):
        seg = sorted_ids[starts[e] : starts[e] + padded[e]].tolist()
        real = sorted(p for p in seg if p < m * top_k)
        assert real == sorted(i for i, x in enumerate(flat) if x == e)
        assert seg.count(m * top_k) == padded[e] - counts[e]
        for b in range(starts[e] // block_m, (starts[e] + padded[e]) // block_m):
            assert block_expert[b].item() == e
    assert all(x == m * top_k for x in sorted_ids[total:].tolist())
    assert all(x == num_experts + 1 for x in block_expert[total // block_m :].tolist())


def _align_ab():
    import importlib.util

    path = Path(__file__).parents[1] / "tools" / "align_ab.py"
    spec = importlib.util.spec_from_file_location("align_ab", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_align_ab_compares_two_versions_and_fails_on_a_different_alignment(tmp_path):
    """``tools/align_ab.py``: the tree against itself agrees; against a version that gives one pair another
    expert's segment it reports ``same: false`` and exits 1 (two-launch sizes: 800 pairs)."""
    tool = _align_ab()
    src = Path(tool.__file__).parents[1] / "src" / "moe_triton" / "kernels" / "align.py"
    args = ["--device", DEVICE, "--cases", "16:4:200:16", "--repeat", "1"]
    out = tmp_path / "same.json"
    assert tool.main([*args, "--against", str(src), "--json", str(out)]) == 0
    (row,) = json.loads(out.read_text())["rows"]
    assert row["same"] is True and row["tree_us"] > 0 and row["against_us"] > 0
    wrong = tmp_path / "wrong.py"
    wrong.write_text(
        "from moe_triton.kernels.align import align as _align\n"
        "def align(ids, e, block_m):\n"
        "    ids = ids.clone(); ids[0, 0] = (ids[0, 0] + 1) % e\n"
        "    return _align(ids, e, block_m)\n"
    )
    assert tool.main([*args, "--against", str(wrong), "--json", str(out)]) == 1
    assert json.loads(out.read_text())["rows"][0]["same"] is False


def test_configs_ab_times_each_config_on_both_routings_and_fails_on_a_different_output(tmp_path, monkeypatch):
    """``tools/configs_ab.py``: every (routing, config) row is timed, balanced routing gives every expert the
    mean pairs, and a config whose forward writes another output is marked and makes the exit status 1 (here
    the forward is wrapped to perturb the file config's output)."""
    import importlib.util

    from moe_triton import kernel_configs as kc
    from moe_triton import launch

    spec = importlib.util.spec_from_file_location("configs_ab", Path(__file__).parents[1] / "tools" / "configs_ab.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    mine = kc.KernelConfig(16, kc.GemmConfig(32, 32, 1, 2, 2), kc.GemmConfig(32, 32, 1, 2, 2, persistent=1))
    table = tmp_path / "table.json"
    table.write_text(json.dumps({"entries": {kc.table_key("fp32", 8, 64, 32, 2): {"24": mine.as_dict()}}}))
    forward = launch.run_fused_moe

    def perturbed(*args, config=None, **kwargs):
        forward(*args, config=config, **kwargs)
        if config == mine:
            args[6].add_(1.0)  # out

    monkeypatch.setattr(launch, "run_fused_moe", perturbed)
    out = tmp_path / "ab.json"
    argv = ["--device", DEVICE, "--shape", "8,2,64,32", "--scheme", "fp32", "--dtype", "float32", "--tokens", "24",
            "--rounds", "1", "--repeat", "1", "--config", "heur=selected", "--config", f"mine=file:{table}",
            "--json", str(out)]  # fmt: skip
    assert tool.main(argv) == 1
    rows = json.loads(out.read_text())["rows"]
    assert [(r["routing"], r["config"]) for r in rows] == [(r, c) for r in tool.ROUTINGS for c in ("heur", "mine")]
    assert all(r["us"] > 0 and r["same"] is (r["config"] == "heur") for r in rows)
    assert all(r["pairs_per_expert"] == [6, 6] for r in rows if r["routing"] == "balanced")
    assert rows[1]["entry"] == mine.as_dict()


def test_configs_ab_changes_fields_of_a_source_and_reports_a_config_that_fails(tmp_path):
    """``tools/configs_ab.py``'s ``SOURCE@M`` (the entry tuned at M, whatever M is timed) and ``SOURCE+FIELD=VALUE``:
    the changes apply at once (a smaller block and the tail it needs, in either order); a misspelt field, a
    non-JSON value or an M the table lacks is named before anything runs (exit 2); a config that cannot launch
    becomes a row with its error while the others are timed (exit 1)."""
    import importlib.util

    from moe_triton import kernel_configs as kc

    spec = importlib.util.spec_from_file_location("configs_ab", Path(__file__).parents[1] / "tools" / "configs_ab.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    base = kc.KernelConfig(128, kc.GemmConfig(64, tail_m=64), kc.GemmConfig(128))
    small, large = kc.KernelConfig(16, kc.GemmConfig(16), kc.GemmConfig(16)), kc.KernelConfig(32)
    table = tmp_path / "table.json"
    per_m = {"16": small.as_dict(), "64": large.as_dict()}
    table.write_text(json.dumps({"entries": {kc.table_key("fp32", 8, 64, 32, 2): per_m}}))
    cfg = MoeConfig(8, 2, 64, 32, quant_scheme="fp32", dtype=torch.float32)
    assert tool.resolve(f"file:{table}", cfg, 24, DEVICE) == small  # the nearest M, as a forward picks
    assert tool.resolve(f"file:{table}@64", cfg, 24, DEVICE) == large  # the entry at exactly 64
    assert tool.resolve(f"file:{table}@64+block_m=64", cfg, 24, DEVICE) == replace(large, block_m=64)
    for order in (["gemm1.tail_m=16", "block_m=32"], ["block_m=32", "gemm1.tail_m=16"]):
        got = tool.changed(base, [*order, "gemm2.whole_chunk=true", "pdl=true"])
        assert (got.block_m, got.gemm1.tail_m, got.gemm1.block_n) == (32, 16, 64)
        assert got.gemm2.whole_chunk and got.pdl
    with pytest.raises(ValueError, match="tail_m=64 must be"):
        tool.changed(base, ["block_m=64"])
    common = ["--device", DEVICE, "--shape", "8,2,64,32", "--scheme", "fp32", "--dtype", "float32", "--tokens", "24",
              "--rounds", "1", "--repeat", "1", "--config", "heur=selected"]  # fmt: skip
    for bad in ("selected+gemm1.block_nn=32", "selected+gemm3.block_n=32", "selected+gemm1.swap_ab=yes", "file:t@99"):
        assert tool.main([*common, "--config", f"x={bad.replace('t@', f'{table}@')}"]) == 2
    out = tmp_path / "ab.json"
    argv = [*common, "--config", "narrow=selected+gemm1.block_n=16", "--config", "odd=selected+gemm1.block_n=48",
            "--json", str(out)]  # fmt: skip
    assert tool.main(argv) == 1
    rows = json.loads(out.read_text())["rows"]
    assert [(r["config"], "error" in r) for r in rows[:3]] == [("heur", False), ("narrow", False), ("odd", True)]
    assert rows[1]["entry"]["gemm1"]["block_n"] == 16 and rows[1]["same"] and rows[1]["us"] > 0
    assert rows[2]["error"] and rows[2]["same"] is False


def test_heuristic_and_tuned_configs(tmp_path, monkeypatch):
    from moe_triton import kernel_configs

    fp8 = kernel_configs.heuristic_config("fp8_block", 256, 7168, 256, 8, 1)
    assert fp8.gemm1.block_k == 128 and fp8.gemm2.block_k == 128
    assert kernel_configs.heuristic_config("mxfp4", 128, 2880, 2880, 4, 4096).gemm1.block_k % 32 == 0
    assert kernel_configs.heuristic_config("bf16", 8, 4096, 14336, 2, 1).block_m == 16
    assert kernel_configs.heuristic_config("bf16", 8, 4096, 14336, 2, 4096).block_m == 128
    key = kernel_configs.table_key("bf16", 8, 64, 32, 2)
    small = kernel_configs.KernelConfig(
        16, kernel_configs.GemmConfig(32, 32, 1, 2, 2), kernel_configs.GemmConfig(64, 32, 1, 4, 2)
    )
    large = kernel_configs.KernelConfig(
        64, kernel_configs.GemmConfig(128, 64, 8, 8, 3), kernel_configs.GemmConfig(128, 64, 8, 8, 4)
    )
    monkeypatch.setenv("MOE_TRITON_TABLE_DIR", str(tmp_path))
    assert kernel_configs.user_table_path("cpu") == tmp_path / "cpu.json"
    (tmp_path / "cpu.json").write_text(json.dumps({"entries": {key: {"1": small.as_dict(), "512": large.as_dict()}}}))
    kernel_configs.clear_cache()
    assert kernel_configs.tuned_entry("cpu", key) == {1: small, 512: large}
    assert kernel_configs.select_config("bf16", 8, 64, 32, 2, 3, "cpu") == small
    assert kernel_configs.select_config("bf16", 8, 64, 32, 2, 400, "cpu") == large


def test_tune_table_merges_per_token_count(tmp_path, monkeypatch):
    """Tuning writes each finished M at once; a later run for other Ms keeps the earlier ones."""
    pytest.importorskip("triton")
    from moe_triton import kernel_configs
    from moe_triton.tune import write_table

    key = kernel_configs.table_key("mxfp4", 128, 2880, 2880, 4)
    a = kernel_configs.KernelConfig(
        16, kernel_configs.GemmConfig(32, 64, 1, 4, 4), kernel_configs.GemmConfig(64, 64, 1, 4, 4), 1
    )
    b = kernel_configs.KernelConfig(
        128, kernel_configs.GemmConfig(128, 128, 8, 8, 3), kernel_configs.GemmConfig(128, 64, 8, 8, 3), 1
    )
    c = kernel_configs.KernelConfig(
        16, kernel_configs.GemmConfig(64, 64, 1, 4, 4), kernel_configs.GemmConfig(64, 128, 1, 4, 4), 2
    )
    path = tmp_path / "cpu.json"
    write_table(path, "cpu", {key: {1: a}})
    write_table(path, "cpu", {key: {4096: b}})
    write_table(path, "cpu", {key: {1: c}})
    table = json.loads(path.read_text())
    assert table["device"] == "cpu" and list(table["entries"][key]) == ["1", "4096"]
    monkeypatch.setenv("MOE_TRITON_TABLE_DIR", str(tmp_path))
    kernel_configs.clear_cache()
    assert kernel_configs.tuned_entry("cpu", key) == {1: c, 4096: b}


def test_tune_candidates_swap_operands_below_a_wgmma_or_for_mxfp4():
    pytest.importorskip("triton")
    from moe_triton.tune import candidates

    for rows_per_expert in (1, 50, 200):
        for _, gemms in candidates("mxfp4", rows_per_expert):
            swapped = [g for g in gemms if g.swap_ab]
            assert swapped and all(g.block_n >= 64 and g.block_k % 64 == 0 for g in swapped)
            assert len(set(gemms)) == len(gemms)
        for scheme in ("bf16", "fp8_block"):
            for block_m, gemms in candidates(scheme, rows_per_expert):
                swapped = [g for g in gemms if g.swap_ab]
                assert bool(swapped) == (block_m < 64), (scheme, block_m)
                assert all(g.block_n >= 64 for g in swapped) and len(set(gemms)) == len(gemms)
    # with descriptors: every tile twice, loads plain and through descriptors; never for mxfp4
    for rows_per_expert in (1, 50, 200):
        for (bm, plain), (bm_t, both) in zip(candidates("bf16", rows_per_expert),
                                             candidates("bf16", rows_per_expert, tma=True), strict=True):  # fmt: skip
            assert bm == bm_t and not any(g.tma for g in plain)
            assert [g for g in both if not g.tma] == plain and [replace(g, tma=False) for g in both if g.tma] == plain
        assert not any(g.tma for _, gemms in candidates("mxfp4", rows_per_expert, tma=True) for g in gemms)
    # decode tiles only while experts see a few rows; from 4 on average 32-row blocks compete (routing skew)
    assert [bm for bm, _ in candidates("bf16", 2)] == [16]
    assert [bm for bm, _ in candidates("bf16", 16)] == [16, 32]
    # from half a 128-row block per expert the large tiles compete with the medium ones
    assert [bm for bm, _ in candidates("bf16", 40)] == [32, 64]
    assert [bm for bm, _ in candidates("bf16", 64)] == [32, 64, 128]
    assert [bm for bm, _ in candidates("bf16", 200)] == [64, 128]


def test_tuner_retimes_its_fastest_tiles_split_at_decode_and_as_persistent_walks_above(monkeypatch):
    """``tune._trials`` with the timing replaced by a fixed cost per (tile, split): at decode the
    ``SPLIT_TOP`` fastest tiles are re-timed at every split, and as walks only where the routing is
    aligned; with aligned routing the ``PERSISTENT_TOP`` fastest as persistent walks, unsplit, so ``_best``
    can pick one."""
    pytest.importorskip("triton")
    from moe_triton import tune
    from moe_triton.kernel_configs import GemmConfig

    tiles = [GemmConfig(bn, 64, 8, 4, 3, tma=t) for bn in (32, 64, 128, 256) for t in (False, True)]

    def cost(g, split):  # wider is faster; a walk at 2 per SM fastest of all; splits slower
        return 1000 / g.block_n - (5 if g.persistent == 2 else 0) + split

    monkeypatch.setattr(tune, "_bench", lambda fn: fn())
    make = lambda g, split: lambda: cost(g, split)
    warmed = []
    decode = tune._trials(make, tiles, True, warmed.extend)
    assert set(decode) == {1, *tune.SPLITS}
    assert all(len(t) == tune.SPLIT_TOP for s, t in decode.items() if s > 1)
    assert not any(g.persistent for t in decode.values() for g in t)

    both = tune._trials(make, tiles, True, warmed.extend, walks=True)
    assert set(both) == {1, *tune.SPLITS} and any(g.persistent for g in both[1])
    assert not any(g.persistent for s, t in both.items() if s > 1 for g in t)
    above = tune._trials(make, tiles, False, warmed.extend, walks=True)
    assert set(above) == {1}
    walks = [g for g in above[1] if g.persistent]
    top = sorted(tiles, key=lambda g: cost(g, 1))[: tune.PERSISTENT_TOP]
    assert {replace(g, persistent=0) for g in walks} == set(top)
    assert {g.persistent for g in walks} == set(tune.PERSISTENT)
    assert len(walks) == len(top) * len(tune.PERSISTENT)
    assert (walks[0], 1) in warmed  # compiled ahead of timing like every candidate
    _, split, best = tune._best(above)
    assert split == 1 and best.persistent == 2 and best.block_n == 256 and best.tail_m == 0


def test_tuner_retimes_its_fastest_walks_with_few_row_tiles(monkeypatch):
    """With ``tails`` the ``TAIL_TOP`` fastest persistent walks are re-timed with each few-row tile
    (``GemmConfig.tail_m``), compiled ahead like every candidate, and one can win; without walks none is tried."""
    pytest.importorskip("triton")
    from moe_triton import tune
    from moe_triton.kernel_configs import GemmConfig

    tiles = [GemmConfig(bn, 64, 8, 4, 3) for bn in (64, 128, 256)]

    def cost(g, split):  # wider is faster, walks faster, a 32-row tail fastest of all
        return 1000 / g.block_n - (5 if g.persistent else 0) - (3 if g.tail_m == 32 else 0) + split

    monkeypatch.setattr(tune, "_bench", lambda fn: fn())
    make = lambda g, split: lambda: cost(g, split)
    warmed = []
    trials = tune._trials(make, tiles, False, warmed.extend, walks=True, tails=(32, 64))
    tailed = [g for g in trials[1] if g.tail_m]
    assert len(tailed) == tune.TAIL_TOP * 2 and all(g.persistent for g in tailed)
    assert {g.tail_m for g in tailed} == {32, 64}
    assert all((g, 1) in warmed for g in tailed)
    _, _, best = tune._best(trials)
    assert best.tail_m == 32 and best.block_n == 256
    assert not any(g.tail_m for g in tune._trials(make, tiles, False, warmed.extend, tails=(32,))[1])


def test_tuner_retimes_each_splits_fastest_mxfp4_tiles_with_whole_chunks(monkeypatch):
    """With ``whole`` (MXFP4) each split's ``WHOLE_TOP`` fastest tiles that take K in order are re-timed with
    ``GemmConfig.whole_chunk``, compiled ahead like every candidate, and one can win; tiles it would not
    change are never re-timed, and without ``whole`` none is."""
    pytest.importorskip("triton")
    from moe_triton import tune
    from moe_triton.kernel_configs import GemmConfig, whole_chunk_applies

    tiles = [GemmConfig(bn, 64, 1, 4, 3, swap_ab=s) for bn in (32, 64, 128) for s in (False, True)]

    def cost(g, split):  # wider is faster, unswapped a little faster, whole chunks fastest of all
        return 1000 / g.block_n + (0 if not g.swap_ab else 0.5) - (4 if g.whole_chunk else 0) + split

    monkeypatch.setattr(tune, "_bench", lambda fn: fn())
    make = lambda g, split: lambda: cost(g, split)
    warmed = []
    whole = lambda g: whole_chunk_applies("mxfp4", 16, g)
    trials = tune._trials(make, tiles, True, warmed.extend, whole=whole)
    for split, times in trials.items():
        chunked = [g for g in times if g.whole_chunk]
        assert chunked and len(chunked) <= tune.WHOLE_TOP and all(g.swap_ab for g in chunked), split
        assert all((g, split) in warmed for g in chunked)
    _, split, best = tune._best(trials)
    assert split == 1 and best == GemmConfig(128, 64, 1, 4, 3, swap_ab=True, whole_chunk=True)
    assert not any(g.whole_chunk for t in tune._trials(make, tiles, True, warmed.extend).values() for g in t)


def test_tuner_never_chooses_a_candidate_whose_output_differs_from_the_first_tiles(monkeypatch):
    """A tile a compiler lowers wrongly must not win by being fast: ``tune_shape`` on the interpreter with
    the timing replaced (wider is faster) and one GEMM2 tile made to write wrong output (as Triton's
    warp-specialized walk once did on the H200): that tile, split or walked, is logged and not chosen; the
    next fastest is. GEMM1's last-timed candidate writes NaN: it is refused too, and GEMM2's candidates still
    read the first GEMM1 tile's output (else every GEMM2 tile would disagree)."""
    pytest.importorskip("triton")
    from moe_triton import launch, tune
    from moe_triton.kernel_configs import GemmConfig

    cfg = MoeConfig(8, 2, 64, 64, quant_scheme="fp32", activation="silu", dtype=torch.float32)
    weights = tune.prepare_weights_for(cfg, DEVICE)
    tiles = [GemmConfig(bn, bk, 1, 4, 2) for bn, bk in ((32, 32), (64, 32), (32, 64))]
    real1, real2 = launch.launch_gemm1, launch.launch_gemm2

    def nan_when_walking_64_deep(*args, **kw):
        real1(*args, **kw)
        if args[5].block_k == 64 and args[5].persistent:
            args[4].fill_(float("nan"))

    def wrong_when_64_wide(a, w, routing, y, g, **kw):
        real2(a, w, routing, y, g, **kw)
        if g.block_n == 64:
            y.mul_(1.5)

    timed = []

    def bench(fn):
        fn()
        g = fn.args[5] if fn.func is launch.launch_gemm1 else fn.args[4]
        timed.append(g)
        return 1.0 / g.block_n

    monkeypatch.setattr(launch, "launch_gemm1", nan_when_walking_64_deep)
    monkeypatch.setattr(launch, "launch_gemm2", wrong_when_64_wide)
    monkeypatch.setattr(tune, "_bench", bench)
    monkeypatch.setattr(tune, "_pdl_available", lambda device: False)  # this clock times GEMM launches only
    monkeypatch.setattr(tune, "candidates", lambda scheme, rows, tma=False: [(16, tiles)])
    monkeypatch.setattr(tune, "SPLITS", (2,))
    monkeypatch.setattr(tune, "PERSISTENT", (1,))
    lines = []
    best = tune.tune_shape(cfg, weights, [20], DEVICE, log=lines.append)[20]
    assert best.gemm1.block_n == 64  # right and fastest
    assert best.gemm2.block_n != 64 and best.gemm2 in {*tiles, *(replace(t, persistent=1) for t in tiles)}
    assert not (best.gemm1.block_k == 64 and best.gemm1.persistent)
    rejected = [line for line in lines if "not chosen" in line]
    assert (
        [line for line in rejected if "another a " in line]
        == [line for line in rejected if "another a " in line and "block_k=64" in line and "persistent=1" in line]
        != []
    )
    gemm2 = [line for line in rejected if "another y " in line]
    assert gemm2 and all("block_n=64" in line for line in gemm2)
    assert any("persistent=1" in line for line in gemm2) and any("split 2" in line for line in gemm2)
    assert sum(g.block_n == 64 for g in timed) >= 4  # timed (unsplit, split, walked), then refused


def test_tuner_judges_gemm1_candidates_on_the_rows_that_hold_pairs():
    """What a refused candidate leaves in the intermediate's padding rows (which no GEMM1 writes) does not
    count against the candidates timed after it: a GEMM1 launch's ``written`` reads the rows holding pairs."""
    pytest.importorskip("triton")
    from moe_triton import tune
    from moe_triton.kernel_configs import GemmConfig

    cfg = MoeConfig(8, 2, 64, 64, quant_scheme="fp32", activation="silu", dtype=torch.float32)
    weights = tune.prepare_weights_for(cfg, DEVICE)
    fn = tune._launches(cfg, weights, tune._inputs(cfg, 20, DEVICE), 16, DEVICE)["gemm1"](GemmConfig(32, 32, 1), 1)
    fn()
    first = fn.written[1]().clone()
    intermediate = fn.args[4]
    assert first.shape[0] == 40 < intermediate.shape[0]  # 20 tokens x 2 slots, and padding rows
    intermediate.fill_(float("nan"))  # as a refused candidate may leave it
    fn()
    assert torch.equal(fn.written[1](), first)


@pytest.mark.parametrize("quantized", [False, True])
def test_custom_op_opcheck(quantized):
    from moe_core.synthetic import random_inputs, random_weights
    from moe_triton import launch
    from moe_triton.layout import prepare_weights

    dtype = torch.bfloat16 if DEVICE == "cuda" else torch.float32
    scheme = "mxfp4" if quantized else {torch.bfloat16: "bf16", torch.float32: "fp32"}[dtype]
    act = "swiglu_oai" if quantized else "silu"
    cfg = MoeConfig(4, 2, 64, 64, quant_scheme=scheme, activation=act, has_bias=quantized, dtype=dtype)
    w = prepare_weights(scheme, random_weights(cfg, DEVICE))
    x, ids, tw = random_inputs(cfg, 5, DEVICE)
    out = torch.empty(5, 64, dtype=dtype, device=DEVICE)
    args = (x, ids, tw, w.w13, w.w2, w.w13_scale, w.w2_scale, w.b13, w.b2, out, scheme, act, 1.702, 7.0, False,
            w.w13_mult, w.w2_mult)  # fmt: skip
    torch.library.opcheck(
        launch.fused_moe, args, test_utils=("test_schema", "test_faketensor", "test_autograd_registration")
    )


def test_tuner_skips_candidates_that_fail_to_build_and_reraises_the_rest():
    pytest.importorskip("triton")
    from triton.compiler.errors import CompilationError

    from moe_triton.tune import _safe

    logged = []

    def fails(exc):
        def bench(fn):
            raise exc

        return bench

    assert _safe(fails(CompilationError("src", None, "cannot lower")), None, logged.append) == float("inf")
    assert _safe(fails(RuntimeError("PassManager::run failed")), None, logged.append) == float("inf")
    assert len(logged) == 2 and "did not compile" in logged[0]
    with pytest.raises(ValueError):
        _safe(fails(ValueError("a real bug")), None, logged.append)
    assert _safe(lambda fn: 0.5, None, logged.append) == 0.5


@pytest.mark.parametrize("forced", [None, False])
def test_tuner_chooses_whole_mxfp4_chunks_per_gemm_where_they_time_faster(monkeypatch, forced):
    """``tune_shape`` end to end on MXFP4 with a stand-in clock under which a whole-chunk GEMM1 is faster and a
    whole-chunk GEMM2 slower: every candidate really runs (and agrees with the first), the entry takes whole
    chunks in GEMM1 only. With the ``mxfp4_whole_chunk`` switch set no tile is timed with them (the switch
    would make both variants the same launch), and the log says why."""
    pytest.importorskip("triton")
    from moe_core.synthetic import random_weights
    from moe_triton import switches, tune
    from moe_triton.kernel_configs import GemmConfig
    from moe_triton.layout import prepare_weights

    monkeypatch.setattr(tune, "candidates", lambda scheme, rows, tma=False: [(16, [GemmConfig(64, 64, 1, 4, 2, True)])])
    monkeypatch.setattr(tune, "SPLITS", (2,))
    monkeypatch.setattr(tune, "_pdl_available", lambda device: False)  # this clock times GEMM launches only
    timed = []

    def clock(fn):
        fn()
        first = fn.func.__name__ == "launch_gemm1"
        tiles = fn.args[5] if first else fn.args[4]
        timed.append((first, tiles.whole_chunk))
        return 1.0 + (-0.5 if first else 0.5) * tiles.whole_chunk

    monkeypatch.setattr(tune, "_bench", clock)
    dtype = torch.bfloat16 if DEVICE == "cuda" else torch.float16
    cfg = MoeConfig(8, 2, 128, 64, quant_scheme="mxfp4", activation="swiglu_oai", dtype=dtype, has_bias=True)
    weights = prepare_weights("mxfp4", random_weights(cfg, DEVICE))
    lines = []
    with switches.override(mxfp4_whole_chunk=forced):
        best = tune.tune_shape(cfg, weights, [1], DEVICE, log=lines.append)[1]
    assert not any("not chosen" in line for line in lines), lines
    if forced is None:
        assert {(True, True), (False, True)} <= set(timed)
        assert best.gemm1.whole_chunk and not best.gemm2.whole_chunk
    else:
        assert not any(w for _, w in timed) and not best.gemm1.whole_chunk
        assert any("MOE_TRITON_MXFP4_WHOLE_CHUNK is set" in line for line in lines), lines


def test_tuner_times_each_split_of_gemm1_and_picks_the_fastest(monkeypatch):
    """``tune_shape`` end to end at a toy shape with a stand-in clock: every candidate really runs (the
    split ones with their partials and counters), and each GEMM's fastest split wins."""
    pytest.importorskip("triton")
    from moe_core.synthetic import random_weights
    from moe_triton import tune
    from moe_triton.kernel_configs import GemmConfig
    from moe_triton.layout import prepare_weights

    gemms = [GemmConfig(32, 32, 1, 4, 2), GemmConfig(16, 64, 1, 4, 2)]
    monkeypatch.setattr(tune, "candidates", lambda scheme, rows_per_expert, tma=False: [(16, gemms)])
    ran = []

    def clock(fn):
        fn()
        gemm = {"launch_gemm1": "run1", "launch_gemm2": "run2"}[fn.func.__name__]
        split = 1 if fn.keywords["split"] is None else fn.keywords["split"].factor
        ran.append((gemm, split))
        return {("run1", 2): 2.0, ("run2", 4): 0.5}.get((gemm, split), 3.0)

    monkeypatch.setattr(tune, "_bench", clock)
    monkeypatch.setattr(tune, "_pdl_available", lambda device: False)  # this clock times GEMM launches only
    scheme, dtype = ("bf16", torch.bfloat16) if DEVICE == "cuda" else ("fp32", torch.float32)
    cfg = MoeConfig(8, 2, 128, 64, quant_scheme=scheme, activation="silu", dtype=dtype, has_bias=True)
    weights = prepare_weights(scheme, random_weights(cfg, DEVICE))
    best = tune.tune_shape(cfg, weights, [1], DEVICE, log=lambda line: None)[1]
    assert (best.split_k, best.split_k2, best.block_m) == (2, 4, 16)
    for gemm in ("run1", "run2"):
        assert sorted(s for g, s in set(ran) if g == gemm) == [1, *tune.SPLITS]
        assert ran.count((gemm, 1)) == len(gemms)


@pytest.mark.parametrize("pdl_time,chosen", [(0.9, True), (0.998, False), (1.1, False)])
def test_tuner_sets_pdl_where_the_whole_forward_was_faster_with_it(monkeypatch, tmp_path, pdl_time, chosen):
    """After the tiles, ``tune_shape`` times the whole forward on them without and with programmatic
    dependent launch, alternately, and sets the entry's ``pdl`` only where it was ``PDL_MIN_GAIN`` faster
    (0.998 of the plain time is within it); the table it writes carries the choice. A stand-in clock, and
    PDL taken as available (on the CPU the forward runs plain either way: its outputs agree)."""
    pytest.importorskip("triton")
    from moe_triton import kernel_configs, launch, tune
    from moe_triton.kernel_configs import GemmConfig

    cfg = MoeConfig(8, 2, 64, 64, quant_scheme="fp32", activation="silu", dtype=torch.float32)
    weights = tune.prepare_weights_for(cfg, DEVICE)
    forwards = []

    def clock(fn):
        fn()
        if fn.func is launch.run_fused_moe:
            forwards.append(fn.keywords["switches"].pdl)
            return pdl_time if fn.keywords["switches"].pdl else 1.0
        return 1.0

    monkeypatch.setattr(tune, "_bench", clock)
    monkeypatch.setattr(tune, "_pdl_available", lambda device: True)
    monkeypatch.setattr(tune, "candidates", lambda scheme, rows, tma=False: [(16, [GemmConfig(32, 32, 1, 4, 2)])])
    monkeypatch.setattr(tune, "SPLITS", ())
    lines = []
    best = tune.tune_shape(cfg, weights, [20], DEVICE, log=lines.append)[20]
    assert best.pdl is chosen
    assert forwards == [False, True] * tune.PDL_ROUNDS
    assert any(f"pdl {'on' if chosen else 'off'}" in line and "whole forward" in line for line in lines)
    path = tune.write_table(tmp_path / "cpu.json", "cpu", {"k": {20: best}})
    assert kernel_configs.parse_table(path.read_text())["k"][20].pdl is chosen


@pytest.mark.parametrize(
    "speed,perturb,added",
    [
        ({3: 0.9}, False, {2: "a", 3: "b", 5: "b"}),  # the far neighbour wins at 3: every probed count gets its winner
        ({2: 0.99, 5: 1.5}, False, {}),  # within BOUNDARY_MIN_GAIN, or the nearest wins: nothing added
        ({3: 0.9}, True, {}),  # faster but another output: not used
        ({"near 2": float("inf")}, True, {2: "b", 3: "a", 5: "b"}),  # the nearest did not run: nothing to compare
    ],
)
def test_tuner_adds_entries_where_the_nearest_entry_is_the_slower_neighbour(monkeypatch, speed, perturb, added):
    """``boundary_entries``: between adjacent entries (one of them tuned now), the whole forward runs on both
    neighbours at ``probe_points``; where the one the nearest-M rule does not pick is ``BOUNDARY_MIN_GAIN``
    faster at some count (and writes the same output), every probed count gets the entry that won there.
    Pairs with one config, or with neither count tuned now, are not timed. A stand-in clock: ``speed`` is
    the far neighbour's time (against 1.0, else 1.1) per probed count, ``near M`` the nearest's (inf: it did
    not run); ``perturb`` changes the far neighbour's output."""
    pytest.importorskip("triton")
    from moe_triton import tune
    from moe_triton.kernel_configs import GemmConfig, KernelConfig

    cfg = MoeConfig(8, 2, 64, 64, quant_scheme="fp32", activation="silu", dtype=torch.float32)
    weights = tune.prepare_weights_for(cfg, DEVICE)
    a, b = KernelConfig(16, GemmConfig(32, 32, 1, 4, 2), GemmConfig(32, 32, 1, 4, 2)), KernelConfig(16)
    entry = {1: a, 8: b, 64: b, 512: a}  # 8-64: one config; 64-512: neither tuned below
    timed = []

    def clock(fn):
        fn()
        m, config = fn.args[0].shape[0], fn.keywords["config"]
        timed.append(m)
        far = config == (b if m - 1 <= 8 - m else a)
        if far and perturb:
            fn.out.add_(1.0)
        return speed.get(m, 1.1) if far else speed.get(f"near {m}", 1.0)

    monkeypatch.setattr(tune, "_bench", clock)
    lines = []
    got = tune.boundary_entries(cfg, weights, entry, {1, 8}, DEVICE, log=lines.append)
    assert got == {m: {"a": a, "b": b}[n] for m, n in added.items()}
    assert sorted(set(timed)) == tune.probe_points(1, 8) == [2, 3, 5]
    assert len(timed) == 2 * tune.BOUNDARY_ROUNDS * 3
    assert any("another output" in line for line in lines) is (perturb and added == {})


def test_pdl_is_not_chosen_when_it_changes_the_output():
    """PDL changes when kernels start, not what they compute: a forward whose output differs with it is
    reported and left plain, however fast."""
    from moe_triton import tune

    def forward(value, ms):
        fn = lambda: ms
        fn.out = torch.full((2, 3), value)
        return fn

    lines = []
    bench = lambda fn: fn()
    same = {False: forward(1.0, 1.0), True: forward(1.0, 0.5)}
    assert tune._choose_pdl(same, bench, lines.append) == (True, 1.0, 0.5)
    other = {False: forward(1.0, 1.0), True: forward(2.0, 0.5)}
    assert tune._choose_pdl(other, bench, lines.append) == (False, 1.0, 0.5)
    assert len(lines) == 1 and "another output" in lines[0]


def test_a_table_entry_sets_pdl_unless_the_switch_forces_it():
    """``pdl_wanted``: the switch where it is set (1 / 0), else the entry's choice; without an entry, off.
    On the CPU no launch takes the keywords, whatever is wanted."""
    from moe_triton import launch
    from moe_triton.kernel_configs import KernelConfig
    from moe_triton.switches import Switches

    tuned, plain = KernelConfig(pdl=True), KernelConfig()
    assert launch.pdl_wanted(Switches(), tuned) and not launch.pdl_wanted(Switches(), plain)
    assert not launch.pdl_wanted(Switches(), None)
    assert not launch.pdl_wanted(Switches(pdl=False), tuned) and launch.pdl_wanted(Switches(pdl=True), plain)
    assert launch.pdl_kwargs(torch.device("cpu"), Switches(), tuned) == {}
    assert KernelConfig.from_dict(tuned.as_dict()) == tuned
    assert KernelConfig.from_dict({k: v for k, v in tuned.as_dict().items() if k != "pdl"}) == plain
    with pytest.raises(ValueError, match="pdl must be true or false"):
        KernelConfig.from_dict({**tuned.as_dict(), "pdl": "yes"})
