"""The exact steady state of ``tl.range`` loops (DESIGN.md §12), and running a program through the event loop.

In timing mode a run stops simulating a loop once the event loop's whole
dynamic state at an iteration boundary equals its state some whole number
of periods earlier, shifted by a constant number of cycles; the remaining
periods are then known exactly, and the run goes on from the shifted state.
Nothing is assumed about the kernel beyond what the trace says:

**Periodic by construction.** A ``tl.range`` body is traced once and
instantiated per iteration (:mod:`kbwork.pe.program`), so iteration
``i + P`` repeats iteration ``i`` with every row slice moved by its stride,
where ``P`` is the loop's period: the lcm of the periods of the rings it
indexes with its index and of the staging ring's (``Program.loop_period``).

**Shift-invariant hazards.** A loop is accelerated only where the hazard
relation between its iterations depends on their distance alone: every pair
of byte ranges its body touches, one of them written, is fixed against
fixed, ring slot against anything fixed, two row slices moving with one
stride, or a moving slice that meets a fixed range at every iteration or at
none (:func:`shift_invariant`). Otherwise the loop runs in full and the run
says why.

**Boundaries and states.** A boundary is the instant the next command the
CPU would dispatch is the first of an iteration and nothing of it has been
lowered: the CPU is free, its queue has room (its DISPATCH starts then,
unless a ``tl.wait`` holds it). The state there (:func:`canonical`) is
every variable of the event loop, with times, seqs and command ids as
offsets from the boundary's: the running stages (ends and units), each
engine's ready queue, the unmet dependencies and cross-command waiters of
every stage not yet started in the commands from the first incomplete one,
those commands' completion, the dispatch and plan counters, the queue
occupancy, the hazard holds (strict FIFO's held command; rw_aware's counts
and waiters), the staging ring (each buffer's last consumer, or "ended")
and the iteration's phase in the loop's period. Everything it refers to
must be a command of the loop (the first incomplete one, and the
``reach`` commands a staging edge can look back): then commands at equal
offsets are the same body commands, ``p`` iterations apart.

**The jump.** When the state at iteration ``i2`` equals the one at ``i1 <
i2`` (``p = i2 - i1`` a multiple of ``P``), the future from ``i2`` is the
future from ``i1`` shifted — the event loop is deterministic and only
compares times, seqs and the footprints' overlaps, which the shift
preserves — so iteration ``i2 + k·p`` sees the state of ``i2`` shifted ``k``
times. The cursor moves past ``k·p`` iterations, the footprints of the
commands still in flight move by ``k·p`` strides, and the loop goes on; it
leaves at least ``cmd_queue_depth`` commands (and a period) of the loop
before its last iteration, so the CPU's look-ahead into what follows is
simulated, not assumed. The run's records are the simulated ones with the
period's block repeated ``k`` times (:mod:`.expand`). Several loops are
accelerated one after another.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from ..errors import ValidationError
from ..pe.program import Loop
from ..pe.scheduler import Program, Schedule, _spans_at
from .loop import JOIN, MASK, PE_SHIFT, WAKE, DeviceState, PeState, new_pe, run
from .records import LazyRows, Timeline, schedule_of, timeline_of

#: The device steady state's sampling PE keeps its role through this many of its boundaries in a row that find
#: some PE not at one (:class:`GroupSteady`).
SAMPLER_MISSES = 1

#: Boundaries a loop is watched for a repeated state before the steady state gives up on it (plus four
#: structural periods).
WATCH = 64


def check_steady_state(value: Any, where: str) -> None:
    """Refuse anything but ``True`` or ``False`` for ``steady_state=`` (DESIGN.md §12).

    Raises:
        ValidationError: naming ``where`` and the value.
    """
    if value is not True and value is not False:
        raise ValidationError(f"{where}: steady_state must be True or False, got {value!r} "
                              f"({type(value).__name__}).")


@dataclass(frozen=True)
class SteadyState:
    """Which path a run took (``run.steady_state``).

    ``path`` is ``"steady"`` (some loop's remaining periods were inserted) or ``"full"`` (every stage
    simulated; ``reason`` says why). ``period`` is the proven period in iterations (of the first loop
    accelerated) or None, ``proven_at`` the iteration at which that proof closed or None; ``loops`` has
    one line per loop of the program (what happened to it), ``inserted`` the periods inserted in all.
    """

    path: str
    period: int | None = None
    proven_at: int | None = None
    reason: str | None = None
    inserted: int = 0
    loops: tuple[str, ...] = ()

    def __repr__(self) -> str:
        if self.path == "steady":
            return (f"SteadyState(steady: period {self.period} iterations, proven at iteration {self.proven_at}, "
                    f"{self.inserted} periods inserted)")
        return f"SteadyState(full: {self.reason})"


@dataclass(frozen=True)
class Insertion:
    """``k`` copies of the block between two equivalent boundaries, in the simulation's own numbering.

    The block is the commands ``c1 .. c2 - 1`` (stages ``s1 .. s2 - 1``), iterations ``i1 .. i2 - 1`` of
    ``loop``, lasting ``dt = t2 - t1`` cycles; it is inserted ``k`` times at ``c2``/``s2``/``t2``.
    """

    loop: Loop
    i1: int
    i2: int
    c1: int
    c2: int
    s1: int
    s2: int
    t1: int
    t2: int
    k: int
    prog: Any = field(default=None, compare=False, repr=False)  # the launch whose loop it is

    @property
    def p(self) -> int:
        return self.i2 - self.i1

    @property
    def dcmd(self) -> int:
        return self.c2 - self.c1

    @property
    def dseq(self) -> int:
        return self.s2 - self.s1

    @property
    def dt(self) -> int:
        return self.t2 - self.t1


# --- the static rule -----------------------------------------------------------------------------------
def _meets(m1: tuple, m2: tuple, n: int) -> str:
    """How two footprint makers (``scheduler._span_maker``) relate over ``n`` iterations: ``"never"``,
    ``"always"`` (at every iteration, or a relation that moves with the iterations' distance),
    or ``"varies"``."""
    k1, k2 = m1[0], m2[0]
    if k1 > k2:
        m1, m2, k1, k2 = m2, m1, k2, k1
    if k1 == 0 and k2 == 0:
        return "always"                          # fixed against fixed: the same at every iteration
    if k2 == 3:
        return "varies"                          # a handle too general to reason about
    if k1 == 0 and k2 == 2:
        return "always"                          # fixed against a ring slot: periodic
    if k1 == 2 and k2 == 2:
        return "always"
    if k1 == 0 and k2 == 1:
        tcm, lo, hi = m1[1]
        if tcm != m2[1]:
            return "never"
        hits = [lo < a + m2[4] and a < hi for a in (m2[2] + m2[3] * i for i in _probe(n, m2[3], lo, hi, m2[2],
                                                                                          m2[4]))]
        return "never" if not any(hits) else "always" if all(hits) else "varies"
    if k1 == 1 and k2 == 1:
        if m1[1] != m2[1]:
            return "never"
        if m1[3] == m2[3]:
            return "always"                      # one stride: the relation depends on the distance alone
        h1 = (min(m1[2], m1[2] + m1[3] * (n - 1)), max(m1[2], m1[2] + m1[3] * (n - 1)) + m1[4])
        h2 = (min(m2[2], m2[2] + m2[3] * (n - 1)), max(m2[2], m2[2] + m2[3] * (n - 1)) + m2[4])
        return "never" if h1[1] <= h2[0] or h2[1] <= h1[0] else "varies"
    if k1 == 1 and k2 == 2:                      # a moving slice against each slot of a ring
        verdicts = {_meets((0, span), m1, n) for span in m2[1]}
        return "varies" if "varies" in verdicts else "always"
    return "varies"


def _probe(n: int, stride: int, lo: int, hi: int, a0: int, size: int) -> list[int]:
    """The iterations at which a slice moving by ``stride`` can start or stop meeting ``[lo, hi)``: the
    first, the last, and where it crosses the range's ends (the set it meets is one interval of iterations)."""
    pts = {0, n - 1}
    if stride:
        for edge in (lo - size, hi):
            x = (edge - a0) / stride
            for i in (math.floor(x) - 1, math.floor(x), math.floor(x) + 1, math.floor(x) + 2):
                if 0 <= i < n:
                    pts.add(i)
    return sorted(pts)


def shift_invariant(prog: Program, loop: Loop) -> str | None:
    """None when ``loop``'s hazard relation between iterations depends on their distance alone (module
    docstring), else what breaks it, in words."""
    n = loop.iterations
    uses = []  # (body index, maker, written)
    for k in range(len(loop.body)):
        bc = prog.body_command(loop, k)
        uses += [(k, m, False) for m in bc.reads] + [(k, m, True) for m in bc.writes]
    for x, (k1, m1, w1) in enumerate(uses):
        for k2, m2, w2 in uses[x:]:
            if not (w1 or w2):
                continue
            if _meets(m1, m2, n) == "varies":
                what = "a range that moves with the index" if 1 in (m1[0], m2[0]) else "a range"
                return (f"loop {loop.number}: body command {k1} ({loop.body[k1].label!r}) and body command {k2} "
                        f"({loop.body[k2].label!r}) touch {what} that overlaps in some iterations and not in "
                        f"others, so the hazards between iterations are not the same from one period to the next")
    return None


def _waits_across_iterations(loop: Loop) -> str | None:
    """None unless a ``tl.wait`` at the end of ``loop``'s body holds the next iteration on a command of this one
    (a jump would leave the waiting command's target among the inserted periods), else that, in words."""
    n = len(loop.body)
    for k, t, rel in loop.waits:
        if k == n and rel:
            return (f"loop {loop.number}: a tl.wait at the end of its body (on body command {t}, "
                    f"{loop.body[t].label!r}) holds the next iteration's first command, so each iteration waits on "
                    f"the one before it")
    return None


def jump(pe: PeState, ins: Insertion) -> None:
    """Move ``pe`` past ``ins.k`` periods: the cursor skips them, and the commands still in flight take the
    footprints they would have ``k`` periods on (the hazards they meet from now on are those)."""
    loop, skip = ins.loop, ins.k * ins.p
    pe.cursor.skip(loop, skip)
    ctab = pe.ctab
    for x in range(pe.first_incomplete, pe.n_lowered):
        if ctab.loop[x] is loop and not pe.completed[x]:
            bc = pe.cursor.program.body_command(loop, ctab.body[x])
            r, w, before = pe.moved.get(x, (ctab.reads[x], ctab.writes[x], 0))  # its own, across several jumps
            pe.moved[x] = (r, w, before + skip)
            ctab.reads[x] = _spans_at(bc.reads, ctab.iteration[x] + before + skip)
            ctab.writes[x] = _spans_at(bc.writes, ctab.iteration[x] + before + skip)


# --- the state at a boundary -------------------------------------------------------------------------------
def events_by_pe(dev: DeviceState) -> dict[int, list[tuple[int, int]]]:
    """The device's pending events split by PE: PE -> ``[(cycle, key & MASK), ...]`` in heap order."""
    out: dict[int, list[tuple[int, int]]] = {}
    for e, key in dev.events:
        p = key >> PE_SHIFT
        lst = out.get(p)
        if lst is None:
            lst = out[p] = []
        lst.append((e, key & MASK))
    return out


def canonical(dev: DeviceState, pe: PeState, t: int, phase: int,
              pending: Sequence[tuple[int, int]] | None = None) -> tuple | None:
    """The whole dynamic state of ``pe`` at a boundary, with times, seqs and commands as offsets from it
    (module docstring); None when it refers to a command outside the boundary's loop. ``pending``: ``pe``'s
    events as ``(cycle, key & MASK)``, if the caller split the device's events by PE already (a group's
    steady state compares every PE's state at once: one pass over the events, not one per PE)."""
    ctab = pe.ctab
    c = pe.n_lowered
    s0 = len(pe.start)
    loop = pe.cursor.at_boundary()[0]
    lo = min(pe.first_incomplete, c - pe.cursor.reach - 1)
    if lo < 0 or ctab.loop[lo] is not loop:
        return None
    start, end, unit, remaining, xsucc = pe.start, pe.end, pe.unit, pe.remaining, pe.xsucc
    if pending is None:
        pending = events_by_pe(dev).get(pe.pe, ())
    events = []
    for e, q in pending:  # this PE's pending events (a flow's end that moved is no longer one)
        if q == WAKE:
            continue
        if q >= JOIN:  # a transfer in its access phase, about to join its channel (and the unit it holds)
            events.append((e - t, (q ^ JOIN) - s0, 1, unit[q ^ JOIN]))
        elif end[q] == e:
            events.append((e - t, q - s0, 0))
    window = ctab.dispatch_seq[pe.first_incomplete] if pe.first_incomplete < c else s0
    stages = []
    for s in range(window, s0):
        if start[s] < 0:
            x = xsucc[s]
            stages.append((s - s0, remaining[s], None if x is None else tuple(u - s0 for u in x)))
        elif end[s] > t:
            x = xsucc[s]
            stages.append((s - s0, end[s] - t, unit[s], None if x is None else tuple(u - s0 for u in x)))
    ring = pe.cursor.ring
    nb = ring.n_buffers
    ring_state = tuple((slot, ring._count[slot] % nb,
                        tuple(None if q is None or -1 < end[q] <= t else q - s0 for q in ring._consumer[slot]))
                       for slot in ring.SLOTS)
    f = pe.first_incomplete
    return (phase, tuple(sorted(events)), tuple(tuple(sorted(q - s0 for q in rq))
                                                                                   for rq in pe.ready_q),
            tuple(stages), tuple(x - c for x in range(f, c) if pe.completed[x]), tuple(pe.cmd_left[f:c]),
            f - c, pe.next_dispatch - c, pe.dispatched_end - c, pe.next_plan - c, pe.in_flight,
            tuple(x - c for x in pe.active), pe.held_strict - c if pe.held_strict >= 0 else None,
            tuple(sorted((h - c, n) for h, n in pe.held_count.items())),
            tuple(sorted((o - c, tuple(h - c for h in hs)) for o, hs in pe.waiters.items())), ring_state)


@dataclass(eq=False)
class _Watch:
    """What the steady state knows of one loop while the run goes on."""

    loop: Loop
    period: int
    why_not: str | None
    seen: dict[tuple, tuple[int, int, int, int]] = field(default_factory=dict)  # state -> (i, c, s, t)
    watched: int = 0
    outcome: str = ""


def _watch(watches: dict[int, _Watch], loop: Loop, prog: Program) -> _Watch:
    """``loop``'s watch in ``watches``, made on first sight: its period, and why it cannot go steady (checked
    once: the shift-invariance rule)."""
    w = watches.get(id(loop))
    if w is None:
        why = shift_invariant(prog, loop) or _waits_across_iterations(loop)
        w = watches[id(loop)] = _Watch(loop, prog.loop_period(loop), why)
        if why is not None:
            w.outcome = f"simulated in full: {why}"
    return w


def steady_outcome(ins: Insertion) -> str:
    """What :class:`Steady` says of a loop it accelerated by ``ins`` (a line of ``SteadyState.loops``)."""
    return (f"steady: period {ins.p} iterations ({ins.dt} cycles) proven at iteration {ins.i2} against iteration "
            f"{ins.i1}; {ins.k} periods ({ins.k * ins.p} iterations) inserted")


class Steady:
    """The steady state of one run: called at every boundary (``loop.run``'s ``on_boundary``)."""

    def __init__(self, prog: Program):
        self.prog = prog
        self.watches: dict[int, _Watch] = {}
        self.insertions: list[Insertion] = []
        self.first: tuple[int, int] | None = None  # (period, proven at) of the first insertion

    def __call__(self, dev: DeviceState, pe: PeState, t: int) -> None:
        loop, i = pe.cursor.at_boundary()
        prog = pe.cursor.program
        w = _watch(self.watches, loop, prog)
        if w.why_not is not None or w.outcome:
            return
        depth = prog.topo.cmd_queue_depth
        cpi = len(loop.body)
        # iterations the loop keeps after a jump: a period, and cmd_queue_depth commands before its last
        keep = w.period + -(-depth // cpi) + 1
        if loop.iterations - i < keep + w.period:
            if not w.seen:
                w.outcome = (f"simulated in full: {loop.iterations} iterations, too few to prove a period and "
                             f"insert one")
            else:
                w.outcome = (f"simulated in full: no repeated state within its first {i} iterations (it has "
                             f"{loop.iterations})")
            return
        w.watched += 1
        if w.watched > WATCH + 4 * w.period:
            w.outcome = f"simulated in full: no repeated state within the first {w.watched - 1} boundaries watched"
            return
        key = canonical(dev, pe, t, i % w.period)
        if key is None:
            return
        c, s = pe.n_lowered, len(pe.start)
        hit = w.seen.get(key)
        if hit is None:
            w.seen[key] = (i, c, s, t)
            return
        i1, c1, s1, t1 = hit
        p = i - i1
        k = (loop.iterations - i - keep) // p
        if k < 1:
            w.outcome = "simulated in full: the loop ended before a period could be inserted"
            return
        ins = Insertion(loop, i1, i, c1, c, s1, s, t1, t, k, prog)
        self._jump(pe, ins)
        dev.shift += k * ins.dt  # the simulated clock now runs that far behind the real one
        self.insertions.append(ins)
        if self.first is None:
            self.first = (p, i)
        w.outcome = steady_outcome(ins)

    def _jump(self, pe: PeState, ins: Insertion) -> None:
        jump(pe, ins)

    def state(self, why_full: str) -> SteadyState:
        lines = tuple(f"loop {n}: {w.outcome or 'simulated in full'}" for n, w in enumerate(self.watches.values()))
        if not self.insertions:
            reason = "; ".join(w.outcome.split(": ", 1)[1] for w in self.watches.values() if w.outcome) or why_full
            return SteadyState("full", reason=reason, loops=lines)
        return SteadyState("steady", self.first[0], self.first[1], None, sum(x.k for x in self.insertions), lines)


def simulate_program(prog: Program, memory=None, *, steady_state: bool = True,
                     why_full: str = "steady_state=False") -> tuple[Timeline, Schedule, SteadyState]:
    """Run one launch ``prog`` on one PE: in data mode (``memory`` given) with the executor, every stage; in
    timing mode with the steady state unless ``steady_state`` is False (:func:`simulate_pe`)."""
    from .loop import LaunchMemory

    mem = None if memory is None else [LaunchMemory(memory.hbm, memory.tcm)]
    return simulate_pe([prog], mem, steady_state=steady_state, why_full=why_full)


def simulate_pe(progs: Sequence[Program], memories: Sequence[Any] | None = None, *, steady_state: bool = True,
                why_full: str = "steady_state=False", after: Sequence[tuple] = (),
                sync: int = 0, begin: int = 0, outer_after: Sequence[int] = (),
                cmd_offset: int = 0) -> tuple[Timeline, Schedule, SteadyState]:
    """Run the launches ``progs`` back to back on one PE alone (no channel it uses is contended): in data mode
    (``memories``: each launch's ``LaunchMemory``) every stage; in timing mode with the steady state unless
    ``steady_state`` is False. ``after``: each launch's dependencies on the PE's own launches, ``(0, index)``
    pairs, ``sync`` their signal latency (DESIGN.md §16). ``begin``, ``outer_after``, ``cmd_offset``: a PE going
    on from launches simulated in another loop (:func:`~kbwork.device.loop.new_pe`; :mod:`.cut`).

    Returns:
        The PE's timeline, its schedule (both in the real numbering: a steady run's are the simulated records
        with the inserted periods repeated, built on first use) and how it ran.
    """
    prog = progs[0]
    pe = new_pe(prog, launches=progs[1:], memories=memories or (), after=after, begin=begin, outer_after=outer_after,
                cmd_offset=cmd_offset)
    if after and sync:
        from .loop import device as make_device

        dev = make_device([pe], sync=sync)  # noqa: F841 (the PE holds its device weakly: kept alive for the run)
    if memories:
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            run(pe)
        # every effect has been applied: let them go (they hold a record per stage; the analysis never reads them)
        pe.table.effects = [None] * len(pe.table)
        return _finish(pe, progs, (), SteadyState("full", reason=why_full))
    if not steady_state or not any(p.loops for p in progs):
        run(pe)
        return _finish(pe, progs, (), SteadyState(
            "full", reason=why_full if not steady_state else "the program has no tl.range loop"))
    watcher = Steady(prog)
    run(pe, on_boundary=watcher)
    return _finish(pe, progs, watcher.insertions, watcher.state("no loop was accelerated"))


def _finish(pe: PeState, progs: Sequence[Program], insertions: Sequence["Insertion"],
            state: SteadyState) -> tuple[Timeline, Schedule, SteadyState]:
    for x, (r, w, _) in pe.moved.items():  # the commands that crossed a jump keep their own footprints
        pe.ctab.reads[x], pe.ctab.writes[x] = r, w
    commands = progs[0].trace.commands if len(progs) == 1 else _Concat([p.trace.commands for p in progs])
    loops = tuple(lp for p in progs for lp in p.loops)
    sched = schedule_of(pe, commands, loops)
    tl = timeline_of(pe, sched)
    if not insertions:
        return tl, sched, state
    from .expand import expand

    xs, xt = expand(progs[0], sched, tl, insertions, pe.waited,
                    list(zip(pe.launch_first, pe.launch_start)), pe.after_at)
    return xt, xs, state


class _Concat(LazyRows):
    """The commands of several launches, one after another (each launch's own sequence, instantiated on access)."""

    what = "command"

    def __init__(self, parts: Sequence[Sequence]):
        self._parts = list(parts)
        self._starts = [0]
        for p in self._parts:
            self._starts.append(self._starts[-1] + len(p))

    def __len__(self) -> int:
        return self._starts[-1]

    def _at(self, i: int) -> Any:
        k = bisect.bisect_right(self._starts, i) - 1
        return self._parts[k][i - self._starts[k]]

    def __iter__(self):
        for p in self._parts:
            yield from p

    def __repr__(self) -> str:
        return f"Commands({len(self)} commands in {len(self._parts)} launches)"


def flows_state(dev: DeviceState, t: int, s0: dict[int, int]) -> tuple:
    """Every contended channel's active flows at ``t``: ``(pe, seq − s0[pe], units left)``, sorted."""
    out = []
    for c in sorted(dev.channels):
        fc = dev.channels[c]
        fc._advance(t)  # rates are constant until the next join or leave: advancing to t changes nothing ahead
        out.append((c, tuple(sorted((p, q - s0[p], left) for (p, q), left in fc.flows.items()))))
    return tuple(out)


@dataclass(eq=False)
class _Joint:
    """What the device steady state has seen of one regime at boundaries of one PE's loop."""

    seen: dict[tuple, tuple] = field(default_factory=dict)  # state -> (t, per PE (i, c, s) or None)
    watched: int = 0


class GroupSteady:
    """The steady state of a group of PEs sharing channels (DESIGN.md §12, §14), called at every boundary of
    any PE's loop.

    The state compared is every PE's (:func:`canonical`: each PE in a ``tl.range`` loop, with the next
    command to lower the first of an iteration, or finished) and every flow's (:func:`flows_state`), at a
    boundary of one PE's loop. When the state at ``t2`` equals the one at ``t1``, shifted by ``t2 − t1``,
    the device repeats: PE x advances ``p_x`` iterations per ``t2 − t1`` cycles. ``k`` such periods are
    inserted at once for every PE, ``k`` stopping short of the earliest loop end among the PEs (each keeps
    a period and ``cmd_queue_depth`` commands before its loop's last iteration); then the run goes on and
    tries again, in the new regime (which PEs are in which loop, which have finished).

    States are compared at the boundaries of one PE at a time, the *sampler*: the first PE whose boundary finds
    every PE at one (each PE's boundaries make a sequence of samples of their own, and a repeat is proven
    within one sequence, so sampling every PE's would compute every PE's state once per PE per period, for
    the same proof). Another PE takes over when the sampler has finished or gone quiet (the other PEs have had
    more boundaries than the group has PEs since its last), when more than :data:`SAMPLER_MISSES` of its
    boundaries in a row found some PE elsewhere, or when it has spent its budget of boundaries. Which PE
    samples changes when a repeat is proven, never what the run computes.
    """

    def __init__(self, pes: Sequence[PeState]):
        self.pes = list(pes)
        self.sampler: PeState | None = None
        self.idle = 0    # other PEs' boundaries since the sampler's last
        self.misses = 0  # the sampler's boundaries in a row that found a PE elsewhere
        #: what stopped the last try: (PE, None, launch) for a PE not at a boundary, (PE, loop, launch) for a
        #: PE in a loop that cannot be accelerated or with too little of it left for a period
        self.blocker: tuple | None = None
        self.watches: dict[int, _Watch] = {}
        self.insertions: dict[int, list[Insertion]] = {q.pe: [] for q in self.pes}
        self.regime: tuple | None = None
        self.joint: dict[tuple, _Joint] = {}
        self.first: tuple[int, int] | None = None
        self.budget_spent = False

    @staticmethod
    def _finished(q: PeState) -> bool:
        return q.cursor.done and q.launch + 1 >= len(q.launches) and q.in_flight == 0 \
            and q.next_dispatch >= q.n_lowered

    def __call__(self, dev: DeviceState, P: PeState, t: int) -> None:
        s = self.sampler
        if s is P:
            self.idle = 0
        elif s is not None:
            self.idle += 1
            if self.idle <= len(self.pes) and not self._finished(s):
                return  # another PE's boundaries are being sampled
            self.sampler = None  # it has gone quiet (straight-line code, finished): another PE may sample
        if self._sample(dev, P, t):
            self.sampler, self.misses = P, 0
        elif self.sampler is P:
            self.misses += 1
            if self.misses > SAMPLER_MISSES:
                self.sampler = None  # its boundaries keep missing the others': another PE may sample

    def _sample(self, dev: DeviceState, P: PeState, t: int) -> bool:
        """Compare the device's state at this boundary of ``P`` with the earlier ones (and jump on a repeat);
        False when nothing could be compared here: a PE not at a boundary, ``P``'s budget spent, or no room
        for a period."""
        b = self.blocker  # what stopped the last try, asked first: it most often stops this one too
        if b is not None:
            q, loop, launch = b
            if not self._finished(q):
                at = q.cursor.at_boundary() if q.opened >= q.launch else None
                if at is None or (at[0] is loop and q.launch == launch):
                    return False  # q is still elsewhere, or still in the loop that stopped the last try
        pos: list[tuple[Loop, int, _Watch] | None] = []
        for q in self.pes:
            if self._finished(q):
                pos.append(None)
                continue
            at = q.cursor.at_boundary() if q.opened >= q.launch else None  # (waiting for a launch: elsewhere)
            if at is None:
                self.blocker = (q, None, q.launch)
                return False  # a PE in straight-line code or mid-iteration: nothing repeats now
            w = _watch(self.watches, at[0], q.cursor.program)
            if w.why_not is not None:
                self.blocker = (q, at[0], q.launch)  # its loop cannot be accelerated: not while q is in it
                return False
            pos.append((at[0], at[1], w))
        regime = tuple(None if x is None else (q.launch, id(x[0])) for q, x in zip(self.pes, pos))
        if regime != self.regime:
            self.regime, self.joint = regime, {}
        key = (P.pe, id(pos[self.pes.index(P)][0]))
        j = self.joint.get(key)
        if j is None:
            j = self.joint[key] = _Joint()
        periods = [x[2].period for x in pos if x is not None]
        j.watched += 1
        if j.watched > WATCH + 4 * max(periods, default=1):
            if self.sampler is P:
                self.sampler = None  # its budget is spent: another PE may try
            return False
        # every PE in a loop must have room for a period beyond the one that proves it
        depth = P.cursor.program.topo.cmd_queue_depth
        keeps = []
        for q, x in zip(self.pes, pos):
            if x is None:
                keeps.append(0)
                continue
            loop, i, w = x
            keep = w.period + -(-depth // len(loop.body)) + 1
            if loop.iterations - i < keep + w.period:
                self.blocker = (q, loop, q.launch)  # its iterations only grow: too few left until it leaves
                return False
            keeps.append(keep)
        parts = []
        pending = events_by_pe(dev)
        for q, x in zip(self.pes, pos):
            if x is None:
                parts.append(("done",))
                continue
            st = canonical(dev, q, t, x[1] % x[2].period, pending.get(q.pe, ()))
            if st is None:
                return True  # it refers to a command outside its loop (early in it): none to compare yet
            parts.append(st)
        parts.append(flows_state(dev, t, {q.pe: len(q.start) for q in self.pes}))
        state = tuple(parts)
        now = tuple(None if x is None else (x[1], q.n_lowered, len(q.start)) for q, x in zip(self.pes, pos))
        hit = j.seen.get(state)
        if hit is None:
            j.seen[state] = (t, now)
            return True
        t1, then = hit
        k = None
        for q, x, a, b, keep in zip(self.pes, pos, then, now, keeps):
            if x is None:
                continue
            p = b[0] - a[0]
            if p <= 0:
                return True
            room = (x[0].iterations - b[0] - keep) // p
            k = room if k is None else min(k, room)
        if not k or k < 1:
            return True
        for q, x, a, b in zip(self.pes, pos, then, now):
            if x is None:
                continue
            loop = x[0]
            ins = Insertion(loop, a[0], b[0], a[1], b[1], a[2], b[2], t1, t, k, q.cursor.program)
            jump(q, ins)
            self.insertions[q.pe].append(ins)
            dt = ins.k * ins.dt
            w = x[2]
            w.outcome = (f"steady with the device: period {ins.p} iterations ({t - t1} cycles) proven at "
                         f"iteration {b[0]} against iteration {a[0]}; {k} periods inserted")
        dev.shift += dt  # every PE not finished moved on as far: the simulated clock runs that far behind the real one
        if self.first is None:
            x = pos[self.pes.index(P)]
            self.first = (now[self.pes.index(P)][0] - then[self.pes.index(P)][0], now[self.pes.index(P)][0])
        self.joint = {}  # what was seen lies before the jump: start afresh in the moved numbering
        return True

    def state(self, q: PeState, progs: Sequence[Program], why_full: str) -> SteadyState:
        loops = [lp for p in progs for lp in p.loops]
        lines = tuple(f"loop {n}: {self.watches[id(lp)].outcome if id(lp) in self.watches and self.watches[id(lp)].outcome else 'simulated in full'}"
                      for n, lp in enumerate(loops))
        ins = self.insertions[q.pe]
        if not ins:
            return SteadyState("full", reason=why_full, loops=lines)
        return SteadyState("steady", ins[0].p, ins[0].i2, None, sum(x.k for x in ins), lines)


def simulate_group(progs: Sequence[Sequence[Program]], memories: Sequence[Sequence[Any]] | None,
                   channels: dict, *, steady_state: bool = True, why_full: str = "steady_state=False",
                   after: Sequence[Sequence[tuple]] = (), sync: int = 0, begins: Sequence[int] = (),
                   outer_after: Sequence[Sequence[int]] = (), cmd_offsets: Sequence[int] = ()
                   ) -> list[tuple[Timeline, Schedule, SteadyState]]:
    """Run several PEs that share contended channels in one event loop: PE ``i`` runs the launches ``progs[i]``;
    in timing mode with the device steady state (:class:`GroupSteady`) unless ``steady_state`` is False.
    ``after[i]``: PE ``i``'s launches' dependencies, ``(place in the group, launch index)`` pairs, ``sync`` their
    signal latency (DESIGN.md §16). ``begins[i]``, ``outer_after[i]``, ``cmd_offsets[i]``: PE ``i`` going on from
    launches simulated in another loop (:func:`~kbwork.device.loop.new_pe`; :mod:`.cut`).

    Returns:
        Per PE, as :func:`simulate_pe` does.
    """
    from .loop import device as make_device

    pes = [new_pe(ps[0], launches=ps[1:], memories=() if memories is None else memories[i],
                  after=after[i] if after else (), begin=begins[i] if begins else 0,
                  outer_after=outer_after[i] if outer_after else (), cmd_offset=cmd_offsets[i] if cmd_offsets else 0)
           for i, ps in enumerate(progs)]
    dev = make_device(pes, channels, sync)
    if memories is not None:
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            run(dev)
        for pe in pes:
            pe.table.effects = [None] * len(pe.table)
        return [_finish(pe, ps, (), SteadyState("full", reason=why_full)) for pe, ps in zip(pes, progs)]
    if not steady_state or not any(p.loops for ps in progs for p in ps):
        run(dev)
        why = why_full if not steady_state else "the program has no tl.range loop"
        return [_finish(pe, ps, (), SteadyState("full", reason=why)) for pe, ps in zip(pes, progs)]
    watcher = GroupSteady(pes)
    run(dev, on_boundary=watcher)
    return [_finish(pe, ps, watcher.insertions[pe.pe], watcher.state(pe, ps, "no loop was accelerated"))
            for pe, ps in zip(pes, progs)]
