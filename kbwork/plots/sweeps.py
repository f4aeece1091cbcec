"""Sweeps in pictures: each variant against one axis, heat maps of ratios in small multiples, the fastest
variant at every point, and cycles grouped by one axis."""

from __future__ import annotations

import textwrap
from collections.abc import Hashable
from typing import Any, Iterable, NamedTuple

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.colors import TwoSlopeNorm
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, MaxNLocator

from ..errors import ValidationError
from .checks import _check_ax, _check_baseline, _check_center, _check_column_name, _level_list
from .style import _fmt_value, _new_axes, _variant_colors, axis_label, cycle_axis, facet_title, text_color


def scaling(sweep_df: pd.DataFrame, ax: plt.Axes | None = None, x: str = "kv_len", *, baseline: str = "opt2",
            kind: str = "ratio", title: str | None = None) -> plt.Axes:
    """End-to-end cycles of every variant against ``x``.

    ``sweep_df`` is a :func:`kbwork.decode.sweep` result with one value of every other axis.

    Args:
        kind: ``"ratio"`` (default): each other variant's end-to-end cycles
            divided by ``baseline``'s, so a few-percent gap is visible (a
            dotted line at 1 marks a tie); ``"cycles"``: end-to-end (solid)
            and total dispatch cycles (dashed) on log-log axes.
        baseline: the variant the ratios divide by.
        title: the Axes title.

    Returns:
        The Axes (x on a log2 scale).

    Raises:
        ValidationError: a bad ``kind``, ``x`` not a column name, ``baseline`` not in the sweep, or ``ax``
            not an Axes.
    """
    if not isinstance(kind, str) or kind not in ("ratio", "cycles"):
        raise ValidationError(f"scaling: kind={kind!r}; use 'ratio' or 'cycles'.")
    _check_column_name(x, "x", "scaling")
    need = {"variant", "cycles", "dispatch_total", x}
    if not isinstance(sweep_df, pd.DataFrame) or not need <= set(sweep_df.columns) or sweep_df.empty:
        raise ValidationError(f"scaling: expected a non-empty decode.sweep() DataFrame with columns "
                              f"{', '.join(sorted(need))}.")
    _check_ax(ax, "scaling")
    if kind == "ratio":
        _check_baseline(sweep_df, baseline, "scaling")
    if ax is None:
        ax = _new_axes((7, 4))
    colors = _variant_colors(sorted(set(sweep_df["variant"])))
    ax.set_xscale("log", base=2)
    ax.set_xlabel(axis_label(x))
    if title:
        ax.set_title(title, loc="left", fontsize=10)
    if kind == "cycles":
        for variant, g in sweep_df.groupby("variant", sort=True):
            g = g.sort_values(x)
            c = colors.get(variant)
            ax.plot(g[x], g["cycles"], "o-", color=c, label=f"{variant} end-to-end")
            ax.plot(g[x], g["dispatch_total"], "s--", color=c, alpha=0.7, label=f"{variant} dispatch (PE_CPU)")
        ax.set_yscale("log")
        ax.set_ylabel("cycles")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
        return ax
    wide = sweep_df.pivot_table(index=x, columns="variant", values="cycles", aggfunc="first").sort_index()
    ratios = []
    for variant in [v for v in wide.columns if v != baseline]:
        r = wide[variant] / wide[baseline]
        ratios.extend(r.to_numpy())
        ax.plot(r.index, r.to_numpy(), "o-", color=colors.get(variant), label=f"{variant} / {baseline}")
        for xv, yv in zip(r.index, r.to_numpy()):
            ax.annotate(f"{yv:.3f}", (xv, yv), textcoords="offset points", xytext=(0, 7), ha="center", fontsize=7)
    ax.axhline(1.0, color="black", linestyle=":", linewidth=1)
    lo, hi = min(ratios + [1.0]), max(ratios + [1.0])
    pad = max(0.01, 0.15 * (hi - lo))
    ax.set_ylim(lo - pad, hi + pad)
    ax.set_xticks(list(wide.index))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:,.0f}"))
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    ax.set_ylabel(f"end-to-end cycles / {baseline}'s  (> 1: {baseline} faster)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    return ax


def ratio_norm(values: Any, center: float = 1.0) -> TwoSlopeNorm:
    """A colour norm centred on ``center``, as far below it as above: ``center`` ± the largest distance of
    ``values`` from it. The colour bar then has ``center`` in its middle and both sides visible, and a colour
    reads the same distance from ``center`` on either side (a table of ratios all above 1 uses the upper
    half of the colours, which says so).

    Raises:
        ValidationError: ``values`` are not numbers, or ``center`` is not a finite real.
    """
    _check_center(center, "ratio_norm")
    try:
        v = np.asarray(values, np.float64)
    except (TypeError, ValueError):
        raise ValidationError(f"ratio_norm: values must be numbers (an array or Series of ratios), got "
                              f"{type(values).__name__}.") from None
    v = v[np.isfinite(v)]
    span = max(float(np.abs(v - center).max()) if v.size else 0.0, 1e-9)
    return TwoSlopeNorm(vcenter=center, vmin=center - span, vmax=center + span)


class _Facets(NamedTuple):
    """The panels of a small-multiples figure: the facet levels and, for each panel, its key."""

    row_levels: list[str]
    col_levels: list[str]
    rows: list[tuple]
    cols: list[tuple]

    def select(self, obj: pd.Series | pd.DataFrame, r: tuple, c: tuple) -> Any:
        """The part of ``obj`` in panel (r, c), the facet levels dropped; ``None`` when it holds nothing."""
        levels, key = self.row_levels + self.col_levels, r + c
        if not levels:
            return obj
        try:
            return obj.xs(key if len(key) > 1 else key[0], level=levels if len(levels) > 1 else levels[0])
        except KeyError:
            return None

    def name(self, r: tuple, c: tuple) -> str:
        """The panel's title in words (:func:`facet_title`): its row facets on one line, its column facets
        on the next."""
        def line(levels: list[str], key: tuple) -> str:
            return " · ".join(facet_title(lev, v) for lev, v in zip(levels, key))

        return "\n".join(x for x in (line(self.row_levels, r), line(self.col_levels, c)) if x)


def _facets(index: pd.Index, *, row: str, col: str, facet_row: Any, facet_col: Any, where: str,
            facet_col_arg: str = "facet_col") -> _Facets:
    """Check that ``index`` has exactly the levels row, col and the facets; list the panels in index order."""
    fr = _level_list(facet_row, "facet_row", where)
    fc = _level_list(facet_col, facet_col_arg, where)
    for name, level in (("row", row), ("col", col)):
        if not isinstance(level, Hashable):
            raise ValidationError(f"{where}: {name} must be an index level name (e.g. 'kv_len'), got {level!r:.60}.")
    levels = list(index.names)
    want = [row, col, *fr, *fc]
    if len(set(want)) != len(want) or set(want) != set(levels):
        raise ValidationError(f"{where}: the index has levels {levels}; row, col and the facets must name each of "
                              f"them once (fix any other level first, e.g. with .xs(value, level=name)).")

    def keys(names: list[str]) -> list[tuple]:
        if not names:
            return [()]
        return list(dict.fromkeys(zip(*(index.get_level_values(n) for n in names))))

    return _Facets(fr, fc, keys(fr), keys(fc))


def ratio_heatmaps(ratios: pd.Series, *, facet: str | Iterable[str], row: str, col: str,
                   facet_row: str | Iterable[str] | None = None, center: float = 1.0, label: str = "ratio",
                   cmap: str = "RdBu", fmt: str = "{:.2f}") -> plt.Figure:
    """One heat map per value of ``facet`` (a row of panels; a grid with ``facet_row``), all on one colour
    scale centred on ``center`` (:func:`ratio_norm`).

    Args:
        ratios: a Series with a MultiIndex holding exactly the levels ``row``, ``col`` and the facets
            (e.g. ``wide["opt3/opt2"]`` of a pivoted sweep).
        facet: the index level (or levels) whose values make the columns of panels.
        facet_row: the index level (or levels) whose values make the rows of panels.
        row, col: the index levels for each panel's rows and columns.
        label: the colour bar's label.

    Returns:
        The Figure; every cell is written with its value (white on dark cells). The colour bar has
        ``center`` in its middle, both sides of it shown (:func:`ratio_norm`).

    Raises:
        ValidationError: ``ratios`` is not a Series of numbers, the levels are not those of the index,
            ``center`` is not a finite real, ``cmap`` is not a matplotlib colormap, or ``fmt`` is not a
            format string for one number.
    """
    where = "ratio_heatmaps"
    got = (type(ratios).__name__ if not isinstance(ratios, pd.Series) else "an empty Series" if ratios.empty
           else None if pd.api.types.is_numeric_dtype(ratios.dtype) else f"a Series of {ratios.dtype}")
    if got is not None:
        raise ValidationError(f"{where}: ratios must be a non-empty pandas Series of numbers whose index holds the "
                              f"levels row, col and the facets (e.g. wide['opt3/opt2'] of a pivoted sweep), got "
                              f"{got}.")
    panels = _facets(ratios.index, row=row, col=col, facet_row=facet_row, facet_col=facet, where=where,
                     facet_col_arg="facet")
    _check_center(center, where)
    try:
        cm = plt.get_cmap(cmap)
    except (TypeError, ValueError):
        raise ValidationError(f"{where}: cmap={cmap!r:.60} is not a matplotlib colormap; pass a name such as "
                              f"'RdBu' or a Colormap.") from None
    try:  # a format that a number cannot fill fails on the first cell; refuse it before drawing
        formats = isinstance(fmt, str) and isinstance(fmt.format(1.0), str)
    except (TypeError, ValueError, IndexError, KeyError, AttributeError):
        formats = False
    if not formats:
        raise ValidationError(f"{where}: fmt={fmt!r:.60} must be a format string for one number, e.g. "
                              f"'{{:.2f}}'.")
    norm = ratio_norm(ratios.to_numpy(), center)
    nr, nc = len(panels.rows), len(panels.cols)
    fig, axes = plt.subplots(nr, nc, figsize=(4.3 * nc + 1.2, 3.2 * nr + 0.4), sharey=True, layout="constrained",
                             squeeze=False)
    im = None
    for i, r in enumerate(panels.rows):
        for j, c in enumerate(panels.cols):
            ax = axes[i, j]
            part = panels.select(ratios, r, c)
            if part is None:
                ax.set_axis_off()
                continue
            t = part.unstack(col).sort_index()
            z = t.to_numpy(np.float64)
            im = ax.imshow(z, cmap=cm, norm=norm, aspect="auto")
            for (a, b), v in np.ndenumerate(z):
                if np.isnan(v):
                    continue
                red, green, blue, _ = cm(norm(v))
                dark = 0.299 * red + 0.587 * green + 0.114 * blue < 0.5
                ax.text(b, a, fmt.format(v), ha="center", va="center", fontsize=9, color="white" if dark else "black")
            ax.set_xticks(range(t.shape[1]), [_fmt_value(v) for v in t.columns])
            ax.set_yticks(range(t.shape[0]), [_fmt_value(v) for v in t.index])
            ax.set_xlabel(axis_label(col))
            ax.set_title(panels.name(r, c), fontsize=10)
        axes[i, 0].set_ylabel(axis_label(row))
    cbar = fig.colorbar(im, ax=axes.ravel().tolist(), label=label)
    cbar.ax.set_yscale("linear")  # the norm is symmetric: linear keeps the centre in the middle
    cbar.ax.yaxis.set_major_locator(MaxNLocator(nbins=8, steps=[1, 2, 5, 10]))
    cbar.ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:.2f}"))
    return fig


def _pct(x: float) -> str:
    """``0.134`` -> ``"+13%"``, ``0.034`` -> ``"+3.4%"``, ``0.0002`` -> ``"+0.02%"``: a whole percent from 10 %,
    two decimals under 0.1 %, so a small gap does not read as none."""
    p = 100 * x
    return f"+{p:.0f}%" if p >= 9.95 else f"+{p:.1f}%" if p >= 0.095 else f"+{p:.2f}%"


def winner_map(table: pd.DataFrame, *, row: str, col: str, facet_row: str | Iterable[str] | None = None,
               facet_col: str | Iterable[str] | None = None, focus: str | None = None,
               title: str | None = None) -> plt.Figure:
    """Small multiples of which variant is fastest end to end: one panel per facet value, one cell per
    (row, col) value, coloured by the fastest variant.

    Args:
        table: :func:`kbwork.analysis.winners` output, its index holding exactly the levels
            ``row``, ``col`` and the facets.
        row, col: the index levels for each panel's rows and columns.
        facet_row, facet_col: the index level (or levels) whose values make the rows and the
            columns of panels.
        focus: a variant to follow. Each cell reads the fastest variant, then ``"<v> +x%"``: how much
            longer ``focus`` takes than the fastest, or, where ``focus`` is the fastest, how much
            longer the next fastest takes. Without ``focus`` the second line is always the next fastest.
        title: the figure title.

    Returns:
        The Figure. Each panel's image has the gid ``winners``; the legend (below the panels) names the
        colours and says what the second line is.

    Raises:
        ValidationError: not a winners table, the levels are not those of the index, or ``focus`` is not
            one of its variants.
    """
    if not isinstance(table, pd.DataFrame) or not {"best", "runner_up", "margin"} <= set(table.columns):
        raise ValidationError("winner_map: pass analysis.winners(sweep) output (columns best, runner_up, margin, "
                              "<variant>/best).")
    variants = [c[:-len("/best")] for c in table.columns if isinstance(c, str) and c.endswith("/best")]
    if focus is not None and focus not in variants:
        raise ValidationError(f"winner_map: focus {focus!r} is not one of the table's variants "
                              f"({', '.join(variants)}).")
    panels = _facets(table.index, row=row, col=col, facet_row=facet_row, facet_col=facet_col, where="winner_map")
    colors = _variant_colors(variants)
    nr, nc = len(panels.rows), len(panels.cols)
    fig, axes = plt.subplots(nr, nc, figsize=(3.0 * nc + 0.6, 2.6 * nr + 1.2), sharey=True, layout="constrained",
                             squeeze=False)
    seen: dict[str, None] = {}
    for i, r in enumerate(panels.rows):
        for j, c in enumerate(panels.cols):
            ax = axes[i, j]
            part = panels.select(table, r, c)
            if part is None:
                ax.set_axis_off()
                continue
            best = part["best"].unstack(col).sort_index()
            rows_, cols_ = list(best.index), list(best.columns)
            rgb = np.ones((len(rows_), len(cols_), 3))
            for (a, b), v in np.ndenumerate(best.to_numpy(object)):
                if not isinstance(v, str):
                    continue
                seen[v] = None
                rgb[a, b] = matplotlib.colors.to_rgb(colors[v])
                cell = part.xs((rows_[a], cols_[b]), level=[row, col]).iloc[0]
                if focus is None or v == focus:
                    detail = f"{cell['runner_up']} {_pct(cell['margin'])}"
                else:
                    detail = f"{focus} {_pct(cell[f'{focus}/best'] - 1)}"
                ax.text(b, a, f"{v}\n{detail}", ha="center", va="center", fontsize=8, linespacing=1.3,
                        color=text_color(rgb[a, b]))
            im = ax.imshow(rgb, aspect="auto", interpolation="nearest")
            im.set_gid("winners")
            ax.set_xticks(range(len(cols_)), [_fmt_value(v) for v in cols_])
            ax.set_yticks(range(len(rows_)), [_fmt_value(v) for v in rows_])
            ax.set_xlabel(axis_label(col))
            ax.set_title(panels.name(r, c), fontsize=9)
        axes[i, 0].set_ylabel(axis_label(row))
    what = (f"second line: how much longer {focus} takes than the fastest (where {focus} is fastest: the next "
            f"fastest)" if focus is not None else "second line: how much longer the next fastest variant takes")
    # the legend title says how to read a cell: wrapped to the figure's width (about 0.6 em a character)
    chars = max(30, int(fig.get_figwidth() * 72 / (0.6 * 9)))
    fig.legend(handles=[Patch(color=colors[v], label=f"{v} fastest") for v in variants if v in seen],
               loc="outside lower center", ncols=len(seen) or 1, fontsize=9, frameon=False,
               title=textwrap.fill(f"cell colour: the fastest variant end to end; {what}", chars), title_fontsize=9)
    if title:
        fig.suptitle(title, x=0.01, ha="left", fontsize=11)
    return fig


def cycles_bars(sweep_df: pd.DataFrame, group: str = "hazard_policy", ax: plt.Axes | None = None, *,
                order: Iterable[Any] | None = None, baseline: str | None = None, title: str | None = None) -> plt.Axes:
    """Grouped bars of end-to-end cycles: one group per value of ``group``, one bar per variant.

    Args:
        sweep_df: :func:`kbwork.decode.sweep` rows with one value of every other axis.
        group: the sweep column to group by.
        order: the groups' order; for ``hazard_policy`` the default is the
            topology's default policy first (strict FIFO, then rw_aware).
        baseline: each group is labelled with every other variant's cycles over this one's; None: opt2's when
            the sweep has it (else no ratio labels).

    Returns:
        The Axes; every bar is labelled with its cycles.

    Raises:
        ValidationError: ``sweep_df`` is not a non-empty sweep, ``group`` is not a column, ``order`` is not
            an iterable of exactly the groups, a ``baseline`` given that is not in the sweep, or ``ax`` is not an
            Axes.
    """
    from ..config import HAZARD_POLICIES

    where = "cycles_bars"
    if not isinstance(sweep_df, pd.DataFrame) or sweep_df.empty or not {"variant", "cycles"} <= set(sweep_df.columns):
        raise ValidationError(f"{where}: expected a non-empty decode.sweep() DataFrame with columns cycles, variant "
                              f"and the group's, got {type(sweep_df).__name__}.")
    _check_column_name(group, "group", where)
    if group not in sweep_df.columns:
        raise ValidationError(f"{where}: no column {group!r} in the sweep.")
    if baseline is not None:
        _check_baseline(sweep_df, baseline, where)
    else:
        baseline = "opt2"  # labelled when present, as before a baseline could be named
    _check_ax(ax, where)
    present = list(dict.fromkeys(sweep_df[group]))
    if order is None:
        order = [p for p in HAZARD_POLICIES if p in present] if group == "hazard_policy" else sorted(present)
    if isinstance(order, (str, bytes)) or not isinstance(order, Iterable):
        raise ValidationError(f"{where}: order must be a list of the groups ({present}) in the order to draw "
                              f"them, or None, got {order!r:.60}.")
    order = list(order)
    # hashable first: set() of an unhashable group would be a TypeError
    if not all(isinstance(g, Hashable) for g in order) or set(order) != set(present):
        raise ValidationError(f"{where}: order {order} must list exactly the groups {present}.")
    wide = sweep_df.pivot_table(index=group, columns="variant", values="cycles", aggfunc="first").reindex(order)
    variants = list(wide.columns)
    if ax is None:
        ax = _new_axes((6.5, 3.8))
    colors = _variant_colors(variants)
    width = 0.8 / len(variants)
    for i, v in enumerate(variants):
        xs = np.arange(len(order)) - 0.4 + width * (i + 0.5)
        bars = ax.bar(xs, wide[v].to_numpy(), width=width * 0.92, color=colors.get(v), label=v)
        for b in bars:
            ax.text(b.get_x() + b.get_width() / 2, b.get_height(), f"{b.get_height():,.0f}", ha="center",
                    va="bottom", fontsize=7)
    labels = []
    for g in order:
        text = _fmt_value(g)
        if baseline in wide.columns:
            text += "".join(f"\n{v}/{baseline} = {wide.loc[g, v] / wide.loc[g, baseline]:.3f}"
                            for v in variants if v != baseline)
        labels.append(text)
    ax.set_xticks(range(len(order)), labels)
    ax.set_ylim(0, float(np.nanmax(wide.to_numpy())) * 1.12)
    cycle_axis(ax.yaxis)
    ax.set_ylabel("end-to-end cycles")
    ax.set_xlabel(axis_label(group))
    if title:
        ax.set_title(title, loc="left", fontsize=10)
    ax.legend(fontsize=8, loc="upper right", frameon=False)
    return ax
