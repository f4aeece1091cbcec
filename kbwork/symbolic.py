"""The symbolic loop index of ``tl.range`` (DESIGN.md §13): affine integers that are never concrete.

A ``tl.range`` body is traced once. Its index ``j`` is an :class:`Index`:
``a·i + b`` in the loop's iteration counter ``i = 0, 1, ..., n - 1`` (for
``tl.range(start, stop, step)``, ``j`` itself is ``step·i + start``). It
supports exactly the arithmetic that keeps it affine — ``j + c``, ``j - c``,
``c - j``, ``c * j``, ``-j`` — and everything that would need a concrete value
(``int(j)``, ``bool(j == 3)``, ``if j:``, ``range(j)``, ``j % 2``, a Python list
indexed by ``j``, ``f"{j}"``) raises :class:`~kbwork.errors.TraceError` naming the
expression and the fix, the way JAX refuses to concretise a traced value.

This module is a foundation: the memories (:mod:`kbwork.memory`) slice
handles with it, the PE side instantiates loops with it, and the kernel
language (:mod:`kbwork.triton_emu`) hands it to kernels as ``tl.Index``.
"""

from __future__ import annotations

import operator
from typing import Any

import numpy as np

from .errors import TraceError

#: What every refusal says to do instead.
FIX = "peel that iteration out of the loop, or index a tl.ring"


class LoopVar:
    """The identity of one ``tl.range`` loop: its iteration count and where it stands in the program.

    ``number`` counts the loops of a kernel (0, 1, ...); ``iterations`` is n.
    ``closed`` is set when the body has been traced (an :class:`Index` of a
    closed loop used later is refused). ``periods`` collects the ring periods
    the body indexes with its index (``n / gcd(a, n)`` for ``ring[a·i + b]``).
    ``body_len`` is the body's number of commands, set when it has been traced
    (None while it is being traced).
    """

    __slots__ = ("number", "iterations", "start", "step", "closed", "periods", "text", "body_len")

    def __init__(self, number: int, iterations: int, start: int = 0, step: int = 1, text: str = "j"):
        self.number = number
        self.iterations = iterations
        self.start, self.step = start, step
        self.closed = False
        self.periods: set[int] = set()
        self.text = text
        self.body_len: int | None = None

    def j_at(self, i: int) -> int:
        """The loop's ``j`` in iteration ``i`` (``start + step·i``)."""
        return self.start + self.step * i

    def __repr__(self) -> str:
        state = "traced" if self.closed else "tracing"
        return f"LoopVar(loop {self.number}, {self.iterations} iterations, {state})"


def _int(x: Any) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


class Index:
    """``a·i + b`` in the iteration counter ``i`` of one loop: the traced ``j`` and its affine images.

    ``at(i)`` is its value in iteration ``i``. ``text`` is how error messages
    write it, in terms of the loop's ``j`` (``"j + 1"``, ``"2*j"``).
    """

    __slots__ = ("var", "a", "b", "_ja", "_jb")

    def __init__(self, var: LoopVar, a: int, b: int, ja: int = 1, jb: int = 0):
        self.var, self.a, self.b = var, int(a), int(b)
        # the same value as an affine function of j (for messages): a·i + b = ja·j + jb
        self._ja, self._jb = ja, jb

    # --- values --------------------------------------------------------------------------
    def at(self, i: int) -> int:
        """The value in iteration ``i`` (0-based)."""
        return self.a * i + self.b

    @property
    def text(self) -> str:
        """The expression in terms of ``j``, as a reader wrote it (``"j + 1"``, ``"2*j - 3"``)."""
        ja, jb, j = self._ja, self._jb, self.var.text
        head = {1: j, -1: f"-{j}"}.get(ja, f"{ja}*{j}")
        if not jb:
            return head
        return f"{head} {'+' if jb > 0 else '-'} {abs(jb)}"

    def __repr__(self) -> str:
        return f"tl.Index({self.text})"

    # --- affine arithmetic ---------------------------------------------------------------
    def _combine(self, other: Any, sign: int, op: str) -> Any:
        if isinstance(other, Index):
            if other.var is not self.var:
                raise TraceError(f"{self.text} {op} {other.text}: the two indices belong to different tl.range "
                                 f"loops; a body sees only its own loop's index ({FIX}).")
            a, b = self.a + sign * other.a, self.b + sign * other.b
            ja, jb = self._ja + sign * other._ja, self._jb + sign * other._jb
            return b if a == 0 else Index(self.var, a, b, ja, jb)
        if _int(other):
            return Index(self.var, self.a, self.b + sign * int(other), self._ja, self._jb + sign * int(other))
        return NotImplemented

    def __add__(self, other: Any) -> Any:
        return self._combine(other, 1, "+")

    __radd__ = __add__

    def __sub__(self, other: Any) -> Any:
        return self._combine(other, -1, "-")

    def __rsub__(self, other: Any) -> Any:
        if _int(other):
            return Index(self.var, -self.a, int(other) - self.b, -self._ja, int(other) - self._jb)
        return NotImplemented

    def __neg__(self) -> "Index":
        return Index(self.var, -self.a, -self.b, -self._ja, -self._jb)

    def __pos__(self) -> "Index":
        return self

    def __mul__(self, other: Any) -> Any:
        if isinstance(other, Index):
            raise TraceError(f"({self.text}) * ({other.text}) is not affine in j; tl.range indices support "
                             f"j + c, c * j and slices of constant extent ({FIX}).")
        if _int(other):
            c = int(other)
            return c * self.b if c == 0 else Index(self.var, self.a * c, self.b * c, self._ja * c, self._jb * c)
        return self._refuse(f"({self.text}) * {other!r}", "a tl.range index times a non-integer")

    __rmul__ = __mul__

    # --- everything that needs a concrete value ----------------------------------------------
    def _refuse(self, expr: str, what: str) -> None:
        raise TraceError(f"{expr}: {what} needs a concrete value, but a tl.range body is traced once with a "
                         f"symbolic index (j has no value while the body runs); {FIX}.")

    def __index__(self) -> int:
        self._refuse(f"{self.text} used as a Python int (range(), a list or tuple index, int())",
                     "a Python int")
        raise AssertionError  # pragma: no cover - _refuse raises

    def __int__(self) -> int:
        self._refuse(f"int({self.text})", "int()")
        raise AssertionError  # pragma: no cover

    def __float__(self) -> float:
        self._refuse(f"float({self.text})", "float()")
        raise AssertionError  # pragma: no cover

    def __array__(self, dtype: Any = None, copy: Any = None) -> Any:
        # numpy swallows a failing __index__ into its own IndexError; a failing __array__ it lets through
        self._refuse(f"{self.text} used as a numpy value (an array index, np.asarray)", "a numpy value")
        raise AssertionError  # pragma: no cover

    def __bool__(self) -> bool:
        self._refuse(f"bool({self.text}) (an `if {self.text}:` or `and`/`or`)", "a branch on the index")
        raise AssertionError  # pragma: no cover

    def __hash__(self) -> int:
        self._refuse(f"hash({self.text}) (a dict or set keyed by {self.text})", "a dict or set key")
        raise AssertionError  # pragma: no cover

    def __format__(self, spec: str) -> str:
        self._refuse(f"format({self.text}) (an f-string or str())", "text that varies per iteration")
        raise AssertionError  # pragma: no cover

    __str__ = lambda self: self.__format__("")  # noqa: E731

    def __eq__(self, other: Any) -> "_Comparison":  # type: ignore[override]
        return _Comparison(self, "==", other)

    def __ne__(self, other: Any) -> "_Comparison":  # type: ignore[override]
        return _Comparison(self, "!=", other)

    def __lt__(self, other: Any) -> "_Comparison":
        return _Comparison(self, "<", other)

    def __le__(self, other: Any) -> "_Comparison":
        return _Comparison(self, "<=", other)

    def __gt__(self, other: Any) -> "_Comparison":
        return _Comparison(self, ">", other)

    def __ge__(self, other: Any) -> "_Comparison":
        return _Comparison(self, ">=", other)


def _refuse_op(name: str, shown: str):
    def method(self: Index, *other: Any) -> Any:
        expr = shown.format(x=self.text, y=" ".join(repr(o) if not isinstance(o, Index) else o.text
                                                     for o in other))
        self._refuse(expr, f"{name}")
    method.__name__ = name
    return method


for _name, _shown in (("__mod__", "{x} % {y}"), ("__rmod__", "{y} % {x}"), ("__floordiv__", "{x} // {y}"),
                      ("__rfloordiv__", "{y} // {x}"), ("__truediv__", "{x} / {y}"),
                      ("__rtruediv__", "{y} / {x}"), ("__pow__", "{x} ** {y}"), ("__rpow__", "{y} ** {x}"),
                      ("__divmod__", "divmod({x}, {y})"), ("__abs__", "abs({x})"), ("__round__", "round({x})"),
                      ("__and__", "{x} & {y}"), ("__or__", "{x} | {y}"), ("__xor__", "{x} ^ {y}"),
                      ("__lshift__", "{x} << {y}"), ("__rshift__", "{x} >> {y}"), ("__invert__", "~{x}")):
    setattr(Index, _name, _refuse_op(_name.strip("_"), _shown))


class _Comparison:
    """``j == 3`` and friends: a comparison that only exists to refuse being used as a truth value."""

    __slots__ = ("left", "op", "right")

    def __init__(self, left: Index, op: str, right: Any):
        self.left, self.op, self.right = left, op, right

    def __bool__(self) -> bool:
        right = self.right.text if isinstance(self.right, Index) else repr(self.right)
        self.left._refuse(f"bool({self.left.text} {self.op} {right}) (an `if` on the index)",
                          "a branch on the index")
        raise AssertionError  # pragma: no cover

    def __repr__(self) -> str:
        right = self.right.text if isinstance(self.right, Index) else repr(self.right)
        return f"<traced comparison {self.left.text} {self.op} {right}>"


def is_index(x: Any) -> bool:
    """True for a symbolic :class:`Index`."""
    return isinstance(x, Index)


def value_at(x: Any, i: int) -> int:
    """``x`` in iteration ``i``: an Index's value there, or ``x`` itself (an int)."""
    return x.at(i) if isinstance(x, Index) else operator.index(x)
