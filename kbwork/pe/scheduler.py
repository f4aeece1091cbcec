"""PE_SCHEDULER: every command becomes DISPATCH + PLAN + its plan's stages, a command at a time.

A launch's :class:`Program` is the static part of its schedule: the trace
(:mod:`kbwork.pe.program`: plain commands and ``tl.range`` loops), and for
every command what it costs to dispatch and plan, its hazard footprint (the
byte ranges it reads and writes) and its plan's stages. It lowers commands
*on demand* and in program order, through a :class:`Cursor` that appends
each command's stages to a stage table (seq = creation order: for each
command its DISPATCH, its PLAN, then its plan stages) and advances the
staging ring. A loop body's command is planned once — in timing mode as a
:class:`~kbwork.pe.templates.PlanTemplate` — and every iteration is that
template stamped with the iteration's handle names and ring position: the
body is lowered once, instantiated many times (DESIGN.md §13).

The event loop (:mod:`kbwork.device`) drives the cursor as the PE dispatches,
so a long loop is never lowered ahead of what is simulated; :func:`schedule`
lowers a whole list of commands at once (a :class:`Schedule`, what tests
and the analysis read). The dynamic part (queue depth, hazard holds, engine
arbitration) happens in the event loop. This module is recipe-free: it sees
flat op lists only.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, Protocol, Sequence

from ..config import Topology
from ..errors import SimulationError
from ..memory import Handle, LoopHandle
from .commands import Command, CompositeCmd, DmaCmd, dispatch_cycles
from .engines import Latency
from .program import Loop, Plain, Trace
from ..symbolic import Index
from .stages import Engine, Phase, RawStageTable, StageKind, StageTable
from .engines import BINDERS, StagingRef
from .templates import (PLAN_CACHE, SEEN_ONCE, UNSEEN, CommandTemplate, PlanTemplate,
                        path_handles, record, record_effects, signature_key, stamp)
from .tiling import StagingRing, generate_plan_from_ops

#: A byte range in one memory: (space is TCM, first byte, one past the last); ``Handle.span``.
Range = tuple[bool, int, int]

_DISPATCH, _PLAN = int(StageKind.DISPATCH), int(StageKind.PLAN)
_E_CPU, _E_SCHED = int(Engine.PE_CPU), int(Engine.PE_SCHEDULER)
_P_DISPATCH, _P_PLAN = int(Phase.DISPATCH), int(Phase.PLAN)


def _handles(cmd: Command) -> tuple[list[Handle], list[Handle]]:
    """The handles ``cmd`` reads and writes (DESIGN.md §5): reads are every operand; writes every ``out``,
    the ``rw_handles`` and the recipe scratch."""
    if isinstance(cmd, DmaCmd):
        return [cmd.src], [cmd.dst]
    ops = cmd.ops
    reads = [h for op in ops for h in op.operands.values()]
    writes = [op.out for op in ops if op.out is not None] + list(cmd.rw_handles) + list(cmd.scratch)
    return reads, writes


def footprint(cmd: Command) -> tuple[tuple[Range, ...], tuple[Range, ...]]:
    """The byte ranges ``cmd`` reads and writes, for hazard tracking (DESIGN.md §5).

    Reads are every operand handle; writes are every ``out`` plus the
    ``rw_handles``. Recipe scratch is the ``out`` of the recipe's ops, so it
    counts as written: commands sharing scratch are ordered, and bytes a
    scratch scope released are not overwritten while a command using them is
    in flight. (The scheduler's staging buffers never appear in ops; the
    staging ring orders them.)
    """
    if isinstance(cmd, DmaCmd):
        return (cmd.src.span,), (cmd.dst.span,)
    ops = cmd.ops
    try:
        reads = dict.fromkeys([s for op in ops for s in op.read_spans])
    except TypeError:  # an op whose operands are not handles: let the handles say what is wrong
        reads = dict.fromkeys([h.span for op in ops for h in op.operands.values()])
    writes = dict.fromkeys([op.out.span for op in ops if op.out is not None]
                           + [h.span for h in cmd.rw_handles] + [h.span for h in cmd.scratch])
    return tuple(reads), tuple(writes)


def conflicts(reads_a: tuple[Range, ...], writes_a: tuple[Range, ...],
              reads_b: tuple[Range, ...], writes_b: tuple[Range, ...]) -> bool:
    """True when a's reads or writes overlap b's writes, or a's writes overlap b's reads."""
    # one function, no helper per pair of lists: the event loop asks this at every PLAN, of every command in
    # flight, and a call costs more than the few comparisons it makes
    for s2, lo2, hi2 in writes_b:
        for s1, lo1, hi1 in reads_a:
            if s1 == s2 and lo1 < hi2 and lo2 < hi1:
                return True
        for s1, lo1, hi1 in writes_a:
            if s1 == s2 and lo1 < hi2 and lo2 < hi1:
                return True
    for s2, lo2, hi2 in reads_b:
        for s1, lo1, hi1 in writes_a:
            if s1 == s2 and lo1 < hi2 and lo2 < hi1:
                return True
    return False


class CommandTable:
    """Per lowered command, in the order lowered: what the event loop and the analysis read of it.

    ``cmd``: its id in the launch's program order; ``dispatch_seq``: its
    DISPATCH's seq (its PLAN's is the next); ``plan_end``: one past its last
    stage; ``reads``/``writes``: its hazard footprint; ``waits``: the
    commands ``tl.wait`` put before it, as positions in this table;
    ``label``, ``iter``, ``logical_bytes``, ``dispatch`` (cycles); ``loop``,
    ``iteration``, ``body``: the ``tl.range`` loop, iteration and body index
    it belongs to (``None``, -1, -1 outside loops).
    """

    __slots__ = ("cmd", "dispatch_seq", "plan_end", "reads", "writes", "waits", "label", "iter", "logical_bytes",
                 "dispatch", "loop", "iteration", "body")

    def __init__(self):
        for name in self.__slots__:
            setattr(self, name, [])

    def __len__(self) -> int:
        return len(self.cmd)

    def __repr__(self) -> str:
        return f"CommandTable({len(self)} commands)"

    def append(self, real: int, d: int, e: int, reads: tuple, writes: tuple, waits: tuple, label: str, it: int,
               logical_bytes: int, dispatch: int, loop: "Loop | None" = None, iteration: int = -1,
               body: int = -1) -> None:
        for name, v in zip(self.__slots__, (real, d, e, reads, writes, waits, label, it, logical_bytes, dispatch,
                                            loop, iteration, body)):
            getattr(self, name).append(v)


@dataclass(eq=False)
class _BodyCommand:
    """A loop body's command, planned once: what every iteration of it stamps."""

    dispatch: int
    plan: int
    template: CommandTemplate | None
    paths: tuple               # the handles whose names the template's stages carry, per iteration
    effects: tuple | None      # data mode: the plan stages' effect templates (``templates.record_effects``)
    reads: tuple               # how each footprint entry is made per iteration (``_span_maker``)
    writes: tuple
    taken: dict[str, int]      # staging buffers taken per slot per iteration


def _span_maker(h: Handle) -> tuple:
    """How a footprint entry is made in iteration ``i``: ``(0, span)`` fixed, ``(1, tcm, addr, stride,
    nbytes)`` a row slice moving ``stride`` bytes per iteration, ``(2, spans, a, b)`` ring slot ``(a·i + b) mod n``
    of a ring whose slots have ``spans``, or ``(3, handle)`` anything else (``handle.span_at``)."""
    if h.__class__ is not LoopHandle:
        return (0, h.span)
    if h.kind == "rows":
        return (1, h.span[0], h.addr, h.stride, h.nbytes)
    if h.kind == "ring" and not h.chain:
        return (2, tuple(x.span for x in h.slots), h.slot.a, h.slot.b)
    if h.kind == "named" and not h.chain:
        return (0, h.span)
    return (3, h)


def _spans_at(makers: tuple, i: int) -> tuple[Range, ...]:
    out = []
    for m in makers:
        k = m[0]
        if k == 0:
            out.append(m[1])
        elif k == 1:
            lo = m[2] + m[3] * i
            out.append((m[1], lo, lo + m[4]))
        elif k == 2:
            spans = m[1]
            out.append(spans[(m[2] * i + m[3]) % len(spans)])
        else:
            out.append(m[1].span_at(i))
    return tuple(dict.fromkeys(out))


class Program:
    """The static schedule of one launch (DESIGN.md §5, §13): lowered a command at a time by a :class:`Cursor`.

    Attributes:
        trace: the launch as traced (commands and loops).
        topo: the topology.
        with_effects: data mode (every stage carries its effect; no templates).
        staging_base: TCM address of the scheduler's staging buffers.
        n_commands: how many commands the launch has.
        loops: the trace's loops (first command, commands per iteration, count, period).
        scale: engine -> speedup: every stage of that engine takes ``ceil(d / speedup)`` cycles instead of
            ``d`` (``analysis.what_if``); empty for the machine as it is.
    """

    def __init__(self, trace: Trace, topo: Topology, *, with_effects: bool = False, staging_base: int = 0,
                 templates: bool = True, scale: dict[int, Any] | None = None):
        self.trace = trace
        self.topo = topo
        self.with_effects = with_effects
        self.staging_base = staging_base
        self.templates = templates
        self.scale = dict(scale or {})
        self.n_commands = trace.n_commands
        self._body: dict[tuple[int, int], _BodyCommand] = {}
        self._commands: dict[tuple, CommandTemplate] = {}  # (plan signature, logical bytes) -> template
        self._dispatch: dict[int, int] = {}    # logical bytes -> dispatch cycles
        self._plan_cycles: dict[int, int] = {}  # ops -> plan cycles

    @property
    def loops(self) -> tuple:
        """The trace's loops (read from the trace when asked: a replicated launch's trace is never made)."""
        return self.trace.loops

    # made when the program is first lowered: a device's replicated launches never are
    @functools.cached_property
    def latency(self) -> Latency:
        """The topology's stage latencies."""
        return Latency(self.topo)

    @functools.cached_property
    def _plans(self) -> "PlanTable | None":
        return PLAN_CACHE.plans_for(self.topo) if self.templates else None

    def __repr__(self) -> str:
        return f"Program({self.n_commands} commands, {len(self.loops)} loops, {self.topo.name})"

    def cursor(self, table: StageTable, commands: CommandTable, cmd_offset: int = 0) -> "Cursor":
        """A cursor that lowers this program's commands, in order, into ``table`` and ``commands`` (their ids in
        program order counted from ``cmd_offset``: a launch after others on the same PE)."""
        return Cursor(self, table, commands, cmd_offset)

    # --- per-command costs ----------------------------------------------------------------
    def dispatch_of(self, logical_bytes: int) -> int:
        dc = self._dispatch.get(logical_bytes)
        if dc is None:
            t = self.topo
            dc = self._dispatch[logical_bytes] = self._scaled(
                _E_CPU, dispatch_cycles(logical_bytes, t.fixed_cycles, t.r_fraction, t.max_composite_logical_bytes))
        return dc

    def plan_of(self, n_ops: int) -> int:
        pc = self._plan_cycles.get(n_ops)
        if pc is None:
            pc = self._plan_cycles[n_ops] = self._scaled(_E_SCHED, self.latency.plan(n_ops))
        return pc

    def _scaled(self, engine: int, d: int) -> int:
        s = self.scale.get(engine)
        return d if s is None else -(-d * s.denominator // s.numerator)

    def command_template(self, cmd: CompositeCmd, tpl: PlanTemplate) -> CommandTemplate:
        """The :class:`CommandTemplate` of a command planned by ``tpl`` (its DISPATCH and PLAN costs added)."""
        key = (id(tpl), cmd.logical_bytes, len(cmd.ops))
        ct = self._commands.get(key)
        if ct is None or ct.plan is not tpl:
            dur = tuple(self._scaled(e, d) for e, d in zip(tpl.engine, tpl.dur)) if self.scale else None
            ct = self._commands[key] = CommandTemplate.of(tpl, cmd.logical_bytes, self.dispatch_of(cmd.logical_bytes),
                                                          self.plan_of(len(cmd.ops)), dur)
        return ct

    def body_command(self, loop: Loop, k: int) -> _BodyCommand:
        """Body command ``k`` of ``loop``, planned once (the plan of iteration 0, which every iteration repeats)."""
        key = (loop.number, k)
        bc = self._body.get(key)
        if bc is None:
            cmd = loop.body[k]
            tpl = None
            if self.templates and not isinstance(cmd, DmaCmd):
                sig = signature_key(cmd)
                if sig is not None:
                    got = self._plans.get(sig)
                    if got.__class__ is PlanTemplate:
                        tpl = got
                    else:  # a body repeats by construction: record its template at first sight
                        tpl = record(cmd, self.topo, self.latency)
                        self._plans.put(sig, tpl)
            reads, writes = _handles(cmd)
            effects = None
            if tpl is not None:
                paths = tuple((cmd.ops[oi].out if port is None else cmd.ops[oi].operands[port])
                              for oi, port in tpl.paths)
                taken = {slot: n for slot, n, _ in tpl.ring}
                ct = self.command_template(cmd, tpl)
                if self.with_effects:
                    effects = record_effects(cmd, self.topo, self.latency)
            else:
                paths, ct = (), None
                taken = _taken(cmd, self.topo, self.latency)
            n_ops = 1 if isinstance(cmd, DmaCmd) else len(cmd.ops)
            bc = self._body[key] = _BodyCommand(
                self.dispatch_of(cmd.logical_bytes), self.plan_of(n_ops), ct, paths, effects,
                tuple(dict.fromkeys(_span_maker(h) for h in reads)),
                tuple(dict.fromkeys(_span_maker(h) for h in writes)), taken)
        return bc

    def loop_period(self, loop: Loop) -> int:
        """The loop's period in iterations: the lcm of its rings' periods and of the staging ring's (the
        buffers a loop takes per iteration cycle through ``tile_buffers`` in some whole number of iterations)."""
        n = self.topo.tile_buffers
        per_slot: dict[str, int] = {}
        for k in range(len(loop.body)):
            for slot, taken in self.body_command(loop, k).taken.items():
                per_slot[slot] = per_slot.get(slot, 0) + taken
        return math.lcm(loop.period, *(n // math.gcd(t, n) for t in per_slot.values() if t))


def _taken(cmd: Command, topo: Topology, lat: Latency) -> dict[str, int]:
    """Staging buffers per slot the plan of ``cmd`` takes (planned into a scratch table)."""
    ring = StagingRing(topo)
    generate_plan_from_ops(cmd, topo, RawStageTable(), ring, lat, after=(0,))
    return {slot: n for slot, n in ring._count.items() if n}


@dataclass(eq=False)
class _IterationTemplate:
    """One whole iteration of a loop whose body commands all have templates: their columns concatenated."""

    cts: tuple[CommandTemplate, ...]
    kind: tuple
    engine: tuple
    phase: tuple
    op_kind: tuple
    tile: tuple
    k_tile: tuple
    nbytes: tuple
    dur: tuple
    lpreds: tuple
    lsucc: tuple
    npred: tuple
    chan: tuple                 # per stage: the HBM channel a DMA stage moves bytes on, -1 otherwise
    sizes: tuple                # per command: its number of stages
    doff: tuple                 # per command: its DISPATCH offset
    eoff: tuple                 # per command: one past its last stage
    tensor: tuple               # per stage: its name when it names no handle ("")
    named: tuple                # (stage, index into the iteration's flat list of names) of the others
    name_base: tuple            # per command: where its names start in that list
    ring_users: tuple           # commands that take staging buffers or wait for their previous consumers
    fixed_fp: tuple             # per command: (reads, writes) when they do not move with the index, else None
    iters: tuple
    labels: tuple
    logical_bytes: tuple
    dispatch: tuple


def _name_iterations(prog: "Program", loop: Loop, it: _IterationTemplate, i0: int, m: int, ib0: int,
                     col: list[str]) -> None:
    """Write the handle names of iterations ``i0 .. i0 + m - 1`` (lowered from seq ``ib0``) into the tensor
    column ``col``."""
    n = len(it.kind)
    paths = [prog.body_command(loop, k).paths for k in range(len(it.cts))]
    for j in range(m):
        i, ib = i0 + j, ib0 + j * n
        names: list[str] = []
        for k, ct in enumerate(it.cts):
            hn = [h.name_at(i) if h.__class__ is LoopHandle else h.name for h in paths[k]]
            names += [t if t.__class__ is str else "|".join([hn[x] for x in t]) for t in ct.plan.tensors]
        for row, x in it.named:
            col[ib + row] = names[x]


def _iteration_template(prog: "Program", loop: Loop) -> _IterationTemplate | None:
    bcs = [prog.body_command(loop, k) for k in range(len(loop.body))]
    if any(bc.template is None for bc in bcs):
        return None
    cols: dict[str, list] = {n: [] for n in ("kind", "engine", "phase", "op_kind", "tile", "k_tile", "nbytes", "dur",
                                             "lpreds", "lsucc", "npred", "chan")}
    sizes, doff, eoff, named, name_base, ring_users, fixed_fp = [], [], [], [], [], [], []
    off = names = 0
    for k, bc in enumerate(bcs):
        ct = bc.template
        for n in cols:
            cols[n] += getattr(ct, n) if n != "chan" else [bc.paths[x].channel if x >= 0 else -1 for x in ct.chan]
        doff.append(off)
        sizes.append(len(ct))
        n_names = len(ct.plan.tensors)
        named += [(off + row, names + x) for row, x in enumerate(ct.tensor)
                  if x >= 0 and ct.plan.tensors[x] != ""]
        name_base.append(names)
        names += n_names
        off += len(ct)
        eoff.append(off)
        if ct.ext_rows or ct.plan.ring:
            ring_users.append(k)
        moving = any(m[0] != 0 for m in bc.reads + bc.writes)
        fixed_fp.append(None if moving else (_spans_at(bc.reads, 0), _spans_at(bc.writes, 0)))
    return _IterationTemplate(tuple(b.template for b in bcs), *(tuple(cols[n]) for n in cols), tuple(sizes),
                              tuple(doff), tuple(eoff), ("",) * off, tuple(named), tuple(name_base), tuple(ring_users),
                              tuple(fixed_fp), loop.iters, tuple(c.label for c in loop.body),
                              tuple(c.logical_bytes for c in loop.body), tuple(b.dispatch for b in bcs))


class Cursor:
    """Lowers a :class:`Program`'s commands in program order into a stage table and a command table.

    Each :meth:`lower` appends the next block — one plain command, or a
    whole loop iteration — (each command's DISPATCH, PLAN and plan stages,
    with the command ids the caller gives: the event loop numbers the
    commands it simulates) and advances the staging ring. :meth:`skip`
    moves past whole periods of a loop without lowering them (the steady
    state inserts them instead). After a :meth:`lower`, ``ext_edges`` holds
    ``(stage, earlier stage)`` for every dependency of the new plan stages
    on an earlier command's stage (the staging ring's previous consumers).

    ``reach`` is how many commands back a plan stage's dependency has
    reached so far.
    """

    def __init__(self, program: Program, table: StageTable, commands: CommandTable, cmd_offset: int = 0):
        self.program = program
        self.topo = program.topo
        self.table = table
        self.commands = commands
        self.cmd_offset = cmd_offset
        self.ring = StagingRing(program.topo, program.staging_base)
        self.next = 0           # the next command to lower (its id in program order)
        self.reach = 0
        self.ext_edges: list[tuple[int, int]] = []
        self._last_dispatch: int | None = None
        self._last_plan: int | None = None
        self._seg_index = 0
        self._iter_tpl: dict[int, _IterationTemplate | None] = {}

    def __repr__(self) -> str:
        return f"Cursor(next command #{self.next} of {self.program.n_commands})"

    @property
    def done(self) -> bool:
        return self.next >= self.program.n_commands

    def _segment(self):
        segs = self.program.trace.segments
        while segs[self._seg_index].end_cmd <= self.next:
            self._seg_index += 1
        return segs[self._seg_index]

    def at_boundary(self) -> tuple[Loop, int] | None:
        """``(loop, iteration)`` when the next command is the first of a loop iteration, else None."""
        if self.next >= self.program.n_commands:
            return None
        seg = self._segment()
        if isinstance(seg, Loop):
            i, k = seg.where(self.next)
            if k == 0:
                return seg, i
        return None

    def skip(self, loop: Loop, iterations: int) -> None:
        """Move past ``iterations`` whole iterations of ``loop`` (a whole number of its periods)."""
        # a whole number of periods takes each staging buffer a whole number of times round: the consumers
        # stay where they are, only the counts move on
        for k in range(len(loop.body)):
            for slot, taken in self.program.body_command(loop, k).taken.items():
                self.ring._count[slot] += iterations * taken
        self.next += iterations * len(loop.body)

    def lower(self, cid: int, iterations: int = 1) -> int:
        """Lower the next block — a plain command, or up to ``iterations`` whole loop iterations — its first
        command numbered ``cid`` and the others after it; return how many commands it lowered."""
        seg = self._segment()
        if isinstance(seg, Loop):
            i, k = seg.where(self.next)
            if k == 0:
                it = self._iter_tpl.get(seg.number, False)
                if it is False:
                    it = self._iter_tpl[seg.number] = _iteration_template(self.program, seg)
                if it is not None:
                    m = min(iterations, seg.iterations - i)
                    self._lower_iterations(seg, it, i, m, cid)
                    return m * len(seg.body)
            self._lower_loop_command(seg, i, k, cid)
            return 1
        self._lower_plain(seg.commands[self.next - seg.first_cmd], cid)
        return 1

    def _lower_iterations(self, loop: Loop, it: _IterationTemplate, i0: int, m: int, cid: int) -> None:
        """Lower iterations ``i0 .. i0 + m - 1`` of ``loop`` from its iteration template, commands numbered from
        ``cid``: the columns every iteration repeats are extended once for all ``m``."""
        prog, table, ctab = self.program, self.table, self.commands
        real0 = self.next
        K = len(loop.body)
        self.next += m * K
        ib0 = len(table)
        n = len(it.kind)
        table.kind += it.kind * m
        table.engine += it.engine * m
        table.phase += it.phase * m
        table.op_kind += it.op_kind * m
        table.tile += it.tile * m
        table.k_tile += it.k_tile * m
        table.nbytes += it.nbytes * m
        table.dur += it.dur * m
        table.effects += [None] * (n * m)
        table.chan += it.chan * m
        table.lpreds += it.lpreds * m
        table.lsucc += it.lsucc * m
        table.npred += it.npred * m
        table._tensor += it.tensor * m
        if it.named:  # the names wait until someone reads them (the op_log); the event loop does not
            table.pending_names.append(lambda col: _name_iterations(prog, loop, it, i0, m, ib0, col))
        cmd_col, cbase = table.cmd, table.cbase
        doff, eoff, sizes = it.doff, it.eoff, it.sizes
        for j in range(m):
            c0 = cid + j * K
            for k in range(K):
                cmd_col += [c0 + k] * sizes[k]
        cbase += [ib0 + j * n + o for j in range(m) for o in doff]
        xpreds = table.xpreds
        xpreds += [()] * (n * m)
        prev_d, prev_p = self._last_dispatch, self._last_plan
        ext_edges: list[tuple[int, int]] = []
        ring = self.ring
        nb = ring.n_buffers
        count, consumer = ring._count, ring._consumer
        effects = table.effects if prog.with_effects else None
        for j in range(m):
            ib = ib0 + j * n
            for k in range(K):  # program order: each DISPATCH after the previous one, each PLAN after the previous
                d = ib + doff[k]
                xpreds[d] = () if prev_d is None else (prev_d,)
                xpreds[d + 1] = () if prev_p is None else (prev_p,)
                prev_d, prev_p = d, d + 1
            if effects is not None:
                self._bind_effects(loop, it, i0 + j, cid + j * K, ib, effects)
            for k in it.ring_users:
                ct = it.cts[k]
                base = ib + doff[k]
                if ct.ext_rows:
                    ext = {code: consumer[slot][(count[slot] + r) % nb] for code, slot, r in ct.plan.externals}
                    for row, codes in ct.ext_rows:
                        xs = tuple(q for q in (ext[c] for c in codes) if q is not None)
                        if xs:
                            xpreds[base + row] = xs
                            ext_edges += [(base + row, q) for q in xs]
                for slot, taken, binds in ct.plan.ring:
                    n0 = count[slot]
                    count[slot] = n0 + taken
                    consumers = consumer[slot]
                    for r, local in binds:
                        consumers[(n0 + r) % nb] = base + 2 + local
        self._last_dispatch, self._last_plan = prev_d, prev_p
        self.ext_edges = ext_edges
        self._note_reach(ext_edges)
        # the commands
        ctab.cmd += range(self.cmd_offset + real0, self.cmd_offset + real0 + m * K)
        ctab.dispatch_seq += [ib0 + j * n + o for j in range(m) for o in doff]
        ctab.plan_end += [ib0 + j * n + o for j in range(m) for o in eoff]
        reads, writes = ctab.reads, ctab.writes
        for j in range(m):
            i = i0 + j
            for k, fp in enumerate(it.fixed_fp):
                if fp is None:
                    bc = prog.body_command(loop, k)
                    reads.append(_spans_at(bc.reads, i))
                    writes.append(_spans_at(bc.writes, i))
                else:
                    reads.append(fp[0])
                    writes.append(fp[1])
        if prog.trace.has_waits(loop):
            ctab.waits += [self._waits(real0 + x) for x in range(m * K)]
        else:
            ctab.waits += [()] * (m * K)
        ctab.label += it.labels * m
        ctab.iter += [x.at(i0 + j) if x.__class__ is Index else x for j in range(m) for x in it.iters]
        ctab.logical_bytes += it.logical_bytes * m
        ctab.dispatch += it.dispatch * m
        ctab.loop += [loop] * (m * K)
        ctab.iteration += [i0 + j for j in range(m) for _ in range(K)]
        ctab.body += list(range(K)) * m

    def _bind_effects(self, loop: Loop, it: _IterationTemplate, i: int, cid: int, ib: int, effects: list) -> None:
        """Write the data-mode effects of iteration ``i`` (its first command numbered ``cid``, its first stage
        at ``ib``), each body command's as :meth:`_bind_command` does, the ring moving on between them."""
        count = dict(self.ring._count)
        memo: dict[int, Any] = {}
        for k, ct in enumerate(it.cts):
            self._bind_command(self.program.body_command(loop, k), i, cid + k, ib + it.doff[k], effects, count, memo)
            for slot, taken, _ in ct.plan.ring:
                count[slot] += taken

    def _bind_command(self, bc: "_BodyCommand", i: int, cid: int, d: int, effects: list, count: dict,
                      memo: dict) -> None:
        """Write the data-mode effects of body command ``bc`` in iteration ``i`` (numbered ``cid``, its DISPATCH at
        seq ``d``): its effect template bound to the iteration's handles, to the staging buffers the ring holds
        for it (``count``: the ring's takes before the command) and to its own accumulators."""
        ring = self.ring
        nb = ring.n_buffers

        def h(x):
            cls = x.__class__
            if cls is LoopHandle:
                y = memo.get(id(x))
                if y is None:
                    y = memo[id(x)] = x.at(i)
                return y
            if cls is StagingRef:
                return ring.handle(x.slot, (count[x.slot] + x.rel) % nb, x.shape, x.dtype)
            return x

        def key(kk: tuple) -> tuple:  # accumulators are keyed by the instance
            return (cid,) + kk[1:]
        base = d + 2
        for x, e in enumerate(bc.effects):
            if e is not None:
                effects[base + x] = BINDERS[e.__class__](e, h, key)

    def _lower_loop_command(self, loop: Loop, i: int, k: int, cid: int) -> None:
        prog, table = self.program, self.table
        real = self.next
        self.next += 1
        bc = prog.body_command(loop, k)
        body_cmd = loop.body[k]
        d = len(table)
        prev_d, prev_p = self._order(d)
        if bc.template is not None:
            count = dict(self.ring._count)  # the ring before the command takes its buffers
            self.ext_edges = stamp(bc.template, cid, [h.name_at(i) if h.__class__ is LoopHandle else h.name
                                                      for h in bc.paths], [h.channel for h in bc.paths], table,
                                   self.ring, prev_d, prev_p)
            if prog.with_effects:
                self._bind_command(bc, i, cid, d, table.effects, count, {})
            self._note_reach(self.ext_edges)
            reads, writes, label = _spans_at(bc.reads, i), _spans_at(bc.writes, i), body_cmd.label
        else:
            cmd = loop.command(i, k)
            self._generic(cmd, cid, bc.dispatch, bc.plan, prev_d, prev_p)
            reads, writes = footprint(cmd)
            label = cmd.label
        self.commands.append(self.cmd_offset + real, d, len(table), reads, writes,
                             self._waits(real) if prog.trace.has_waits(loop) else (), label,
                             loop.iter_label(i, k), body_cmd.logical_bytes, bc.dispatch, loop, i, k)

    def _lower_plain(self, cmd: Command, cid: int) -> None:
        prog, table = self.program, self.table
        real = self.next
        self.next += 1
        is_dma = isinstance(cmd, DmaCmd)
        dc = prog.dispatch_of(cmd.logical_bytes)
        pc = prog.plan_of(1 if is_dma else len(cmd.ops))
        d = len(table)
        prev_d, prev_p = self._order(d)
        tpl = self._cached_plan(cmd)
        if tpl is not None:
            handles = path_handles(cmd, tpl.paths)
            self.ext_edges = stamp(prog.command_template(cmd, tpl), cid, [h.name for h in handles],
                                   [h.channel for h in handles], table, self.ring, prev_d, prev_p)
            self._note_reach(self.ext_edges)
        else:
            self._generic(cmd, cid, dc, pc, prev_d, prev_p)
        reads, writes = footprint(cmd)
        self.commands.append(self.cmd_offset + real, d, len(table), reads, writes, self._waits(real), cmd.label,
                             cmd.iter, cmd.logical_bytes, dc)

    def _order(self, d: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        prev_d = () if self._last_dispatch is None else (self._last_dispatch,)
        prev_p = () if self._last_plan is None else (self._last_plan,)
        self._last_dispatch, self._last_plan = d, d + 1
        return prev_d, prev_p

    def _waits(self, real: int) -> tuple[int, ...]:
        """``tl.wait`` targets of command ``real``, as positions in the command table."""
        return tuple(self._position(self.cmd_offset + t) for t in self.program.trace.waits_of(real))

    def _position(self, target: int) -> int:
        ctab = self.commands
        # targets are earlier commands: search back from the end (a wait targets a recent command)
        cmd = ctab.cmd
        for pos in range(len(cmd) - 1, -1, -1):
            if cmd[pos] == target:
                return pos
            if cmd[pos] < target:
                break
        raise SimulationError(f"tl.wait on command #{target}, which the steady state moved past; a wait inside a "
                              f"tl.range body must name a command of its own iteration or one before the loop.")

    def _cached_plan(self, cmd: Command) -> PlanTemplate | None:
        """The plan cache's template for a plain command, if it has one; records it on the second sighting
        (a one-off command, the final store, never pays for recording)."""
        plans = self.program._plans
        if plans is None or isinstance(cmd, DmaCmd) or self.program.with_effects:
            return None
        key = signature_key(cmd)
        if key is None:
            return None
        tpl = plans.get(key)
        if tpl.__class__ is PlanTemplate:
            return tpl
        if tpl is UNSEEN:
            plans.put(key, SEEN_ONCE)
        elif tpl is SEEN_ONCE:
            plans.put(key, record(cmd, self.program.topo, self.program.latency))
        return None

    def _generic(self, cmd: Command, cid: int, dc: int, pc: int, prev_d: tuple, prev_p: tuple) -> None:
        """Lower ``cmd`` by planning it afresh (data mode, and commands no template covers)."""
        prog, table = self.program, self.table
        if cid != cmd.completion.cmd:  # plans name their command; effects key accumulators by it
            cmd = _renumbered(cmd, cid)
        is_dma = isinstance(cmd, DmaCmd)
        kind = "dma" if is_dma else "composite"
        d = table.begin()
        table.add(_DISPATCH, _E_CPU, _P_DISPATCH, cid, kind, -1, -1, "", cmd.logical_bytes, dc, prev_d)
        table.add(_PLAN, _E_SCHED, _P_PLAN, cid, kind, -1, -1, "", 0, pc, (d,) + prev_p)
        generate_plan_from_ops(cmd, prog.topo, table, self.ring, prog.latency, after=(d + 1,))
        if prog.scale:
            _rescale(prog, table, d + 2)
        xpreds = table.xpreds
        self.ext_edges = [(u, q) for u in range(d + 2, len(table)) for q in xpreds[u]]
        self._note_reach(self.ext_edges)

    def _note_reach(self, ext_edges: Sequence[tuple[int, int]]) -> None:
        """Note how far back a plan stage depends on an earlier command (``ext_edges``: (stage, earlier))."""
        cmd = self.table.cmd
        for u, q in ext_edges:
            if cmd[u] - cmd[q] > self.reach:
                self.reach = cmd[u] - cmd[q]


def _rescale(prog: Program, table: StageTable, first: int) -> None:
    engine, dur = table.engine, table.dur
    for s in range(first, len(table)):
        sp = prog.scale.get(engine[s])
        if sp is not None:
            dur[s] = -(-dur[s] * sp.denominator // sp.numerator)


def _renumbered(cmd: Command, cid: int) -> Command:
    """``cmd`` with command id ``cid`` (plans name their command; effects key accumulators by it)."""
    from dataclasses import replace

    return replace(cmd, completion=replace(cmd.completion, cmd=cid))


class Schedule:
    """A launch's program lowered (every command's stages), with the per-command bookkeeping.

    Per command ``i`` (its position in the command table: its id in program
    order for a run simulated in full): ``dispatch_seq[i]``, ``plan_seq[i]``,
    its plan stages ``plan_first[i] .. plan_end[i] - 1``, ``reads[i]``/
    ``writes[i]`` (hazard footprint), ``waits[i]`` (commands whose completion
    ``tl.wait`` put before its dispatch), ``labels``, ``iters``,
    ``logical_bytes``. ``table`` holds the stages, ``loops`` the trace's
    loops, ``commands`` the command objects (instantiated on access).
    What :func:`schedule` returns and what a run's ``program`` reads like.
    """

    def __init__(self, topo: Topology, table: StageTable, ctab: CommandTable, commands: Sequence[Command],
                 loops: tuple[Loop, ...] = (), reach: int = 0):
        self.topo, self.table, self.ctab, self.commands, self.loops, self.reach = \
            topo, table, ctab, commands, loops, reach

    def __repr__(self) -> str:
        return f"Schedule({len(self.ctab)} commands, {len(self.table)} stages, {self.topo.name})"

    dispatch_seq = property(lambda self: self.ctab.dispatch_seq)
    plan_end = property(lambda self: self.ctab.plan_end)
    reads = property(lambda self: self.ctab.reads)
    writes = property(lambda self: self.ctab.writes)
    waits = property(lambda self: self.ctab.waits)
    labels = property(lambda self: self.ctab.label)
    iters = property(lambda self: self.ctab.iter)
    logical_bytes = property(lambda self: self.ctab.logical_bytes)

    @property
    def plan_seq(self) -> list[int]:
        return [d + 1 for d in self.ctab.dispatch_seq]

    @property
    def plan_first(self) -> list[int]:
        return [d + 2 for d in self.ctab.dispatch_seq]

    def edge_reach(self) -> int:
        """How many commands back a static edge reaches: the largest ``cmd(s) - cmd(p)`` over every plan
        stage ``s`` and its dependency ``p`` (staging-ring edges reach back to earlier commands)."""
        return self.reach

    @property
    def n_commands(self) -> int:
        return len(self.ctab)

    @property
    def n_stages(self) -> int:
        return len(self.table)

    def periods(self) -> list[tuple[int, int, int]]:
        """The periods a steady state inserted: none (every stage here was simulated)."""
        return []


class ScheduleView(Protocol):
    """What a run holds as its program (DESIGN.md §19), whatever made it: the full :class:`Schedule`, the
    expanded steady one (``device.expand.ExpandedSchedule``), a replica (``device.device.Replica``) or a PE
    simulated in parts (``device.join.JoinedSchedule``).

    ``commands`` are the commands in program order and ``table`` the stages (columns indexed by seq; ``len``
    is the number of stages); ``n_commands`` and ``n_stages`` their lengths. The per-command columns
    (``labels``, ``iters``, ``dispatch_seq``, ``plan_seq``, ``plan_first``, ``plan_end``, ``logical_bytes``,
    ``waits``, ``reads``, ``writes``) take ints, negative ints and slices, as ``commands`` does.
    """

    topo: Topology
    table: Any
    commands: Sequence[Command]
    loops: tuple
    reach: int

    @property
    def n_commands(self) -> int: ...

    @property
    def n_stages(self) -> int: ...

    labels: Sequence[str]
    iters: Sequence[int]
    dispatch_seq: Sequence[int]
    plan_seq: Sequence[int]
    plan_first: Sequence[int]
    plan_end: Sequence[int]
    logical_bytes: Sequence[int]
    waits: Sequence[tuple[int, ...]]
    reads: Sequence[tuple]
    writes: Sequence[tuple]

    def edge_reach(self) -> int: ...

    def periods(self) -> list[tuple[int, int, int]]:
        """``(dseq, lo, hi)`` per period a steady state inserted (empty for a run simulated in full)."""
        ...


def lower(program: Program) -> Schedule:
    """Lower every command of ``program`` (no simulation): the whole static schedule."""
    table, ctab = StageTable(program.with_effects), CommandTable()
    cur = program.cursor(table, ctab)
    while not cur.done:
        cur.lower(len(ctab))
    return Schedule(program.topo, table, ctab, program.trace.commands, program.loops, cur.reach)


def schedule(commands: Sequence[Command] | Trace, topo: Topology, *, waits: Sequence[tuple[int, int]] = (),
             with_effects: bool = False, staging_base: int = 0, templates: bool = True) -> Schedule:
    """Lower a program's commands (a list, or a :class:`~kbwork.pe.program.Trace`) to the full stage table.

    Args:
        commands: in program order; ``commands[i].completion.cmd`` must be ``i``.
        topo: the topology.
        waits: ``(before_cmd, wait_for_cmd)`` pairs from ``tl.wait`` (a list of commands only).
        with_effects: record data-mode effects on the stages.
        staging_base: TCM address of the scheduler's staging buffers.
        templates: without effects, plan each composite signature once and stamp repeats from its
            template (the plan cache, ``pe.templates``); the stage table is the same either way.

    Returns:
        The :class:`Schedule`.

    Raises:
        ValueError: a command whose id is not its position.
    """
    if isinstance(commands, Trace):
        trace = commands
    else:
        commands = list(commands)
        for i, cmd in enumerate(commands):
            if cmd.completion.cmd != i:
                raise ValueError(f"command {cmd!r} is at position {i} but carries id {cmd.completion.cmd}")
        trace = Trace([Plain(0, tuple(commands))] if commands else [], waits)
    return lower(Program(trace, topo, with_effects=with_effects, staging_base=staging_base, templates=templates))
