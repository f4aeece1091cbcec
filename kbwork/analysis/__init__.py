"""Per-tile dispatch, its closed form, the dispatch-ratio gate, and where a run's time goes.

The simulated per-tile dispatch is read off an op_log (DISPATCH stage
durations summed by ``iter``). The closed form applies the dispatch formula
of DESIGN.md §4 to the logical bytes of the commands a tile emits, with no
simulation; the two must agree exactly.

Where the time goes (DESIGN.md §11), data in, data out: :func:`utilization`
and :func:`utilization_over_time` read an op_log; :func:`attribution`,
:func:`waits` and :func:`what_if` read a run (its critical path, its holds,
its program) and return DataFrames. Every function that reads a run takes a
:class:`~kbwork.Run` or anything whose ``.run`` is one (a ``decode.DecodeRun``);
those that read an op_log take one of those too. This package sits below
``decode`` and ``model`` (DESIGN §9): they import it, never the other way, so
running a decode from parameters first is ``decode.what_if``'s job.
"""

from __future__ import annotations

import decimal
import numbers
from fractions import Fraction
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from ..config import Topology, exact_fraction
from ..errors import ValidationError
from ..oplog import ENGINE_NAMES, check_schema, engine_tracks, require_columns
from ..pe.commands import Command, dispatch_cycles
from ..device import CAUSES, simulate
from ..sim import DeviceRun, Run
from . import per_pe as _per_pe
from .channels import (CONTENDED, channel_steps, channels, channels_over_time, contention,  # noqa: F401
                       contention_words, path_contention)

GATE_FACTOR = 2.0


def _run_of(x: Any) -> Run | None:
    """``x`` if it is a :class:`~kbwork.Run`, its ``.run`` if that is one (a ``decode.DecodeRun``), else None."""
    if isinstance(x, Run):
        return x
    inner = getattr(x, "run", None)
    return inner if isinstance(inner, Run) else None


def _op_log_of(x: Any) -> Any:
    """The op_log of a Run (or of anything whose ``.run`` is one); anything else as given, for the
    caller's check to name."""
    run = None if isinstance(x, pd.DataFrame) else _run_of(x)
    return x if run is None else run.op_log


def _check_cycles(op_log: pd.DataFrame, where: str) -> None:
    """Refuse ``start``/``end`` columns that are not whole cycles (an op_log's are int64)."""
    for c in ("start", "end"):
        if not pd.api.types.is_integer_dtype(op_log[c].dtype):
            raise ValidationError(f"{where}: column {c!r} holds {op_log[c].dtype} values; an op_log's start and end "
                                  f"are whole cycles (int64). Pass run.op_log, or convert with .astype('int64') "
                                  f"after dropping missing rows.")


def dispatch_per_tile(op_log: pd.DataFrame) -> pd.Series:
    """Sum of DISPATCH cycles of the commands labelled with each tile's ``iter`` (iter >= 0).

    Args:
        op_log: an op_log, or a Run (or anything whose ``.run`` is one) to read it from.

    Returns:
        A Series indexed by iter, named ``dispatch_cycles``.

    Raises:
        ValidationError: ``op_log`` is not an op_log.
    """
    op_log = _op_log_of(op_log)
    check_schema(op_log)
    d = op_log[(op_log["stage"] == "DISPATCH") & (op_log["iter"] >= 0)]
    s = (d["end"] - d["start"]).groupby(d["iter"]).sum()
    s.name = "dispatch_cycles"
    return s.astype("int64")


def _sum_by_iter(values: np.ndarray, iters: np.ndarray, name: str) -> pd.Series:
    keep = iters >= 0
    it, vals = iters[keep], values[keep]
    if not len(it):
        return pd.Series([], dtype="int64", name=name, index=pd.Index([], name="iter"))
    n = int(it.max()) + 1
    sums = np.bincount(it, weights=vals, minlength=n).astype(np.int64)
    present = np.flatnonzero(np.bincount(it, minlength=n))  # the iters that occur, without sorting
    return pd.Series(sums[present], index=pd.Index(present, name="iter"), name=name)


def dispatch_per_tile_from_run(run) -> pd.Series:
    """:func:`dispatch_per_tile` computed from a :class:`~kbwork.Run` (or anything whose ``.run`` is one)
    without building its op_log."""
    run = _resolve_run_only(run)
    return _sum_by_iter(run.dispatch_cycles(), np.asarray(run.program.iters, dtype=np.int64), "dispatch_cycles")


def command_bytes_per_tile(commands: Sequence[Command]) -> dict[int, list[int]]:
    """Logical bytes of every command, grouped by ``iter`` (commands with iter -1 left out)."""
    out: dict[int, list[int]] = {}
    for c in commands:
        if c.iter >= 0:
            out.setdefault(c.iter, []).append(c.logical_bytes)
    return dict(sorted(out.items()))


def closed_form(command_bytes: Iterable[int], fixed: int, r: float | Fraction, cap: int = 1024) -> int:
    """``Σ FIXED·segments + ceil(R·bytes)`` over one tile's commands.

    Raises:
        ValidationError: a negative or non-numeric FIXED, R or byte count, or a cap below 1.
    """
    _check_calibration(fixed, r, cap, "closed_form")
    sizes = list(command_bytes)
    if any(isinstance(b, bool) or not isinstance(b, numbers.Integral) or b < 0 for b in sizes):
        raise ValidationError(f"closed_form: command bytes must be non-negative ints, got {sizes!r}.")
    return sum(dispatch_cycles(int(b), fixed, r, cap) for b in sizes)


def _check_calibration(fixed: Any, r: Any, cap: Any, where: str) -> None:
    for name, v, integral in (("fixed", fixed, True), ("r", r, False), ("cap", cap, True)):
        ok = isinstance(v, numbers.Integral if integral else numbers.Real) and not isinstance(v, bool)
        if not ok or v < (1 if name == "cap" else 0) or (not integral and not np.isfinite(float(v))):
            raise ValidationError(f"{where}: {name}={v!r}; FIXED and R must be non-negative numbers "
                                  f"(FIXED whole cycles) and the cap a positive int.")


def closed_form_per_tile(commands: Sequence[Command], topo: Topology) -> pd.Series:
    """The closed-form per-tile dispatch of a program's commands under ``topo``'s calibration:
    ``Σ FIXED·segments + ceil(R·bytes)`` over each tile's commands, from their logical bytes."""
    lb = np.fromiter((c.logical_bytes for c in commands), dtype=np.int64, count=len(commands))
    iters = np.fromiter((c.iter for c in commands), dtype=np.int64, count=len(commands))
    return _closed_form_by_iter(lb, iters, topo)


def closed_form_per_tile_from_program(prog, topo: Topology) -> pd.Series:
    """:func:`closed_form_per_tile` from a program's ``logical_bytes`` and ``iters`` (a scheduled
    ``Program``, or the periodic program of a steady-state run), without its command objects."""
    return _closed_form_by_iter(np.asarray(prog.logical_bytes, np.int64), np.asarray(prog.iters, np.int64), topo)


def _closed_form_by_iter(lb: np.ndarray, iters: np.ndarray, topo: Topology) -> pd.Series:
    fixed, r, cap = topo.fixed_cycles, topo.r_fraction, topo.max_composite_logical_bytes
    sizes = np.unique(lb)  # a handful of command sizes: cost each once, then look every command up
    cost = np.array([dispatch_cycles(int(b), fixed, r, cap) for b in sizes], dtype=np.int64)
    return _sum_by_iter(cost[np.searchsorted(sizes, lb)] if len(lb) else lb, iters, "closed_form_cycles")


def gate(opt3_cycles: float, opt2_cycles: float, factor: float = GATE_FACTOR) -> bool:
    """The dispatch-ratio gate: ``opt3 > factor × opt2`` (default factor 2).

    Raises:
        ValidationError: an argument that is not a real number.
    """
    for name, v in (("opt3_cycles", opt3_cycles), ("opt2_cycles", opt2_cycles), ("factor", factor)):
        if isinstance(v, bool) or not isinstance(v, numbers.Real) or v != v:  # v != v: NaN
            raise ValidationError(f"gate: {name}={v!r} is not a number.")
    return bool(opt3_cycles > factor * opt2_cycles)


def ratio_grid(bytes_opt2: Sequence[int], bytes_opt3: Sequence[int], fixed_values: Sequence[float],
               r_values: Sequence[float], cap: int = 1024) -> pd.DataFrame:
    """Closed-form dispatch ratio opt3/opt2 over a FIXED × R grid (FIXED rows, R columns).

    FIXED values are rounded to whole cycles, as the topology requires.

    Raises:
        ValidationError: a negative or non-numeric FIXED or R, or an argument that is not a list.
    """
    for name, v in (("bytes_opt2", bytes_opt2), ("bytes_opt3", bytes_opt3), ("fixed_values", fixed_values),
                    ("r_values", r_values)):
        if isinstance(v, (str, bytes, Mapping)) or not isinstance(v, Iterable):
            raise ValidationError(f"ratio_grid: {name}={v!r} must be a list (of command bytes, or of FIXED or R "
                                  f"values), e.g. [{v!r}].")
    bytes_opt2, bytes_opt3, fixed_values, r_values = map(list, (bytes_opt2, bytes_opt3, fixed_values, r_values))
    for f in fixed_values:
        _check_calibration(int(round(f)) if isinstance(f, numbers.Real) and not isinstance(f, bool) else f,
                           0, cap, "ratio_grid")
    for r in r_values:
        _check_calibration(0, r, cap, "ratio_grid")
    grid = np.empty((len(fixed_values), len(r_values)))
    for i, f in enumerate(fixed_values):
        for j, r in enumerate(r_values):
            d2 = closed_form(bytes_opt2, int(round(f)), r, cap)
            d3 = closed_form(bytes_opt3, int(round(f)), r, cap)
            grid[i, j] = d3 / d2 if d2 else np.inf if d3 else np.nan  # 0/0 (no dispatch at all): undefined
    return pd.DataFrame(grid, index=pd.Index([int(round(f)) for f in fixed_values], name="fixed_cycles"),
                        columns=pd.Index(list(r_values), name="r_cycles_per_byte"))


# --- where the time goes (DESIGN §11) ------------------------------------------------------------------
def utilization(op_log: pd.DataFrame, *, per_pe: bool | None = None) -> pd.DataFrame:
    """How busy each engine unit was over the run.

    Args:
        op_log: an op_log (of one PE or of a device), or a Run (or anything whose ``.run`` is one) to read it
            from.
        per_pe: ``None``: per PE when the op_log holds several PEs; ``True``: per PE; ``False``: the
            device as a whole (:mod:`.per_pe`).

    Returns:
        One row per engine unit in track order (each DMA channel its own;
        with a categorical ``engine`` column, every unit of the run, used or
        not): ``engine``, ``stages``, ``busy_cycles`` (the sum of its stages'
        ``end - start``) and ``busy_fraction`` (busy cycles over the run's
        cycles, the last ``end``; 0 for an empty run). Per PE, one row per
        (PE, unit) with ``pe`` first; for the device, busy cycles summed over
        the PEs and the fraction over PEs × cycles.

    Raises:
        ValidationError: not an op_log, or a bad ``per_pe``.
    """
    op_log = _op_log_of(op_log)
    require_columns(op_log, ("engine", "start", "end"), "utilization")
    _check_cycles(op_log, "utilization")
    how = _per_pe.form(len(_per_pe.pes_of(op_log)), per_pe, "utilization")
    if how != _per_pe.ONE:
        return _per_pe.utilization(op_log, how)
    tracks = engine_tracks(op_log["engine"])
    codes = pd.Categorical(op_log["engine"], categories=tracks).codes
    dur = (op_log["end"] - op_log["start"]).to_numpy(np.int64)
    cycles = int(op_log["end"].max()) if len(op_log) else 0
    busy = np.bincount(codes, weights=dur, minlength=len(tracks)).astype(np.int64)
    return pd.DataFrame({"engine": list(tracks),
                         "stages": np.bincount(codes, minlength=len(tracks)).astype(np.int64),
                         "busy_cycles": busy,
                         "busy_fraction": busy / cycles if cycles else np.zeros(len(tracks))})


def utilization_over_time(op_log: pd.DataFrame, bins: int | Sequence[float] = 100, *,
                          per_pe: bool | None = None) -> pd.DataFrame:
    """Busy fraction of each engine unit in each time bin.

    Args:
        op_log: an op_log, or a Run (or anything whose ``.run`` is one) to read it from.
        bins: a number of equal bins from cycle 0 to the run's last cycle, or
            the increasing bin edges in cycles.
        per_pe: as :func:`utilization`: per PE, the columns are a MultiIndex
            ``(pe, engine)``; for the device, each unit's mean over the PEs.

    Returns:
        One row per bin, indexed by the bin's first cycle (``bin_start``), one
        column per engine unit in track order: the fraction of the bin that
        unit was busy (0 for an empty bin). Vectorised: a unit runs one stage
        at a time, so its busy time up to any cycle is a prefix sum over its
        stages sorted by start.

    Raises:
        ValidationError: ``bins`` is not a positive int or increasing edges, or a bad ``per_pe``.
    """
    op_log = _op_log_of(op_log)
    require_columns(op_log, ("engine", "start", "end"), "utilization_over_time")
    _check_cycles(op_log, "utilization_over_time")
    how = _per_pe.form(len(_per_pe.pes_of(op_log)), per_pe, "utilization_over_time")
    if how != _per_pe.ONE:  # every PE's units run one stage at a time, not the same unit of two PEs
        return _per_pe.utilization_over_time(op_log, bins, how,
                                             lambda df, edges: utilization_over_time(df, edges, per_pe=False))
    tracks = engine_tracks(op_log["engine"])
    cycles = int(op_log["end"].max()) if len(op_log) else 0
    if isinstance(bins, numbers.Integral) and not isinstance(bins, bool):
        if bins <= 0 or bins > 10_000_000:
            raise ValidationError(f"utilization_over_time: bins={bins}; pass a positive number of bins "
                                  f"(at most 10,000,000).")
        edges = np.linspace(0.0, float(cycles), int(bins) + 1)
    else:
        try:
            edges = np.asarray(bins, dtype=np.float64)
        except (TypeError, ValueError):
            edges = np.zeros(0)
        if edges.ndim != 1 or len(edges) < 2 or (np.diff(edges) < 0).any() or not np.isfinite(edges).all():
            raise ValidationError("utilization_over_time: bins must be a positive int or at least two "
                                  "increasing finite edges (cycles).")
    codes = pd.Categorical(op_log["engine"], categories=tracks).codes
    start = op_log["start"].to_numpy(np.int64)
    end = op_log["end"].to_numpy(np.int64)
    order = np.lexsort((start, codes))
    codes, start, end = codes[order], start[order], end[order]
    bounds = np.searchsorted(codes, np.arange(len(tracks) + 1))
    width = np.diff(edges)
    out = {}
    for i, name in enumerate(tracks):
        s, e = start[bounds[i]:bounds[i + 1]], end[bounds[i]:bounds[i + 1]]
        if not len(s):
            out[name] = np.zeros(len(width))
            continue
        d = e - s
        cum = np.concatenate(([0], np.cumsum(d)))
        busy = _busy_before(s, d, cum, edges[1:]) - _busy_before(s, d, cum, edges[:-1])
        out[name] = np.divide(busy, width, out=np.zeros(len(width)), where=width > 0)
    return pd.DataFrame(out, index=pd.Index(edges[:-1], name="bin_start"))


def _busy_before(s: np.ndarray, d: np.ndarray, cum: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Busy cycles of one unit before each cycle in ``x``: its stages start at ``s`` (ascending, never
    overlapping) and last ``d``; ``cum[k]`` is the busy time of the first k. The stages starting before x
    are over by then, all but the last of them, which counts up to x."""
    k = np.searchsorted(s, x, side="left")
    last = np.maximum(k - 1, 0)
    return cum[last] + np.where(k > 0, np.minimum(x - s[last], d[last]), 0)


def attribution(run) -> pd.DataFrame:
    """The critical path's cycles by engine unit and by cause (DESIGN §11).

    Of a device run, its critical path: the PE that finishes last's
    (``run.critical_path()``); of one PE of it, ``attribution(run.pe(p))``.

    Each row of ``run.critical_path()`` counts its ``end - start`` once to its
    engine and once to the cause of its incoming link (the first row's is
    ``dependency``). The path runs from cycle 0 to ``run.cycles`` without gaps,
    so each of the two sums is ``run.cycles`` exactly.

    Returns:
        Long form: ``by`` (``"engine"`` or ``"cause"``), ``name`` (every engine
        unit in track order, then every cause of ``device.walk.CAUSES``, zeros
        included), ``cycles`` and ``fraction`` (of ``run.cycles``).
    """
    run = _resolve_run_only(run)
    path = run.critical_path()
    dur = (path["end"] - path["start"]).to_numpy(np.int64)
    tracks = run.units  # the op_log's engine categories; a device's op_log is not built for them
    by_engine = np.bincount(pd.Categorical(path["engine"], categories=tracks).codes, weights=dur,
                            minlength=len(tracks)).astype(np.int64)
    by_cause = np.bincount(path["cause"].cat.codes.to_numpy(), weights=dur, minlength=len(CAUSES)).astype(np.int64)
    cycles = np.concatenate((by_engine, by_cause))
    total = run.cycles
    return pd.DataFrame({"by": ["engine"] * len(tracks) + ["cause"] * len(CAUSES),
                         "name": list(tracks) + list(CAUSES), "cycles": cycles,
                         "fraction": cycles / total if total else np.zeros(len(cycles))})


#: The columns ``decode.sweep(..., attribution=True)`` adds (:func:`path_cycles`): the critical path's
#: cycles by engine (every DMA channel summed into ``path_PE_DMA``), then by cause.
PATH_COLUMNS = tuple(f"path_{n}" for n in (*ENGINE_NAMES, *CAUSES))


def path_cycles(run) -> dict[str, int]:
    """:func:`attribution` of one run as a flat record, the same keys for every run (what a sweep row holds).

    Args:
        run: a :class:`~kbwork.Run` or a ``decode.DecodeRun``.

    Returns:
        :data:`PATH_COLUMNS` -> cycles: ``path_<engine>`` for every engine of
        ``ENGINE_NAMES`` (a DMA engine's channels summed) and ``path_<cause>``
        for every cause, zeros included. Each of the two groups adds up to the
        run's end-to-end cycles.
    """
    att = attribution(_resolve_run_only(run))
    out = dict.fromkeys(PATH_COLUMNS, 0)
    for by, name, cycles in zip(att["by"], att["name"], att["cycles"]):
        out[f"path_{name.rstrip('0123456789') if by == 'engine' else name}"] += int(cycles)
    return out


def _sweep_axes(sweep_df: Any, where: str) -> list[str]:
    """The axis columns of a ``decode.sweep`` frame: those before ``variant`` (without a resume file's ``point``)."""
    if not isinstance(sweep_df, pd.DataFrame) or not {"variant", "cycles"} <= set(sweep_df.columns):
        raise ValidationError(f"{where}: pass decode.sweep(...) output (columns: the axes, then variant, cycles, "
                              f"...), not {type(sweep_df).__name__}.")
    cols = list(sweep_df.columns)
    return [c for c in cols[:cols.index("variant")] if c != "point"]


def _by_point(sweep_df: pd.DataFrame, axes: list[str], values: str, variants: list[str], where: str) -> pd.DataFrame:
    """``values`` with one row per point (indexed by ``axes``, in sweep order) and one column per variant."""
    df = sweep_df[sweep_df["variant"].isin(variants)]
    if not axes:  # a sweep of one point has no axis columns
        df = df.assign(point=0)
        axes = ["point"]
    points = df[axes].drop_duplicates()
    index = pd.Index(points[axes[0]]) if len(axes) == 1 else pd.MultiIndex.from_frame(points)
    try:
        wide = df.set_index([*axes, "variant"])[values].unstack("variant")
    except ValueError:
        raise ValidationError(f"{where}: some point holds a variant twice; pass one sweep's rows.") from None
    wide = wide.reindex(index)[variants]
    if wide.isna().to_numpy().any():
        raise ValidationError(f"{where}: not every point holds every variant of {variants}.")
    wide.columns.name = None
    return wide


def winners(sweep_df: pd.DataFrame, variants: Sequence[str] | None = None) -> pd.DataFrame:
    """The fastest variant end to end at every point of a sweep, and by how much.

    Args:
        sweep_df: ``decode.sweep(...)`` output (the axis columns, then ``variant``, ``cycles``, ...).
        variants: the variants to rank, two or more (default: every variant in the sweep, in its order).

    Returns:
        One row per point, indexed by the axis columns in sweep order:
        each variant's end-to-end ``cycles`` under its name; ``best`` (the
        fastest; on a tie the first in ``variants``); ``runner_up`` (the next
        fastest); ``margin`` (the runner-up's cycles over the best's, minus 1:
        how much longer the next fastest takes); and ``<variant>/best`` for
        every variant (its cycles over the best's; 1.0 for the best).

    Raises:
        ValidationError: not a sweep frame, fewer than two variants, a variant
            not in the sweep, or a point without every variant.
    """
    axes = _sweep_axes(sweep_df, "winners")
    present = list(dict.fromkeys(sweep_df["variant"]))
    variants = present if variants is None else list(variants)
    missing = [v for v in variants if v not in present]
    if missing or len(variants) < 2:
        raise ValidationError(f"winners: rank two or more of the sweep's variants ({', '.join(present)}); got "
                              f"{variants}.")
    wide = _by_point(sweep_df, axes, "cycles", variants, "winners")
    z = wide.to_numpy(np.float64)
    order = np.argsort(z, axis=1, kind="stable")
    rows = np.arange(len(z))
    best, second = z[rows, order[:, 0]], z[rows, order[:, 1]]
    names = np.array(variants, dtype=object)
    out = wide.copy()
    out["best"] = names[order[:, 0]]
    out["runner_up"] = names[order[:, 1]]
    out["margin"] = second / best - 1.0
    for j, v in enumerate(variants):
        out[f"{v}/best"] = z[:, j] / best
    return out


def attribution_gap(sweep_df: pd.DataFrame, a: str, b: str, by: str = "engine",
                    drop_zero: bool = True) -> pd.DataFrame:
    """How much longer variant ``a`` takes than ``b`` at every point of a sweep, split by where each
    run's critical path spends its cycles.

    Args:
        sweep_df: ``decode.sweep(..., attribution=True)`` output.
        a, b: two variants of the sweep.
        by: ``"engine"`` or ``"cause"``.
        drop_zero: leave out the engines (causes) whose difference is 0 at every point.

    Returns:
        One row per point, indexed by the axis columns in sweep order: ``gap``
        (a's end-to-end cycles minus b's), then per engine (or cause) a's
        critical-path cycles there minus b's. The columns after ``gap`` add up
        to it. It compares two critical paths; it is not a causal split (for
        that, :func:`what_if`): a positive entry means that unit (or cause)
        carries more of a's path than of b's.

    Raises:
        ValidationError: a bad ``by``, a sweep without the ``path_`` columns, or
            ``a``/``b`` not in it.
    """
    if by not in ("engine", "cause"):
        raise ValidationError(f"attribution_gap: by={by!r}; use 'engine' or 'cause'.")
    axes = _sweep_axes(sweep_df, "attribution_gap")
    if not set(PATH_COLUMNS) <= set(sweep_df.columns):
        raise ValidationError("attribution_gap: the sweep has no path_ columns; run decode.sweep(..., "
                              "attribution=True).")
    present = list(dict.fromkeys(sweep_df["variant"]))
    if a not in present or b not in present or a == b:
        raise ValidationError(f"attribution_gap: a and b must be two of the sweep's variants ({', '.join(present)}),"
                              f" got {a!r} and {b!r}.")
    names = list(ENGINE_NAMES) if by == "engine" else list(CAUSES)
    out = {"gap": _by_point(sweep_df, axes, "cycles", [a, b], "attribution_gap")}
    for n in names:
        out[n] = _by_point(sweep_df, axes, f"path_{n}", [a, b], "attribution_gap")
    frame = pd.DataFrame({k: (w[a] - w[b]).astype(np.int64) for k, w in out.items()})
    if drop_zero:
        frame = frame[["gap"] + [n for n in names if (frame[n] != 0).any()]]
    frame.columns.name = by
    return frame


#: The columns of :func:`waits`, in order, after ``stage, engine, stages``.
WAIT_COLUMNS = ("dependency", "hazard", "queue", "wait", "scheduler", "engine_busy", "total")


def waits(run, *, per_pe: bool | None = None) -> pd.DataFrame:
    """Stage-cycles spent waiting, by stage kind and engine unit, split by what was waited for.

    Of a device run: per PE (``per_pe`` None with several PEs, or True; a
    ``pe`` column first) or, with ``per_pe=False``, summed over the PEs.

    Each stage waits from the cycle its engine could first have taken it, in
    the order the PE issues work, until it starts:

    * a plan stage (DMA_READ, FETCH, GEMM, MATH, DMA_WRITE) from its
      command's PLAN end: ``hazard`` = the hold of its command (release − PLAN
      end, from ``run.holds()``; 0 if not held), ``dependency`` = ready −
      release (its data, tile and staging-ring edges), ``engine_busy`` =
      start − ready (ready, but its engine — every DMA channel — was busy);
    * a DISPATCH from the end of the previous DISPATCH (cycle 0 for the
      first): the CPU idles until its ``ready``, charged to ``wait`` (a
      ``tl.wait``) or ``queue`` (a full command queue), whichever set
      ``ready`` (a tie: ``wait``);
    * a PLAN from the later of its DISPATCH's end and the previous PLAN's
      end: charged to ``scheduler`` (blocked behind a held command, strict
      FIFO).

    DISPATCH and PLAN never wait for their engine in this sense: it is busy
    only with the previous command, which they follow in order. Every stage's
    columns add up to its wait, ``total``.

    Returns:
        One row per (stage kind, engine unit) present, stage kinds in
        pipeline order and units in track order: ``stage``, ``engine``,
        ``stages``, then :data:`WAIT_COLUMNS` as integer cycles summed over
        those stages.

    Raises:
        ValidationError: not a run, or a bad ``per_pe``.
    """
    run = _resolve_run_only(run)
    how = _per_pe.form(len(run.pes), per_pe, "waits")
    if how != _per_pe.ONE:
        return _per_pe.waits(run, how, lambda r: waits(r, per_pe=False))
    if run.pe(run.pes[0]) is not run:  # a device run in which one PE ran: that PE's
        return waits(run.pe(run.pes[0]), per_pe=False)
    prog, tl = run.program, run.timeline
    log = run.op_log
    kind = log["stage"].cat.codes.to_numpy(np.int64)
    cmd = log["cmd"].to_numpy(np.int64)
    ready, start, end = (log[c].to_numpy(np.int64) for c in ("ready", "start", "end"))
    d = np.asarray(prog.dispatch_seq, np.int64)
    p = d + 1
    plan_end = end[p]
    released = plan_end.copy()
    holds = run.holds()
    released[holds["cmd"].to_numpy(np.int64)] = holds["release"].to_numpy(np.int64)
    n = len(log)
    cols = {c: np.zeros(n, np.int64) for c in WAIT_COLUMNS}
    work = kind >= 2
    c = cmd[work]
    cols["hazard"][work] = released[c] - plan_end[c]
    cols["dependency"][work] = ready[work] - released[c]
    cols["engine_busy"][work] = start[work] - ready[work]
    cols["total"][work] = start[work] - plan_end[c]
    # DISPATCH: idle from the previous DISPATCH's end to ready, for a wait or a queue slot
    prev_end = np.concatenate(([0], end[d[:-1]]))
    idle = np.maximum(ready[d] - prev_end, 0)
    by_wait = tl.front.d_wait == ready[d]
    cols["wait"][d] = np.where(by_wait, idle, 0)
    cols["queue"][d] = np.where(by_wait, 0, idle)
    cols["engine_busy"][d] = start[d] - np.maximum(ready[d], prev_end)
    cols["total"][d] = start[d] - prev_end
    # PLAN: idle from max(its DISPATCH's end, the previous PLAN's end) to ready, behind a hold
    since = np.maximum(end[d], np.concatenate(([0], end[p[:-1]])))
    cols["scheduler"][p] = np.maximum(ready[p] - since, 0)
    cols["engine_busy"][p] = start[p] - np.maximum(ready[p], since)
    cols["total"][p] = start[p] - since
    frame = pd.DataFrame({"stage": log["stage"], "engine": log["engine"], "stages": 1, **cols})
    out = frame.groupby(["stage", "engine"], observed=True, sort=True).sum().reset_index()
    out["stage"] = out["stage"].astype(str)
    out["engine"] = out["engine"].astype(str)
    return out


#: The range of :func:`what_if`'s ``speedup``: from an engine a thousand times slower to a million times
#: faster (beyond that every stage of it takes one cycle anyway; a slower engine would push cycle counts
#: of long runs towards the int64 the timeline counts in).
SPEEDUP_RANGE = (Fraction(1, 1000), Fraction(10**6))


def _speedup_fraction(speedup: Any) -> Fraction:
    """``speedup`` as the exact fraction it is written as, or a ValidationError saying what is accepted.

    Every real number type is read exactly: ints (Python and numpy) as themselves, ``Fraction`` and
    ``Decimal`` as themselves,
    floats as the decimal they print as (``0.1`` is 1/10; a numpy float as its own type prints it, so
    ``np.float32(0.1)`` is 1/10 too).
    """
    low, high = SPEEDUP_RANGE

    def refuse(why: str) -> ValidationError:
        return ValidationError(f"what_if: speedup={speedup!r} {why}; pass a real number from {float(low):g} to "
                               f"{float(high):g} (2 = twice as fast, 0.5 = half as fast).")

    if isinstance(speedup, (bool, np.bool_)) or not isinstance(speedup, (numbers.Real, decimal.Decimal)):
        raise refuse(f"is a {type(speedup).__name__}, not a real number")
    try:
        factor: Fraction | None
        if isinstance(speedup, decimal.Decimal):
            factor = Fraction(speedup) if speedup.is_finite() else None
        elif isinstance(speedup, numbers.Integral):
            factor = Fraction(int(speedup))
        elif isinstance(speedup, numbers.Rational):
            factor = Fraction(int(speedup.numerator), int(speedup.denominator))
        else:
            value = float(speedup)
            factor = (None if not np.isfinite(value) else
                      Fraction(str(speedup)) if isinstance(speedup, np.floating) else exact_fraction(value))
    except (TypeError, ValueError, OverflowError, ZeroDivisionError):
        raise refuse("cannot be read as a number") from None
    if factor is None:
        raise refuse("is not finite")
    if factor <= 0:
        raise refuse("is not positive")
    if not low <= factor <= high:
        raise refuse("is out of range")
    return factor


def _engine_names(engine: Any) -> list[str]:
    """The engines ``what_if`` re-simulates: all of them for ``None``, else the names given, checked."""
    if engine is None:
        return list(ENGINE_NAMES)
    if isinstance(engine, str):
        names = [engine]
    elif isinstance(engine, (list, tuple, np.ndarray, pd.Index, pd.Series)) and len(engine):
        names = list(engine)
    else:
        raise ValidationError(f"what_if: engine={engine!r}; pass an engine name ({', '.join(ENGINE_NAMES)}), a "
                              f"non-empty list of them, or None for every engine.")
    for name in names:
        if not isinstance(name, str) or name not in ENGINE_NAMES:
            hint = (f" ({name!r} is a channel; name its engine)" if isinstance(name, str)
                    and name.rstrip("0123456789") in ENGINE_NAMES else "")
            raise ValidationError(f"what_if: unknown engine {name!r}{hint}; use one of {', '.join(ENGINE_NAMES)}.")
    return [str(name) for name in names]


def check_what_if(engine: str | Sequence[str] | None = None, speedup: Any = 2.0) -> tuple[list[str], Fraction]:
    """The arguments of :func:`what_if` checked, before anything is simulated (``decode.what_if`` checks
    them before it runs a decode).

    Returns:
        The engine names to re-simulate and the speedup as the exact fraction it is written as.

    Raises:
        ValidationError: as :func:`what_if`'s, for ``engine`` and ``speedup``.
    """
    factor = _speedup_fraction(speedup)
    return _engine_names(engine), factor


def what_if(run: Any, engine: str | Sequence[str] | None = None, speedup: float = 2.0) -> pd.DataFrame:
    """Causal profiling: re-simulate with one engine's stages ``speedup`` times faster.

    The run's own program is re-simulated in timing mode (the same stages,
    dependencies, hazards and queue) with every stage of the engine taking
    ``ceil(d / speedup)`` cycles instead of ``d``, ``speedup`` read as the
    exact decimal it is written as: speedup 1 reproduces the run exactly, a
    stage that takes time never becomes free, and a speedup below 1 slows
    the engine down. A DMA speedup applies to every channel.

    Args:
        run: a :class:`~kbwork.Run`, or anything whose ``.run`` is one (a
            ``decode.DecodeRun``). To start from a dict of ``decode.run``
            parameters, use ``decode.what_if``.
        engine: an engine name (``"PE_DMA"``, ``"PE_GEMM"``, ...), a list of
            them, or ``None`` for every engine (one row each).
        speedup: a real number of any type (int, float, numpy, ``Fraction``)
            in :data:`SPEEDUP_RANGE`, read exactly as written.

    Returns:
        One row per engine: ``engine``, ``speedup``, ``baseline_cycles`` (the
        run's), ``cycles`` (re-simulated), ``change_cycles`` (cycles −
        baseline), ``change`` (that as a fraction of the baseline) and
        ``end_to_end_speedup`` (baseline / cycles).

    Raises:
        ValidationError: an unknown engine (or an engine that is no name), a speedup that is no real
            number, not finite, or out of :data:`SPEEDUP_RANGE`, or an input that is none of the above;
            checked before anything is simulated.
    """
    names, factor = check_what_if(engine, speedup)
    resolved = _run_of(run)
    if resolved is None:
        how = " (for a dict of decode.run parameters, use decode.what_if)" if isinstance(run, dict) else ""
        raise ValidationError(f"what_if takes a Run or anything whose .run is one (a decode.DecodeRun), "
                              f"not {type(run).__name__}{how}.")
    run = resolved
    rows = []
    for name in names:
        cycles = run.rescaled(ENGINE_NAMES.index(name), factor).cycles
        base = run.cycles
        rows.append({"engine": name, "speedup": float(factor), "baseline_cycles": base, "cycles": cycles,
                     "change_cycles": cycles - base, "change": (cycles - base) / base if base else 0.0,
                     "end_to_end_speedup": base / cycles if cycles else float("nan")})
    return pd.DataFrame(rows)


# --- explain: the whole story of one run ---------------------------------------------------------------
#: A unit busy at least this fraction of the run is called saturated by :func:`explain`: the run cannot
#: be much shorter than that unit's work, whatever else changes.
SATURATED = 0.85
#: The causes of :func:`waits` other than ``engine_busy``, in the order :func:`explain` lists them.
_WAIT_CAUSES = ("dependency", "hazard", "queue", "wait", "scheduler", "engine_busy")


def top_waits(run, n: int = 5) -> pd.DataFrame:
    """The ``n`` largest entries of :func:`waits`, one (stage kind, engine unit, cause) each.

    Returns:
        Columns ``stage``, ``engine``, ``cause`` (a :data:`WAIT_COLUMNS` name
        other than ``total``), ``cycles`` (stage-cycles waited: stages wait at
        the same time, so these can add up to more than the run) and
        ``stages`` (how many stages of that kind and unit there are), largest
        first; ties keep stage-kind, unit and cause order. Zero entries are
        left out.

    Raises:
        ValidationError: ``n`` is not a positive int.
    """
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n <= 0:
        raise ValidationError(f"top_waits: n={n!r}; pass a positive number of rows.")
    w = waits(run, per_pe=False)  # a device's summed over its PEs
    long = w.melt(id_vars=["stage", "engine", "stages"], value_vars=list(_WAIT_CAUSES), var_name="cause",
                  value_name="cycles")
    # melt lists cause by cause; order by (stage row, cause) so that ties read in pipeline order
    long["_row"] = np.tile(np.arange(len(w)), len(_WAIT_CAUSES))
    long["_cause"] = np.repeat(np.arange(len(_WAIT_CAUSES)), len(w))
    long = long[long["cycles"] > 0].sort_values(["cycles", "_row", "_cause"], ascending=[False, True, True],
                                                kind="stable")
    out = long.head(int(n))[["stage", "engine", "cause", "cycles", "stages"]].reset_index(drop=True)
    out["cycles"] = out["cycles"].astype(np.int64)
    return out


class Explanation:
    """Where one run's time went: what :func:`explain` returns.

    Attributes:
        name: what the run is called in reports (a variant name, say).
        cycles: end-to-end cycles; ``us`` the same in microseconds.
        hazard_policy: the run's hazard policy.
        utilization: :func:`utilization` of its op_log.
        attribution: :func:`attribution` of the run.
        top_waits: :func:`top_waits` of the run.
        holds: how many commands a hazard held (rows of ``run.holds()``).
        bound: the numbers the sentence is made of (see :func:`explain`).
        sentence: one sentence saying what bounds the run.
        pe, pes: the PE the critical path runs on, and how many PEs ran (1 but for a device run, whose
            utilisation, holds and waits here are that PE's).
    """

    def __init__(self, name: str, cycles: int, us: float, hazard_policy: str, utilization: pd.DataFrame,
                 attribution: pd.DataFrame, top_waits: pd.DataFrame, holds: int, bound: dict[str, Any],
                 sentence: str, pe: int = 0, pes: int = 1):
        self.name, self.cycles, self.us, self.hazard_policy = name, cycles, us, hazard_policy
        self.utilization, self.attribution, self.top_waits = utilization, attribution, top_waits
        self.holds, self.bound, self.sentence = holds, bound, sentence
        self.pe, self.pes = pe, pes

    def __repr__(self) -> str:
        return f"Explanation({self.name}: {self.cycles} cycles; {self.sentence})"

    def by(self, what: str) -> pd.Series:
        """The critical-path cycles by ``"engine"`` or by ``"cause"``, indexed by name (zeros included)."""
        if what not in ("engine", "cause"):
            raise ValidationError(f"Explanation.by({what!r}): use 'engine' or 'cause'.")
        a = self.attribution[self.attribution["by"] == what]
        return pd.Series(a["cycles"].to_numpy(), index=pd.Index(a["name"].tolist(), name=what), name="cycles")

    def to_dict(self) -> dict[str, Any]:
        """Every field as plain JSON-serialisable values (integers for cycles, floats for fractions)."""
        util = self.utilization
        device = {"pes": int(self.pes), "pe": int(self.pe)} if self.pes > 1 else {}
        return {
            **device,
            "name": self.name, "cycles": int(self.cycles), "us": float(self.us),
            "hazard_policy": self.hazard_policy, "holds": int(self.holds),
            "utilization": {e: {"stages": int(s), "busy_cycles": int(b), "busy_fraction": float(f)}
                            for e, s, b, f in zip(util["engine"], util["stages"], util["busy_cycles"],
                                                  util["busy_fraction"])},
            "critical_path": {what: {k: int(v) for k, v in self.by(what).items()} for what in ("engine", "cause")},
            "top_waits": [{"stage": r.stage, "engine": r.engine, "cause": r.cause, "cycles": int(r.cycles),
                           "stages": int(r.stages)} for r in self.top_waits.itertuples()],
            "bound": {k: (float(v) if isinstance(v, (float, np.floating)) else
                          int(v) if isinstance(v, (numbers.Integral,)) and not isinstance(v, bool) else v)
                      for k, v in self.bound.items()},
            "sentence": self.sentence,
        }

    @property
    def short(self) -> str:
        """The bound in a few words (``kbwork compare`` prints it): e.g. ``latency-bound (critical path 67%
        PE_GEMM, 31% PE_DMA; 29% after hazard holds)`` or ``throughput-bound on PE_GEMM (busy 92%)``."""
        b = self.bound
        shared = (f"; channel{'s' if len(b['contended_channels']) > 1 else ''} "
                  f"{', '.join(map(str, b['contended_channels']))} contended, "
                  f"{100 * b['contention_fraction']:.0f}% lost" if b.get("contended_channels") else "")
        if b["kind"] == "throughput":
            return f"throughput-bound on {b['engine']} (busy {100 * b['busy_fraction']:.0f}%{shared})"
        second = (f", {100 * b['second_fraction']:.0f}% {b['second_engine']}"
                  if b["second_engine"] is not None and b["second_fraction"] > 0 else "")
        cause = (f"; {100 * b['cause_fraction']:.0f}% after {_CAUSE_SHORT[b['cause']]}"
                 if b["cause"] is not None else "")
        return (f"latency-bound (critical path {100 * b['engine_fraction']:.0f}% {b['engine']}{second}{cause}"
                f"{shared})")

    def report(self) -> str:
        """The text ``kbwork explain`` prints for this run: cycles, utilisation, critical path, waits, bound."""
        c = self.cycles
        device = (f"; a device of {self.pes} PEs: the critical path, and the units below, are PE {self.pe}'s"
                  if self.pes > 1 else "")
        lines = [f"{self.name}: {c} cycles = {self.us:.3f} us ({self.hazard_policy}, {self.holds} commands held "
                 f"by hazards{device})"]
        lines.append(f"  {'engine unit':14}{'busy':>10}{'busy %':>8}{'on critical path':>18}{'path %':>8}")
        on_path = self.by("engine")
        for e, busy, frac in zip(self.utilization["engine"], self.utilization["busy_cycles"],
                                 self.utilization["busy_fraction"]):
            p = int(on_path.get(e, 0))
            lines.append(f"  {e:14}{busy:>10}{100 * frac:>7.1f}%{p:>18}{_pct(p, c):>8}")
        causes = self.by("cause")
        lines.append("  critical path by cause: " + ", ".join(f"{k} {v} ({_pct(v, c).strip()})"
                                                              for k, v in causes.items() if v))
        if len(self.top_waits):
            lines.append("  top waits (stage-cycles, summed over stages that wait at the same time):")
            for r in self.top_waits.itertuples():
                lines.append(f"    {r.stage:9} on {r.engine:12} waiting for {r.cause:12}{r.cycles:>10} "
                             f"({r.stages} stages)")
        lines.append(f"  bound: {self.sentence}")
        return "\n".join(lines)


def _pct(part: float, whole: float) -> str:
    return f"{100 * part / whole:5.1f}%" if whole else "    -"


def explain(run_or_decode_run: Any, name: str | None = None, *, top: int = 5,
            saturated: float = SATURATED, contended: float = CONTENDED) -> Explanation:
    """Where a run's time went, and one sentence saying what bounds it (DESIGN §11).

    The sentence is derived from the numbers, never chosen by hand:

    * the **lead engine** is the unit with the most critical-path cycles
      (the first in track order on a tie);
    * if that unit is busy at least ``saturated`` of the run, the run is
      **throughput-bound** on it: it cannot be much shorter than that unit's
      work, and the sentence says so with its busy share and its share of the
      critical path;
    * otherwise the run is **latency-bound**: its critical path is a chain
      (the lead engine's share and the runner-up's) through units that are
      idle part of the time, and the sentence names the link cause, other
      than plain ``dependency``, that carries most of the path (``hazard``,
      ``engine``, ``queue``, ...), with its share, if it carries any;
    * if the DMA stages on the critical path lost at least ``contended`` of
      the run's cycles to sharing their HBM channels (:func:`contention`),
      it names those channels and the cycles lost; below that it says nothing
      of them.

    A device run is explained on the PE its critical path runs on (the one
    that finishes last): the utilisation, holds and waits are that PE's.

    Args:
        run_or_decode_run: a :class:`~kbwork.Run` or a ``decode.DecodeRun``.
        name: what to call the run (default: the decode variant, or ``"run"``).
        top: how many :func:`top_waits` rows to keep.
        saturated: the busy fraction from which a unit counts as saturated.
        contended: the fraction of the run lost to channel sharing on the
            critical path from which the sentence names contention.

    Returns:
        An :class:`Explanation`; its ``bound`` dict holds ``kind``
        (``"throughput"`` or ``"latency"``), ``engine``, ``engine_cycles`` and
        ``engine_fraction`` (on the critical path), ``busy_fraction`` (of the
        run), ``second_engine`` and ``second_fraction``, ``cause`` and
        ``cause_fraction`` (``None`` and 0.0 when only dependencies link the
        path), ``contention_cycles`` and ``contention_fraction`` (what the
        path's DMA stages lost to sharing) and ``contended_channels`` (the
        channels the sentence names, ascending; empty below ``contended``).

    Raises:
        ValidationError: not a run, or a bad ``name``, ``top``, ``saturated`` or ``contended``.
    """
    run = _run_of(run_or_decode_run)
    if run is None:
        raise ValidationError(f"explain takes a Run or a decode.DecodeRun, not {type(run_or_decode_run).__name__}.")
    if name is not None and not isinstance(name, str):
        raise ValidationError(f"explain: name={name!r} must be text (what the report calls the run), or None for "
                              f"the variant's name.")
    if isinstance(saturated, bool) or not isinstance(saturated, numbers.Real) or not 0 < saturated <= 1:
        raise ValidationError(f"explain: saturated={saturated!r}; pass a busy fraction in (0, 1].")
    if isinstance(contended, bool) or not isinstance(contended, numbers.Real) or not 0 < contended <= 1:
        raise ValidationError(f"explain: contended={contended!r}; pass a fraction of the run in (0, 1].")
    if name is None:
        name = getattr(run_or_decode_run, "variant", None) or "run"
    cycles = run.cycles
    on = run.pe(run.last_pe()) if isinstance(run, DeviceRun) else run  # the PE the critical path runs on
    util = utilization(on.op_log)
    att = attribution(run)
    n_holds = len(on.timeline.held)
    lost = path_contention(run)
    eng = att[att["by"] == "engine"].reset_index(drop=True)
    order = np.lexsort((np.arange(len(eng)), -eng["cycles"].to_numpy()))  # most cycles first, then track order
    lead, second = eng.iloc[order[0]], eng.iloc[order[1]] if len(eng) > 1 else None
    busy = float(util.loc[util["engine"] == lead["name"], "busy_fraction"].iloc[0])
    causes = att[(att["by"] == "cause") & (att["name"] != "dependency")].reset_index(drop=True)
    corder = np.lexsort((np.arange(len(causes)), -causes["cycles"].to_numpy()))
    top_cause = causes.iloc[corder[0]] if len(causes) and causes["cycles"].max() > 0 else None
    bound = {
        "kind": "throughput" if busy >= saturated else "latency",
        "engine": str(lead["name"]), "engine_cycles": int(lead["cycles"]), "engine_fraction": float(lead["fraction"]),
        "busy_fraction": busy,
        "second_engine": None if second is None else str(second["name"]),
        "second_fraction": 0.0 if second is None else float(second["fraction"]),
        "cause": None if top_cause is None else str(top_cause["name"]),
        "cause_fraction": 0.0 if top_cause is None else float(top_cause["fraction"]),
        "contention_cycles": lost["cycles"], "contention_fraction": float(lost["fraction"]),
        "contended_channels": list(lost["channels"]) if lost["fraction"] >= contended else [],
    }
    sentence = _sentence(name, cycles, bound, n_holds)
    if bound["contended_channels"]:
        sentence = f"{sentence[:-1]}; {contention_words(lost)}."
    return Explanation(name, cycles, run.topology.cycles_to_us(cycles), run.topology.hazard_policy, util, att,
                       top_waits(on, top), n_holds, bound, sentence, on.pes[0], len(run.pes))


#: What each link cause means, as the sentence of :func:`explain` words it.
_CAUSE_WORDS = {
    "engine": "stages that waited for a busy engine",
    "hazard": "stages released by hazard holds",
    "queue": "dispatches that waited for a queue slot",
    "wait": "dispatches that waited on tl.wait",
    "scheduler": "plans blocked behind a held command",
    "order": "stages that followed program order",
}


#: The same, in two or three words (``Explanation.short``).
_CAUSE_SHORT = {"engine": "busy-engine waits", "hazard": "hazard holds", "queue": "queue waits",
                "wait": "tl.wait", "scheduler": "scheduler blocks", "order": "program order"}


def _sentence(name: str, cycles: int, b: dict[str, Any], holds: int) -> str:
    """The one sentence of :func:`explain`, from the numbers in ``b``."""
    pct = lambda f: f"{100 * f:.0f}%"  # noqa: E731
    e, ef, busy = b["engine"], b["engine_fraction"], b["busy_fraction"]
    if b["kind"] == "throughput":
        text = (f"{name} is throughput-bound on {e}: it is busy {pct(busy)} of the {cycles} cycles and carries "
                f"{pct(ef)} of the critical path")
    else:
        text = f"{name} is latency-bound: its critical path is {pct(ef)} {e}"
        if b["second_engine"] is not None and b["second_fraction"] > 0:
            text += f" and {pct(b['second_fraction'])} {b['second_engine']} work"
        else:
            text += " work"
        text += f", and {e} is busy {pct(busy)} of the {cycles} cycles"
    if b["cause"] is not None:
        text += f"; {_CAUSE_WORDS[b['cause']]} carry {pct(b['cause_fraction'])} of the path"
        if b["cause"] == "hazard":
            text += f" ({holds} commands held)"
    return text + "."


def explain_all(runs: Any, *, top: int = 5, saturated: float = SATURATED) -> dict[str, Explanation]:
    """:func:`explain` for every run of a ``decode.Comparison`` or a mapping name -> run.

    Returns:
        name -> :class:`Explanation`, in the order given.

    Raises:
        ValidationError: neither a Comparison nor a mapping of runs.
    """
    items = getattr(runs, "runs", runs)
    if not hasattr(items, "items"):
        raise ValidationError(f"explain_all takes a decode.Comparison or a dict name -> run, "
                              f"not {type(runs).__name__}.")
    return {str(k): explain(r, str(k), top=top, saturated=saturated) for k, r in items.items()}


def attribution_table(explanations: Any) -> pd.DataFrame:
    """The critical-path attribution of several runs in one long table (what ``plots.attribution`` draws).

    Args:
        explanations: name -> :class:`Explanation`, or name -> run (explained here),
            or a ``decode.Comparison``.

    Returns:
        Columns ``variant`` (the name), ``by``, ``name``, ``cycles``, ``fraction``:
        :func:`attribution` of each run, in the order given.
    """
    items = getattr(explanations, "runs", explanations)
    if not hasattr(items, "items"):
        raise ValidationError(f"attribution_table takes a dict name -> Explanation (or run) or a "
                              f"decode.Comparison, not {type(explanations).__name__}.")
    frames = []
    for k, x in items.items():
        att = x.attribution if isinstance(x, Explanation) else attribution(_resolve_run_only(x))
        frames.append(att.assign(variant=str(k))[["variant", "by", "name", "cycles", "fraction"]])
    if not frames:
        raise ValidationError("attribution_table: no runs given.")
    return pd.concat(frames, ignore_index=True)


def _resolve_run_only(x: Any) -> Run:
    """:func:`_run_of` ``x``, or a ValidationError naming what was given."""
    run = _run_of(x)
    if run is not None:
        return run
    raise ValidationError(f"expected a Run, a decode.DecodeRun or an Explanation, not {type(x).__name__}.")


def attribution_wide(explanations: Any, by: str = "engine", drop_zero: bool = True) -> pd.DataFrame:
    """The critical-path attribution of several runs side by side, one row per run.

    Args:
        explanations: name -> :class:`Explanation` (or run), or a ``decode.Comparison``.
        by: ``"engine"`` or ``"cause"``.
        drop_zero: leave out the names that are 0 in every run.

    Returns:
        Indexed by run name: ``cycles`` (end to end), then one column per
        engine unit or cause, in :func:`attribution` order; each row's
        columns after ``cycles`` add up to it.

    Raises:
        ValidationError: a bad ``by`` or ``explanations``.
    """
    if by not in ("engine", "cause"):
        raise ValidationError(f"attribution_wide: by={by!r}; use 'engine' or 'cause'.")
    t = attribution_table(explanations)
    t = t[t["by"] == by]
    names = list(dict.fromkeys(t["name"]))
    runs = list(dict.fromkeys(t["variant"]))
    wide = t.pivot(index="variant", columns="name", values="cycles").loc[runs, names].astype(np.int64)
    if drop_zero:
        wide = wide.loc[:, (wide != 0).any()]
    wide.insert(0, "cycles", wide.sum(axis=1))
    wide.index.name, wide.columns.name = "run", by
    return wide


def utilization_wide(explanations: Any) -> pd.DataFrame:
    """Busy fraction of every engine unit, one row per run (indexed by name), units in track order.

    ``explanations`` is name -> :class:`Explanation` (or run), or a ``decode.Comparison``.
    """
    items = getattr(explanations, "runs", explanations)
    if not hasattr(items, "items"):
        raise ValidationError(f"utilization_wide takes a dict name -> Explanation (or run) or a "
                              f"decode.Comparison, not {type(explanations).__name__}.")
    rows = {}
    for k, x in items.items():
        util = x.utilization if isinstance(x, Explanation) else utilization(_resolve_run_only(x).op_log)
        rows[str(k)] = util.set_index("engine")["busy_fraction"]
    out = pd.DataFrame(rows).T
    out.index.name, out.columns.name = "run", "engine"
    return out
