"""The deterministic event loop (DESIGN.md §5, §6, §11): a PE's units, stage by stage.

Events are stage ends in a heap keyed by ``(time, seq)``. At each instant
the loop first retires every stage that ends then (in seq order: data
effects, successors, command completion, hazard checks), then lets each free
unit start the ready stage with the lowest seq (oldest first). Nothing
depends on dict or set iteration order.

:func:`run` reads as SimPy's ``step()``: it takes the next instant and the
PE whose event comes out first, and hands the instant to that PE's process,
:func:`_turns`: its two phases, apply (pop its events of the instant and
apply them) then schedule (start what can start). A PE's whole state is its
record, :class:`PeState`; the process is a generator over it, binding the
lists it works on once per run, since a turn is most often a single event
and a plain call per turn would bind them at every event.

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

import weakref
from dataclasses import dataclass, field
from heapq import heapify, heappop, heappush
from typing import Any, Callable, Generator, Sequence

from ..errors import SimulationError
from ..pe.engines import DataExecutor
from ..pe.scheduler import CommandTable, Program, Schedule, conflicts
from ..pe.stages import Engine, EngineSpec, StageKind, StageTable, engine_table
from .flows import FlowChannel

_DISPATCH, _PLAN = int(StageKind.DISPATCH), int(StageKind.PLAN)
_DMA_ENGINE = int(Engine.PE_DMA)


class Lowered:
    """A cursor over a schedule lowered beforehand (tests, ``analysis.what_if`` with explicit durations):
    :meth:`lower` hands the loop one command at a time; its stages are already in the table."""

    def __init__(self, sched: Schedule):
        self.sched = sched
        self.topo = sched.topo
        self.table = sched.table
        self.commands = sched.ctab
        self.next = 0
        self.reach = sched.reach
        self.cmd_offset = 0
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
    # --- the front end and the engines (the pending events are the device's) ---------------------------
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
    #: commands whose footprints a steady-state jump moved on: their own (reads, writes) and the iterations moved
    moved: dict[int, tuple] = field(default_factory=dict)
    # --- the PE on the device ---------------------------------------------------------------------------------
    pe: int = 0
    launches: list = field(default_factory=list)            # the programs it runs, back to back
    launch: int = 0                                          # the one running
    launch_first: list[int] = field(default_factory=list)   # first command of every launch after the first
    launch_start: list[int] = field(default_factory=list)   # and the cycle it started
    memories: list = field(default_factory=list)            # data mode: each launch's LaunchMemory
    #: per launch, the launches it waits for (DESIGN.md §16): ``(device-local PE, launch index)`` pairs
    after: list = field(default_factory=list)
    opened: int = 0              # the latest launch whose first DISPATCH may start (its dependencies ended)
    launch_end: list[int] = field(default_factory=list)     # each ended launch's end, in the device's real clock
    wake_at: int = -1            # a wake-up pushed for the gate of the running launch
    #: a PE whose earlier launches ran in another event loop (:mod:`.cut`): the cycle they ended, which its first
    #: launch waits for as it would for a previous launch, in the device's real clock (0: none)
    begin: int = 0
    #: per launch, the latest end + ``sync`` of the launches it is after that ran in another event loop, in the
    #: real clock (-1: none); empty when no launch has one
    outer_after: list = field(default_factory=list)
    #: launches whose gate an ``after`` dependency set: (first command, the cycle it opened, in this PE's
    #: simulated clock), for the front end's ``d_after``
    after_at: list[tuple[int, int]] = field(default_factory=list)
    apply: Any = None                                        # data mode: the running launch's executor
    flows: dict[int, FlowChannel] = field(default_factory=dict)  # the contended channels of the device
    in_flow: set[int] = field(default_factory=set)          # DMA stages whose bytes are moving on one
    dma_base: int = 0                                        # a transfer's access phase, before it joins
    #: the DeviceState it belongs to, weakly (the device holds its PEs: a strong reference back would keep a
    #: finished loop's lists for the cyclic collector)
    device: Any = None
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


#: A heap key is ``pe << PE_SHIFT | seq``: at one cycle a PE's events come out together, in seq order.
PE_SHIFT = 40
MASK = (1 << PE_SHIFT) - 1
#: Seq-field values at or above this are not stage ends: a flow joining its channel (``seq | JOIN``), or a PE's
#: first look at the machine (``WAKE``).
JOIN = 1 << (PE_SHIFT - 1)
WAKE = MASK


class LaunchMemory:
    """What a data-mode launch's effects read and write: the device's HBM and the launch's own TCM."""

    __slots__ = ("hbm", "tcm")

    def __init__(self, hbm: Any, tcm: Any):
        self.hbm, self.tcm = hbm, tcm

    def arena(self, h: Any) -> Any:
        return self.hbm if h.space.value == "hbm" else self.tcm


@dataclass(slots=True, eq=False, weakref_slot=True)
class DeviceState:
    """The device's whole dynamic state: every PE's, the pending events of all of them, the contended channels'
    flows, and the cycle the loop has processed."""

    pes: list[PeState]
    events: list[tuple[int, int]] = field(default_factory=list)
    t: int = 0
    channels: dict[int, FlowChannel] = field(default_factory=dict)
    #: events in ``events`` that a reflow left behind (a flow's end that moved): passed over when they come out,
    #: and dropped all at once when they are most of the heap (:func:`_reflow`)
    stale: int = 0
    #: launch dependencies (DESIGN.md §16): the signal latency, the PEs waiting for a launch's end, and the cycles
    #: the steady state inserted so far (the simulated clock runs that far behind the real one)
    sync: int = 0
    waiters: dict[tuple[int, int], list[int]] = field(default_factory=dict)
    shift: int = 0

    def __repr__(self) -> str:
        return f"DeviceState({len(self.pes)} PEs at cycle {self.t}, {len(self.channels)} contended channels)"


def new_pe(program: Program | Schedule, *, launches: Sequence[Program] = (), memories: Sequence[Any] = (),
           pe: int = 0, after: Sequence[tuple] = (), begin: int = 0, outer_after: Sequence[int] = (),
           cmd_offset: int = 0) -> PeState:
    """A PE ready to run ``program`` from cycle 0 (a :class:`Program` is lowered as it runs), and then ``launches``
    after it, back to back; ``memories`` (data mode) are each launch's :class:`LaunchMemory`; ``after`` each
    launch's dependencies, ``(device-local PE, launch index)`` pairs (DESIGN.md §16).

    A PE that goes on from launches simulated in another event loop (:mod:`.cut`) gets ``begin``, the cycle they
    ended (its first launch waits for it as for a previous launch), ``outer_after``, per launch the latest end +
    ``sync_cycles`` of its dependencies simulated there (-1: none), and ``cmd_offset``, their commands."""
    if isinstance(program, Schedule):
        cursor: Any = Lowered(program)
        table, ctab, topo = program.table, program.ctab, program.topo
    else:
        table, ctab = StageTable(program.with_effects), CommandTable()
        cursor = program.cursor(table, ctab, cmd_offset=cmd_offset) if cmd_offset else program.cursor(table, ctab)
        topo = program.topo
    engines = engine_table(topo)
    if engines[0].capacity != 1 or engines[1].capacity != 1:
        raise SimulationError("PE_CPU and PE_SCHEDULER issue in order: each must have exactly one unit.")
    n_units = sum(e.capacity for e in engines)
    state = PeState(table, ctab, cursor, engines, topo.cmd_queue_depth, topo.hazard_policy == "strict_fifo",
                    busy=[False] * n_units, ready_q=[[] for _ in engines])
    state.pe = pe
    state.dma_base = topo.dma_base_cycles
    state.launches = [program, *launches]
    state.memories = list(memories)
    state.after = [tuple(a) for a in after]
    state.begin = begin
    state.outer_after = [int(g) for g in outer_after] if any(g >= 0 for g in outer_after) else []
    first_gated = (state.after and state.after[0]) or (state.outer_after and state.outer_after[0] >= 0)
    state.opened = -1 if first_gated or begin > 0 else 0
    if state.memories:
        state.apply = DataExecutor(state.memories[0]).apply
    return state


def device(pes: Sequence[PeState], channels: dict[int, FlowChannel] | None = None, sync: int = 0) -> DeviceState:
    """The device of ``pes`` (PE ``i`` is ``pes[i]``) at cycle 0, each PE about to look at the machine; ``sync``
    the signal latency of a launch dependency (``sync_cycles``)."""
    dev = DeviceState(list(pes), channels=dict(channels or {}), sync=sync)
    for i, p in enumerate(dev.pes):
        p.pe = i
        p.device = weakref.ref(dev)
        p.flows = {c: fc for c, fc in dev.channels.items()}
        heappush(dev.events, (0, (i << PE_SHIFT) | WAKE))
    return dev


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


#: Loop iterations lowered at once when no steady state watches the boundaries (the columns every iteration
#: repeats are then extended once for all of them).
CHUNK = 32


def _next_launch(pe: PeState, t: int) -> bool:
    """Start ``pe``'s next launch at cycle ``t`` (its previous one has completed): a fresh cursor — staging ring,
    and in data mode TCM — over the same stage and command tables. False when it has no next launch."""
    nxt = pe.launch + 1
    if nxt >= len(pe.launches):
        return False
    pe.launch = nxt
    prog = pe.launches[nxt]
    pe.cursor = prog.cursor(pe.table, pe.ctab, cmd_offset=pe.cursor.cmd_offset + prog_commands(pe.launches[nxt - 1]))
    pe.launch_first.append(pe.n_lowered)
    pe.launch_start.append(t)
    if pe.memories:
        pe.apply = DataExecutor(pe.memories[nxt]).apply
    return True


def _ended(dev: DeviceState, pe: PeState, t: int) -> None:
    """``pe``'s running launch ended at ``t``: record it (in the real clock) and wake the PEs waiting for it."""
    j = len(pe.launch_end)
    pe.launch_end.append(t + dev.shift)
    for p in dev.waiters.pop((pe.pe, j), ()):
        heappush(dev.events, (t, (p << PE_SHIFT) | WAKE))


def _open(dev: DeviceState, pe: PeState, t: int) -> bool:
    """Whether the running launch of ``pe`` may dispatch at ``t`` (DESIGN.md §16): every launch it is ``after``
    has ended, ``sync`` cycles ago. If not, ``pe`` waits for the first that has not ended (it wakes ``pe``) or is
    woken when the latest end + ``sync`` comes."""
    deps = pe.after[pe.launch] if pe.after else ()
    gate = -1
    pes = dev.pes
    for q, j in deps:
        ends = pes[q].launch_end
        if j >= len(ends):
            w = dev.waiters.setdefault((q, j), [])
            if pe.pe not in w:
                w.append(pe.pe)
            return False
        gate = max(gate, ends[j] + dev.sync)
    outer = pe.outer_after[pe.launch] if pe.outer_after else -1
    if outer > gate:  # dependencies that ran in another event loop: their latest end + sync
        gate = outer
    gate -= dev.shift  # in the simulated clock
    at = gate
    if pe.launch == 0 and pe.begin - dev.shift > at:  # its earlier launches, run in another loop, end then
        at = pe.begin - dev.shift
    if at > t:
        if pe.wake_at != at:
            pe.wake_at = at
            heappush(dev.events, (at, (pe.pe << PE_SHIFT) | WAKE))
        return False
    if deps or outer >= 0:
        pe.after_at.append((pe.n_lowered, gate))
    pe.opened = pe.launch
    pe.wake_at = -1
    return True


def prog_commands(prog: Program | Schedule) -> int:
    return prog.n_commands


def step(dev: DeviceState, **kw: Any) -> int:
    """Process the next cycle at which something happens (SimPy's ``step``); return it (or the last one)."""
    return run(dev, until=dev.events[0][0] if dev.events else dev.t, **kw)


def run(dev: DeviceState | PeState, apply: Callable[[object], None] | None = None,
        edges: list[list[int]] | dict[int, list[list[int]]] | None = None, on_boundary: Callable[..., Any] | None = None,
        until: int | None = None) -> int:
    """Run the device (or one PE) until every program has completed, or up to and including cycle ``until``;
    return the last cycle processed.

    The loop is SimPy's ``step()``, a turn at a time: the next instant and the PE whose event comes out first;
    pop its events of that instant and apply them; then schedule what can start then: the two phases of the
    PE's process (:func:`_turns`), which read and write its record, :class:`PeState`.

    Args:
        dev: the device (:func:`device`), or one PE (:func:`new_pe`: it is made a device of one), at cycle 0 or
            where an earlier call stopped.
        apply: data mode, one PE given without its memories: called with each plan stage's effect when it ends.
        edges: if given (one PE: a list, extended with one list per stage; a device: PE -> such a list), receives
            the *dynamic* dependencies the run resolved — queue-slot and ``tl.wait`` waits, hazard holds, the scheduler blocked behind a
            held command — as the seq of the stage whose end released each stage. With the static ``preds`` they
            form the resolved stage graph (the benchmark replays it in SimPy).
        on_boundary: called as ``on_boundary(dev, pe, t)`` at an iteration boundary of PE ``pe``: the first
            instant at which its CPU is free and its queue has room, and the next command, not yet lowered, is
            the first of a ``tl.range`` iteration (that command's DISPATCH starts then, unless a ``tl.wait``
            holds it). The steady state (:mod:`.steady`) compares the states there; the hook may move the
            program on (the cursor then lowers a later iteration).
        until: stop after processing this cycle (``step``); ``None`` runs to the end.

    Raises:
        SimulationError: a program deadlocks (e.g. a ``tl.wait`` on a later command).
    """
    if isinstance(dev, PeState):
        pe0 = dev
        if apply is not None:
            pe0.apply = apply
        dev = pe0.device() if pe0.device is not None else None
        if dev is None:
            dev = device([pe0])
    events, pes = dev.events, dev.pes
    # one PE: every event is its own (its keys are plain seqs); no contended channel: every end is final
    single, flowing = len(pes) == 1, bool(dev.channels)
    turns: list = [None] * len(pes)  # each PE's process (:func:`_process`), made at its first turn
    t = dev.t
    per_pe = edges if isinstance(edges, dict) else ({0: edges} if edges is not None else None)
    if per_pe is not None and len(pes) > 1 and not isinstance(edges, dict):
        raise SimulationError("a device run records its dynamic edges per PE: pass edges as {pe: []}.")
    if per_pe is not None:
        for p, lst in per_pe.items():
            lst.extend([] for _ in range(len(pes[p].start) - len(lst)))
    if single:  # one PE: every event is its own, and its process is made once
        if events:
            turn = _process(dev, pes[0], single, flowing, on_boundary,
                            None if per_pe is None else per_pe.setdefault(0, []))
            while True:  # (see below)
                if not events:
                    break
                t = events[0][0]
                if until is not None and t > until:
                    break
                turn(t)
        dev.t = t
        if not events:
            _check_finished(pes, t)
        return t
    while True:  # (not ``while events``: CPython 3.11 warms a function up for specializing at an unconditional
        if not events:  # backward jump, and run is called once per simulation)
            break
        t, key = events[0]
        if until is not None and t > until:
            break
        p = key >> PE_SHIFT
        turn = turns[p]
        if turn is None:
            turn = turns[p] = _process(dev, pes[p], single, flowing, on_boundary,
                                       None if per_pe is None else per_pe.setdefault(p, []))
        turn(t)
    dev.t = t
    if not events:
        _check_finished(pes, t)
    return t


def _process(dev: DeviceState, P: PeState, single: bool, flowing: bool, on_boundary: Callable[..., Any] | None,
             E: list[list[int]] | None) -> Callable[[int], Any]:
    """PE ``P``'s process (SimPy's): ``turn(t)``, called at every instant the loop turns to ``P``, runs its two
    phases, apply then schedule (:func:`_turns`). ``E``: ``P``'s dynamic edges, if recorded.

    The process is a generator that binds the lists it works on once and then handles one instant per ``send``:
    its locals live as long as the run, so a turn costs no binding and no frame set-up (a plain call per turn
    would, for every local). The lists are the objects themselves, which the phases change in place and nothing
    replaces while the loop runs; the counters are read and written in ``P``'s record, where the steady state
    reads them."""
    if E is not None:
        E.extend([] for _ in range(len(P.start) - len(E)))
    turn = _turns(dev, P, single, flowing, on_boundary, E)
    next(turn)
    return turn.send


def _turns(dev: DeviceState, P: PeState, single: bool, flowing: bool, on_boundary: Callable[..., Any] | None,
           E: list[list[int]] | None) -> Generator[None, int, None]:
    """PE ``P``'s process: at each instant ``t`` sent, its two phases, one after the other.

    **Apply**: pop every event of ``P`` at ``t`` and apply it, in seq order. A stage's end frees its unit; a
    plan stage's applies its effect (data mode), leaves its flow, notifies its successors and may complete its
    command (releasing the commands held behind it); a DISPATCH's counts; a PLAN's checks the command against
    every earlier one not yet complete, and releases it or holds it (:func:`_hold`). A flow reaching its data
    phase joins its channel; a wake-up only brings ``P`` to the second phase.

    **Schedule**: start what can start on ``P`` then. The CPU dispatches the next command (lowering it first,
    :func:`_lower_next`) unless its queue is full or a ``tl.wait`` holds it; the scheduler plans the next
    dispatched command unless a ``strict_fifo`` hold stops it; each plan engine's free units, lowest-numbered
    first, take its oldest ready stages (SimPy's resources: the topology's engine table), DMA stages on a
    contended channel through the flow rule (:class:`~kbwork.device.flows.FlowChannel`)."""
    # bound once per run, for both phases (the lists themselves, which they change in place)
    events, table = dev.events, P.table
    kind, engine, cmd_of, effects, cbase, lsucc, chan, nbytes = (table.kind, table.engine, table.cmd, table.effects,
                                                                 table.cbase, table.lsucc, table.chan, table.nbytes)
    end, rdy, unit, remaining, xsucc, cmd_left, completed, final_stage, busy, ready_q, active = (
        P.end, P.rdy, P.unit, P.remaining, P.xsucc, P.cmd_left, P.completed, P.final_stage, P.busy, P.ready_q,
        P.active)
    ctab = P.ctab
    dispatch_seq, reads, writes = ctab.dispatch_seq, ctab.reads, ctab.writes
    strict, flows, in_flow, p = P.strict, P.flows, P.in_flow, P.pe
    # and what only the schedule phase reads
    dur, start, waits, depth, pkey = table.dur, P.start, ctab.waits, P.depth, p << PE_SHIFT
    # the plan engines: each of one unit, each of several, and the DMA units when its transfers start through the
    # flow rule (a PE on contended channels)
    walk_one: list[tuple[list[int], int]] = []
    walk_many: list[tuple[list[int], tuple[int, ...]]] = []
    dma_units: tuple[int, ...] = ()
    u0 = 0
    for e, spec in enumerate(P.engines):
        units = tuple(range(u0, u0 + spec.capacity))
        u0 += spec.capacity
        if e == _DMA_ENGINE and flows:
            dma_units = units
        elif e >= 2:
            (walk_one.append((ready_q[e], units[0])) if len(units) == 1
             else walk_many.append((ready_q[e], units)))
    dma_q = ready_q[_DMA_ENGINE] if flows else None
    t = yield
    while True:  # a turn
        # --- apply: the first event is P's at t (run looked); then as long as the next one is
        apply = P.apply  # the running launch's executor (data mode): a new launch brings its own
        while True:
            s = heappop(events)[1] & MASK
            if s >= JOIN:
                if s != WAKE:  # a flow's data phase starts: it joins its channel
                    s ^= JOIN
                    _reflow(dev, flows[chan[s]].join(t, p, s, nbytes[s]))
            elif flowing and (end[s] != t or (s not in in_flow and engine[s] == _DMA_ENGINE and nbytes[s]
                                              and chan[s] in flows)):
                pass  # a flow's end that moved since it was pushed, or one it moved back to (already retired)
            else:
                busy[unit[s]] = False
                k = kind[s]
                if k > _PLAN:
                    if apply is not None and effects[s] is not None:
                        apply(effects[s])
                    if in_flow and s in in_flow:
                        in_flow.discard(s)
                        _reflow(dev, flows[chan[s]].leave(t, p, s))
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
                    if not left:  # the command completes: it leaves the queue
                        completed[c] = True
                        P.in_flight -= 1
                        active.remove(c)
                        final_stage[c] = s
                        P.last_completion = (t, s)
                        f, n_low = P.first_incomplete, P.n_lowered
                        while f < n_low and completed[f]:
                            f += 1
                        P.first_incomplete = f
                        if strict:
                            h = P.held_strict
                            if h >= 0 and f >= h:
                                P.held_strict = -1
                                P.last_release = (t, s)
                                _release(P, h, s, t, E)
                        else:
                            held_count = P.held_count
                            for h in P.waiters.pop(c, ()):
                                held_count[h] -= 1
                                if held_count[h] == 0:
                                    del held_count[h]
                                    _release(P, h, s, t, E)
                elif k == _DISPATCH:
                    P.dispatched_end += 1
                else:  # PLAN: hazard check against every earlier incomplete command
                    c = cmd_of[s]
                    rd, wr = reads[c], writes[c]
                    # active is in dispatch order (appended as dispatched, removed as completed): the commands before c
                    # come first. (A loop, not a comprehension: that would be a call of its own at every PLAN.)
                    hit = []
                    for o in active:
                        if o >= c:
                            break
                        if conflicts(rd, wr, reads[o], writes[o]):
                            hit.append(o)
                    if not hit:  # released at once: _release(P, c, -1, t, E) inlined (the loop's most frequent call)
                        d = dispatch_seq[c]
                        for y in lsucc[d + 1]:
                            u = d + y
                            left = remaining[u] - 1
                            remaining[u] = left
                            if not left:
                                heappush(ready_q[engine[u]], u)
                                rdy[u] = t
                    else:
                        _hold(P, c, hit)
            if not events or events[0][0] != t or not (single or events[0][1] >> PE_SHIFT == p):
                break
        # --- schedule
        while not busy[0] and P.in_flight < depth:  # the CPU: one DISPATCH at most
            c = P.next_dispatch
            if c == P.n_lowered and not _lower_next(dev, P, t, on_boundary, E):
                break
            wc = waits[c]
            if wc and not all(completed[w] for w in wc):
                break
            s = dispatch_seq[c]
            if wc:
                when = 0
                for w in wc:
                    when = max(when, end[final_stage[w]])
                P.waited.append((c, when))
            if E is not None:
                E[s].extend(final_stage[w] for w in wc)
                if P.last_completion[0] == t:
                    E[s].append(P.last_completion[1])
            start[s] = t
            end[s] = te = t + dur[s]
            heappush(events, (te, pkey | s))
            busy[0] = True
            P.in_flight += 1
            active.append(c)
            P.next_dispatch = c + 1
            break
        if not busy[1] and P.next_plan < P.dispatched_end and P.held_strict < 0:  # the scheduler
            s = dispatch_seq[P.next_plan] + 1
            if E is not None and P.last_release[0] == t:
                E[s].append(P.last_release[1])
            start[s] = t
            end[s] = te = t + dur[s]
            heappush(events, (te, pkey | s))
            busy[1] = True
            P.next_plan += 1
        for rq, u in walk_one:  # the plan engines
            if rq and not busy[u]:
                s = heappop(rq)
                start[s] = t
                end[s] = te = t + dur[s]
                heappush(events, (te, pkey | s))
                busy[u] = True
        for rq, units in walk_many:
            if not rq:
                continue
            for u in units:
                if not busy[u]:
                    s = heappop(rq)
                    start[s] = t
                    end[s] = te = t + dur[s]
                    heappush(events, (te, pkey | s))
                    busy[u] = True
                    unit[s] = u
                    if not rq:
                        break
        if dma_q:  # a PE whose transfers may share a channel: those start through the flow rule
            for u in dma_units:
                if not busy[u]:
                    s = heappop(dma_q)
                    start[s] = t
                    busy[u] = True
                    unit[s] = u
                    fc = flows.get(chan[s])
                    if fc is None:
                        end[s] = te = t + dur[s]
                        heappush(events, (te, pkey | s))
                    else:
                        tj = t + P.dma_base
                        if not nbytes[s]:  # moves nothing: ends at its data phase's start, never joins
                            end[s] = tj
                            heappush(events, (tj, pkey | s))
                        else:
                            end[s] = -2  # known when its flow finishes
                            in_flow.add(s)
                            if tj == t:
                                _reflow(dev, fc.join(t, p, s, nbytes[s]))
                            else:
                                heappush(events, (tj, pkey | JOIN | s))
                    if not dma_q:
                        break
        t = yield


def _hold(P: PeState, c: int, hit: list[int]) -> None:
    """The PLAN of command ``c`` of ``P`` ended in conflict with the earlier commands ``hit``: hold ``c`` (under
    ``strict_fifo``, the scheduler with it) until they complete."""
    P.held.append(c)
    if P.strict:
        P.held_strict = c
    else:
        P.hits.append(hit)
        P.held_count[c] = len(hit)
        waiters = P.waiters
        for o in hit:
            waiters.setdefault(o, []).append(c)


def _lower_next(dev: DeviceState, P: PeState, t: int, on_boundary: Callable[..., Any] | None,
                E: list[list[int]] | None) -> bool:
    """``P``'s CPU is free at ``t`` with room in its queue, and every lowered command is dispatched: lower the next
    block of its program, after ending the running launch and starting the next one when the running one has
    no command left (at an iteration boundary, the steady state's ``on_boundary`` first). False when nothing
    can be dispatched now: the last commands are in flight, no launch is left, or the next one's gate is
    closed."""
    while P.cursor.done:
        if P.in_flight:
            return False
        if len(P.launch_end) <= P.launch:
            _ended(dev, P, t)
        if not _next_launch(P, t):
            return False
    if P.opened < P.launch and not _open(dev, P, t):
        return False  # it waits for a launch it is after (DESIGN.md §16)
    if on_boundary is not None and P.cursor.at_boundary():
        dev.t = t
        on_boundary(dev, P, t)
    _lower(P, t, CHUNK if on_boundary is None else 1)
    if E is not None:
        E.extend([] for _ in range(len(P.start) - len(E)))
    return True


def _check_finished(pes: list[PeState], t: int) -> None:
    """The heap ran dry at ``t``: raise if some PE's program did not finish (it deadlocks)."""
    for P in pes:
        n_low = P.n_lowered
        if not P.cursor.done or P.launch + 1 < len(P.launches) or P.next_dispatch < n_low \
                or P.first_incomplete < n_low:
            stuck = P.next_dispatch if P.next_dispatch < n_low else P.first_incomplete
            why, ctab = "", P.ctab
            if stuck < n_low and ctab.waits[stuck]:
                why = (f" (it waits on command(s) {[ctab.cmd[w] for w in ctab.waits[stuck]]}; a tl.wait must "
                       f"name an earlier command)")
            if stuck >= n_low:
                raise SimulationError(f"the timeline stopped at cycle {t} with PE {P.pe}'s program unfinished: "
                                      f"it deadlocks.")
            raise SimulationError(f"the timeline stopped at cycle {t} with command #{ctab.cmd[stuck]} "
                                  f"{ctab.label[stuck]!r} unfinished{why}: the program deadlocks.")


def _release(P: PeState, c: int, by: int, t: int, edges: list[list[int]] | None) -> None:
    """Command ``c`` of ``P`` is released (its PLAN ended, its hazards cleared): its plan's roots may start."""
    d = P.ctab.dispatch_seq[c]
    remaining, ready_q, engine, rdy = P.remaining, P.ready_q, P.table.engine, P.rdy
    for y in P.table.lsucc[d + 1]:
        u = d + y
        if edges is not None and by >= 0:
            edges[u].append(by)
        left = remaining[u] - 1
        remaining[u] = left
        if not left:
            heappush(ready_q[engine[u]], u)
            rdy[u] = t
    if by >= 0:
        P.release_at[c] = t


def _reflow(dev: DeviceState, ends: list[tuple[int, int, int]]) -> None:
    """A channel's rates changed: every flow on it whose end moved gets its new end pushed (the old one, when
    it comes out, no longer matches and is passed over)."""
    pes, events = dev.pes, dev.events
    for p, s, e in ends:
        end = pes[p].end
        was = end[s]
        if was != e:
            if was >= 0:  # the end pushed before stays in the heap
                dev.stale += 1
            end[s] = e
            heappush(events, (e, (p << PE_SHIFT) | s))
    if dev.stale > STALE_MIN and 2 * dev.stale > len(events):
        _drop_stale(dev)


#: Stale events a device's heap may hold before :func:`_reflow` considers dropping them.
STALE_MIN = 1024


def _drop_stale(dev: DeviceState) -> None:
    """Drop the stale ends from the device's heap, in place (the loop holds the list). What is kept comes out in
    the same order: the heap's entries are distinct ``(cycle, key)`` pairs, or equal ones, indistinguishable. An
    end is kept when it is its stage's end (a flow's end that moved away and back may be there twice: the loop
    retires the first and passes over the second, as before)."""
    pes, events = dev.pes, dev.events
    kept = []
    for x in events:
        q = x[1] & MASK
        if q >= JOIN or pes[x[1] >> PE_SHIFT].end[q] == x[0]:
            kept.append(x)
    events[:] = kept
    heapify(events)
    dev.stale = 0
