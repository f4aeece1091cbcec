"""One PE's records from several event loops, joined into the records of one run.

Two reductions simulate a PE's launches in parts: the cut (:mod:`.cut`: its launches before the cut in one
event loop, the rest in another that started them where the first ended) and launch by launch
(:func:`kbwork.device.device.simulate_alone`: a PE alone on its channels runs each launch as if alone from cycle
0, the same launch elsewhere replicated, and moves it to where the previous one ended). Each part is numbered
from 0 and may run ``shift`` cycles early. Joined, a later part's seqs, command positions and the commands its
records name move past the earlier parts', its cycles by its shift. What the parts could not see of each other,
the DISPATCH and PLAN constraints that look back across a join (the previous DISPATCH's and PLAN's starts, the
queue slots, a strict-FIFO hold), is computed again from the joined arrays, as
:func:`~kbwork.device.records.front_end` computes it for any run; the first command of a part waits for the
previous part's end as a launch waits for the previous one (``d_launch``). Every column is built on first use:
a step that reads only cycles builds none.
"""

from __future__ import annotations

import bisect
from functools import cached_property
from typing import Any, Sequence

import numpy as np
import pandas as pd
from pandas.api.types import union_categoricals

from .records import FrontEnd, LazyRows, dispatch_ready, front_end
from .steady import SteadyState, _Concat


def _ints(a: Any) -> np.ndarray:
    return np.asarray(a, dtype=np.int64)


def _cat(values: Any) -> pd.Categorical:
    """``values`` as a categorical with sorted categories (as ``oplog`` makes them)."""
    if isinstance(values, pd.Categorical):
        return values
    return pd.Categorical(np.asarray(list(values), dtype=object)) if len(values) else pd.Categorical([])


class JoinedTable:
    """The stage table of a joined run: the parts' stages one after another (``cmd`` and ``preds`` moved past the
    earlier parts' commands and stages)."""

    def __init__(self, tables: Sequence[Any], ns: Sequence[int], nc: Sequence[int]):
        self._t, self._ns, self._nc = list(tables), list(ns), list(nc)  # offsets: len(tables) + 1 each

    def __len__(self) -> int:
        return self._ns[-1]

    def __repr__(self) -> str:
        return f"JoinedTable({len(self)} stages in {len(self._t)} parts)"

    def _col(self, name: str, dtype: Any = np.int64, shift: Sequence[int] | None = None) -> np.ndarray:
        cols = [np.asarray(getattr(t, name), dtype) for t in self._t]
        if shift is not None:
            cols = [c + d if d else c for c, d in zip(cols, shift)]
        return np.concatenate(cols) if cols else np.zeros(0, dtype)

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
        return union_categoricals([_cat(t.op_kind) for t in self._t], sort_categories=True)

    @cached_property
    def tensor(self) -> pd.Categorical:
        return union_categoricals([_cat(t.tensor) for t in self._t], sort_categories=True)

    @property
    def preds(self) -> "_JoinedPreds":
        return _JoinedPreds([t.preds for t in self._t], self._ns)

    def column(self, name: str) -> Any:
        return getattr(self, name)

    def _part(self, s: int) -> int:
        return bisect.bisect_right(self._ns, s) - 1

    def describe(self, s: int) -> str:
        k = self._part(s)
        if not k:
            return self._t[0].describe(s)
        q = s - self._ns[k]
        return f"seq {s} (part {k}, {q} there): " + self._t[k].describe(q).split(": ", 1)[1]


class _JoinedPreds(LazyRows):
    """Every stage's static dependencies in the joined numbering (made on access)."""

    what = "stage"

    def __init__(self, parts: Sequence[Sequence], ns: Sequence[int]):
        self._p, self._ns = parts, ns

    def __len__(self) -> int:
        return self._ns[-1]

    def _at(self, s: int) -> tuple[int, ...]:
        k = bisect.bisect_right(self._ns, s) - 1
        off = self._ns[k]
        return tuple(p + off for p in self._p[k][s - off]) if off else self._p[k][s]


class JoinedSchedule:
    """The schedule of a PE simulated in parts (a ``ScheduleView``): the parts' commands and stages one after
    another, in one numbering."""

    def __init__(self, parts: Sequence[Any]):
        self._s = list(parts)
        self._ns = [0]
        self._nc = [0]
        for x in self._s:
            self._ns.append(self._ns[-1] + x.n_stages)
            self._nc.append(self._nc[-1] + x.n_commands)
        a = self._s[0]
        self.topo, self.loops = a.topo, tuple(lp for x in self._s for lp in x.loops)
        self.reach = max(x.reach for x in self._s)
        self.commands = _Concat([x.commands for x in self._s])
        self.table = JoinedTable([x.table for x in self._s], self._ns, self._nc)

    def __repr__(self) -> str:
        return (f"Schedule({self.n_commands} commands, {self.n_stages} stages, {self.topo.name}; "
                f"in {len(self._s)} parts)")

    @property
    def n_commands(self) -> int:
        return self._nc[-1]

    @property
    def n_stages(self) -> int:
        return self._ns[-1]

    def _cmd_col(self, name: str, shift: Sequence[int] | None = None) -> np.ndarray:
        cols = [_ints(getattr(x, name)) for x in self._s]
        if shift is not None:
            cols = [c + d for c, d in zip(cols, shift)]
        return np.concatenate(cols)

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
        return [lab for x in self._s for lab in x.labels]

    @cached_property
    def waits(self) -> list[tuple[int, ...]]:
        out: list[tuple[int, ...]] = []
        for x, nc in zip(self._s, self._nc):
            out += [tuple(w + nc for w in ws) if ws and nc else tuple(ws) for ws in x.waits]
        return out

    @cached_property
    def reads(self) -> list[tuple]:
        return [r for x in self._s for r in x.reads]

    @cached_property
    def writes(self) -> list[tuple]:
        return [w for x in self._s for w in x.writes]

    def edge_reach(self) -> int:
        return max(x.edge_reach() for x in self._s)

    def periods(self) -> list[tuple[int, int, int]]:
        return [(d, lo + ns, hi + ns) for x, ns in zip(self._s, self._ns) for d, lo, hi in x.periods()]


class JoinedTimeline:
    """The timeline of a PE simulated in parts (as :class:`~kbwork.device.records.Timeline` reads), each field
    built on first use: part k's cycles moved by ``shifts[k]``; every part after the first began where the one
    before it ended."""

    def __init__(self, parts: Sequence[Any], sched: JoinedSchedule, shifts: Sequence[int],
                 gates: Sequence[int] | None = None):
        self._t, self._sched, self._dt = list(parts), sched, list(shifts)
        self._gates = list(gates) if gates is not None and any(g >= 0 for g in gates) else None
        self.engines = self._t[0].engines
        self._ends = [t.cycles + d for t, d in zip(self._t, self._dt)]
        self.cycles = max(self._ends)

    def __repr__(self) -> str:
        return f"Timeline({self._sched.n_stages} stages; in {len(self._t)} parts)"

    def _cat(self, name: str, times: bool = False, shift: Sequence[int] | None = None) -> np.ndarray:
        cols = [np.asarray(getattr(t, name)) for t in self._t]
        if times:
            cols = [c + d if d else c for c, d in zip(cols, self._dt)]
        if shift is not None:
            cols = [c + d if d else c for c, d in zip(cols, shift)]
        return np.concatenate(cols)

    start = cached_property(lambda self: self._cat("start", times=True))
    end = cached_property(lambda self: self._cat("end", times=True))
    unit = cached_property(lambda self: self._cat("unit"))
    done = cached_property(lambda self: self._cat("done", times=True))
    held = cached_property(lambda self: self._cat("held", shift=self._sched._nc))
    release = cached_property(lambda self: self._cat("release", times=True))
    hit = cached_property(lambda self: np.concatenate([_ints(t.hit) + nc for t, nc in zip(self._t, self._sched._nc)]))

    @cached_property
    def hit_ptr(self) -> np.ndarray:
        out, total = [np.zeros(1, np.int64)], 0
        for t in self._t:
            p = _ints(t.hit_ptr)
            out.append(p[1:] + total)
            total += int(p[-1]) if len(p) else 0
        return np.concatenate(out)

    def dispatch_cycles(self, sched: Any = None) -> np.ndarray:
        """Each command's DISPATCH cycles, the parts' one after another (``sched`` is not read)."""
        return np.concatenate([t.dispatch_cycles(s) for t, s in zip(self._t, self._sched._s)])

    @cached_property
    def front(self) -> FrontEnd:
        sched = self._sched
        d = _ints(sched.dispatch_seq)
        whole = front_end(sched, d, self.start, self.end, self.done, self.held, self.release,
                          sched.topo.hazard_policy == "strict_fifo", ())
        fronts = [t.front for t in self._t]

        def moved(col: str, default: bool = False) -> np.ndarray | None:
            cols = [getattr(f, col) for f in fronts]
            if all(c is None for c in cols):
                return None
            out = []
            for c, f, dt in zip(cols, fronts, self._dt):
                c = np.full(len(f.d_launch), -1, np.int64) if c is None else np.asarray(c, np.int64)
                out.append(np.where(c >= 0, c + dt, c) if dt else c)
            return np.concatenate(out)

        d_launch = moved("d_launch")
        for k in range(1, len(self._t)):  # each part waited for the previous one's end, as a launch does
            c = sched._nc[k]
            if c < len(d_launch):
                d_launch[c] = self._ends[k - 1]
        d_after = moved("d_after")
        if self._gates is not None:  # a part that waited for launches simulated elsewhere: their end + sync
            if d_after is None:
                d_after = np.full(len(d_launch), -1, np.int64)
            for k, g in enumerate(self._gates):
                if g >= 0 and sched._nc[k] < len(d_after):
                    d_after[sched._nc[k]] = g
        return whole._replace(d_wait=moved("d_wait"), d_launch=d_launch, d_after=d_after)

    @cached_property
    def ready(self) -> np.ndarray:
        r = self._cat("ready", times=True)
        f = self.front
        d = _ints(self._sched.dispatch_seq)
        r[d] = dispatch_ready(f)
        r[d + 1] = np.maximum(np.maximum(f.p_dependency, f.p_order), f.p_scheduler)
        return r


def joined_state(states: Sequence[SteadyState]) -> SteadyState:
    """How a PE simulated in parts ran: the first part's steady state that inserted periods (or the first's when
    none did), the periods all inserted, and every loop of every part, numbered across them."""
    loops = tuple(f"loop {n}: {line.split(': ', 1)[1] if line.startswith('loop ') else line}"
                  for n, line in enumerate(x for st in states for x in st.loops))
    steady = [st for st in states if st.path == "steady"]
    if steady:
        return SteadyState("steady", steady[0].period, steady[0].proven_at, None, sum(st.inserted for st in steady),
                           loops)
    reason = "; ".join(dict.fromkeys(st.reason for st in states if st.reason)) or None
    return SteadyState("full", reason=reason, loops=loops)


def join(parts: Sequence[tuple], shifts: Sequence[int] | None = None, gates: Sequence[int] | None = None) -> tuple:
    """``(timeline, schedule, steady state)`` of a PE from its parts' (each such a triple, in order), part k's
    cycles moved by ``shifts[k]`` (default: none; each part began where the previous one ended). ``gates[k]``
    (-1: none): the cycle part k's first DISPATCH waited for, its dependencies' latest end + ``sync_cycles``
    (DESIGN.md §16), when they ran in another loop: its ``d_after``, as the loop records it."""
    sched = JoinedSchedule([p[1] for p in parts])
    tl = JoinedTimeline([p[0] for p in parts], sched, shifts or [0] * len(parts), gates)
    return tl, sched, joined_state([p[2] for p in parts])
