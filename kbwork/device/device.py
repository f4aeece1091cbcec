"""A device run (DESIGN.md §14): every PE's launches through one event loop, the isolation check, and the
exact reductions.

PEs share bandwidth, never data, and they interact only through the channels their transfers share, and
only where sharing can slow a transfer (:func:`kbwork.device.flows.contended`). So a device run:

1. refuses, before simulating, any HBM range one PE writes and another reads or writes
   (:func:`check_isolation`);
2. splits the PEs into *groups*: PEs linked when their transfers touch a common contended channel
   (:func:`groups`); each group is simulated by itself, in one event loop;
3. simulates a group whose launch lists and layouts, relative to their tensors, equal an earlier group's
   once, and gives the later group the earlier one's records (:func:`group_key`); a PE alone in its group
   that followed an earlier PE's calls to the end (:class:`Follow`, ``triton_emu.follow``) is known to
   equal it without a key, and takes its records the same way, its commands never made;
4. in timing mode, lets the steady state (:mod:`.steady`) insert whole periods of every loop, jointly
   for the PEs of a group.

Every reduction gives the plain simulation's results; :class:`Reductions` says which ran.
"""

from __future__ import annotations

import bisect
import operator
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import pandas as pd

from ..errors import ValidationError
from ..memory import Handle, LoopHandle, Space
from ..pe.commands import DmaCmd
from ..pe.program import Plain
from ..pe.scheduler import Program
from ..symbolic import Index
from .flows import FlowChannel, contended


@dataclass
class Reductions:
    """Which exact reductions a device run used (``run.reductions``)."""

    pes: int = 1
    groups: int = 1                 # groups of PEs simulated separately (linked by contended channels)
    simulated: int = 1              # groups actually simulated; the others replicated from an equal one
    contended_channels: tuple[int, ...] = ()
    replicated_from: dict[int, int] = field(default_factory=dict)  # PE -> the PE whose records it took

    def __str__(self) -> str:
        parts = [f"{self.pes} PE{'s' if self.pes != 1 else ''}"]
        if self.pes > 1:
            parts.append(f"{self.groups} groups simulated separately" if self.groups > 1 else "one group")
            if self.simulated < self.groups:
                parts.append(f"{self.simulated} simulated, {self.groups - self.simulated} replicated from an "
                             f"identical one")
        parts.append(f"contended channels: {', '.join(map(str, self.contended_channels)) or 'none'}")
        return "; ".join(parts)


@dataclass(frozen=True)
class Follow:
    """A PE whose every launch followed, call by call, the launch at the same place of PE ``ref``
    (``triton_emu.follow``): its programs are ``ref``'s with ``tensors`` (a recorded tensor's address ->
    ``(recorded tensor, this PE's)``) and ``channels`` (a recorded channel -> this PE's) put in."""

    ref: int
    tensors: dict[int, tuple[Handle, Handle]]
    channels: dict[int, int]

    def __repr__(self) -> str:
        return f"Follow(PE {self.ref}, {len(self.tensors)} tensors, channels {self.channels})"

    def uses(self, placed: "Placed") -> "Uses | None":
        """The followed PE's uses (``placed``: each family with the tensor it lies in) with this PE's tensors and
        channels; None if something does not map (a tensor or channel this PE did not pair)."""
        moved = []
        for fams in (placed.reads, placed.writes):
            out = []
            for f, t in fams:
                pair = self.tensors.get(t.addr)
                if pair is None:
                    return None
                out.append(Family(f.addr + pair[1].addr - t.addr, f.stride, f.size, f.count))
            moved.append(out)
        chans = {self.channels.get(c) for c in placed.channels}
        if None in chans:
            return None
        return Uses(chans, moved[0], moved[1])


@dataclass(frozen=True)
class Placed:
    """A PE's uses with each family's tensor (what :meth:`Follow.uses` moves to a following PE's tensors); a
    family that lies in no single tensor makes it None (:func:`placed`)."""

    channels: set[int]
    reads: list[tuple["Family", Handle]]
    writes: list[tuple["Family", Handle]]


def placed(uses: "Uses", by_addr: Sequence[Handle], starts: Sequence[int]) -> Placed | None:
    """``uses`` with each family's tensor (``by_addr``: the tensors by address, ``starts`` their addresses)."""
    out = []
    for fams in (uses.reads, uses.writes):
        found = []
        for f in fams:
            lo, hi = f.hull
            i = bisect.bisect_right(starts, lo) - 1
            if i < 0 or hi > by_addr[i].end:
                return None
            found.append((f, by_addr[i]))
        out.append(found)
    return Placed(uses.channels, out[0], out[1])


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


def _hbm_uses(prog: Program, reads: list[Family], writes: list[Family], chans: set[int]) -> None:
    """Add every HBM range ``prog`` reads and writes to ``reads`` and ``writes`` (a loop's moving slices as
    families, not one per iteration), and to ``chans`` the channels its transfers move bytes on (a DMA's HBM
    side, a composite's HBM operands and outs): one walk over the commands, a loop's body once."""
    HBM = Space.HBM

    def add(h: Handle, out: list[Family], n: int) -> None:
        if not h.nbytes:
            return
        if isinstance(h, LoopHandle):
            if h.kind == "rows":
                out.append(Family(h.addr, h.stride, h.nbytes, n))
                return
            for i in range(n):  # anything else moving: each iteration (rare in HBM)
                c = h.at(i)
                out.append(Family(c.addr, 0, c.nbytes, 1))
            return
        out.append(Family(h.addr, 0, h.nbytes, 1))

    for seg in prog.trace.segments:
        cmds, n = (seg.commands, 1) if isinstance(seg, Plain) else (seg.body, seg.iterations)
        for cmd in cmds:
            if isinstance(cmd, DmaCmd):  # reads its source, writes its destination (DESIGN.md §5)
                src, dst = cmd.src, cmd.dst
                chans.add(src.channel if src.space is HBM else dst.channel)
                if src.space is HBM:
                    add(src, reads, n)
                if dst.space is HBM:
                    add(dst, writes, n)
                continue
            # a composite reads every operand and writes every out, its rw_handles and its recipe scratch
            for op in cmd.ops:
                for h in op.operands.values():
                    if h.space is HBM:
                        chans.add(h.channel)
                        add(h, reads, n)
                h = op.out
                if h is not None and h.space is HBM:
                    chans.add(h.channel)
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
    """:class:`Uses` of one PE's launches, in one walk over their commands (a loop's body once)."""
    chans: set[int] = set()
    reads: list[Family] = []
    writes: list[Family] = []
    for prog in progs:
        _hbm_uses(prog, reads, writes, chans)
    return Uses(chans, reads, writes)


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


def check_isolation(programs: dict[int, Sequence[Program]], tensors: Sequence[Handle],
                    uses: dict[int, Uses] | None = None) -> None:
    """Refuse any HBM range one PE writes and another PE reads or writes (DESIGN.md §14).

    A sweep over the families' address hulls, so only families whose hulls overlap are compared exactly:
    PEs on tensors of their own cost one sort.

    Raises:
        ValidationError: naming both PEs and the tensor (of the lowest pair of PEs in conflict).
    """
    uses = uses or {pe: uses_of(programs[pe]) for pe in programs}
    items = []  # (hull lo, hull hi, pe, written, family)
    for pe in sorted(programs):
        items += [(*f.hull, pe, False, f) for f in uses[pe].reads]
        items += [(*f.hull, pe, True, f) for f in uses[pe].writes]
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
        raise ValidationError(
            f"device run: PE {w[2]} writes tensor {name!r} and PE {o[2]} {verb} the same bytes; PEs share "
            f"bandwidth, never data (DESIGN.md §14). Give each PE its own tensors (or its own rows of one), or "
            f"run both launches on one PE.")


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
           uses: dict[int, Uses] | None = None) -> list[list[int]]:
    """The PEs in groups linked by the contended channels they use, each group ascending, groups by first PE."""
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
    out: dict[int, list[int]] = {}
    for pe in sorted(programs):
        out.setdefault(find(pe), []).append(pe)
    return [out[k] for k in sorted(out)]


def tensor_index(tensors: Sequence[Handle]) -> tuple[list[Handle], list[int], set[str], set[int], dict[str, tuple]]:
    """What :func:`group_key` looks up, made once for every group of a run: the HBM tensors by address, their
    start addresses, their names and the lengths of those, and a memo of the keys of plain TCM handles (filled
    by the groups as they are keyed: see :func:`group_key`)."""
    by_addr = sorted(tensors, key=lambda h: h.addr)
    names = {h.name for h in by_addr}
    return by_addr, [h.addr for h in by_addr], names, {len(n) for n in names}, {}


def _tcm_names(h: Any) -> tuple[list[str], list[tuple[str, str]]]:
    """The names handle ``h`` takes in the op_log in every iteration of its loop, as far as their tensor part
    (before ``[``) goes: full names (a slice's cut at its ``[``), and for a buffer named after a body command
    (``softmax_merges9.P``) its ``(stem, suffix)``, the command id between."""
    if not isinstance(h, LoopHandle):
        return [h.name], []
    if h.kind == "named":
        pre = h.prefix
        if not isinstance(pre, LoopHandle):  # a CommandName
            names, stems = [], [(pre.stem, h.suffix)]
        else:
            names, stems = _tcm_names(pre)
            names, stems = [n + h.suffix for n in names], [(st, suf + h.suffix) for st, suf in stems]
    elif h.kind == "rows":
        names, stems = _tcm_names(h.root)
    else:
        names, stems = [x.name for x in h.slots], []
    return ([n + "[" for n in names] if h.chain else names), stems


def _misread_by_name(h: Handle, hbm_names: set[str]) -> bool:
    """Whether a replica's text renaming (``rename_tensor``) could rename a name TCM handle ``h`` takes: one
    whose tensor part (before ``[``) is an HBM tensor's name ("O" beside a tensor O, a ring slot "buf0" beside
    a tensor buf0), or that holds ``|`` (what separates a fetch's two names), or a command-named buffer whose
    stem starts an HBM tensor's name."""
    if not isinstance(h, LoopHandle):  # most handles: one name
        n = h.name
        return "|" in n or n.split("[", 1)[0] in hbm_names
    names, stems = _tcm_names(h)
    if any("|" in n or n.split("[", 1)[0] in hbm_names for n in names):
        return True
    return any(x.startswith(stem) for stem, _ in stems for x in hbm_names)


def group_key(group: Sequence[int], programs: dict[int, Sequence[Program]], tensors: Sequence[Handle],
              shared: dict[int, int], index: tuple | None = None
              ) -> tuple[tuple | None, tuple[str, ...], tuple[int, ...]]:
    """What decides a group's records, with every HBM tensor and channel named relative to the group (the order
    it first meets them): two groups with equal keys evolve identically. Returns the key (None when a program
    holds something the key cannot describe: the group is then simulated), the names a replica renames (the
    group's HBM tensors and the names made from them, in the order met) and its channels in the order met (what
    a replica's channels map through)."""
    by_addr, starts, hbm_all, hbm_lengths, tcm_keys = index if index is not None else tensor_index(tensors)
    undescribable = []
    tensor_ids: dict[int, int] = {}
    tensor_names: list[str] = []  # every name a replica renames, in the order met: HBM tensors and names made from them
    hbm_names: list[str] = []     # the HBM tensors, by relative id
    hbm_ids: dict[str, int] = {}  # and their relative ids by name
    named: set[str] = set()       # what tensor_names holds (a group may name thousands)
    name_lengths: set[int] = set()  # the lengths of hbm_names (where a TCM name's prefix may be one of them)
    channel_ids: dict[int, int] = {}
    import bisect

    memo: dict[int, Any] = {}  # id(handle) -> its key (never empty, so never false)
    known = memo.get

    def hkey(h: Any) -> Any:
        k = memo.get(id(h))
        if k is None:
            k = memo[id(h)] = _hkey(h)
        return k

    def _hkey(h: Any) -> Any:
        if not isinstance(h, Handle):
            undescribable.append(h)
            return ("?",)
        if h.space is Space.TCM:
            name: Any = h.name
            plain = h.__class__ is Handle
            if plain:
                # A plain TCM handle whose name no HBM tensor's name could rename has a key of its values
                # alone, the same in every group: kept by name for the run's later groups (most of a PE's
                # handles are such, and every PE of a device makes its own, equal ones). A hit is the same
                # tuple object, which also makes comparing two groups' keys cheaper.
                hit = tcm_keys.get(name)
                if hit is not None and hit[1] == h.addr and hit[3] == h.dtype and hit[2] == h.shape \
                        and hit[4] == h.pinned:
                    return hit
            base_name = name.split("[", 1)[0]
            if _misread_by_name(h, hbm_all):
                undescribable.append(h)
                return ("?",)
            # "K0_tcm": a TCM name made from a tensor's, renamed with it -- from the first tensor met whose name
            # is a proper prefix (looked up prefix by prefix, only at the lengths the tensors' names have: a
            # group may hold thousands of tensors, and its names are mostly of a few lengths)
            n = len(base_name)
            tids = [t for t in (hbm_ids.get(base_name[:k]) for k in name_lengths if k < n) if t is not None]
            if tids:
                tid = min(tids)
                if base_name not in named:
                    named.add(base_name)
                    tensor_names.append(base_name)
                name = ("from", tid, name[len(hbm_names[tid]):])
            base = (0, h.addr, h.shape, h.dtype, h.pinned, name)
            if plain and not any(base_name[:k] in hbm_all for k in hbm_lengths if k < n):
                tcm_keys[name] = base  # no proper prefix is any HBM tensor's name: no group renames it
        else:
            i = bisect.bisect_right(starts, h.addr) - 1
            if i < 0 or not (by_addr[i].addr <= h.addr < by_addr[i].end or h.nbytes == 0):
                undescribable.append(h)  # HBM bytes outside every tensor: no relative address to give
                return ("?",)
            t = by_addr[i]
            tid = tensor_ids.get(t.addr)
            if tid is None:
                # a name rename_tensor would split ("|": a fetch's pair, "[": a slice); checked where a tensor is
                # first met, not for every handle of one
                if "|" in t.name or "[" in t.name:
                    undescribable.append(h)
                    return ("?",)
                tid = tensor_ids[t.addr] = len(tensor_ids)
                named.add(t.name)
                tensor_names.append(t.name)
                hbm_names.append(t.name)
                hbm_ids.setdefault(t.name, tid)
                name_lengths.add(len(t.name))
            cid = channel_ids.setdefault(h.channel, len(channel_ids))
            base = (1, tid, h.addr - t.addr, h.shape, h.dtype, h.pinned, cid, h.channel in shared,
                    h.name[len(t.name):] if h.name.startswith(t.name) else None)
        if isinstance(h, LoopHandle):
            return base + (h.kind, h.stride, None if h.slot is None else (h.slot.a, h.slot.b),
                           tuple(x.addr for x in h.slots), len(h.chain))
        return base

    def ckey(cmd: Any) -> tuple:
        it = cmd.iter
        it = (it.a, it.b) if isinstance(it, Index) else it
        if isinstance(cmd, DmaCmd):
            # the default label names the source ("dma_load K[0:128]"): a replica renames it with its tensors
            verb = "dma_load " if cmd.src.space is Space.HBM else "dma_store "
            if cmd.auto_label is not None or cmd.label == verb + cmd.src.name:
                label: Any = ("default", verb)
            elif cmd.label.startswith(DMA_VERBS) and \
                    any(p.split("[", 1)[0] in hbm_all for p in cmd.label.split(" ", 1)[1].split("|")):
                undescribable.append(cmd)  # names a tensor like a default label: a replica would rename it
                label = ("?",)
            else:
                label = cmd.label
            return ("dma", hkey(cmd.src), hkey(cmd.dst), label, it)
        # an op is its kind, scope and shipped scalars (a GEMM's m, k, n, trans_b by value: they shape its
        # stages; other scalars by name: their values change numbers, never times) and its handles' keys,
        # which hold their space, shape, dtype and pinning: everything its plan depends on (OpSpec.signature).
        # One flat tuple per command: an op's kind fixes how many operands follow it (validated against the op
        # table), so the flat sequence reads back unambiguously. (Plain strings and tuples: the key is hashed,
        # and an enum's hash is a Python-level call; a handle's key is looked up in the memo inline, hkey
        # making it the first time; no comprehension per op, each of which is a call of its own.)
        flat: list = ["cmd", cmd.label, it]
        put = flat.append
        for op in cmd.ops:
            put(op.kind)
            put(op.scope._value_)
            put(tuple(op.extra.items()) if op.kind == "gemm" else tuple(op.extra))
            for n, h in op.operands.items():
                put(n)
                put(known(id(h)) or hkey(h))
            h = op.out
            put(None if h is None else known(id(h)) or hkey(h))
        put(0)  # then the rw handles, and after 1 the scratch (ints: never an op's kind nor a handle's key)
        for h in cmd.rw_handles:
            put(known(id(h)) or hkey(h))
        put(1)
        for h in cmd.scratch:
            put(known(id(h)) or hkey(h))
        return tuple(flat)

    key = []
    for pe in group:
        for prog in programs[pe]:
            tr = prog.trace
            for seg in tr.segments:
                if isinstance(seg, Plain):
                    key.append(("plain", tuple([ckey(c) for c in seg.commands])))
                else:
                    key.append(("loop", seg.iterations, seg.period, tuple([ckey(c) for c in seg.body]),
                                tuple((x.a, x.b) if isinstance(x, Index) else x for x in seg.iters), seg.waits))
            key.append(("waits", tuple(tr.waits)))
        key.append(("pe-end",))
    return (None if undescribable else tuple(key)), tuple(tensor_names), tuple(channel_ids)


def flow_channels(shared: dict[int, int], topo) -> dict[int, FlowChannel]:
    """A :class:`FlowChannel` for every contended channel."""
    rate = topo.channel_fraction
    return {c: FlowChannel(c, rate, topo.dma_bytes_per_cycle, k) for c, k in shared.items()}


# --- replicas -------------------------------------------------------------------------------------------------
#: How a DMA command's default label starts (``tl.load``, ``tl.store``); the rest names its source.
DMA_VERBS = ("dma_load ", "dma_store ")


def rename_label(label: str, rename: dict[str, str]) -> str:
    """A command's label in a replica: a default DMA label (``dma_load K0[0:128]``) names the replica's tensor."""
    for verb in DMA_VERBS:
        if label.startswith(verb):
            return verb + rename_tensor(label[len(verb):], rename)
    return label


def rename_tensor(name: str, rename: dict[str, str]) -> str:
    """``name`` (an op_log ``tensor``: ``K[0:128]``, ``a|b``) with every HBM tensor in it renamed by ``rename``."""
    if not name:
        return name
    if "|" not in name:  # most names: one tensor, or a slice of one
        base = name.partition("[")[0]
        new = rename.get(base)
        return name if new is None else new + name[len(base):]
    parts = name.split("|")
    for i, part in enumerate(parts):
        base = part.split("[", 1)[0]
        if base in rename:
            parts[i] = rename[base] + part[len(base):]
    return "|".join(parts)


def _commands(progs: Sequence[Program]) -> Sequence:
    from .steady import _Concat

    return progs[0].trace.commands if len(progs) == 1 else _Concat([p.trace.commands for p in progs])


class _RenamedTable:
    """A stage table as another PE's replica reads it: every column shared, ``tensor`` with its own names."""

    def __init__(self, table: Any, rename: dict[str, str], chan_map: dict[int, int] | None = None):
        self._t, self._rename, self._chan_map = table, rename, chan_map or {}
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

    def __getattr__(self, name: str) -> Any:
        return getattr(self._t, name)

    def __repr__(self) -> str:
        return f"{self._t!r} (a replica)"

    @property
    def tensor(self) -> pd.Categorical:
        if self._tensor is None:
            col = pd.Categorical(self._t.tensor).remove_unused_categories()
            rename = self._rename
            cats = [rename_tensor(str(c), rename) for c in col.categories.tolist()]
            codes = np.asarray(col.codes)
            if len(set(cats)) == len(cats) and not (codes < 0).any():
                # renaming keeps distinct names distinct (tensors map one to one) but may reorder them: the
                # categories sorted again, as a categorical made from the renamed names has them, and each
                # stage's code mapped to its name's new place (no name is made per stage)
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
    """The schedule of a PE whose group was replicated from an identical one (DESIGN.md §14): the simulated PE's
    records, with this PE's own commands and tensor names."""

    def __init__(self, sched: Any, rename: dict[str, str], commands: Sequence, chan_map: dict[int, int] | None = None):
        self._s = sched
        self._rename = rename
        self.table = _RenamedTable(sched.table, rename, chan_map)
        self.commands = commands
        self._labels: list[str] | None = None

    @property
    def labels(self) -> list[str]:
        if self._labels is None:
            cache: dict[str, str] = {}
            self._labels = [cache[x] if x in cache else cache.setdefault(x, rename_label(x, self._rename))
                            for x in self._s.labels]
        return self._labels

    def __getattr__(self, name: str) -> Any:
        return getattr(self._s, name)

    def __repr__(self) -> str:
        return f"{self._s!r} (a replica)"


# --- simulating a device -----------------------------------------------------------------------------------------
def simulate_device(programs: dict[int, list[Program]], topo, tensors: Sequence[Handle],
                    memories: dict[int, list[Any]] | None = None, *, steady_state: bool = True,
                    why_full: str = "steady_state=False", reduce: bool = True,
                    follows: dict[int, Follow] | None = None) -> tuple[dict[int, tuple], Reductions]:
    """Simulate every PE's launches (DESIGN.md §14): isolation checked first, then each group of PEs linked by a
    contended channel in one event loop, a group equal to an earlier one replicated from it.

    Args:
        programs: PE -> its launches' programs, in the order they run.
        topo: the device's topology.
        tensors: every HBM tensor of the simulator (to name them in errors and to compare groups).
        memories: data mode: PE -> each launch's ``LaunchMemory``.
        steady_state: timing mode: insert the remaining periods of loops once proven (DESIGN.md §12).
        reduce: False: no groups and no replication; every PE in one event loop, a flow on every channel of
            finite bandwidth (contended or not). The plain simulation every reduction must reproduce.
        follows: PEs whose launches followed another PE's (:class:`Follow`): what they touch is read from the
            followed PE's, and alone in their group they take its records without their commands being made.

    Returns:
        PE -> ``(timeline, schedule, steady state)``, and the :class:`Reductions` used.

    Raises:
        ValidationError: a PE writes bytes another PE reads or writes.
    """
    from .steady import simulate_group, simulate_pe

    follows = dict(follows or {}) if reduce and memories is None else {}
    uses: dict[int, Uses] = {}
    where: dict[int, Placed | None] = {}  # a followed PE's uses, placed in its tensors (once for all who follow it)
    index = tensor_index(tensors) if follows else None
    for pe in sorted(programs, key=lambda p: p in follows):  # the followed PEs first
        fo = follows.get(pe)
        mapped = None
        if fo is not None and fo.ref in uses:
            if fo.ref not in where:
                where[fo.ref] = placed(uses[fo.ref], index[0], index[1])
            mapped = fo.uses(where[fo.ref]) if where[fo.ref] is not None else None
        if mapped is None:
            follows.pop(pe, None)
            mapped = uses_of(programs[pe])
        uses[pe] = mapped
    if len(programs) > 1:  # isolation is between PEs: one PE's launches may share its bytes
        check_isolation(programs, tensors, uses)
    shared = contended_channels(programs, topo, uses)
    grouped = groups(programs, shared, uses)
    if not reduce:
        if topo.channel_fraction is not None:
            shared = _channel_users(programs, topo, uses)
        grouped = [sorted(programs)]
    red = Reductions(pes=len(programs), groups=len(grouped), simulated=0, contended_channels=tuple(shared))
    out: dict[int, tuple] = {}
    seen: dict[tuple, tuple[list[int], tuple[str, ...], tuple[int, ...]]] = {}
    # replication needs a second group to replicate to; data mode computes every PE's numbers
    keyed = memories is None and reduce and len(grouped) > 1
    index = (index or tensor_index(tensors)) if keyed else None
    # a PE alone with its records: (the PE whose records they are, its names -> this PE's, its channels -> this PE's)
    alone: dict[int, tuple[int, dict[str, str], dict[int, int]]] = {}

    def lone(group: list[int]) -> bool:
        return len(group) == 1 and not (uses[group[0]].channels & shared.keys())

    def simulate(group: list[int]) -> None:
        key, names, chans = group_key(group, programs, tensors, shared, index) if keyed else (None, (), ())
        hit = seen.get(key) if key is not None else None  # one lookup: hashing a key walks all of it
        if hit is not None:  # an identical group: its records are the earlier one's
            src_group, src_names, src_chans = hit
            rename, chan_map = dict(zip(src_names, names)), dict(zip(src_chans, chans))
            for pe, src in zip(group, src_group):
                tl, sched, state = out[src]
                out[pe] = (tl, Replica(sched, rename, _commands(programs[pe]), chan_map), state)
                red.replicated_from[pe] = src
            if lone(group):
                alone[group[0]] = (src_group[0], rename, chan_map)
            return
        red.simulated += 1
        mine = {c: k for c, k in shared.items() if any(c in uses[pe].channels for pe in group)}
        if len(group) == 1 and not mine:  # alone on its channels: every transfer's duration is known when it starts
            pe = group[0]
            out[pe] = simulate_pe(programs[pe], None if memories is None else memories[pe],
                                  steady_state=steady_state, why_full=why_full)
            if key is not None:
                alone[pe] = (pe, {n: n for n in names}, {c: c for c in chans})
        else:
            results = simulate_group([programs[pe] for pe in group],
                                     None if memories is None else [memories[pe] for pe in group],
                                     flow_channels(mine, topo), steady_state=steady_state, why_full=why_full)
            out.update(zip(group, results))
        if key is not None:
            seen[key] = (group, names, chans)

    later = []
    for group in grouped:
        if keyed and lone(group) and group[0] in follows:
            later.append(group[0])  # once the PE it followed has its records
        else:
            simulate(group)
    for pe in later:
        fo = follows[pe]
        took = alone.get(fo.ref) if fo.ref in out else None
        copied = _follow_names(took, fo) if took is not None else None
        if copied is None:  # the followed PE is not alone, or not describable: this one is simulated (or keyed)
            simulate([pe])
            continue
        src, rename, chan_map = copied
        tl, sched, state = out[src]
        out[pe] = (tl, Replica(sched, rename, _commands(programs[pe]), chan_map), state)
        red.replicated_from[pe] = src
    return out, red


def _follow_names(took: tuple[int, dict[str, str], dict[int, int]], fo: Follow
                  ) -> tuple[int, dict[str, str], dict[int, int]] | None:
    """What a PE that followed ``fo.ref`` takes: ``fo.ref``'s source PE, with the source's tensor names and channels
    mapped on to this PE's (through ``fo.ref``'s own, ``took``). None when a name of this PE would not survive a
    replica's renaming (a ``|`` or ``[`` in a tensor's name) or a channel does not map."""
    src, rename, chan_map = took
    names = {}
    for r, f in fo.tensors.values():
        if "|" in f.name or "[" in f.name:
            return None
        names[r.name] = f.name
    channels = fo.channels
    if any(c not in channels for c in chan_map.values()):
        return None
    return (src, {n: names.get(m, m) for n, m in rename.items()},
            {c: channels[m] for c, m in chan_map.items()})
