"""Where the time goes, in bars: the critical path by cause or engine unit, and what speeding up one engine
would save."""

from __future__ import annotations

from typing import Any, Mapping

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.patches import Patch

from ..errors import ValidationError
from .checks import _check_ax, _check_flag
from .style import _color_for, _new_axes, _variant_colors, cycle_axis, text_color


# --- where the time goes ----------------------------------------------------------------------------------
def _attribution_frame(table: Any) -> pd.DataFrame:
    """A long (variant, by, name, cycles) frame from an attribution table or a mapping name -> attribution."""
    if isinstance(table, pd.DataFrame) and {"variant", "by", "name", "cycles"} <= set(table.columns):
        return table
    if isinstance(table, Mapping) and table:
        frames = []
        for k, a in table.items():
            a = getattr(a, "attribution", a)  # an analysis.Explanation
            if not isinstance(a, pd.DataFrame) or not {"by", "name", "cycles"} <= set(a.columns):
                break
            frames.append(a.assign(variant=str(k)))
        else:
            return pd.concat(frames, ignore_index=True)
    raise ValidationError("attribution: pass analysis.attribution_table(...) (columns variant, by, name, cycles) "
                          "or a dict name -> analysis.attribution(run).")


def attribution(table: Any, ax: plt.Axes | None = None, *, by: str = "cause", title: str | None = None,
                legend: bool = True) -> plt.Axes:
    """One stacked bar per variant: its critical-path cycles split by cause (or by engine unit).

    Args:
        table: :func:`kbwork.analysis.attribution_table` output, or a dict
            name -> :func:`kbwork.analysis.attribution` frame (or Explanation).
        ax: Axes to draw on (a new constrained-layout figure when ``None``).
        by: ``"cause"`` or ``"engine"``.
        title: the Axes title (default says what is drawn).
        legend: draw the legend of the names present.

    Returns:
        The Axes. Each bar's segments add up to that variant's end-to-end
        cycles (written at the bar's end); a segment is labelled with its
        share when the label fits.

    Raises:
        ValidationError: a bad ``table`` or ``by``, ``ax`` not an Axes, or ``legend`` not a bool.
    """
    if not isinstance(by, str) or by not in ("cause", "engine"):
        raise ValidationError(f"attribution: by={by!r}; use 'cause' or 'engine'.")
    df = _attribution_frame(table)
    _check_ax(ax, "attribution")
    _check_flag(legend, "legend", "attribution")
    df = df[df["by"] == by]
    variants = list(dict.fromkeys(df["variant"]))
    if ax is None:
        ax = _new_axes((10, 0.9 + 0.55 * len(variants)))
    names = list(dict.fromkeys(df["name"]))
    seen: dict[str, None] = {}
    totals = []
    texts = []
    for row, v in enumerate(variants):
        g = df[df["variant"] == v].set_index("name")["cycles"]
        left = 0
        for name in names:
            c = int(g.get(name, 0))
            if c <= 0:
                continue
            seen[name] = None
            bar = ax.barh(row, c, left=left, color=_color_for(by, name), edgecolor="white", linewidth=0.6,
                          label=name)[0]
            bar.set_gid(f"attribution:{v}:{name}")
            total = int(g.sum())
            texts.append((ax.text(left + c / 2, row, f"{100 * c / total:.0f}%", ha="center", va="center",
                                  fontsize=7, color=text_color(_color_for(by, name))), bar))
            left += c
        totals.append(left)
        ax.text(left, row, f"  {left:,}", va="center", fontsize=8)
    ax.set_yticks(range(len(variants)))
    ax.set_yticklabels(variants)
    ax.set_ylim(len(variants) - 0.5, -0.5)
    ax.set_xlim(0, max(totals + [1]) * 1.12)
    cycle_axis(ax.xaxis)
    ax.set_xlabel("critical-path cycles (each bar adds up to the variant's end-to-end cycles)")
    ax.set_title(title if title is not None else f"critical path by {by}", loc="left", fontsize=10)
    if legend and seen:
        ax.legend(handles=[Patch(color=_color_for(by, n), label=n) for n in seen], loc="upper left",
                  bbox_to_anchor=(1.005, 1.0), fontsize=8, frameon=False, borderaxespad=0.0)
    fig = ax.figure
    fig.draw_without_rendering()
    renderer = fig.canvas.get_renderer()
    for t, bar in texts:  # a share that does not fit its segment is left out, never drawn across its edges
        if t.get_window_extent(renderer).width > bar.get_window_extent(renderer).width - 2:
            t.set_text("")
    return ax


def attribution_figure(table: Any, title: str | None = None) -> plt.Figure:
    """:func:`attribution` by engine unit above :func:`attribution` by cause, one bar per variant in each.

    Returns:
        The Figure (two Axes).

    Raises:
        ValidationError: a bad ``table`` (as :func:`attribution`).
    """
    df = _attribution_frame(table)
    n = df["variant"].nunique()
    fig, (a, b) = plt.subplots(2, 1, figsize=(10.5, 1.6 + 1.1 * n), layout="constrained")
    attribution(df, ax=a, by="engine", title="critical path by engine unit: which unit's work the path runs through")
    attribution(df, ax=b, by="cause", title="critical path by cause: what bound the start of each stage on it")
    a.set_xlabel("")
    if title:
        fig.suptitle(title, x=0.01, ha="left", fontsize=11)
    return fig


def what_if(table: pd.DataFrame, ax: plt.Axes | None = None, *, title: str | None = None) -> plt.Axes:
    """Grouped bars: the end-to-end change when one engine is sped up, per engine, one bar per variant.

    Args:
        table: :func:`kbwork.analysis.what_if` output, one frame per variant
            concatenated with a ``variant`` column (without it, one group).
        ax: Axes to draw on (a new constrained-layout figure when ``None``).
        title: the Axes title (default names the speedup).

    Returns:
        The Axes: the x axis is the end-to-end time saved, in % of each
        variant's baseline (a bar at 0 means that engine is not worth
        speeding up); each bar is labelled with its %. Bars take their
        variant's colour (:data:`VARIANT_COLORS`), or, for one run, their
        engine's (:data:`ENGINE_COLORS`).

    Raises:
        ValidationError: ``table`` lacks the columns of ``analysis.what_if``, or ``ax`` is not an Axes.
    """
    need = {"engine", "speedup", "baseline_cycles", "cycles"}
    if not isinstance(table, pd.DataFrame) or not need <= set(table.columns):
        raise ValidationError(f"plots.what_if: pass analysis.what_if(...) output (columns {', '.join(sorted(need))},"
                              f" plus 'variant' for several).")
    _check_ax(ax, "what_if")
    df = table if "variant" in table.columns else table.assign(variant="")
    variants = list(dict.fromkeys(df["variant"]))
    engines = list(dict.fromkeys(df["engine"]))
    if ax is None:
        ax = _new_axes((8.5, 1.2 + 0.22 * len(engines) * (len(variants) + 1)))
    height = 0.8 / len(variants)
    named = _variant_colors([v for v in variants if v])
    saved_all = []
    for i, v in enumerate(variants):
        g = df[df["variant"] == v].set_index("engine")
        saved = np.array([100.0 * (1 - g.loc[e, "cycles"] / g.loc[e, "baseline_cycles"]) if e in g.index else 0.0
                          for e in engines])
        saved_all.extend(saved)
        y = np.arange(len(engines)) - 0.4 + height * (i + 0.5)
        # several variants: each its colour; one run: each engine's
        color = named[v] if v else [_color_for("engine", e) for e in engines]
        bars = ax.barh(y, saved, height=height * 0.92, color=color, label=v or None)
        for b, s in zip(bars, saved):
            ax.text(b.get_width(), b.get_y() + b.get_height() / 2, f" {s:.1f}%", va="center", fontsize=7)
    ax.set_yticks(range(len(engines)))
    ax.set_yticklabels(engines)
    ax.set_ylim(len(engines) - 0.5, -0.5)
    hi = max(saved_all + [1.0])
    ax.set_xlim(min(0.0, min(saved_all + [0.0]) * 1.2), hi * 1.18)
    ax.axvline(0, color="black", linewidth=0.8)
    ax.set_xlabel("end-to-end cycles saved (% of the variant's own)")
    speedups = sorted(set(df["speedup"]))
    ax.set_title(title if title is not None else
                 f"which engine, {' / '.join(f'{s:g}' for s in speedups)}x faster, moves end-to-end time",
                 loc="left", fontsize=10)
    if any(variants):
        ax.legend(fontsize=8, loc="lower right", frameon=False)
    ax.grid(axis="x", alpha=0.3)
    return ax
