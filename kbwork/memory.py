"""Tensor handles and the two memories they point into.

A :class:`Handle` is a frozen value (name, space, addr, shape, dtype, pinned).
``space`` is always truthful and ``pinned`` is true exactly for TCM handles:
the scheduler inserts a DMA for every operand that is not pinned.

HBM grows as the host allocates kernel tensors; TCM is a fixed-size bump
allocator with nested scopes. Both can be *backed* by numpy byte buffers
(data mode) or be address bookkeeping only (timing mode).

Every handle an arena makes carries its :class:`Origin`: the arena (one HBM
per simulator, one TCM per run) and, for an allocation inside a scratch
scope, that scope. The kernel language refuses a handle whose origin is not
its own memory, or whose scope has closed (DESIGN.md §2 "Handle lifetime"),
so a handle is never read at an address that now holds something else. The
origin takes no part in equality or hashing: handles stay values.
"""

from __future__ import annotations

import enum
import math
import weakref
from dataclasses import dataclass, field
from typing import Any, Iterator

import ml_dtypes
import numpy as np

from .errors import TcmOverflowError, TraceError, ValidationError
from .symbolic import FIX, Index, LoopVar


class Space(str, enum.Enum):
    """Where a handle's bytes live. Compares equal to ``"hbm"`` / ``"tcm"``."""

    HBM = "hbm"
    TCM = "tcm"

    def __str__(self) -> str:
        return self.value


#: Canonical dtype name -> numpy dtype. Element sizes: fp8 1 B, bf16/fp16 2 B, fp32 4 B. ``fp8`` is OCP e4m3fn
#: (largest finite 448, no inf: a value beyond it would be NaN, so what is placed in fp8 is range-checked first).
DTYPES: dict[str, np.dtype] = {
    "bf16": np.dtype(ml_dtypes.bfloat16),
    "fp16": np.dtype(np.float16),
    "fp32": np.dtype(np.float32),
    "fp8": np.dtype(ml_dtypes.float8_e4m3fn),
}
#: The largest finite value of each dtype (beyond it a value is stored as inf).
DTYPE_MAX: dict[str, float] = {name: float(ml_dtypes.finfo(d).max) for name, d in DTYPES.items()}
_ALIASES = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "fp32", "float": "fp32",
            "f32": "fp32", "f16": "fp16", "float8_e4m3fn": "fp8", "e4m3fn": "fp8", "fp8_e4m3fn": "fp8"}


_CANONICAL = frozenset(DTYPES)


def canonical_dtype(dtype: object) -> str:
    """Return the canonical name (``"bf16"``, ``"fp16"``, ``"fp32"``, ``"fp8"``) of ``dtype``.

    Accepts canonical names, common aliases and numpy dtypes.

    Raises:
        ValidationError: the dtype is not one the PE supports.
    """
    if dtype.__class__ is str and dtype in _CANONICAL:
        return dtype  # type: ignore[return-value]
    if isinstance(dtype, str):
        name = _ALIASES.get(dtype.lower(), dtype.lower())
        if name in DTYPES:
            return name
    else:
        try:
            npd = np.dtype(dtype)  # type: ignore[arg-type]
        except TypeError:
            npd = None
        for name, d in DTYPES.items():
            if npd == d:
                return name
    raise ValidationError(f"dtype {dtype!r} is not supported; use one of {', '.join(DTYPES)}.")


def itemsize(dtype: str) -> int:
    """Bytes per element of a canonical dtype."""
    return DTYPES[dtype].itemsize


_ITEMSIZE = {name: d.itemsize for name, d in DTYPES.items()}


def _gone() -> None:
    """The arena of an unpickled handle's origin: none (see :meth:`Origin.__getstate__`)."""
    return None


class Origin:
    """Where a handle was made: an arena, and the scratch scope it was allocated in (if any).

    An arena's own origin (``arena.origin``) is alive as long as the arena is
    in use; a scope's origin dies when the scope exits. ``describe()`` says
    where the handle came from, for error messages. ``note`` names a scope
    the kernel did not open itself (the body of an empty ``tl.range``, whose
    allocations are undone when it has been traced).
    """

    __slots__ = ("_arena", "label", "scope_depth", "alive", "closed_at", "note", "copied")

    def __init__(self, arena: "Arena", scope_depth: int = 0, note: str = ""):
        # weakly: the arena holds its handles, each handle its origin; a strong reference back would make
        # every traced launch a reference cycle, left for the cyclic collector when a run is dropped
        self._arena = weakref.ref(arena)
        self.label = arena.label
        self.copied = False  # an unpickled (or deep-copied) origin: its arena stayed behind
        self.scope_depth = scope_depth
        self.alive = True
        self.closed_at: str = ""
        self.note = note

    @property
    def arena(self) -> "Arena | None":
        """The arena the handle was made in; ``None`` once that arena is gone (its simulator or run dropped)."""
        return self._arena()

    # A pickled (or deep-copied) handle keeps where it came from in words, not the arena: its copy belongs to
    # no simulator, as the copy of an arena it used to drag along did not either.
    def __getstate__(self) -> tuple:
        return (self.label, self.scope_depth, self.alive, self.closed_at, self.note)

    def __setstate__(self, state: tuple) -> None:
        self._arena, self.copied = _gone, True
        self.label, self.scope_depth, self.alive, self.closed_at, self.note = state

    def describe(self) -> str:
        where = self.label
        if self.note:
            where += f", in {self.note}"
        elif self.scope_depth:
            where += f", inside a tl.scratch_scope() (depth {self.scope_depth})"
            if not self.alive:
                where += f" that closed{(' ' + self.closed_at) if self.closed_at else ''}"
        return where

    def __repr__(self) -> str:
        return f"Origin({self.describe()})"


@dataclass(frozen=True, slots=True)
class Handle:
    """A frozen view of a tensor in HBM or TCM.

    Row slices (``h[a:b]``) of a row-major tensor are contiguous handles with
    the name ``"h[a:b]"`` and their parent's origin. ``size``, ``nbytes`` and
    ``end`` are computed once (the scheduler reads them for every hazard
    check). ``origin`` says which arena (and scratch scope) made the handle;
    it is not part of equality or the hash.
    """

    name: str
    space: Space
    addr: int
    shape: tuple[int, ...]
    dtype: str
    pinned: bool
    origin: Origin | None = field(default=None, compare=False, repr=False)
    #: the HBM channel the tensor lives on (DESIGN.md §14; 0 for TCM): its transfers move bytes there
    channel: int = field(default=0, compare=False)
    size: int = field(init=False, repr=False, compare=False)
    nbytes: int = field(init=False, repr=False, compare=False)
    end: int = field(init=False, repr=False, compare=False)
    #: ``(space is TCM, addr, end)``: the byte range hazard tracking compares.
    span: tuple[bool, int, int] = field(init=False, repr=False, compare=False)
    _hash: int = field(init=False, repr=False, compare=False)

    def __init__(self, name: str, space: Space, addr: int, shape: tuple[int, ...], dtype: str, pinned: bool,
                 origin: Origin | None = None, channel: int = 0) -> None:
        # written out (the dataclass keeps it): a trace makes a handle for every buffer and slice, and setting
        # the slots through their descriptors is cheaper than the generated __init__'s object.__setattr__
        _S_NAME(self, name)
        _S_SPACE(self, space)
        _S_ADDR(self, addr)
        _S_SHAPE(self, shape)
        _S_DTYPE(self, dtype)
        _S_PINNED(self, pinned)
        _S_ORIGIN(self, origin)
        _S_CHANNEL(self, channel)
        self.__post_init__()

    def __post_init__(self) -> None:
        shape, addr = self.shape, self.addr
        size = shape[0] * shape[1] if len(shape) == 2 else math.prod(shape)
        nbytes = size * _ITEMSIZE[self.dtype]
        end = addr + nbytes
        _S_SIZE(self, size)
        _S_NBYTES(self, nbytes)
        _S_END(self, end)
        _S_SPAN(self, (self.space is Space.TCM, addr, end))
        # hashed once: handles key dicts in hot loops, and the generated hash would rehash every
        # field (and the Space enum, a Python-level call) on each lookup
        _S_HASH(self, hash((self.name, str.__str__(self.space), addr, shape, self.dtype, self.pinned)))

    def __hash__(self) -> int:
        return self._hash

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def overlaps(self, other: "Handle") -> bool:
        """True when both handles are in the same space and their byte ranges overlap (for a
        :class:`LoopHandle`, in some iteration of its loop)."""
        if isinstance(other, LoopHandle):
            return other.overlaps(self)
        return (self.space == other.space and self.addr < other.end and other.addr < self.end
                and self.nbytes > 0 and other.nbytes > 0)

    def __getitem__(self, key: object) -> "Handle":
        if not isinstance(key, slice) or key.step not in (None, 1):
            raise ValidationError(f"handle {self.name!r}: only contiguous row slices h[a:b] are supported, "
                                  f"got {key!r}.")
        if isinstance(key.start, Index) or isinstance(key.stop, Index):
            return LoopHandle.rows(self, key.start, key.stop)
        rows = self.shape[0]
        start = 0 if key.start is None else key.start
        stop = rows if key.stop is None else key.stop
        if _is_int(start) and _is_int(stop) and (start < 0 or stop < 0):  # numpy's from-the-end, written out
            lo, hi = (max(0, rows + x) if x < 0 else x for x in (start, stop))
            raise ValidationError(f"handle {self.name!r}: row slice [{key.start}:{key.stop}] counts from the end; "
                                  f"handles take row numbers from 0 (of {rows} rows), e.g. [{lo}:{hi}].")
        if not (_is_int(start) and _is_int(stop) and 0 <= start < stop <= rows):
            raise ValidationError(f"handle {self.name!r}: row slice [{key.start}:{key.stop}] is empty or out of "
                                  f"range for {rows} rows.")
        start, stop = int(start), int(stop)
        row_bytes = self.nbytes // rows
        return Handle(f"{self.name}[{start}:{stop}]", self.space, self.addr + start * row_bytes,
                      (stop - start,) + self.shape[1:], self.dtype, self.pinned, self.origin, self.channel)

    def __repr__(self) -> str:
        shape = "x".join(map(str, self.shape))
        pin = ", pinned" if self.pinned else ""
        return f"Handle({self.name!r}, {self.space.value}@{self.addr:#x}, {shape} {self.dtype}{pin})"


# The slots' own setters (a frozen dataclass refuses plain assignment): what Handle.__init__ sets fields with.
(_S_NAME, _S_SPACE, _S_ADDR, _S_SHAPE, _S_DTYPE, _S_PINNED, _S_ORIGIN, _S_CHANNEL, _S_SIZE, _S_NBYTES, _S_END, _S_SPAN,
 _S_HASH) = (Handle.__dict__[f].__set__ for f in ("name", "space", "addr", "shape", "dtype", "pinned", "origin",
                                                   "channel", "size", "nbytes", "end", "span", "_hash"))


def _is_int(x: object) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def _row_slice(h: Handle, start: int, stop: int, origin: "Origin | None" = None) -> Handle:
    """``h[start:stop]`` without the range check (the representative of a slice in an empty loop may lie
    outside its tensor: nothing is ever emitted for it)."""
    row_bytes = h.nbytes // h.shape[0]
    return Handle(f"{h.name}[{start}:{stop}]", h.space, h.addr + start * row_bytes,
                  (stop - start,) + h.shape[1:], h.dtype, h.pinned, h.origin if origin is None else origin,
                  h.channel)


def _meets_affine(a: int, s: int, la: int, b: int, u: int, lb: int, n: int) -> bool:
    """Whether ``[a + s·i, a + s·i + la)`` and ``[b + u·i, b + u·i + lb)`` overlap for some ``i`` in ``[0, n)``:
    ``-la < (a - b) + (s - u)·i < lb``, a linear condition on ``i``."""
    c, d = a - b, s - u
    if d == 0:
        return -la < c < lb
    lo, hi = (-la - c) / d, (lb - c) / d  # the open interval of i where it holds
    if d < 0:
        lo, hi = hi, lo
    first = max(0, math.floor(lo) + 1)
    last = min(n - 1, math.ceil(hi) - 1)
    return first <= last


def _affine_text(x: "Index | int") -> str:
    return x.text if isinstance(x, Index) else str(x)


def _at(x: "Index | int", i: int) -> int:
    return x.at(i) if isinstance(x, Index) else x


def _key(x: "Index | int") -> tuple:
    return ("i", x.a, x.b) if isinstance(x, Index) else ("c", x)


@dataclass(frozen=True, slots=True, eq=False, repr=False)
class LoopHandle(Handle):
    """A handle that is a different tensor slice or ring slot in every iteration of a ``tl.range`` loop.

    Made by slicing a handle with a symbolic index (``K[j*T:(j+1)*T]``), by
    indexing a :class:`Ring` with one (``S[j + 1]``), or, for a TCM buffer
    allocated in a body's scratch scope, by its name: made from such a handle's
    (``X[256:320]_tcm``), or from the command it serves (recipe scratch,
    ``softmax_merges9.P``: a :class:`CommandName` prefix). Its
    own fields (``name``, ``addr``, ``shape``, ...) are iteration 0's, with the
    symbolic text as the name (error messages show it). :meth:`at` is the
    concrete :class:`Handle` of iteration ``i``; ``shape``, ``dtype``, ``space``
    and pinning never change from one iteration to the next (slices have a
    constant extent).

    ``kind`` is ``"rows"`` (``root`` sliced by ``chain``, pairs of affine
    bounds applied in order), ``"ring"`` (slot ``slot`` of ``slots``, then
    ``chain``) or ``"named"`` (``root`` itself, named ``prefix.name_at(i)`` +
    ``suffix``, then ``chain``).
    """

    var: LoopVar | None = None
    kind: str = "rows"
    root: Handle | None = None
    slots: tuple = ()
    slot: "Index | None" = None
    chain: tuple = ()
    prefix: "LoopHandle | CommandName | None" = None
    suffix: str = ""

    def __init__(self, name: str, space: Space, addr: int, shape: tuple[int, ...], dtype: str, pinned: bool,
                 origin: Origin | None = None, channel: int = 0, var: LoopVar | None = None, kind: str = "rows",
                 root: Handle | None = None, slots: tuple = (), slot: "Index | None" = None, chain: tuple = (),
                 prefix: "LoopHandle | CommandName | None" = None, suffix: str = "") -> None:
        # written out, as Handle.__init__ is (a body makes one for every slice and ring slot it names)
        Handle.__init__(self, name, space, addr, shape, dtype, pinned, origin, channel)
        _L_VAR(self, var)
        _L_KIND(self, kind)
        _L_ROOT(self, root)
        _L_SLOTS(self, slots)
        _L_SLOT(self, slot)
        _L_CHAIN(self, chain)
        _L_PREFIX(self, prefix)
        _L_SUFFIX(self, suffix)

    # --- construction ----------------------------------------------------------------------
    @staticmethod
    def rows(parent: Handle, start: object, stop: object) -> "LoopHandle":
        """``parent[start:stop]`` with affine bounds (at least one symbolic) of constant extent.

        Raises:
            TraceError: bounds of two loops, or an extent that changes with the index.
            ValidationError: a slice outside ``parent`` at the loop's first or last iteration.
        """
        shape = parent.shape
        rows = shape[0]
        start = 0 if start is None else start
        stop = rows if stop is None else stop
        # (a slice is made for every tile a body names: checked without generators)
        s_idx, t_idx = isinstance(start, Index), isinstance(stop, Index)
        for b, is_idx in ((start, s_idx), (stop, t_idx)):
            if not is_idx and not _is_int(b):
                raise ValidationError(f"handle {parent.name!r}: row slice bounds must be ints or tl.range indices, "
                                      f"got {b!r}.")
        looped = isinstance(parent, LoopHandle)
        var = parent.var if looped else (start.var if s_idx else stop.var)
        if (s_idx and start.var is not var) or (t_idx and stop.var is not var):
            raise TraceError(f"{parent.name}[{_affine_text(start)}:{_affine_text(stop)}]: the index belongs to "
                             f"another tl.range loop than the handle ({FIX}).")
        if var.closed:
            raise TraceError(f"{parent.name}[{_affine_text(start)}:{_affine_text(stop)}]: the tl.range loop of "
                             f"this index has ended; use the index inside its body only.")
        extent = stop - start
        text = f"{parent.name}[{start.text if s_idx else start}:{stop.text if t_idx else stop}]"
        if isinstance(extent, Index):
            raise TraceError(f"{text}: the extent {extent.text} changes with the index; a slice in a tl.range body "
                             f"must have a constant extent (e.g. K[j*T:(j+1)*T]).")
        if extent <= 0:
            raise ValidationError(f"handle {parent.name!r}: row slice {text} is empty (extent {extent}).")
        lo0 = start.b if s_idx else start  # iteration 0's rows
        hi0 = stop.b if t_idx else stop
        n = var.iterations
        if n:
            last = n - 1
            for i, lo, hi in ((0, lo0, hi0), (last, start.a * last + start.b if s_idx else start,
                                              stop.a * last + stop.b if t_idx else stop)):
                if not 0 <= lo < hi <= rows:
                    which = "first" if i == 0 else "last"
                    raise ValidationError(
                        f"handle {parent.name!r}: row slice {text} at the {which} iteration (j = {var.j_at(i)}) is "
                        f"rows {lo}:{hi}, outside {parent.name}'s {rows} rows. Fix the bounds or the loop's range.")
        # iteration 0's slice (as _row_slice makes it), its fields given straight to the loop handle
        addr = parent.addr + int(lo0) * (parent.nbytes // rows)
        sub = (int(hi0 - lo0),) + shape[1:]
        if looped:
            return LoopHandle(text, parent.space, addr, sub, parent.dtype, parent.pinned, parent.origin,
                              parent.channel, var, parent.kind, parent.root, parent.slots, parent.slot,
                              parent.chain + ((start, stop),), parent.prefix, parent.suffix)
        return LoopHandle(text, parent.space, addr, sub, parent.dtype, parent.pinned, parent.origin, parent.channel,
                          var, "rows", parent, (), None, ((start, stop),), None, "")

    @staticmethod
    def named(root: Handle, prefix: "LoopHandle | CommandName", suffix: str) -> "LoopHandle":
        """``root`` (a fixed buffer) under the name ``prefix.name_at(i) + suffix`` in iteration ``i``."""
        return LoopHandle(prefix.name + suffix, root.space, root.addr, root.shape, root.dtype, root.pinned,
                          root.origin, root.channel, var=prefix.var, kind="named", root=root, prefix=prefix,
                          suffix=suffix)

    def __getitem__(self, key: object) -> "LoopHandle":
        if not isinstance(key, slice) or key.step not in (None, 1):
            raise ValidationError(f"handle {self.name!r}: only contiguous row slices h[a:b] are supported, "
                                  f"got {key!r}.")
        return LoopHandle.rows(self, key.start, key.stop)

    # --- per iteration -------------------------------------------------------------------------
    def at(self, i: int) -> Handle:
        """The concrete handle of iteration ``i`` (0-based), named as a plain loop would name it."""
        if self.kind == "named":
            root = self.root
            h = Handle(self.prefix.name_at(i) + self.suffix, root.space, root.addr, root.shape, root.dtype,
                       root.pinned, root.origin, root.channel)
        else:
            h = self.root if self.kind == "rows" else self.slots[self.slot.at(i) % len(self.slots)]
        for lo, hi in self.chain:
            h = _row_slice(h, _at(lo, i), _at(hi, i))
        return h

    def name_at(self, i: int) -> str:
        """The name of iteration ``i``'s handle (``K[256:384]``)."""
        if self.kind == "named":
            name = self.prefix.name_at(i) + self.suffix
        else:
            name = self.root.name if self.kind == "rows" else self.slots[self.slot.at(i) % len(self.slots)].name
        for lo, hi in self.chain:
            name = f"{name}[{_at(lo, i)}:{_at(hi, i)}]"
        return name

    def span_at(self, i: int) -> tuple[bool, int, int]:
        """``Handle.span`` of iteration ``i``'s handle."""
        return self.at(i).span if self.kind != "rows" else (self.span[0], self.addr + self.stride * i,
                                                            self.addr + self.stride * i + self.nbytes)

    @property
    def stride(self) -> int:
        """Bytes the handle moves per iteration: a row slice's address is ``addr + stride·i``
        (0 for ring slots and named buffers, which do not move affinely)."""
        if self.kind != "rows":
            return 0
        row_bytes = self.root.nbytes // self.root.shape[0]
        return row_bytes * sum(lo.a if isinstance(lo, Index) else 0 for lo, _ in self.chain)

    @property
    def symbolic_key(self) -> tuple:
        """What tells two loop handles apart beyond their iteration-0 fields."""
        return (self.kind, id(self.var), self.root, tuple(s.addr for s in self.slots),
                None if self.slot is None else _key(self.slot),
                tuple((_key(lo), _key(hi)) for lo, hi in self.chain),
                None if self.prefix is None else self.prefix.symbolic_key, self.suffix)

    def overlaps(self, other: Handle) -> bool:
        """True when this handle and ``other`` (a plain handle, or a loop handle of the same loop, taken in the
        same iteration) overlap in some iteration of the loop. Exact: ring slots are a finite set, row slices
        move by a constant stride."""
        if self.space != other.space or not self.nbytes or not other.nbytes:
            return False
        n = max(self.var.iterations, 1) if self.var is not None else 1
        if not isinstance(other, LoopHandle):
            if self.kind == "rows":
                return _meets_affine(self.addr, self.stride, self.nbytes, other.addr, 0, other.nbytes, n)
            if self.kind == "ring" and not self.chain:
                return any(x.overlaps(other) for x in self.slots)
            if self.kind == "named" and not self.chain:
                return self.root.overlaps(other)
        elif self.kind == "rows" and other.kind == "rows":
            return _meets_affine(self.addr, self.stride, self.nbytes, other.addr, other.stride, other.nbytes, n)
        elif self.kind in ("ring", "named") and other.kind in ("ring", "named") and not self.chain \
                and not other.chain:
            period = math.lcm(len(self.slots) or 1, len(other.slots) or 1)
            return any(self.at(i).overlaps(other.at(i)) for i in range(min(n, period)))
        # anything else: every iteration (few), or the first ones and the last
        samples = range(n) if n <= 4096 else sorted(set(range(64)) | {n - 1})
        return any(self.at(i).overlaps(other.at(i) if isinstance(other, LoopHandle) else other) for i in samples)

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, LoopHandle) and self.name == other.name and self.addr == other.addr
                and self.shape == other.shape and self.dtype == other.dtype and self.space is other.space
                and self.symbolic_key == other.symbolic_key)

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        shape = "x".join(map(str, self.shape))
        return f"LoopHandle({self.name!r}, {self.space.value}, {shape} {self.dtype}, per iteration of loop " \
               f"{self.var.number if self.var is not None else '?'})"

    def __reduce__(self):
        raise ValidationError(f"loop handle {self.name!r} lives in its tl.range body only; it cannot be pickled "
                              f"or kept.")


(_L_VAR, _L_KIND, _L_ROOT, _L_SLOTS, _L_SLOT, _L_CHAIN, _L_PREFIX, _L_SUFFIX) = (
    LoopHandle.__dict__[f].__set__ for f in ("var", "kind", "root", "slots", "slot", "chain", "prefix", "suffix"))


class CommandName:
    """A name made from a command id in a ``tl.range`` body: ``<stem><id>`` with the id of iteration ``i``'s
    instance of body command ``cmd`` (iteration 0's id), as a plain loop names it (``softmax_merges9``).

    The prefix of a ``"named"`` :class:`LoopHandle`. The body's length is known once it has been traced
    (``var.body_len``); only iteration 0's name is asked for before.
    """

    __slots__ = ("var", "stem", "cmd")

    def __init__(self, var: LoopVar, stem: str, cmd: int):
        self.var, self.stem, self.cmd = var, stem, cmd

    @property
    def name(self) -> str:
        return f"{self.stem}{self.cmd}"

    def name_at(self, i: int) -> str:
        n = self.var.body_len
        if i and n is None:
            raise RuntimeError(f"{self.name}: the name of iteration {i} is asked for before the body was traced")
        return f"{self.stem}{self.cmd + i * n}" if i else self.name

    @property
    def symbolic_key(self) -> tuple:
        return ("cmd", id(self.var), self.stem, self.cmd)

    def __repr__(self) -> str:
        return f"CommandName({self.stem}<command {self.cmd} of iteration 0>)"


class Ring:
    """``tl.ring(n, shape, dtype, name=)``: n TCM buffers a loop indexes cyclically (DESIGN.md §13).

    ``ring[j + c]`` is slot ``(j + c) mod n`` in every iteration (a
    :class:`LoopHandle`); ``ring[k]`` with a concrete ``k`` is slot ``k mod n``
    (a plain handle), so a peeled last iteration names the right slot. The
    slots are named ``<name>0 .. <name>{n-1}``.
    """

    __slots__ = ("name", "slots")

    def __init__(self, name: str, slots: tuple[Handle, ...]):
        self.name, self.slots = name, slots

    def __len__(self) -> int:
        return len(self.slots)

    def __getitem__(self, key: object) -> Handle:
        n = len(self.slots)
        if isinstance(key, Index):
            var = key.var
            if var.closed:
                raise TraceError(f"{self.name}[{key.text}]: the tl.range loop of this index has ended; use the "
                                 f"index inside its body only.")
            var.periods.add(n // math.gcd(key.a, n) if key.a else 1)
            rep = self.slots[key.at(0) % n]
            return LoopHandle(f"{self.name}[{key.text}]", rep.space, rep.addr, rep.shape, rep.dtype, rep.pinned,
                              rep.origin, rep.channel, var=var, kind="ring", slots=self.slots, slot=key)
        if _is_int(key):
            return self.slots[int(key) % n]
        raise ValidationError(f"ring {self.name!r}: index it with an int or a tl.range index (S[j], S[j + 1]), "
                              f"got {key!r}.")

    def __iter__(self):
        return iter(self.slots)

    def __repr__(self) -> str:
        s = self.slots[0]
        shape = "x".join(map(str, s.shape))
        return f"Ring({self.name!r}, {len(self.slots)} x {shape} {s.dtype} in TCM)"


#: The largest tensor or memory kbwork will lay out (1 TiB): far beyond any PE, and small enough
#: that byte offsets and cycle counts stay exact in int64.
MAX_BYTES = 1 << 40
#: the buffer of an arena that keeps no bytes (timing mode)
_NO_BYTES = np.zeros(0, dtype=np.uint8)
_NO_BYTES.flags.writeable = False


class Arena:
    """One memory space: a bump allocator, optionally backed by a numpy byte buffer.

    HBM arenas grow on demand; TCM arenas have a fixed capacity and support
    nested scopes (``mark``/``release``) whose allocations are freed at exit.
    ``label`` says whose memory it is (error messages name it).

    A TCM also allocates from its top end downward (``alloc(..., from_top=True)``:
    kernel-scope recipe scratch, made on a recipe's first expansion wherever that
    falls). The bytes below ``high`` are the bump region: a scratch scope's
    bytes are never taken by such scratch, so the layout of the bump region does
    not depend on when a recipe is first expanded. The two meet at overflow.
    """

    ALIGN = 64

    def __init__(self, space: Space, capacity: int | None, backed: bool, label: str = ""):
        self.space = space
        self.capacity = capacity
        self.backed = backed
        self.label = label or f"a {space.value.upper()} arena"
        self.top = 0
        #: the lowest byte allocated from the top end (the capacity while nothing is)
        self.high = capacity
        self.live: list[Handle] = []
        #: the origin of allocations made outside any scratch scope
        self.origin = Origin(self)
        self._scopes: list[Origin] = []
        if backed and capacity is not None:
            try:
                self.buf = np.zeros(capacity, dtype=np.uint8)
            except (MemoryError, ValueError):
                raise TcmOverflowError(f"cannot back {self.label} ({capacity} B) with host memory in data mode; "
                                       f"use a smaller tcm_bytes or mode='timing'.") from None
        else:
            self.buf = _NO_BYTES  # nothing is ever read or written: one empty, read-only buffer serves them all
        self._views: dict[tuple, np.ndarray] = {}  # (addr, shape, dtype) -> view of buf

    def __repr__(self) -> str:
        cap = "unbounded" if self.capacity is None else f"{self.capacity} B"
        used = self.top + (0 if self.capacity is None else self.capacity - self.high)
        return f"Arena({self.label}, used={used} B, capacity={cap}, {len(self.live)} live)"

    @property
    def free(self) -> int | None:
        return None if self.capacity is None else self.high - self.top

    def alloc(self, name: str, shape: object, dtype: object, channel: int = 0, *, from_top: bool = False) -> Handle:
        """Allocate a tensor and return its handle (origin: this arena, in the innermost open scope; an HBM
        tensor lives on ``channel``). ``from_top``: just below the bytes allocated from the top end of a TCM
        (an unbounded arena allocates at its bump top either way).

        Raises:
            ValidationError: a bad name, shape or dtype, or a tensor too large to lay out.
            TcmOverflowError: the TCM cannot hold it; the message lists what holds the space.
        """
        if name.__class__ is not str or not name:
            if not isinstance(name, str) or not name:
                raise ValidationError(f"tensor names must be non-empty strings, got {name!r}.")
        shape = check_shape(name, shape)
        if dtype.__class__ is not str or dtype not in _CANONICAL:
            dtype = canonical_dtype(dtype)
        nbytes = math.prod(shape) * _ITEMSIZE[dtype]
        addr = -(-self.top // self.ALIGN) * self.ALIGN
        if nbytes > MAX_BYTES or (self.capacity is None and addr + nbytes > MAX_BYTES):
            raise ValidationError(f"tensor {name!r} of shape {shape} {dtype} needs {nbytes} B; kbwork lays out at most "
                                  f"{MAX_BYTES} B (1 TiB) per memory. Use a smaller shape.")
        from_top = from_top and self.capacity is not None
        low = addr
        if from_top:
            addr = (self.high - nbytes) // self.ALIGN * self.ALIGN
        if self.capacity is not None and (addr < low if from_top else addr + nbytes > self.high):
            holders = sorted(self.live, key=lambda h: (-h.nbytes, h.addr))[:8]
            held = "; ".join(f"{h.name} {h.nbytes} B" for h in holders) or "nothing"
            raise TcmOverflowError(
                f"TCM overflow allocating {name!r} ({nbytes} B, shape {shape} {dtype}): only "
                f"{max(0, self.high - low)} B of {self.capacity} B are free. Largest holders: {held}. "
                f"Free space with tl.scratch_scope(), use smaller tiles, or raise tcm_bytes.")
        if self.backed and self.capacity is None and addr + nbytes > self.buf.size:
            try:
                # a quarter more than needed: a few growths for many small tensors, and no doubling of a large one
                grown = np.zeros(max(addr + nbytes, self.buf.size + self.buf.size // 4), dtype=np.uint8)
            except (MemoryError, ValueError):
                raise ValidationError(f"HBM tensor {name!r} of shape {shape} {dtype} needs {nbytes} B, which the "
                                      f"host cannot back in data mode ({addr + nbytes} B of HBM in all); use a "
                                      f"smaller shape or mode='timing'.") from None
            grown[: self.buf.size] = self.buf
            self.buf = grown
            self._views.clear()  # the old views point into the old buffer
        if from_top:
            self.high = addr
        else:
            self.top = addr + nbytes
        h = Handle(name, self.space, addr, shape, dtype, self.space == Space.TCM,
                   self._scopes[-1] if self._scopes else self.origin, channel)
        self.live.append(h)
        return h

    def reserve(self, nbytes: int) -> None:
        """Grow a backed, unbounded arena (HBM) once so that ``nbytes`` more fit without growing again (the
        tensors about to be placed; growing copies the buffer, and a large one is then briefly held twice)."""
        need = -(-self.top // self.ALIGN) * self.ALIGN + nbytes
        if self.backed and self.capacity is None and need > self.buf.size:
            grown = np.zeros(need, dtype=np.uint8)
            grown[: self.buf.size] = self.buf
            self.buf = grown
            self._views.clear()

    def drop_last(self, h: Handle, top: int) -> None:
        """Undo the allocation of ``h``, the last one made, restoring the top to ``top`` (what it was before)."""
        if self.live and self.live[-1] is h:
            self.live.pop()
            self.top = top

    def mark(self, note: str = "") -> tuple[int, int, int | None]:
        """Open a scratch scope: allocations until the matching :meth:`release` belong to it (``note``: a scope
        the kernel did not open, see :class:`Origin`; it does not count in the depth of the scopes inside it)."""
        depth = sum(1 for o in self._scopes if not o.note) + (0 if note else 1)
        self._scopes.append(Origin(self, depth, note))
        return self.top, len(self.live), self.high

    def release(self, mark: tuple[int, int, int | None], closed_at: str = "") -> None:
        """Close the innermost scratch scope: free its bytes (at both ends), and its handles die."""
        self.top, n, self.high = mark
        del self.live[n:]
        if self._scopes:
            scope = self._scopes.pop()
            scope.alive = False
            scope.closed_at = closed_at

    def check(self, h: Handle) -> str | None:
        """Why ``h`` may not be used with this arena (a message), or ``None`` when it may."""
        o = h.origin
        if o is None:
            return (f"handle {h.name!r} was not made by this simulator (a hand-built Handle?); make tensors with "
                    f"sim.hbm(...), tl.alloc/tl.full/tl.load, or slices of those.")
        if o.copied:
            return (f"handle {h.name!r} is a pickled or deep-copied copy of a handle of {o.label}; a copy "
                    f"belongs to no simulator. Use the handle sim.hbm(...) returned (or make the tensor again).")
        if o.arena is not self:
            return (f"handle {h.name!r} comes from {o.label}, not {self.label}; "
                    + ("place the data on this simulator with sim.hbm(...)." if self.space == Space.HBM else
                       "TCM is fresh for every run: allocate it again in this kernel (tl.alloc/tl.full/tl.load)."))
        if not o.alive and o.note:
            return (f"handle {h.name!r} was made in {o.note}: such a body is traced but never runs, so what it "
                    f"allocated is not in the program. Use it in a loop that runs, or make it before the loop.")
        if not o.alive:
            return (f"handle {h.name!r} was allocated inside a tl.scratch_scope() that has closed"
                    f"{(' ' + o.closed_at) if o.closed_at else ''}; its bytes may hold other data now. Use it inside "
                    f"the scope, or allocate it outside.")
        return None

    # --- data access (backed arenas only) -------------------------------------------
    def view(self, h: Handle) -> np.ndarray:
        """The handle's elements as a numpy array view (writable) of this arena."""
        key = (h.addr, h.shape, h.dtype)
        v = self._views.get(key)
        if v is None:
            v = self._views[key] = self.buf[h.addr:h.end].view(DTYPES[h.dtype]).reshape(h.shape)
        return v

    def read_f32(self, h: Handle) -> np.ndarray:
        """The handle's elements as float32: a view when already fp32, else a converted copy.

        Callers must not write into the result.
        """
        v = self.view(h)
        return v if v.dtype == np.float32 else v.astype(np.float32)

    def write(self, h: Handle, values: np.ndarray) -> None:
        """Write ``values`` (broadcast to the handle's shape) into the handle, rounding to its dtype."""
        v = self.view(h)
        values = np.asarray(values)
        v[...] = values if values.dtype == v.dtype else values.astype(v.dtype)


def check_shape(name: str, shape: object) -> tuple[int, ...]:
    """``shape`` as a tuple of positive ints (1-D or 2-D); an int is a 1-D shape.

    Raises:
        ValidationError: floats, bools, other types, zero or negative extents, or more than 2 dims.
    """
    if shape.__class__ is tuple:  # the common case, already right (no generator: every buffer is checked)
        n = len(shape)
        if n == 2:
            a, b = shape
            if a.__class__ is int and b.__class__ is int and a > 0 and b > 0:
                return shape
        elif n == 1 and shape[0].__class__ is int and shape[0] > 0:
            return shape
    if _is_int(shape):
        shape = (shape,)
    if isinstance(shape, (str, bytes)) or not hasattr(shape, "__iter__"):
        raise ValidationError(f"tensor {name!r}: shape {shape!r} is not a tuple of ints.")
    dims = tuple(shape)  # type: ignore[arg-type]
    if not all(_is_int(s) for s in dims):
        raise ValidationError(f"tensor {name!r}: shape {dims!r} must hold ints only (no floats, bools or strings).")
    dims = tuple(int(s) for s in dims)
    if not 1 <= len(dims) <= 2 or any(s <= 0 for s in dims):
        raise ValidationError(f"tensor {name!r}: shape {dims} must be 1-D or 2-D with positive extents.")
    return dims


class Memory:
    """The PE's two memories for one simulator: HBM (shared across runs) and a TCM per run."""

    def __init__(self, tcm_bytes: int, backed: bool, label: str = "this simulator"):
        self.backed = backed
        self.label = label
        self.hbm = Arena(Space.HBM, None, backed, f"the HBM of {label}")
        self.tcm_bytes = tcm_bytes
        self.runs = 0
        self.tcm = Arena(Space.TCM, tcm_bytes, backed, f"the TCM of {label} (before any run)")

    def __repr__(self) -> str:
        return f"Memory({self.label}: {self.hbm!r}, {self.tcm!r})"

    def new_tcm(self, label: str | None = None) -> Arena:
        """Start a fresh TCM for a new kernel launch (handles of the previous one are refused from now on);
        ``label`` says which launch (``"PE 3, launch 1"``) on a device."""
        self.runs += 1
        what = f"run {self.runs}" + (f" ({label})" if label else "")
        self.tcm = Arena(Space.TCM, self.tcm_bytes, self.backed, f"the TCM of {what} of {self.label}")
        return self.tcm

    def arena(self, h: Handle) -> Arena:
        return self.hbm if h.space == Space.HBM else self.tcm

    def iter_arenas(self) -> Iterator[Arena]:
        yield self.hbm
        yield self.tcm


# --- host data placed in HBM (sim.hbm) --------------------------------------------------------------------
#: Bytes of input placed (checked and rounded) at a time.
PLACE_CHUNK_BYTES = 1 << 23


def chunks(arr: np.ndarray, nbytes: int = PLACE_CHUNK_BYTES) -> Iterator[slice]:
    """Row slices of ``arr`` (its first axis) of about ``nbytes`` each."""
    n = arr.shape[0] if arr.ndim else 1
    row = max(1, arr.nbytes // max(n, 1))
    step = max(1, nbytes // row)
    for r0 in range(0, n, step):
        yield slice(r0, min(n, r0 + step))


def _finite(x: np.ndarray) -> bool:
    """Whether every value of ``x`` is finite (bf16 read on its bits: numpy's own check on it is slow)."""
    if x.dtype == DTYPES["bf16"]:
        return bool(((x.view(np.uint16) & 0x7F80) != 0x7F80).all())
    return bool(np.isfinite(x).all())


def place(name: str, arr: np.ndarray, dtype: str, out: np.ndarray | None) -> None:
    """Check ``arr`` (finite, representable in ``dtype``) and write it rounded to ``dtype`` into ``out`` (if given),
    a chunk of rows at a time. Values go through float32 first, as the PE's numbers do.

    Raises:
        ValidationError: NaN or inf in the array, or values that overflow ``dtype``.
    """
    target = DTYPES[dtype]
    a = arr if arr.ndim else arr.reshape(1)
    dst_all = None if out is None else out.reshape(a.shape)
    for sl in chunks(a):
        c = a[sl]
        with np.errstate(over="ignore", invalid="ignore"):  # what overflows is refused just below
            v = c if c.dtype == np.float32 else c.astype(np.float32)
            if dst_all is None:
                dst = v if target == np.float32 else v.astype(target)
            else:
                dst = dst_all[sl]
                dst[...] = v
        if not _finite(dst):
            if (c.dtype.kind == "f" or c.dtype == DTYPES["bf16"]) and not _finite(c):
                raise ValidationError(f"sim.hbm({name!r}): the array holds NaN or inf; pass finite values.")
            big = max(float(np.max(np.abs(a[x].astype(np.float64)))) for x in chunks(a))
            raise ValidationError(f"sim.hbm({name!r}): values up to {big:.4g} overflow {dtype} "
                                  f"(largest finite {DTYPE_MAX[dtype]:.4g}); they would be "
                                  f"stored as inf. Scale the data or use a wider dtype.")


def host_array(name: str, array: Any) -> np.ndarray:
    """``array`` as a numpy array of real numbers, or a ValidationError saying what it is instead."""
    try:
        arr = np.asarray(array)
    except (ValueError, TypeError) as exc:
        raise ValidationError(f"sim.hbm({name!r}): cannot read the data as an array ({exc}); pass a 1-D or 2-D "
                              f"numpy array of numbers.") from None
    if np.iscomplexobj(arr):
        raise ValidationError(f"sim.hbm({name!r}): the array is complex ({arr.dtype}); the PE holds real numbers "
                              f"only. Pass .real and .imag as two tensors.")
    if arr.dtype.kind not in "iuf" and arr.dtype != DTYPES["bf16"]:
        raise ValidationError(f"sim.hbm({name!r}): the array holds {arr.dtype} values, not real numbers; pass "
                              f"ints or floats.")
    return arr
