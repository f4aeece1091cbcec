"""Per-tile dispatch, its closed form, and the dispatch-ratio gate.

The simulated per-tile dispatch is read off an op_log (DISPATCH stage
durations summed by ``iter``). The closed form applies the dispatch formula
of DESIGN.md §4 to the logical bytes of the commands a tile emits, with no
simulation; the two must agree exactly.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Iterable, Sequence

import numpy as np
import pandas as pd

from .config import Topology
from .pe.commands import Command, dispatch_cycles

GATE_FACTOR = 2.0


def dispatch_per_tile(op_log: pd.DataFrame) -> pd.Series:
    """Sum of DISPATCH cycles of the commands labelled with each tile's ``iter`` (iter >= 0).

    Returns:
        A Series indexed by iter, named ``dispatch_cycles``.
    """
    d = op_log[(op_log["stage"] == "DISPATCH") & (op_log["iter"] >= 0)]
    s = (d["end"] - d["start"]).groupby(d["iter"]).sum()
    s.name = "dispatch_cycles"
    return s.astype("int64")


def _sum_by_iter(values: np.ndarray, iters: np.ndarray, name: str) -> pd.Series:
    keep = iters >= 0
    it, vals = iters[keep], values[keep]
    if not len(it):
        return pd.Series([], dtype="int64", name=name, index=pd.Index([], name="iter"))
    sums = np.bincount(it, weights=vals, minlength=int(it.max()) + 1).astype(np.int64)
    present = np.unique(it)
    return pd.Series(sums[present], index=pd.Index(present, name="iter"), name=name)


def dispatch_per_tile_from_run(run) -> pd.Series:
    """:func:`dispatch_per_tile` computed from a :class:`~kbwork.Run` without building its op_log."""
    return _sum_by_iter(run.dispatch_cycles(), np.asarray(run.program.iters, dtype=np.int64), "dispatch_cycles")


def command_bytes_per_tile(commands: Sequence[Command]) -> dict[int, list[int]]:
    """Logical bytes of every command, grouped by ``iter`` (commands with iter -1 left out)."""
    out: dict[int, list[int]] = {}
    for c in commands:
        if c.iter >= 0:
            out.setdefault(c.iter, []).append(c.logical_bytes)
    return dict(sorted(out.items()))


def closed_form(command_bytes: Iterable[int], fixed: int, r: float | Fraction, cap: int = 1024) -> int:
    """``Σ FIXED·segments + ceil(R·bytes)`` over one tile's commands."""
    return sum(dispatch_cycles(b, fixed, r, cap) for b in command_bytes)


def closed_form_per_tile(commands: Sequence[Command], topo: Topology) -> pd.Series:
    """The closed-form per-tile dispatch of a program's commands under ``topo``'s calibration:
    ``Σ FIXED·segments + ceil(R·bytes)`` over each tile's commands, from their logical bytes."""
    fixed, r, cap = topo.fixed_cycles, topo.r_fraction, topo.max_composite_logical_bytes
    cost = {b: dispatch_cycles(b, fixed, r, cap) for b in {c.logical_bytes for c in commands}}
    cycles = np.fromiter((cost[c.logical_bytes] for c in commands), dtype=np.int64, count=len(commands))
    iters = np.fromiter((c.iter for c in commands), dtype=np.int64, count=len(commands))
    return _sum_by_iter(cycles, iters, "closed_form_cycles")


def gate(opt3_cycles: float, opt2_cycles: float, factor: float = GATE_FACTOR) -> bool:
    """The dispatch-ratio gate: ``opt3 > factor × opt2`` (default factor 2)."""
    return bool(opt3_cycles > factor * opt2_cycles)


def ratio_grid(bytes_opt2: Sequence[int], bytes_opt3: Sequence[int], fixed_values: Sequence[float],
               r_values: Sequence[float], cap: int = 1024) -> pd.DataFrame:
    """Closed-form dispatch ratio opt3/opt2 over a FIXED × R grid (FIXED rows, R columns).

    FIXED values are rounded to whole cycles, as the topology requires.
    """
    grid = np.empty((len(fixed_values), len(r_values)))
    for i, f in enumerate(fixed_values):
        for j, r in enumerate(r_values):
            d2 = closed_form(bytes_opt2, int(round(f)), r, cap)
            d3 = closed_form(bytes_opt3, int(round(f)), r, cap)
            grid[i, j] = d3 / d2 if d2 else np.inf
    return pd.DataFrame(grid, index=pd.Index([int(round(f)) for f in fixed_values], name="fixed_cycles"),
                        columns=pd.Index(list(r_values), name="r_cycles_per_byte"))
