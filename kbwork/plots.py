"""Plots of op_logs: pure functions that take DataFrames and an optional Axes.

Every function returns the matplotlib Axes (or Figure) it drew on, so a
notebook, a test and the command line call the same code.
"""

from __future__ import annotations

from typing import Iterable, Sequence

import matplotlib

if matplotlib.get_backend().lower() in ("", "agg") or not hasattr(matplotlib, "pyplot"):
    pass
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.collections import PolyCollection  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

from .oplog import ENGINE_NAMES, STAGE_NAMES  # noqa: E402

#: One colour per stage kind (colour-blind friendly, Okabe-Ito based).
STAGE_COLORS = {
    "DISPATCH": "#999999",
    "PLAN": "#CC79A7",
    "DMA_READ": "#0072B2",
    "FETCH": "#56B4E9",
    "GEMM": "#D55E00",
    "MATH": "#009E73",
    "DMA_WRITE": "#E69F00",
}


def tile_window(op_log: pd.DataFrame, tiles: Iterable[int]) -> tuple[int, int]:
    """The cycle window ``(start, end)`` spanning every stage of the commands labelled with ``tiles``.

    Raises:
        ValueError: none of the tiles appear in the op_log.
    """
    sel = op_log[op_log["iter"].isin(list(tiles))]
    if sel.empty:
        raise ValueError(f"no stages with iter in {list(tiles)}; the op_log has iters "
                         f"{sorted(op_log['iter'].unique())[:10]}...")
    return int(sel["start"].min()), int(sel["end"].max())


def gantt(op_log: pd.DataFrame, ax: plt.Axes | None = None, window: tuple[int, int] | None = None, *,
          highlight: dict | None = None, clock_ghz: float | None = 1.25, title: str | None = None,
          legend: bool = True) -> plt.Axes:
    """Draw a Gantt chart: one row per engine, one colour per stage kind.

    Args:
        op_log: an op_log DataFrame.
        ax: Axes to draw on (a new figure when ``None``).
        window: ``(start, end)`` cycles to show; stages overlapping it are drawn.
        highlight: column -> value (e.g. ``{"cmd": 12}`` or ``{"iter": 3}``);
            matching stages are drawn outlined, the others faded.
        clock_ghz: adds a secondary µs axis on top (``None`` to omit).
        title: the Axes title.
        legend: draw the stage-kind legend.

    Returns:
        The Axes. Each engine is one PolyCollection, so 100k stages draw fast.
    """
    if ax is None:
        _, ax = plt.subplots(figsize=(12, 3.2))
    df = op_log
    if window is not None:
        lo, hi = window
        df = df[(df["end"] > lo) & (df["start"] < hi)]
    start = df["start"].to_numpy(np.float64)
    end = df["end"].to_numpy(np.float64)
    eng = df["engine"].to_numpy()
    stage = df["stage"].to_numpy()
    hl = np.ones(len(df), bool)
    if highlight:
        for col, val in highlight.items():
            hl &= (df[col] == val).to_numpy()
    rows = {name: i for i, name in enumerate(ENGINE_NAMES)}
    h = 0.8
    for name, row in rows.items():
        m = eng == name
        if not m.any():
            continue
        s, e = start[m], end[m]
        y0, y1 = row - h / 2, row + h / 2
        verts = np.empty((len(s), 4, 2))
        verts[:, 0, 0] = s
        verts[:, 1, 0] = s
        verts[:, 2, 0] = e
        verts[:, 3, 0] = e
        verts[:, [0, 3], 1] = y0
        verts[:, [1, 2], 1] = y1
        colors = np.array([matplotlib.colors.to_rgba(STAGE_COLORS[k]) for k in STAGE_NAMES])
        idx = np.searchsorted(np.array(STAGE_NAMES), stage[m], sorter=np.argsort(STAGE_NAMES))
        face = colors[np.argsort(STAGE_NAMES)[idx]]
        if highlight:
            face[~hl[m], 3] = 0.25
        edge = np.zeros_like(face)
        if highlight:
            edge[hl[m]] = (0, 0, 0, 1)
        coll = PolyCollection(verts, facecolors=face, edgecolors=edge, linewidths=0.6 if highlight else 0)
        ax.add_collection(coll)
    ax.set_yticks(range(len(ENGINE_NAMES)))
    ax.set_yticklabels(ENGINE_NAMES)
    ax.set_ylim(len(ENGINE_NAMES) - 0.5, -0.5)
    if window is not None:
        ax.set_xlim(*window)
    elif len(df):
        ax.set_xlim(0, float(end.max()) * 1.01)
    ax.set_xlabel("cycles")
    if clock_ghz:
        per_us = clock_ghz * 1e3
        sec = ax.secondary_xaxis("top", functions=(lambda c: c / per_us, lambda u: u * per_us))
        sec.set_xlabel("µs")
    if title:
        ax.set_title(title, loc="left", fontsize=10)
    if legend:
        present = [k for k in STAGE_NAMES if k in set(stage)]
        ax.legend(handles=[Patch(color=STAGE_COLORS[k], label=k) for k in present], loc="upper left",
                  bbox_to_anchor=(1.005, 1.0), fontsize=8, frameon=False)
    ax.grid(axis="x", alpha=0.3)
    return ax


def compare_gantt(op_log_opt2: pd.DataFrame, op_log_opt3: pd.DataFrame, tiles: int = 3,
                  clock_ghz: float | None = 1.25) -> plt.Figure:
    """opt2 above opt3 on one cycle axis, from cycle 0 to the end of tile ``tiles - 1`` of the slower one.

    Returns:
        The Figure.
    """
    fig, axes = plt.subplots(2, 1, figsize=(13, 5.6), sharex=True, constrained_layout=True)
    wins = [tile_window(df, range(tiles)) for df in (op_log_opt2, op_log_opt3)]
    hi = max(w[1] for w in wins)
    for ax, df, name in zip(axes, (op_log_opt2, op_log_opt3), ("opt2 (2 commands per tile)",
                                                               "opt3 (10 commands per tile)")):
        gantt(df, ax=ax, window=(0, hi), clock_ghz=clock_ghz, title=f"{name}: first {tiles} tiles",
              legend=ax is axes[0])
    axes[0].set_xlabel("")
    return fig


def _as_list(x: Sequence | None) -> list:
    return list(x) if x is not None else []
