"""Every plot refuses a bad argument with a ValidationError that names it and says what to pass, before it
draws anything; the good values of the same arguments still draw."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import math  # noqa: E402
import types  # noqa: E402
import warnings  # noqa: E402

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from kbwork import KbworkError, ValidationError, analysis, decode, plots  # noqa: E402

from test_device import two_loads  # noqa: E402  (tests/ is on sys.path)


@pytest.fixture(scope="module")
def ctx():
    """What the calls below draw: a run and its op_log, a comparison, a device run and the tables plots take."""
    dr = decode.run("opt2", kv_len=512, mode="timing")
    cmp = decode.compare(kv_len=512, mode="timing")
    ol = dr.run.op_log
    # decode.sweep's layout: the axes, then variant, cycles, ...
    sweep = pd.DataFrame({"kv_len": [256, 256, 512, 512], "tile": 128, "variant": ["opt2", "opt3"] * 2,
                          "cycles": [100, 120, 200, 230], "dispatch_total": [10, 30, 20, 60]})
    idx = pd.MultiIndex.from_product([[0, 40], [64, 128], [1024, 4096]], names=["fixed_cycles", "tile", "kv_len"])
    return types.SimpleNamespace(
        dr=dr, run=dr.run, ol=ol, cmp=cmp, dev=two_loads(40, stagger=100),
        util=analysis.utilization_over_time(ol, bins=20),
        grid=analysis.ratio_grid(cmp.opt2.command_bytes_per_tile, cmp.opt3.command_bytes_per_tile,
                                 fixed_values=[0, 40, 80], r_values=[0.0, 0.0625, 0.125]),
        explained=analysis.explain_all(cmp), sweep=sweep,
        ratios=pd.Series(np.linspace(1.02, 1.20, len(idx)), index=idx),
        winners=analysis.winners(sweep))


AX = r"ax must be a matplotlib Axes \(or None for a new figure\)"
CLOCK = r"clock_ghz must be None or a positive finite real number"
HATCH = r"hatch must be None or a mapping of tensor base name \(str\) -> matplotlib hatch pattern \(str\)"
TILES = r"tiles must be an iterable of tile numbers \(ints\): pass \[3\] or range\(3\)"

# (id, call of the ctx fixture, what the message must say: the function and the argument)
CASES = [
    # gantt
    ("gantt-ax-str", lambda c: plots.gantt(c.ol, ax="ax"), f"gantt: {AX}"),
    ("gantt-clock-str", lambda c: plots.gantt(c.ol, clock_ghz="x"), f"gantt: {CLOCK}.*got 'x'"),
    ("gantt-clock-0", lambda c: plots.gantt(c.ol, clock_ghz=0), f"gantt: {CLOCK}.*got 0"),
    ("gantt-clock-neg", lambda c: plots.gantt(c.ol, clock_ghz=-1), f"gantt: {CLOCK}.*got -1"),
    ("gantt-clock-nan", lambda c: plots.gantt(c.ol, clock_ghz=math.nan), f"gantt: {CLOCK}"),
    ("gantt-clock-inf", lambda c: plots.gantt(c.ol, clock_ghz=math.inf), f"gantt: {CLOCK}"),
    ("gantt-clock-bool", lambda c: plots.gantt(c.ol, clock_ghz=True), f"gantt: {CLOCK}"),
    ("gantt-hatch-str", lambda c: plots.gantt(c.ol, hatch="x"), f"gantt: {HATCH}"),
    ("gantt-hatch-int-pattern", lambda c: plots.gantt(c.ol, hatch={"V": 5}), f"gantt: {HATCH}.*'V': 5"),
    ("gantt-hatch-int-name", lambda c: plots.gantt(c.ol, hatch={5: "//"}), f"gantt: {HATCH}"),
    ("gantt-hatch-bad-pattern", lambda c: plots.gantt(c.ol, hatch={"V": "abc"}),
     r"gantt: hatch\['V'\] = 'abc' is not a matplotlib hatch pattern"),
    ("gantt-dpi-neg", lambda c: plots.gantt(c.ol, dpi=-5), r"gantt: dpi must be None or a positive finite real"),
    ("gantt-dpi-str", lambda c: plots.gantt(c.ol, dpi="x"), r"gantt: dpi must be None or a positive"),
    ("gantt-legend", lambda c: plots.gantt(c.ol, legend="no"), r"gantt: legend must be True or False"),
    ("gantt-window", lambda c: plots.gantt(c.ol, window=(5, 1)), r"gantt: window=\(5, 1\) is empty"),
    ("gantt-holds", lambda c: plots.gantt(c.ol, holds=5), r"gantt: holds must be a DataFrame"),
    # gantt_or_utilization
    ("gou-none", lambda c: plots.gantt_or_utilization(None), r"gantt_or_utilization: expected an op_log"),
    ("gou-ax", lambda c: plots.gantt_or_utilization(c.ol, ax="ax"), f"gantt_or_utilization: {AX}"),
    ("gou-dpi-str", lambda c: plots.gantt_or_utilization(c.ol, dpi="x"), r"gantt_or_utilization: dpi must be"),
    ("gou-dpi-0", lambda c: plots.gantt_or_utilization(c.ol, dpi=0), r"gantt_or_utilization: dpi must be"),
    ("gou-max-bins-0", lambda c: plots.gantt_or_utilization(c.ol, max_bins=0),
     r"gantt_or_utilization: max_bins must be None or a positive int"),
    ("gou-max-bins-neg", lambda c: plots.gantt_or_utilization(c.ol, max_bins=-1), r"max_bins must be None or a"),
    ("gou-max-bins-float", lambda c: plots.gantt_or_utilization(c.ol, max_bins=2.5), r"max_bins must be None or a"),
    ("gou-max-bins-bool", lambda c: plots.gantt_or_utilization(c.ol, max_bins=True), r"max_bins must be None or a"),
    ("gou-clock", lambda c: plots.gantt_or_utilization(c.ol, clock_ghz=-1), f"gantt_or_utilization: {CLOCK}"),
    ("gou-window", lambda c: plots.gantt_or_utilization(c.ol, window="x"), r"gantt_or_utilization: window="),
    ("gou-unknown-option", lambda c: plots.gantt_or_utilization(c.ol, colour="red"),
     r"gantt_or_utilization: unknown option\(s\) 'colour'"),
    # options for gantt are checked even where the plot turns out to be utilisation (a tiny dpi: too dense)
    ("gou-dense-hatch", lambda c: plots.gantt_or_utilization(c.ol, dpi=1, hatch="x"), f"gantt_or_utilization: {HATCH}"),
    # utilization_over_time
    ("uot-op-log", lambda c: plots.utilization_over_time(c.ol),
     r"utilization_over_time: util must be analysis\.utilization_over_time\(op_log, bins=\.\.\.\) output .*not an "
     r"op_log; pass analysis\.utilization_over_time\(op_log\)"),
    ("uot-none", lambda c: plots.utilization_over_time(None), r"utilization_over_time: util must be"),
    ("uot-strings", lambda c: plots.utilization_over_time(pd.DataFrame({"PE_CPU": ["a", "b"]})),
     r"utilization_over_time: util must be .*'PE_CPU' do not hold numbers"),
    ("uot-end-str", lambda c: plots.utilization_over_time(c.util, end="x"),
     r"utilization_over_time: end must be None or a positive finite real"),
    ("uot-end-neg", lambda c: plots.utilization_over_time(c.util, end=-5), r"utilization_over_time: end must be"),
    ("uot-end-before-last-bin", lambda c: plots.utilization_over_time(c.util, end=1),
     r"utilization_over_time: end=1 must come after the last bin's start"),
    ("uot-clock", lambda c: plots.utilization_over_time(c.util, clock_ghz=0), f"utilization_over_time: {CLOCK}"),
    ("uot-ax", lambda c: plots.utilization_over_time(c.util, ax=5), f"utilization_over_time: {AX}"),
    ("uot-colorbar", lambda c: plots.utilization_over_time(c.util, colorbar="yes"), r"colorbar must be True or False"),
    # compare_gantt
    ("cg-clock-str", lambda c: plots.compare_gantt(c.cmp, clock_ghz="bogus"),
     r"compare_gantt: clock_ghz must be None, 'auto' or a positive finite real number"),
    ("cg-clock-0", lambda c: plots.compare_gantt(c.cmp, clock_ghz=0), r"compare_gantt: clock_ghz must be"),
    ("cg-tiles-str", lambda c: plots.compare_gantt(c.cmp, tiles="x"), r"compare_gantt: tiles must be a positive int"),
    ("cg-tiles-0", lambda c: plots.compare_gantt(c.cmp, tiles=0), r"compare_gantt: tiles must be a positive int"),
    ("cg-tiles-bool", lambda c: plots.compare_gantt(c.cmp, tiles=True), r"compare_gantt: tiles must be a positive"),
    ("cg-hatch", lambda c: plots.compare_gantt(c.cmp, hatch="x"), f"compare_gantt: {HATCH}"),
    ("cg-dpi", lambda c: plots.compare_gantt(c.cmp, dpi=-1), r"compare_gantt: dpi must be"),
    ("cg-holds", lambda c: plots.compare_gantt(c.cmp, holds="yes"), r"compare_gantt: holds must be True or False"),
    # tile_window, commands_per_tile, too_dense
    ("tile-window-int", lambda c: plots.tile_window(c.ol, 3), f"tile_window: {TILES}"),
    ("tile-window-str", lambda c: plots.tile_window(c.ol, "12"), f"tile_window: {TILES}"),
    ("tile-window-float", lambda c: plots.tile_window(c.ol, [1.5]), f"tile_window: {TILES}; 1.5 is not an int"),
    ("commands-per-tile", lambda c: plots.commands_per_tile(None), r"commands_per_tile: expected an op_log"),
    ("too-dense-width", lambda c: plots.too_dense(c.ol, None, -1), r"too_dense: width_px must be a positive"),
    ("too-dense-op-log", lambda c: plots.too_dense(None, None, 100), r"too_dense: expected an op_log"),
    # dispatch_per_tile
    ("dispatch-tile-str", lambda c: plots.dispatch_per_tile(c.cmp, tile="x"),
     r"dispatch_per_tile: tile must be a non-negative int"),
    ("dispatch-tile-neg", lambda c: plots.dispatch_per_tile(c.cmp, tile=-1), r"dispatch_per_tile: tile must be"),
    ("dispatch-ax", lambda c: plots.dispatch_per_tile(c.cmp, ax=5), f"dispatch_per_tile: {AX}"),
    ("dispatch-not-op-log", lambda c: plots.dispatch_per_tile({"a": pd.DataFrame({"x": [1]})}),
     r"dispatch_per_tile: a: the DataFrame has no column\(s\)"),
    # attribution, what_if
    ("attribution-ax", lambda c: plots.attribution(c.explained, ax=5), f"attribution: {AX}"),
    ("attribution-legend", lambda c: plots.attribution(c.explained, legend=1), r"attribution: legend must be True"),
    ("attribution-by", lambda c: plots.attribution(c.explained, by=["cause"]), r"attribution: by=\['cause'\]"),
    ("what-if-ax", lambda c: plots.what_if(analysis.what_if(c.run, speedup=2), ax="ax"), f"what_if: {AX}"),
    # sweeps
    ("scaling-ax", lambda c: plots.scaling(c.sweep, ax=5), f"scaling: {AX}"),
    ("scaling-x", lambda c: plots.scaling(c.sweep, x=["kv_len"]), r"scaling: x must be the name of a sweep column"),
    ("scaling-baseline", lambda c: plots.scaling(c.sweep, baseline="opt9"),
     r"scaling: baseline 'opt9' is not in the sweep \(variants: opt2, opt3\)"),
    ("cycles-bars-baseline", lambda c: plots.cycles_bars(c.sweep, group="kv_len", baseline="opt9"),
     r"cycles_bars: baseline 'opt9' is not in the sweep \(variants: opt2, opt3\)"),
    ("cycles-bars-none", lambda c: plots.cycles_bars(None), r"cycles_bars: expected a non-empty decode\.sweep\(\)"),
    ("cycles-bars-ax", lambda c: plots.cycles_bars(c.sweep, group="kv_len", ax=5), f"cycles_bars: {AX}"),
    ("cycles-bars-group", lambda c: plots.cycles_bars(c.sweep, group=["kv_len"]), r"cycles_bars: group must be"),
    ("cycles-bars-order", lambda c: plots.cycles_bars(c.sweep, group="kv_len", order=5), r"cycles_bars: order must"),
    # gate_map
    ("gate-map-op-log", lambda c: plots.gate_map(c.ol),
     r"gate_map: grid must be analysis\.ratio_grid\(\.\.\.\) output .*not an op_log"),
    ("gate-map-labels", lambda c: plots.gate_map(pd.DataFrame({"a": [1.0]}, index=[0])),
     r"gate_map: grid must be .*columns must be labelled with numbers"),
    ("gate-map-threshold-str", lambda c: plots.gate_map(c.grid, threshold="x"),
     r"gate_map: threshold must be a positive finite real"),
    ("gate-map-threshold-neg", lambda c: plots.gate_map(c.grid, threshold=-1), r"gate_map: threshold must be"),
    ("gate-map-threshold-0", lambda c: plots.gate_map(c.grid, threshold=0), r"gate_map: threshold must be"),
    ("gate-map-ax", lambda c: plots.gate_map(c.grid, ax=5), f"gate_map: {AX}"),
    # ratio_heatmaps, winner_map, ratio_norm
    ("heatmaps-none", lambda c: plots.ratio_heatmaps(None, facet="fixed_cycles", row="tile", col="kv_len"),
     r"ratio_heatmaps: ratios must be a non-empty pandas Series of numbers.*got NoneType"),
    ("heatmaps-frame", lambda c: plots.ratio_heatmaps(c.ratios.to_frame(), facet="fixed_cycles", row="tile",
                                                      col="kv_len"), r"ratio_heatmaps: ratios must be .*DataFrame"),
    ("heatmaps-strings", lambda c: plots.ratio_heatmaps(c.ratios.astype(str), facet="fixed_cycles", row="tile",
                                                        col="kv_len"), r"ratio_heatmaps: ratios must be .*got a Series of"),
    ("heatmaps-facet", lambda c: plots.ratio_heatmaps(c.ratios, facet=5, row="tile", col="kv_len"),
     r"ratio_heatmaps: facet must be an index level name or a list of them"),
    ("heatmaps-row", lambda c: plots.ratio_heatmaps(c.ratios, facet="fixed_cycles", row=["tile"], col="kv_len"),
     r"ratio_heatmaps: row must be an index level name"),
    ("heatmaps-center", lambda c: plots.ratio_heatmaps(c.ratios, facet="fixed_cycles", row="tile", col="kv_len",
                                                       center="x"), r"ratio_heatmaps: center must be a finite real"),
    ("heatmaps-cmap", lambda c: plots.ratio_heatmaps(c.ratios, facet="fixed_cycles", row="tile", col="kv_len",
                                                     cmap="bogus"), r"ratio_heatmaps: cmap='bogus' is not a"),
    ("heatmaps-fmt", lambda c: plots.ratio_heatmaps(c.ratios, facet="fixed_cycles", row="tile", col="kv_len",
                                                    fmt=5), r"ratio_heatmaps: fmt=5 must be a format string"),
    ("heatmaps-fmt-key", lambda c: plots.ratio_heatmaps(c.ratios, facet="fixed_cycles", row="tile", col="kv_len",
                                                        fmt="{x}"), r"ratio_heatmaps: fmt='\{x\}' must be"),
    ("winner-map-facet", lambda c: plots.winner_map(c.winners, row="tile", col="kv_len", facet_col=5),
     r"winner_map: facet_col must be an index level name"),
    ("ratio-norm-values", lambda c: plots.ratio_norm("x"), r"ratio_norm: values must be numbers"),
    ("ratio-norm-center", lambda c: plots.ratio_norm([1.0], center=None), r"ratio_norm: center must be"),
    # small helpers
    ("text-color", lambda c: plots.text_color("nope"), r"text_color: fill='nope' is not a matplotlib colour"),
    ("cycle-axis", lambda c: plots.cycle_axis(plt.figure().add_subplot()),
     r"cycle_axis: axis must be a matplotlib Axis \(ax\.xaxis or ax\.yaxis\)"),
    ("describe", lambda c: plots.describe(None), r"describe: params must be a mapping"),
    ("axis-label", lambda c: plots.axis_label(["kv_len"]), r"axis_label: name must be"),
    ("facet-title", lambda c: plots.facet_title({}, 1), r"facet_title: name must be"),
    # device_gantt, default_pes
    ("device-pes-twice", lambda c: plots.device_gantt(c.dev, pes=[0, 0]),
     r"device_gantt: pes=\[0, 0\] lists PE 0 more than once"),
    ("device-pes-bool", lambda c: plots.device_gantt(c.dev, pes=[True]),
     r"device_gantt: pes=\[True\]; each PE must be an int \(not a bool\)"),
    ("device-pes-float", lambda c: plots.device_gantt(c.dev, pes=[0, 1.0]), r"each PE must be an int"),
    ("device-pes-missing", lambda c: plots.device_gantt(c.dev, pes=[7]), r"device_gantt: PE 7 ran nothing"),
    ("device-clock-0", lambda c: plots.device_gantt(c.dev, clock_ghz=0), f"device_gantt: {CLOCK}"),
    ("device-clock-neg", lambda c: plots.device_gantt(c.dev, clock_ghz=-1), f"device_gantt: {CLOCK}"),
    ("device-dpi", lambda c: plots.device_gantt(c.dev, dpi="x"), r"device_gantt: dpi must be"),
    ("device-hatch", lambda c: plots.device_gantt(c.dev, hatch=["V"]), f"device_gantt: {HATCH}"),
    ("device-channels", lambda c: plots.device_gantt(c.dev, channels="yes"), r"device_gantt: channels must be True"),
    ("device-holds", lambda c: plots.device_gantt(c.dev, holds=1), r"device_gantt: holds must be True or False"),
    ("device-window", lambda c: plots.device_gantt(c.dev, window=(10, 10)), r"device_gantt: window=\(10, 10\)"),
    ("default-pes-n", lambda c: plots.device.default_pes(c.dev, 0), r"default_pes: n must be a positive int"),
    ("default-pes-run", lambda c: plots.device.default_pes(None), r"default_pes takes a Run"),
]


@pytest.mark.parametrize("call, match", [pytest.param(f, m, id=i) for i, f, m in CASES])
def test_a_bad_argument_is_refused_by_name_before_anything_is_drawn(ctx, call, match):
    before = set(plt.get_fignums())
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # refused, not drawn with a warning
        with pytest.raises(ValidationError, match=match) as info:
            call(ctx)
    assert isinstance(info.value, KbworkError)
    new = set(plt.get_fignums()) - before
    # cycle_axis' case makes its own figure to pass an Axes; no call makes one of its own before refusing
    assert len(new) <= (1 if "cycle_axis" in match else 0)


def test_good_values_of_the_checked_arguments_still_draw(ctx):
    ol, cmp = ctx.ol, ctx.cmp
    for clock in (None, 1, np.float64(1.25), 2.5):
        ax = plots.gantt(ol, clock_ghz=clock, dpi=np.float32(100))
        assert (len(ax.child_axes) == 1) == (clock is not None)  # the µs axis
        plt.close("all")
    for hatch in (None, {}, {"V": "xx"}, plots.TENSOR_HATCH):
        plots.gantt(ol, hatch=hatch, legend=np.bool_(False))
        plt.close("all")
    assert plots.tile_window(ol, np.arange(2)) == plots.tile_window(ol, range(2)) == plots.tile_window(ol, [0, 1])
    for clock in ("auto", None, 2):
        assert len(plots.compare_gantt(cmp, tiles=np.int64(2), clock_ghz=clock).axes) >= 2
        plt.close("all")
    ax = plots.utilization_over_time(ctx.util, end=float(ctx.ol["end"].max()), clock_ghz=None, colorbar=False)
    assert ax.get_xlim()[1] == float(ctx.ol["end"].max())
    ax = plots.gantt_or_utilization(ol, dpi=1, max_bins=5, holds=ctx.run.holds())
    assert ax.get_gid() == "utilization"
    assert plots.gantt_or_utilization(ol, window=plots.tile_window(ol, [1]), legend=False).get_gid() == "gantt"
    plots.cycles_bars(ctx.sweep, group="kv_len", baseline="opt3", order=[512, 256])
    no_opt2 = ctx.sweep[ctx.sweep.variant != "opt2"]   # no baseline named: opt2's ratios when it is there
    labels = [t.get_text() for t in plots.cycles_bars(no_opt2, group="kv_len").get_xticklabels()]
    assert labels and not any("/" in t for t in labels)
    plots.scaling(ctx.sweep, baseline="opt3")
    plots.scaling(ctx.sweep, kind="cycles", baseline="anything: cycles divide by nothing")
    plots.gate_map(ctx.grid, threshold=np.float64(1.5))
    plots.ratio_heatmaps(ctx.ratios, facet=["fixed_cycles"], row="tile", col="kv_len", center=np.float64(1),
                         cmap=plt.get_cmap("RdBu"), fmt="{:.1%}")
    plots.dispatch_per_tile(cmp, tile=np.int64(1), ax=plt.figure().add_subplot())
    fig = plots.device_gantt(ctx.dev, pes=(1, 0), clock_ghz=np.float64(1.0), dpi=100, hatch=None)
    assert [ax.get_gid() for ax in fig.axes if ax.get_gid()][:2] == ["pe:0", "pe:1"]
    assert plots.device.default_pes(ctx.dev, np.int64(1)) == [1]
