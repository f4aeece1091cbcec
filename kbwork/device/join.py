"""One PE's records from two event loops, joined into the records of one run (the cut, :mod:`.cut`).

A PE whose launches were simulated in two phases — its launches before the cut in one event loop, the rest in
another that started them at the cycle the first phase ended — has two schedules and two timelines, each
numbered from 0. Joined, the second phase's seqs, command positions and the commands its records name move
past the first phase's; cycles are the device's in both already. What the two loops could not see of each
other, the DISPATCH and PLAN constraints that look back across the join (the previous DISPATCH's and PLAN's
starts, the queue slots, a strict-FIFO hold), is computed again from the joined arrays, as
:func:`~kbwork.device.records.front_end` computes it for any run; the first command after the join waits for
the first phase's end as a launch waits for the previous one (``d_launch``). Every column is built on first
use: a step that reads only cycles builds none.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any, Sequence

import numpy as np
import pandas as pd
from pandas.api.types import union_categoricals

from .records import FrontEnd, dispatch_ready, front_end
from .steady import SteadyState, _Concat


def _ints(a: Any) -> np.ndarray:
    return np.asarray(a, dtype=np.int64)


def _cat(values: Any) -> pd.Categorical:
    """``values`` as a categorical with sorted categories (as ``oplog`` makes them)."""
    if isinstance(values, pd.Categorical):
        return values
    return pd.Categorical(np.asarray(list(values), dtype=object)) if len(values) else pd.Categorical([])


class JoinedTable:
    """The stage table of a joined run: the first phase's stages, then the second's (its ``cmd`` and ``preds``
    moved past the first's commands and stages)."""

    def __init__(self, a: Any, b: Any, ns: int, nc: int):
        self._a, self._b, self._ns, self._nc = a, b, ns, nc

    def __len__(self) -> int:
        return self._ns + len(self._b)

    def __repr__(self) -> str:
        return f"JoinedTable({len(self)} stages: {self._ns} before the cut)"

    def _col(self, name: str, dtype: Any = np.int64, shift: int = 0) -> np.ndarray:
        b = np.asarray(getattr(self._b, name), dtype)
        return np.concatenate([np.asarray(getattr(self._a, name), dtype), b + shift if shift else b])

    kind = cached_property(lambda self: self._col("kind", np.int8))
    engine = cached_property(lambda self: self._col("engine", np.int8))
    phase = cached_property(lambda self: self._col("phase", np.int8))
    cmd = cached_property(lambda self: self._col("cmd", shift=self._nc))
    tile = cached_property(lambda self: self._col("tile"))
    k_tile = cached_property(lambda self: self._col("k_tile"))
    nbytes = cached_property(lambda self: self._col("nbytes"))
    dur = cached_property(lambda self: self._col("dur"))
    chan = cached_property(lambda self: self._col("chan"))

    @cached_property
    def op_kind(self) -> pd.Categorical:
        return union_categoricals([_cat(self._a.op_kind), _cat(self._b.op_kind)], sort_categories=True)

    @cached_property
    def tensor(self) -> pd.Categorical:
        return union_categoricals([_cat(self._a.tensor), _cat(self._b.tensor)], sort_categories=True)

    @property
    def preds(self) -> "_JoinedPreds":
        return _JoinedPreds(self._a.preds, self._b.preds, self._ns)

    def column(self, name: str) -> Any:
        return getattr(self, name)

    def describe(self, s: int) -> str:
        if s < self._ns:
            return self._a.describe(s)
        text = self._b.describe(s - self._ns)
        return f"seq {s} (after the cut, {s - self._ns} there): " + text.split(": ", 1)[1]


class _JoinedPreds(Sequence):
    """Every stage's static dependencies in the joined numbering (made on access)."""

    def __init__(self, a: Sequence, b: Sequence, ns: int):
        self._a, self._b, self._ns = a, b, ns

    def __len__(self) -> int:
        return self._ns + len(self._b)

    def __getitem__(self, s: Any) -> Any:
        if isinstance(s, slice):
            return [self[i] for i in range(*s.indices(len(self)))]
        if s < 0:
            s += len(self)
        if not 0 <= s < len(self):
            raise IndexError(f"stage {s} out of range ({len(self)} stages)")
        if s < self._ns:
            return self._a[s]
        return tuple(p + self._ns for p in self._b[s - self._ns])


class JoinedSchedule:
    """The schedule of a PE simulated in two phases (a ``ScheduleView``): the first phase's commands and stages,
    then the second's, in one numbering."""

    def __init__(self, a: Any, b: Any):
        self._a, self._b = a, b
        self._ns, self._nc = a.n_stages, a.n_commands
        self.topo, self.loops, self.reach = a.topo, tuple(a.loops) + tuple(b.loops), max(a.reach, b.reach)
        self.commands = _Concat([a.commands, b.commands])
        self.table = JoinedTable(a.table, b.table, self._ns, self._nc)

    def __repr__(self) -> str:
        return f"Schedule({self.n_commands} commands, {self.n_stages} stages, {self.topo.name}; in two phases)"

    @property
    def n_commands(self) -> int:
        return self._nc + self._b.n_commands

    @property
    def n_stages(self) -> int:
        return self._ns + self._b.n_stages

    def _cmd_col(self, name: str, shift: int = 0) -> np.ndarray:
        return np.concatenate([_ints(getattr(self._a, name)), _ints(getattr(self._b, name)) + shift])

    dispatch_seq = cached_property(lambda self: self._cmd_col("dispatch_seq", self._ns))
    plan_end = cached_property(lambda self: self._cmd_col("plan_end", self._ns))
    logical_bytes = cached_property(lambda self: self._cmd_col("logical_bytes"))
    iters = cached_property(lambda self: self._cmd_col("iters"))

    @property
    def plan_seq(self) -> np.ndarray:
        return self.dispatch_seq + 1

    @property
    def plan_first(self) -> np.ndarray:
        return self.dispatch_seq + 2

    @cached_property
    def labels(self) -> list[str]:
        return list(self._a.labels) + list(self._b.labels)

    @cached_property
    def waits(self) -> list[tuple[int, ...]]:
        nc = self._nc
        return list(self._a.waits) + [tuple(w + nc for w in ws) if ws else () for ws in self._b.waits]

    @cached_property
    def reads(self) -> list[tuple]:
        return list(self._a.reads) + list(self._b.reads)

    @cached_property
    def writes(self) -> list[tuple]:
        return list(self._a.writes) + list(self._b.writes)

    def edge_reach(self) -> int:
        return max(self._a.edge_reach(), self._b.edge_reach())

    def periods(self) -> list[tuple[int, int, int]]:
        ns = self._ns
        return list(self._a.periods()) + [(d, lo + ns, hi + ns) for d, lo, hi in self._b.periods()]


class JoinedTimeline:
    """The timeline of a PE simulated in two phases (as :class:`~kbwork.device.records.Timeline` reads), each
    field built on first use; ``begin`` is the cycle the first phase ended, where the second phase began."""

    def __init__(self, a: Any, b: Any, sched: JoinedSchedule, begin: int):
        self._a, self._b, self._sched, self._begin = a, b, sched, begin
        self._nc = sched._nc
        self.engines = a.engines
        self.cycles = max(a.cycles, b.cycles)

    def __repr__(self) -> str:
        return f"Timeline({self._sched.n_stages} stages; in two phases)"

    def _cat(self, name: str, shift: int = 0) -> np.ndarray:
        b = np.asarray(getattr(self._b, name))
        return np.concatenate([np.asarray(getattr(self._a, name)), b + shift if shift else b])

    start = cached_property(lambda self: self._cat("start"))
    end = cached_property(lambda self: self._cat("end"))
    unit = cached_property(lambda self: self._cat("unit"))
    done = cached_property(lambda self: self._cat("done"))
    held = cached_property(lambda self: self._cat("held", self._nc))
    release = cached_property(lambda self: self._cat("release"))
    hit = cached_property(lambda self: np.concatenate([_ints(self._a.hit), _ints(self._b.hit) + self._nc]))

    @cached_property
    def hit_ptr(self) -> np.ndarray:
        pa, pb = _ints(self._a.hit_ptr), _ints(self._b.hit_ptr)
        return np.concatenate([pa, pb[1:] + (pa[-1] if len(pa) else 0)])

    def dispatch_cycles(self, sched: Any = None) -> np.ndarray:
        """Each command's DISPATCH cycles, the two phases' one after the other (``sched`` is not read)."""
        return np.concatenate([self._a.dispatch_cycles(self._sched._a), self._b.dispatch_cycles(self._sched._b)])

    @cached_property
    def front(self) -> FrontEnd:
        fa, fb = self._a.front, self._b.front
        sched = self._sched
        d = _ints(sched.dispatch_seq)
        whole = front_end(sched, d, self.start, self.end, self.done, self.held, self.release,
                          sched.topo.hazard_policy == "strict_fifo", ())
        d_launch = np.concatenate([fa.d_launch, fb.d_launch])
        if self._nc < len(d_launch):
            d_launch[self._nc] = self._begin  # it waited for the first phase's end, as for a previous launch
        d_after = None
        if fa.d_after is not None or fb.d_after is not None:
            none = [np.full(len(f.d_launch), -1, np.int64) for f in (fa, fb)]
            d_after = np.concatenate([f.d_after if f.d_after is not None else n for f, n in zip((fa, fb), none)])
        return whole._replace(d_wait=np.concatenate([fa.d_wait, fb.d_wait]), d_launch=d_launch, d_after=d_after)

    @cached_property
    def ready(self) -> np.ndarray:
        r = self._cat("ready")
        f = self.front
        d = _ints(self._sched.dispatch_seq)
        r[d] = dispatch_ready(f)
        r[d + 1] = np.maximum(np.maximum(f.p_dependency, f.p_order), f.p_scheduler)
        return r


def joined_state(a: SteadyState, b: SteadyState) -> SteadyState:
    """How a two-phase PE ran: the first phase's steady state (or the second's when only it inserted periods), with
    every loop of both."""
    loops = tuple(a.loops) + tuple(b.loops)
    if a.path == "steady":
        return SteadyState("steady", a.period, a.proven_at, None, a.inserted + b.inserted, loops)
    if b.path == "steady":
        return SteadyState("steady", b.period, b.proven_at, None, b.inserted, loops)
    return SteadyState("full", reason=a.reason, loops=loops)


def join(first: tuple, second: tuple) -> tuple:
    """``(timeline, schedule, steady state)`` of a PE from its first phase's and its second's (the second started
    at the first's last cycle)."""
    tl_a, s_a, st_a = first
    tl_b, s_b, st_b = second
    sched = JoinedSchedule(s_a, s_b)
    return JoinedTimeline(tl_a, tl_b, sched, tl_a.cycles), sched, joined_state(st_a, st_b)
