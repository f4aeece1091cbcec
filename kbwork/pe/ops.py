"""The op set the PE executes: operand names, scalars, cost class, numerics.

This table is hardware knowledge (the MATH/GEMM ISA). The compiler side
validates against it; the engines cost and execute from it. An entry is
everything about its op (micrograd's "behaviour beside its data"): operand
ports, the real-valued scalars it ships (4 logical bytes each), its cost
class, and its numpy meaning, called as ``fn(*operands, **scalars)`` (an
accumulator op gets the running value first). Adding a MATH op means adding
one :class:`OpInfo` here; validation, dispatch costing, planning and data
mode pick it up, and the scheduler's plan cache keys on :func:`table_key`,
so editing the table in a running process takes effect at once.

======================  =========================  ======================================
kind                    operands -> out            numpy meaning
======================  =========================  ======================================
``fill``                out (scalar ``value``)     ``out[...] = value``
``copy``                a -> out                   ``out = a``
``scale``               (accumulator, ``factor``)  ``acc *= factor``
``add``                 other (accumulator)        ``acc += other``
``rmax``, ``rsum``      a (G,T) -> out (G,1)       row max / row sum
``max_elem``            a, b -> out                ``maximum(a, b)``
``exp_diff``            a, b -> out                ``exp(a - b)``, b per row when (G,1)
``fma``                 a, b, c -> out             ``a * b + c``, b per row when (G,1)
``mul_bcast``           a (G,d), b (G,1) -> out    ``a * b`` per row
``div_bcast``           a (G,d), b (G,1) -> out    ``a / b`` per row
``mul``                 a, b -> out                ``a * b``, numpy broadcasting (a row
                                                   of per-column gains, say)
``rms_inv``             a (G,K) -> out (G,1)       ``1 / sqrt(mean(a**2) + eps)`` per row;
                        (scalar ``eps``)           a row reduction in the exp cost class
                                                   (a square root is transcendental)
======================  =========================  ======================================
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..errors import ValidationError


@dataclass(frozen=True)
class OpInfo:
    """What one op kind takes and does.

    ``scalars`` are the real-valued parameters the op ships (``value``,
    ``factor``, ...): each is an int or float (±inf allowed, NaN not), costs 4
    logical bytes and reaches ``fn`` as a keyword argument. ``params`` are
    the GEMM's shape parameters (m, k, n, trans_b), which ship like scalars
    but are set by the kernel language from the operand shapes.
    ``accumulator`` ops (``scale``, ``add``) have no ``out``: they update the
    running accumulator inside a GEMM tile loop, or the nearest preceding op's
    output elsewhere. ``reduction`` ops reduce each row to a ``(rows, 1)``
    column and pay ``ceil(log2(row_len))`` extra cycles.
    """

    kind: str
    operands: tuple[str, ...]
    scalars: tuple[str, ...] = ()
    exp_cost: bool = False
    reduction: bool = False
    accumulator: bool = False
    fn: Callable[..., np.ndarray] | None = None
    doc: str = ""
    params: tuple[str, ...] = ()
    #: ``operands`` and ``shipped`` as sets: what an op's keys are checked against (once per op validated)
    operand_set: frozenset = field(init=False, repr=False, compare=False)
    shipped_set: frozenset = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # a new entry's mistakes fail here, where it is written, not as a TypeError in the middle of a run
        where = f"OpInfo {self.kind!r}"
        if not isinstance(self.kind, str) or not self.kind.isidentifier():
            raise ValidationError(f"OpInfo: kind {self.kind!r} must be a name (an identifier string).")
        names: list[str] = []
        for what in ("operands", "scalars", "params"):
            v = getattr(self, what)
            if not isinstance(v, tuple) or not all(isinstance(x, str) and x.isidentifier() for x in v):
                hint = f"; write ({v!r},) for one" if isinstance(v, str) else ""
                raise ValidationError(f"{where}: {what} must be a tuple of names, got {v!r}{hint}.")
            names += v
        if len(set(names)) != len(names) or "out" in names:
            raise ValidationError(f"{where}: operand, scalar and param names must be distinct and not 'out', got "
                                  f"{names}.")
        if self.kind != "gemm" and not callable(self.fn):
            raise ValidationError(f"{where}: fn must be its numpy meaning, called as fn(*operands, **scalars) "
                                  f"(an accumulator op gets the running value first); got {self.fn!r}.")
        if self.accumulator and self.reduction:
            raise ValidationError(f"{where}: an accumulator op updates the running value in place; it cannot "
                                  f"also be a row reduction.")
        object.__setattr__(self, "operand_set", frozenset(self.operands))
        object.__setattr__(self, "shipped_set", frozenset(self.shipped))

    @property
    def shipped(self) -> tuple[str, ...]:
        """Every key the op's ``extra`` must hold: its parameters, then its scalars."""
        return self.params + self.scalars

    def __repr__(self) -> str:
        return f"OpInfo({self.kind}: {', '.join(self.operands + self.shipped) or '-'})"


def _rmax(a): return a.max(axis=-1, keepdims=True)
def _rsum(a): return a.sum(axis=-1, keepdims=True, dtype=np.float32)


def _rms_inv(a, *, eps):
    mean_sq = np.mean(a * a, axis=-1, keepdims=True, dtype=np.float32)
    return np.float32(1.0) / np.sqrt(mean_sq + np.float32(eps))


OPS: dict[str, OpInfo] = {op.kind: op for op in (
    OpInfo("gemm", ("a", "b"), params=("m", "k", "n", "trans_b"), doc="out = a @ b (b.T when trans_b)"),
    OpInfo("fill", (), ("value",), fn=lambda *, value: np.float32(value), doc="out[...] = value"),
    OpInfo("copy", ("a",), fn=lambda a: a, doc="out = a"),
    OpInfo("scale", (), ("factor",), accumulator=True, fn=lambda acc, *, factor: acc * np.float32(factor),
           doc="acc *= factor"),
    OpInfo("add", ("other",), accumulator=True, fn=lambda acc, other: acc + other, doc="acc += other"),
    OpInfo("rmax", ("a",), reduction=True, fn=_rmax, doc="out = row max of a"),
    OpInfo("rsum", ("a",), reduction=True, fn=_rsum, doc="out = row sum of a"),
    OpInfo("max_elem", ("a", "b"), fn=np.maximum, doc="out = maximum(a, b)"),
    OpInfo("exp_diff", ("a", "b"), exp_cost=True, fn=lambda a, b: np.exp(a - b),
           doc="out = exp(a - b), b broadcast per row"),
    OpInfo("fma", ("a", "b", "c"), fn=lambda a, b, c: a * b + c, doc="out = a * b + c, b broadcast per row"),
    OpInfo("mul_bcast", ("a", "b"), fn=np.multiply, doc="out = a * b, b (rows, 1) per row"),
    OpInfo("div_bcast", ("a", "b"), fn=np.divide, doc="out = a / b, b (rows, 1) per row"),
    OpInfo("mul", ("a", "b"), fn=np.multiply, doc="out = a * b (numpy broadcasting)"),
    OpInfo("rms_inv", ("a",), ("eps",), exp_cost=True, reduction=True, fn=_rms_inv,
           doc="out = 1 / sqrt(mean(a**2, per row) + eps)"),
)}

MATH_KINDS = tuple(k for k in OPS if k != "gemm")


def table_key() -> tuple:
    """The op table's content, as a hashable value: equal exactly when no entry was added, removed or replaced.

    The scheduler's plan cache includes it in its key (a plan's durations and
    placement read the table), so editing ``OPS`` invalidates what it planned.
    """
    return tuple(OPS.items())


def apply_math(kind: str, args: dict[str, np.ndarray], extra: dict, acc: np.ndarray | None = None) -> np.ndarray:
    """Compute one MATH op in float32 and return the result (not yet rounded).

    ``acc`` is the running value for accumulator ops. Overflow to inf and
    ``exp(-inf - -inf)`` are part of the ops' meaning (``m`` starts at -inf);
    :meth:`DataExecutor.quiet` silences numpy's warnings for a whole run, so
    this does not set ``np.errstate`` per call.
    """
    info = OPS[kind]
    scalars = {n: extra[n] for n in info.scalars}
    operands = [args[n] for n in info.operands]
    if info.accumulator:
        return info.fn(acc, *operands, **scalars)
    return info.fn(*operands, **scalars)
