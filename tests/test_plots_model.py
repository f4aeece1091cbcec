"""A model's decode step in pictures (notebook 06): the tokens/s plots with the physical bound, ping-pong's gain,
the variants, the per-head verdict under channel contention, and the step panel (its wiring driven without a
browser)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

import kbwork  # noqa: E402
from kbwork import ValidationError, plots  # noqa: E402
from kbwork import model as mdl  # noqa: E402
from kbwork.model_panel import StepPanel  # noqa: E402


# --- the plots ----------------------------------------------------------------------------------------
def _sweep(models=("llama-3-8b", "llama-3-70b"), x="context", xs=(1024, 4096, 32768), other=16):
    rows = []
    for m in models:
        for i, v in enumerate(xs):
            batch, context = (other, v) if x == "context" else (v, other)
            base = 1000.0 / (i + 1) / (1 if m == "llama-3-8b" else 4)
            for variant, placement, schedule, f in (("opt2", "ahbm", "serial", 0.5), ("opt3", "ahbm", "serial", 0.48),
                                                    ("opt2", "ahbm", "ping_pong", 0.55 + 0.1 * i),
                                                    ("-", "host", "serial", 0.9)):
                rows.append({"model": m, "batch": batch, "context": context, "variant": variant,
                             "placement": placement, "schedule": schedule, "seconds": batch / (base * f),
                             "tokens_per_s": base * f})
    df = pd.DataFrame(rows)
    mdl.sweeps.record_setup(df, "h200", "ahbm-device-v1")   # as model.sweep records its own
    return df


def _gids(ax, prefix):
    return {ln.get_gid(): ln for ln in ax.get_lines() if (ln.get_gid() or "").startswith(prefix)}


def test_tokens_per_s_draws_every_case_and_the_bounds_on_log_axes():
    sw = _sweep()
    one = sw[sw.model == "llama-3-8b"]
    ax = plots.tokens_per_s(one, "context")
    cases = _gids(ax, "case:")
    assert set(cases) == {"case:opt2 on AHBM, serial", "case:opt3 on AHBM, serial", "case:opt2 on AHBM, ping-pong",
                          "case:H200 alone"}
    line = cases["case:opt2 on AHBM, ping-pong"]
    assert list(line.get_xdata()) == [1024, 4096, 32768]
    assert list(line.get_ydata()) == pytest.approx(list(one[one.schedule == "ping_pong"].tokens_per_s))
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1k", "4k", "32k"]
    assert "context" in ax.get_xlabel() and "tokens/s" in ax.get_ylabel()
    assert "llama-3-8b" in ax.get_title(loc="left") and "batch 16" in ax.get_title(loc="left")
    # the H200 alone and AHBM serial bounds coincide at equal bandwidths: one line with both names
    bounds = _gids(ax, "bound:")
    assert set(bounds) == {"bound:host+ahbm_serial", "bound:ahbm"}
    xs = bounds["bound:ahbm"].get_xdata()
    assert xs[0] == 1024 and xs[-1] == 32768
    want = [mdl.physical_bound("llama-3-8b", [int(c)] * 16).tokens_per_s("ahbm") for c in xs]
    assert list(bounds["bound:ahbm"].get_ydata()) == pytest.approx(want)
    labels = ax.get_legend_handles_labels()[1]
    assert any(lab.startswith("bound, H200 alone = AHBM serial") for lab in labels)
    # every point lies below its bound
    for gid, case in cases.items():
        kind = "host+ahbm_serial" if "ping-pong" not in gid else "ahbm"
        b = bounds[f"bound:{kind}"]
        assert (case.get_ydata() <= np.interp(case.get_xdata(), b.get_xdata(), b.get_ydata()) * (1 + 1e-9)).all()
    # other bandwidths: the serial bound parts from the H200's
    ax = plots.tokens_per_s(one, "context", device=mdl.load_device(channel_bytes_per_cycle=80), bounds=True)
    assert set(_gids(ax, "bound:")) == {"bound:host", "bound:ahbm_serial", "bound:ahbm"}
    assert not _gids(plots.tokens_per_s(one, "context", bounds=False), "bound:")


def test_tokens_per_s_against_batch_and_a_case_missing_points_breaks_its_line():
    sw = _sweep(x="batch", xs=(1, 4, 16), other=32768)
    one = sw[(sw.model == "llama-3-70b") & ~((sw.variant == "opt3") & (sw.batch == 4))]
    ax = plots.tokens_per_s(one, "batch")
    opt3 = _gids(ax, "case:")["case:opt3 on AHBM, serial"]
    assert list(opt3.get_xdata()) == [1, 4, 16] and np.isnan(opt3.get_ydata()[1])
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "4", "16"] and "batch" in ax.get_xlabel()
    assert "context 32k" in ax.get_title(loc="left")
    assert list(_gids(ax, "bound:")["bound:ahbm"].get_xdata()) == list(range(1, 17))


def test_tokens_per_s_refuses_frames_it_cannot_draw():
    sw = _sweep()
    with pytest.raises(ValidationError, match="'model'"):
        plots.tokens_per_s(sw, "context")
    with pytest.raises(ValidationError, match="'batch'"):
        plots.tokens_per_s(pd.concat([sw, sw.assign(batch=4)])[lambda d: d.model == "llama-3-8b"], "context")
    with pytest.raises(ValidationError, match="x="):
        plots.tokens_per_s(sw, "tile")
    with pytest.raises(ValidationError, match="columns"):
        plots.tokens_per_s(sw.drop(columns="schedule"))


@pytest.mark.parametrize("draw", [
    lambda sw, ax: plots.tokens_per_s(sw[sw.model == "llama-3-8b"], "context", ax=ax),
    lambda sw, ax: plots.ping_pong_gain(sw, "context", ax=ax),
    lambda sw, ax: plots.variant_ratio(sw, "context", ax=ax),
], ids=["tokens_per_s", "ping_pong_gain", "variant_ratio"])
def test_the_model_plots_refuse_an_ax_that_is_not_an_axes_by_name(draw):
    sw = _sweep()
    for bad in ("ax", 5):
        with pytest.raises(ValidationError, match=r"plots\.\w+: ax must be a matplotlib Axes"):
            draw(sw, bad)
    ax = plt.figure().add_subplot()
    assert draw(sw, ax) is ax


def test_tokens_per_s_grid_has_a_panel_per_model_one_legend_and_says_the_device_and_host():
    fig = plots.tokens_per_s_grid(_sweep(), "context")
    titles = [a.get_title(loc="left").split(",")[0] for a in fig.axes]
    assert len(fig.axes) == 2 and titles == ["llama-3-8b", "llama-3-70b"]
    assert len(fig.legends) == 1
    assert any(t.get_text().startswith("bound, AHBM overlapped") for t in fig.legends[0].get_texts())
    assert "96 PEs" in fig._suptitle.get_text() and "h200" in fig._suptitle.get_text()
    with pytest.raises(ValidationError, match="facet"):
        plots.tokens_per_s_grid(_sweep(), facet="host")


OTHER = dict(pes=48, hbm_channels=48, channel_bytes_per_cycle=20)


def _bound_y(ax, gid="bound:ahbm"):
    line = _gids(ax, "bound:")[gid]
    return line.get_xdata(), line.get_ydata()


def test_tokens_per_s_draws_the_bound_of_the_device_the_sweep_ran_on():
    dev = mdl.load_device(**OTHER)
    sw = mdl.sweep(context=[512, 2048], batch=2, variants=("opt2",), placements=("ahbm", "host"),
                   schedules=("serial", "ping_pong"), device=dev, host={"hbm_tb_s": 6.0}, workers=1,
                   progress=False)
    xs, ys = _bound_y(plots.tokens_per_s(sw, "context"))
    want = [mdl.physical_bound("llama-3-8b", [int(c)] * 2, host={"hbm_tb_s": 6.0}, device=dev).tokens_per_s("ahbm")
            for c in xs]
    assert list(ys) == pytest.approx(want)
    default = [mdl.physical_bound("llama-3-8b", [int(c)] * 2).tokens_per_s("ahbm") for c in xs]
    assert not np.allclose(ys, default)                      # not the default device's any more
    # given, device= and host= are drawn instead of the record
    _, given = _bound_y(plots.tokens_per_s(sw, "context", device="ahbm-device-v1", host="h200"))
    assert list(given) == pytest.approx(default)
    fig = plots.tokens_per_s_grid(sw, "context")
    assert "48 PEs on 48 channels x 20 B/cycle" in fig._suptitle.get_text()
    assert "6 TB/s" in fig._suptitle.get_text()


def test_a_frame_that_records_no_device_is_drawn_at_the_default_device_unless_told():
    one = _sweep()[lambda d: d.model == "llama-3-8b"]
    one.attrs = {}
    xs, ys = _bound_y(plots.tokens_per_s(one, "context"))
    default = [mdl.physical_bound("llama-3-8b", [int(c)] * 16).tokens_per_s("ahbm") for c in xs]
    assert list(ys) == pytest.approx(default)
    plots.tokens_per_s_grid(one, "context")
    assert not _gids(plots.tokens_per_s(one, "context", bounds=False), "bound:")
    xs, ys = _bound_y(plots.tokens_per_s(one, "context", device=mdl.load_device(**OTHER)))
    want = [mdl.physical_bound("llama-3-8b", [int(c)] * 16, **OTHER).tokens_per_s("ahbm") for c in xs]
    assert list(ys) == pytest.approx(want)


@pytest.mark.parametrize("column, values, kw", [
    ("channel_bytes_per_cycle", [80.0], dict(channel_bytes_per_cycle=80)),
    ("hbm_tb_s", [8.0], dict(host={"hbm_tb_s": 8.0})),
    ("clock_ghz", [2.5], dict(clock_ghz=2.5)),
])
def test_a_swept_bound_key_of_one_value_is_applied_over_the_recorded_device(column, values, kw):
    one = _sweep()[lambda d: d.model == "llama-3-8b"].assign(**{column: values[0]})
    xs, ys = _bound_y(plots.tokens_per_s(one, "context"))
    assert list(ys) == pytest.approx([mdl.physical_bound("llama-3-8b", [int(c)] * 16, **kw).tokens_per_s("ahbm")
                                      for c in xs])


def test_rows_of_several_values_of_a_bound_key_are_refused():
    one = _sweep()[lambda d: d.model == "llama-3-8b"]
    two = pd.concat([one.assign(channel_bytes_per_cycle=40.0), one.assign(channel_bytes_per_cycle=80.0)])
    with pytest.raises(ValidationError, match=r"the rows hold 2 values of 'channel_bytes_per_cycle' "
                                              r"\(\[40.0, 80.0\]\); the bound differs between them; select one"):
        plots.tokens_per_s(two, "context")
    # faceted by that key, each panel draws its own
    fig = plots.tokens_per_s_grid(two, "context", facet="channel_bytes_per_cycle")
    (_, y40), (_, y80) = (_bound_y(ax) for ax in fig.axes)
    assert len(fig.axes) == 2 and (y80 >= y40).all() and (y80 > y40).any()   # 80 B/cycle: a higher bound


def test_ping_pong_gain_is_ping_pong_over_serial_per_model():
    sw = _sweep()
    ax = plots.ping_pong_gain(sw, "context")
    lines = _gids(ax, "gain:")
    assert set(lines) == {"gain:llama-3-8b:opt2", "gain:llama-3-70b:opt2"}
    assert list(lines["gain:llama-3-8b:opt2"].get_ydata()) == pytest.approx([0.55 / 0.5, 0.65 / 0.5, 0.75 / 0.5])
    assert "ping-pong / serial" in ax.get_ylabel()
    with pytest.raises(ValidationError, match="both schedules"):
        plots.ping_pong_gain(sw[sw.schedule == "serial"], "context")


def test_variant_ratio_is_each_variant_over_the_baseline():
    ax = plots.variant_ratio(_sweep(), "context")
    lines = _gids(ax, "variant:")
    assert set(lines) == {"variant:llama-3-8b:opt3", "variant:llama-3-70b:opt3"}
    assert list(lines["variant:llama-3-70b:opt3"].get_ydata()) == pytest.approx([0.96] * 3)
    with pytest.raises(ValidationError, match="another variant"):
        plots.variant_ratio(_sweep()[lambda d: d.variant != "opt3"], "context")


def _contention_frame(ratios: dict[str, list[float]]) -> pd.DataFrame:
    rows = []
    for policy, rs in ratios.items():
        for k, r in enumerate(rs, start=1):
            rows += [(k, "opt2", 1000 * k, 500.0 * k, 0.5, policy), (k, "opt3", 1000 * k * r, 500.0 * k, 0.5, policy)]
    return pd.DataFrame(rows, columns=["pes_per_channel", "variant", "cycles", "channel_bound_cycles",
                                       "channel_busy", "hazard_policy"])


def test_contention_marks_where_the_verdict_flips_and_says_so_when_it_does_not():
    fig = plots.contention(_contention_frame({"strict_fifo": [1.1, 1.05, 1.02], "rw_aware": [0.8, 0.9, 1.1]}))
    assert fig.crossings["strict_fifo"] == []
    assert fig.crossings["rw_aware"] == [pytest.approx(2.5)]
    ax, ax2 = fig.axes
    labels = ax.get_legend_handles_labels()[1]
    assert "strict FIFO: opt2 faster at every k, no crossing" in labels
    assert "rw-aware: flips at k = 2.50" in labels
    assert any("verdict flips at k = 2.50" in t.get_text() for t in ax.texts)
    assert list(_gids(ax2, "bound:")["bound:channel"].get_ydata()) == [500.0, 1000.0, 1500.0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "2", "3"]
    one = plots.contention(_contention_frame({"x": [0.9, 0.95]}).drop(columns="hazard_policy"), by=None)
    assert one.crossings == {None: []}
    assert "opt3 faster at every k, no crossing" in one.axes[0].get_legend_handles_labels()[1]
    with pytest.raises(ValidationError, match="'a1'"):
        plots.contention(_contention_frame({"x": [1.0]}), other="a1")


# --- the panel ----------------------------------------------------------------------------------------
SMALL = dict(model="llama-3-8b", batch=2, context=1024)


def test_the_panel_runs_every_case_and_holds_each_to_its_bound():
    panel = StepPanel(**SMALL, variants=("opt2", "opt3"), draw=False)
    assert [c["label"] for c in panel.state["cases"]] == ["opt2 on AHBM, serial", "opt2 on AHBM, ping-pong",
                                                          "opt3 on AHBM, serial", "opt3 on AHBM, ping-pong",
                                                          "H200 alone"]
    s = mdl.step("llama-3-8b", [1024] * 2, variant="opt3", schedule="ping_pong")
    assert panel.state["tokens_per_s"]["opt3 on AHBM, ping-pong"] == pytest.approx(s.tokens_per_s)
    assert panel.state["pes"] == 96 and panel.figure is None
    for c in panel.state["cases"]:
        assert 0 < c["of_bound"] <= 1
    assert set(panel.state["bounds"]) == {"host", "ahbm_serial", "ahbm"}
    state = panel.update(pes_per_channel=2, channel_bytes_per_cycle=20, fixed_cycles=0)
    s = mdl.step("llama-3-8b", [1024] * 2, pes=192, hbm_channels=96, channel_bytes_per_cycle=20, fixed_cycles=0)
    assert state["pes"] == 192 and state["tokens_per_s"]["opt2 on AHBM, serial"] == pytest.approx(s.tokens_per_s)
    assert state["bounds"]["ahbm"] == pytest.approx(
        mdl.physical_bound("llama-3-8b", [1024] * 2, channel_bytes_per_cycle=20).tokens_per_s("ahbm"))
    assert "192 PEs (2 per channel)" in panel.setting_text() and "FIXED 0" in panel.setting_text()
    assert "H200 alone" in panel.summary_html()


def test_the_panel_prints_no_nonzero_rate_as_zero():
    # a starved channel: 0.00074 tokens/s must read as such, not as "0.0"
    panel = StepPanel(**SMALL, variants=("opt2",), schedules=("serial",), draw=False, channel_bytes_per_cycle=1e-5)
    rate = panel.state["tokens_per_s"]["opt2 on AHBM, serial"]
    assert 0 < rate < 0.01
    line = next(x for x in panel.summary_html().splitlines() if x.startswith("opt2 on AHBM"))
    assert f"{rate:.3g}" in line or f"{rate:.6f}".rstrip("0") in line
    assert " 0.0 " not in line and not line.split()[4].strip("0.") == ""


def test_the_panel_refuses_bad_values_and_keeps_the_last_good_setting():
    panel = StepPanel(**SMALL, variants=("opt2",), schedules=("serial",), draw=False)
    before = dict(panel.state)
    for kw, match in ((dict(pes_per_chanel=2), "unknown control"), (dict(channel_bytes_per_cycle=0), "positive"),
                      (dict(fixed_cycles=-1), "fixed_cycles"), (dict(batch=0), "batch"),
                      (dict(model="llama-9"), "llama-9")):
        with pytest.raises(kbwork.KbworkError, match=match):
            panel.update(**kw)
        assert panel.error and panel.state == before and "still showing" in panel.message_html()
    panel.update(batch=1)
    assert panel.error is None and panel.message_html() == ""
    with pytest.raises(ValidationError, match="schedules"):
        StepPanel(**SMALL, schedules="serial")
    with pytest.raises(ValidationError, match="opt9"):
        StepPanel(**SMALL, variants=("opt9",))


def test_moving_a_slider_recomputes_and_redraws_the_same_figure_in_place():
    W = pytest.importorskip("ipywidgets")
    panel = StepPanel(**SMALL, variants=("opt2",))
    box = panel.widget()
    fig, image = panel.figure, panel._widgets["figure"]
    assert isinstance(image, W.Image) and bytes(image.value).startswith(b"\x89PNG")
    bars = panel._artists["bars"]
    widths = [b.get_width() for b in bars]
    assert widths == pytest.approx([c["tokens_per_s"] for c in panel.state["cases"]])
    first_png = image.value
    panel._widgets["channel_bytes_per_cycle"].value = 8.0          # what letting go of the slider does
    assert panel.state["channel_bytes_per_cycle"] == 8.0
    new = [b.get_width() for b in bars]
    assert new[0] < widths[0] and new[-1] == pytest.approx(widths[-1])   # the device slows; the H200 does not
    assert new == pytest.approx([c["tokens_per_s"] for c in panel.state["cases"]])
    line = panel._artists["lines"]["ahbm"]
    assert line.get_xdata()[0] == pytest.approx(panel.state["bounds"]["ahbm"])
    assert bytes(image.value) != bytes(first_png) and panel.figure is fig and box is panel.widget()
    assert len(fig.axes) == 1 and len(fig.legends) == 1               # redrawn in place, nothing appended
    panel._widgets["pes_per_channel"].value = 2
    panel._widgets["fixed_cycles"].value = 100
    assert (panel.state["pes"], panel.state["fixed_cycles"]) == (192, 100)
    panel._widgets["context"].value = 4096
    assert panel.state["context"] == 4096 and "context 4k" in panel._artists["title"].get_text()
    assert "4k" in panel.summary_html() or "context 4k" in panel._widgets["summary"].value
    panel.update(batch=3)                                            # a call moves the controls too
    assert panel._widgets["batch"].value == 3 and panel.state["batch"] == 3
    panel.update(context=2000)
    assert panel._widgets["context"].value == 2000


# --- what does not fit is drawn hollow (DESIGN.md §15, "Capacity: what fits") -----------------------------
def test_a_point_that_does_not_fit_is_hollow_and_the_legend_says_so():
    from kbwork.plots.model import HOLLOW_LABEL

    # llama-3-70b on the device: batch 4 at 32k is 40 GiB of KV (fits), batch 16 160 GiB (does not)
    sw = mdl.sweep(model="llama-3-70b", batch=[4, 16], context=32768, variants=("opt2",),
                   schedules=("serial", "ping_pong"), progress=False, workers=1)
    assert list(sw.fits) == [True, True, False, False]
    ax = plots.tokens_per_s(sw, "batch")
    line = _gids(ax, "case:")["case:opt2 on AHBM, serial"]
    assert list(line.get_markevery()) == [0]                       # the filled marker: batch 4 only
    hollow = [x for x in ax.get_lines() if x.get_gid() == "case:opt2 on AHBM, serial:hollow"]
    assert len(hollow) == 1 and list(hollow[0].get_xdata()) == [16] and hollow[0].get_markerfacecolor() == "white"
    assert HOLLOW_LABEL in [t.get_text() for t in ax.get_legend().get_texts()]
    gain = plots.ping_pong_gain(sw, "batch")
    assert gain.hollow and HOLLOW_LABEL in [t.get_text() for t in gain.get_legend().get_texts()]
    fits_all = sw[sw.batch == 4]
    ax2 = plots.tokens_per_s(fits_all, "batch")
    assert HOLLOW_LABEL not in [t.get_text() for t in ax2.get_legend().get_texts()]


def test_the_panel_draws_a_case_that_does_not_fit_as_a_hollow_bar():
    from kbwork.model_panel import StepPanel

    panel = StepPanel(model="llama-3-70b", batch=1, context=32768, variants=("opt2",), schedules=("serial",))
    fits = {c["label"]: c["fits"] for c in panel.state["cases"]}
    assert fits == {"opt2 on AHBM, serial": True, "H200 alone": False}   # 131 + 10 GiB over the H200's 139
    bars = panel._artists["bars"]
    assert bars[0].get_fill() and not bars[1].get_fill()
    texts = [t.get_text() for t in panel.figure.legends[-1].get_texts()]
    assert any(t.startswith("hollow bar: does not fit") for t in texts)
    assert "does not fit" in panel.summary_html()
    panel.update(context=4096)                                          # now both fit: both filled again
    assert all(b.get_fill() for b in bars)
