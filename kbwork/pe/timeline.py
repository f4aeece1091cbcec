"""The deterministic event loop that runs a :class:`Program` (DESIGN.md §5, §6, §11).

Events are stage ends in a heap keyed by ``(time, seq)``. At each instant the
loop first retires every stage that ends then (in seq order: data effects,
successors, command completion, hazard checks), then lets each free unit
start the ready stage with the lowest seq (oldest first). Nothing depends on
dict or set iteration order.

The engines come from the topology's engine table (``stages.engine_table``):
each engine has a capacity, its number of units. PE_CPU and PE_SCHEDULER
issue in order and have one unit each; PE_DMA has ``dma_channels``. When
units of one engine are free at an instant, the oldest ready stage takes the
lowest-numbered free unit, the next oldest the next one, and so on.

Dynamic rules handled here rather than by static edges:

* PE_CPU dispatches in program order and stalls while ``cmd_queue_depth``
  commands are in flight (a command is in flight from the start of its
  DISPATCH until its last stage ends) or while a ``tl.wait`` is pending.
* PE_SCHEDULER plans in dispatch order. At the end of a PLAN the command is
  checked against every earlier command not yet complete. Under
  ``strict_fifo`` a conflicting command is held until every earlier command
  has completed, and no later command is planned meanwhile. Under
  ``rw_aware`` it waits only for the commands it conflicts with and later
  commands go ahead.
* A command's plan stages are released (its PLAN's successors notified) when
  its PLAN has ended and its hazard check has cleared.

What the loop records besides start and end (:class:`Timeline`), so that a
run can say where its time went:

* ``ready`` of every stage: the cycle from which only its engine kept it
  waiting. For a plan stage, the instant its last unmet constraint cleared
  (its dependencies ended and its command was released). For DISPATCH, the
  later of the previous DISPATCH's start, the time its queue slot was free
  (for command c >= depth, the depth-th latest completion among commands
  0..c-1) and its ``tl.wait`` completions. For PLAN, the later of its
  DISPATCH's end, the previous PLAN's start and the release of a held
  command the scheduler was blocked behind. A stage starts at ``ready``
  unless its engine (for DMA, every channel) is busy then.
* the unit each stage ran on (which DMA channel), so that the stage a unit
  ran just before another (an engine edge of the critical path) can be found;
* every hazard hold: the held command, the cycle its hold was released and,
  under ``rw_aware``, the commands it waited for.

From these, :class:`Bindings` tells for any stage what bound its start, and
the stage whose end it was:

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

from dataclasses import dataclass
from heapq import heappop, heappush
from typing import Callable, NamedTuple, Sequence

import numpy as np

from ..errors import SimulationError
from .scheduler import Program, conflicts
from .stages import EngineSpec, StageKind, engine_table

_DISPATCH, _PLAN = int(StageKind.DISPATCH), int(StageKind.PLAN)

#: What bound a stage's start: the cause of a critical-path link (DESIGN §11).
CAUSES = ("engine", "dependency", "hazard", "queue", "wait", "scheduler", "order")
ENGINE, DEPENDENCY, HAZARD, QUEUE, WAIT, SCHEDULER, ORDER = range(len(CAUSES))
#: When constraints tie at the cycle that sets ``ready``, the first of these is named (``Bindings``
#: tries each stage kind's constraints in this order).
TIE_ORDER = (HAZARD, SCHEDULER, WAIT, QUEUE, DEPENDENCY, ORDER)


def successors(prog: Program) -> list[list[int]]:
    """Successor lists of every stage (edges into DISPATCH/PLAN are gated dynamically, so left out)."""
    t = prog.table
    succ: list[list[int]] = [[] for _ in range(len(t))]
    kind = t.kind
    for s, preds in enumerate(t.preds):
        if kind[s] > _PLAN:
            for p in preds:
                succ[p].append(s)
    return succ


class FrontEnd(NamedTuple):
    """Per command, the cycle each constraint of its DISPATCH and PLAN clears (-1: no such constraint).

    DISPATCH: ``d_order`` (the previous DISPATCH's start), ``d_queue`` (its
    queue slot is free), ``d_wait`` (its ``tl.wait`` completions). PLAN:
    ``p_dependency`` (its DISPATCH's end), ``p_order`` (the previous PLAN's
    start), ``p_scheduler`` (strict FIFO: the release of the latest held
    command before it).
    """

    d_order: np.ndarray
    d_queue: np.ndarray
    d_wait: np.ndarray
    p_dependency: np.ndarray
    p_order: np.ndarray
    p_scheduler: np.ndarray


@dataclass(eq=False)
class Timeline:
    """What one run of the event loop produced: int arrays indexed by seq unless said otherwise.

    Attributes:
        engines: the engine table the loop walked (``unit_names(engines)`` names the units).
        start, end: cycles of every stage.
        ready: the cycle from which only its engine kept each stage waiting (module docstring).
        unit: the unit each stage ran on (an index into ``unit_names(engines)``); ``units`` holds
            it as the loop left it (the stage table's engine column when every engine has one unit).
        done: per command, the cycle it completed.
        held, release: the held commands, ascending, and the cycle each hold was released.
        hit_ptr, hit: rw_aware: ``held[i]`` waited for the commands
            ``hit[hit_ptr[i]:hit_ptr[i + 1]]``; under strict_fifo (every earlier command) empty.
        front: the DISPATCH and PLAN constraints per command (:class:`FrontEnd`).
    """

    engines: tuple[EngineSpec, ...]
    start: np.ndarray
    end: np.ndarray
    ready: np.ndarray
    units: Sequence[int]
    done: np.ndarray
    held: np.ndarray
    release: np.ndarray
    hit_ptr: np.ndarray
    hit: np.ndarray
    front: FrontEnd

    @property
    def unit(self) -> np.ndarray:
        # with one unit per engine the loop hands over the stage table's engine column as it is;
        # it becomes an array only when asked for
        if not isinstance(self.units, np.ndarray):
            self.units = np.asarray(self.units, np.int16)
        return self.units

    def __repr__(self) -> str:
        return f"Timeline({len(self.end)} stages, {len(self.held)} holds)"


def _ints(values: Sequence[int]) -> np.ndarray:
    return np.fromiter(values, dtype=np.int64, count=len(values))


class Snapshot(NamedTuple):
    """The event loop's whole dynamic state at one instant: after every stage ending then has retired,
    before the DISPATCH of command ``cmd`` (seq ``seq``) starts at cycle ``t``.

    Everything the loop reads to decide what happens next is here (its comment block lists the
    variables): running stages with their ends and units, each engine's ready queue, the unmet
    dependencies of every stage not yet started in commands ``first_incomplete`` up to the
    snapshot's window, the commands in flight and their stages left, which have completed, the
    dispatch and plan counters, and the hazard holds. Records the loop keeps for the analysis
    (``ready``, holds already released) are not state: they never decide anything.
    """

    t: int
    cmd: int
    seq: int
    events: tuple[tuple[int, int, int], ...]       # (end, seq, unit) of every running stage, sorted
    ready: tuple[tuple[int, ...], ...]             # per engine, the queued seqs, sorted
    remaining: tuple[tuple[int, int], ...]         # (seq, unmet dependencies) of stages not started
    cmd_left: tuple[tuple[int, int], ...]          # (cmd, stages left) of the commands in flight
    completed: tuple[int, ...]                     # commands >= first_incomplete already complete
    first_incomplete: int
    next_dispatch: int
    dispatched_end: int
    next_plan: int
    in_flight: int
    held_strict: int
    held_count: tuple[tuple[int, int], ...]
    waiters: tuple[tuple[int, tuple[int, ...]], ...]

    def shifted(self, dt: int, dseq: int, dcmd: int) -> "Snapshot":
        """This state as it would read ``dt`` cycles, ``dseq`` stages and ``dcmd`` commands later."""
        def c(x: int) -> int:
            return x + dcmd if x >= 0 else x
        return Snapshot(
            self.t + dt, self.cmd + dcmd, self.seq + dseq,
            tuple((e + dt, q + dseq, u) for e, q, u in self.events),
            tuple(tuple(q + dseq for q in rq) for rq in self.ready),
            tuple((q + dseq, r) for q, r in self.remaining),
            tuple((c(x), left) for x, left in self.cmd_left),
            tuple(c(x) for x in self.completed),
            c(self.first_incomplete), c(self.next_dispatch), c(self.dispatched_end), c(self.next_plan),
            self.in_flight, c(self.held_strict),
            tuple((c(x), k) for x, k in self.held_count),
            tuple((c(x), tuple(c(h) for h in hs)) for x, hs in self.waiters))


def _snapshot(t, c, s, events, ready_q, remaining, start, plan_first, plan_end, window_end, cmd_left, active,
              completed, first_incomplete, next_dispatch, dispatched_end, next_plan, in_flight, held_strict,
              held_count, waiters, unit) -> Snapshot:
    """Copy the loop's state into a :class:`Snapshot` (a function, so the loop's locals stay plain locals)."""
    rem = []
    lo = plan_first[first_incomplete] if first_incomplete < len(plan_first) else len(start)
    hi = plan_end[window_end - 1] if window_end > 0 else lo
    for q in range(lo, hi):
        if start[q] < 0:
            rem.append((q, remaining[q]))
    return Snapshot(
        t, c, s, tuple(sorted((e, q, unit[q]) for e, q in events)), tuple(tuple(sorted(rq)) for rq in ready_q),
        tuple(rem), tuple((x, cmd_left[x]) for x in active),
        tuple(x for x in range(first_incomplete, next_dispatch) if completed[x]),
        first_incomplete, next_dispatch, dispatched_end, next_plan, in_flight, held_strict,
        tuple(sorted(held_count.items())), tuple((x, tuple(hs)) for x, hs in sorted(waiters.items())))


def simulate(prog: Program, apply: Callable[[object], None] | None = None,
             edges: list[list[int]] | None = None, *, dur: Sequence[int] | None = None,
             snapshots: dict[int, "Snapshot | None"] | None = None, window: int = 0) -> Timeline:
    """Run the program's timeline.

    Args:
        prog: the static program from ``scheduler.schedule``.
        apply: data mode: called with each stage's effect when it ends, in
            (end, seq) order. ``None`` for timing mode.
        edges: if given (one empty list per stage), receives the *dynamic*
            dependencies the run resolved — queue-slot and ``tl.wait`` waits,
            hazard holds, the scheduler blocked behind a held command — as the
            seq of the stage whose end released each stage. With the static
            ``preds`` they form the resolved stage graph (used by the benchmark
            to replay the timeline in an independent simulator).
        dur: every stage's duration in cycles, instead of the stage table's
            (``analysis.what_if`` scales one engine's).
        snapshots: command id -> None; each entry is filled with the loop's
            whole dynamic state (:class:`Snapshot`) at the instant that
            command's DISPATCH starts, before it starts (the steady-state proof
            compares two of them). ``window``: how many commands past the next
            one to dispatch the snapshot's ``remaining`` counts cover (static
            edges reach that far ahead).

    Returns:
        The :class:`Timeline`: start, end and ready of every stage, the unit
        it ran on, the hazard holds.

    Raises:
        SimulationError: the program deadlocks (e.g. a ``tl.wait`` on a later command).
        ValueError: ``dur`` does not have one entry per stage.
    """
    table = prog.table
    n = len(table)
    ncmd = len(prog.commands)
    if dur is None:
        dur = table.dur
    elif len(dur) != n:
        raise ValueError(f"simulate: dur has {len(dur)} entries; the program has {n} stages.")
    engine, kind, cmd_of = table.engine, table.kind, table.cmd
    effects = table.effects
    succ = successors(prog)
    topo = prog.topo
    engines = engine_table(topo)
    if engines[0].capacity != 1 or engines[1].capacity != 1:
        raise SimulationError("PE_CPU and PE_SCHEDULER issue in order: each must have exactly one unit.")
    # unit index of an engine's first unit, and every engine's units; unit u of PE_CPU is 0, of PE_SCHEDULER 1
    first: list[int] = []
    units_of: list[tuple[int, ...]] = []
    n_units = 0
    for spec in engines:
        first.append(n_units)
        units_of.append(tuple(range(n_units, n_units + spec.capacity)))
        n_units += spec.capacity

    depth = topo.cmd_queue_depth
    strict = topo.hazard_policy == "strict_fifo"
    dispatch_seq, plan_seq = prog.dispatch_seq, prog.plan_seq
    reads, writes, waits = prog.reads, prog.writes, prog.waits

    # --- the loop's whole dynamic state at an instant (with t); nothing else carries over -------------
    # events          heap of (end, seq) of the stages running
    # remaining[s]    unmet static dependencies of stage s (its PLAN counts until the command is released)
    # ready_q[e]      per engine, heap of the seqs of ready stages not yet started
    # busy[u]         per unit: whether a stage runs on it
    # cmd_left[c]     plan stages of command c not yet ended
    # completed[c], first_incomplete   which commands have completed; the lowest that has not
    # active          dispatched, not completed commands, ascending
    # in_flight       len(active): the queue occupancy the CPU checks
    # next_dispatch, dispatched_end, next_plan   commands whose DISPATCH started / ended, PLANs started
    # held_strict     strict_fifo: the one held command, or -1
    # held_count      rw_aware: held command -> conflicts still in flight
    # waiters         rw_aware: command -> the held commands waiting on it
    # start[s], end[s]                 -1 until s starts (a started stage's end is its pending event)
    # final_stage[c]  the stage whose end completed command c (read for tl.wait times and ``edges``)
    # last_completion, last_release    for ``edges`` only
    # Recorded for the analysis, never read to decide anything: rdy, unit (read to free a unit, written
    # only for engines with several units), held, release_at, hits, waited.
    start = [-1] * n
    end = [-1] * n
    rdy = [-1] * n
    # the unit each stage runs on: with one unit per engine, the engine itself (the table's column,
    # never written); otherwise each engine's first unit, rewritten by the multi-unit start below
    multi = n_units > len(engines)
    unit = [first[e] for e in engine] if multi else engine
    remaining = [len(p) for p in table.preds]
    events: list[tuple[int, int]] = []
    ready_q: list[list[int]] = [[] for _ in engines]
    busy = [False] * n_units
    # the engines the loop walks for plan stages, in engine-table order: (ready heap, unit) of those
    # with one unit, (ready heap, units) of those with several. Walking one group before the other
    # changes nothing: a start never makes another stage ready, only an end does.
    walk_one: list[tuple[list[int], int]] = []
    walk_many: list[tuple[list[int], tuple[int, ...]]] = []
    for e in range(2, len(engines)):  # loops, not comprehensions, so that ready_q stays a plain local
        if len(units_of[e]) == 1:
            walk_one.append((ready_q[e], units_of[e][0]))
        else:
            walk_many.append((ready_q[e], units_of[e]))

    cmd_left = [e - f for f, e in zip(prog.plan_first, prog.plan_end)]
    plan_first_of, plan_end_of = prog.plan_first, prog.plan_end
    completed = [False] * ncmd
    first_incomplete = 0
    active: list[int] = []
    dispatched_end = 0
    next_dispatch = 0
    next_plan = 0
    in_flight = 0
    held_strict = -1
    held_count: dict[int, int] = {}
    waiters: dict[int, list[int]] = {}
    held: list[int] = []
    release_at: dict[int, int] = {}
    hits: list[list[int]] = []
    waited: list[tuple[int, int]] = []

    last_completion = (-1, -1)      # (time, stage) of the latest command completion
    last_release = (-1, -1)         # (time, stage) of the latest strict-FIFO release
    final_stage = [-1] * ncmd

    # the lists release() touches come in as defaults, not from the enclosing scope: a name a nested
    # function reads becomes a closure cell, slower to reach on every use in the loop below
    def release(c: int, by: int, t: int, succ=succ, plan_seq=plan_seq, edges=edges, remaining=remaining,
                ready_q=ready_q, engine=engine, rdy=rdy, release_at=release_at) -> None:
        for u in succ[plan_seq[c]]:
            if edges is not None and by >= 0:
                edges[u].append(by)
            left = remaining[u] - 1
            remaining[u] = left
            if not left:
                heappush(ready_q[engine[u]], u)
                rdy[u] = t
        if by >= 0:
            release_at[c] = t

    t = 0
    while True:
        # -- retire everything that ends at t ------------------------------------------
        while events and events[0][0] == t:
            s = heappop(events)[1]
            busy[unit[s]] = False
            k = kind[s]
            if k > _PLAN:
                if apply is not None and effects[s] is not None:
                    apply(effects[s])
                for u in succ[s]:
                    left = remaining[u] - 1
                    remaining[u] = left
                    if not left:
                        heappush(ready_q[engine[u]], u)
                        rdy[u] = t
                c = cmd_of[s]
                cmd_left[c] -= 1
                if cmd_left[c] == 0:
                    completed[c] = True
                    in_flight -= 1
                    active.remove(c)
                    final_stage[c] = s
                    last_completion = (t, s)
                    while first_incomplete < ncmd and completed[first_incomplete]:
                        first_incomplete += 1
                    if strict:
                        if held_strict >= 0 and first_incomplete >= held_strict:
                            h = held_strict
                            held_strict = -1
                            last_release = (t, s)
                            release(h, s, t)
                    else:
                        for h in waiters.pop(c, ()):
                            held_count[h] -= 1
                            if held_count[h] == 0:
                                del held_count[h]
                                release(h, s, t)
            elif k == _DISPATCH:
                dispatched_end += 1
            else:  # PLAN: hazard check against every earlier incomplete command
                c = cmd_of[s]
                rd, wr = reads[c], writes[c]
                hit = [o for o in active if o < c and conflicts(rd, wr, reads[o], writes[o])]
                if not hit:
                    release(c, -1, t)
                else:
                    held.append(c)
                    if strict:
                        held_strict = c
                    else:
                        hits.append(hit)
                        held_count[c] = len(hit)
                        for o in hit:
                            waiters.setdefault(o, []).append(c)
        # -- start what can start at t --------------------------------------------------
        if not busy[0] and next_dispatch < ncmd and in_flight < depth:
            c = next_dispatch
            wc = waits[c]
            if not wc or all(completed[w] for w in wc):
                s = dispatch_seq[c]
                if snapshots is not None and c in snapshots:
                    snapshots[c] = _snapshot(t, c, s, events, ready_q, remaining, start, plan_first_of, plan_end_of,
                                             min(ncmd, next_dispatch + 1 + window), cmd_left, active, completed,
                                             first_incomplete, next_dispatch, dispatched_end, next_plan, in_flight,
                                             held_strict, held_count, waiters, unit)
                if wc:
                    when = 0
                    for w in wc:  # a loop, not a comprehension: that would make ``end`` a closure cell
                        when = max(when, end[final_stage[w]])
                    waited.append((c, when))
                if edges is not None:
                    edges[s].extend(final_stage[w] for w in waits[c])
                    if last_completion[0] == t:
                        edges[s].append(last_completion[1])
                start[s] = t
                end[s] = te = t + dur[s]
                heappush(events, (te, s))
                busy[0] = True
                in_flight += 1
                active.append(c)
                next_dispatch += 1
        if not busy[1] and next_plan < dispatched_end and held_strict < 0:
            s = plan_seq[next_plan]
            if edges is not None and last_release[0] == t:
                edges[s].append(last_release[1])
            start[s] = t
            end[s] = te = t + dur[s]
            heappush(events, (te, s))
            busy[1] = True
            next_plan += 1
        # plan stages: each engine's free units, lowest-numbered first, take its oldest ready stages
        for rq, u in walk_one:
            if rq and not busy[u]:
                s = heappop(rq)
                start[s] = t
                end[s] = te = t + dur[s]
                heappush(events, (te, s))
                busy[u] = True
        if multi:
            for rq, units in walk_many:
                if not rq:
                    continue
                for u in units:
                    if not busy[u]:
                        s = heappop(rq)
                        start[s] = t
                        end[s] = te = t + dur[s]
                        heappush(events, (te, s))
                        busy[u] = True
                        unit[s] = u
                        if not rq:
                            break
        if not events:
            break
        t = events[0][0]

    if next_dispatch < ncmd or first_incomplete < ncmd:
        stuck = next_dispatch if next_dispatch < ncmd else first_incomplete
        why = ""
        if next_dispatch < ncmd and waits[stuck]:
            why = f" (it waits on command(s) {list(waits[stuck])}; a tl.wait must name an earlier command)"
        raise SimulationError(f"the timeline stopped at cycle {t} with command #{stuck} "
                              f"{prog.labels[stuck]!r} unfinished{why}: the program deadlocks.")

    start_a, end_a = _ints(start), _ints(end)
    done = end_a[_ints(final_stage)] if ncmd else np.zeros(0, np.int64)
    held_a = _ints(held)
    release_a = _ints([release_at[c] for c in held])
    hit_ptr = np.zeros(len(hits) + 1, np.int64)
    np.cumsum([len(h) for h in hits], out=hit_ptr[1:])
    hit_a = _ints([o for h in hits for o in h])
    ready_a = _ints(rdy)
    d = _ints(dispatch_seq)
    front = _front_end(prog, d, start_a, end_a, done, held_a, release_a, strict, waited)
    ready_a[d] = np.maximum(np.maximum(front.d_order, front.d_queue), front.d_wait)
    ready_a[d + 1] = np.maximum(np.maximum(front.p_dependency, front.p_order), front.p_scheduler)
    return Timeline(engines, start_a, end_a, ready_a, unit, done, held_a, release_a, hit_ptr, hit_a, front)


def _front_end(prog: Program, d: np.ndarray, start: np.ndarray, end: np.ndarray, done: np.ndarray,
               held: np.ndarray, release: np.ndarray, strict: bool, waited: list[tuple[int, int]]) -> FrontEnd:
    """The cycles at which each DISPATCH and PLAN constraint clears, per command (see :class:`FrontEnd`).

    ``d`` holds the seq of each command's DISPATCH; its PLAN is the next stage.
    """
    ncmd = len(done)
    p = d + 1
    none = np.full(ncmd, -1, np.int64)
    d_order = none.copy()
    d_order[0:1] = 0                # the first command waits for nothing
    d_order[1:] = start[d[:-1]]
    # Commands >= c cannot complete before DISPATCH c starts, so the (c - depth + 1)-th completion of
    # all commands is that among 0..c-1: the depth-th latest of theirs.
    depth = prog.topo.cmd_queue_depth
    d_queue = none.copy()
    if ncmd > depth:
        d_queue[depth:] = np.sort(done)[:ncmd - depth]
    d_wait = none.copy()
    for c, when in waited:
        d_wait[c] = when
    p_order = none.copy()
    p_order[1:] = start[p[:-1]]
    p_scheduler = none.copy()
    if strict and len(held):
        # strict FIFO plans nothing while a command is held, so PLAN c waits for the release of the
        # latest held command before it (earlier holds were released earlier still)
        latest = np.searchsorted(held, np.arange(ncmd), side="left") - 1
        blocked = latest >= 0
        p_scheduler[blocked] = release[latest[blocked]]
    return FrontEnd(d_order, d_queue, d_wait, end[d], p_order, p_scheduler)


class Bindings:
    """What bound the start of each stage of a run, and the stage whose end it was (module docstring).

    Resolved on demand from the :class:`Timeline` and the static program, by
    the fixed tie order of the module docstring.
    """

    def __init__(self, prog: Program, tl: Timeline):
        self.prog, self.tl = prog, tl
        self._kind, self._cmd, self._preds = prog.table.kind, prog.table.cmd, prog.table.preds
        self._strict = prog.topo.hazard_policy == "strict_fifo"
        self._held_index = {int(c): i for i, c in enumerate(tl.held)}
        self._by_unit: tuple[np.ndarray, np.ndarray] | None = None
        self._path: tuple[list[int], list[int]] | None = None
        #: ``(dseq, lo, hi)`` when stages lo..hi-1 repeat every dseq stages (a steady-state run): the
        #: critical path then repeats too, and the walk copies whole periods of it instead of stepping
        self.period: tuple[int, int, int] | None = None
        # commands by (completion cycle, id): the lowest-numbered command completing at a cycle
        self._by_done = np.lexsort((np.arange(len(tl.done)), tl.done))
        self._done_sorted = tl.done[self._by_done]

    def __call__(self, s: int) -> tuple[int, int]:
        """``(cause, stage)`` for stage ``s``: a code into :data:`CAUSES` and the stage whose end bound
        its start (-1 for the first command's DISPATCH, which nothing precedes).

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

    def critical_path(self) -> tuple[list[int], list[int]]:
        """The chain of stages that sets the end-to-end time, from cycle 0 to the last cycle.

        It ends at the lowest-seq stage among those ending last and walks back
        through what bound each start; each stage starts where the previous
        one ends.

        Returns:
            ``(seqs, causes)`` in time order: the stages and the cause of each
            one's incoming link (the first, starting at cycle 0, ``dependency``).
        """
        if self._path is None:
            self._path = self._walk()
        seqs, causes = self._path
        return list(seqs), list(causes)

    def _walk(self) -> tuple[list[int], list[int]]:
        tl = self.tl
        if not len(tl.end):
            return [], []
        s = int(np.flatnonzero(tl.end == tl.end.max())[0])
        seqs: list[int] = []
        causes: list[int] = []
        start, end = tl.start, tl.end
        period = self.period
        seen: dict[int, int] = {}  # stage -> its index in seqs, inside the repeating stretch
        for _ in range(len(end)):
            seqs.append(s)
            if start[s] == 0:
                causes.append(DEPENDENCY)
                break
            if period is not None and period[1] <= s < period[2]:
                dseq, lo, _ = period
                j = seen.get(s + dseq)
                if j is None:
                    seen[s] = len(seqs) - 1
                else:  # the path came down one whole period: copy as many more as fit
                    s = self._repeat(seqs, causes, j, dseq, lo)
                    period = None
            cause, p = self(s)
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
