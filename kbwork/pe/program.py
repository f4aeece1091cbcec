"""A kernel's trace as data: plain commands and ``tl.range`` loops whose body was traced once (DESIGN.md §13).

The kernel language records a launch as a sequence of :class:`Segment` s: a
run of plain commands, or a :class:`Loop` — its body's commands, traced once
with a symbolic index, and how many iterations run. The program is the
body instantiated for every iteration: iteration ``i`` of body command ``k``
is command ``first_cmd + i·len(body) + k``, its handles those of iteration
``i`` (:meth:`kbwork.memory.LoopHandle.at`), its ``iter`` label the affine
label evaluated at ``i``. Nothing else differs between iterations, by
construction: that is what lets the scheduler plan a body command once and
the steady state (DESIGN.md §12) prove periodicity without guessing.

:class:`Trace` is the whole launch: the commands as a lazy sequence (a
million-command loop is not materialised until asked for), each loop's
layout (first command, commands per iteration, count, period), and the
``tl.wait`` pairs.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from ..memory import CommandName, LoopHandle
from ..symbolic import Index, LoopVar
from .commands import Command, Completion, CompositeCmd, DmaCmd, OpSpec


def _subst(h: Any, i: int) -> Any:
    return h.at(i) if isinstance(h, LoopHandle) else h


def _op_has_loop(op: OpSpec) -> bool:
    return isinstance(op.out, LoopHandle) or any(isinstance(h, LoopHandle) for h in op.operands.values())


def _op_at(op: OpSpec, i: int) -> OpSpec:
    return OpSpec(op.kind, op.scope, {n: _subst(h, i) for n, h in op.operands.items()}, op.extra, _subst(op.out, i))


def command_at(cmd: Command, i: int, cid: int, iter_label: int) -> Command:
    """Body command ``cmd`` as it is in iteration ``i``: command id ``cid``, label ``iter_label``."""
    c = cmd.completion
    if isinstance(cmd, DmaCmd):
        src, dst = _subst(cmd.src, i), _subst(cmd.dst, i)
        # a default label names the source, which differs per iteration ("dma_load K[256:384]")
        label = cmd.label if cmd.auto_label is None else cmd.auto_label + src.name
        return DmaCmd(Completion(cid, _subst(c.primary_out, i), c.origin), src, dst, label, iter_label)
    ops = tuple(_op_at(op, i) if _op_has_loop(op) else op for op in cmd.ops)
    return CompositeCmd(Completion(cid, _subst(c.primary_out, i), c.origin), ops,
                        tuple(_subst(h, i) for h in cmd.rw_handles), cmd.data_op,
                        tuple(_subst(h, i) for h in cmd.scratch), cmd.label, iter_label)


@dataclass(frozen=True, eq=False)
class Loop:
    """One ``tl.range`` loop of a launch, as data.

    Attributes:
        number: which loop of the launch (0, 1, ...).
        first_cmd: the command id of iteration 0's first command.
        body: iteration 0's commands (ids ``first_cmd + k``), traced once; their handles may be
            :class:`~kbwork.memory.LoopHandle` s.
        iterations: how many times the body runs (0 for an empty range: the body was traced, nothing runs).
        iters: per body command its ``iter`` label: -1, an int, or an affine :class:`~kbwork.symbolic.Index`.
        waits: ``(body index, target, relative)``: before body command ``k``, ``tl.wait`` on body command
            ``target`` of the same iteration (``relative``) or on command id ``target`` (before the loop).
            ``k == len(body)`` is a wait at the end of the body: it holds the next iteration's first command
            (and, after the last iteration, the loop's next command: a plain wait the trace records).
        period: the loop's structural period in iterations: the lcm of the periods of the rings its body
            indexes with the index (1 if none). Iteration ``i + period`` repeats iteration ``i`` with every
            row slice moved by its stride.
        var: the loop variable (``var.start``, ``var.step``: the ``j`` of iteration ``i`` is ``start + step·i``).
    """

    number: int
    first_cmd: int
    body: tuple[Command, ...]
    iterations: int
    iters: tuple[Any, ...]
    waits: tuple[tuple[int, int, bool], ...]
    period: int
    var: LoopVar

    @property
    def cmds_per_iter(self) -> int:
        return len(self.body)

    @property
    def end_cmd(self) -> int:
        """One past the loop's last command id."""
        return self.first_cmd + self.iterations * len(self.body)

    def iter_label(self, i: int, k: int) -> int:
        """The ``iter`` label of body command ``k`` in iteration ``i``."""
        it = self.iters[k]
        return it.at(i) if isinstance(it, Index) else it

    def command(self, i: int, k: int) -> Command:
        """Body command ``k`` of iteration ``i`` as a concrete command."""
        return command_at(self.body[k], i, self.first_cmd + i * len(self.body) + k, self.iter_label(i, k))

    def where(self, cid: int) -> tuple[int, int]:
        """``(iteration, body index)`` of command id ``cid`` of this loop."""
        i, k = divmod(cid - self.first_cmd, len(self.body))
        return i, k

    def __repr__(self) -> str:
        return (f"Loop({self.number}: {self.iterations} iterations x {len(self.body)} commands from command "
                f"#{self.first_cmd}, period {self.period})")


@dataclass(frozen=True, eq=False)
class Plain:
    """A run of commands outside any loop (``first_cmd`` is the first one's id)."""

    first_cmd: int
    commands: tuple[Command, ...]

    @property
    def end_cmd(self) -> int:
        return self.first_cmd + len(self.commands)

    def __repr__(self) -> str:
        return f"Plain({len(self.commands)} commands from #{self.first_cmd})"


Segment = Plain | Loop


class Trace:
    """One launch of a kernel as traced: its segments, in program order.

    ``commands`` is a lazy sequence of every command (loops instantiated on
    access); ``loops`` lists the loops; ``waits`` are the ``(before, target)``
    pairs of ``tl.wait`` outside loops. :meth:`waits_of` gives any command's.

    A trace bound to a launch's tensors (``triton_emu.binding``) may be given its segments as the function
    that makes them, with ``n_commands``: they are made when first read (a replicated launch's never are).
    """

    def __init__(self, segments: Sequence[Segment] | Callable[[], Sequence[Segment]],
                 waits: Sequence[tuple[int, int]] = (), binding: Any = None, *, n_commands: int | None = None):
        #: which trace of its run this launch was bound from, and to what (``triton_emu.binding.Binding``; None
        #: for a trace made outside a run)
        self.binding = binding
        #: the ``tl.wait`` pairs outside loops, as given
        self.plain_waits = tuple(waits)
        if callable(segments):
            self._make: Callable[[], Sequence[Segment]] | None = segments
            self.n_commands = n_commands
        else:
            self._make = None
            self._set(segments)

    def _set(self, segments: Sequence[Segment]) -> None:
        self._segments = tuple(s for s in segments if (s.commands if isinstance(s, Plain) else s.iterations))
        self._all = tuple(segments)
        self._loops = tuple(s for s in segments if isinstance(s, Loop))
        self.n_commands = self._segments[-1].end_cmd if self._segments else 0
        self._starts = [s.first_cmd for s in self._segments]
        waits_by: dict[int, list[int]] = {}
        for before, target in self.plain_waits:
            waits_by.setdefault(before, []).append(target)
        self._waits = {c: tuple(sorted(ts)) for c, ts in waits_by.items()}
        # the loops a tl.wait outside them holds a command of (one issued just before a loop holds its first)
        self._held = frozenset(seg.number for seg in self._loops
                               if any(seg.first_cmd <= c < seg.end_cmd for c in self._waits))

    def _made(self) -> "Trace":
        make = self._make
        if make is not None:
            self._make = None
            self._set(make())
        return self

    @property
    def segments(self) -> tuple[Segment, ...]:
        """The segments that hold commands (an empty loop holds none)."""
        return self._made()._segments

    @property
    def all_segments(self) -> tuple[Segment, ...]:
        """Every segment as traced, empty loops included."""
        return self._made()._all

    @property
    def loops(self) -> tuple[Loop, ...]:
        return self._made()._loops

    @property
    def commands(self) -> "CommandList":
        """Every command, in program order (a view made on access: kept on the trace, it would hold the trace
        in a reference cycle)."""
        return CommandList(self)

    def __repr__(self) -> str:
        return f"Trace({self.n_commands} commands, {len(self.loops)} loops)"

    def segment_of(self, cid: int) -> Segment:
        """The segment holding command id ``cid``."""
        return self.segments[bisect.bisect_right(self._starts, cid) - 1]  # (segments made it)

    def command(self, cid: int) -> Command:
        seg = self.segment_of(cid)
        if isinstance(seg, Plain):
            return seg.commands[cid - seg.first_cmd]
        return seg.command(*seg.where(cid))

    def waits_of(self, cid: int) -> tuple[int, ...]:
        """The commands ``tl.wait`` put before command ``cid``, ascending (as a plain Python loop puts them)."""
        seg = self.segment_of(cid)
        plain = self._waits.get(cid, ())
        if isinstance(seg, Plain) or not (seg.waits or plain):
            return plain
        return tuple(sorted(plain + self._loop_waits(seg, *seg.where(cid))))

    @staticmethod
    def _loop_waits(seg: "Loop", i: int, k: int) -> tuple[int, ...]:
        """What ``seg``'s own waits put before body command ``k`` of iteration ``i``: those before ``k``, and for
        ``k == 0`` those at the end of the previous iteration's body."""
        n = len(seg.body)
        base = seg.first_cmd + i * n
        out = tuple(base + t if rel else t for kk, t, rel in seg.waits if kk == k)
        if k == 0 and i > 0:
            out += tuple(base - n + t if rel else t for kk, t, rel in seg.waits if kk == n)
        return out

    def has_waits(self, loop: "Loop") -> bool:
        """Whether any ``tl.wait`` holds a command of ``loop`` (its own, or one issued before it)."""
        return bool(loop.waits) or loop.number in self._held

    def iter_of(self, cid: int) -> int:
        seg = self.segment_of(cid)
        if isinstance(seg, Plain):
            return seg.commands[cid - seg.first_cmd].iter
        return seg.iter_label(*seg.where(cid))

    @property
    def waits(self) -> list[tuple[int, int]]:
        """Every ``(before, target)`` pair, in program order (loops instantiated)."""
        out = []
        for seg in self.segments:
            if isinstance(seg, Plain):
                out += [(c, t) for c in range(seg.first_cmd, seg.end_cmd) for t in self._waits.get(c, ())]
            elif self.has_waits(seg):
                n = len(seg.body)
                for i in range(seg.iterations):
                    base = seg.first_cmd + i * n
                    for k in range(n):
                        out += [(base + k, t) for t in sorted(self._waits.get(base + k, ())
                                                              + self._loop_waits(seg, i, k))]
        return out


class CommandList(Sequence):
    """Every command of a trace, in program order, instantiated on access (ints, negative ints and slices)."""

    def __init__(self, trace: Trace):
        self._trace = trace

    def __len__(self) -> int:
        return self._trace.n_commands

    def __getitem__(self, i: Any) -> Any:
        n = self._trace.n_commands
        if isinstance(i, slice):
            return [self._trace.command(c) for c in range(*i.indices(n))]
        try:
            c = i.__index__()
        except AttributeError:
            raise TypeError(f"command indices must be integers or slices, not {type(i).__name__}") from None
        if c < 0:
            c += n
        if not 0 <= c < n:
            raise IndexError(f"command {i} out of range ({n} commands)")
        return self._trace.command(c)

    def __iter__(self) -> Iterator[Command]:
        for seg in self._trace.segments:
            if isinstance(seg, Plain):
                yield from seg.commands
            else:
                for i in range(seg.iterations):
                    for k in range(len(seg.body)):
                        yield seg.command(i, k)

    def __repr__(self) -> str:
        return f"CommandList({len(self)} commands)"


def commands_of(trace: Trace) -> Iterator[Command]:
    """The trace's commands as traced: plain ones, and a loop's body once."""
    for s in trace.all_segments:
        yield from (s.commands if isinstance(s, Plain) else s.body)


def handles_of(trace: Trace) -> Iterator[Any]:
    """Every handle of the trace's commands as traced (a loop's body once), each followed by the parts a loop
    handle is made of; in an order that depends on the trace's structure alone (two bindings of one trace give
    their handles side by side)."""
    for c in commands_of(trace):
        hs = [c.completion.primary_out]
        if isinstance(c, DmaCmd):
            hs += [c.src, c.dst]
        else:
            for op in c.ops:
                hs += [*op.operands.values(), op.out]
            hs += [*c.rw_handles, *c.scratch]
        while hs:
            h = hs.pop()
            if h is None:
                continue
            yield h
            if isinstance(h, LoopHandle):
                hs += [y for y in (h.root, h.prefix) if y is not None and not isinstance(y, CommandName)]
                hs += list(h.slots)


def loop_period(var: LoopVar) -> int:
    """The lcm of the ring periods a body indexed with its index (1 when it indexes none)."""
    return math.lcm(1, *var.periods)
