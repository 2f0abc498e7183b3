"""The runtime switches (``moe_triton.switches``): read from the environment when asked, overridden in
process, and what a forward launches under them. Runs under the interpreter."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from test_kernel_paths import DEVICE, FLOAT, _forward, _kc

from moe_core import MoeConfig
from moe_core.reference import reference_for
from moe_core.synthetic import random_inputs, random_weights
from moe_core.tolerances import relative_l2, tolerance
from moe_triton import launch, switches
from moe_triton.launch_args import Activation

WIDE = "fp32" if FLOAT == torch.float32 else "bf16"


@pytest.fixture
def environ(monkeypatch):
    """``monkeypatch`` for the switches' variables; the switches are read again once they are restored."""
    for variable in switches.VARIABLES.values():
        monkeypatch.delenv(variable, raising=False)
    yield monkeypatch
    monkeypatch.undo()
    switches.refresh()


@pytest.fixture
def gemm_launches(monkeypatch):
    """Every ``launch_gemm1`` / ``launch_gemm2`` call of the forwards in the test, with its keywords; the
    launches still run."""
    calls = []

    def spy(name, real):
        def launch_and_record(*args, **kwargs):
            calls.append((name, kwargs))
            return real(*args, **kwargs)

        return launch_and_record

    for name in ("launch_gemm1", "launch_gemm2"):
        monkeypatch.setattr(launch, name, spy(name, getattr(launch, name)))
    return calls


def _splits(calls) -> dict[str, int]:
    return {name: kw["split"].factor if kw["split"] is not None else 1 for name, kw in calls}


def test_the_table_has_every_switch_with_its_variable_and_default():
    rows = {name: (variable, default) for name, variable, default, doc in switches.describe() if doc}
    assert rows == {
        "split_k": ("MOE_TRITON_SPLIT_K", 0),
        "mxfp4_asm": ("MOE_TRITON_MXFP4_ASM", True),
        "mxfp4_whole_chunk": ("MOE_TRITON_MXFP4_WHOLE_CHUNK", None),
        "fp8_prequant": ("MOE_TRITON_FP8_PREQUANT", True),
        "fp8_scale_prefetch": ("MOE_TRITON_FP8_SCALE_PREFETCH", True),
        "pdl": ("MOE_TRITON_PDL", None),
        "direct": ("MOE_TRITON_DIRECT", True),
        "fast_launch": ("MOE_TRITON_FAST_LAUNCH", True),
        "fused_router": ("MOE_TRITON_FUSED_ROUTER", True),
        "fused_gate": ("MOE_TRITON_FUSED_GATE", True),
        "gate_max_tokens": ("MOE_TRITON_GATE_MAX_TOKENS", 256),
        "auto_split_k": ("MOE_TRITON_AUTO_SPLIT_K", False),
    }
    assert switches.from_environ({}) == switches.Switches()


def test_environment_changes_after_import_take_effect_on_refresh(environ):
    assert switches.refresh() == switches.Switches()
    environ.setenv("MOE_TRITON_SPLIT_K", "3")
    environ.setenv("MOE_TRITON_PDL", "on")
    environ.setenv("MOE_TRITON_FP8_PREQUANT", "0")
    assert switches.current_switches().split_k == 0  # read when asked, not on every call
    now = switches.refresh()
    assert switches.current_switches() == now == switches.Switches(split_k=3, pdl=True, fp8_prequant=False)
    environ.setenv("MOE_TRITON_SPLIT_K", "")  # empty: the default
    assert switches.refresh().split_k == 0
    environ.setenv("MOE_TRITON_PDL", "0")  # off everywhere, the tile configs' choice overridden
    assert switches.refresh().pdl is False
    environ.setenv("MOE_TRITON_PDL", "")  # unset: as the tile config says
    assert switches.refresh().pdl is None


@pytest.mark.parametrize(
    "variable,value",
    [("MOE_TRITON_SPLIT_K", "two"), ("MOE_TRITON_SPLIT_K", "-1"), ("MOE_TRITON_PDL", "maybe"),
     ("MOE_TRITON_MXFP4_ASM", "2")],
)  # fmt: skip
def test_a_bad_value_names_its_variable(environ, variable, value):
    environ.setenv(variable, value)
    with pytest.raises(ValueError, match=f"{variable}='{value}' is not valid"):
        switches.refresh()
    with pytest.raises(ValueError, match=variable):
        switches.from_environ({variable: value})


def test_override_nests_restores_and_rejects_unknown_or_bad_values():
    before = switches.current_switches()
    with switches.override(pdl=True) as outer:
        assert switches.current_switches() == outer and outer.pdl and outer.split_k == before.split_k
        with switches.override(split_k=2):
            assert switches.current_switches().pdl and switches.current_switches().split_k == 2
        assert switches.current_switches() == outer
    assert switches.current_switches() == before
    with pytest.raises(TypeError, match="unknown switch"), switches.override(pld=True):
        pass
    with pytest.raises(ValueError, match="MOE_TRITON_SPLIT_K"), switches.override(split_k=-2):
        pass
    with pytest.raises(ValueError, match="MOE_TRITON_PDL"), switches.override(pdl="yes"):
        pass
    with pytest.raises(ValueError, match="MOE_TRITON_FAST_LAUNCH.*True or False,"), switches.override(fast_launch=None):
        pass
    assert switches.current_switches() == before


def test_split_k_switch_makes_a_forward_split_gemm1(gemm_launches):
    cfg = MoeConfig(8, 2, 128, 64, quant_scheme=WIDE, activation="silu", dtype=FLOAT)
    weights = random_weights(cfg, DEVICE)
    x, ids, tw = random_inputs(cfg, 3, DEVICE)
    kc = _kc(32, 1)  # the config pins GEMM1 unsplit; the switch overrides it
    unsplit = _forward(cfg, weights, x, ids, tw, kc)
    assert _splits(gemm_launches) == {"launch_gemm1": 1, "launch_gemm2": 1}
    gemm_launches.clear()
    with switches.override(split_k=2):
        split = _forward(cfg, weights, x, ids, tw, kc)
    assert _splits(gemm_launches) == {"launch_gemm1": 2, "launch_gemm2": 1}
    assert gemm_launches[0][1]["split"].partials.shape[0] == 2
    assert relative_l2(split, reference_for(cfg, weights, x, ids, tw)) <= tolerance(WIDE, FLOAT)
    assert relative_l2(split, unsplit) <= tolerance(WIDE, FLOAT)


def test_split_k_from_the_environment_reaches_a_forward(environ, gemm_launches):
    cfg = MoeConfig(8, 1, 128, 64, quant_scheme=WIDE, activation="gelu", dtype=FLOAT)
    weights = random_weights(cfg, DEVICE)
    x, ids, tw = random_inputs(cfg, 2, DEVICE)
    environ.setenv("MOE_TRITON_SPLIT_K", "4")
    switches.refresh()
    out = _forward(cfg, weights, x, ids, tw, _kc(32, 0))
    assert _splits(gemm_launches)["launch_gemm1"] == 4
    assert relative_l2(out, reference_for(cfg, weights, x, ids, tw)) <= tolerance(WIDE, FLOAT)


@pytest.mark.parametrize("prequant", [True, False])
def test_fp8_prequant_switch_chooses_where_the_activations_are_quantized(monkeypatch, prequant):
    """fp8_block (its dot is inexact under the interpreter, so the GEMMs are recorded, not run): with the
    switch on GEMM1 reads codes and scales from ``quantize_fp8_groups``, off it reads ``x`` itself."""
    from moe_triton.layout import prepare_weights

    calls, quantized = [], []
    monkeypatch.setattr(launch, "launch_gemm1", lambda x, *a, **kw: calls.append(("gemm1", x, kw)))
    monkeypatch.setattr(launch, "launch_gemm2", lambda *a, **kw: calls.append(("gemm2", None, kw)))
    real = launch.quantize_fp8_groups
    monkeypatch.setattr(launch, "quantize_fp8_groups", lambda x, pdl=None: quantized.append(x) or real(x, pdl))
    cfg = MoeConfig(4, 1, 256, 128, quant_scheme="fp8_block", activation="silu", dtype=torch.float16)
    p = prepare_weights("fp8_block", random_weights(cfg, DEVICE))
    x, ids, tw = random_inputs(cfg, 3, DEVICE)
    out = torch.empty(3, 256, dtype=torch.float16, device=DEVICE)
    with switches.override(fp8_prequant=prequant):
        launch.run_fused_moe(x, ids, tw, p.gemm1(), p.gemm2(), Activation("silu"), out, config=_kc(128, 1))
    (_, a, kw), _ = calls
    if prequant:
        assert len(quantized) == 1 and a.dtype == torch.float8_e4m3fn and kw["x_scale"].shape == (3, 2)
    else:
        assert not quantized and a is x and kw["x_scale"] is None


def test_a_forward_reads_the_switches_once_and_passes_them_down(monkeypatch, gemm_launches):
    reads = []
    real = switches.current_switches
    monkeypatch.setattr(launch, "current_switches", lambda: reads.append(1) or real())
    cfg = MoeConfig(8, 2, 128, 64, quant_scheme=WIDE, activation="silu", dtype=FLOAT)
    weights = random_weights(cfg, DEVICE)
    x, ids, tw = random_inputs(cfg, 2, DEVICE)
    with switches.override(split_k=2) as forced:
        _forward(cfg, weights, x, ids, tw, _kc(32, 1))
    assert len(reads) == 1
    assert all(kw["switches"] == forced for _, kw in gemm_launches)


def test_pdl_switch_is_off_on_the_cpu():
    with switches.override(pdl=True):
        assert launch.pdl_kwargs(torch.device("cpu")) == {}


def test_whole_chunks_follow_the_tile_unless_the_switch_is_set():
    """``GemmConfig.whole_chunk`` chooses per GEMM; the ``mxfp4_whole_chunk`` switch, when set, overrides every
    tile; tiles it would not change (not MXFP4, or K out of order: fewer than 64 rows, unswapped) always get
    False, so they keep one compiled variant."""
    from moe_triton.kernel_configs import GemmConfig

    swapped, plain = GemmConfig(swap_ab=True, whole_chunk=True), GemmConfig(whole_chunk=True)
    unset, on, off = (switches.Switches(mxfp4_whole_chunk=v) for v in (None, True, False))
    assert launch._whole_chunk("mxfp4", 16, swapped, unset)
    assert not launch._whole_chunk("mxfp4", 16, replace(swapped, whole_chunk=False), unset)
    assert launch._whole_chunk("mxfp4", 16, replace(swapped, whole_chunk=False), on)
    assert not launch._whole_chunk("mxfp4", 16, swapped, off)
    assert launch._whole_chunk("mxfp4", 64, plain, unset)  # 64 rows take K in order unswapped too
    assert not launch._whole_chunk("mxfp4", 32, plain, on)
    assert not launch._whole_chunk("bf16", 64, swapped, on)


def test_fp8_scales_are_prefetched_only_in_decode_tiles():
    on, off = switches.Switches(fp8_scale_prefetch=True), switches.Switches(fp8_scale_prefetch=False)
    assert launch._scale_prefetch("fp8_block", launch.PREFETCH_MAX_BLOCK_M, on)
    assert not launch._scale_prefetch("fp8_block", 2 * launch.PREFETCH_MAX_BLOCK_M, on)
    assert not launch._scale_prefetch("fp8_block", launch.PREFETCH_MAX_BLOCK_M, off)
    assert not launch._scale_prefetch("bf16", launch.PREFETCH_MAX_BLOCK_M, on)
