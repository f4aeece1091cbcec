"""What bound each stage's start, and the critical path (DESIGN.md §11): the walk behind ``Run.critical_path()``.

From a run's records (:mod:`.records`: start, end, ready and unit of every
stage, completions, holds), :class:`Bindings` tells for any stage what bound
its start, and the stage whose end it was:

* ``engine``: it started later than ``ready``; the stage that occupied its
  unit up to its start (whose end freed the unit; zero-length stages run at
  that very cycle are passed over). This covers DISPATCH after DISPATCH and
  PLAN after PLAN.
* otherwise the constraint that set ``ready``: ``dependency`` (a static
  edge: DISPATCH -> its PLAN, PLAN -> its plan stages, data and tile edges,
  staging-ring edges), ``hazard`` (the completion that released its
  command's hold; under strict FIFO possibly a command it did not conflict
  with), ``queue`` (the completion that freed a queue slot), ``wait`` (a
  ``tl.wait`` completion), ``scheduler`` (a PLAN blocked behind a held
  command: the completion that released the hold) or ``order`` (the
  previous DISPATCH or PLAN, binding only when it took zero cycles).

Ties. When several constraints clear at the very cycle that sets ``ready``,
the one named is the first in the order hazard, scheduler, wait, queue,
dependency, order: the named cause is the most specific one, a hold or an
explicit wait before plain data flow, and program order last (it only binds
after a zero-length stage). Among stages of that cause the lowest seq is
named: for a completion, the lowest-numbered command completing at that
cycle, and of its stages ending then the lowest seq. The critical path ends
at the lowest-seq stage among those ending at the run's last cycle.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..errors import SimulationError

_DISPATCH, _PLAN = 0, 1

#: What bound a stage's start: the cause of a critical-path link (DESIGN §11).
#: (``after`` sits before ``hazard``, not at the end: columns made from this order, such as a sweep's
#: ``path_<cause>``, keep the order and the last columns they had)
CAUSES = ("engine", "dependency", "after", "hazard", "queue", "wait", "scheduler", "order", "launch")
ENGINE, DEPENDENCY, AFTER, HAZARD, QUEUE, WAIT, SCHEDULER, ORDER, LAUNCH = range(len(CAUSES))
#: When constraints tie at the cycle that sets ``ready``, the first of these is named (``Bindings``
#: tries each stage kind's constraints in this order).
TIE_ORDER = (AFTER, LAUNCH, HAZARD, SCHEDULER, WAIT, QUEUE, DEPENDENCY, ORDER)


class Bindings:
    """What bound the start of each stage of a run, and the stage whose end it was (module docstring).

    Resolved on demand from the :class:`Timeline` and the static program, by
    the fixed tie order of the module docstring.
    """

    def __init__(self, prog, tl, periods: Sequence[tuple[int, int, int]] = ()):
        self.prog, self.tl = prog, tl
        self._kind, self._cmd, self._preds = prog.table.kind, prog.table.cmd, prog.table.preds
        self._strict = prog.topo.hazard_policy == "strict_fifo"
        self._held_index = {int(c): i for i, c in enumerate(tl.held)}
        self._by_unit: tuple[np.ndarray, np.ndarray] | None = None
        self._path: tuple[list[int], list[int]] | None = None
        #: ``(dseq, lo, hi)`` of every stretch where stages lo..hi-1 repeat every dseq stages (a steady-state
        #: run): the critical path then repeats too, and the walk copies whole periods of it instead of stepping
        self.periods: list[tuple[int, int, int]] = list(periods)
        # commands by (completion cycle, id): the lowest-numbered command completing at a cycle
        self._by_done = np.lexsort((np.arange(len(tl.done)), tl.done))
        self._done_sorted = tl.done[self._by_done]

    def __call__(self, s: int) -> tuple[int, int]:
        """``(cause, stage)`` for stage ``s``: a code into :data:`CAUSES` and the stage whose end bound
        its start (-1 for the first command's DISPATCH, which nothing precedes, and for a launch's first
        DISPATCH bound by a launch it is ``after``, whose stage is on a PE of its own: :func:`after_link`).

        Raises:
            SimulationError: the timeline's records are inconsistent (a bug, never bad input).
        """
        tl, prog = self.tl, self.prog
        st, r = int(tl.start[s]), int(tl.ready[s])
        if st > r:
            return ENGINE, self._occupant(int(tl.unit[s]), st)
        k, c = self._kind[s], self._cmd[s]
        f = tl.front
        if k == _DISPATCH:
            if f.d_after is not None and f.d_after[c] == r:  # a launch it is after (DESIGN.md §16)
                return AFTER, -1
            if f.d_launch[c] == r:  # the first command of a later launch: after the last stage of the one before
                return LAUNCH, self._last_of_launch_before(c, r)
            if f.d_wait[c] == r:
                return WAIT, self._completion(min(w for w in prog.waits[c] if tl.done[w] == r), r)
            if f.d_queue[c] == r:
                return QUEUE, self._completion(self._first_done(r), r)
            if c > 0 and f.d_order[c] == r:
                return ORDER, prog.dispatch_seq[c - 1]
            if c == 0:
                return DEPENDENCY, -1
        elif k == _PLAN:
            if f.p_scheduler[c] == r:
                i = int(np.searchsorted(tl.held, c)) - 1
                return SCHEDULER, self._released_by(i)
            if f.p_dependency[c] == r:
                return DEPENDENCY, prog.dispatch_seq[c]
            if c > 0 and f.p_order[c] == r:
                return ORDER, prog.plan_seq[c - 1]
        else:
            p = prog.plan_seq[c]
            i = self._held_index.get(c, -1)
            preds = self._preds[s]
            if i >= 0 and tl.release[i] == r and p in preds:
                return HAZARD, self._released_by(i)
            best = -1
            for q in preds:
                clears = int(tl.release[i]) if q == p and i >= 0 else int(tl.end[q])
                if clears == r and (best < 0 or q < best):
                    best = q
            if best >= 0:
                return DEPENDENCY, best
        raise SimulationError(f"no constraint of {prog.table.describe(s)} clears at its ready cycle {r}.")

    def _last_of_launch_before(self, c: int, r: int) -> int:
        """The lowest-seq stage ending at cycle ``r`` (the launch's start) among the commands before ``c``."""
        tl = self.tl
        lo = int(np.flatnonzero(np.asarray(tl.front.d_launch[:c]) >= 0)[-1]) if (np.asarray(tl.front.d_launch[:c])
                                                                                  >= 0).any() else 0
        best = -1
        for x in range(lo, c):
            if tl.done[x] == r:
                s = self._completion(x, r)
                if best < 0 or s < best:
                    best = s
        if best < 0:
            raise SimulationError(f"no stage of the launch before command {c} ends at its start {r}.")
        return best

    def _first_done(self, r: int) -> int:
        """The lowest-numbered command completing at cycle ``r``."""
        i = int(np.searchsorted(self._done_sorted, r))
        if i == len(self._done_sorted) or self._done_sorted[i] != r:
            raise SimulationError(f"no command completes at cycle {r}.")
        return int(self._by_done[i])

    def _released_by(self, i: int) -> int:
        """The completion that released hold ``i``: of the commands it waited for completing then, the
        lowest-numbered (strict FIFO: every earlier command; the lowest completing then is one of them)."""
        tl = self.tl
        r = int(tl.release[i])
        if self._strict:
            return self._completion(self._first_done(r), r)
        waited = tl.hit[tl.hit_ptr[i]:tl.hit_ptr[i + 1]]
        return self._completion(int(waited[tl.done[waited] == r].min()), r)

    def _occupant(self, u: int, t: int) -> int:
        """The stage that occupied unit ``u`` up to cycle ``t``: it ends at ``t`` and started before
        (one unit runs one stage at a time, so there is exactly one; zero-length stages run at ``t``
        itself are passed over)."""
        tl = self.tl
        if self._by_unit is None:
            span = int(tl.end.max()) + 1 if len(tl.end) else 1
            key = tl.unit.astype(np.int64) * span + tl.end
            order = np.argsort(key, kind="stable")
            self._by_unit = (key[order], order)
        keys, order = self._by_unit
        span = int(tl.end.max()) + 1
        lo, hi = np.searchsorted(keys, [u * span + t, u * span + t + 1])
        for q in order[lo:hi].tolist():
            if tl.start[q] < t:
                return q
        raise SimulationError(f"no stage occupied unit {u} up to cycle {t}.")

    def _completion(self, c: int, r: int) -> int:
        """The lowest-seq stage of command ``c`` that ends at ``r``, its completion cycle."""
        lo, hi = self.prog.plan_first[c], self.prog.plan_end[c]
        return lo + int(np.flatnonzero(self.tl.end[lo:hi] == r)[0])

    def critical_path(self, last: int | None = None) -> tuple[list[int], list[int]]:
        """The chain of stages that sets the end-to-end time, from cycle 0 to the last cycle.

        It ends at the lowest-seq stage among those ending last (or at stage ``last``) and walks back
        through what bound each start; each stage starts where the previous
        one ends. A launch's first DISPATCH bound by a launch it is ``after`` ends the walk on this PE (its
        cause ``after``: the device's path goes on on that launch's PE, :func:`after_link`).

        Returns:
            ``(seqs, causes)`` in time order: the stages and the cause of each
            one's incoming link (the first, starting at cycle 0, ``dependency``).
        """
        if last is not None:
            return self._walk(last)
        if self._path is None:
            self._path = self._walk()
        seqs, causes = self._path
        return list(seqs), list(causes)

    def _walk(self, last: int | None = None) -> tuple[list[int], list[int]]:
        tl = self.tl
        if not len(tl.end):
            return [], []
        s = int(np.flatnonzero(tl.end == tl.end.max())[0]) if last is None else last
        seqs: list[int] = []
        causes: list[int] = []
        start, end = tl.start, tl.end
        periods = sorted(self.periods, key=lambda x: -x[2])  # the walk goes down: the highest stretch first
        period = periods.pop(0) if periods else None
        seen: dict[int, int] = {}  # stage -> its index in seqs, inside the repeating stretch
        for _ in range(len(end)):
            seqs.append(s)
            if start[s] == 0:
                causes.append(DEPENDENCY)
                break
            while period is not None and s < period[1]:  # below this stretch: on to the next one down
                period, seen = (periods.pop(0) if periods else None), {}
            if period is not None and period[1] <= s < period[2]:
                dseq, lo, _ = period
                j = seen.get(s + dseq)
                if j is None:
                    seen[s] = len(seqs) - 1
                else:  # the path came down one whole period: copy as many more as fit
                    s = self._repeat(seqs, causes, j, dseq, lo)
                    period, seen = (periods.pop(0) if periods else None), {}
            cause, p = self(s)
            if cause == AFTER:
                causes.append(AFTER)
                break
            if p < 0 or end[p] != start[s]:
                raise SimulationError(f"the critical path breaks at {self.prog.table.describe(s)}: "
                                      f"{CAUSES[cause]} link to stage {p}.")
            causes.append(cause)
            s = p
        return seqs[::-1], causes[::-1]

    def _repeat(self, seqs: list[int], causes: list[int], j: int, dseq: int, lo: int) -> int:
        """Extend a backward path whose last stage is ``seqs[j]`` one period down by whole periods.

        ``seqs[j+1:]`` (its last stage ``seqs[j] - dseq``) is one period of the
        path; what binds a stage binds its copy a period earlier, so the path
        goes on as copies of it, each ``dseq`` lower, while they stay at or
        above ``lo``. The first and last copies are checked stage by stage.
        Returns the path's last stage (its incoming link not yet appended).
        """
        block = np.asarray(seqs[j + 1:], np.int64)
        block_causes = causes[j + 1:] + [causes[j]]  # the period's links; the last one is seqs[j]'s
        reps = int((block.min() - lo) // dseq)
        if reps <= 0:
            return seqs[-1]
        copies = [block - r * dseq for r in range(1, reps + 1)]
        links = block_causes[-1:] + block_causes[:-1]  # the cause of each stage a copy's stages follow
        for r in sorted({0, reps - 1}):  # the copies keep following the bindings (the ends of the stretch)
            stages = np.concatenate([[block[-1] if r == 0 else copies[r - 1][-1]], copies[r]])
            for x, nxt, cause in zip(stages[:-1].tolist(), stages[1:].tolist(), links):
                got = self(x)
                if got != (cause, nxt):
                    raise SimulationError(f"the critical path does not repeat with the schedule at "
                                          f"{self.prog.table.describe(x)}.")
        causes.append(causes[j])  # the link into seqs[-1], as into seqs[j]
        for copy in copies:
            seqs.extend(copy.tolist())
            causes.extend(block_causes)
        causes.pop()  # the last copy's last stage: its link is computed by the caller
        return seqs[-1]


def launch_of(tl, c: int) -> int:
    """The launch (its index on its PE) that command ``c`` belongs to: the launches after the first start where
    the front end's ``d_launch`` is set."""
    return int((np.asarray(tl.front.d_launch[:c + 1]) >= 0).sum())


def launch_end(b: Bindings, j: int) -> tuple[int, int]:
    """``(end, stage)`` of launch ``j`` of ``b``'s PE: its last stage's end and the lowest-seq stage ending then."""
    tl = b.tl
    firsts = [0] + np.flatnonzero(np.asarray(tl.front.d_launch) >= 0).tolist() + [len(tl.done)]
    lo, hi = firsts[j], firsts[j + 1]
    done = np.asarray(tl.done[lo:hi])
    e = int(done.max())
    return e, min(b._completion(lo + int(x), e) for x in np.flatnonzero(done == e))


def after_link(bindings: dict, deps: dict, sync: int, pe: int, s: int) -> tuple[int, int]:
    """The stage that bound launch's first DISPATCH ``s`` on PE ``pe`` through ``after`` (DESIGN.md §16): of the
    launches it waits for (``deps``: PE -> per launch, ``(pe, index)`` pairs), the one whose end + ``sync`` is the
    DISPATCH's ready (the lowest PE, then index, on a tie), and its lowest-seq stage ending last: ``(PE, stage)``.

    Raises:
        SimulationError: no dependency ends then (a bug, never bad input).
    """
    b = bindings[pe]
    c = int(b._cmd[s])
    r = int(b.tl.ready[s])
    for q, j in deps[pe][launch_of(b.tl, c)]:
        e, stage = launch_end(bindings[q], j)
        if e + sync == r:
            return q, stage
    raise SimulationError(f"no launch PE {pe}'s command {c} is after ends {sync} cycles before its ready {r}.")


def device_path(bindings: dict, deps: dict | None, sync: int, pe: int) -> list[tuple[int, list[int], list[int]]]:
    """The device's critical path (DESIGN.md §14, §16): PE ``pe``'s, and where it starts at a launch bound by one
    it is ``after``, that launch's PE's path into it, and so on. ``bindings``: PE -> :class:`Bindings`.

    Returns:
        In time order, ``(PE, seqs, causes)`` stretches (each PE's own numbering), the first cause of each
        stretch after the first ``after``.
    """
    out = []
    seqs, causes = bindings[pe].critical_path()
    while True:
        out.append((pe, seqs, causes))
        if not seqs or causes[0] != AFTER or deps is None:
            break
        pe, last = after_link(bindings, deps, sync, pe, seqs[0])
        seqs, causes = bindings[pe].critical_path(last)
    return out[::-1]
