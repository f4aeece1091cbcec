"""Plots of op_logs: pure functions that take DataFrames and an optional Axes.

Every function returns the matplotlib Axes (or Figure) it drew on, so a
notebook, a test and the command line call the same code.
"""

from __future__ import annotations

from typing import Iterable

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.collections import PolyCollection
from matplotlib.patches import Patch

from .errors import ValidationError
from .oplog import STAGE_NAMES, check_schema, engine_tracks

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

_PALETTE = np.array([matplotlib.colors.to_rgba(STAGE_COLORS[k]) for k in STAGE_NAMES])


def tile_window(op_log: pd.DataFrame, tiles: Iterable[int]) -> tuple[int, int]:
    """The cycle window ``(start, end)`` spanning every stage of the commands labelled with ``tiles``.

    Raises:
        ValidationError: none of the tiles appear in the op_log.
    """
    check_schema(op_log)
    sel = op_log[op_log["iter"].isin(list(tiles))]
    if sel.empty:
        raise ValidationError(f"no stages with iter in {list(tiles)}; the op_log has iters "
                              f"{sorted(op_log['iter'].unique())[:10]}...")
    return int(sel["start"].min()), int(sel["end"].max())


def gantt(op_log: pd.DataFrame, ax: plt.Axes | None = None, window: tuple[int, int] | None = None, *,
          highlight: dict | None = None, clock_ghz: float | None = 1.25, title: str | None = None,
          legend: bool = True) -> plt.Axes:
    """Draw a Gantt chart: one row per engine unit (each DMA channel its own), one colour per stage kind.

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
    tracks = engine_tracks(op_log["engine"])
    df = op_log
    if window is not None:
        lo, hi = window
        df = df[(df["end"] > lo) & (df["start"] < hi)]
    start = df["start"].to_numpy(np.float64)
    end = df["end"].to_numpy(np.float64)
    row = pd.Categorical(df["engine"], categories=tracks).codes
    face = _PALETTE[pd.Categorical(df["stage"], categories=STAGE_NAMES).codes]
    edge = np.zeros_like(face)
    if highlight:
        hl = np.ones(len(df), bool)
        for col, val in highlight.items():
            hl &= (df[col] == val).to_numpy()
        face[~hl, 3] = 0.25
        edge[hl] = (0, 0, 0, 1)
        width = 0.6
    else:  # thin white seams keep back-to-back stages apart while they are few enough to see
        edge[:] = (1, 1, 1, 1)
        width = 0.25 if len(df) <= 3000 else 0.0
    h = 0.4
    verts = np.empty((len(df), 4, 2))
    verts[:, 0, 0] = verts[:, 1, 0] = start
    verts[:, 2, 0] = verts[:, 3, 0] = end
    verts[:, 0, 1] = verts[:, 3, 1] = row - h
    verts[:, 1, 1] = verts[:, 2, 1] = row + h
    for r in range(len(tracks)):  # one collection per engine unit
        m = row == r
        if m.any():
            ax.add_collection(PolyCollection(verts[m], facecolors=face[m], edgecolors=edge[m], linewidths=width))
    ax.set_yticks(range(len(tracks)))
    ax.set_yticklabels(tracks)
    ax.set_ylim(len(tracks) - 0.5, -0.5)
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
        present = [k for k in STAGE_NAMES if k in set(df["stage"].unique())]
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


def dispatch_per_tile(op_log_opt2: pd.DataFrame, op_log_opt3: pd.DataFrame, tile: int = 1,
                      ax: plt.Axes | None = None) -> plt.Axes:
    """Stacked bars: the DISPATCH cycles of each command of one tile, opt2 beside opt3.

    Returns:
        The Axes.
    """
    if ax is None:
        _, ax = plt.subplots(figsize=(9, 2.8))
    cmap = plt.get_cmap("tab20")
    labels_seen: dict[str, tuple] = {}
    totals, names = [], []
    for row, (name, df) in enumerate((("opt2", op_log_opt2), ("opt3", op_log_opt3))):
        d = df[(df["stage"] == "DISPATCH") & (df["iter"] == tile)].sort_values("cmd")
        if d.empty:
            raise ValidationError(f"{name}: no DISPATCH stages with iter {tile}")
        names.append(f"{name} ({len(d)} cmds)")
        left = 0
        for lab, cyc in zip(d["label"], d["end"] - d["start"]):
            color = labels_seen.setdefault(lab, cmap(len(labels_seen) % 20))
            ax.barh(row, cyc, left=left, color=color, edgecolor="white", linewidth=0.8)
            if cyc >= 25:
                ax.text(left + cyc / 2, row, f"{lab}\n{cyc}", ha="center", va="center", fontsize=7)
            left += cyc
        totals.append(left)
        ax.text(left + 4, row, f"{left} cycles", va="center", fontsize=9)
    ax.set_yticks([0, 1])
    ax.set_yticklabels(names)
    ax.set_ylim(1.6, -0.6)
    ax.set_xlim(0, max(totals) * 1.15)
    ax.set_xlabel(f"PE_CPU dispatch cycles for tile {tile}")
    ax.set_title(f"per-tile dispatch: opt3 / opt2 = {totals[1] / totals[0]:.2f}  (gate: > 2)", loc="left",
                 fontsize=10)
    return ax


def scaling(sweep_df: pd.DataFrame, ax: plt.Axes | None = None, x: str = "kv_len") -> plt.Axes:
    """End-to-end cycles (solid) and total dispatch cycles (dashed) of each variant against ``x``.

    ``sweep_df`` is a :func:`kbwork.decode.sweep` result with one value of every other axis.

    Returns:
        The Axes (log-log).
    """
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 4))
    colors = {"opt2": "#0072B2", "opt3": "#D55E00"}
    for variant, g in sweep_df.groupby("variant", sort=True):
        g = g.sort_values(x)
        c = colors.get(variant)
        ax.plot(g[x], g["cycles"], "o-", color=c, label=f"{variant} end-to-end")
        ax.plot(g[x], g["dispatch_total"], "s--", color=c, alpha=0.7, label=f"{variant} dispatch (PE_CPU)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel(x)
    ax.set_ylabel("cycles")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return ax


def gate_map(grid: pd.DataFrame, ax: plt.Axes | None = None, threshold: float = 2.0,
             mark: tuple[float, float] | None = (40, 0.0625)) -> plt.Axes:
    """The dispatch ratio opt3/opt2 over a FIXED × R grid, with the ``ratio = threshold`` contour.

    ``grid`` is :func:`kbwork.analysis.ratio_grid` output (FIXED rows, R columns).
    ``mark`` puts a star on one calibration (default: the default topology).

    Returns:
        The Axes.
    """
    if ax is None:
        _, ax = plt.subplots(figsize=(6.5, 4.5))
    f = grid.index.to_numpy(float)
    r = grid.columns.to_numpy(float)
    z = grid.to_numpy(float)
    mesh = ax.pcolormesh(r, f, z, shading="nearest", cmap="viridis")
    ax.figure.colorbar(mesh, ax=ax, label="dispatch ratio opt3 / opt2")
    if z.min() < threshold < z.max():
        cs = ax.contour(r, f, z, levels=[threshold], colors="white", linewidths=2)
        ax.clabel(cs, fmt=lambda v: f"ratio = {v:g}", fontsize=8)
    if mark is not None:
        ax.plot(mark[1], mark[0], marker="*", color="red", markersize=14, label="default calibration")
        ax.legend(loc="upper right", fontsize=8)
    ax.set_xlabel("R (cycles per logical byte)")
    ax.set_ylabel("FIXED (cycles per command)")
    ax.set_title(f"gate opt3 > {threshold:g} x opt2 holds above the white line", loc="left", fontsize=10)
    return ax
