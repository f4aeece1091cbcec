"""The op set the PE executes: operand names, scalars, cost class, numerics.

This table is hardware knowledge (the MATH/GEMM ISA). The compiler side
validates against it; the engines cost and execute from it. Adding a MATH op
means adding one :class:`OpInfo` here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np


@dataclass(frozen=True)
class OpInfo:
    """What one op kind takes and does.

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

    def __repr__(self) -> str:
        return f"OpInfo({self.kind}: {', '.join(self.operands + self.scalars) or '-'})"


def _rmax(a): return a.max(axis=-1, keepdims=True)
def _rsum(a): return a.sum(axis=-1, keepdims=True, dtype=np.float32)


OPS: dict[str, OpInfo] = {op.kind: op for op in (
    OpInfo("gemm", ("a", "b"), ("m", "k", "n", "trans_b"), doc="out = a @ b (b.T when trans_b)"),
    OpInfo("fill", (), ("value",), fn=None, doc="out[...] = value"),
    OpInfo("copy", ("a",), fn=lambda a: a, doc="out = a"),
    OpInfo("scale", (), ("factor",), accumulator=True, doc="acc *= factor"),
    OpInfo("add", ("other",), accumulator=True, fn=lambda acc, other: acc + other, doc="acc += other"),
    OpInfo("rmax", ("a",), reduction=True, fn=_rmax, doc="out = row max of a"),
    OpInfo("rsum", ("a",), reduction=True, fn=_rsum, doc="out = row sum of a"),
    OpInfo("max_elem", ("a", "b"), fn=np.maximum, doc="out = maximum(a, b)"),
    OpInfo("exp_diff", ("a", "b"), exp_cost=True, fn=lambda a, b: np.exp(a - b),
           doc="out = exp(a - b), b broadcast per row"),
    OpInfo("fma", ("a", "b", "c"), fn=lambda a, b, c: a * b + c, doc="out = a * b + c"),
    OpInfo("mul_bcast", ("a", "b"), fn=np.multiply, doc="out = a * b, b (rows, 1) per row"),
    OpInfo("div_bcast", ("a", "b"), fn=np.divide, doc="out = a / b, b (rows, 1) per row"),
)}

MATH_KINDS = tuple(k for k in OPS if k != "gemm")


def apply_math(kind: str, args: dict[str, np.ndarray], extra: dict, acc: np.ndarray | None = None) -> np.ndarray:
    """Compute one MATH op in float32 and return the result (not yet rounded).

    ``acc`` is the running value for accumulator ops. Overflow to inf and
    ``exp(-inf - -inf)`` are part of the ops' meaning (``m`` starts at -inf);
    :meth:`DataExecutor.quiet` silences numpy's warnings for a whole run, so
    this does not set ``np.errstate`` per call.
    """
    if kind == "fill":
        raise AssertionError("fill is applied by the caller (it needs the out shape)")
    if kind == "scale":
        return acc * np.float32(extra["factor"])
    info = OPS[kind]
    if info.accumulator:
        return info.fn(acc, *[args[n] for n in info.operands])
    return info.fn(*[args[n] for n in info.operands])
