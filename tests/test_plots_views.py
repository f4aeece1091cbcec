"""The pictures: each plot draws what it claims, fits in its figure, and takes any number of variants."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
from matplotlib.collections import LineCollection, PolyCollection  # noqa: E402
from matplotlib.text import Text  # noqa: E402

from kbwork import ValidationError, analysis, decode, plots  # noqa: E402
from kbwork.oplog import ENGINE_NAMES  # noqa: E402


@pytest.fixture(scope="module")
def cmp3():
    return decode.compare(kv_len=512, mode="timing", variants=("opt2", "opt3", "a1"))


@pytest.fixture(scope="module")
def rw():
    return decode.run("opt3", kv_len=512, mode="timing", hazard_policy="rw_aware")


def _by_gid(ax, gid):
    return [c for c in ax.collections if c.get_gid() == gid]


def _texts(fig):
    """Every non-empty text the figure draws: titles, labels, tick labels, legends, annotations."""
    fig.canvas.draw()
    out = [t for t in fig.texts if t.get_text()]
    if fig._suptitle is not None:
        out.append(fig._suptitle)
    axes = list(fig.axes)
    for ax in list(axes):
        axes.extend(ax.child_axes)
    for ax in axes:
        out += [ax.title, ax._left_title, ax._right_title, ax.xaxis.label, ax.yaxis.label]
        out += _drawn_tick_labels(ax.xaxis, 0) + _drawn_tick_labels(ax.yaxis, 1) + list(ax.texts)
        if ax.get_legend() is not None:
            out += list(ax.get_legend().get_texts())
    for leg in fig.legends:
        out += list(leg.get_texts())
    return [t for t in out if isinstance(t, Text) and t.get_visible() and t.get_text().strip()]


def _drawn_tick_labels(axis, i):
    """The tick labels matplotlib draws: those whose tick lies within the view (a locator may place more)."""
    lo, hi = sorted(axis.get_view_interval())
    return [t for t in axis.get_ticklabels() if lo - 1e-9 <= t.get_position()[i] <= hi + 1e-9]


def assert_nothing_clipped(fig):
    """Every text lies inside the figure (what a saved PNG shows), to within a pixel."""
    box = fig.bbox
    renderer = fig.canvas.get_renderer()
    for t in _texts(fig):
        e = t.get_window_extent(renderer)
        assert e.x0 >= box.x0 - 1 and e.x1 <= box.x1 + 1 and e.y0 >= box.y0 - 1 and e.y1 <= box.y1 + 1, \
            f"{t.get_text()!r} at {e} is outside the figure {box}"


def assert_integer_ticks(axis):
    assert axis.get_offset_text().get_text() == "", "an offset ('1e6') in the corner"
    labels = [t.get_text() for t in axis.get_ticklabels() if t.get_text()]
    assert labels
    for lab in labels:
        assert lab.replace(",", "").lstrip("−-").isdigit(), f"tick label {lab!r} is not a whole number"


# --- the Gantt ---------------------------------------------------------------------------------------------
def test_v_tiles_are_hatched_and_k_tiles_are_not(cmp3):
    log = cmp3.opt2.op_log
    ax = plots.gantt(log)
    hatched = [c for c in ax.collections if isinstance(c, PolyCollection) and c.get_hatch()]
    assert {c.get_gid() for c in hatched} == {"stages:PE_DMA:////", "stages:PE_GEMM:////"}
    base = log["tensor"].astype(str).str.rsplit("|", n=1).str[-1].str.split("[").str[0]
    moves = log["stage"].isin(["DMA_READ", "DMA_WRITE", "FETCH"])
    is_v = (moves & (base == "V")).to_numpy()
    assert sum(len(c.get_paths()) for c in hatched) == is_v.sum() == 2 * cmp3.opt2.n_tiles
    # the K tiles are in the plain DMA collection: as many K reads as tiles
    plain_dma = _by_gid(ax, "stages:PE_DMA")[0]
    k_reads = (log["stage"] == "DMA_READ") & (base == "K")
    assert len(plain_dma.get_paths()) == int(((log["engine"] == "PE_DMA") & ~pd.Series(is_v)).sum())
    assert int(k_reads.sum()) == cmp3.opt2.n_tiles
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "V tiles (hatched)" in labels
    assert not [c for c in plots.gantt(log, hatch=None).collections if c.get_hatch()]


def test_a_hold_marker_per_hold_on_the_held_command_s_row(rw):
    run = rw.run
    holds = run.holds()
    assert len(holds) > 5
    ax = plots.gantt(run.op_log, holds=holds)
    (coll,) = _by_gid(ax, "holds")
    segs = coll.get_segments()
    assert len(segs) == len(holds)
    np.testing.assert_array_equal([s[0][0] for s in segs], holds["plan_end"])
    np.testing.assert_array_equal([s[1][0] for s in segs], holds["release"])
    # each on the row of the unit that ran its command's first plan stage, within the row's band of bars
    log = run.op_log
    for (x, y), cmd in zip([s[0] for s in segs], holds["cmd"]):
        work = log[(log.cmd == cmd) & ~log.stage.isin(["DISPATCH", "PLAN"])].sort_values(["start", "seq"])
        row = ENGINE_NAMES.index(str(work.iloc[0].engine))
        assert row < y < row + 0.4
    # a window keeps the holds that overlap it
    lo, hi = plots.tile_window(log, [1])
    ax = plots.gantt(log, window=(lo, hi), holds=holds)
    inside = ((holds.release >= lo) & (holds.plan_end <= hi)).sum()
    assert len(_by_gid(ax, "holds")[0].get_segments()) == inside > 0


def test_the_critical_path_is_outlined_stage_by_stage_and_linked_where_it_changes_unit(rw):
    run = rw.run
    cp = run.critical_path()
    ax = plots.gantt(run.op_log, critical_path=cp)
    (outline,) = _by_gid(ax, "critical-path")
    assert len(outline.get_paths()) == len(cp)
    (links,) = _by_gid(ax, "critical-path-links")
    changes = (cp["engine"].astype(str).to_numpy()[1:] != cp["engine"].astype(str).to_numpy()[:-1])
    assert len(links.get_segments()) == int(changes.sum())
    # each link stands at the start of the stage it leads to, coloured by that stage's cause
    starts = cp["start"].to_numpy()[1:][changes]
    assert [s[0][0] for s in links.get_segments()] == list(starts)
    colors = [matplotlib.colors.to_hex(c) for c in links.get_colors()]
    causes = cp["cause"].astype(str).to_numpy()[1:][changes]
    assert colors == [plots.CAUSE_COLORS[c].lower() for c in causes]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "critical path" in labels and "  link: hazard" in labels


def test_gantt_rejects_what_is_not_holds_or_a_critical_path(cmp3):
    with pytest.raises(ValidationError, match="holds must be a DataFrame"):
        plots.gantt(cmp3.opt2.op_log, holds=[1, 2])
    with pytest.raises(ValidationError, match="critical path must be a DataFrame"):
        plots.gantt(cmp3.opt2.op_log, critical_path=cmp3.opt2.op_log.drop(columns="start"))


def test_cycle_ticks_are_whole_numbers_without_an_offset():
    r = decode.run("opt2", kv_len=65536, mode="timing")  # over a million cycles
    assert r.cycles > 1_000_000
    with pytest.warns(plots.DensityWarning):
        ax = plots.gantt(r.op_log, legend=False)
    ax.figure.canvas.draw()
    assert_integer_ticks(ax.xaxis)
    lo, hi = plots.tile_window(r.op_log, [400])  # a narrow window far from 0
    ax = plots.gantt(r.op_log, window=(lo, hi))
    ax.figure.canvas.draw()
    assert_integer_ticks(ax.xaxis)


def test_100k_stages_with_hatches_holds_and_a_path_stay_a_handful_of_collections():
    n = 100_000
    rng = np.random.default_rng(0)
    engines = np.array(ENGINE_NAMES)[rng.integers(0, 5, n)]
    stages = np.where(engines == "PE_DMA", "DMA_READ", "MATH")
    tensors = np.where(engines == "PE_DMA", np.where(rng.integers(0, 2, n) == 1, "V[0:128]", "K[0:128]"), "")
    start = np.arange(n) * 10
    log = pd.DataFrame({"seq": range(n), "cmd": np.arange(n) // 4, "iter": -1, "label": "x", "stage": stages,
                        "engine": engines, "op_kind": "", "phase": "tile", "tile": 0, "k_tile": 0,
                        "tensor": tensors, "bytes": 0, "ready": start, "start": start, "end": start + 7})
    holds = pd.DataFrame({"cmd": np.arange(0, n // 4, 3), "label": "x"})
    holds["plan_end"] = holds["cmd"] * 40
    holds["release"] = holds["plan_end"] + 25
    cp = log.iloc[::7].assign(cause=pd.Categorical(["dependency"] * len(log.iloc[::7])))
    _, ax = plt.subplots(figsize=(300, 3))  # wide enough for every stage: no DensityWarning, all drawn
    ax = plots.gantt(log, ax=ax, holds=holds, critical_path=cp)
    polys = [c for c in ax.collections if isinstance(c, PolyCollection)]
    lines = [c for c in ax.collections if isinstance(c, LineCollection)]
    assert len(polys) == 5 + 1 + 1  # a collection per unit, the hatched V reads, the path outline
    assert len(lines) == 2          # holds and path links
    assert sum(len(c.get_paths()) for c in polys if c.get_gid().startswith("stages")) == n


def test_a_run_gantt_names_its_run_and_keeps_every_label_inside_the_figure(tmp_path):
    from kbwork.cli import main

    path = tmp_path / "g.png"
    captured = {}
    orig = plots.gantt_or_utilization

    def spy(*args, **kw):
        captured["ax"] = ax = orig(*args, **kw)
        return ax

    mp = pytest.MonkeyPatch()
    mp.setattr(plots, "gantt_or_utilization", spy)
    mp.setattr(plt, "close", lambda *a, **k: None)  # keep the figure to look at after the CLI saved it
    try:
        assert main(["run", "--variant", "opt3", "--kv-len", "1024", "--mode", "timing", "--gantt", str(path)]) == 0
    finally:
        mp.undo()
    ax = captured["ax"]
    title = ax.get_title(loc="left")
    for part in ("opt3", "kv_len 1024", "FIXED 40", "R 0.0625", "strict_fifo", "3 of 8 tiles"):
        assert part in title
    assert ax.get_gid() == "gantt"
    assert_nothing_clipped(ax.figure)
    assert_integer_ticks(ax.xaxis)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert _by_gid(ax, "holds") and _by_gid(ax, "critical-path")


# --- several variants ----------------------------------------------------------------------------------------
def test_compare_gantt_draws_every_variant_of_a_comparison(cmp3):
    fig = plots.compare_gantt(cmp3, tiles=2, holds=True, critical_path=True)
    panels = [ax for ax in fig.axes if ax.get_gid() == "gantt"]
    assert len(panels) == 3
    titles = [ax.get_title(loc="left") for ax in panels]
    for ax, (v, r) in zip(panels, cmp3.runs.items()):
        title = ax.get_title(loc="left")
        assert title.startswith(f"{v} ({len(r.command_bytes_per_tile)} commands per tile)")
        assert f"{r.cycles:,} cycles" in title
        assert _by_gid(ax, "critical-path") and _by_gid(ax, "holds")
    assert "kv_len 512" in fig._suptitle.get_text() and "strict_fifo" in fig._suptitle.get_text()
    assert len(fig.legends) == 1 and len(set(titles)) == 3
    assert_nothing_clipped(fig)


def test_compare_gantt_takes_a_dict_and_the_old_two_op_log_call(cmp3):
    fig = plots.compare_gantt({"opt2": cmp3.opt2.op_log, "a1": cmp3.a1.op_log}, tiles=2)
    assert [ax.get_title(loc="left").split(" (")[0] for ax in fig.axes if ax.get_gid() == "gantt"] == ["opt2", "a1"]
    old = plots.compare_gantt(cmp3.opt2.op_log, cmp3.opt3.op_log, 2)
    assert [ax.get_title(loc="left") for ax in old.axes if ax.get_gid() == "gantt"] == [
        "opt2 (2 commands per tile): first 2 tiles", "opt3 (10 commands per tile): first 2 tiles"]
    with pytest.raises(ValidationError, match="need runs"):
        plots.compare_gantt({"opt2": cmp3.opt2.op_log}, critical_path=True)
    with pytest.raises(ValidationError, match="pass the second too"):
        plots.compare_gantt(cmp3.opt2.op_log)
    with pytest.raises(ValidationError, match="no variants"):
        plots.compare_gantt({})


def test_dispatch_per_tile_for_any_number_of_variants(cmp3):
    ax = plots.dispatch_per_tile(cmp3, tile=1)
    widths = [p.get_width() for p in ax.patches]
    assert sum(widths) == 103 + 425 + 143
    assert [t.get_text() for t in ax.get_yticklabels()] == ["opt2 (2 cmds)", "opt3 (10 cmds)", "a1 (3 cmds)"]
    title = ax.get_title(loc="left")
    assert "opt3 / opt2 = 4.13" in title and "a1 / opt2 = 1.39" in title
    old = plots.dispatch_per_tile(cmp3.opt2.op_log, cmp3.opt3.op_log, tile=1)
    assert sum(p.get_width() for p in old.patches) == 103 + 425
    two = plots.dispatch_per_tile({"opt3": cmp3.opt3.op_log, "a1": cmp3.a1.op_log}, tile=1)
    assert "a1 / opt3 = 0.34" in two.get_title(loc="left")


@pytest.mark.parametrize("width", [9.5, 6.0, 3.5])
def test_dispatch_bar_labels_stay_inside_their_bars(cmp3, width):
    fig, ax = plt.subplots(figsize=(width, 2.6), layout="constrained")
    plots.dispatch_per_tile(cmp3, tile=1, ax=ax)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    bars = list(ax.patches)
    labels = [t for t in ax.texts if t.get_text() and "cycles" not in t.get_text()]
    assert labels
    for t in labels:
        e = t.get_window_extent(renderer)
        x, y = e.x0 + e.width / 2, e.y0 + e.height / 2
        bar = next(b for b in bars if b.get_window_extent(renderer).contains(x, y))
        be = bar.get_window_extent(renderer)
        assert be.x0 <= e.x0 and e.x1 <= be.x1, f"{t.get_text()!r} overruns its bar"
    if width == 9.5:  # at the default size every command is named
        names = " ".join(t.get_text() for t in labels)
        assert "mul_bcast" in names and "exp_diff" in names


# --- long runs ---------------------------------------------------------------------------------------------
def test_utilization_over_time_plot_is_the_data():
    r = decode.run("opt3", kv_len=2048, mode="timing")
    util = analysis.utilization_over_time(r.op_log, bins=40)
    ax = plots.utilization_over_time(util, end=r.cycles)
    (mesh,) = [c for c in ax.collections if c.get_gid() == "utilization"]
    np.testing.assert_allclose(np.asarray(mesh.get_array()).reshape(len(util.columns), len(util)), util.T.to_numpy())
    assert [t.get_text() for t in ax.get_yticklabels()] == list(util.columns)
    assert ax.get_xlim() == (0.0, float(r.cycles))
    assert_integer_ticks(ax.xaxis)
    assert_nothing_clipped(ax.figure)
    with pytest.raises(ValidationError, match="utilization_over_time"):
        plots.utilization_over_time(util.iloc[:0])


def test_gantt_or_utilization_switches_when_a_row_has_more_stages_than_pixels():
    r = decode.run("opt3", kv_len=32768, mode="timing")
    log = r.op_log
    few = plots.tile_window(log, range(3))
    assert not plots.too_dense(log, few, 1000)
    assert plots.too_dense(log, None, 1000)
    assert plots.gantt_or_utilization(log, window=few).get_gid() == "gantt"
    ax = plots.gantt_or_utilization(log, dpi=120)
    assert ax.get_gid() == "utilization"
    assert "iteration" in ax.get_xlabel()  # bins hold whole tiles
    (mesh,) = [c for c in ax.collections if c.get_gid() == "utilization"]
    busy = np.asarray(mesh.get_array()).reshape(5, -1)
    # steady state: away from the start and the end, a periodic schedule's bins are equally busy
    mid = busy[:, 20:-20]
    assert np.ptp(mid, axis=1).max() < 1e-9


def test_the_cli_gantt_draws_utilization_when_the_tiles_hold_more_stages_than_pixels(tmp_path, capsys,
                                                                                    monkeypatch):
    from kbwork.cli import main

    from kbwork.plots import gantts  # where gantt_or_utilization finds it

    calls = []
    orig = plots.utilization_over_time
    monkeypatch.setattr(gantts, "utilization_over_time", lambda *a, **k: calls.append(1) or orig(*a, **k))
    path = tmp_path / "long.png"
    argv = ["run", "--variant", "opt3", "--kv-len", "32768", "--mode", "timing", "--gantt", str(path)]
    assert main(argv) == 0
    assert not calls and "utilisation" not in capsys.readouterr().err  # three tiles: a Gantt
    assert main(argv + ["--gantt-tiles", "all"]) == 0
    assert len(calls) == 1
    assert "draws utilisation over time instead" in capsys.readouterr().err
    assert path.stat().st_size > 0
    # compare --gantt switches per panel the same way
    assert main(["compare", "--kv-len", "32768", "--mode", "timing", "--gantt", str(path),
                 "--gantt-tiles", "all"]) == 0
    assert len(calls) == 3
    assert "draws utilisation over time instead" in capsys.readouterr().err


# --- where the time goes -----------------------------------------------------------------------------------
def test_attribution_bars_add_up_to_each_variant_s_cycles(cmp3):
    table = analysis.attribution_table(cmp3)
    for by in ("cause", "engine"):
        ax = plots.attribution(table, by=by)
        assert [t.get_text() for t in ax.get_yticklabels()] == list(cmp3.variants)
        for v, r in cmp3.runs.items():
            bars = [p for p in ax.patches if p.get_gid().startswith(f"attribution:{v}:")]
            assert sum(b.get_width() for b in bars) == r.cycles
            assert all(b.get_width() > 0 for b in bars)
        legend = [t.get_text() for t in ax.get_legend().get_texts()]
        names = table[(table.by == by) & (table.cycles > 0)]["name"].unique()
        assert sorted(legend) == sorted(names)
        assert by in ax.get_title(loc="left")
    fig = plots.attribution_figure(table, title="t")
    assert len([a for a in fig.axes if a.patches]) == 2
    assert_nothing_clipped(fig)
    # a dict name -> attribution draws the same bars
    ax2 = plots.attribution({v: analysis.attribution(r.run) for v, r in cmp3.runs.items()}, by="cause")
    assert [p.get_width() for p in ax2.patches] == [p.get_width() for p in plots.attribution(table).patches]
    with pytest.raises(ValidationError, match="by="):
        plots.attribution(table, by="unit")
    with pytest.raises(ValidationError, match="attribution_table"):
        plots.attribution(cmp3.opt2.op_log)


def test_what_if_bars_are_the_saved_share(cmp3):
    rows = [analysis.what_if(r, speedup=2).assign(variant=v) for v, r in cmp3.runs.items()]
    table = pd.concat(rows, ignore_index=True)
    ax = plots.what_if(table)
    widths = [p.get_width() for p in ax.patches]
    assert len(widths) == len(table)
    expected = [100 * (1 - row.cycles / row.baseline_cycles) for v in cmp3.variants
                for row in table[table.variant == v].itertuples()]
    np.testing.assert_allclose(widths, expected)
    assert "2x faster" in ax.get_title(loc="left")
    assert_nothing_clipped(ax.figure)
    with pytest.raises(ValidationError, match="analysis.what_if"):
        plots.what_if(table.drop(columns="cycles"))


def test_scaling_shows_the_ratio_and_cycles_bars_put_strict_fifo_first():
    sw = decode.sweep(kv_len=[256, 1024], hazard_policy=["rw_aware", "strict_fifo"], progress=False)
    strict = sw[sw.hazard_policy == "strict_fifo"]
    ax = plots.scaling(strict, title="ratio")
    ratio = strict[strict.variant == "opt3"].cycles.to_numpy() / strict[strict.variant == "opt2"].cycles.to_numpy()
    np.testing.assert_allclose(ax.lines[0].get_ydata(), ratio)
    lo, hi = ax.get_ylim()
    assert lo < 1 < hi and hi - lo < 0.5  # a few percent fills the height
    with pytest.raises(ValidationError, match="baseline"):
        plots.scaling(strict, baseline="b9")
    ax = plots.cycles_bars(sw[sw.kv_len == 1024])
    groups = [t.get_text().split("\n")[0] for t in ax.get_xticklabels()]
    assert groups == ["strict FIFO", "rw-aware"]  # in words, the default policy first
    assert ax.get_xlabel() == "hazard policy"
    heights = [p.get_height() for p in ax.patches]
    one = sw[sw.kv_len == 1024].set_index(["hazard_policy", "variant"]).cycles
    assert heights == [one["strict_fifo", "opt2"], one["rw_aware", "opt2"],
                       one["strict_fifo", "opt3"], one["rw_aware", "opt3"]]
    assert_integer_ticks(ax.yaxis)


def test_ratio_heatmaps_centre_the_colour_scale_on_one_with_both_sides_visible():
    idx = pd.MultiIndex.from_product([[0, 40], [64, 128], [1024, 4096]], names=["fixed_cycles", "tile", "kv_len"])
    ratios = pd.Series(np.linspace(1.02, 1.20, len(idx)), index=idx)
    fig = plots.ratio_heatmaps(ratios, facet="fixed_cycles", row="tile", col="kv_len", label="r")
    images = [a.images[0] for a in fig.axes if a.images]
    assert len(images) == 2
    norm = images[0].norm
    # as far below 1 as above: the largest ratio is saturated, and 1 is white in the middle of the bar
    assert norm.vcenter == 1.0 and norm.vmax == pytest.approx(1.20) and norm.vmin == pytest.approx(0.80)
    assert norm(1.20) == pytest.approx(1.0) and norm(1.0) == pytest.approx(0.5) and norm(1.02) > 0.5
    (cbar,) = [a for a in fig.axes if not a.images]
    lo, hi = cbar.get_ylim()
    assert (lo, hi) == (pytest.approx(0.80), pytest.approx(1.20))
    fig.canvas.draw()
    ticks = [float(t.get_text()) for t in cbar.get_yticklabels() if t.get_text() and lo <= t.get_position()[1] <= hi]
    assert min(ticks) < 1 < max(ticks) and 1.0 in ticks  # both sides labelled, the centre too
    texts = [t.get_text() for a in fig.axes for t in a.texts]
    assert "1.02" in texts and "1.20" in texts
    assert [a.get_title() for a in fig.axes if a.images] == ["FIXED = 0 cycles", "FIXED = 40 cycles"]
    assert {a.get_xlabel() for a in fig.axes if a.images} == {"kv length (tokens)"}
    assert_nothing_clipped(fig)
    with pytest.raises(ValidationError, match="levels"):
        plots.ratio_heatmaps(ratios, facet="nope", row="tile", col="kv_len")


def test_ratio_heatmaps_lay_out_a_grid_with_facet_row():
    idx = pd.MultiIndex.from_product([["strict_fifo", "rw_aware"], [1, 2], [0, 40], [64, 128]],
                                     names=["hazard_policy", "dma_channels", "fixed_cycles", "tile"])
    ratios = pd.Series(np.linspace(0.8, 1.3, len(idx)), index=idx)
    fig = plots.ratio_heatmaps(ratios, facet="dma_channels", facet_row="hazard_policy", row="fixed_cycles",
                               col="tile", label="a1 / opt2")
    panels = [a for a in fig.axes if a.images]
    assert len(panels) == 4
    assert [a.get_title() for a in panels] == [f"hazard policy = {p}\nDMA channels = {c}"
                                               for p in ("strict FIFO", "rw-aware") for c in (1, 2)]
    np.testing.assert_allclose(panels[3].images[0].get_array(), ratios.xs(("rw_aware", 2), level=["hazard_policy", "dma_channels"]).unstack("tile").to_numpy())
    assert_nothing_clipped(fig)
    with pytest.raises(ValidationError, match="name each of them once"):
        plots.ratio_heatmaps(ratios, facet="dma_channels", row="fixed_cycles", col="tile")  # hazard_policy left over


def _winners_table():
    rows = []
    for policy in ("strict_fifo", "rw_aware"):
        for fixed in (0, 400):
            for tile in (32, 128):
                c = {"opt2": 100, "opt3": 95 if policy == "rw_aware" else 110,
                     "a1": 90 if (policy, fixed) == ("rw_aware", 400) else 113}
                rows += [(policy, fixed, tile, v, n + (tile == 32)) for v, n in c.items()]
    return analysis.winners(pd.DataFrame(rows, columns=["hazard_policy", "fixed_cycles", "tile", "variant", "cycles"]))


def test_winner_map_colours_each_cell_by_the_fastest_and_says_by_how_much():
    w = _winners_table()
    fig = plots.winner_map(w, row="fixed_cycles", col="tile", facet_col="hazard_policy", focus="a1", title="who wins")
    panels = [a for a in fig.axes if a.images]
    assert [a.get_title() for a in panels] == ["hazard policy = strict FIFO", "hazard policy = rw-aware"]
    assert all(a.images[0].get_gid() == "winners" for a in panels)
    rw = panels[1]
    rgb = rw.images[0].get_array()
    assert tuple(rgb[0, 1]) == pytest.approx(matplotlib.colors.to_rgb(plots.VARIANT_COLORS["opt3"]))  # FIXED 0
    assert tuple(rgb[1, 1]) == pytest.approx(matplotlib.colors.to_rgb(plots.VARIANT_COLORS["a1"]))  # FIXED 400
    texts = {(round(t.get_position()[1]), round(t.get_position()[0])): t.get_text() for t in rw.texts}
    assert texts[(0, 1)] == "opt3\na1 +19%"          # a1 takes 113 / 95 of the fastest
    assert texts[(1, 1)] == "a1\nopt3 +5.6%"         # a1 fastest: the next one takes 95 / 90
    strict = {t.get_text() for t in panels[0].texts}
    assert strict == {"opt2\na1 +13%"}  # 114 / 101 and 113 / 100
    legend = fig.legends[0]
    assert [t.get_text() for t in legend.get_texts()] == ["opt2 fastest", "opt3 fastest", "a1 fastest"]
    assert "how much longer a1 takes" in " ".join(legend.get_title().get_text().split())
    assert_nothing_clipped(fig)
    box, title = fig.bbox, legend.get_title().get_window_extent(fig.canvas.get_renderer())
    assert box.x0 - 1 <= title.x0 and title.x1 <= box.x1 + 1, "the legend title runs out of the figure"
    grid = plots.winner_map(w, row="fixed_cycles", col="tile", facet_row="hazard_policy")
    assert len([a for a in grid.axes if a.images]) == 2
    assert {t.get_text() for a in grid.axes for t in a.texts} >= {"opt3\nopt2 +5.3%", "opt2\nopt3 +10%"}


def test_winner_map_refuses_a_table_it_cannot_lay_out():
    w = _winners_table()
    with pytest.raises(ValidationError, match="name each of them once"):
        plots.winner_map(w, row="fixed_cycles", col="tile")
    with pytest.raises(ValidationError, match="focus 'b9'"):
        plots.winner_map(w, row="fixed_cycles", col="tile", facet_col="hazard_policy", focus="b9")
    with pytest.raises(ValidationError, match="analysis.winners"):
        plots.winner_map(w[["opt2", "a1"]], row="fixed_cycles", col="tile", facet_col="hazard_policy")


# --- figures fit for a paper: text inside, one palette, one µs axis, the prologue in the first tiles --------
def _palette():
    named = [*plots.STAGE_COLORS.values(), *plots.ENGINE_COLORS.values(), *plots.CAUSE_COLORS.values(),
             *plots.VARIANT_COLORS.values(), *plots.PALETTE, plots.HOLD_COLOR, "white", "black"]
    return {matplotlib.colors.to_hex(c) for c in named}


def _fill_colors(fig):
    """The colour of every filled thing a reader tells apart: bars, stage collections, data lines."""
    out = []
    for ax in fig.axes:
        for p in ax.patches:
            if p.get_fill():
                out.append(p.get_facecolor())
        for c in ax.collections:
            if isinstance(c, PolyCollection) and len(c.get_facecolors()):
                out.extend(c.get_facecolors())
            if isinstance(c, LineCollection):
                out.extend(c.get_colors())
        for line in ax.get_lines():
            out.append(line.get_color())
        for im in ax.images:
            if im.get_gid() == "winners":  # an RGB picture of the winners' colours
                out.extend(map(tuple, np.unique(np.asarray(im.get_array()).reshape(-1, 3), axis=0)))
    return [matplotlib.colors.to_hex(c, keep_alpha=False) for c in out]


@pytest.fixture(scope="module")
def figures(cmp3, rw):
    r = cmp3.opt3
    wi = pd.concat([analysis.what_if(x, speedup=2).assign(variant=v) for v, x in cmp3.runs.items()], ignore_index=True)
    sw = decode.sweep(kv_len=[256, 512], tile=[64, 128], hazard_policy=["strict_fifo", "rw_aware"],
                      variants=("opt2", "opt3", "a1"), workers=1, progress=False)
    ratios = sw.pivot_table(index=["hazard_policy", "tile", "kv_len"], columns="variant", values="cycles")
    grid = analysis.ratio_grid(cmp3.opt2.command_bytes_per_tile, cmp3.opt3.command_bytes_per_tile,
                               fixed_values=np.arange(0, 101, 4), r_values=np.arange(17) * 0.0625)
    return {
        "gantt": lambda: plots.gantt(rw.op_log, window=plots.tile_window(rw.op_log, range(2)),
                                     holds=rw.run.holds(), critical_path=rw.run.critical_path()).figure,
        "compare_gantt": lambda: plots.compare_gantt(cmp3, tiles=2, holds=True, critical_path=True),
        "dispatch_per_tile": lambda: plots.dispatch_per_tile(cmp3, tile=1).figure,
        "what_if": lambda: plots.what_if(wi).figure,
        "what_if_one_run": lambda: plots.what_if(analysis.what_if(r, speedup=2)).figure,
        "attribution": lambda: plots.attribution_figure(analysis.attribution_table(cmp3), title="t"),
        "gate_map": lambda: plots.gate_map(grid).figure,
        "gate_map_mark": lambda: plots.gate_map(grid, mark=(20, 0.25)).figure,
        "ratio_heatmaps": lambda: plots.ratio_heatmaps((ratios.a1 / ratios.opt2), facet="hazard_policy", row="tile",
                                                       col="kv_len"),
        "winner_map": lambda: plots.winner_map(analysis.winners(sw), row="tile", col="kv_len",
                                               facet_col="hazard_policy", focus="a1"),
        "cycles_bars": lambda: plots.cycles_bars(sw[(sw.kv_len == 512) & (sw.tile == 64)]).figure,
        "scaling": lambda: plots.scaling(sw[(sw.tile == 64) & (sw.hazard_policy == "rw_aware")]).figure,
    }


FIGURES = ["gantt", "compare_gantt", "dispatch_per_tile", "what_if", "what_if_one_run", "attribution", "gate_map",
           "gate_map_mark", "ratio_heatmaps", "winner_map", "cycles_bars", "scaling"]


@pytest.mark.parametrize("name", FIGURES)
def test_every_figure_keeps_its_text_inside_and_takes_its_colours_from_the_palette(name, figures):
    fig = figures[name]()
    assert_nothing_clipped(fig)
    colors = _fill_colors(fig)
    assert colors, "nothing coloured was found"
    assert set(colors) <= _palette(), f"colours outside the palette: {set(colors) - _palette()}"
    # one µs axis per figure, if any
    axes = [a for ax in fig.axes for a in (ax, *ax.child_axes)]
    assert sum(a.get_xlabel() == "µs" for a in axes) <= 1
    # labels written inside fills read: white on dark, black on light
    for ax in fig.axes:
        for t in ax.texts:
            if not t.get_text() or (t.get_ha(), t.get_va()) != ("center", "center"):
                continue
            bars = [p for p in ax.patches if p.get_fill() and p.contains_point(
                ax.transData.transform(t.get_position()))]
            if bars:
                assert t.get_color() == plots.text_color(bars[-1].get_facecolor()), t.get_text()


def test_what_if_and_dispatch_bars_use_the_variant_and_palette_colours(cmp3):
    wi = pd.concat([analysis.what_if(x, speedup=2).assign(variant=v) for v, x in cmp3.runs.items()], ignore_index=True)
    ax = plots.what_if(wi)
    per_variant = len(ax.patches) // 3
    for i, v in enumerate(cmp3.variants):
        bars = ax.patches[i * per_variant:(i + 1) * per_variant]
        assert {matplotlib.colors.to_hex(b.get_facecolor()) for b in bars} == {plots.VARIANT_COLORS[v].lower()}
    one = plots.what_if(analysis.what_if(cmp3.opt2, speedup=2))
    assert [matplotlib.colors.to_hex(b.get_facecolor()) for b in one.patches] == [
        plots.ENGINE_COLORS[e].lower() for e in ENGINE_NAMES]
    ax = plots.dispatch_per_tile(cmp3, tile=1)
    fills = [matplotlib.colors.to_hex(p.get_facecolor()) for p in ax.patches]
    assert set(fills) <= {c.lower() for c in plots.PALETTE}
    assert fills[0] == plots.PALETTE[0].lower() and "tab" not in repr(fills)
    dark = [t for t in ax.texts if t.get_color() == "white"]
    assert dark, "no label on a dark fill was written in white"


def test_the_first_tiles_window_starts_at_cycle_0_and_so_does_the_cli_gantt(tmp_path, cmp3):
    from kbwork.cli import main

    log = cmp3.opt3.op_log
    assert plots.tile_window(log, range(3))[0] == 0  # the prologue (load Q, the fills) is in the picture
    assert plots.tile_window(log, [1])[0] == int(log[log["iter"] == 1]["start"].min()) > 0
    captured = {}
    orig = plots.gantt_or_utilization
    mp = pytest.MonkeyPatch()
    mp.setattr(plots, "gantt_or_utilization", lambda *a, **k: captured.setdefault("ax", orig(*a, **k)))
    mp.setattr(plt, "close", lambda *a, **k: None)
    try:
        assert main(["run", "--variant", "opt3", "--kv-len", "1024", "--mode", "timing", "--gantt",
                     str(tmp_path / "g.png")]) == 0
    finally:
        mp.undo()
    ax = captured["ax"]
    ax.figure.canvas.draw()
    assert ax.get_xlim()[0] == 0
    first = [t for t in _drawn_tick_labels(ax.xaxis, 0) if t.get_text()][0]
    assert first.get_text() == "0" and first.get_position()[0] == 0
    assert_nothing_clipped(ax.figure)


def test_a_gantt_denser_than_its_pixels_warns_and_leaves_out_what_would_blacken_it():
    r = decode.run("opt3", kv_len=32768, mode="timing")
    with pytest.warns(plots.DensityWarning, match=r"PE_CPU has [\d,]+ stages in the window but the Axes is \d+ "
                                                  r"pixels wide.*gantt_or_utilization"):
        ax = plots.gantt(r.op_log, holds=r.run.holds(), critical_path=r.run.critical_path())
    assert not _by_gid(ax, "critical-path") and not _by_gid(ax, "holds")
    assert _by_gid(ax, "stages:PE_CPU")  # the stages are still drawn
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", plots.DensityWarning)  # a few tiles fit: no warning
        ax = plots.gantt(r.op_log, window=plots.tile_window(r.op_log, range(3)), holds=r.run.holds(),
                         critical_path=r.run.critical_path())
    assert _by_gid(ax, "critical-path") and _by_gid(ax, "holds")


def test_gate_map_draws_its_contour_when_the_grid_holds_fixed_0_and_r_0(cmp3):
    """FIXED 0, R 0 dispatches nothing: the ratio there is NaN, and the white line is still drawn through the
    other cells (notebook 03's grid starts at that corner)."""
    grid = analysis.ratio_grid(cmp3.opt2.command_bytes_per_tile, cmp3.opt3.command_bytes_per_tile,
                               fixed_values=np.arange(0, 101, 10), r_values=np.arange(9) * 0.125)
    assert np.isnan(grid.loc[0, 0.0]) and np.nanmin(grid) < 2 < np.nanmax(grid)
    for g in (grid, grid.drop(index=0)):
        (line,) = [c for c in plots.gate_map(g).collections if c.get_gid() == "threshold"]
        assert len(line.get_paths()) and line.get_paths()[0].vertices.size
    assert not [c for c in plots.gate_map(grid, threshold=50).collections if c.get_gid() == "threshold"]
    plt.close("all")


def test_gate_map_lays_itself_out_and_labels_its_star_from_mark(cmp3):
    grid = analysis.ratio_grid(cmp3.opt2.command_bytes_per_tile, cmp3.opt3.command_bytes_per_tile,
                               fixed_values=np.arange(0, 101, 10), r_values=np.arange(9) * 0.125)
    ax = plots.gate_map(grid)
    assert isinstance(ax.figure.get_layout_engine(), matplotlib.layout_engine.ConstrainedLayoutEngine)
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [
        "FIXED = 40 cycles, R = 0.0625 cycles/byte (default)"]
    ax = plots.gate_map(grid, mark=(20, 0.25))
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["FIXED = 20 cycles, R = 0.25 cycles/byte"]
    (star,) = [line for line in ax.get_lines() if line.get_marker() == "*"]
    assert (star.get_xdata()[0], star.get_ydata()[0]) == (0.25, 20)
    assert plots.gate_map(grid, mark=None).get_legend() is None
    with pytest.raises(ValidationError, match="mark="):
        plots.gate_map(grid, mark="default")


def test_compare_gantt_has_one_us_axis():
    fig = plots.compare_gantt(decode.compare(kv_len=512, mode="timing", variants=("opt2", "opt3", "a1")), tiles=2)
    axes = [a for ax in fig.axes for a in (ax, *ax.child_axes)]
    assert sum(a.get_xlabel() == "µs" for a in axes) == 1
    assert [a.get_xlabel() for a in fig.axes if a.get_gid() == "gantt"] == ["", "", "cycles"]
