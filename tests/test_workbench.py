"""The workbench: plots, the calibration panel, sweeps and the measured-data fit."""

from __future__ import annotations

import io
import threading
from fractions import Fraction

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
from matplotlib.collections import PolyCollection  # noqa: E402

import kbwork  # noqa: E402
from kbwork import analysis, decode, plots  # noqa: E402
from kbwork.calibration import PE_COMMAND_BYTES, fit_dispatch, load_measured  # noqa: E402
from kbwork.oplog import ENGINE_NAMES  # noqa: E402
from kbwork.widgets import CalibrationPanel  # noqa: E402


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
    with pytest.warns(plots.DensityWarning, match="PE_.* has 2.,... stages in the window"):
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


def test_panel_redraws_and_widgets_drive_update(monkeypatch):
    pytest.importorskip("ipywidgets")
    panel = CalibrationPanel(kv_len=512, gantt_tiles=1)
    first = panel.figure
    assert first is not None
    box = panel.widget()
    fixed = panel._widgets["fixed"]
    fixed.value = 0                     # what moving the slider does
    assert panel.wait(timeout=60)
    assert panel.state["fixed"] == 0 and panel.state["gate"] is False
    assert "FAIL" in panel._widgets["summary"].value
    panel._widgets["tile"].value = 64
    assert panel.wait(timeout=60)
    assert panel.state["tile"] == 64
    assert box is panel.widget() and panel.figure is first
    with pytest.raises(kbwork.ValidationError, match="unknown control"):
        panel.update(fixd=3)
    real, calls = decode.compare, []
    monkeypatch.setattr(decode, "compare", lambda **kw: calls.append(kw) or real(**kw))
    panel.update(fixed=12, kv_len=1000)  # a call moves the controls too (kv_len rounded to the tile) ...
    assert (fixed.value, panel._widgets["kv_len"].value) == (12, 960)
    assert panel.wait(timeout=60) and len(calls) == 1 and panel.state["fixed"] == 12  # ... and simulates once


def _bars(panel, variant):
    """The panel's Gantt collections for ``variant`` (one per engine track) and their Axes."""
    rows = panel._rows[variant]
    return rows.ax, rows.collections


def test_panel_updates_the_same_figure_in_place():
    W = pytest.importorskip("ipywidgets")
    panel = CalibrationPanel(kv_len=1024, gantt_tiles=2)
    panel.widget()
    fig, image = panel.figure, panel._widgets["figure"]
    assert isinstance(image, W.Image)
    ax, colls = _bars(panel, "opt3")
    colls = list(colls)
    n_artists = len(fig.get_children()), len(ax.get_children())
    xlim, cpu = ax.get_xlim(), colls[0].get_paths()
    png = bytes(image.value)
    assert png.startswith(b"\x89PNG")
    assert "FIXED 40 cycles" in fig._suptitle.get_text()

    panel.update(fixed=120)
    assert panel.figure is fig and panel._widgets["figure"] is image
    after_ax, after = _bars(panel, "opt3")
    assert after_ax is ax and all(a is b for a, b in zip(after, colls, strict=True))  # the same artists ...
    assert (len(fig.get_children()), len(ax.get_children())) == n_artists   # ... and no new artists
    assert ax.get_xlim() != xlim and ax.get_xlim()[1] > xlim[1]  # dispatch got longer: a wider window

    def widest(paths):  # PE_CPU: the DISPATCH bars
        return max(np.ptp(p.vertices[:, 0]) for p in paths)

    assert widest(colls[0].get_paths()) >= 120 > widest(cpu)
    assert "FIXED 120 cycles" in fig._suptitle.get_text()
    assert bytes(image.value) != png and bytes(image.value).startswith(b"\x89PNG")
    assert plt.get_fignums() == []  # never a pyplot figure (the inline backend would show it again)
    # the repaint (background + what moves) is the picture a full draw of the same figure gives, but
    # for antialiased pixels where a bar's end meets a y tick at the frame (they are painted in
    # another order); and a plain savefig still draws everything
    painted = np.asarray(fig.canvas.buffer_rgba()).copy()
    fig.canvas.draw()
    full = np.asarray(fig.canvas.buffer_rgba())
    assert painted.shape == full.shape and (painted != full).any(axis=-1).mean() < 1e-3
    fig.savefig(io.BytesIO(), format="png")
    assert not any(c.get_animated() for c in colls)


def test_panel_coalesces_changes_that_arrive_while_it_simulates(monkeypatch):
    panel = CalibrationPanel(kv_len=512, draw=False)
    real = decode.compare
    entered, release = threading.Event(), threading.Event()
    asked: list[tuple[int, float]] = []

    def slow_compare(**kw):
        asked.append((kw["fixed_cycles"], kw["r_cycles_per_byte"]))
        entered.set()
        release.wait(60)  # the first simulation is held until the other changes are queued
        return real(**kw)

    monkeypatch.setattr(decode, "compare", slow_compare)
    panel.request(fixed=10)
    assert entered.wait(60)
    for fixed in (20, 30, 40, 50):
        panel.request(fixed=fixed)
    panel.request(r=0.25)
    release.set()
    assert panel.wait(timeout=120)
    assert asked == [(10, 0.0625), (50, 0.25)]  # the middle values were never simulated
    assert (panel.state["fixed"], panel.state["r"]) == (50, 0.25)


def test_panel_free_dispatch_shows_an_undefined_ratio_and_a_failed_gate():
    pytest.importorskip("ipywidgets")
    panel = CalibrationPanel(kv_len=512)
    panel.widget()
    panel.request(fixed=0, r=0.0)
    assert panel.wait(timeout=60)
    assert panel.error is None
    s = panel.state
    assert s["ratio"] is None and s["closed_form_ratio"] is None and s["gate"] is False
    assert s["dispatch"] == {"opt2": 0, "opt3": 0} and "has no value" in s["ratio_note"]
    assert "ratio undefined" in panel.ratio_text() and "FAIL" in panel.ratio_text()
    summary = panel._widgets["summary"].value
    assert "ratio undefined" in summary and "FAIL" in summary and "FIXED 0 cycles, R 0 cycles/byte" in summary
    assert panel._widgets["message"].value == ""
    assert "FIXED 0 cycles" in panel.figure._suptitle.get_text()


def test_panel_shows_a_setting_it_cannot_simulate_as_a_message(monkeypatch):
    pytest.importorskip("ipywidgets")
    panel = CalibrationPanel(kv_len=512)
    panel.widget()
    before = dict(panel.state)
    panel.request(group=100_000)        # Q alone is larger than the TCM
    assert panel.wait(timeout=60)       # nothing raised out of the widget path
    message = panel._widgets["message"].value
    assert "TcmOverflowError" in message and "TCM overflow allocating" in message
    assert "still showing the last one that could: FIXED 40 cycles" in message and "group 8" in message
    assert panel.state == before and panel.values["group"] == 8
    panel.request(group=4)              # a good setting clears the message
    assert panel.wait(timeout=60)
    assert panel.error is None and panel._widgets["message"].value == "" and panel.state["group"] == 4
    with pytest.raises(kbwork.ValidationError, match="fixed_cycles"):
        panel.update(fixed=-1)          # called directly, the error is raised (and shown)
    assert "fixed_cycles" in panel._widgets["message"].value

    def broken(**kw):
        raise RuntimeError("boom")

    monkeypatch.setattr(decode, "compare", broken)
    panel.request(fixed=7)
    assert panel.wait(timeout=60)
    assert "unexpected RuntimeError" in panel._widgets["message"].value and "boom" in panel.error


def test_the_panel_shows_the_fixed_it_simulates_and_refuses_one_it_cannot(monkeypatch):
    panel = CalibrationPanel(kv_len=512, draw=False)
    asked = []
    real = decode.compare
    monkeypatch.setattr(decode, "compare", lambda **kw: asked.append(kw["fixed_cycles"]) or real(**kw))
    for whole in (40.0, np.float64(12.0), np.int64(7), Fraction(80, 2)):
        panel.update(fixed=whole)
        assert asked[-1] == int(whole) and type(asked[-1]) is int
        assert panel.values["fixed"] == int(whole) and f"FIXED {int(whole)} cycles," in panel.setting_text()
    n = len(asked)
    for bad in (40.7, -0.5, -1, float("nan"), float("inf"), -float("inf"), Fraction(81, 2), "40", True):
        with pytest.raises(kbwork.ValidationError, match="FIXED .* is a whole number of cycles >= 0"):
            panel.update(fixed=bad)
        assert panel.setting_text().startswith("FIXED 40 cycles,")  # still the last simulated setting
        panel._apply({"fixed": bad})  # what a widget does: the message, never "a bug in kbwork"
        assert "whole number of cycles" in panel.error and "bug" not in panel.error
        assert "still showing the last one that could: FIXED 40 cycles" in panel.message_html()
    assert len(asked) == n  # none of them was simulated
    panel.update(r=0.123456789)
    assert "R 0.123456789 cycles/byte" in panel.setting_text()  # exactly the R simulated


def test_panel_with_three_variants():
    pytest.importorskip("ipywidgets")
    panel = CalibrationPanel(kv_len=512, variants=("opt2", "opt3", "a1"))
    panel.widget()
    s = panel.state
    assert s["variants"] == ("opt2", "opt3", "a1")
    assert s["dispatch"] == {"opt2": 103, "opt3": 425, "a1": s["dispatch_a1"]} and s["dispatch_a1"] > 103
    assert [g["rule"] for g in s["gates"]] == ["opt3 > 2 x opt2", "a1 > 2 x opt2", "opt3 > 2 x a1"]
    assert "dispatch ratio opt3/opt2 = 4.126" in panel.ratio_text()
    summary = panel._widgets["summary"].value
    for text in ("a1 ", "a1 > 2 x opt2", "opt3 > 2 x a1", str(s["cycles"]["a1"])):
        assert text in summary
    titles = [ax.get_title(loc="left") for ax in panel.figure.axes]
    assert titles == ["opt2: 2 commands per tile", "opt3: 10 commands per tile", "a1: 3 commands per tile"]
    panel.update(fixed=0)
    assert panel.state["dispatch"]["a1"] < panel.state["dispatch"]["opt3"]

    pair = CalibrationPanel(kv_len=512, variants=("opt2", "a1"), draw=False)
    assert pair.state["gate"] is None and pair.ratio_text().startswith("no headline ratio")
    assert [g["rule"] for g in pair.state["gates"]] == ["a1 > 2 x opt2"]
    assert "a1 > 2 x opt2" in pair.summary_html()
    for bad in (("opt2",), ("opt2", "nope"), ("opt2", "opt2")):
        with pytest.raises(kbwork.ValidationError, match="variant"):
            CalibrationPanel(kv_len=512, variants=bad, draw=False)


def test_measured_h200_fit_matches_its_readme():
    fit = fit_dispatch(load_measured("h200_kernel_launch_cost"))
    assert fit.fixed == pytest.approx(0.531, abs=5e-4)
    assert fit.r == pytest.approx(1.07e-5, rel=0.02)
    fixed_c, r_c = fit.in_cycles(1.98)
    assert round(fixed_c) == 1051 and r_c == pytest.approx(0.021, abs=5e-4)
    with pytest.raises(kbwork.ValidationError, match="no measured table"):
        load_measured("nope")


def test_h200_fit_over_the_sizes_pe_commands_use_in_pe_cycles():
    h200 = load_measured("h200_kernel_launch_cost")
    fit = fit_dispatch(h200, bytes_range=PE_COMMAND_BYTES)
    assert list(fit.arg_bytes) == [64, 256, 512, 1024]   # 8 B is below the range, 2 KiB and up above it
    assert np.abs(fit.residuals).max() < 2e-3              # flat there: the line is within 2 ns
    fixed_pe, r_pe = fit.in_cycles(kbwork.load_topology().clock_ghz)   # the PE's 1.25 GHz
    assert round(fixed_pe) == 663 and r_pe == pytest.approx(0.036, abs=5e-4)
    assert "over 64-1024 B" in repr(fit)
    with pytest.raises(kbwork.ValidationError, match="at least two points with arg_bytes in 2000-3000"):
        fit_dispatch(h200, bytes_range=(2000, 3000))
    with pytest.raises(kbwork.ValidationError, match="low <= high"):
        fit_dispatch(h200, bytes_range=(1024, 24))
    with pytest.raises(kbwork.ValidationError, match="clock_ghz must be a positive number"):
        fit.in_cycles(0)
