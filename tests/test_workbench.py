"""The workbench: plots, the calibration panel, sweeps and the measured-data fit."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
from matplotlib.collections import PolyCollection  # noqa: E402

import kbwork  # noqa: E402
from kbwork import analysis, decode, plots  # noqa: E402
from kbwork.calibration import fit_dispatch, load_measured  # noqa: E402
from kbwork.oplog import ENGINE_NAMES  # noqa: E402
from kbwork.widgets import CalibrationPanel  # noqa: E402


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


@pytest.fixture(scope="module")
def small_cmp():
    return decode.compare(kv_len=512, mode="timing")


def _collections(ax):
    return [c for c in ax.collections if isinstance(c, PolyCollection)]


def test_gantt_one_collection_per_engine_and_every_stage_drawn(small_cmp):
    log = small_cmp.opt3.op_log
    ax = plots.gantt(log)
    colls = _collections(ax)
    # one collection per engine unit, plus one for the hatched V-tile stages on each unit that moves them
    plain = [c for c in colls if c.get_gid().count(":") == 1]
    assert len(plain) == log["engine"].nunique() == 5
    assert sorted(c.get_gid() for c in colls if c not in plain) == ["stages:PE_DMA:////", "stages:PE_GEMM:////"]
    assert sum(len(c.get_paths()) for c in colls) == len(log)
    assert [t.get_text() for t in ax.get_yticklabels()] == list(ENGINE_NAMES)
    assert ax.get_legend() is not None
    # the µs axis is on top
    assert any(getattr(c, "get_xlabel", lambda: "")() == "µs" for c in ax.child_axes)


def test_gantt_window_and_highlight(small_cmp):
    log = small_cmp.opt2.op_log
    lo, hi = plots.tile_window(log, [1])
    sel = log[(log.end > lo) & (log.start < hi)]
    ax = plots.gantt(log, window=(lo, hi), highlight={"iter": 1})
    assert sum(len(c.get_paths()) for c in _collections(ax)) == len(sel)
    assert ax.get_xlim() == (lo, hi)
    faded = np.concatenate([c.get_facecolors()[:, 3] for c in _collections(ax)])
    assert (faded < 1).any() and (faded == 1).any()
    with pytest.raises(ValueError, match="no stages with iter"):
        plots.tile_window(log, [999])


def test_gantt_draws_100k_stages_as_five_collections():
    n = 100_000
    rng = np.random.default_rng(0)
    engines = np.array(ENGINE_NAMES)[rng.integers(0, 5, n)]
    stages = np.array(["DMA_READ", "FETCH", "GEMM", "MATH", "DISPATCH"])[rng.integers(0, 5, n)]
    start = np.arange(n) * 10
    log = pd.DataFrame({"seq": range(n), "cmd": 0, "iter": -1, "label": "x", "stage": stages, "engine": engines,
                        "op_kind": "", "phase": "tile", "tile": 0, "k_tile": 0, "tensor": "", "bytes": 0,
                        "start": start, "end": start + 7})
    ax = plots.gantt(log)
    assert len(_collections(ax)) == 5
    ax.figure.canvas.draw()


def test_compare_gantt_and_dispatch_bars(small_cmp):
    fig = plots.compare_gantt(small_cmp.opt2.op_log, small_cmp.opt3.op_log, tiles=2)
    assert len(fig.axes) >= 2
    ax = plots.dispatch_per_tile(small_cmp.opt2.op_log, small_cmp.opt3.op_log, tile=1)
    assert "4.13" in ax.get_title(loc="left")
    widths = [p.get_width() for p in ax.patches]
    assert sum(widths) == 103 + 425


def test_scaling_and_gate_map():
    sw = decode.sweep(kv_len=[256, 512], progress=False)
    assert set(sw.columns) >= {"kv_len", "variant", "cycles", "dispatch_total", "dispatch_per_tile"}
    assert len(sw) == 4
    ax = plots.scaling(sw)  # the end-to-end ratio opt3/opt2, and the line at 1
    assert len(ax.lines) == 2
    ratio = sw[sw.variant == "opt3"].cycles.to_numpy() / sw[sw.variant == "opt2"].cycles.to_numpy()
    np.testing.assert_allclose(ax.lines[0].get_ydata(), ratio)
    ax = plots.scaling(sw, kind="cycles")  # the old log-log view: end-to-end and dispatch per variant
    assert len(ax.lines) == 4
    grid = analysis.ratio_grid([60, 304], [60, 24, 32, 32, 32, 24, 40, 32, 24, 64], range(0, 81, 10),
                               [0.0, 0.0625, 0.25, 0.5])
    assert grid.loc[40, 0.0625] == pytest.approx(425 / 103)
    ax = plots.gate_map(grid)
    assert ax.collections  # the mesh (and the ratio = 2 contour)


def test_sweep_rejects_unknown_axis():
    with pytest.raises(kbwork.ValidationError, match="unknown axis kvlen"):
        decode.sweep(kvlen=[256])


# --- the calibration panel, driven without a browser ---------------------------------------------
def test_panel_fixed_40_to_0_flips_the_gate_and_shows_the_closed_form():
    panel = CalibrationPanel(kv_len=1024, draw=False)
    assert panel.state["gate"] is True
    assert "4.126" in panel.ratio_text() and "PASS" in panel.ratio_text()
    state = panel.update(fixed=0)
    assert state["gate"] is False
    bytes2 = decode.run("opt2", kv_len=256, mode="timing").command_bytes_per_tile
    bytes3 = decode.run("opt3", kv_len=256, mode="timing").command_bytes_per_tile
    closed = analysis.closed_form(bytes3, 0, 0.0625) / analysis.closed_form(bytes2, 0, 0.0625)
    assert state["ratio"] == pytest.approx(closed) == pytest.approx(25 / 23)
    assert f"{closed:.3f}" in panel.ratio_text() and "FAIL" in panel.ratio_text()


def test_panel_redraws_and_widgets_drive_update():
    pytest.importorskip("ipywidgets")
    panel = CalibrationPanel(kv_len=512, gantt_tiles=1)
    first = panel.figure
    assert first is not None
    box = panel.widget()
    fixed = panel._widgets["fixed"]
    fixed.value = 0                     # what moving the slider does
    assert panel.state["fixed"] == 0 and panel.state["gate"] is False
    assert "FAIL" in panel._widgets["summary"].value
    panel._widgets["tile"].value = 64
    assert panel.state["tile"] == 64
    assert box is panel.widget()
    with pytest.raises(kbwork.ValidationError, match="unknown control"):
        panel.update(fixd=3)


def test_measured_h200_fit_matches_its_readme():
    fit = fit_dispatch(load_measured("h200_kernel_launch_cost"))
    assert fit.fixed == pytest.approx(0.531, abs=5e-4)
    assert fit.r == pytest.approx(1.07e-5, rel=0.02)
    fixed_c, r_c = fit.in_cycles(1.98)
    assert round(fixed_c) == 1051 and r_c == pytest.approx(0.021, abs=5e-4)
    with pytest.raises(kbwork.ValidationError, match="no measured table"):
        load_measured("nope")
