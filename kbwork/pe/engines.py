"""Engine models: how long each stage takes, and (data mode) what it does.

Latency models read only the topology and a stage's extents (DESIGN.md §1).
:class:`DataExecutor` applies a stage's effect to the numpy-backed memories
when the stage ends; the timeline calls it in (end, seq) order so a
scheduling bug shows up as a wrong number.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any, Callable, Mapping, NamedTuple

import numpy as np

from ..config import Topology
from ..memory import DTYPES, Handle, Memory
from .ops import OPS, apply_math


class Latency:
    """Cycle costs of every stage kind for one topology (DESIGN.md §1)."""

    def __init__(self, topo: Topology):
        self.topo = topo
        t = topo
        self._dma_base, self._dma_bw = t.dma_base_cycles, t.dma_bytes_per_cycle
        # a transfer alone on its channel moves at the lesser of its unit's rate and the channel's (§14,
        # Topology.alone_rate); None where the unit's own whole rate binds (the integer path, the common case)
        rate = t.alone_rate
        self._alone: Fraction | None = None if rate == t.dma_bytes_per_cycle else rate
        self._fetch_bw = t.fetch_bytes_per_cycle
        self._gemm_base, self._mr, self._mc = t.gemm_base_cycles, t.mac_rows, t.mac_cols
        self._math_base, self._math_bw = t.math_base_cycles, t.math_elements_per_cycle
        self._cost_exp, self._cost_other = t.math_cost_exp, t.math_cost_other
        self._math_cache: dict[tuple[str, int, int], int] = {}

    def __repr__(self) -> str:
        return f"Latency({self.topo.name})"

    def plan(self, n_ops: int) -> int:
        """PLAN: ``plan_base + plan_per_op x len(cmd.ops)``."""
        return self.topo.plan_base_cycles + self.topo.plan_cycles_per_op * n_ops

    def dma(self, nbytes: int) -> int:
        """One DMA transfer alone on its channel: ``200 + ceil(bytes / min(64, channel bytes per cycle))``."""
        rate = self._alone
        if rate is None:
            return self._dma_base + -(-nbytes // self._dma_bw)
        return self._dma_base + -(-nbytes * rate.denominator // rate.numerator)

    def fetch(self, nbytes: int) -> int:
        """FETCH of a- and b-tiles from TCM: ``ceil(bytes / 128)``."""
        return -(-nbytes // self._fetch_bw)

    def gemm(self, tm: int, tn: int, tk: int) -> int:
        """One GEMM tile on the MAC array: ``16 + ceil(tm/32) x ceil(tn/32) x tk``."""
        return self._gemm_base + (-(-tm // self._mr)) * (-(-tn // self._mc)) * tk

    def math(self, kind: str, n_elements: int, row_len: int = 1) -> int:
        """One MATH op: ``8 + ceil(n / 64) x cost(kind)`` (+ ``ceil(log2(row_len))`` for reductions)."""
        key = (kind, n_elements, row_len)
        cycles = self._math_cache.get(key)
        if cycles is None:
            cycles = self._math_cache[key] = self._math(kind, n_elements, row_len)
        return cycles

    def _math(self, kind: str, n_elements: int, row_len: int) -> int:
        info = OPS[kind]
        cost = self._cost_exp if info.exp_cost else self._cost_other
        cycles = self._math_base + (-(-n_elements // self._math_bw)) * cost
        if info.reduction and row_len > 1:
            cycles += math.ceil(math.log2(row_len))
        return cycles


# --- data mode --------------------------------------------------------------------------
# A stage's effect is a named record (built by tiling, applied here by the handler its type names).
# A block is ``(handle, r0, r1, c0, c1)``: rows r0:r1 and columns c0:c1 of the handle (columns only of a 1-D one).
class CopyBlock(NamedTuple):
    """DMA: a block of ``src`` into the whole of ``dst`` (same dtype: a DMA copies bytes)."""

    src: Handle
    r0: int
    r1: int
    c0: int
    c1: int
    dst: Handle


class Fetch(NamedTuple):
    """FETCH: the a- and b-blocks of one GEMM tile into the GEMM's registers, as float32."""

    key: tuple
    a: tuple
    b: tuple
    trans_b: bool


class GemmTile(NamedTuple):
    """GEMM: ``acc (+)= a @ b`` from the registers ``key``; ``first`` starts the accumulator."""

    key: tuple
    acc: tuple
    first: bool


class AccOp(NamedTuple):
    """An accumulator epilogue (``scale``, ``add``) on the running tile; ``other`` is a block or None."""

    kind: str
    acc: tuple
    other: tuple | None
    extra: Mapping


class StoreAcc(NamedTuple):
    """Write the accumulator (rounded to the out's dtype) into its block of ``out``."""

    acc: tuple
    out: Handle
    r0: int
    r1: int
    c0: int
    c1: int


class MathOp(NamedTuple):
    """A MATH op on memory: ``out = kind(operands, extra)``; operands name -> handle."""

    kind: str
    operands: Mapping
    extra: Mapping
    out: Handle


class MathAcc(NamedTuple):
    """An accumulator op on a whole tensor in memory: ``target = kind(target, operands, extra)``."""

    kind: str
    target: Handle
    operands: Mapping
    extra: Mapping


class Effects(NamedTuple):
    """Several effects of one stage, applied in order."""

    items: tuple


class StagingRef(NamedTuple):
    """In an effect template: the staging buffer a plan's ``rel``-th take of ``slot`` lands in (resolved against
    the staging ring's position when the template is stamped)."""

    slot: str
    rel: int
    shape: tuple
    dtype: str


def _block(b: tuple, h: Callable[[Any], Any]) -> tuple:
    return (h(b[0]),) + b[1:]


#: How each effect type is bound to one instance of its command: ``bind(effect, h, key)`` with ``h`` mapping a
#: template's handles (loop handles, staging references) to the instance's and ``key`` its accumulator keys.
BINDERS: dict[type, Callable[..., Any]] = {
    CopyBlock: lambda e, h, key: CopyBlock(h(e.src), e.r0, e.r1, e.c0, e.c1, h(e.dst)),
    Fetch: lambda e, h, key: Fetch(key(e.key), _block(e.a, h), _block(e.b, h), e.trans_b),
    GemmTile: lambda e, h, key: GemmTile(key(e.key), key(e.acc), e.first),
    AccOp: lambda e, h, key: AccOp(e.kind, key(e.acc), None if e.other is None else _block(e.other, h), e.extra),
    StoreAcc: lambda e, h, key: StoreAcc(key(e.acc), h(e.out), e.r0, e.r1, e.c0, e.c1),
    MathOp: lambda e, h, key: MathOp(e.kind, {n: h(x) for n, x in e.operands.items()}, e.extra, h(e.out)),
    MathAcc: lambda e, h, key: MathAcc(e.kind, h(e.target), {n: h(x) for n, x in e.operands.items()}, e.extra),
    Effects: lambda e, h, key: Effects(tuple(BINDERS[x.__class__](x, h, key) for x in e.items)),
}


class DataExecutor:
    """Applies stage effects to the memories in float32, rounding on every write.

    Each effect type has one handler (:attr:`handlers`, effect type -> method, on the class: a table of
    bound methods on the instance would hold it in a reference cycle); a new effect is a new record type
    and a handler beside the others.
    """

    handlers: dict[type, Callable[["DataExecutor", Any], None]] = {}

    def __init__(self, memory: Memory):
        self.mem = memory
        self.regs: dict[object, tuple[np.ndarray, np.ndarray]] = {}
        self.acc: dict[object, np.ndarray] = {}

    def __repr__(self) -> str:
        return f"DataExecutor({len(self.acc)} live accumulators)"

    @staticmethod
    def quiet() -> np.errstate:
        """numpy's floating-point warnings off, for the span of a run (see ``ops.apply_math``)."""
        return np.errstate(invalid="ignore", over="ignore", divide="ignore")

    def _block(self, h: Handle, r0: int, r1: int, c0: int, c1: int) -> np.ndarray:
        v = self.mem.arena(h).view(h)
        return v[r0:r1, c0:c1] if v.ndim == 2 else v[c0:c1]

    def _f32(self, h: Handle) -> np.ndarray:
        return self.mem.arena(h).read_f32(h)  # read-only: every op below returns a new array

    def apply(self, effect: object) -> None:
        """Apply one stage's effect."""
        self.handlers[effect.__class__](self, effect)

    def _many(self, e: Effects) -> None:
        for x in e.items:
            self.handlers[x.__class__](self, x)

    def _copy_block(self, e: CopyBlock) -> None:
        dst = e.dst
        self.mem.arena(dst).view(dst)[...] = self._block(e.src, e.r0, e.r1, e.c0, e.c1).reshape(dst.shape)

    def _fetch(self, e: Fetch) -> None:
        a = self._block(*e.a).astype(np.float32)
        b = self._block(*e.b).astype(np.float32)
        self.regs[e.key] = (a, b.T if e.trans_b else b)

    def _gemm(self, e: GemmTile) -> None:
        a, b = self.regs.pop(e.key)
        prod = a @ b
        self.acc[e.acc] = prod if e.first else self.acc[e.acc] + prod

    def _acc(self, e: AccOp) -> None:
        args = {"other": np.asarray(self._block(*e.other), dtype=np.float32)} if e.other is not None else {}
        self.acc[e.acc] = apply_math(e.kind, args, e.extra, self.acc[e.acc])

    def _store_acc(self, e: StoreAcc) -> None:
        block = self._block(e.out, e.r0, e.r1, e.c0, e.c1)
        block[...] = self.acc.pop(e.acc).astype(DTYPES[e.out.dtype])

    def _math(self, e: MathOp) -> None:
        args = {name: self._f32(h) for name, h in e.operands.items()}
        self.mem.arena(e.out).write(e.out, apply_math(e.kind, args, e.extra))

    def _math_acc(self, e: MathAcc) -> None:
        args = {name: self._f32(h) for name, h in e.operands.items()}
        self.mem.arena(e.target).write(e.target, apply_math(e.kind, args, e.extra, self._f32(e.target)))


DataExecutor.handlers = {CopyBlock: DataExecutor._copy_block, Fetch: DataExecutor._fetch, GemmTile: DataExecutor._gemm,
                         AccOp: DataExecutor._acc, StoreAcc: DataExecutor._store_acc, MathOp: DataExecutor._math,
                         MathAcc: DataExecutor._math_acc, Effects: DataExecutor._many}
