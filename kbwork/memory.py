"""Tensor handles and the two memories they point into.

A :class:`Handle` is a frozen value (name, space, addr, shape, dtype, pinned).
``space`` is always truthful and ``pinned`` is true exactly for TCM handles:
the scheduler inserts a DMA for every operand that is not pinned.

HBM grows as the host allocates kernel tensors; TCM is a fixed-size bump
allocator with nested scopes. Both can be *backed* by numpy byte buffers
(data mode) or be address bookkeeping only (timing mode).
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from typing import Iterator

import ml_dtypes
import numpy as np

from .errors import TcmOverflowError, ValidationError


class Space(str, enum.Enum):
    """Where a handle's bytes live. Compares equal to ``"hbm"`` / ``"tcm"``."""

    HBM = "hbm"
    TCM = "tcm"

    def __str__(self) -> str:
        return self.value


#: Canonical dtype name -> numpy dtype. Element sizes: bf16/fp16 2 B, fp32 4 B.
DTYPES: dict[str, np.dtype] = {
    "bf16": np.dtype(ml_dtypes.bfloat16),
    "fp16": np.dtype(np.float16),
    "fp32": np.dtype(np.float32),
}
_ALIASES = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "fp32", "float": "fp32",
            "f32": "fp32", "f16": "fp16"}


_CANONICAL = frozenset(DTYPES)


def canonical_dtype(dtype: object) -> str:
    """Return the canonical name (``"bf16"``, ``"fp16"``, ``"fp32"``) of ``dtype``.

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


@dataclass(frozen=True, slots=True)
class Handle:
    """A frozen view of a tensor in HBM or TCM.

    Row slices (``h[a:b]``) of a row-major tensor are contiguous handles with
    the name ``"h[a:b]"``. ``size``, ``nbytes`` and ``end`` are computed once
    (the scheduler reads them for every hazard check).
    """

    name: str
    space: Space
    addr: int
    shape: tuple[int, ...]
    dtype: str
    pinned: bool
    size: int = field(init=False, repr=False, compare=False)
    nbytes: int = field(init=False, repr=False, compare=False)
    end: int = field(init=False, repr=False, compare=False)
    #: ``(space is TCM, addr, end)``: the byte range hazard tracking compares.
    span: tuple[bool, int, int] = field(init=False, repr=False, compare=False)
    _hash: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        size = math.prod(self.shape)
        nbytes = size * _ITEMSIZE[self.dtype]
        object.__setattr__(self, "size", size)
        object.__setattr__(self, "nbytes", nbytes)
        object.__setattr__(self, "end", self.addr + nbytes)
        object.__setattr__(self, "span", (self.space is Space.TCM, self.addr, self.addr + nbytes))
        # hashed once: handles key the kernel language's caches, and the generated hash would
        # rehash every field (and the Space enum, a Python-level call) on each lookup
        object.__setattr__(self, "_hash", hash((self.name, str.__str__(self.space), self.addr, self.shape,
                                                self.dtype, self.pinned)))

    def __hash__(self) -> int:
        return self._hash

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def overlaps(self, other: "Handle") -> bool:
        """True when both handles are in the same space and their byte ranges overlap."""
        return (self.space == other.space and self.addr < other.end and other.addr < self.end
                and self.nbytes > 0 and other.nbytes > 0)

    def __getitem__(self, key: object) -> "Handle":
        if not isinstance(key, slice) or key.step not in (None, 1):
            raise ValidationError(f"handle {self.name!r}: only contiguous row slices h[a:b] are supported, "
                                  f"got {key!r}.")
        rows = self.shape[0]
        start = 0 if key.start is None else key.start
        stop = rows if key.stop is None else key.stop
        if not (isinstance(start, int) and isinstance(stop, int) and 0 <= start < stop <= rows):
            raise ValidationError(f"handle {self.name!r}: row slice [{key.start}:{key.stop}] is empty or out of "
                                  f"range for {rows} rows.")
        row_bytes = self.nbytes // rows
        return Handle(f"{self.name}[{start}:{stop}]", self.space, self.addr + start * row_bytes,
                      (stop - start,) + self.shape[1:], self.dtype, self.pinned)

    def __repr__(self) -> str:
        shape = "x".join(map(str, self.shape))
        pin = ", pinned" if self.pinned else ""
        return f"Handle({self.name!r}, {self.space.value}@{self.addr:#x}, {shape} {self.dtype}{pin})"


class Arena:
    """One memory space: a bump allocator, optionally backed by a numpy byte buffer.

    HBM arenas grow on demand; TCM arenas have a fixed capacity and support
    nested scopes (``mark``/``release``) whose allocations are freed at exit.
    """

    ALIGN = 64

    def __init__(self, space: Space, capacity: int | None, backed: bool):
        self.space = space
        self.capacity = capacity
        self.backed = backed
        self.top = 0
        self.live: list[Handle] = []
        self.buf = np.zeros(capacity if (backed and capacity is not None) else 0, dtype=np.uint8)
        self._views: dict[tuple, np.ndarray] = {}  # (addr, shape, dtype) -> view of buf

    def __repr__(self) -> str:
        cap = "unbounded" if self.capacity is None else f"{self.capacity} B"
        return f"Arena({self.space.value}, used={self.top} B, capacity={cap}, {len(self.live)} live)"

    @property
    def free(self) -> int | None:
        return None if self.capacity is None else self.capacity - self.top

    def alloc(self, name: str, shape: tuple[int, ...], dtype: str) -> Handle:
        """Allocate a tensor and return its handle.

        Raises:
            ValidationError: a bad shape.
            TcmOverflowError: the TCM cannot hold it; the message lists what holds the space.
        """
        shape = _check_shape(name, shape)
        dtype = canonical_dtype(dtype)
        nbytes = math.prod(shape) * _ITEMSIZE[dtype]
        addr = -(-self.top // self.ALIGN) * self.ALIGN
        if self.capacity is not None and addr + nbytes > self.capacity:
            holders = sorted(self.live, key=lambda h: (-h.nbytes, h.addr))[:8]
            held = "; ".join(f"{h.name} {h.nbytes} B" for h in holders) or "nothing"
            raise TcmOverflowError(
                f"TCM overflow allocating {name!r} ({nbytes} B, shape {shape} {dtype}): only "
                f"{max(0, self.capacity - addr)} B of {self.capacity} B are free. Largest holders: {held}. "
                f"Free space with tl.scratch_scope(), use smaller tiles, or raise tcm_bytes.")
        self.top = addr + nbytes
        h = Handle(name, self.space, addr, shape, dtype, self.space == Space.TCM)
        self.live.append(h)
        if self.backed and self.capacity is None and self.top > self.buf.size:
            grown = np.zeros(max(self.top, 2 * self.buf.size), dtype=np.uint8)
            grown[: self.buf.size] = self.buf
            self.buf = grown
            self._views.clear()  # the old views point into the old buffer
        return h

    def adopt(self, handles: list[Handle]) -> bool:
        """Allocate ``handles`` again, exactly where they were (a replayed allocation).

        Returns False and changes nothing unless each one is what :meth:`alloc`
        would return next (same space, at the aligned top, fitting the capacity).
        """
        top = self.top
        for h in handles:
            addr = -(-top // self.ALIGN) * self.ALIGN
            if h.space != self.space or h.addr != addr or (self.capacity is not None and h.end > self.capacity):
                return False
            top = h.end
        if self.backed and self.capacity is None and top > self.buf.size:
            return False  # growing a backed HBM stays alloc's job
        self.top = top
        self.live.extend(handles)
        return True

    def mark(self) -> tuple[int, int]:
        return self.top, len(self.live)

    def release(self, mark: tuple[int, int]) -> None:
        self.top, n = mark
        del self.live[n:]

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


def _check_shape(name: str, shape: object) -> tuple[int, ...]:
    if shape.__class__ is tuple and 1 <= len(shape) <= 2 and all(s.__class__ is int and s > 0 for s in shape):
        return shape  # the common case, already right
    if isinstance(shape, (int, np.integer)):
        shape = (int(shape),)
    try:
        shape = tuple(int(s) for s in shape)  # type: ignore[union-attr]
    except TypeError:
        raise ValidationError(f"tensor {name!r}: shape {shape!r} is not a tuple of ints.") from None
    if not 1 <= len(shape) <= 2 or any(s <= 0 for s in shape):
        raise ValidationError(f"tensor {name!r}: shape {shape} must be 1-D or 2-D with positive extents.")
    return shape


class Memory:
    """The PE's two memories for one simulator: HBM (shared across runs) and a TCM per run."""

    def __init__(self, tcm_bytes: int, backed: bool):
        self.backed = backed
        self.hbm = Arena(Space.HBM, None, backed)
        self.tcm_bytes = tcm_bytes
        self.tcm = Arena(Space.TCM, tcm_bytes, backed)

    def new_tcm(self) -> Arena:
        """Start a fresh TCM for a new kernel launch."""
        self.tcm = Arena(Space.TCM, self.tcm_bytes, self.backed)
        return self.tcm

    def arena(self, h: Handle) -> Arena:
        return self.hbm if h.space == Space.HBM else self.tcm

    def iter_arenas(self) -> Iterator[Arena]:
        yield self.hbm
        yield self.tcm
