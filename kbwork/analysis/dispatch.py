"""Per-tile dispatch, its closed form, and the dispatch-ratio gate (DESIGN §4).

The simulated per-tile dispatch is read off an op_log (DISPATCH stage
durations summed by ``iter``). The closed form applies the dispatch formula
of DESIGN.md §4 to the logical bytes of the commands a tile emits, with no
simulation; the two must agree exactly. The gate compares a candidate's
per-tile dispatch with a baseline's (opt3's with opt2's in ``decode.compare``).
"""

from __future__ import annotations

import numbers
from fractions import Fraction
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from ..config import Topology
from ..errors import ValidationError
from ..oplog import check_schema
from ..pe.commands import Command, dispatch_cycles
from .inputs import _op_log_of, _resolve_run_only


GATE_FACTOR = 2.0


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


def gate(candidate_cycles: float, baseline_cycles: float, factor: float = GATE_FACTOR) -> bool:
    """The dispatch-ratio gate: ``candidate > factor × baseline`` (default factor 2); ``decode.compare`` passes
    opt3's per-tile dispatch as the candidate and opt2's as the baseline.

    Returns:
        Whether the candidate's dispatch is more than ``factor`` times the baseline's.

    Raises:
        ValidationError: an argument that is not a real number.
    """
    for name, v in (("candidate_cycles", candidate_cycles), ("baseline_cycles", baseline_cycles),
                    ("factor", factor)):
        if isinstance(v, bool) or not isinstance(v, numbers.Real) or v != v:  # v != v: NaN
            raise ValidationError(f"gate: {name}={v!r} is not a number.")
    return bool(candidate_cycles > factor * baseline_cycles)


def ratio_grid(baseline_bytes: Sequence[int], candidate_bytes: Sequence[int], fixed_values: Sequence[float],
               r_values: Sequence[float], cap: int = 1024) -> pd.DataFrame:
    """Closed-form dispatch ratio candidate/baseline over a FIXED × R grid (FIXED rows, R columns): each
    argument of bytes is the logical bytes of one tile's commands (``DecodeRun.command_bytes_per_tile``; opt2's
    as the baseline and opt3's as the candidate for the ratio :func:`gate` tests).

    FIXED values are rounded to whole cycles, as the topology requires.

    Returns:
        The ratio at each (FIXED, R): ``inf`` where only the baseline dispatches nothing, NaN where neither
        dispatches anything.

    Raises:
        ValidationError: a negative or non-numeric FIXED or R, or an argument that is not a list.
    """
    for name, v in (("baseline_bytes", baseline_bytes), ("candidate_bytes", candidate_bytes),
                    ("fixed_values", fixed_values), ("r_values", r_values)):
        if isinstance(v, (str, bytes, Mapping)) or not isinstance(v, Iterable):
            raise ValidationError(f"ratio_grid: {name}={v!r} must be a list (of command bytes, or of FIXED or R "
                                  f"values), e.g. [{v!r}].")
    baseline_bytes, candidate_bytes, fixed_values, r_values = map(list, (baseline_bytes, candidate_bytes, fixed_values,
                                                                      r_values))
    for f in fixed_values:
        _check_calibration(int(round(f)) if isinstance(f, numbers.Real) and not isinstance(f, bool) else f,
                           0, cap, "ratio_grid")
    for r in r_values:
        _check_calibration(0, r, cap, "ratio_grid")
    grid = np.empty((len(fixed_values), len(r_values)))
    for i, f in enumerate(fixed_values):
        for j, r in enumerate(r_values):
            base = closed_form(baseline_bytes, int(round(f)), r, cap)
            cand = closed_form(candidate_bytes, int(round(f)), r, cap)
            grid[i, j] = cand / base if base else np.inf if cand else np.nan  # 0/0 (no dispatch at all): undefined
    return pd.DataFrame(grid, index=pd.Index([int(round(f)) for f in fixed_values], name="fixed_cycles"),
                        columns=pd.Index(list(r_values), name="r_cycles_per_byte"))
