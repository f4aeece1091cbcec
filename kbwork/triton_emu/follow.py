"""Following a launch: a later launch of a device run checked, call by call, against an earlier one.

A device run calls every launch's kernel once (DESIGN.md §12, §14), and most of what a call of ``tl``
costs is lowering it: a composite's recipe expanded, its ops built and validated. When a device runs the
same kernel on many PEs over tensors of the same shapes, those lowerings are the same lowering, relative
to each PE's tensors; the run then simulates one PE and replicates it (§14's exact reductions). So the
first launch of a kind *records* its calls (:class:`Recording`), and a later launch of that kind
*follows* it (:class:`Follower`): its kernel is called as any kernel is, each of its ``tl`` calls does
what changes the context (allocations, recipe scratch, the command's id and completion) as it always
does, and is compared with the recorded call at the same position. A composite equal to the recorded one
— every argument, relative to the tensors; the command id, loop, ``iter`` label and open scratch scopes;
the recipe scratch it found — is emitted as a :class:`Deferred`: its lowering is put off until its
command is read. The recorded call was lowered without an error, so this one would be too, and to the
same command with this launch's tensors. At the first call that differs the launch stops following: the
calls before keep their deferred commands, and from there on every call is lowered as it is made, so an
error is raised by the call that makes it, as always.

What "equal" means is strict, so that equal calls lower to equal commands: scalars of one type and one
value (``-0.0`` is not ``0.0``), strings, bools and None by value, lists, tuples and dicts item by item
(dict keys in order), ``OpSpec`` s field by field, loop indices by their loop and coefficients; a TCM
handle of this launch equal in every field, name included; an HBM handle at the same offset of the
tensor paired with the recorded one (each recorded tensor with one tensor of this launch and back, each
channel with one channel), its name that tensor's name with the same suffix. Anything else (another
type, a handle this launch does not own) ends the following.

A launch that followed to its end, with the same loops, labels and waits
(:meth:`Follower.finish`), equals the recorded launch with its tensors paired: the device may then take
the recorded PE's records for it (``device.device``), and its commands are never lowered unless read.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from typing import Any, Sequence

import numpy as np

from ..memory import CommandName, Handle, LoopHandle, Space
from ..pe.commands import Completion, OpSpec, Scope
from ..pe.program import Loop, Plain
from ..symbolic import Index, LoopVar


#: what compares by value: immutable, and equal only to its own kind (``1 == 1.0`` is not asked: classes differ)
_ATOMS = frozenset({str, int, bool, type(None)})
_TCM = Space.TCM
#: the empty tuple (one object): what a composite's prologue, epilogue and rw_handles default to
_NONE = ()


#: where a composite's arguments (``TLContext.composite``'s parameters, in order) may hold lists and dicts:
#: ``prologue``, ``epilogue``, ``ops`` and ``rw_handles``. Anywhere else a list is refused by lowering, and only
#: calls that were lowered without an error are recorded or put off.
LISTS = slice(9, 13)


def snapshot(args: tuple) -> tuple:
    """A composite's arguments as they are now, whatever the kernel does to its own lists afterwards: its
    prologue and epilogue entries copied (a valid entry holds handles, scalars and strings only), its ``ops`` and
    ``rw_handles`` lists copied (OpSpecs and handles are values). A call is lowered from its arguments as they are
    when it is made; one recorded, or put off, keeps them as they were."""
    pro, epi, ops, rw = args[LISTS]
    if not pro and not epi and ops is None and rw.__class__ is not list:  # most MATH ops: nothing to copy
        return args
    return args[:LISTS.start] + (_entries(pro), _entries(epi), list(ops) if ops.__class__ is list else ops,
                                 list(rw) if rw.__class__ is list else rw) + args[LISTS.stop:]


def _entries(seq: Any) -> Any:
    c = seq.__class__
    if c is list:
        return [e.copy() if e.__class__ is dict else e for e in seq]
    if c is tuple and seq:
        return tuple([e.copy() if e.__class__ is dict else e for e in seq])
    return seq


class Recording:
    """The calls of a launch that emitted commands, in order: ``(kind, args, context, result)``, and at its end
    the shape of its program (:func:`layout`)."""

    __slots__ = ("calls", "layout")

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.layout: tuple | None = None

    def add(self, kind: str, args: tuple, ctx: tuple, result: Any) -> None:
        self.calls.append((kind, args, ctx, result))

    def finish(self, tl: Any) -> None:
        self.layout = layout(tl)

    def __repr__(self) -> str:
        return f"Recording({len(self.calls)} calls{'' if self.layout is not None else ', open'})"


class Tensors:
    """A simulator's HBM tensors by address (what an HBM handle is paired by)."""

    __slots__ = ("by_addr", "starts")

    def __init__(self, tensors: Sequence[Handle]):
        self.by_addr = sorted(tensors, key=lambda h: h.addr)
        self.starts = [h.addr for h in self.by_addr]

    def of(self, h: Handle) -> Handle | None:
        """The tensor holding every byte of ``h`` (iteration 0's, for a loop handle); None if there is none."""
        i = bisect.bisect_right(self.starts, h.addr) - 1
        if i < 0:
            return None
        t = self.by_addr[i]
        return t if h.end <= t.end and h.nbytes else None  # (t.addr <= h.addr: bisect found it so)


class Pairing:
    """The tensors and channels a following PE pairs with the recorded PE's, shared by its launches: tensors one to
    one, each recorded channel with one channel of this PE.

    ``tensors`` maps a recorded tensor's address to ``(recorded tensor, this PE's tensor)``; ``channels`` a
    recorded channel to this PE's."""

    __slots__ = ("index", "tensors", "back", "channels")

    def __init__(self, index: Tensors):
        self.index = index
        self.tensors: dict[int, tuple[Handle, Handle]] = {}
        self.back: dict[int, int] = {}
        self.channels: dict[int, int] = {}

    def tensor(self, f: Handle, r: Handle) -> bool:
        hit = self.tensors.get(r.addr)
        if hit is not None:
            return hit[1] is f or hit[1].addr == f.addr
        if f.addr in self.back:
            return False  # this PE's tensor is paired with another recorded one already
        self.tensors[r.addr] = (r, f)
        self.back[f.addr] = r.addr
        return True

    def channel(self, f: int, r: int) -> bool:
        hit = self.channels.get(r)
        if hit is None:
            self.channels[r] = f
            return True
        return hit == f


class Follower:
    """One launch following a recorded one (see the module's docstring). :meth:`start` binds it to the launch's
    context; the context asks :meth:`composite` for each composite and :meth:`call` / :meth:`made` for each
    load and store; :meth:`finish` says whether the launch followed to its end."""

    def __init__(self, recording: Recording, pairing: Pairing):
        self.rec = recording
        self.pairing = pairing
        self.tl: Any = None
        self.lowerer: Any = None
        self.pos = 0
        self._announced = False  # the command about to be emitted is the one a matched call stands for
        self.following = True
        self._vars: dict[int, LoopVar] = {}   # id(this launch's loop var) -> the recorded launch's
        self._pairs: dict[int, Any] = {}      # id(this launch's handle) -> the recorded handle it equals
        self._keep: list[Any] = []            # the handles of _pairs, alive while their ids key it

    def __repr__(self) -> str:
        state = "following" if self.following else "stopped"
        return f"Follower({state} at call {self.pos} of {len(self.rec.calls)})"

    def start(self, tl: Any) -> None:
        self.tl = tl
        tl._follow = self
        # what lowers the put-off calls: a context of the same class with no state (lowering a put-off call
        # reads none), so that a deferred command does not hold the context that holds it
        self.lowerer = object.__new__(tl.__class__)

    def release(self) -> None:
        """Let go of the launch's context (a trace that raised: :meth:`finish` is not asked)."""
        self.stop()
        self.tl = None
        self._pairs.clear()
        self._keep.clear()

    def announced(self) -> bool:
        """Whether the command the context is emitting is that of the call just matched (and no other): the
        context asks at every command, so a command emitted by a path that is not followed ends the following."""
        ok, self._announced = self._announced, False
        return ok

    def stop(self) -> None:
        """Stop following: every later call is lowered as it is made."""
        self.following = False
        if self.tl is not None:
            self.tl._follow = None

    # --- the calls ---------------------------------------------------------------------------------
    def _next(self, kind: str, args: tuple) -> tuple | None:
        """The recorded call this one takes the place of, if it equals it (kind, context and arguments)."""
        calls = self.rec.calls
        pos = self.pos
        if pos >= len(calls):
            return None
        rec = calls[pos]
        if rec[0] != kind:
            return None
        # the context (what TLContext._ctx records), then the arguments: the hot path of a following launch
        tl = self.tl
        ncmd, var, it, scopes = rec[2]
        lp = tl._loop
        if tl._ncmd != ncmd or len(tl._scopes) != scopes or (lp is None) != (var is None):
            return None
        if lp is not None and not self.var(lp.var, var):
            return None
        mine = tl._iter
        if not (mine == it if mine.__class__ is int and it.__class__ is int else self.affine(mine, it)):
            return None
        if not self._items(zip(args, rec[1])):
            return None
        self.pos = pos + 1
        return rec

    def call(self, kind: str, args: tuple) -> bool:
        """A load or store: whether it equals the recorded call (else following stops). It is made as always."""
        if self._next(kind, args) is None:
            self.stop()
            return False
        self._announced = True
        return True

    def made(self, result: Handle) -> None:
        """What the load just made (its TCM buffer): following stops if it differs from the recorded one's."""
        if not self.handle(result, self.rec.calls[self.pos - 1][3]):
            self.stop()

    def composite(self, args: tuple) -> Completion | None:
        """A composite: if it equals the recorded one, do what it changes in the context and emit it with its
        lowering put off; returns its completion. None when it differs: following stops, and the caller lowers
        it as it is made."""
        rec = self._next("composite", args)
        if rec is None:
            self.stop()
            return None
        tl = self.tl
        where = tl._where()
        scratch = primary = None
        recipe = rec[3]
        if recipe is not None:
            (part, i), rd, recorded = recipe
            if part == "prologue":
                entry = args[9][i]
                operands = {n: entry[n] for n in rd.operands}
            else:
                o = args[11][i]
                entry = {"scope": o.scope, **o.operands, **o.extra}
                operands = {n: entry[n] for n in rd.operands}
            # what the call changes: it finds or allocates its scratch (and may raise here, as it would)
            scratch = tl._recipe_scratch_for(rd, operands, At(tl._ncmd, tl._loop is not None, part, i, rd.name))
            primary = scratch[rd.primary_out.name] if rd.primary_out is not None else None
            if len(scratch) != len(recorded) or not all(
                    # a plain TCM buffer (found or allocated here, so this launch's) equal in every field, a loop
                    # handle (scratch named per iteration) by its structure
                    x == y if x.__class__ is Handle and y.__class__ is Handle else self.handle(x, y)
                    for x, y in zip(scratch.values(), recorded.values())):
                # not the recorded scratch: lowered now, with the scratch it has, and following stops
                self.stop()
                cmd, _ = tl._lower_composite(args, where, tl._iter, (tl._next(primary), scratch))
                return tl._emit(cmd)
        tl._n_deferred += 1
        self._announced = True
        return tl._emit(Deferred(self.lowerer, snapshot(args), where, tl._iter, tl._next(primary), scratch))

    def finish(self) -> bool:
        """Whether the launch followed the recorded one to its end: every call equal, no call left over, the same
        loops (count, period, iteration labels, waits) and waits."""
        ok = self.following and self.pos == len(self.rec.calls) and self.rec.layout is not None \
            and _same_layout(layout(self.tl), self.rec.layout, self)
        self.release()
        return ok

    # --- equality, relative to the paired tensors --------------------------------------------------------
    def var(self, f: LoopVar | None, r: LoopVar | None) -> bool:
        if f is None or r is None:
            return f is r
        hit = self._vars.get(id(f))
        if hit is not None:
            return hit is r
        if (f.number, f.iterations, f.start, f.step, f.text) != (r.number, r.iterations, r.start, r.step, r.text):
            return False
        self._vars[id(f)] = r
        self._keep.append(f)
        return True

    def affine(self, f: Any, r: Any) -> bool:
        """Two ``iter`` labels, slice bounds or ring slots: ints by value, loop indices by loop and coefficients."""
        fc = f.__class__
        if fc is not r.__class__:
            return False
        if fc is Index:
            return (f.a == r.a and f.b == r.b and f._ja == r._ja and f._jb == r._jb) and self.var(f.var, r.var)
        return fc is int and f == r

    def value(self, f: Any, r: Any) -> bool:
        """Whether ``f`` (of this launch) equals ``r`` (recorded): see the module's docstring."""
        fc = f.__class__
        if fc is not r.__class__:
            return False
        if fc in _ATOMS:
            return f == r
        if fc is Handle or fc is LoopHandle:
            return self.handle(f, r)
        if fc is tuple or fc is list:
            return len(f) == len(r) and self._items(zip(f, r))
        if fc is dict:  # (a prologue or epilogue entry: its keys in order, then its values)
            return len(f) == len(r) and list(f) == list(r) and self._items(zip(f.values(), r.values()))
        if fc is float:
            return f == r and math.copysign(1.0, f) == math.copysign(1.0, r)  # NaN: unequal
        if fc is Scope:
            return f is r
        if fc is OpSpec:
            return (f.kind == r.kind and f.scope is r.scope and self.value(dict(f.operands), dict(r.operands))
                    and self.value(dict(f.extra), dict(r.extra)) and self.value(f.out, r.out))
        if fc is Index:
            return self.affine(f, r)
        if issubclass(fc, (np.integer, np.floating, np.bool_)):
            return bool(f == r) and (not issubclass(fc, np.floating)
                                     or math.copysign(1.0, float(f)) == math.copysign(1.0, float(r)))
        return False

    def _items(self, pairs: Any) -> bool:
        """Whether every ``(mine, recorded)`` of ``pairs`` is equal (:meth:`value`, its common cases inline)."""
        known = self._pairs
        for x, y in pairs:
            xc = x.__class__
            if x is y and (xc in _ATOMS or x is _NONE):  # most: the same None, bool, literal string, small int, ()
                continue
            if xc is Handle or xc is LoopHandle:
                # paired before, and its scratch scope (if any) still open; else checked in full
                if y.__class__ is not xc or ((known.get(id(x)) is not y or not x.origin.alive)
                                             and not self.handle(x, y)):
                    return False
            elif not self.value(x, y):
                return False
        return True

    def handle(self, f: Handle, r: Handle) -> bool:
        """Whether this launch's handle ``f`` equals the recorded ``r`` and this launch owns it (its scratch scope,
        if any, still open: a pair found before is taken only then)."""
        if self._pairs.get(id(f)) is r and f.origin.alive:
            return True
        if not self._handle(f, r):
            return False
        self._pairs[id(f)] = r
        self._keep.append(f)
        return True

    def _handle(self, f: Handle, r: Handle) -> bool:
        fc = f.__class__
        if fc is not r.__class__ or (fc is not Handle and fc is not LoopHandle):
            return False
        space = f.space
        if space is not r.space or f.shape != r.shape or f.dtype != r.dtype or f.pinned != r.pinned:
            return False
        if not self.tl._owns(f):
            return False
        if space is _TCM:
            if f.addr != r.addr or f.name != r.name or f.channel != r.channel:
                return False
        else:
            p = self.pairing
            ft, rt = p.index.of(f), p.index.of(r)
            if ft is None or rt is None or f.addr - ft.addr != r.addr - rt.addr:
                return False
            fn, rn, ftn, rtn = f.name, r.name, ft.name, rt.name
            if not (fn.startswith(ftn) and rn.startswith(rtn) and fn[len(ftn):] == rn[len(rtn):]):
                return False
            if not (p.tensor(ft, rt) and p.channel(f.channel, r.channel)):
                return False
        return fc is Handle or self._loop_handle(f, r)

    def _loop_handle(self, f: LoopHandle, r: LoopHandle) -> bool:
        if f.kind != r.kind or f.suffix != r.suffix or not self.var(f.var, r.var):
            return False
        fs, rs = f.slot, r.slot
        if (fs is None) != (rs is None) or (fs is not None and not self.affine(fs, rs)):
            return False
        if len(f.chain) != len(r.chain):
            return False
        for (a, c), (b, d) in zip(f.chain, r.chain):
            if not (self.affine(a, b) and self.affine(c, d)):
                return False
        fr, rr = f.root, r.root
        if (fr is None) != (rr is None) or (fr is not None and not self.handle(fr, rr)):
            return False
        if len(f.slots) != len(r.slots):
            return False
        for x, y in zip(f.slots, r.slots):
            if not self.handle(x, y):
                return False
        fp, rp = f.prefix, r.prefix
        if fp is None or rp is None:
            return fp is rp
        if fp.__class__ is not rp.__class__:
            return False
        if fp.__class__ is CommandName:
            return fp.stem == rp.stem and fp.cmd == rp.cmd and self.var(fp.var, rp.var)
        return self.handle(fp, rp)


class At(tuple):
    """Where a composite call is, ``(command id, in a body, part, index, recipe)``, in words
    (``command #9 (in a tl.range body) prologue[0]: recipe 'softmax_merge'``) written only when an error needs
    them: ``TLContext._where`` for every call, and a following call's recipe part (:class:`Follower`)."""

    __slots__ = ()

    def __new__(cls, ncmd: int, body: bool, part: str = "", index: int = 0, recipe: str = "") -> "At":
        return tuple.__new__(cls, (ncmd, body, part, index, recipe))

    def __str__(self) -> str:
        ncmd, body, part, index, recipe = self
        text = f"command #{ncmd}" + (" (in a tl.range body)" if body else "")
        if part:
            text += f" prologue[{index}]" if part == "prologue" else f" op {index}"
            text += f": recipe {recipe!r}"
        return text

    def __format__(self, spec: str) -> str:
        return format(str(self), spec)

    def __repr__(self) -> str:
        return f"At({str(self)!r})"


class Deferred:
    """A composite whose lowering :class:`Follower` put off: the call's arguments and what was done when it was
    made (where errors would name it, its ``iter`` label, its completion, its recipe scratch). ``command()``
    lowers it, once, with ``lowerer`` (a context with no state: see :meth:`Follower.start`)."""

    __slots__ = ("lowerer", "args", "where", "iter", "completion", "scratch", "_cmd")

    def __init__(self, lowerer: Any, args: tuple, where: str, iter_: Any, completion: Completion, scratch: Any):
        self.lowerer, self.args, self.where, self.iter = lowerer, args, where, iter_
        self.completion, self.scratch = completion, scratch
        self._cmd = None

    def command(self) -> Any:
        if self._cmd is None:
            self._cmd, _ = self.lowerer._lower_composite(self.args, self.where, self.iter,
                                                         (self.completion, self.scratch))
        return self._cmd

    def __repr__(self) -> str:
        return f"Deferred(command #{self.completion.cmd}{'' if self._cmd is None else ', lowered'})"


def lowered_segments(segments: Sequence[Plain | Loop]) -> list[Plain | Loop]:
    """``segments`` with every :class:`Deferred` command lowered (the others as they are)."""
    out: list[Plain | Loop] = []
    for seg in segments:
        if isinstance(seg, Plain):
            cmds = seg.commands
            if any(c.__class__ is Deferred for c in cmds):
                seg = Plain(seg.first_cmd, tuple(c.command() if c.__class__ is Deferred else c for c in cmds))
        elif any(c.__class__ is Deferred for c in seg.body):
            seg = dataclasses.replace(seg, body=tuple(c.command() if c.__class__ is Deferred else c
                                                      for c in seg.body))
        out.append(seg)
    return out


def layout(tl: Any) -> tuple:
    """The shape of a launch's program as traced so far, read without its commands: each segment's place and
    length; each loop's number, iterations, period, range, ``iter`` labels and waits; the waits outside loops."""
    segs = list(tl._segments) + ([Plain(tl._plain_first, tuple(tl._plain))] if tl._plain else [])
    out: list[tuple] = []
    for s in segs:
        if isinstance(s, Plain):
            out.append(("plain", s.first_cmd, len(s.commands)))
        else:
            out.append(("loop", s.number, s.first_cmd, len(s.body), s.iterations, s.period, s.var, s.iters, s.waits))
    return tuple(out), tuple(tl.waits)


def _same_layout(f: tuple, r: tuple, fol: Follower) -> bool:
    (fs, fw), (rs, rw) = f, r
    if fw != rw or len(fs) != len(rs):
        return False
    for a, b in zip(fs, rs):
        if a[0] != b[0]:
            return False
        if a[0] == "plain":
            if a != b:
                return False
        elif a[1:6] != b[1:6] or a[8] != b[8] or not fol.var(a[6], b[6]) or len(a[7]) != len(b[7]) \
                or not all(fol.affine(x, y) for x, y in zip(a[7], b[7])):
            return False
    return True
