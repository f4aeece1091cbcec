"""The deterministic event loop (DESIGN.md §5, §6, §11): a PE's units, stage by stage.

Events are stage ends in a heap keyed by ``(time, seq)``. At each instant
the loop first retires every stage that ends then (in seq order: data
effects, successors, command completion, hazard checks), then lets each free
unit start the ready stage with the lowest seq (oldest first). Nothing
depends on dict or set iteration order.

The units come from the topology's engine table (``pe.stages.engine_table``,
SimPy's ``Resource(env, capacity)``): each engine is a resource with a
capacity, its number of units, and every stage names the engine it runs on.
PE_CPU and PE_SCHEDULER are in-order resources of one unit: the CPU
dispatches commands in program order, the scheduler plans them in dispatch
order. When units of one engine are free at an instant, the oldest ready
stage takes the lowest-numbered free unit, the next oldest the next one.

Commands are lowered to stages as the CPU reaches them (the program's
:class:`~kbwork.pe.scheduler.Cursor`): a long ``tl.range`` loop is never
lowered ahead of what is simulated, and the steady state (:mod:`.steady`)
can move the cursor past whole periods. A stage lowered after some of its
dependencies already ended waits only for the others.

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

What the loop records besides start and end (:class:`~kbwork.device.records.Timeline`)
— ``ready``, the unit, completions, hazard holds and their releases — is
described in :mod:`kbwork.device.walk`, which turns it into the critical path.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from heapq import heappop, heappush
from typing import Any, Callable

from ..errors import SimulationError
from ..pe.scheduler import CommandTable, Program, Schedule, conflicts
from ..pe.stages import EngineSpec, StageKind, StageTable, engine_table

_DISPATCH, _PLAN = int(StageKind.DISPATCH), int(StageKind.PLAN)


class Lowered:
    """A cursor over a schedule lowered beforehand (tests, ``analysis.what_if`` with explicit durations):
    :meth:`lower` hands the loop one command at a time; its stages are already in the table."""

    def __init__(self, sched: Schedule):
        self.sched = sched
        self.table = sched.table
        self.commands = sched.ctab
        self.next = 0
        self.reach = sched.reach
        self.ext_edges: list[tuple[int, int]] = []

    @property
    def done(self) -> bool:
        return self.next >= len(self.sched.ctab)

    def at_boundary(self) -> None:
        return None

    def lower(self, cid: int, iterations: int = 1) -> int:
        s, c = self.sched, self.next
        if cid != c:
            raise SimulationError("a lowered schedule is simulated in full: its commands keep their ids.")
        self.next += 1
        d, e = s.ctab.dispatch_seq[c], s.ctab.plan_end[c]
        xpreds = s.table.xpreds
        self.ext_edges = [(u, q) for u in range(d + 2, e) for q in xpreds[u]]
        return 1


@dataclass(slots=True, eq=False)
class PeState:
    """One PE's whole dynamic state: the one declaration the loop, the snapshot and the shift all read.

    Stage lists are indexed by seq, command lists by the command's id in the
    simulation (``cmds[c].cmd`` is its id in program order; the two differ
    only after the steady state moved past inserted periods).
    """

    table: StageTable
    ctab: CommandTable                         # the lowered commands (pe.scheduler.CommandTable)
    cursor: Any                                # a pe.scheduler.Cursor, or Lowered
    engines: tuple[EngineSpec, ...]
    depth: int
    strict: bool
    # --- per command ---------------------------------------------------------------------------------
    n_lowered: int = 0                                      # commands whose stages joined the lists
    cmd_left: list[int] = field(default_factory=list)       # plan stages not yet ended
    completed: list[bool] = field(default_factory=list)
    final_stage: list[int] = field(default_factory=list)    # the stage whose end completed it
    # --- per stage -----------------------------------------------------------------------------------
    start: list[int] = field(default_factory=list)          # -1 until it starts
    end: list[int] = field(default_factory=list)
    rdy: list[int] = field(default_factory=list)            # when its last unmet dependency cleared
    unit: list[int] = field(default_factory=list)           # the unit it ran on (written for multi-unit engines)
    remaining: list[int] = field(default_factory=list)      # unmet dependencies (its PLAN until released)
    xsucc: list[list[int] | None] = field(default_factory=list)  # later commands' stages waiting for it
    # --- time, the pending events, the front end and the engines --------------------------------------
    t: int = 0                   # the instant the loop has processed
    events: list[tuple[int, int]] = field(default_factory=list)    # heap of (end, seq) of running stages
    busy: list[bool] = field(default_factory=list)          # per unit
    ready_q: list[list[int]] = field(default_factory=list)  # per engine, a heap of ready seqs
    next_dispatch: int = 0       # the next command to dispatch
    dispatched_end: int = 0      # DISPATCHes ended
    next_plan: int = 0           # the next command to plan
    in_flight: int = 0           # dispatched, not completed: the queue occupancy
    active: list[int] = field(default_factory=list)         # those commands, ascending
    first_incomplete: int = 0
    held_strict: int = -1        # strict_fifo: the held command, or -1
    held_count: dict[int, int] = field(default_factory=dict)       # rw_aware: held -> conflicts in flight
    waiters: dict[int, list[int]] = field(default_factory=dict)    # rw_aware: command -> held waiting on it
    # --- records for the analysis (never read to decide anything) --------------------------------------
    held: list[int] = field(default_factory=list)
    release_at: dict[int, int] = field(default_factory=dict)
    hits: list[list[int]] = field(default_factory=list)
    waited: list[tuple[int, int]] = field(default_factory=list)
    #: commands whose footprints a steady-state jump moved on: their own (reads, writes)
    moved: dict[int, tuple] = field(default_factory=dict)
    last_completion: tuple[int, int] = (-1, -1)
    last_release: tuple[int, int] = (-1, -1)

    def first_unit_of(self, n0: int, n1: int) -> list[int]:
        """The first unit of the engine of each stage ``n0 .. n1 - 1`` (where a stage runs unless its engine has
        several units and the loop picks another)."""
        first, u = [], 0
        for spec in self.engines:
            first.append(u)
            u += spec.capacity
        return list(map(first.__getitem__, self.table.engine[n0:n1]))

    def __repr__(self) -> str:
        return (f"PeState({self.n_lowered} commands lowered, {self.next_dispatch} dispatched, "
                f"{self.in_flight} in flight, {len(self.start)} stages)")


def new_pe(program: Program | Schedule, *, with_effects: bool = False) -> PeState:
    """A PE ready to run ``program`` from cycle 0 (a :class:`Program` is lowered as it runs)."""
    if isinstance(program, Schedule):
        cursor: Any = Lowered(program)
        table, ctab, topo = program.table, program.ctab, program.topo
    else:
        table, ctab = StageTable(program.with_effects), CommandTable()
        cursor = program.cursor(table, ctab)
        topo = program.topo
    engines = engine_table(topo)
    if engines[0].capacity != 1 or engines[1].capacity != 1:
        raise SimulationError("PE_CPU and PE_SCHEDULER issue in order: each must have exactly one unit.")
    n_units = sum(e.capacity for e in engines)
    return PeState(table, ctab, cursor, engines, topo.cmd_queue_depth, topo.hazard_policy == "strict_fifo",
                   busy=[False] * n_units, ready_q=[[] for _ in engines])


#: Loop iterations lowered at once when no steady state watches the boundaries (the columns every iteration
#: repeats are then extended once for all of them).
CHUNK = 32


def _lower(pe: PeState, t: int, iterations: int = 1) -> None:
    """Lower the next block of ``pe``'s program (a command, or up to ``iterations`` loop iterations): its
    stages join the lists, waiting for what has not ended."""
    ctab = pe.ctab
    c0 = pe.n_lowered
    n0 = len(pe.start)
    c1 = c0 + (pe.cursor.lower(c0, iterations) if iterations > 1 else pe.cursor.lower(c0))
    pe.n_lowered = c1
    n1 = ctab.plan_end[c1 - 1]
    if ctab.dispatch_seq[c0] != n0:
        raise SimulationError(f"command {c0} was lowered at seq {ctab.dispatch_seq[c0]}, not after the {n0} stages "
                              f"before it.")
    d, e = ctab.dispatch_seq, ctab.plan_end
    pe.cmd_left += [e[c] - d[c] - 2 for c in range(c0, c1)]
    pe.completed += [False] * (c1 - c0)
    pe.final_stage += [-1] * (c1 - c0)
    k = n1 - n0
    minus = [-1] * k
    pe.start += minus
    pe.end += minus
    pe.rdy += minus
    pe.unit += pe.first_unit_of(n0, n1)
    pe.xsucc += [None] * k
    pe.remaining += pe.table.npred[n0:n1]  # the dependencies inside each command: none has ended yet
    end, xsucc, remaining = pe.end, pe.xsucc, pe.remaining
    for u, p in pe.cursor.ext_edges:  # and those on earlier commands' stages that have not (lowering happens
        if not -1 < end[p] <= t:      # after every stage ending at t retired)
            x = xsucc[p]
            if x is None:
                xsucc[p] = [u]
            else:
                x.append(u)
            remaining[u] += 1


def step(pe: PeState, **kw: Any) -> int:
    """Process the next instant at which something happens (SimPy's ``step``); return it (or the last one)."""
    return run(pe, until=pe.events[0][0] if pe.events else pe.t, **kw)


def run(pe: PeState, apply: Callable[[object], None] | None = None, edges: list[list[int]] | None = None,
        on_boundary: Callable[[PeState, int], bool] | None = None, until: int | None = None) -> int:
    """Run ``pe`` until its program has completed, or up to and including cycle ``until``; return the
    last cycle processed.

    Args:
        pe: the PE (:func:`new_pe`), at cycle 0 or where an earlier call stopped.
        apply: data mode: called with each plan stage's effect when it ends, in (end, seq) order.
        edges: if given (a list, extended with one list per stage), receives the *dynamic* dependencies
            the run resolved — queue-slot and ``tl.wait`` waits, hazard holds, the scheduler blocked
            behind a held command — as the seq of the stage whose end released each stage. With the
            static ``preds`` they form the resolved stage graph (the benchmark replays it in SimPy).
        on_boundary: called as ``on_boundary(pe, t)`` at an iteration boundary: the first instant at
            which the CPU is free and its queue has room, and the next command, not yet lowered, is the
            first of a ``tl.range`` iteration (that command's DISPATCH starts then, unless a ``tl.wait``
            holds it). The steady state (:mod:`.steady`) compares the states there; the hook may move
            the program on (the cursor then lowers a later iteration).
        until: stop after processing this cycle (``step``); ``None`` runs to the end.

    Raises:
        SimulationError: the program deadlocks (e.g. a ``tl.wait`` on a later command).
    """
    table = pe.table
    kind, engine, dur, cmd_of, effects = table.kind, table.engine, table.dur, table.cmd, table.effects
    cbase, lsucc = table.cbase, table.lsucc
    start, end, rdy, unit, remaining, xsucc = pe.start, pe.end, pe.rdy, pe.unit, pe.remaining, pe.xsucc
    ctab = pe.ctab
    dispatch_seq, reads, writes, waits = ctab.dispatch_seq, ctab.reads, ctab.writes, ctab.waits
    cmd_left, completed, final_stage = pe.cmd_left, pe.completed, pe.final_stage
    busy, ready_q, active = pe.busy, pe.ready_q, pe.active
    held_count, waiters, held, release_at, hits, waited = (pe.held_count, pe.waiters, pe.held, pe.release_at,
                                                           pe.hits, pe.waited)
    cursor, depth, strict = pe.cursor, pe.depth, pe.strict
    next_dispatch, dispatched_end, next_plan = pe.next_dispatch, pe.dispatched_end, pe.next_plan
    in_flight, first_incomplete, held_strict = pe.in_flight, pe.first_incomplete, pe.held_strict
    last_completion, last_release = pe.last_completion, pe.last_release
    if edges is not None:
        edges.extend([] for _ in range(len(start) - len(edges)))

    # the engines the loop walks for plan stages, in engine-table order: (ready heap, unit) of those with
    # one unit, (ready heap, units) of those with several. Walking one group before the other changes
    # nothing: a start never makes another stage ready, only an end does.
    walk_one: list[tuple[list[int], int]] = []
    walk_many: list[tuple[list[int], tuple[int, ...]]] = []
    u0 = 0
    for e, spec in enumerate(pe.engines):
        units = tuple(range(u0, u0 + spec.capacity))
        u0 += spec.capacity
        if e >= 2:
            (walk_one.append((ready_q[e], units[0])) if len(units) == 1 else walk_many.append((ready_q[e], units)))
    first_unit = [0] * len(pe.engines)
    u0 = 0
    for e, spec in enumerate(pe.engines):
        first_unit[e] = u0
        u0 += spec.capacity

    def release(c: int, by: int, t: int) -> None:
        d = dispatch_seq[c]
        for y in lsucc[d + 1]:
            u = d + y
            if edges is not None and by >= 0:
                edges[u].append(by)
            left = remaining[u] - 1
            remaining[u] = left
            if not left:
                heappush(ready_q[engine[u]], u)
                rdy[u] = t
        if by >= 0:
            release_at[c] = t

    events = pe.events
    t = pe.t
    while True:
        # -- retire everything that ends at t ----------------------------------------------------------
        while events and events[0][0] == t:
            s = heappop(events)[1]
            busy[unit[s]] = False
            k = kind[s]
            if k > _PLAN:
                if apply is not None and effects[s] is not None:
                    apply(effects[s])
                c = cmd_of[s]
                b = cbase[c]
                for y in lsucc[s]:
                    u = b + y
                    left = remaining[u] - 1
                    remaining[u] = left
                    if not left:
                        heappush(ready_q[engine[u]], u)
                        rdy[u] = t
                x = xsucc[s]
                if x is not None:
                    for u in x:
                        left = remaining[u] - 1
                        remaining[u] = left
                        if not left:
                            heappush(ready_q[engine[u]], u)
                            rdy[u] = t
                left = cmd_left[c] - 1
                cmd_left[c] = left
                if not left:
                    completed[c] = True
                    in_flight -= 1
                    active.remove(c)
                    final_stage[c] = s
                    last_completion = (t, s)
                    n_low = pe.n_lowered
                    while first_incomplete < n_low and completed[first_incomplete]:
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
        # -- start what can start at t --------------------------------------------------------------------
        while not busy[0] and in_flight < depth:
            c = next_dispatch
            if c == pe.n_lowered:
                if cursor.done:
                    break
                if on_boundary is not None and cursor.at_boundary():
                    pe.next_dispatch, pe.dispatched_end, pe.next_plan = next_dispatch, dispatched_end, next_plan
                    pe.in_flight, pe.first_incomplete, pe.held_strict = in_flight, first_incomplete, held_strict
                    pe.last_completion, pe.last_release, pe.t = last_completion, last_release, t
                    on_boundary(pe, t)
                _lower(pe, t, CHUNK if on_boundary is None else 1)
                if edges is not None:
                    edges.extend([] for _ in range(len(start) - len(edges)))
            wc = waits[c]
            if wc and not all(completed[w] for w in wc):
                break
            s = dispatch_seq[c]
            if wc:
                when = 0
                for w in wc:
                    when = max(when, end[final_stage[w]])
                waited.append((c, when))
            if edges is not None:
                edges[s].extend(final_stage[w] for w in wc)
                if last_completion[0] == t:
                    edges[s].append(last_completion[1])
            start[s] = t
            end[s] = te = t + dur[s]
            heappush(events, (te, s))
            busy[0] = True
            in_flight += 1
            active.append(c)
            next_dispatch += 1
            break
        if not busy[1] and next_plan < dispatched_end and held_strict < 0:
            s = dispatch_seq[next_plan] + 1
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
        if not events or (until is not None and events[0][0] > until):
            break
        t = events[0][0]

    pe.t = t
    pe.next_dispatch, pe.dispatched_end, pe.next_plan = next_dispatch, dispatched_end, next_plan
    pe.in_flight, pe.first_incomplete, pe.held_strict = in_flight, first_incomplete, held_strict
    pe.last_completion, pe.last_release = last_completion, last_release
    n_low = pe.n_lowered
    if not events and (not cursor.done or next_dispatch < n_low or first_incomplete < n_low):
        stuck = next_dispatch if next_dispatch < n_low else first_incomplete
        why = ""
        if stuck < n_low and waits[stuck]:
            why = (f" (it waits on command(s) {[ctab.cmd[w] for w in waits[stuck]]}; a tl.wait must name an earlier "
                   f"command)")
        raise SimulationError(f"the timeline stopped at cycle {t} with command #{ctab.cmd[stuck]} "
                              f"{ctab.label[stuck]!r} unfinished{why}: the program deadlocks.")
    return t

