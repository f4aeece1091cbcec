"""Utilisation and waits of a device run, per PE and for the device (DESIGN.md §14, "Seeing it").

Every PE has its own units (PE 0's ``PE_DMA`` is not PE 1's), so a device op_log is grouped by ``pe`` as
well as by unit. The functions of :mod:`kbwork.analysis` (``utilization``, ``utilization_over_time``,
``waits``) take ``per_pe``:

* ``None`` (the default): per PE when more than one PE ran, else exactly the one-PE form;
* ``True``: per PE always (a ``pe`` column, or a ``pe`` level of the columns);
* ``False``: the device as a whole, its PEs' units pooled (the one-PE form; on one PE, exactly it).

This module holds the device forms; the one-PE forms stay where they were, and are what each PE's rows
are handed to.
"""

from __future__ import annotations

import numbers
from typing import Any, Callable

import numpy as np
import pandas as pd

from ..errors import ValidationError
from ..oplog import STAGE_NAMES, engine_tracks

ONE, PER_PE, DEVICE = "one", "per_pe", "device"


def form(n_pes: int, per_pe: Any, where: str) -> str:
    """Which form ``per_pe`` asks for with ``n_pes`` PEs present: :data:`ONE`, :data:`PER_PE` or :data:`DEVICE`.

    Raises:
        ValidationError: ``per_pe`` is not None, True or False.
    """
    if per_pe is not None and not isinstance(per_pe, (bool, np.bool_)):
        raise ValidationError(f"{where}: per_pe={per_pe!r}; pass None (per PE when several ran), True (per PE) "
                              f"or False (the device as a whole).")
    if per_pe is None:
        return PER_PE if n_pes > 1 else ONE
    return PER_PE if per_pe else (DEVICE if n_pes > 1 else ONE)


def pes_of(op_log: pd.DataFrame) -> np.ndarray:
    """The PEs an op_log holds, ascending (``[0]`` for an op_log without a ``pe`` column, or without rows)."""
    if "pe" not in op_log.columns or not len(op_log):
        return np.zeros(1, np.int64)
    return np.unique(op_log["pe"].to_numpy(np.int64))


def utilization(op_log: pd.DataFrame, how: str) -> pd.DataFrame:
    """:func:`kbwork.analysis.utilization` per PE (``how`` = :data:`PER_PE`) or pooled (:data:`DEVICE`).

    Returns:
        Per PE: ``pe``, ``engine``, ``stages``, ``busy_cycles``, ``busy_fraction`` (of the run's cycles, the
        last ``end`` of any PE), one row per (PE, unit), PEs ascending, units in track order, zeros included.
        Pooled: ``engine``, ``stages``, ``busy_cycles`` (summed over the PEs), ``busy_fraction`` (over
        PEs × cycles: the mean of the PEs' fractions).
    """
    tracks = engine_tracks(op_log["engine"])
    pes = pes_of(op_log)
    codes = pd.Categorical(op_log["engine"], categories=tracks).codes.astype(np.int64)
    pe_idx = np.searchsorted(pes, op_log["pe"].to_numpy(np.int64)) if "pe" in op_log.columns else 0 * codes
    dur = (op_log["end"] - op_log["start"]).to_numpy(np.int64)
    cycles = int(op_log["end"].max()) if len(op_log) else 0
    n, t = len(pes), len(tracks)
    key = pe_idx * t + codes if how == PER_PE else codes
    size = n * t if how == PER_PE else t
    busy = np.bincount(key, weights=dur, minlength=size).astype(np.int64)
    stages = np.bincount(key, minlength=size).astype(np.int64)
    span = cycles * (1 if how == PER_PE else n)
    out = {"engine": list(tracks) * (n if how == PER_PE else 1), "stages": stages, "busy_cycles": busy,
           "busy_fraction": busy / span if span else np.zeros(size)}
    if how == PER_PE:
        out = {"pe": np.repeat(pes, t), **out}
    return pd.DataFrame(out)


def over_time_edges(bins: Any, cycles: int) -> Any:
    """``bins`` as edges every PE shares: a number of bins over the device's cycles becomes its edges (the
    edges the one-PE form would take over ``[0, cycles]``); edges are passed through for it to check."""
    if isinstance(bins, numbers.Integral) and not isinstance(bins, bool) and 0 < bins <= 10_000_000:
        return np.linspace(0.0, float(cycles), int(bins) + 1)
    return bins


def utilization_over_time(op_log: pd.DataFrame, bins: Any, how: str,
                          one_pe: Callable[[pd.DataFrame, Any], pd.DataFrame]) -> pd.DataFrame:
    """:func:`kbwork.analysis.utilization_over_time` per PE or pooled, from ``one_pe`` applied to each PE's rows
    over the device's bins.

    Returns:
        Indexed by ``bin_start``. Per PE: columns a MultiIndex ``(pe, engine)``, every PE's units in track
        order. Pooled: one column per unit, the mean over the PEs of its busy fraction.
    """
    cycles = int(op_log["end"].max()) if len(op_log) else 0
    edges = over_time_edges(bins, cycles)
    pes = pes_of(op_log)
    pe = op_log["pe"].to_numpy(np.int64)
    parts = {int(p): one_pe(op_log[pe == p], edges) for p in pes}
    if how == PER_PE:
        out = pd.concat(parts, axis=1, names=["pe", "engine"])
        return out
    first = next(iter(parts.values()))
    total = sum(f.to_numpy() for f in parts.values()) / len(parts)
    return pd.DataFrame(total, index=first.index, columns=first.columns)


def waits(run: Any, how: str, one_pe: Callable[[Any], pd.DataFrame]) -> pd.DataFrame:
    """:func:`kbwork.analysis.waits` per PE (a ``pe`` column first) or pooled (the (stage kind, unit) rows
    summed over the PEs), from ``one_pe`` applied to each PE's run.

    Returns:
        The columns of ``waits``; per PE with ``pe`` first, PEs ascending; pooled in stage-kind order, then
        track order, as ``waits`` lists them.
    """
    frames = {p: one_pe(run.pe(p)) for p in run.pes}
    if how == PER_PE:
        return pd.concat([f.assign(pe=np.int64(p))[["pe", *f.columns]] for p, f in frames.items()],
                         ignore_index=True)
    both = pd.concat(list(frames.values()), ignore_index=True)
    tracks = engine_tracks(run.op_log["engine"])
    out = both.groupby(["stage", "engine"], sort=False).sum().reset_index()
    order = np.lexsort((pd.Categorical(out["engine"], categories=tracks).codes,
                        pd.Categorical(out["stage"], categories=STAGE_NAMES).codes))
    return out.iloc[order].reset_index(drop=True)
