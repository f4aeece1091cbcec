"""A launch that differs from one simulated before only in its loops' trip counts takes that one's records
(DESIGN.md §12, §14; docs/device.md, "Exact reductions", item 5).

A PE alone on its channels runs its launches one by one (:func:`kbwork.device.device.simulate_alone`). In timing
mode the steady state (:mod:`.steady`) proves a period ``p`` of a ``tl.range`` loop at iteration ``i2``, jumps
``k`` periods and simulates the rest: the loop's last iterations and what follows it. A launch B whose program is
launch A's but for the trip count of that loop — ``m`` iterations where A had ``n``, ``(m - n) % p == 0`` and
``k' = k + (m - n) / p >= 1`` — would be simulated as A was, record for record: its first ``i2`` iterations are
A's commands (so its states at the boundaries are A's, and the same boundary proves the same period), the jump
of ``k'`` periods leaves it ``m - i2 - k'·p = n - i2 - k·p`` iterations before the loop ends, as A's left, and
what follows is A's moved on by ``m - n`` iterations. Only *what the commands are* differs: the command ids
after the loop, the iterations (hence ``iter`` labels, default DMA labels, stage names and footprints) of the
commands simulated after the jump, and the tensor names everywhere (B's binding). So B's records are A's
simulated ones with B's commands, iterations, names and footprints, expanded with ``k'`` in place of ``k``
(:func:`kbwork.device.expand.expand`).

Whether B's program is A's but for trip counts is decided by a key (:func:`length_key`): every segment of the
trace (plain commands; a loop's body, period, waits, ``iter`` labels and loop variable, never its count), every
handle described by what decides timing — space, shape, dtype, pinning; in TCM its address; in HBM which bound
tensor holds it and where (the tensors' aliasing and channels numbered as :func:`~.device.group_key` numbers
them), a ``tl.range`` slice's stride — never its name. An HBM handle after a loop is placed relative to where the
loop's slices of its tensor end (its offset less the loop's count times their stride): the epilogue that reads
the last tile of a longer K reads the tile after the loop's, as the shorter one's does (and a fixed range after
the loop keys each count apart). Where that is not exact — a body touching a written tensor with slices that move
and with ranges that do not, two strides over one tensor in one body, a TCM slice that moves, a ``tl.wait`` into
a loop from outside it — there is no key and the launch is simulated.

A hit is taken only when every loop A accelerated keeps ``(m - n) % p == 0`` and ``k' >= 1``, and every other
loop has A's count; otherwise B is simulated. The steady state's static rule (:func:`.steady.shift_invariant`)
reads a loop's count, but only where a range that moves with the loop meets another in some iterations and not
in others, one of them written; the key leaves no such pair whose verdict the count could change: a TCM slice
that moves has no key, a slice and a fixed range of one written tensor in one body have none, two strides over
one tensor have none, and ranges of different tensors never meet (a tensor holds its slices at every iteration,
which ``tl.range`` slicing checks at the first and the last). So B's loops pass the rule as A's did.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Sequence

import numpy as np

from ..errors import SimulationError
from ..memory import Handle, LoopHandle, Space
from ..pe.commands import DmaCmd
from ..pe.program import Loop, Plain
from ..pe.scheduler import Program, _spans_at, footprint
from ..pe.scheduler import _handles as _rw_handles
from ..symbolic import Index
from .device import BoundTable
from .expand import ExpandedSchedule, ExpandedTimeline, _stage_names, command_stage_names, expand, label_at
from .steady import Insertion, SteadyState, steady_outcome


class _NoKey(Exception):
    """The trace has no length-free key (simulate the launch)."""


# --- the key ---------------------------------------------------------------------------------------------------
def length_key(prog: Program) -> tuple[tuple, tuple[int, ...]] | None:
    """The key of a launch alone, free of its loops' trip counts, and its channels in the order its tensors meet
    them (what another length's records map through); None when the launch has none (it is then simulated).

    Two launches with equal keys run the same program but for their loops' iteration counts, on tensors laid out
    alike (which arguments are one tensor) on channels alike (module docstring)."""
    b = prog.trace.binding
    if b is None or not prog.loops:  # (a launch without a loop never goes steady: nothing to take)
        return None
    layout = b.layout()
    if layout is None:
        return None
    memo = b.traced.memo
    if "lengths" not in memo:
        try:
            memo["lengths"] = _describe(b.traced)
        except _NoKey:
            memo["lengths"] = None
    desc = memo["lengths"]
    if desc is None:
        return None
    chan_ids: dict[int, int] = {}
    pattern = tuple(chan_ids.setdefault(h.channel, len(chan_ids)) for h in b.tensors())
    scale = tuple(sorted(prog.scale.items()))
    return (desc, layout, pattern, id(prog.topo), prog.staging_base, prog.templates, prog.with_effects,
            scale), tuple(chan_ids)


def _describe(traced: Any) -> tuple:
    """The length-free description of one trace (shared by its bindings: a binding moves every handle with its
    tensor). Raises :class:`_NoKey` when there is none."""
    trace = traced.trace
    place = _Place(tuple(traced.leaves) + tuple(traced.constants))
    segs = trace.all_segments
    # pass 1: per loop, the strides of the HBM slices that move with it and the tensors it touches fixed
    written: set[int] = set()
    moving: list[dict[int, set[int]]] = []
    fixed: list[set[int]] = []
    for seg in segs:
        cmds = seg.commands if isinstance(seg, Plain) else seg.body
        mv: dict[int, set[int]] = {}
        fx: set[int] = set()
        for cmd in cmds:
            for h, w in _handles(cmd):
                if h is None or h.space is not Space.HBM:
                    continue
                t = place.tensor(h)
                if w:
                    written.add(t)
                if h.__class__ is LoopHandle:
                    if h.kind != "rows":
                        raise _NoKey
                    mv.setdefault(t, set()).add(h.stride)
                else:
                    fx.add(t)
        moving.append(mv if isinstance(seg, Loop) else {})
        fixed.append(fx)
    for mv, fx in zip(moving, fixed):
        for t, strides in mv.items():
            if len(strides) > 1 or (t in written and t in fx):
                raise _NoKey  # no one shift places what follows the loop
    # pass 2: the segments, each HBM offset less what the loops before it moved its tensor by
    shift: dict[int, int] = {}
    start_of: dict[int, tuple[int, int]] = {}  # a plain command's id -> (segment, place in it)
    out = []

    seen: dict[int, tuple] = {}  # id(handle) -> its description, until a loop moves the offsets on

    def hd(h: Any) -> Any:
        if h is None:
            return None
        got = seen.get(id(h))
        if got is None:
            got = seen[id(h)] = _handle(h, place, shift)
        return got
    for g, seg in enumerate(segs):
        if isinstance(seg, Plain):
            for x in range(len(seg.commands)):
                start_of[seg.first_cmd + x] = (g, x)
            out.append(("plain", tuple(_command(c, hd) for c in seg.commands)))
        else:
            waits = []
            for k, t, rel in seg.waits:
                if not rel:
                    if t not in start_of:
                        raise _NoKey  # a wait on a command of an earlier loop
                    t = start_of[t]
                waits.append((k, t, rel))
            v = seg.var
            out.append(("loop", seg.number, seg.period, len(seg.body), tuple(waits),
                        tuple(("i", it.a, it.b) if isinstance(it, Index) else it for it in seg.iters),
                        (v.start, v.step, tuple(sorted(v.periods))),
                        tuple(_command(c, hd) for c in seg.body)))
            for t, strides in moving[g].items():
                shift[t] = shift.get(t, 0) + seg.iterations * next(iter(strides))
            seen.clear()
    waits = []
    for before, target in trace.plain_waits:
        if before not in start_of or target not in start_of:
            raise _NoKey  # a wait that holds or names a loop's command
        waits.append((start_of[before], start_of[target]))
    out.append(("waits", tuple(waits)))
    try:
        return _Hashed(tuple(out))
    except TypeError:
        raise _NoKey from None  # a scalar that does not hash


class _Hashed:
    """A trace's description, hashed once (a launch's key is looked up more than once, and the description of a
    decode holds a few hundred handles)."""

    __slots__ = ("value", "_hash")

    def __init__(self, value: tuple):
        self.value, self._hash = value, hash(value)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return self is other or (other.__class__ is _Hashed and self._hash == other._hash
                                 and self.value == other.value)

    def __repr__(self) -> str:
        return f"_Hashed({self.value!r})"


def _handles(cmd: Any) -> list[tuple[Any, bool]]:
    """Every handle of ``cmd`` with whether the command writes it: its primary output, then what it reads and
    what it writes as the scheduler's hazard tracking counts them (:func:`kbwork.pe.scheduler._handles`)."""
    reads, writes = _rw_handles(cmd)
    return [(cmd.completion.primary_out, False)] + [(h, False) for h in reads] + [(h, True) for h in writes]


class _Place:
    """Which of a trace's HBM tensors (its arguments, then its constants) holds a handle."""

    def __init__(self, tensors: tuple[Handle, ...]):
        self.tensors = tensors
        firsts: set[tuple[int, int]] = set()
        hbm = []
        for i, h in enumerate(tensors):
            if h.space is Space.HBM and h.nbytes and (h.addr, h.nbytes) not in firsts:
                firsts.add((h.addr, h.nbytes))  # (an argument passed twice: the first place names it)
                hbm.append((h.addr, h.end, i))
        hbm.sort()
        for (_, e, _), (s, _, _) in zip(hbm, hbm[1:]):
            if s < e:
                raise _NoKey  # tensors that overlap without being one
        self.hbm, self.starts = hbm, [x[0] for x in hbm]

    def tensor(self, h: Handle) -> int:
        """The index of the tensor holding HBM handle ``h`` (iteration 0's, for a loop handle).

        Raises:
            _NoKey: no tensor holds it, or it is on another channel than its tensor.
        """
        k = bisect.bisect_right(self.starts, h.addr) - 1
        if k < 0 or h.addr + h.nbytes > self.hbm[k][1] or (not h.nbytes and h.addr >= self.hbm[k][1]):
            raise _NoKey
        t = self.hbm[k][2]
        if h.channel != self.tensors[t].channel:
            raise _NoKey
        return t

    def offset(self, h: Handle, t: int) -> int:
        return h.addr - self.tensors[t].addr


def _handle(h: Handle, place: _Place, shift: dict[int, int]) -> tuple:
    """What decides the timing of a command reading or writing ``h`` (module docstring); ``shift``: tensor ->
    the bytes the loops before moved its slices by (an offset is placed less it)."""
    base = (h.space is Space.TCM, h.shape, h.dtype, h.pinned, h.nbytes)
    if h.__class__ is LoopHandle:
        if h.space is Space.HBM:  # (pass 1 refused any other kind)
            t = place.tensor(h)
            return base + ("rows", t, place.offset(h, t) - shift.get(t, 0), h.stride,
                           None if h.var is None else h.var.number)
        if h.kind == "ring" and not h.chain:
            return base + ("ring", tuple(x.span for x in h.slots), h.slot.a, h.slot.b)
        if h.kind == "named" and not h.chain:
            return base + ("named", h.span, _prefix(h.prefix))
        raise _NoKey  # a TCM slice that moves with the loop, or anything more general
    if h.space is Space.HBM:
        t = place.tensor(h)
        return base + ("hbm", t, place.offset(h, t) - shift.get(t, 0))
    return base + ("tcm", h.addr)


def _prefix(p: Any) -> tuple:
    """A named buffer's prefix (what names it, never where it is: its bytes are the buffer's own)."""
    if p is None:
        return ()
    if isinstance(p, LoopHandle):
        return ("handle", p.kind, _prefix(p.prefix), p.suffix)
    return ("cmd", p.stem)


def _extra(v: Any) -> Any:
    c = v.__class__
    if c is float or c is np.float64 or c is np.float32:
        return (c, float(v).hex())
    return (c, v)


def _command(cmd: Any, hd: Any) -> tuple:
    """A command as the key holds it: its handles by :func:`_handle`, its ops, its label (a default DMA label by
    its verb: the rest names the source), never its id or ``iter`` label."""
    label = ("auto", cmd.auto_label) if cmd.__class__ is DmaCmd and cmd.auto_label is not None else cmd.label
    head = (cmd.__class__.__name__, label, cmd.logical_bytes, hd(cmd.completion.primary_out))
    if cmd.__class__ is DmaCmd:
        return head + (hd(cmd.src), hd(cmd.dst))
    # (lists, not generators, and the scope's value, not the enum, whose hash is a Python-level call: a trace's
    # description is made for every length of a kernel)
    ops = tuple([(op.kind, op.scope._value_, tuple([(n, hd(h)) for n, h in op.operands.items()]),
                  tuple([(n, _extra(v)) for n, v in op.extra.items()]) if op.extra else (), hd(op.out))
                 for op in cmd.ops])
    return head + (ops, tuple([hd(h) for h in cmd.rw_handles]), cmd.data_op, tuple([hd(h) for h in cmd.scratch]))


# --- taking another length's records ------------------------------------------------------------------------------
@dataclass(eq=False)
class Source:
    """A launch simulated alone that went steady: its program and its records (``(timeline, schedule, steady
    state)``, the schedule an :class:`~kbwork.device.expand.ExpandedSchedule`) and its channels in key order."""

    prog: Program
    res: tuple
    chans: tuple[int, ...]


def steady_source(prog: Program, res: tuple, chans: tuple[int, ...]) -> Source | None:
    """``prog``'s records as a :class:`Source`, or None when they cannot be one (not steady)."""
    tl, sched, state = res
    if state.path != "steady" or sched.__class__ is not ExpandedSchedule or tl.__class__ is not ExpandedTimeline:
        return None
    ins = sched.insertions
    if len({x.loop.number for x in ins}) != len(ins) or any(x.prog is not prog for x in ins):
        return None
    return Source(prog, res, chans)


def from_other_length(prog: Program, sources: Sequence[Source], chans: tuple[int, ...]) -> tuple | None:
    """``prog``'s records (``(timeline, schedule, steady state)``) from the first of ``sources`` (of ``prog``'s
    :func:`length_key`) whose loops it runs to a length the steady state would have reached the same way
    (module docstring), else None."""
    for src in sources:
        out = _rebound(src, prog, chans)
        if out is not None:
            return out
    return None


def _rebound(src: Source, prog: Program, chans: tuple[int, ...]) -> tuple | None:
    """``prog``'s records from ``src``'s (module docstring), or None when a loop's count keeps them apart."""
    tl_x, sched_x, state = src.res
    ins = sched_x.insertions
    loops_a, loops_b = src.prog.loops, prog.loops
    if len(loops_a) != len(loops_b):
        return None
    by_number = {x.loop.number: x for x in ins}
    moved: dict[int, tuple[Loop, int]] = {}  # loop number -> this launch's loop and the periods it adds
    for la, lb in zip(loops_a, loops_b):
        x = by_number.get(la.number)
        d = lb.iterations - la.iterations
        if x is None:
            if d:
                return None  # a loop simulated in full: its count must be the same
            continue
        if x.loop is not la or lb.number != la.number or d % x.p or x.k + d // x.p < 1:
            return None
        moved[la.number] = (lb, d // x.p)
    if len(moved) != len(ins):
        return None
    new_ins = [Insertion(moved[x.loop.number][0], x.i1, x.i2, x.c1, x.c2, x.s1, x.s2, x.t1, x.t2,
                         x.k + moved[x.loop.number][1], prog) for x in ins]
    lines = _loop_lines(state, ins, new_ins)
    if lines is None:
        return None
    tl, waited, launches, afters = tl_x.simulated
    sched = Rebound(sched_x.simulated, prog, loops_a, ins, new_ins, dict(zip(src.chans, chans)))
    xs, xt = expand(prog, sched, tl, new_ins, waited, launches, afters)
    return xt, xs, SteadyState("steady", state.period, state.proven_at, None, sum(x.k for x in new_ins), lines)


def _loop_lines(state: SteadyState, ins: Sequence[Insertion], new: Sequence[Insertion]) -> tuple[str, ...] | None:
    """``state.loops`` with each accelerated loop's line saying its new number of periods; None when the lines
    are not the insertions' in order."""
    out, at = [], 0
    for line in state.loops:
        head, _, said = line.partition(": ")
        if at < len(ins) and said == steady_outcome(ins[at]):
            line = f"{head}: {steady_outcome(new[at])}"
            at += 1
        out.append(line)
    return tuple(out) if at == len(ins) else None


class Rebound:
    """The schedule the event loop simulated for another length's launch, read as this launch's (the launch
    ``prog``): the same stages, seqs and positions, with this launch's commands, iterations, names, labels and
    footprints (:class:`ReboundCommands`, :class:`ReboundTable`). What :func:`~kbwork.device.expand.expand`
    takes in place of the launch's own simulated schedule."""

    def __init__(self, sched: Any, prog: Program, src_loops: Sequence[Loop], ins: Sequence[Insertion],
                 new: Sequence[Insertion], chan_map: dict[int, int]):
        self.topo, self.reach = sched.topo, sched.reach
        self.commands = prog.trace.commands
        self.loops = tuple(prog.loops)
        self.ctab = ReboundCommands(sched.ctab, prog, src_loops, ins, new)
        self.table = ReboundTable(sched.table, self.ctab, chan_map)

    def __repr__(self) -> str:
        return f"Schedule({len(self.ctab)} commands, {len(self.table)} stages, {self.topo.name}; another length's)"


class ReboundCommands:
    """A simulated command table (``pe.scheduler.CommandTable``) read as another launch's: positions, seqs,
    waits and costs as simulated; ids, loops and iterations this launch's (a command simulated after a jump is
    ``m - n`` iterations on, one after the loop ``m - n`` iterations' commands on); labels, ``iter`` labels and
    footprints made from this launch's program on first use."""

    def __init__(self, ctab: Any, prog: Program, src_loops: Sequence[Loop], ins: Sequence[Insertion],
                 new: Sequence[Insertion]):
        self._prog = prog
        self.dispatch_seq, self.plan_end, self.waits = ctab.dispatch_seq, ctab.plan_end, ctab.waits
        self.logical_bytes, self.dispatch, self.body = ctab.logical_bytes, ctab.dispatch, ctab.body
        # per insertion: where its simulated tail starts, the loop it moves on, and by how many iterations
        moves = [(x.c2, x.loop, y.loop, (y.k - x.k) * x.p) for x, y in zip(ins, new)]
        loop_of = {id(a): b for a, b in zip(src_loops, prog.loops)}
        n = len(ctab.cmd)
        cmd, iteration, loops = list(ctab.cmd), list(ctab.iteration), [None] * n
        a_loop = ctab.loop
        for c in range(n):
            la = a_loop[c]
            if la is not None:
                loops[c] = loop_of[id(la)]
        for c2, la, lb, d in moves:
            if not d:
                continue
            per = d * len(la.body)
            for c in range(c2, n):
                cmd[c] += per
                if a_loop[c] is la:
                    iteration[c] += d
        self.cmd, self.iteration, self.loop = cmd, iteration, loops

    def __len__(self) -> int:
        return len(self.cmd)

    def __repr__(self) -> str:
        return f"CommandTable({len(self)} commands; another length's, rebound)"

    def _command(self, c: int) -> Any:
        """Command ``c`` of this launch (a loop's, instantiated at its iteration)."""
        lp = self.loop[c]
        if lp is None:
            return self._prog.trace.command(self.cmd[c])
        return lp.command(self.iteration[c], self.body[c])

    @cached_property
    def label(self) -> list[str]:
        out = []
        for c in range(len(self)):
            lp = self.loop[c]
            if lp is None:
                out.append(self._command(c).label)
                continue
            out.append(label_at(lp.body[self.body[c]], self.iteration[c]))
        return out

    @cached_property
    def iter(self) -> list[int]:
        return [self._command(c).iter if self.loop[c] is None else self.loop[c].iter_label(self.iteration[c],
                                                                                              self.body[c])
                for c in range(len(self))]

    @cached_property
    def _footprints(self) -> tuple[list, list]:
        """Each command's reads and writes, as the cursor makes them (a body command planned from a template by
        its makers, any other from the command itself)."""
        reads, writes = [], []
        prog = self._prog
        for c in range(len(self)):
            lp = self.loop[c]
            if lp is not None:
                bc = prog.body_command(lp, self.body[c])
                if bc.template is not None:
                    i = self.iteration[c]
                    reads.append(_spans_at(bc.reads, i))
                    writes.append(_spans_at(bc.writes, i))
                    continue
            r, w = footprint(self._command(c))
            reads.append(r)
            writes.append(w)
        return reads, writes

    reads = property(lambda self: self._footprints[0])
    writes = property(lambda self: self._footprints[1])

    def names(self, c: int) -> list[str]:
        """The op_log ``tensor`` of each stage of command ``c`` (its DISPATCH and PLAN first)."""
        lp = self.loop[c]
        if lp is not None:
            return _stage_names(self._prog, lp, self.body[c], self.iteration[c])
        return command_stage_names(self._prog, self._command(c))


class ReboundTable(BoundTable):
    """A simulated stage table read as another launch's: every column as simulated but ``chan`` (its channels,
    as a replica's, :class:`~kbwork.device.device.BoundTable`) and ``tensor`` (this launch's names, made from its
    program on first use)."""

    def __init__(self, table: Any, ctab: ReboundCommands, chan_map: dict[int, int]):
        super().__init__(table, None, chan_map)
        self._ctab = ctab

    def __repr__(self) -> str:
        return f"{self._t!r} (another length's, rebound)"

    @cached_property
    def tensor(self) -> list[str]:  # type: ignore[override]
        ctab = self._ctab
        out: list[str] = []
        for c in range(len(ctab)):
            names = ctab.names(c)
            if len(names) != ctab.plan_end[c] - ctab.dispatch_seq[c] or len(out) != ctab.dispatch_seq[c]:
                raise SimulationError(f"command {c} of a launch taken from another length: its stages are not "
                                      f"the simulated launch's")
            out += names
        if len(out) != len(self._t):
            raise SimulationError("a launch taken from another length: its stages are not the simulated launch's")
        return out
