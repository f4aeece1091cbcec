"""``plots.device_gantt`` on a whole run: holds merged per row, back-to-back critical-path stages one outline,
one background for every PE, and a window's title naming the window."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd

from kbwork import model as mdl
from kbwork import plots
from kbwork.plots.device import merged_holds, merged_path


def _run():
    return mdl.step("llama-3-8b", [2048] * 2).attention


def test_merged_holds_and_path_cover_what_they_merge():
    run = _run()
    pe = run.pe(0)
    holds, path = pe.holds(), run.critical_path()
    mh = merged_holds(pe.op_log, holds, run.units)
    assert 0 < len(mh) <= len(holds) and mh["holds"].sum() == len(holds)
    assert mh["plan_end"].min() == holds["plan_end"].min() and mh["release"].max() == holds["release"].max()
    # a second hold of each command, overlapping the first, is merged into its bar
    twice = pd.concat([holds, holds.assign(plan_end=holds["plan_end"] + 1)], ignore_index=True)
    m2 = merged_holds(pe.op_log, twice, run.units)
    assert len(m2) == len(mh) and m2["holds"].sum() == 2 * len(holds)
    assert list(m2["release"]) == list(mh["release"])
    mp = merged_path(path)
    assert 0 < len(mp) < len(path) and mp["stages"].sum() == len(path)
    assert mp["start"].iloc[0] == path["start"].iloc[0] and mp["end"].iloc[-1] == path["end"].iloc[-1]
    # merged outlines never join stages on different units, nor stages with a gap between them
    eng = path["engine"].astype(str).to_numpy()
    joins = (eng[1:] == eng[:-1]) & (path["start"].to_numpy()[1:] == path["end"].to_numpy()[:-1])
    assert len(mp) == len(path) - int(joins.sum())
    assert merged_holds(pe.op_log, holds.iloc[:0], run.units).empty and merged_path(path.iloc[:0]).empty


def test_device_gantt_draws_them_merged_on_one_background_and_titles_a_window():
    run = _run()
    fig = plots.device_gantt(run)
    pes = [ax for ax in fig.axes if str(ax.get_gid()).startswith("pe:")]
    assert len({ax.get_facecolor() for ax in pes}) == 1
    first = pes[0]
    outline = next(c for c in first.collections if c.get_gid() == "critical-path")
    assert len(outline.get_paths()) == len(merged_path(run.critical_path()))
    hold = next(c for c in first.collections if c.get_gid() == "holds")
    assert len(hold.get_segments()) == len(merged_holds(run.pe(0).op_log, run.pe(0).holds(), run.units))
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert any("overlapping ones merged" in t for t in labels) and any("stages" in t and "merged" in t for t in labels)
    assert fig._suptitle.get_text().startswith(f"Device run, {run.cycles:,} cycles")
    plt.close(fig)
    fig = plots.device_gantt(run, window=(1000, 4000))
    assert fig._suptitle.get_text().startswith(f"Device run of {run.cycles:,} cycles, cycles 1,000 to 4,000 shown")
    plt.close(fig)
