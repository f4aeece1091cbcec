"""Tables over a decode sweep's points: the fastest variant at each, and the gap between two variants
split by where their critical paths spend their cycles."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import pandas as pd

from ..device import CAUSES
from ..errors import ValidationError
from ..oplog import ENGINE_NAMES
from .critical import PATH_COLUMNS


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
