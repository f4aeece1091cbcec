"""Gantt charts of op_logs: one row per engine unit, one colour per stage kind, hazard holds and the critical
path over them; utilisation over time where a window holds more stages than pixels; several variants above
one another on one cycle axis."""

from __future__ import annotations

import inspect
import warnings
from typing import Any, Iterable, Mapping, NamedTuple

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.collections import LineCollection, PolyCollection
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from ..errors import ValidationError
from ..oplog import STAGE_NAMES, check_schema, engine_tracks, require_columns
from .checks import (_check_ax, _check_clock, _check_dpi, _check_flag, _check_hatch, _check_int, _check_options,
                     _check_positive, _check_table, _check_tiles, _check_window, _named_runs, _run_parts)
from .style import (_MOVERS, _PALETTE, CAUSE_COLORS, HOLD_COLOR, STAGE_COLORS, TENSOR_HATCH, DensityWarning, _new_axes,
                    _us_axis, cycle_axis, describe)


def commands_per_tile(op_log: pd.DataFrame) -> int:
    """Commands labelled with one tile's ``iter`` (tile 1, or tile 0 when there is one tile): a decode
    variant's commands per tile, read off its op_log.

    Raises:
        ValidationError: ``op_log`` is not an op_log.
    """
    require_columns(op_log, ("stage", "iter"), "commands_per_tile")
    d = op_log[(op_log["stage"] == "DISPATCH") & (op_log["iter"] >= 0)]
    if d.empty:
        return 0
    it = 1 if (d["iter"] == 1).any() else int(d["iter"].min())
    return int((d["iter"] == it).sum())


def tile_window(op_log: pd.DataFrame, tiles: Iterable[int]) -> tuple[int, int]:
    """The cycle window ``(start, end)`` spanning every stage of the commands labelled with ``tiles``;
    from cycle 0 when the tiles include tile 0, so the first tiles' window shows the prologue (the loads and
    fills before the loop) too.

    Raises:
        ValidationError: ``op_log`` is not an op_log, ``tiles`` is not an iterable of ints, or none of the
            tiles appear in the op_log.
    """
    check_schema(op_log)
    tiles = _check_tiles(tiles, "tile_window")
    sel = op_log[op_log["iter"].isin(tiles)]
    if sel.empty:
        raise ValidationError(f"no stages with iter in {tiles}; the op_log has iters "
                              f"{sorted(op_log['iter'].unique())[:10]}...")
    return (0 if 0 in tiles else int(sel["start"].min())), int(sel["end"].max())


# --- the Gantt chart -------------------------------------------------------------------------------------
class _Drawn(NamedTuple):
    """What one Gantt panel shows, for its legend."""

    stages: tuple[str, ...]
    hatches: tuple[tuple[str, str], ...]
    holds: int
    path: int
    causes: tuple[str, ...]


def _tensor_base(name: str) -> str:
    """``"softmax_merge0.P|V[0:128]"`` -> ``"V"``: the streamed operand of a FETCH, without its slice."""
    return name.rsplit("|", 1)[-1].split("[", 1)[0]


def _hatch_patterns(df: pd.DataFrame, hatch: Mapping[str, str] | None) -> np.ndarray:
    """Per row of ``df``, the hatch of the tensor it moves ("" for none)."""
    out = np.full(len(df), "", dtype=object)
    if not hatch or not len(df):
        return out
    # decide once per distinct tensor name, not once per stage
    tensor = df["tensor"]
    if isinstance(tensor.dtype, pd.CategoricalDtype):
        cats, codes = tensor.cat.categories, tensor.cat.codes.to_numpy()
    else:
        c = pd.Categorical(tensor.astype(str))
        cats, codes = c.categories, c.codes
    per_cat = np.array([hatch.get(_tensor_base(str(c)), "") for c in cats] + [""], dtype=object)
    out = per_cat[codes]  # code -1 (missing) reads the trailing ""
    out[~df["stage"].astype(str).isin(_MOVERS).to_numpy()] = ""
    return out


def _hold_rows(op_log: pd.DataFrame, holds: pd.DataFrame, tracks: tuple[str, ...]) -> np.ndarray:
    """The Gantt row of each hold: the unit that ran the held command's first plan stage."""
    work = op_log[op_log["cmd"].isin(holds["cmd"]) & ~op_log["stage"].isin(["DISPATCH", "PLAN"])]
    first = work.sort_values(["cmd", "start", "seq"], kind="stable").drop_duplicates("cmd")
    unit = dict(zip(first["cmd"].to_numpy().tolist(), first["engine"].astype(str)))
    row_of = {t: i for i, t in enumerate(tracks)}
    sched = row_of.get("PE_SCHEDULER", 0)
    return np.array([row_of.get(unit.get(int(c), ""), sched) for c in holds["cmd"]], dtype=np.float64)


def _check_frame(x: Any, what: str, columns: tuple[str, ...], where: str = "gantt") -> pd.DataFrame:
    if not isinstance(x, pd.DataFrame) or not set(columns) <= set(x.columns):
        raise ValidationError(f"{where}: {what} must be a DataFrame with columns {', '.join(columns)} "
                              f"(Run.{what.replace(' ', '_')}()), got {type(x).__name__}.")
    return x


#: The columns of a frame given as ``holds=`` / ``critical_path=`` (Run.holds(), Run.critical_path()).
_HOLDS_COLUMNS = ("cmd", "plan_end", "release")
_PATH_COLUMNS = ("engine", "start", "end", "cause")


def _check_gantt_options(op_log: pd.DataFrame, where: str, *, highlight: Any = None, legend: Any = True,
                         hatch: Any = None, holds: Any = None, critical_path: Any = None) -> None:
    """The checks of :func:`gantt`'s drawing options, for gantt and for whatever passes them on to it: made
    before anything is drawn, and whether or not the density check will leave holds and the path out."""
    if highlight is not None:
        bad = [c for c in highlight if c not in op_log.columns] if isinstance(highlight, Mapping) else [highlight]
        if bad:
            raise ValidationError(f"{where}: highlight={highlight!r} names no op_log column; use e.g. "
                                  f"{{'cmd': 12}} or {{'iter': 3}}.")
    _check_flag(legend, "legend", where)
    _check_hatch(hatch, where)
    if holds is not None:
        _check_frame(holds, "holds", _HOLDS_COLUMNS, where)
    if critical_path is not None:
        _check_frame(critical_path, "critical path", _PATH_COLUMNS, where)


def _draw_gantt(op_log: pd.DataFrame, ax: plt.Axes, window: tuple[int, int] | None, highlight: dict | None,
                hatch: Mapping[str, str] | None, holds: pd.DataFrame | None,
                critical_path: pd.DataFrame | None) -> _Drawn:
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
    pattern = _hatch_patterns(df, hatch)
    hatched = pattern != ""
    used_hatches: dict[tuple[str, str], None] = {}
    for r, track in enumerate(tracks):  # one collection per engine unit (and one per hatch pattern on it)
        m = row == r
        plain = m & ~hatched
        if plain.any():
            coll = PolyCollection(verts[plain], facecolors=face[plain], edgecolors=edge[plain], linewidths=width)
            coll.set_gid(f"stages:{track}")
            ax.add_collection(coll)
        for pat in sorted(set(pattern[m & hatched])):
            sel = m & (pattern == pat)
            # the hatch takes the collection's edge colour: white lines over the stage's own colour
            coll = PolyCollection(verts[sel], facecolors=face[sel], edgecolors=(1, 1, 1, 0.9), linewidths=0.0,
                                  hatch=pat)
            coll.set_gid(f"stages:{track}:{pat}")
            ax.add_collection(coll)
    if hatched.any():
        for name, pat in (hatch or {}).items():
            if (pattern == pat).any():
                used_hatches[(name, pat)] = None
    n_holds = _draw_holds(ax, op_log, holds, tracks, window) if holds is not None else 0
    n_path, causes = _draw_critical_path(ax, critical_path, tracks, window) if critical_path is not None else (0, ())
    ax.set_yticks(range(len(tracks)))
    ax.set_yticklabels(tracks)
    ax.set_ylim(len(tracks) - 0.5, -0.5)
    if window is not None:
        ax.set_xlim(*window)
    elif len(df):
        ax.set_xlim(0, float(end.max()) * 1.01)
    cycle_axis(ax.xaxis)
    ax.set_xlabel("cycles")
    ax.grid(axis="x", alpha=0.3)
    present = set(df["stage"].astype(str).unique())
    return _Drawn(tuple(k for k in STAGE_NAMES if k in present), tuple(used_hatches), n_holds, n_path, causes)


#: Where a hold bar sits, in rows below its row's centre: inside the row's stages (which span ±0.4).
HOLD_OFFSET = 0.3


def _draw_holds(ax: plt.Axes, op_log: pd.DataFrame, holds: pd.DataFrame, tracks: tuple[str, ...],
                window: tuple[int, int] | None) -> int:
    holds = _check_frame(holds, "holds", _HOLDS_COLUMNS)
    if window is not None:
        lo, hi = window
        holds = holds[(holds["release"] >= lo) & (holds["plan_end"] <= hi)]
    if holds.empty:
        return 0
    # a thin bar along the bottom edge of the held command's row, from its PLAN end to its release: on
    # that row (in the gap below it, it read as the next row's), over its stages
    y = _hold_rows(op_log, holds, tracks) + HOLD_OFFSET
    x0 = holds["plan_end"].to_numpy(np.float64)
    x1 = holds["release"].to_numpy(np.float64)
    segs = np.stack([np.stack([x0, y], axis=1), np.stack([x1, y], axis=1)], axis=1)
    coll = LineCollection(segs, colors=HOLD_COLOR, linewidths=2.2, capstyle="butt", zorder=2.5)
    coll.set_gid("holds")
    ax.add_collection(coll)
    return len(holds)


def _draw_critical_path(ax: plt.Axes, path: pd.DataFrame, tracks: tuple[str, ...],
                        window: tuple[int, int] | None) -> tuple[int, tuple[str, ...]]:
    path = _check_frame(path, "critical path", _PATH_COLUMNS)
    row = pd.Categorical(path["engine"], categories=tracks).codes.astype(np.float64)
    start = path["start"].to_numpy(np.float64)
    end = path["end"].to_numpy(np.float64)
    cause = path["cause"].astype(str).to_numpy()
    keep = np.ones(len(path), bool) if window is None else (end >= window[0]) & (start <= window[1])
    if not keep.any():
        return 0, ()
    h = 0.4
    k = np.flatnonzero(keep)
    verts = np.empty((len(k), 4, 2))
    verts[:, 0, 0] = verts[:, 1, 0] = start[k]
    verts[:, 2, 0] = verts[:, 3, 0] = end[k]
    verts[:, 0, 1] = verts[:, 3, 1] = row[k] - h
    verts[:, 1, 1] = verts[:, 2, 1] = row[k] + h
    outline = PolyCollection(verts, facecolors="none", edgecolors="black", linewidths=1.4, zorder=3)
    outline.set_gid("critical-path")
    ax.add_collection(outline)
    # a link where the path changes unit: from the previous stage's row to this one's, at this start,
    # coloured by what bound this start
    i = k[k > 0]
    i = i[(row[i] != row[i - 1]) & keep[i - 1]]
    causes: tuple[str, ...] = ()
    if len(i):
        down = np.sign(row[i] - row[i - 1])  # from the edge of one stage's bar to the facing edge of the next
        y0, y1 = row[i - 1] + down * h, row[i] - down * h
        segs = np.stack([np.stack([start[i], y0], axis=1), np.stack([start[i], y1], axis=1)], axis=1)
        colors = [CAUSE_COLORS.get(c, "black") for c in cause[i]]
        links = LineCollection(segs, colors=colors, linewidths=1.6, zorder=4)
        links.set_gid("critical-path-links")
        ax.add_collection(links)
        present = set(cause[i])
        causes = tuple(c for c in CAUSE_COLORS if c in present)
    return len(k), causes


def _gantt_handles(drawn: Iterable[_Drawn]) -> list:
    drawn = list(drawn)
    stages = {s for d in drawn for s in d.stages}
    handles: list = [Patch(color=STAGE_COLORS[k], label=k) for k in STAGE_NAMES if k in stages]
    hatches = dict.fromkeys(h for d in drawn for h in d.hatches)
    for name, pat in hatches:
        handles.append(Patch(facecolor=STAGE_COLORS["DMA_READ"], edgecolor="white", hatch=pat,
                             label=f"{name} tiles (hatched)"))
    if any(d.holds for d in drawn):
        handles.append(Line2D([], [], color=HOLD_COLOR, linewidth=2.2, label="hazard hold:\nPLAN end → release"))
    if any(d.path for d in drawn):
        handles.append(Patch(facecolor="none", edgecolor="black", linewidth=1.4, label="critical path"))
        causes = {c for d in drawn for c in d.causes}
        for c in CAUSE_COLORS:
            if c in causes:
                handles.append(Line2D([], [], color=CAUSE_COLORS[c], linewidth=1.6, label=f"  link: {c}"))
    return handles


def _legend(ax: plt.Axes, handles: list) -> None:
    if handles:
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=8, frameon=False,
                  borderaxespad=0.0)


def gantt(op_log: pd.DataFrame, ax: plt.Axes | None = None, window: tuple[int, int] | None = None, *,
          highlight: dict | None = None, clock_ghz: float | None = 1.25, title: str | None = None,
          legend: bool = True, hatch: Mapping[str, str] | None = TENSOR_HATCH,
          holds: pd.DataFrame | None = None, critical_path: pd.DataFrame | None = None,
          dpi: float | None = None) -> plt.Axes:
    """Draw a Gantt chart: one row per engine unit (each DMA channel its own), one colour per stage kind.

    Args:
        op_log: an op_log DataFrame.
        ax: Axes to draw on (a new constrained-layout figure when ``None``).
        window: ``(start, end)`` cycles to show; stages overlapping it are drawn.
        highlight: column -> value (e.g. ``{"cmd": 12}`` or ``{"iter": 3}``);
            matching stages are drawn outlined, the others faded.
        clock_ghz: adds a secondary µs axis on top (``None`` to omit).
        title: the Axes title.
        legend: draw the legend (stage kinds, hatched tensors, holds, critical path).
        hatch: tensor base name -> hatch pattern (:data:`TENSOR_HATCH`: decode's
            V tiles hatched, K tiles plain); ``None`` or ``{}`` for no hatching.
        holds: ``Run.holds()``: each hold drawn as a thin bar from the held
            command's PLAN end to its release, just below the row of the unit
            that ran its first plan stage.
        critical_path: ``Run.critical_path()``: its stages outlined in black,
            and where the path moves to another unit a link coloured by the
            cause that bound the next start (:data:`CAUSE_COLORS`).
        dpi: the resolution the figure will be saved at (default: the figure's),
            for the density check below.

    Returns:
        The Axes. Stages are one PolyCollection per engine unit (plus one per
        hatch pattern on it), holds one LineCollection, the critical path one
        PolyCollection and one LineCollection: 100k stages draw fast. When a
        unit has more stages in the window than the Axes has pixels across, a
        :class:`DensityWarning` says so and how to draw it instead
        (:func:`gantt_or_utilization`, or a narrower window), and holds and the
        critical path are left out (drawn per stage, they would turn every row
        black).

    Raises:
        ValidationError: ``op_log`` is not an op_log, a bad ``window`` or ``highlight``,
            ``holds`` or ``critical_path`` is not such a DataFrame, ``ax`` is not an Axes,
            ``clock_ghz`` or ``dpi`` is not None or a positive finite real, ``hatch`` is not
            None or a mapping str -> matplotlib hatch pattern, or ``legend`` is not a bool.
    """
    require_columns(op_log, ("stage", "engine", "tensor", "start", "end"), "gantt")
    _check_ax(ax, "gantt")
    _check_window(window, "gantt")
    _check_gantt_options(op_log, "gantt", highlight=highlight, legend=legend, hatch=hatch, holds=holds,
                         critical_path=critical_path)
    _check_clock(clock_ghz, "gantt")
    _check_dpi(dpi, "gantt")
    if ax is None:
        ax = _new_axes((12, 3.4))
    width = _axes_width_px(ax, dpi)
    unit, count = _densest(op_log, window)
    if count > width:
        left_out = [what for what, x in (("holds", holds), ("the critical path", critical_path)) if x is not None]
        warnings.warn(DensityWarning(
            f"plots.gantt: {unit} has {count:,} stages in the window but the Axes is {width:.0f} pixels wide, so "
            f"they smear into one band" + (f" ({' and '.join(left_out)} left out: drawn per stage they would cover "
                                           f"every bar)" if left_out else "")
            + "; plots.gantt_or_utilization(...) draws utilisation over time instead, or give a narrower window "
              "(e.g. plots.tile_window(op_log, range(3)))."), stacklevel=2)
        holds = critical_path = None
    drawn = _draw_gantt(op_log, ax, window, highlight, hatch, holds, critical_path)
    _us_axis(ax, clock_ghz)
    if title:
        ax.set_title(title, loc="left", fontsize=10)
    if legend:
        _legend(ax, _gantt_handles([drawn]))
    return ax


# --- long runs: utilisation over time --------------------------------------------------------------------
def too_dense(op_log: pd.DataFrame, window: tuple[int, int] | None, width_px: float) -> bool:
    """Whether some engine unit has more stages in ``window`` than ``width_px`` pixels can show (a Gantt
    would be a smear; :func:`utilization_over_time` says more).

    Raises:
        ValidationError: ``op_log`` is not an op_log, a bad ``window``, or ``width_px`` is not a positive
            finite real.
    """
    require_columns(op_log, ("engine", "start", "end"), "too_dense")
    _check_window(window, "too_dense")
    _check_positive(width_px, "width_px", "too_dense", "the Axes' width in pixels", optional=False)
    return _densest(op_log, window)[1] > width_px


def _densest(op_log: pd.DataFrame, window: tuple[float, float] | None) -> tuple[str, int]:
    """The engine unit with the most stages in ``window``, and how many."""
    df = op_log if window is None else op_log[(op_log["end"] > window[0]) & (op_log["start"] < window[1])]
    if df.empty:
        return "", 0
    counts = pd.Categorical(df["engine"], categories=engine_tracks(op_log["engine"])).value_counts()
    return str(counts.idxmax()), int(counts.max())


def _axes_width_px(ax: plt.Axes, dpi: float | None) -> float:
    fig = ax.figure
    return ax.get_position().width * fig.get_figwidth() * (dpi or fig.dpi)


def utilization_over_time(util: pd.DataFrame, ax: plt.Axes | None = None, *, end: float | None = None,
                          clock_ghz: float | None = 1.25, title: str | None = None,
                          colorbar: bool = True) -> plt.Axes:
    """A heat strip per engine unit: how busy it was in each time bin (for runs too long for a Gantt).

    Args:
        util: :func:`kbwork.analysis.utilization_over_time` output (rows are
            bins indexed by their first cycle, columns engine units in track order).
        ax: Axes to draw on (a new constrained-layout figure when ``None``).
        end: the last bin's end in cycles (default: one bin width after its start).
        clock_ghz: adds a secondary µs axis on top (``None`` to omit).
        title: the Axes title.
        colorbar: draw the busy-fraction colour bar.

    Returns:
        The Axes; rows in the Gantt's order (the first unit on top), colour 0
        (idle, white) to 1 (busy the whole bin).

    Raises:
        ValidationError: ``util`` is not such a table (no bins, no units, columns that are not numbers, an
            op_log), ``end`` is not None or a positive finite real after the last bin's start, ``ax`` is not
            an Axes, ``clock_ghz`` is not None or a positive finite real, or ``colorbar`` is not a bool.
    """
    where = "utilization_over_time"
    _check_table(util, "util", where, "analysis.utilization_over_time(op_log, bins=...)",
                 "one row per bin, one column per engine unit, busy fractions",
                 "pass analysis.utilization_over_time(op_log) instead, or draw the op_log itself with "
                 "plots.gantt_or_utilization(op_log)")
    starts = util.index.to_numpy(np.float64)
    if (np.diff(starts) < 0).any():
        raise ValidationError(f"{where}: util's rows must be bins in order of their first cycle, as "
                              f"analysis.utilization_over_time returns them (sort with util.sort_index()).")
    _check_positive(end, "end", where, "the last bin's end in cycles; None for one bin width after its start")
    if end is not None and not end > starts[-1]:
        raise ValidationError(f"{where}: end={end!r} must come after the last bin's start ({starts[-1]:,g} "
                              f"cycles); pass the last bin's end in cycles, or None.")
    _check_ax(ax, where)
    _check_clock(clock_ghz, where)
    _check_flag(colorbar, "colorbar", where)
    if ax is None:
        ax = _new_axes((12, 3.4))
    if end is None:
        end = starts[-1] + (starts[-1] - starts[-2] if len(starts) > 1 else 1.0)
    edges = np.append(starts, float(end))
    tracks = list(util.columns)
    z = util.to_numpy(np.float64).T
    mesh = ax.pcolormesh(edges, np.arange(len(tracks) + 1) - 0.5, z, cmap="Blues", vmin=0.0, vmax=1.0,
                         shading="flat")
    mesh.set_gid("utilization")
    ax.set_yticks(range(len(tracks)))
    ax.set_yticklabels(tracks)
    ax.set_ylim(len(tracks) - 0.5, -0.5)
    ax.set_xlim(edges[0], edges[-1])
    cycle_axis(ax.xaxis)
    widths = np.diff(edges)
    ax.set_xlabel(f"cycles ({len(starts)} bins of {widths[0]:,.0f} cycles)" if np.allclose(widths, widths[0])
                  else f"cycles ({len(starts)} bins)")
    _us_axis(ax, clock_ghz)
    if colorbar:
        ax.figure.colorbar(mesh, ax=ax, label="busy fraction", pad=0.01, fraction=0.04)
    if title:
        ax.set_title(title, loc="left", fontsize=10)
    return ax


def _bin_edges(op_log: pd.DataFrame, lo: float, hi: float, max_bins: int) -> tuple[np.ndarray, str]:
    """Bin edges over ``[lo, hi]`` and how to describe them. When the op_log labels loop iterations, the
    edges are where every k-th iteration's first DISPATCH starts, so each bin holds whole iterations and a
    periodic schedule shows as flat instead of as a beat between bin and period; otherwise equal bins."""
    d = op_log[(op_log["stage"] == "DISPATCH") & (op_log["iter"] >= 0)] if "iter" in op_log.columns else op_log[:0]
    if not d.empty:
        first = d.groupby("iter")["start"].min().sort_values().to_numpy(np.float64)
        inside = first[(first > lo) & (first < hi)]
        if len(inside) >= 2:
            k = max(1, -(-len(inside) // max(1, max_bins - 1)))
            edges = np.concatenate(([lo], inside[::k], [hi]))
            return np.unique(edges), f"bins of {k} iteration{'s' if k > 1 else ''}, by the first dispatch of each"
    edges = np.linspace(lo, hi, max_bins + 1)
    return edges, f"{max_bins} bins of {edges[1] - edges[0]:,.0f} cycles"


def gantt_or_utilization(op_log: pd.DataFrame, ax: plt.Axes | None = None,
                         window: tuple[int, int] | None = None, *, dpi: float | None = None,
                         max_bins: int | None = None, clock_ghz: float | None = 1.25, title: str | None = None,
                         **gantt_options: Any) -> plt.Axes:
    """A :func:`gantt` when every unit's stages in ``window`` fit the Axes' width in pixels, otherwise
    :func:`utilization_over_time` of the window (what ``kbwork run --gantt`` and ``compare --gantt`` draw).

    Args:
        dpi: the resolution the figure will be saved at (default: the figure's).
        max_bins: the most bins of the utilisation plot (default: one per 4 pixels of width). Bins hold
            whole loop iterations when the op_log labels them (``iter``), else equal spans of cycles.
        **gantt_options: passed to :func:`gantt` when it is drawn (``holds``, ``critical_path``, ...).

    Returns:
        The Axes; ``ax.get_gid()`` is ``"gantt"`` or ``"utilization"`` (which one was drawn).

    Raises:
        ValidationError: ``op_log`` is not an op_log, ``ax`` is not an Axes, a bad ``window``, ``dpi`` or
            ``clock_ghz`` is not None or a positive finite real, ``max_bins`` is not None or a positive int,
            or a ``gantt_options`` entry that :func:`gantt` does not take or refuses.
    """
    from ..analysis import utilization_over_time as util_over_time

    where = "gantt_or_utilization"
    require_columns(op_log, ("stage", "engine", "tensor", "start", "end"), where)
    _check_ax(ax, where)
    _check_window(window, where)
    _check_dpi(dpi, where)
    _check_int(max_bins, "max_bins", where, "the most bins of the utilisation plot; None for one per 4 pixels",
               optional=True)
    _check_clock(clock_ghz, where)
    _check_options(gantt_options, _GANTT_OPTIONS, where, "plots.gantt")
    _check_gantt_options(op_log, where, **gantt_options)
    if ax is None:
        ax = _new_axes((12, 3.4))
    width = _axes_width_px(ax, dpi)
    if not too_dense(op_log, window, width):
        gantt(op_log, ax=ax, window=window, clock_ghz=clock_ghz, title=title, dpi=dpi, **gantt_options)
        ax.set_gid("gantt")
        return ax
    lo, hi = window if window is not None else (0, int(op_log["end"].max()))
    edges, how = _bin_edges(op_log, float(lo), float(hi), max_bins or max(1, int(width // 4)))
    util = util_over_time(op_log, bins=edges)
    utilization_over_time(util, ax=ax, end=edges[-1], clock_ghz=clock_ghz, title=title)
    ax.set_xlabel(f"cycles ({how})")
    ax.set_gid("utilization")
    return ax


#: What :func:`gantt_or_utilization` passes on to :func:`gantt`: every option it does not set itself.
_GANTT_OPTIONS = tuple(p for p in inspect.signature(gantt).parameters
                       if p not in ("op_log", "ax", "window", "clock_ghz", "title", "dpi"))


# --- several variants side by side ------------------------------------------------------------------------
def compare_gantt(runs: Any, second: pd.DataFrame | None = None, tiles: int = 3,
                  clock_ghz: float | None | str = "auto", *, holds: bool = False, critical_path: bool = False,
                  hatch: Mapping[str, str] | None = TENSOR_HATCH, title: str | None = None,
                  dpi: float | None = None) -> plt.Figure:
    """Every variant above the next on one cycle axis, from cycle 0 to the end of tile ``tiles - 1`` of the
    slowest.

    Args:
        runs: a ``decode.Comparison``, or a dict name -> op_log, Run or
            ``decode.DecodeRun`` (any number, drawn in that order). The old
            call ``compare_gantt(op_log_a, op_log_b, tiles)`` still works.
        second: the second op_log of the old call only (labelled opt3, the first opt2).
        tiles: the first tiles to show.
        clock_ghz: the clock of the µs axis; ``"auto"`` takes the runs'
            topology's (1.25 GHz for bare op_logs), ``None`` omits the axis.
        holds, critical_path: draw each variant's hazard holds and critical
            path (:func:`gantt`); these need runs, not bare op_logs.
        hatch: as in :func:`gantt`.
        title: the figure title (default: the runs' sizes and calibration, when known).
        dpi: the resolution the figure will be saved at: a panel whose units
            have more stages in the window than the panel has pixels becomes a
            utilisation-over-time plot (:func:`gantt_or_utilization`).

    Returns:
        The Figure, one Axes per variant (plus colour bars of utilisation panels).

    Raises:
        ValidationError: no variants, a variant without the tiles asked for,
            ``holds``/``critical_path`` with bare op_logs or not a bool, ``tiles``
            not a positive int, ``clock_ghz`` not ``"auto"``, None or a positive
            finite real, ``dpi`` not None or a positive finite real, or ``hatch``
            not None or a mapping str -> matplotlib hatch pattern.
    """
    where = "compare_gantt"
    named = _named_runs(runs, second, where)
    _check_int(tiles, "tiles", where, "how many tiles to show from the first, e.g. 3")
    _check_clock(clock_ghz, where, auto=True)
    _check_flag(holds, "holds", where)
    _check_flag(critical_path, "critical_path", where)
    _check_hatch(hatch, where)
    _check_dpi(dpi, where)
    parts = {name: _run_parts(x) for name, x in named.items()}
    if (holds or critical_path) and any(r is None for _, r, _ in parts.values()):
        bare = [n for n, (_, r, _) in parts.items() if r is None]
        raise ValidationError(f"compare_gantt: holds/critical_path need runs, but {', '.join(bare)} "
                              f"{'is a bare op_log' if len(bare) == 1 else 'are bare op_logs'}; pass a "
                              f"decode.Comparison or a dict name -> run.")
    if clock_ghz == "auto":
        clocks = [r.topology.clock_ghz for _, r, _ in parts.values() if r is not None]
        clock_ghz = clocks[0] if clocks else 1.25
    wins = {name: tile_window(log, range(tiles)) for name, (log, _, _) in parts.items()}
    hi = max(w[1] for w in wins.values())
    n = len(parts)
    fig, axes = plt.subplots(n, 1, figsize=(13, 0.6 + 2.5 * n), sharex=True, layout="constrained", squeeze=False)
    axes = axes[:, 0]
    drawn = []
    for i, (ax, (name, (log, run, _params))) in enumerate(zip(axes, parts.items())):
        k = commands_per_tile(log)
        who = f"{name} ({k} command{'s' if k != 1 else ''} per tile)"
        end = f" (the run takes {run.cycles:,} cycles)" if run is not None else ""
        label = f"{who}: first {tiles} tiles{end}"
        clock = clock_ghz if i == 0 else None  # one µs axis, on top of the figure; the panels share it
        if too_dense(log, (0, hi), _axes_width_px(ax, dpi)):
            gantt_or_utilization(log, ax=ax, window=(0, hi), dpi=dpi, clock_ghz=clock,
                                 title=f"{who}: utilisation over the first {tiles} tiles{end}")
            continue
        drawn.append(_draw_gantt(log, ax, (0, hi), None, hatch, run.holds() if holds else None,
                                 run.critical_path() if critical_path else None))
        ax.set_gid("gantt")
        _us_axis(ax, clock)
        ax.set_title(label, loc="left", fontsize=10)
    for ax in axes[:-1]:
        ax.set_xlabel("")
    if drawn:  # one legend for every panel, beside them (constrained layout makes room for it)
        fig.legend(handles=_gantt_handles(drawn), loc="outside right upper", fontsize=8, frameon=False)
    if title is None:
        params = [p for _, _, p in parts.values() if p]
        title = describe(params[0]) if params else None
    if title:
        fig.suptitle(title, x=0.01, ha="left", fontsize=11)
    return fig
