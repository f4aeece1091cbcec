"""How busy each engine unit was: over the whole run, and bin by bin over time (DESIGN §11).

Data in, data out: both read an op_log and return a DataFrame; a device
run's op_log is read per PE or pooled (:mod:`kbwork.analysis.per_pe`).
"""

from __future__ import annotations

import numbers
from typing import Sequence

import numpy as np
import pandas as pd

from ..errors import ValidationError
from ..oplog import engine_tracks, require_columns
from . import per_pe as _per_pe
from .inputs import _check_cycles, _op_log_of


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
