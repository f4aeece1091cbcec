"""Dispatch cost in pictures: one tile's DISPATCH cycles per command, variant by variant, and the dispatch ratio
over a FIXED × R grid with the contour where the gate flips."""

from __future__ import annotations

from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from ..errors import ValidationError
from ..oplog import require_columns
from .checks import _check_ax, _check_int, _check_positive, _check_table, _named_runs, _run_parts
from .style import PALETTE, STAGE_COLORS, _new_axes, cycle_axis, text_color


def _dispatch_title(totals: dict[str, int], tile: int) -> str:
    def ratio(a: str, b: str) -> str:
        return "undefined" if not totals[b] else f"{totals[a] / totals[b]:.2f}"

    if "opt2" in totals and "opt3" in totals:
        parts = [f"opt3 / opt2 = {ratio('opt3', 'opt2')}"]
        parts += [f"{v} / opt2 = {ratio(v, 'opt2')}" for v in totals if v not in ("opt2", "opt3")]
        return f"per-tile dispatch: {', '.join(parts)}  (gate: > 2)"
    base = "opt2" if "opt2" in totals else next(iter(totals))
    parts = [f"{v} / {base} = {ratio(v, base)}" for v in totals if v != base]
    return f"per-tile dispatch, tile {tile}: {', '.join(parts)}"


def dispatch_per_tile(runs: Any, second: pd.DataFrame | None = None, tile: int = 1,
                      ax: plt.Axes | None = None) -> plt.Axes:
    """Stacked bars: the DISPATCH cycles of each command of one tile, one bar per variant.

    Args:
        runs: a ``decode.Comparison``, or a dict name -> op_log (or run), drawn
            top to bottom in that order. The old call
            ``dispatch_per_tile(op_log_a, op_log_b, tile=1)`` still works.
        second: the second op_log of the old call only (labelled opt3, the first opt2).
        tile: which tile's commands.
        ax: Axes to draw on (a new constrained-layout figure when ``None``).

    Returns:
        The Axes. Each command label has the next :data:`PALETTE` colour; each
        segment is labelled with its command and cycles where the label fits
        inside it (split over lines, then smaller, then the cycles alone, else
        no label), white on a dark fill, black on a light one.

    Raises:
        ValidationError: no variants, a variant that is not an op_log or run, a variant without DISPATCH
            stages for ``tile``, ``tile`` not a non-negative int, or ``ax`` not an Axes.
    """
    where = "dispatch_per_tile"
    named = _named_runs(runs, second, where)
    logs = {name: _run_parts(x)[0] for name, x in named.items()}
    for name, df in logs.items():
        require_columns(df, ("stage", "iter", "cmd", "label", "start", "end"), f"{where}: {name}")
    _check_int(tile, "tile", where, "the tile whose commands to draw, e.g. 1", low=0)
    _check_ax(ax, where)
    if ax is None:
        ax = _new_axes((9.5, 0.9 + 0.9 * len(logs)))
    labels_seen: dict[str, str] = {}
    totals: dict[str, int] = {}
    names = []
    texts = []
    for row, (name, df) in enumerate(logs.items()):
        d = df[(df["stage"] == "DISPATCH") & (df["iter"] == tile)].sort_values("cmd")
        if d.empty:
            raise ValidationError(f"{name}: no DISPATCH stages with iter {tile}")
        names.append(f"{name} ({len(d)} cmds)")
        left = 0
        for lab, cyc in zip(d["label"].astype(str), (d["end"] - d["start"]).astype(int)):
            color = labels_seen.setdefault(lab, PALETTE[len(labels_seen) % len(PALETTE)])
            bar = ax.barh(row, cyc, left=left, color=color, edgecolor="white", linewidth=0.8)[0]
            if cyc > 0:
                texts.append((ax.text(left + cyc / 2, row, f"{lab}\n{cyc}", ha="center", va="center", fontsize=7,
                                      color=text_color(color)), bar, lab, cyc))
            left += cyc
        totals[name] = left
        ax.text(left, row, f"  {left} cycles", va="center", fontsize=9)
    ax.set_yticks(range(len(logs)))
    ax.set_yticklabels(names)
    ax.set_ylim(len(logs) - 0.4, -0.6)
    ax.set_xlim(0, max(max(totals.values()), 1) * 1.16)
    ax.set_xlabel(f"PE_CPU dispatch cycles for tile {tile}")
    cycle_axis(ax.xaxis)
    ax.set_title(_dispatch_title(totals, tile), loc="left", fontsize=10)
    _fit_labels(ax, texts)
    return ax


def _fit_labels(ax: plt.Axes, texts: list) -> None:
    """Make every bar label fit inside its bar: split the name over lines, shrink, drop the name, or drop
    the label. Measured after the figure's layout, so the sizes are the ones that will be drawn."""
    if not texts:
        return
    fig = ax.figure
    fig.draw_without_rendering()
    renderer = fig.canvas.get_renderer()

    def fits(t, bar) -> bool:
        tb, bb = t.get_window_extent(renderer), bar.get_window_extent(renderer)
        return tb.width <= bb.width - 6 and tb.height <= bb.height - 2

    for t, bar, lab, cyc in texts:
        tries = [(f"{lab}\n{cyc}", 7), ("\n".join(lab.split()) + f"\n{cyc}", 7),
                 ("\n".join(lab.split()) + f"\n{cyc}", 6), (f"{cyc}", 7), (f"{cyc}", 6)]
        for text, size in tries:
            t.set_text(text)
            t.set_fontsize(size)
            if fits(t, bar):
                break
        else:
            t.set_text("")


def gate_map(grid: pd.DataFrame, ax: plt.Axes | None = None, threshold: float = 2.0,
             mark: tuple[float, float] | None = (40, 0.0625)) -> plt.Axes:
    """The dispatch ratio opt3/opt2 over a FIXED × R grid, with the ``ratio = threshold`` contour.

    ``grid`` is :func:`kbwork.analysis.ratio_grid` output (FIXED rows, R columns).
    ``mark`` ``(FIXED, R)`` puts a star on one calibration (default: the default topology's), labelled
    with its values (and "default" when it is the default topology's).

    Returns:
        The Axes (of a new constrained-layout figure when ``ax`` is None). The contour (gid ``threshold``) runs
        through the finite ratios, and is drawn whenever they cross ``threshold``: the cell where neither
        variant dispatches anything (FIXED 0, R 0) is NaN and is left blank.

    Raises:
        ValidationError: ``grid`` is not a non-empty ratio grid (numbers, FIXED rows, R columns; an op_log
            is named as one), ``threshold`` is not a positive finite real, ``mark`` is not two numbers, or
            ``ax`` is not an Axes.
    """
    where = "gate_map"
    _check_table(grid, "grid", where, "analysis.ratio_grid(...)", "FIXED rows, R columns, dispatch ratios",
                 "pass analysis.ratio_grid(baseline_bytes, candidate_bytes, fixed_values, r_values)", labels=True)
    _check_positive(threshold, "threshold", where, "the dispatch ratio whose contour is drawn, e.g. 2.0",
                    optional=False)
    _check_ax(ax, where)
    if mark is not None:
        try:
            fixed, r_mark = (float(x) for x in mark)
        except (TypeError, ValueError):
            raise ValidationError(f"gate_map: mark={mark!r}; pass (FIXED, R), e.g. (40, 0.0625), or None.") \
                from None
    if ax is None:
        ax = _new_axes((6.5, 4.5))
    f = grid.index.to_numpy(float)
    r = grid.columns.to_numpy(float)
    z = grid.to_numpy(float)
    mesh = ax.pcolormesh(r, f, z, shading="nearest", cmap="viridis")
    ax.figure.colorbar(mesh, ax=ax, label="dispatch ratio opt3 / opt2")
    # a ratio is NaN where neither variant dispatches anything (FIXED 0, R 0) and inf where only the baseline
    # does not: the contour runs through the finite cells, and is drawn whenever they cross the threshold
    finite = z[np.isfinite(z)]
    if finite.size and finite.min() < threshold < finite.max():
        cs = ax.contour(r, f, np.ma.masked_invalid(z), levels=[threshold], colors="white", linewidths=2)
        cs.set_gid("threshold")
        ax.clabel(cs, fmt=lambda v: f"ratio = {v:g}", fontsize=8)
    if mark is not None:
        from ..config import load_topology

        default = load_topology()
        is_default = (fixed, r_mark) == (default.fixed_cycles, default.r_cycles_per_byte)
        ax.plot(r_mark, fixed, marker="*", color=STAGE_COLORS["GEMM"], markeredgecolor="white", markersize=15,
                linestyle="none", label=f"FIXED = {fixed:g} cycles, R = {r_mark:g} cycles/byte"
                                        + (" (default)" if is_default else ""))
        ax.legend(loc="upper right", fontsize=8)
    ax.set_xlabel("R (cycles per logical byte)")
    ax.set_ylabel("FIXED (cycles per command)")
    ax.set_title(f"gate opt3 > {threshold:g} x opt2 holds above the white line", loc="left", fontsize=10)
    return ax
