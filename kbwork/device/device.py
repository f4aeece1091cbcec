"""A device run (DESIGN.md §14): every PE's launches through one event loop, the isolation check, and the
exact reductions.

PEs share bandwidth, never data, and they interact only through the channels their transfers share, and
only where sharing can slow a transfer (:func:`kbwork.device.flows.contended`). So a device run:

1. refuses, before simulating, any HBM range one PE writes and another reads or writes
   (:func:`check_isolation`);
2. splits the PEs into *groups*: PEs linked when their transfers touch a common contended channel
   (:func:`groups`); each group is simulated by itself, in one event loop;
3. simulates once a group whose launches are bindings of the same traces (DESIGN.md §19) to tensors laid out
   alike on channels alike (:func:`group_key`), and gives a later such group the earlier one's records, named
   by its own bindings (:class:`Replica`);
4. in timing mode, lets the steady state (:mod:`.steady`) insert whole periods of every loop, jointly
   for the PEs of a group;
5. in timing mode, runs a PE alone on its channels launch by launch, a launch equal to one simulated before
   replicated and one that differs from a steady one simulated before only in its loops' trip counts given
   that one's records (:func:`simulate_alone`, :mod:`.lengths`), and a plan with ``after`` edges in two phases
   at a cut, the launches that wait for no other PE's apart from the rest (:mod:`.cut`), the rest's PEs run
   PE by PE as well when no two of their transfers share a cycle of a contended channel
   (:func:`~kbwork.device.flows.flows_meet`); a PE's records from several loops are joined (:mod:`.join`).

Every reduction gives the plain simulation's results; :class:`Reductions` says which ran.
"""

from __future__ import annotations

import bisect
import functools
import operator
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import pandas as pd

from ..errors import ValidationError
from ..memory import Handle, LoopHandle, Space
from ..pe.commands import DmaCmd
from ..pe.program import Plain, handles_of
from ..pe.scheduler import Program
from .flows import FlowChannel, contended, flows_meet
from .order import Deps, Order, crosses, local


@dataclass
class Reductions:
    """Which exact reductions a device run used (``run.reductions``)."""

    pes: int = 1
    groups: int = 1                 # groups of PEs simulated separately (linked by contended channels)
    simulated: int = 1              # groups actually simulated; the others replicated from an equal one
    contended_channels: tuple[int, ...] = ()
    replicated_from: dict[int, int] = field(default_factory=dict)  # PE -> the PE whose records it took
    #: a run in two phases (:mod:`.cut`): PE -> its launches before the cut and after it (empty: not cut)
    cut: dict[int, tuple[int, int]] = field(default_factory=dict)
    #: launches of PEs alone that took the records of a launch of other loop lengths (:mod:`.lengths`)
    other_lengths: int = 0
    #: contended groups of a second phase (:mod:`.cut`) run PE by PE, since no two of their flows met
    apart: int = 0

    def __str__(self) -> str:
        parts = [f"{self.pes} PE{'s' if self.pes != 1 else ''}"]
        if self.pes > 1:
            parts.append(f"{self.groups} groups simulated separately" if self.groups > 1 else "one group")
            if self.simulated < self.groups:
                parts.append(f"{self.simulated} simulated, {self.groups - self.simulated} replicated from an "
                             f"identical one")
        if self.cut:
            before, later = (sum(x[i] for x in self.cut.values()) for i in (0, 1))
            parts.append(f"in two phases: {before} launches that wait for no other PE's simulated before the "
                         f"{later} that do or follow one")
        if self.apart:
            parts.append(f"{self.apart} contended group{'s' if self.apart != 1 else ''} after the cut run PE by PE "
                         f"(no two transfers met on a shared channel)")
        if self.other_lengths:
            parts.append(f"{self.other_lengths} launch{'es' if self.other_lengths != 1 else ''} taken from a launch "
                         f"of other loop lengths")
        parts.append(f"contended channels: {', '.join(map(str, self.contended_channels)) or 'none'}")
        return "; ".join(parts)


# --- footprints over a whole program ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Family:
    """HBM bytes a program touches: ``[addr + stride·i, addr + stride·i + size)`` for ``i`` in ``[0, count)``."""

    addr: int
    stride: int
    size: int
    count: int
    #: the lowest and one past the highest byte of any iteration (made once: the isolation sweep sorts by it)
    hull: tuple[int, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        addr = self.addr
        last = addr + self.stride * (self.count - 1)
        object.__setattr__(self, "hull", (addr, last + self.size) if last >= addr else (last, addr + self.size))

    def intervals(self) -> np.ndarray:
        lo = self.addr + self.stride * np.arange(self.count, dtype=np.int64)
        return np.stack([lo, lo + self.size], axis=1)


def _hbm_uses(trace: Any, reads: list, writes: list, chans: list) -> None:
    """Add every HBM range ``trace`` reads and writes to ``reads`` and ``writes`` (a loop's moving slices as
    families, not one per iteration), each as ``(Family, handle)``, and to ``chans`` the handles whose channels
    its transfers move bytes on (a DMA's HBM side, a composite's HBM operands and outs): one walk over the
    commands, a loop's body once."""
    HBM = Space.HBM

    def add(h: Handle, out: list, n: int) -> None:
        if not h.nbytes:
            return
        if isinstance(h, LoopHandle):
            if h.kind == "rows":
                out.append((Family(h.addr, h.stride, h.nbytes, n), h))
                return
            for i in range(n):  # anything else moving: each iteration (rare in HBM)
                c = h.at(i)
                out.append((Family(c.addr, 0, c.nbytes, 1), c))
            return
        out.append((Family(h.addr, 0, h.nbytes, 1), h))

    for seg in trace.segments:
        cmds, n = (seg.commands, 1) if isinstance(seg, Plain) else (seg.body, seg.iterations)
        for cmd in cmds:
            if isinstance(cmd, DmaCmd):  # reads its source, writes its destination (DESIGN.md §5)
                src, dst = cmd.src, cmd.dst
                chans.append(src if src.space is HBM else dst)
                if src.space is HBM:
                    add(src, reads, n)
                if dst.space is HBM:
                    add(dst, writes, n)
                continue
            # a composite reads every operand and writes every out, its rw_handles and its recipe scratch
            for op in cmd.ops:
                for h in op.operands.values():
                    if h.space is HBM:
                        chans.append(h)
                        add(h, reads, n)
                h = op.out
                if h is not None and h.space is HBM:
                    chans.append(h)
                    add(h, writes, n)
            for h in cmd.rw_handles:
                if h.space is HBM:
                    add(h, writes, n)
            for h in cmd.scratch:
                if h.space is HBM:
                    add(h, writes, n)


@dataclass
class Uses:
    """What one PE's launches touch in HBM: the channels their transfers move bytes on, and the byte ranges
    they read and write (loops' moving slices as families)."""

    channels: set[int]
    reads: list[Family]
    writes: list[Family]


def uses_of(progs: Sequence[Program]) -> Uses:
    """:class:`Uses` of one PE's launches: a launch bound from a trace has its trace's uses moved to its own
    tensors (:func:`_placed`, made once per trace), any other is walked (a loop's body once)."""
    chans: set[int] = set()
    reads: list[Family] = []
    writes: list[Family] = []
    for prog in progs:
        b = prog.trace.binding
        # (a trace bound to one launch only is walked: placing its uses would cost more than it saves)
        placed = _placed(b.traced) if b is not None and b.traced.bound > 1 else None
        if placed is None:
            r, w, c = [], [], []
            _hbm_uses(prog.trace, r, w, c)
            reads += [f for f, _ in r]
            writes += [f for f, _ in w]
            chans.update(h.channel for h in c)
            continue
        leaves = b.leaves
        p_reads, p_writes, p_chans = placed
        for fams, out in ((p_reads, reads), (p_writes, writes)):
            for i, f in fams:
                out.append(f if i is None else Family(f.addr + leaves[i].addr, f.stride, f.size, f.count))
        chans.update(c if i is None else leaves[i].channel for i, c in p_chans)
    return Uses(chans, reads, writes)


def _placed(traced: Any) -> tuple | None:
    """A trace's HBM uses relative to its tensor arguments, made once per trace: ``(reads, writes, channels)``,
    each family as ``(argument index, family relative to it)`` and each channel as ``(argument index,
    channel)``, with ``None`` for the index of what no argument holds (the kernel's own tensors: the same in
    every binding). None when the trace's uses cannot be told apart so (a tensor of the kernel's own overlaps
    an argument): each binding is then walked."""
    memo = traced.memo
    if "uses" in memo:
        return memo["uses"]
    r, w, c = [], [], []
    _hbm_uses(traced.trace, r, w, c)
    leaves = [(h.addr, h.end, i) for i, h in enumerate(traced.leaves) if h.space is Space.HBM]
    leaves.sort()
    starts = [x[0] for x in leaves]
    out = None
    try:
        for h in traced.constants:
            if any(lo < h.end and h.addr < hi for lo, hi, _ in leaves):
                raise LookupError(h)

        def where(lo: int, hi: int) -> int | None:
            k = bisect.bisect_right(starts, lo) - 1
            if k >= 0 and hi <= leaves[k][1] and lo < leaves[k][1]:
                return leaves[k][2]
            if any(a < hi and lo < b for a, b, _ in leaves) or lo == hi:
                raise LookupError(lo)  # across arguments, or nothing to place by
            return None

        fams = []
        for src in (r, w):
            placed = []
            for f, _ in src:
                i = where(*f.hull)
                placed.append((i, f if i is None else Family(f.addr - traced.leaves[i].addr, f.stride, f.size,
                                                             f.count)))
            fams.append(placed)
        chans = {(where(h.addr, max(h.end, h.addr + 1)), h.channel) for h in c}
        out = (fams[0], fams[1], [(i, ch) for i, ch in chans])
    except LookupError:
        out = None
    memo["uses"] = out
    return out


def _families_meet(a: Family, b: Family) -> bool:
    (alo, ahi), (blo, bhi) = a.hull, b.hull
    if ahi <= blo or bhi <= alo:
        return False
    if a.count == 1 and b.count == 1:
        return True
    small, big = (a, b) if a.count <= b.count else (b, a)
    x = small.intervals()
    if big.stride == 0:
        return bool(((x[:, 0] < big.addr + big.size) & (big.addr < x[:, 1])).any())
    s = big.stride
    if s < 0:  # walk it the other way round
        big = Family(big.addr + s * (big.count - 1), -s, big.size, big.count)
        s = -s
    # the big family's intervals meeting [x0, x1): j with addr + s·j < x1 and x0 < addr + s·j + size
    j_lo = np.maximum(0, np.floor_divide(x[:, 0] - big.addr - big.size, s) + 1)
    j_hi = np.minimum(big.count - 1, np.floor_divide(x[:, 1] - big.addr - 1, s))
    return bool((j_lo <= j_hi).any())


def merged(parts: Sequence[Uses]) -> Uses:
    """The :class:`Uses` of several launches together."""
    return Uses(set().union(*(u.channels for u in parts)), [f for u in parts for f in u.reads],
                [f for u in parts for f in u.writes])


def check_isolation(programs: dict[int, Sequence[Program]], tensors: Sequence[Handle],
                    uses: dict[int, Uses] | None = None, after: Deps | None = None,
                    launches: dict[int, list[Uses]] | None = None) -> None:
    """Refuse any HBM range a launch on one PE writes and a launch on another PE reads or writes, unless one of
    the two launches happens before the other (DESIGN.md §14, §16: program order and ``after`` edges).

    A sweep over the families' address hulls, so only families whose hulls overlap are compared exactly:
    PEs on tensors of their own cost one sort. ``launches``: PE -> each launch's uses (else ``uses``, PE -> all
    its launches', or both made from ``programs``); ``after``: the plan's dependencies.

    Raises:
        ValidationError: naming both PEs, both launches and the tensor (of the lowest pair of PEs in conflict).
    """
    if launches is None and uses is None:
        launches = {pe: [uses_of([p]) for p in programs[pe]] for pe in programs}
    per = launches if launches is not None else {pe: [uses[pe]] for pe in programs}
    order = Order(after) if after and crosses(after) else None
    items = []  # (hull lo, hull hi, pe, written, family, launch)
    for pe in sorted(programs):
        for i, u in enumerate(per[pe]):
            li = i if launches is not None else -1
            items += [(*f.hull, pe, False, f, li) for f in u.reads]
            items += [(*f.hull, pe, True, f, li) for f in u.writes]
    items.sort(key=operator.itemgetter(0, 1, 2, 3))
    active_r: list[tuple] = []
    active_w: list[tuple] = []
    reach_r = reach_w = 0  # the highest end among the active reads and writes
    found: list[tuple] = []
    for it in items:
        lo = it[0]
        # (most families meet nothing: the active lists are then emptied without a pass over them)
        if active_r:
            active_r, reach_r = ([], 0) if reach_r <= lo else ([a for a in active_r if a[1] > lo], reach_r)
        if active_w:
            active_w, reach_w = ([], 0) if reach_w <= lo else ([a for a in active_w if a[1] > lo], reach_w)
        for other in (active_w + active_r if it[3] else active_w) if active_w or (it[3] and active_r) else ():
            if other[2] != it[2] and _families_meet(other[4], it[4]):
                if order is not None and order.ordered((other[2], other[5]), (it[2], it[5])):
                    continue  # one launch happens before the other: the later sees the earlier's bytes
                w, o = (it, other) if it[3] else (other, it)
                if o[3] and o[2] < w[2]:
                    w, o = o, w  # both write: the lower PE is named the writer
                # the lowest pair of PEs first; then the lower PE writing; then a read before a write
                found.append(((min(w[2], o[2]), max(w[2], o[2]), w[2] > o[2], o[3], w[0], o[0]), w, o))
        if it[3]:
            active_w.append(it)
            reach_w = max(reach_w, it[1])
        else:
            active_r.append(it)
            reach_r = max(reach_r, it[1])
    if found:
        _, w, o = min(found, key=lambda x: x[0])
        name = _tensor_at(sorted(tensors, key=lambda h: h.addr), max(w[4].hull[0], o[4].hull[0]))
        verb = "writes" if o[3] else "reads"
        which = f" (PE {w[2]} launch {w[5]}, PE {o[2]} launch {o[5]})" if w[5] >= 0 else ""
        raise ValidationError(
            f"device run: PE {w[2]} writes tensor {name!r} and PE {o[2]} {verb} the same bytes{which}, and neither "
            f"launch happens before the other; PEs share data only in order (DESIGN.md §16). Order them with "
            f"Launch(..., after=(...)), give each PE its own tensors (or its own rows of one), or run both launches "
            f"on one PE.")


def _tensor_at(tensors: Sequence[Handle], addr: int) -> str:
    for h in tensors:
        if h.addr <= addr < h.end:
            return h.name
    return f"<HBM byte {addr}>"


# --- groups ----------------------------------------------------------------------------------------------------
def _pe_channels(pe: int, programs: dict[int, Sequence[Program]], uses: dict[int, Uses] | None) -> set[int]:
    """The channels PE ``pe``'s launches use: from ``uses`` when given, else found in its programs."""
    return uses[pe].channels if uses is not None else uses_of(programs[pe]).channels


def contended_channels(programs: dict[int, Sequence[Program]], topo,
                       uses: dict[int, Uses] | None = None) -> dict[int, int]:
    """Channel -> the number of DMA units that may move bytes on it, for every channel where they can slow
    one another (:func:`kbwork.device.flows.contended`)."""
    rate = topo.channel_fraction
    return {c: k for c, k in _channel_users(programs, topo, uses).items()
            if contended(rate, topo.dma_bytes_per_cycle, k)}


def _channel_users(programs: dict[int, Sequence[Program]], topo,
                   uses: dict[int, Uses] | None = None) -> dict[int, int]:
    """Channel -> DMA units that may move bytes on it (every DMA unit of every PE using it), ascending."""
    users: dict[int, int] = {}
    for pe in sorted(programs):
        for c in _pe_channels(pe, programs, uses):
            users[c] = users.get(c, 0) + topo.dma_channels
    return dict(sorted(users.items()))


def groups(programs: dict[int, Sequence[Program]], shared: dict[int, int],
           uses: dict[int, Uses] | None = None, after: Deps | None = None) -> list[list[int]]:
    """The PEs in groups linked by the contended channels they use and by ``after`` edges (DESIGN.md §16: a launch
    and the launches it waits for are simulated together), each group ascending, groups by first PE."""
    parent = {pe: pe for pe in programs}

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x
    owner: dict[int, int] = {}
    for pe in sorted(programs):
        for c in sorted(_pe_channels(pe, programs, uses) & set(shared)):
            if c in owner:
                a, b = find(owner[c]), find(pe)
                if a != b:
                    parent[max(a, b)] = min(a, b)
            else:
                owner[c] = pe
    for pe, rows in (after or {}).items():
        for ds in rows:
            for q, _ in ds:
                a, b = find(q), find(pe)
                if a != b:
                    parent[max(a, b)] = min(a, b)
    out: dict[int, list[int]] = {}
    for pe in sorted(programs):
        out.setdefault(find(pe), []).append(pe)
    return [out[k] for k in sorted(out)]


def group_key(group: Sequence[int], programs: dict[int, Sequence[Program]], shared: dict[int, int],
              after: Deps | None = None) -> tuple[tuple | None, tuple[int, ...]]:
    """What decides a group's records (DESIGN.md §19): each launch's trace id; the tensors it binds, each
    numbered by the order the group first meets it (which are the same tensor, across the group's launches);
    their channels, numbered alike, each with whether it is contended; and each launch's ``after`` dependencies,
    each PE named by its place in the group (DESIGN.md §16). Two groups with equal keys are
    bindings of the same traces to tensors laid out alike on channels alike: they evolve identically, and the
    one names its tensors as the other, tensor for tensor. Returns the key (None when a launch is no binding
    of a trace, when two of its tensors overlap without being one, or when a name its trace fixes holds one of
    the PE's tensor names, which a replica's names could not be told from: the group is then simulated) and
    the group's channels in the order met (what a replica's channels map through)."""
    key: list = []
    tensor_ids: dict[tuple, int] = {}
    channel_ids: dict[int, int] = {}
    deps = local(after, group) if after else None
    for k, pe in enumerate(group):
        traced = []
        names: list[str] = []
        for i, prog in enumerate(programs[pe]):
            b = prog.trace.binding
            if b is None or b.layout() is None:
                return None, ()
            key.append(b.trace_id)
            if deps is not None and deps[k][i]:
                key.append(("after", deps[k][i]))
            for h in b.tensors():
                c = h.channel
                key.append((tensor_ids.setdefault((h.addr, h.nbytes), len(tensor_ids)),
                            channel_ids.setdefault(c, len(channel_ids)), c in shared))
            traced.append(b.traced)
            names += [h.name for h in b.leaves]
        # a name any launch of the PE fixes must not be taken for one made from any of its tensors
        for t in traced:
            if not t.taken_names.isdisjoint(names) or any(n.startswith(st) for st in t.taken_stems for n in names):
                return None, ()
        if any("|" in n or "[" in n for n in names):
            return None, ()
        key.append(None)  # the end of a PE's launches
    return tuple(key), tuple(channel_ids)


def _traces_of(group: Sequence[int], programs: dict[int, Sequence[Program]]) -> tuple:
    """What two groups with equal :func:`group_key` s have equal, cheaply: each PE's launches' trace ids (a
    launch bound from no trace counts as its own)."""
    return tuple(tuple(id(p) if p.trace.binding is None else p.trace.binding.trace_id for p in programs[pe])
                 for pe in group)


def flow_channels(shared: dict[int, int], topo) -> dict[int, FlowChannel]:
    """A :class:`FlowChannel` for every contended channel."""
    rate = topo.channel_fraction
    return {c: FlowChannel(c, rate, topo.dma_bytes_per_cycle, k) for c, k in shared.items()}


# --- replicas -------------------------------------------------------------------------------------------------
#: How a DMA command's default label starts (``tl.load``, ``tl.store``); the rest names its source.
DMA_VERBS = ("dma_load ", "dma_store ")


def _commands(progs: Sequence[Program]) -> Sequence:
    from .steady import _Concat

    return progs[0].trace.commands if len(progs) == 1 else _Concat([p.trace.commands for p in progs])


def binding_names(src: Sequence[Program], dst: Sequence[Program]) -> dict[str, str]:
    """The name each name of ``src``'s launches takes in ``dst``'s, where they differ: both lists bindings of the
    same traces, walked side by side, handle by handle (a loop handle iteration by iteration). Each name is
    rendered by its own binding; nothing is parsed."""
    out: dict[str, str] = {}
    for a, b in zip(src, dst):
        for x, y in zip(handles_of(a.trace), handles_of(b.trace)):
            if x is y or x.name == y.name:
                continue
            if x.__class__ is LoopHandle:
                for i in range(x.var.iterations if x.var is not None else 0):
                    out[x.name_at(i)] = y.name_at(i)
            else:
                out[x.name] = y.name
    return out


def _rename(text: str, names: dict[str, str]) -> str:
    """``text`` (a stage's tensor: a name, or a fetch's two joined by ``|``) in the other binding."""
    new = names.get(text)
    if new is not None:
        return new
    if "|" in text:
        return "|".join([names.get(p, p) for p in text.split("|")])
    return text


class ReplicaNames:
    """A replica's names beside the simulated PE's (:func:`binding_names` of the two), made on first use; shared by
    the replica and its stage table (each holding the other would be a reference cycle)."""

    __slots__ = ("_make", "_map")

    def __init__(self, make: Any):
        self._make, self._map = make, None

    def __call__(self) -> dict[str, str]:
        if self._map is None:
            self._map, self._make = self._make(), None
        return self._map


class BoundTable:
    """A stage table as another PE's replica reads it: every column the simulated PE's, but ``chan`` (this PE's
    channels) and ``tensor`` (this PE's names, from its binding)."""

    def __init__(self, table: Any, names: Any, chan_map: dict[int, int] | None = None):
        self._t, self._names, self._chan_map = table, names, chan_map or {}
        self._tensor: pd.Categorical | None = None
        self._chan: np.ndarray | None = None

    @property
    def chan(self) -> np.ndarray:
        """Each stage's channel: the simulated PE's, mapped to this PE's (an identical group may sit on other
        channels: groups are compared relative to their channels)."""
        if self._chan is None:
            c = np.asarray(self._t.chan, dtype=np.int64)
            if self._chan_map and any(a != b for a, b in self._chan_map.items()):
                lut = np.arange(max(int(c.max(initial=0)), max(self._chan_map)) + 1, dtype=np.int64)
                for a, b in self._chan_map.items():
                    lut[a] = b
                c = np.where(c >= 0, lut[np.maximum(c, 0)], c)
            self._chan = c
        return self._chan

    def __len__(self) -> int:
        return len(self._t)

    def __repr__(self) -> str:
        return f"{self._t!r} (a replica)"

    # the columns a stage table is read by (``pe.stages.StageTable``), the simulated PE's
    kind = property(lambda self: self._t.kind)
    engine = property(lambda self: self._t.engine)
    phase = property(lambda self: self._t.phase)
    cmd = property(lambda self: self._t.cmd)
    op_kind = property(lambda self: self._t.op_kind)
    tile = property(lambda self: self._t.tile)
    k_tile = property(lambda self: self._t.k_tile)
    nbytes = property(lambda self: self._t.nbytes)
    dur = property(lambda self: self._t.dur)
    preds = property(lambda self: self._t.preds)

    def describe(self, s: int) -> str:
        return self._t.describe(s)

    @property
    def tensor(self) -> pd.Categorical:
        if self._tensor is None:
            col = pd.Categorical(self._t.tensor).remove_unused_categories()
            names = self._names()
            cats = [_rename(str(c), names) for c in col.categories.tolist()]
            codes = np.asarray(col.codes)
            if len(set(cats)) == len(cats) and not (codes < 0).any():
                # the bindings map tensors one to one, so distinct names stay distinct, perhaps reordered: the
                # categories sorted again, as a categorical made from this PE's names has them, and each stage's
                # code mapped to its name's new place (no name is made per stage)
                order = sorted(range(len(cats)), key=cats.__getitem__)
                place = np.empty(len(cats), dtype=np.int64)
                place[order] = np.arange(len(cats))
                self._tensor = pd.Categorical.from_codes(place[codes], categories=[cats[i] for i in order],
                                                         validate=False)
            else:  # (code -1, a missing name, reads the None after the names)
                self._tensor = pd.Categorical(np.asarray(cats + [None], dtype=object)[codes] if len(col) else [])
        return self._tensor

    def column(self, name: str) -> Any:
        return self.tensor if name == "tensor" else self.chan if name == "chan" else self._t.column(name)


class Replica:
    """The schedule of a PE whose group was replicated from an identical one (DESIGN.md §14, §19): the simulated
    PE's records, with this PE's own commands, channels and names (its binding's)."""

    def __init__(self, sched: Any, commands: Sequence, names: Any, chan_map: dict[int, int] | None = None):
        self.source = sched
        #: the simulated PE's names that this PE's binding names otherwise, and how (made on first use)
        self.names = ReplicaNames(names)
        self.table = BoundTable(sched.table, self.names, chan_map)
        self.commands = commands
        self._labels: list[str] | None = None

    topo = property(lambda self: self.source.topo)
    loops = property(lambda self: self.source.loops)
    reach = property(lambda self: self.source.reach)
    ctab = property(lambda self: self.source.ctab)
    dispatch_seq = property(lambda self: self.source.dispatch_seq)
    plan_seq = property(lambda self: self.source.plan_seq)
    plan_first = property(lambda self: self.source.plan_first)
    plan_end = property(lambda self: self.source.plan_end)
    reads = property(lambda self: self.source.reads)
    writes = property(lambda self: self.source.writes)
    waits = property(lambda self: self.source.waits)
    iters = property(lambda self: self.source.iters)
    logical_bytes = property(lambda self: self.source.logical_bytes)

    def edge_reach(self) -> int:
        return self.source.edge_reach()

    n_commands = property(lambda self: self.source.n_commands)
    n_stages = property(lambda self: self.source.n_stages)

    def periods(self) -> list[tuple[int, int, int]]:
        return self.source.periods()

    @property
    def labels(self) -> list[str]:
        """Each command's label: the simulated PE's, a default DMA label naming this PE's source."""
        if self._labels is None:
            names = self.names()
            cache: dict[str, str] = {}

            def label(x: str) -> str:
                for verb in DMA_VERBS:
                    if x.startswith(verb):
                        new = names.get(x[len(verb):])
                        return x if new is None else verb + new
                return x
            self._labels = [cache[x] if x in cache else cache.setdefault(x, label(x)) for x in self.source.labels]
        return self._labels

    def __repr__(self) -> str:
        return f"{self.source!r} (a replica)"


# --- simulating a device -----------------------------------------------------------------------------------------
def simulate_device(programs: dict[int, list[Program]], topo, tensors: Sequence[Handle],
                    memories: dict[int, list[Any]] | None = None, *, steady_state: bool = True,
                    why_full: str = "steady_state=False", reduce: bool = True,
                    after: Deps | None = None) -> tuple[dict[int, tuple], Reductions]:
    """Simulate every PE's launches (DESIGN.md §14): isolation checked first, then each group of PEs linked by a
    contended channel in one event loop, a group equal to an earlier one (:func:`group_key`) replicated from it.

    Args:
        programs: PE -> its launches' programs, in the order they run.
        topo: the device's topology.
        tensors: every HBM tensor of the simulator (to name them in errors).
        memories: data mode: PE -> each launch's ``LaunchMemory``.
        steady_state: timing mode: insert the remaining periods of loops once proven (DESIGN.md §12).
        reduce: False: no groups and no replication; every PE in one event loop, a flow on every channel of
            finite bandwidth (contended or not). The plain simulation every reduction must reproduce.
        after: PE -> per launch, the launches it waits for (``order.resolve_after``; DESIGN.md §16).

    Returns:
        PE -> ``(timeline, schedule, steady state)``, and the :class:`Reductions` used.

    Raises:
        ValidationError: a PE writes bytes another PE reads or writes, and neither launch happens before the
            other.
    """
    after = _any_edges(after)
    launch_uses = {pe: [uses_of([p]) for p in programs[pe]] for pe in programs}
    uses = {pe: merged(launch_uses[pe]) for pe in programs}
    if len(programs) > 1:  # isolation is between PEs: one PE's launches may share its bytes
        check_isolation(programs, tensors, uses, after, launch_uses)
    if after is not None and memories is None and reduce:
        from .cut import cut_points, worth_cutting

        n = cut_points(programs, launch_uses, after)
        if worth_cutting(programs, n):
            return _in_two_phases(programs, topo, n, launch_uses, after, steady_state, why_full)
    return _simulate(programs, topo, uses, memories, steady_state, why_full, reduce, after)


def _any_edges(deps: Deps | None) -> Deps | None:
    """``deps`` when some launch has a dependency, else None (a plan without edges runs as before them)."""
    return deps if deps and any(ds for rows in deps.values() for ds in rows) else None


def _in_two_phases(programs: dict[int, list[Program]], topo, n: dict[int, int], launch_uses: dict[int, list[Uses]],
                   after: Deps, steady_state: bool, why_full: str) -> tuple[dict[int, tuple], Reductions]:
    """A timing run at the cut ``n`` (:mod:`.cut`): the first phases as a device run of their own, then the
    second phases from where each PE's first ended; each PE's records joined."""
    from .cut import second_phase
    from .join import join

    head = {p: programs[p][:n[p]] for p in sorted(programs) if n[p]}
    out1, red1 = _simulate(head, topo, {p: merged(launch_uses[p][:n[p]]) for p in head}, None, steady_state,
                           why_full, True, None)
    rest, deps, begins, gates, offsets = second_phase(programs, n, out1, after, topo.sync_cycles)
    out2, red2 = _simulate(rest, topo, {p: merged(launch_uses[p][n[p]:]) for p in rest}, None, steady_state,
                           why_full, True, _any_edges(deps),
                           begins=begins, gates=gates, offsets=offsets)
    out = {}
    for p in sorted(programs):
        out[p] = join([out1[p], out2[p]]) if p in out1 and p in out2 else out1[p] if p in out1 else out2[p]
    red = Reductions(pes=len(programs), groups=red1.groups + red2.groups, simulated=red1.simulated + red2.simulated,
                     contended_channels=tuple(sorted(set(red1.contended_channels) | set(red2.contended_channels))),
                     replicated_from=dict(red1.replicated_from),
                     cut={p: (n[p], len(programs[p]) - n[p]) for p in sorted(programs)},
                     other_lengths=red1.other_lengths + red2.other_lengths, apart=red1.apart + red2.apart)
    return out, red


def simulate_alone(progs: Sequence[Program], launches: dict[tuple, Any], *, steady_state: bool = True,
                   why_full: str = "steady_state=False", red: Reductions | None = None,
                   other_lengths: bool = True, begin: int = 0, gates: Sequence[int] = ()) -> tuple:
    """A PE alone on its channels, its launches waiting for nothing but one another, simulated launch by launch:
    each as if alone from cycle 0 and moved to where the previous one ended, a launch equal to one simulated
    before (:func:`group_key` of it alone) replicated from it, and in timing mode a launch that differs from one
    simulated before only in its loops' trip counts given its records (:mod:`.lengths`; counted in ``red``;
    not with ``other_lengths`` False: ``reductions=False``). ``begin``, ``gates``: a PE going on from launches
    simulated in another loop (:mod:`.cut`): its first launch starts no earlier than ``begin``, and launch i no
    earlier than ``gates[i]`` (-1: no gate), as :func:`kbwork.device.loop.new_pe` has them.
    ``launches``: key -> ``(program, records, channels)``, and ``("lengths", key)`` -> the steady launches of a
    length key (:class:`.lengths.Source`), filled here. Exact: a launch of such a PE starts on an idle PE whose
    channels no one else moves bytes on, so what it does does not depend on when it starts.

    Returns:
        ``(timeline, schedule, steady state)``, the launches' records joined (:func:`kbwork.device.join.join`).
    """
    from .join import join
    from .lengths import from_other_length, length_key, steady_source
    from .steady import simulate_pe

    parts, shifts, t = [], [], begin
    for i, prog in enumerate(progs):
        if gates and gates[i] > t:
            t = gates[i]
        b = prog.trace.binding
        # a launch whose trace no other launch is bound to can equal no other: no key to make
        key, chans = group_key([0], {0: [prog]}, {}, None) if b is None or b.traced.bound > 1 else (None, ())
        hit = launches.get(key) if key is not None else None
        if hit is None:
            lk = length_key(prog) if steady_state and other_lengths else None
            sources = launches.get(("lengths", lk[0]), ()) if lk is not None else ()
            res = from_other_length(prog, sources, lk[1]) if sources else None
            if res is None:
                res = simulate_pe([prog], None, steady_state=steady_state, why_full=why_full)
                src = steady_source(prog, res, lk[1]) if lk is not None else None
                if src is not None:
                    launches.setdefault(("lengths", lk[0]), []).append(src)
            elif red is not None:
                red.other_lengths += 1
            if key is not None:
                launches[key] = (prog, res, chans)
        else:
            src, (tl, sched, state), src_chans = hit
            names = functools.partial(binding_names, [src], [prog])
            res = (tl, Replica(sched, prog.trace.commands, names, dict(zip(src_chans, chans))), state)
        parts.append(res)
        shifts.append(t)
        t += res[0].cycles
    return join(parts, shifts, gates or None)


def _simulate(programs: dict[int, list[Program]], topo, uses: dict[int, Uses], memories: dict[int, list[Any]] | None,
              steady_state: bool, why_full: str, reduce: bool, after: Deps | None, *,
              begins: dict[int, int] | None = None, gates: dict[int, list[int]] | None = None,
              offsets: dict[int, int] | None = None) -> tuple[dict[int, tuple], Reductions]:
    """:func:`simulate_device` past the isolation check (and the cut): groups, replicas, each group's loop.
    ``begins``, ``gates``, ``offsets``: the second phase of a cut (:func:`kbwork.device.cut.second_phase`); a
    group of it is replicated only from one that goes on from the same cycles."""
    from .steady import simulate_group, simulate_pe

    shared = contended_channels(programs, topo, uses)
    grouped = groups(programs, shared, uses, after)
    if not reduce:
        if topo.channel_fraction is not None:
            shared = _channel_users(programs, topo, uses)
        grouped = [sorted(programs)]
    red = Reductions(pes=len(programs), groups=len(grouped), simulated=0, contended_channels=tuple(shared))
    out: dict[int, tuple] = {}
    launches: dict[tuple, tuple] = {}  # simulate_alone's launches by key
    seen: dict[tuple, tuple[list[int], tuple[int, ...]]] = {}
    # replication needs a second group to replicate to; data mode computes every PE's numbers
    keyed = memories is None and reduce and len(grouped) > 1
    if keyed:  # only a group whose traces, PE by PE, another group also has can be replicated or replicate one
        alike = Counter(_traces_of(group, programs) for group in grouped)
    for group in grouped:
        key, chans = group_key(group, programs, shared, after) \
            if keyed and alike[_traces_of(group, programs)] > 1 else (None, ())
        if key is not None and begins is not None:  # a second phase: alike only if it goes on from the same cycles
            key = (key, tuple((begins[pe], tuple(gates[pe]), offsets[pe]) for pe in group))
        hit = seen.get(key) if key is not None else None
        if hit is not None:  # an identical group: its records are the earlier one's
            src_group, src_chans = hit
            chan_map = dict(zip(src_chans, chans))
            for pe, src in zip(group, src_group):
                tl, sched, state = out[src]
                names = functools.partial(binding_names, programs[src], programs[pe])
                out[pe] = (tl, Replica(sched, _commands(programs[pe]), names, chan_map), state)
                red.replicated_from[pe] = src
            continue
        red.simulated += 1
        mine = {c: k for c, k in shared.items() if any(c in uses[pe].channels for pe in group)}
        deps = local(after, group) if after else [()] * len(group)
        go_on = {} if begins is None else {
            "begins": [begins[pe] for pe in group], "outer_after": [gates[pe] for pe in group],
            "cmd_offsets": [offsets[pe] for pe in group]}
        results = None
        if begins is not None and memories is None and not any(any(d) for d in deps):
            # a second phase's PEs that wait for none of it: launch by launch from where each first phase ended,
            # kept unless two of their flows meet on a contended channel (on channels of its own none can)
            results = [simulate_alone(programs[pe], launches, steady_state=steady_state, why_full=why_full,
                                      red=red, other_lengths=reduce, begin=begins[pe], gates=gates[pe])
                       for pe in group]
            if flows_meet(results, sorted(mine), topo.dma_base_cycles):
                results = None
            else:
                red.apart += bool(mine)
        if results is not None:
            out.update(zip(group, results))
        elif len(group) == 1 and not mine:  # alone on its channels: every transfer's duration is known when it starts
            pe = group[0]
            if memories is None and begins is None and len(programs[pe]) > 1 and not any(deps[0]):
                out[pe] = simulate_alone(programs[pe], launches, steady_state=steady_state, why_full=why_full,
                                         red=red, other_lengths=reduce)
            else:
                one = {} if begins is None else {"begin": begins[pe], "outer_after": gates[pe],
                                                 "cmd_offset": offsets[pe]}
                out[pe] = simulate_pe(programs[pe], None if memories is None else memories[pe],
                                      steady_state=steady_state, why_full=why_full, after=deps[0],
                                      sync=topo.sync_cycles, **one)
        else:
            out.update(zip(group, simulate_group([programs[pe] for pe in group],
                                                 None if memories is None else [memories[pe] for pe in group],
                                                 flow_channels(mine, topo), steady_state=steady_state,
                                                 why_full=why_full, after=deps, sync=topo.sync_cycles, **go_on)))
        if key is not None:
            seen[key] = (group, chans)
    return out, red
