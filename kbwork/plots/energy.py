"""Plots of a decode step's energy (DESIGN.md §18): tokens per second against tokens per joule, and where a
step's joules go.

Both take DataFrames and return the Axes they drew on, like the rest of :mod:`kbwork.plots`:

* :func:`tokens_per_j` draws one line per case (a ``case`` column: a placement, a PE level), through its
  points in the frame's order (a batch sweep, say), tokens/s on x and tokens/J on y, both log scale; a point
  whose weights and KV cache do not fit (``fits`` False) is hollow and the legend says so.
* :func:`energy_bars` stacks, per case, the groups of :func:`kbwork.model.energy.grouped` (HBM, TCM, MAC,
  MATH, dispatch, device idle, host HBM, host FLOPs, host busy, host idle, link) in mJ per token, and writes
  the idle share (device and host idle) above each bar.

Artists the tests look for carry a ``gid``: ``case:<label>`` (a line) and ``group:<name>`` (a stack layer).
"""

from __future__ import annotations


import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.ticker import NullFormatter

from ..errors import ValidationError
from ..model.energy import GROUPS
from .checks import _check_ax
from .model import _fits, add_hollow_entry, plot_fitting
from .style import PALETTE

#: Each group's colour in :func:`energy_bars` (the device's kinds warm, the host's grey, the link blue).
GROUP_COLORS = {"HBM": "#CC3311", "TCM": "#EE7733", "MAC": "#EE3377", "MATH": "#AA3377", "dispatch": "#CCBB44",
                "device idle": "#DDCC77", "host HBM": "#555555", "host FLOPs": "#888888", "host busy": "#AAAAAA",
                "host idle": "#DDDDDD", "link": "#0077BB"}
#: The groups that are idle power, whose share :func:`energy_bars` writes above each bar.
IDLE_GROUPS = ("device idle", "host idle")


def tokens_per_j(frame: pd.DataFrame, *, case: str = "case", ax: plt.Axes | None = None,
                 annotate: str | None = "batch", legend: bool = True) -> plt.Axes:
    """Tokens/s (x) against tokens/J (y), one line per value of column ``case``, through its rows in order.

    Args:
        frame: rows with ``tokens_per_s``, ``tokens_per_j``, ``case`` and optionally ``fits`` (a
            :func:`kbwork.model.sweep` or :func:`kbwork.model.compare` frame with a ``case`` column added).
        case: the column naming each line.
        ax: where to draw (a new figure when None).
        annotate: a column whose value is written beside each point of the first line (``None``: nothing).
        legend: draw the legend (``False`` for all but one panel of a grid).

    Returns:
        The Axes; ``ax.hollow`` says whether any point does not fit.

    Raises:
        ValidationError: ``frame`` is not a DataFrame with those columns, or ``ax`` is not an Axes.
    """
    where = "plots.tokens_per_j"
    ax = _check_ax(ax, where)
    need = {"tokens_per_s", "tokens_per_j", case} | ({annotate} if annotate else set())
    if not isinstance(frame, pd.DataFrame) or not need <= set(frame.columns) or frame.empty:
        raise ValidationError(f"{where}: expected a non-empty DataFrame with columns {', '.join(sorted(need))} "
                              f"(model.sweep or model.compare rows with a {case!r} column).")
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 4.5), constrained_layout=True)
    fits = _fits(frame)
    for i, (label, g) in enumerate(frame.groupby(case, sort=False)):
        color = PALETTE[i % len(PALETTE)]
        plot_fitting(ax, g["tokens_per_s"].to_numpy(float), g["tokens_per_j"].to_numpy(float),
                     fits.loc[g.index].to_numpy(bool), color=color, marker="o", markersize=5, linewidth=1.4,
                     label=str(label), gid=f"case:{label}")
        if annotate and i == 0:
            for x, y, v in zip(g["tokens_per_s"], g["tokens_per_j"], g[annotate]):
                ax.annotate(f"{annotate} {v}", (x, y), textcoords="offset points", xytext=(4, -10), fontsize=7,
                            color="#444444")
    ax.set_xscale("log")
    ax.set_yscale("log")
    for axis in (ax.xaxis, ax.yaxis):  # labels on the decades only: a minor label per tick overlaps
        axis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("tokens per second (log scale)")
    ax.set_ylabel("tokens per joule (log scale)")
    ax.grid(True, which="major", alpha=0.3)
    ax.hollow = not fits.all()
    if legend:
        ax.legend(handles=add_hollow_entry(ax, ax.hollow), fontsize=7.5, loc="best")
    return ax


def energy_bars(groups: pd.DataFrame, *, ax: plt.Axes | None = None, per: str = "token") -> plt.Axes:
    """Where each case's energy goes: one stacked bar per row of ``groups``.

    Args:
        groups: one row per case (its index the case's label), one column per group of
            :data:`kbwork.model.energy.GROUPS` (joules a step: :func:`kbwork.model.energy.grouped` of each
            step's ``energy``, as rows), and a ``batch`` column when ``per="token"``.
        ax: where to draw (a new figure when None).
        per: ``"token"`` (mJ per token: joules / batch) or ``"step"`` (J a step).

    Returns:
        The Axes.

    Raises:
        ValidationError: ``groups`` lacks a group column (or ``batch`` for ``per="token"``), ``per`` is
            neither, or ``ax`` is not an Axes.
    """
    where = "plots.energy_bars"
    ax = _check_ax(ax, where)
    names = list(GROUPS.values())
    if per not in ("token", "step"):
        raise ValidationError(f"{where}: per={per!r}; use 'token' (mJ per token) or 'step' (J a step).")
    need = set(names) | ({"batch"} if per == "token" else set())
    if not isinstance(groups, pd.DataFrame) or not need <= set(groups.columns) or groups.empty:
        raise ValidationError(f"{where}: expected a non-empty DataFrame, one row per case, with a column per "
                              f"group ({', '.join(names)}){' and batch' if per == 'token' else ''}: "
                              f"model.energy.grouped(step.energy) of each step.")
    if ax is None:
        _, ax = plt.subplots(figsize=(max(5.0, 1.1 * len(groups) + 2.5), 4.5), constrained_layout=True)
    scale = (1e3 / groups["batch"].to_numpy(float)) if per == "token" else np.ones(len(groups))
    xs = np.arange(len(groups))
    bottom = np.zeros(len(groups))
    for name in names:
        h = groups[name].to_numpy(float) * scale
        if not h.any():
            continue
        ax.bar(xs, h, bottom=bottom, color=GROUP_COLORS[name], label=name, width=0.7, gid=f"group:{name}",
               edgecolor="white", linewidth=0.5)
        bottom += h
    idle = groups[list(IDLE_GROUPS)].sum(axis=1).to_numpy(float) * scale
    for x, top, share in zip(xs, bottom, np.divide(idle, bottom, out=np.zeros_like(idle), where=bottom > 0)):
        ax.annotate(f"idle {100 * share:.0f}%", (x, top), textcoords="offset points", xytext=(0, 3), ha="center",
                    fontsize=7.5)
    ax.set_xticks(xs, [str(i) for i in groups.index], rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("mJ per token" if per == "token" else "J per step")
    ax.set_ylim(0, bottom.max() * 1.12 if bottom.max() > 0 else 1)
    handles, labels = ax.get_legend_handles_labels()
    ax.legend(handles[::-1], labels[::-1], fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False)
    return ax
