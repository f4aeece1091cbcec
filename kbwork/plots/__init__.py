"""Plots of op_logs and of where a run's time went: pure functions that take DataFrames and an optional Axes.

Every function returns the matplotlib Axes (or Figure) it drew on, so a
notebook, a test and the command line call the same code. A function that
makes its own figure lays it out with ``constrained_layout``, so labels,
legends and the µs axis stay inside the figure when it is saved.

Artists the tests (and anyone styling a figure) look for carry a ``gid``:
``stages:<unit>`` (one PolyCollection of stages per engine unit),
``stages:<unit>:<hatch>`` (the hatched stages of one unit, e.g. V tiles),
``holds`` (one segment per hazard hold), ``critical-path`` (one outline per
critical-path stage), ``critical-path-links`` (one segment per change of
unit along the path) and ``winners`` (the image of each winner-map panel).

One palette everywhere: a stage kind, an engine, a critical-path cause and a
decode variant each have their colour (:data:`STAGE_COLORS`,
:data:`ENGINE_COLORS`, :data:`CAUSE_COLORS`, :data:`VARIANT_COLORS`); any
other category (a command of a tile, a variant without a colour of its own)
takes the next of :data:`PALETTE`. Text on a coloured fill is white on a dark
one and black on a light one. A figure has one µs axis (on top), facet titles
and axis labels in words (``FIXED = 0 cycles``, not ``fixed_cycles = 0``).
"""

from __future__ import annotations

import inspect
import math
import numbers
import textwrap
import warnings
from collections.abc import Hashable
from typing import Any, Iterable, Mapping, NamedTuple

import matplotlib
import matplotlib.axes
import matplotlib.axis
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.collections import LineCollection, PolyCollection
from matplotlib.colors import TwoSlopeNorm
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.rcsetup import validate_hatch
from matplotlib.ticker import FuncFormatter, MaxNLocator

from ..errors import ValidationError
from ..oplog import STAGE_NAMES, check_schema, engine_tracks, require_columns

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
#: One colour per engine, the colour of the stage kind it mostly runs (attribution by engine).
ENGINE_COLORS = {
    "PE_CPU": STAGE_COLORS["DISPATCH"],
    "PE_SCHEDULER": STAGE_COLORS["PLAN"],
    "PE_DMA": STAGE_COLORS["DMA_READ"],
    "PE_GEMM": STAGE_COLORS["GEMM"],
    "PE_MATH": STAGE_COLORS["MATH"],
}
#: One colour per critical-path cause (Paul Tol's vibrant scheme; attribution by cause, path links).
CAUSE_COLORS = {
    "engine": "#BBBBBB",
    "dependency": "#33415C",
    "hazard": "#CC3311",
    "queue": "#EE7733",
    "wait": "#33BBEE",
    "scheduler": "#EE3377",
    "order": "#009988",
}
#: Hatch pattern by tensor: the stages that move it (DMA_READ, DMA_WRITE, and FETCH of it as the
#: streamed operand) are hatched. A tensor is named by its base name, the part before any ``[rows]``
#: slice: decode's V tiles (``V[0:128]``, ...) are hatched, its K tiles plain.
TENSOR_HATCH = {"V": "////"}
#: One colour per decode variant (sweep plots, the winner map, what-if bars); other variants take
#: :data:`PALETTE` colours.
VARIANT_COLORS = {"opt2": "#0072B2", "opt3": "#D55E00", "a1": "#009E73"}
#: The colour of the hazard-hold bars on a Gantt.
HOLD_COLOR = "#7B1E3A"
#: Every other category, in order: Okabe-Ito's colour-blind-safe eight, then Paul Tol's muted nine.
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#56B4E9", "#CC79A7", "#F0E442", "#999999",
           "#332288", "#88CCEE", "#44AA99", "#117733", "#999933", "#DDCC77", "#CC6677", "#882255", "#AA4499")


class DensityWarning(UserWarning):
    """A Gantt window holds more stages on one row than the Axes has pixels across: they smear."""


#: Sweep axes and decode parameters in words, with their unit: facet titles and axis labels.
AXIS_WORDS = {
    "fixed_cycles": ("FIXED", "cycles"), "r_cycles_per_byte": ("R", "cycles/byte"), "kv_len": ("kv length", "tokens"),
    "tile": ("tile", "rows"), "group": ("group G", "query rows"), "head_dim": ("head dim d", None),
    "dtype": ("dtype", None), "hazard_policy": ("hazard policy", None), "dma_channels": ("DMA channels", None),
}
#: Values in words (hazard policies).
VALUE_WORDS = {"strict_fifo": "strict FIFO", "rw_aware": "rw-aware"}


def _words_of(name: Any, where: str) -> tuple[Any, str | None]:
    if not isinstance(name, Hashable):
        raise ValidationError(f"{where}: name must be a column or index level name (e.g. 'kv_len'), got "
                              f"{type(name).__name__} {name!r:.60}.")
    return AXIS_WORDS.get(name, (name, None))


def axis_label(name: str) -> str:
    """An axis label for a sweep column: ``"fixed_cycles"`` -> ``"FIXED (cycles)"``; others as given.

    Raises:
        ValidationError: ``name`` cannot name a column (a list, a dict, ...).
    """
    words, unit = _words_of(name, "axis_label")
    return f"{words} ({unit})" if unit else words


def facet_title(name: str, value: Any) -> str:
    """A facet's title: ``("fixed_cycles", 0)`` -> ``"FIXED = 0 cycles"``, ``("hazard_policy", "rw_aware")``
    -> ``"hazard policy = rw-aware"``.

    Raises:
        ValidationError: ``name`` cannot name a column (a list, a dict, ...).
    """
    words, unit = _words_of(name, "facet_title")
    return f"{words} = {_fmt_value(value)}" + (f" {unit}" if unit else "")


def text_color(fill: Any) -> str:
    """Black or white, whichever reads on ``fill`` (any matplotlib colour).

    Raises:
        ValidationError: ``fill`` is not a matplotlib colour.
    """
    try:
        r, g, b = matplotlib.colors.to_rgb(fill)
    except (TypeError, ValueError):
        raise ValidationError(f"text_color: fill={fill!r:.60} is not a matplotlib colour; pass e.g. '#0072B2', "
                              f"'white' or an (r, g, b) tuple.") from None
    return "white" if 0.299 * r + 0.587 * g + 0.114 * b < 0.5 else "black"

_PALETTE = np.array([matplotlib.colors.to_rgba(STAGE_COLORS[k]) for k in STAGE_NAMES])
_MOVERS = ("DMA_READ", "DMA_WRITE", "FETCH")


# --- small helpers ---------------------------------------------------------------------------------------
def cycle_axis(axis: matplotlib.axis.Axis) -> None:
    """Integer cycle ticks on ``axis`` (``ax.xaxis``): whole numbers with thousands separators, no
    scientific notation and no offset (never "1e6" in a corner).

    Raises:
        ValidationError: ``axis`` is not a matplotlib Axis (an Axes, say: pass ``ax.xaxis`` or ``ax.yaxis``).
    """
    if not isinstance(axis, matplotlib.axis.Axis):
        raise ValidationError(f"cycle_axis: axis must be a matplotlib Axis (ax.xaxis or ax.yaxis), got "
                              f"{type(axis).__name__}.")
    axis.set_major_locator(MaxNLocator(nbins="auto", steps=[1, 2, 2.5, 5, 10], integer=True))
    axis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:,.0f}"))


def _new_axes(figsize: tuple[float, float]) -> plt.Axes:
    _, ax = plt.subplots(figsize=figsize, layout="constrained")
    return ax


def _us_axis(ax: plt.Axes, clock_ghz: float | None) -> None:
    if clock_ghz:
        per_us = clock_ghz * 1e3
        sec = ax.secondary_xaxis("top", functions=(lambda c: c / per_us, lambda u: u * per_us))
        sec.set_xlabel("µs")


# --- argument checks: one checker per kind of argument, so every plot refuses the same mistake in the same words
def _is_real(x: Any) -> bool:
    # a bool is an int to Python, but clock_ghz=True or dpi=False is a slip, never a setting
    return isinstance(x, numbers.Real) and not isinstance(x, (bool, np.bool_))


def _is_int(x: Any) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, (bool, np.bool_))


def _check_ax(ax: Any, where: str) -> plt.Axes | None:
    """``ax`` itself, once it is None or an Axes."""
    if ax is not None and not isinstance(ax, matplotlib.axes.Axes):
        raise ValidationError(f"{where}: ax must be a matplotlib Axes (or None for a new figure), got "
                              f"{type(ax).__name__} {ax!r:.60}.")
    return ax


def _check_positive(x: Any, name: str, where: str, hint: str, *, optional: bool = True) -> Any:
    """``x`` itself, once it is a positive finite real (or None, when ``optional``)."""
    if x is None and optional:
        return x
    if not _is_real(x) or not math.isfinite(x) or x <= 0:
        raise ValidationError(f"{where}: {name} must be {'None or ' if optional else ''}a positive finite real "
                              f"number ({hint}), got {x!r}.")
    return x


def _check_clock(clock_ghz: Any, where: str, *, auto: bool = False) -> Any:
    """``clock_ghz`` itself, once it is None, a positive finite real or (where ``auto``) ``"auto"``."""
    if auto and isinstance(clock_ghz, str) and clock_ghz == "auto":
        return clock_ghz
    if clock_ghz is None or (_is_real(clock_ghz) and math.isfinite(clock_ghz) and clock_ghz > 0):
        return clock_ghz
    also, own = (", 'auto'", "; 'auto' for the runs' own clock") if auto else ("", "")
    raise ValidationError(f"{where}: clock_ghz must be None{also} or a positive finite real number (the clock in "
                          f"GHz for the µs axis, e.g. 1.25; None for no µs axis{own}), got {clock_ghz!r}.")


def _check_dpi(dpi: Any, where: str) -> Any:
    return _check_positive(dpi, "dpi", where, "the resolution the figure will be saved at, e.g. 150; None for "
                                              "the figure's")


def _check_int(x: Any, name: str, where: str, hint: str, *, low: int = 1, optional: bool = False) -> Any:
    """``x`` itself, once it is an int (not a bool) of at least ``low`` (or None, when ``optional``)."""
    if x is None and optional:
        return x
    if not _is_int(x) or x < low:
        what = "a positive int" if low == 1 else "a non-negative int" if low == 0 else f"an int >= {low}"
        raise ValidationError(f"{where}: {name} must be {'None or ' if optional else ''}{what} ({hint}), "
                              f"got {x!r}.")
    return x


def _check_flag(x: Any, name: str, where: str) -> Any:
    if not isinstance(x, (bool, np.bool_)):
        raise ValidationError(f"{where}: {name} must be True or False, got {x!r}.")
    return x


def _check_hatch(hatch: Any, where: str) -> Any:
    """``hatch`` itself, once it is None or a mapping tensor base name (str) -> matplotlib hatch pattern (str)."""
    how = ("hatch must be None or a mapping of tensor base name (str) -> matplotlib hatch pattern (str), e.g. "
           "{'V': '////'}")
    if hatch is None:
        return hatch
    if not isinstance(hatch, Mapping):
        raise ValidationError(f"{where}: {how}; got {type(hatch).__name__} {hatch!r:.60}.")
    for name, pat in hatch.items():
        if not isinstance(name, str) or not isinstance(pat, str):
            raise ValidationError(f"{where}: {how}; got {name!r}: {pat!r}.")
        try:
            validate_hatch(pat)
        except ValueError as e:
            raise ValidationError(f"{where}: hatch[{name!r}] = {pat!r} is not a matplotlib hatch pattern ({e}); "
                                  f"use the characters / \\ | - + x o O . *, e.g. '////'.") from None
    return hatch


def _check_tiles(tiles: Any, where: str) -> list[int]:
    """``tiles`` as a list, once it is an iterable of tile numbers (ints)."""
    how = "tiles must be an iterable of tile numbers (ints): pass [3] or range(3)"
    if isinstance(tiles, (str, bytes, Mapping)) or not isinstance(tiles, Iterable):
        raise ValidationError(f"{where}: {how}, got {tiles!r:.60}.")
    out = list(tiles)
    bad = [t for t in out if not _is_int(t)]
    if bad:
        raise ValidationError(f"{where}: {how}; {bad[0]!r} is not an int.")
    return out


def _check_window(window: Any, where: str) -> None:
    if window is None:
        return
    try:
        lo, hi = (float(x) for x in window)
    except (TypeError, ValueError):
        raise ValidationError(f"{where}: window={window!r}; pass (start, end) cycles.") from None
    if not lo < hi:
        raise ValidationError(f"{where}: window={window!r} is empty; pass start < end.")


def _check_options(options: Mapping[str, Any], allowed: Iterable[str], where: str, to: str) -> None:
    unknown = [k for k in options if k not in allowed]
    if unknown:
        raise ValidationError(f"{where}: unknown option(s) {', '.join(map(repr, unknown))}; {where} passes "
                              f"only {', '.join(allowed)} on to {to}.")


def _looks_like_op_log(x: Any) -> bool:
    return isinstance(x, pd.DataFrame) and {"stage", "engine", "start", "end"} <= set(x.columns)


def _check_table(x: Any, name: str, where: str, source: str, shape: str, fix: str, *,
                 labels: bool = False) -> pd.DataFrame:
    """``x`` itself, once it is a non-empty DataFrame of numbers (with ``labels``, its rows and columns labelled
    with numbers too) as ``source`` returns. An op_log, the usual slip, is named as one, with ``fix``."""
    want = f"{where}: {name} must be {source} output ({shape})"
    if _looks_like_op_log(x):
        raise ValidationError(f"{want}, not an op_log; {fix}.")
    if not isinstance(x, pd.DataFrame) or x.empty or x.shape[1] == 0:
        what = type(x).__name__ if not isinstance(x, pd.DataFrame) else "an empty DataFrame"
        raise ValidationError(f"{want} (a non-empty DataFrame), got {what}.")
    bad = [c for c, dtype in x.dtypes.items() if not pd.api.types.is_numeric_dtype(dtype)]
    if bad:
        raise ValidationError(f"{want}: its column(s) {', '.join(map(repr, bad[:5]))} do not hold numbers.")
    for what, idx in [("rows", x.index)] + ([("columns", x.columns)] if labels else []):
        if not pd.api.types.is_numeric_dtype(idx):
            raise ValidationError(f"{want}: its {what} must be labelled with numbers, not {list(idx[:3])!r}.")
    return x


def describe(params: Mapping[str, Any]) -> str:
    """A one-line description of a decode run's parameters for a title: sizes, then the calibration.

    ``params`` is ``DecodeRun.params`` (or ``Comparison.params``), e.g.
    ``"kv_len 4096, tile 128, G 8, d 128, bf16 · ahbm-pe-v1: FIXED 40, R 0.0625, strict_fifo"``.

    Raises:
        ValidationError: ``params`` is not a mapping.
    """
    if not isinstance(params, Mapping):
        raise ValidationError(f"describe: params must be a mapping of decode parameters (DecodeRun.params), got "
                              f"{type(params).__name__}.")
    sizes = ", ".join(f"{k} {params[key]}" for k, key in (("kv_len", "kv_len"), ("tile", "tile"), ("G", "group"),
                                                          ("d", "head_dim")) if key in params)
    if "dtype" in params:
        sizes += f", {params['dtype']}"
    calib = []
    if "fixed_cycles" in params:
        calib.append(f"FIXED {params['fixed_cycles']}")
    if "r_cycles_per_byte" in params:
        calib.append(f"R {params['r_cycles_per_byte']:g}")
    if "hazard_policy" in params:
        calib.append(str(params["hazard_policy"]))
    topo = f"{params['topology']}: " if "topology" in params else ""
    return sizes + (f" · {topo}{', '.join(calib)}" if calib else "")


def _run_parts(x: Any) -> tuple[pd.DataFrame, Any, dict | None]:
    """``(op_log, Run or None, decode params or None)`` of an op_log, a Run or a decode.DecodeRun."""
    from ..sim import Run

    if isinstance(x, pd.DataFrame):
        return x, None, None
    if isinstance(x, Run):
        return x.op_log, x, None
    inner = getattr(x, "run", None)
    if isinstance(inner, Run):
        return inner.op_log, inner, dict(getattr(x, "params", {}) or {}) or None
    raise ValidationError(f"expected an op_log DataFrame, a Run or a decode.DecodeRun, not {type(x).__name__}.")


def _named_runs(runs: Any, second: Any, where: str) -> dict[str, Any]:
    """The variants to draw, by name: from a Comparison, a mapping, or the old two-op_log call."""
    if isinstance(runs, pd.DataFrame):
        if not isinstance(second, pd.DataFrame):
            raise ValidationError(f"{where}: given one op_log, pass the second too ({where}(op_log_opt2, "
                                  f"op_log_opt3)), or pass a dict name -> op_log or a decode.Comparison.")
        return {"opt2": runs, "opt3": second}
    if second is not None:
        raise ValidationError(f"{where}: a second positional argument goes only with two op_logs; with "
                              f"{type(runs).__name__} pass the other options by name (tiles=..., tile=...).")
    items = getattr(runs, "runs", runs)
    if not isinstance(items, Mapping):
        raise ValidationError(f"{where} takes a decode.Comparison, a dict name -> op_log (or run), or two "
                              f"op_logs, not {type(runs).__name__}.")
    if not items:
        raise ValidationError(f"{where}: no variants given.")
    return {str(k): v for k, v in items.items()}


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
def compare_gantt(runs: Any, op_log_opt3: pd.DataFrame | None = None, tiles: int = 3,
                  clock_ghz: float | None | str = "auto", *, holds: bool = False, critical_path: bool = False,
                  hatch: Mapping[str, str] | None = TENSOR_HATCH, title: str | None = None,
                  dpi: float | None = None) -> plt.Figure:
    """Every variant above the next on one cycle axis, from cycle 0 to the end of tile ``tiles - 1`` of the
    slowest.

    Args:
        runs: a ``decode.Comparison``, or a dict name -> op_log, Run or
            ``decode.DecodeRun`` (any number, drawn in that order). The old
            call ``compare_gantt(op_log_opt2, op_log_opt3, tiles)`` still works.
        op_log_opt3: the second op_log of the old call only.
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
    named = _named_runs(runs, op_log_opt3, where)
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


def dispatch_per_tile(runs: Any, op_log_opt3: pd.DataFrame | None = None, tile: int = 1,
                      ax: plt.Axes | None = None) -> plt.Axes:
    """Stacked bars: the DISPATCH cycles of each command of one tile, one bar per variant.

    Args:
        runs: a ``decode.Comparison``, or a dict name -> op_log (or run), drawn
            top to bottom in that order. The old call
            ``dispatch_per_tile(op_log_opt2, op_log_opt3, tile=1)`` still works.
        op_log_opt3: the second op_log of the old call only.
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
    named = _named_runs(runs, op_log_opt3, where)
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


def _color_for(by: str, name: str) -> str:
    if by == "cause":
        return CAUSE_COLORS.get(name, "#777777")
    base = name.rstrip("0123456789")
    color = ENGINE_COLORS.get(base, "#777777")
    if base != name:  # a DMA channel: the engine's colour, lighter for higher channels
        k = int(name[len(base):])
        rgb = np.array(matplotlib.colors.to_rgb(color))
        color = matplotlib.colors.to_hex(rgb + (1 - rgb) * min(0.6, 0.3 * k))
    return color


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


# --- sweeps ----------------------------------------------------------------------------------------------
def _check_column_name(name: Any, arg: str, where: str) -> None:
    if not isinstance(name, str):
        raise ValidationError(f"{where}: {arg} must be the name of a sweep column (a str, e.g. 'kv_len'), got "
                              f"{type(name).__name__} {name!r:.60}.")


def _check_baseline(sweep_df: pd.DataFrame, baseline: Any, where: str) -> None:
    """The baseline variant must be one the sweep ran: scaling's and cycles_bars' ratios divide by it."""
    variants = sorted(set(sweep_df["variant"]))
    if not isinstance(baseline, str) or baseline not in variants:
        raise ValidationError(f"{where}: baseline {baseline!r} is not in the sweep (variants: "
                              f"{', '.join(map(str, variants))}).")


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


def _check_center(center: Any, where: str) -> None:
    if not _is_real(center) or not math.isfinite(center):
        raise ValidationError(f"{where}: center must be a finite real number (the value the colours centre on, "
                              f"e.g. 1.0 for ratios), got {center!r}.")


def _level_list(x: str | Iterable[str] | None, name: str, where: str) -> list[str]:
    """An index level, or several, as a list (none for None)."""
    if x is None:
        return []
    if isinstance(x, str):
        return [x]
    if isinstance(x, Iterable) and not isinstance(x, Mapping):
        levels = list(x)
        if all(isinstance(v, Hashable) for v in levels):
            return levels
    raise ValidationError(f"{where}: {name} must be an index level name or a list of them (e.g. 'kv_len' or "
                          f"['kv_len', 'tile']), got {x!r:.60}.")


def _fmt_value(v: Any) -> str:
    """A tick or facet value: ints with thousands separators, known words (:data:`VALUE_WORDS`), everything
    else as it prints."""
    if isinstance(v, (int, np.integer)) and not isinstance(v, bool):
        return f"{v:,}"
    return VALUE_WORDS.get(v, str(v)) if isinstance(v, str) else str(v)


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


def _variant_colors(names: Iterable[str]) -> dict[str, str]:
    """:data:`VARIANT_COLORS`, and for any other variant (in the order given) the next :data:`PALETTE`
    colour that no variant has."""
    free = [c for c in PALETTE if c not in VARIANT_COLORS.values()]
    out, k = {}, 0
    for n in names:
        if n in VARIANT_COLORS:
            out[n] = VARIANT_COLORS[n]
        else:
            out[n] = free[k % len(free)]
            k += 1
    return out


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


def gate_map(grid: pd.DataFrame, ax: plt.Axes | None = None, threshold: float = 2.0,
             mark: tuple[float, float] | None = (40, 0.0625)) -> plt.Axes:
    """The dispatch ratio opt3/opt2 over a FIXED × R grid, with the ``ratio = threshold`` contour.

    ``grid`` is :func:`kbwork.analysis.ratio_grid` output (FIXED rows, R columns).
    ``mark`` ``(FIXED, R)`` puts a star on one calibration (default: the default topology's), labelled
    with its values (and "default" when it is the default topology's).

    Returns:
        The Axes (of a new constrained-layout figure when ``ax`` is None).

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
    if z.min() < threshold < z.max():
        cs = ax.contour(r, f, z, levels=[threshold], colors="white", linewidths=2)
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


from .device import device_gantt  # noqa: E402  (it draws with the helpers above)
from .model import contention, ping_pong_gain, tokens_per_s, tokens_per_s_grid, variant_ratio  # noqa: E402,F401
