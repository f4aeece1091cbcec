"""Hardware commands (ADR-0065 D1-D3) and their dispatch cost (ADR-0064 Rev. 2).

A :class:`CompositeCmd` is one flat, ordered tuple of :class:`OpSpec`; there is
no head/epilogue distinction in the command. Position relative to the (at most
one) GEMM plus each op's :class:`Scope` decide where it runs (see
``tiling.generate_plan_from_ops``).
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from fractions import Fraction
from types import MappingProxyType
from collections.abc import Mapping
from typing import Any, Union

import numpy as np

from ..config import exact_fraction
from ..errors import ValidationError
from ..memory import Handle
from ..symbolic import Index

LOGICAL_BYTES_PER_HANDLE = 8
LOGICAL_BYTES_PER_OP = 8
LOGICAL_BYTES_PER_SCALAR = 4


class Scope(enum.Enum):
    """How often an op repeats within its phase."""

    KERNEL = "kernel"            # once per command invocation
    K_TILE = "k_tile"            # after every k-tile GEMM, on the running accumulator
    OUTPUT_TILE = "output_tile"  # after the last k-tile of each output tile

    def __repr__(self) -> str:
        return f"Scope.{self.name}"


@dataclass(frozen=True, slots=True)
class Completion:
    """What ``tl`` returns for an emitted command; ``tl.wait`` takes it. ``cmd`` is the program-order id.

    ``primary_out`` is the primary output of a recipe the command expanded
    (a softmax merge's P, say), a pinned TCM handle a later command may read.
    ``origin`` marks the run that emitted it (a completion kept from an
    earlier run is refused); a hand-built ``Completion(k)`` has none and means
    command k of the current run. Only ``cmd`` takes part in equality.
    """

    cmd: int
    primary_out: Handle | None = field(default=None, compare=False)
    origin: object = field(default=None, compare=False, repr=False)
    #: for a command of a ``tl.range`` body: its loop variable (``cmd`` is then iteration 0's id)
    loop: object = field(default=None, compare=False, repr=False)

    def __init__(self, cmd: int, primary_out: Handle | None = None, origin: object = None, loop: object = None):
        # written out (the dataclass keeps it): every command makes one; the slots' setters are cheaper than the
        # generated __init__'s object.__setattr__
        _C_CMD(self, cmd)
        _C_PRIMARY(self, primary_out)
        _C_ORIGIN(self, origin)
        _C_LOOP(self, loop)

    def __repr__(self) -> str:
        po = f", primary_out={self.primary_out.name}" if self.primary_out is not None else ""
        return f"Completion(cmd={self.cmd}{po})"


_C_CMD, _C_PRIMARY, _C_ORIGIN, _C_LOOP = (Completion.__dict__[f].__set__ for f in ("cmd", "primary_out", "origin", "loop"))

#: every op without operands or scalars shares this one (most MATH ops ship no scalar)
_EMPTY: Mapping[str, Any] = MappingProxyType({})


def _op_logical_bytes(operands: Mapping[str, Any], extra: Mapping[str, Any], out: Any) -> int:
    """An op's logical bytes: ``8 + 8 x (#operand handles + #out handles) + 4 x #scalar extras`` (ADR-0064 D2)."""
    return (LOGICAL_BYTES_PER_OP + LOGICAL_BYTES_PER_HANDLE * (len(operands) + (out is not None))
            + LOGICAL_BYTES_PER_SCALAR * len(extra))


def _freeze(m: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return MappingProxyType(dict(m)) if m else _EMPTY


@dataclass(frozen=True, eq=False, slots=True)
class OpSpec:
    """One op of a composite: kind, scope, named operand handles, shipped scalars, out.

    ``extra`` holds only the scalars the command ships to the PE (GEMM: m, k,
    n, trans_b; ``scale``: factor; ``fill``: value); each costs 4 logical bytes.
    ``out`` is ``None`` for accumulator ops (``scale``, ``add``), which update
    the nearest preceding op's output in place.
    """

    kind: str
    scope: Scope = Scope.KERNEL
    operands: Mapping[str, Handle] = field(default_factory=dict)
    extra: Mapping[str, Any] = field(default_factory=dict)
    out: Handle | None = None
    #: ``8 + 8 x (#operand handles + #out handles) + 4 x #scalar extras`` (ADR-0064 D2), computed once.
    logical_bytes: int = field(init=False, repr=False, compare=False)
    #: ``(signature, read_spans)``, made on first use of either (see :attr:`signature`).
    _described: tuple | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.kind, str):
            raise ValidationError(f"OpSpec kind must be an op name (a string), got {self.kind!r}.")
        for what in ("operands", "extra"):
            v = getattr(self, what)
            if v is not None and v.__class__ is not dict and not isinstance(v, Mapping):
                raise ValidationError(f"OpSpec {self.kind!r}: {what} must be a dict of name -> "
                                      f"{'handle' if what == 'operands' else 'scalar'}, got {type(v).__name__}.")
        if self.scope.__class__ is not Scope:  # a scope name ("k_tile") from the flat form
            try:
                object.__setattr__(self, "scope", Scope(str(self.scope).lower()))
            except ValueError:
                raise ValidationError(f"OpSpec {self.kind!r}: scope {self.scope!r} is unknown; use one of "
                                      f"{', '.join(s.value for s in Scope)}.") from None
        set_ = object.__setattr__
        operands, extra = _freeze(self.operands), _freeze(self.extra)
        set_(self, "operands", operands)
        set_(self, "extra", extra)
        set_(self, "logical_bytes", _op_logical_bytes(operands, extra, self.out))

    @classmethod
    def built(cls, kind: str, scope: Scope, operands: dict[str, Any], extra: dict[str, Any],
              out: Handle | None) -> "OpSpec":
        """``OpSpec(kind, scope, operands, extra, out)`` from parts the front end made itself and hands over:
        a known op name, a :class:`Scope`, and dicts nobody else holds (so they are wrapped, not copied).
        The same object, without the checks of ``__post_init__``, which a composite's lowering runs for
        every op it builds. Keep the two in step: this sets every field ``__init__`` does."""
        o = object.__new__(cls)
        set_ = object.__setattr__
        set_(o, "kind", kind)
        set_(o, "scope", scope)
        set_(o, "operands", MappingProxyType(operands) if operands else _EMPTY)
        set_(o, "extra", MappingProxyType(extra) if extra else _EMPTY)
        set_(o, "out", out)
        set_(o, "logical_bytes", _op_logical_bytes(operands, extra, out))
        set_(o, "_described", None)
        return o

    @property
    def signature(self) -> tuple | None:
        """Everything but addresses, names and scalar values: kind, scope, each operand's and the out's space,
        shape, dtype and pinning, the names of the shipped scalars, and the values of a GEMM's m, k, n,
        trans_b. The stages the scheduler plans for the op depend on nothing else, so its plan cache keys on
        it (``pe.templates``). ``None`` when an operand is not a handle (validation then says what is wrong).

        Made on first use (a device's replicated PEs never plan their ops), like :attr:`read_spans`."""
        d = self._described
        return (d if d is not None else self._describe())[0]

    @property
    def read_spans(self) -> tuple | None:
        """``Handle.span`` of every operand, in order (what hazard tracking reads); None like ``signature``."""
        d = self._described
        return (d if d is not None else self._describe())[1]

    def _describe(self) -> tuple:
        operands, extra, out, kind = self.operands, self.extra, self.out, self.kind
        try:
            # plain strings, ints and tuples only: the key is hashed on every lookup, and an enum's
            # hash is a Python-level call. ``span[0]`` is the handle's space (is it TCM).
            described, spans = [], []
            for n, h in operands.items():
                span = h.span
                described.append((n, span[0], h.shape, h.dtype, h.pinned))
                spans.append(span)
            sig: tuple | None = (
                kind, self.scope._value_, tuple(described),
                None if out is None else (out.span[0], out.shape, out.dtype, out.pinned),
                tuple(extra.items()) if kind == "gemm" else tuple(extra))
            hash(sig)  # a hand-built handle with a list shape, or an unhashable scalar: no signature
            read_spans: tuple | None = tuple(spans)
        except (AttributeError, TypeError):
            sig = read_spans = None
        d = (sig, read_spans)
        object.__setattr__(self, "_described", d)
        return d

    def handles(self) -> tuple[Handle, ...]:
        """Every handle the op names: operands in order, then out."""
        hs = tuple(self.operands.values())
        return hs + (self.out,) if self.out is not None else hs

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, OpSpec) and self.kind == other.kind and self.scope == other.scope
                and dict(self.operands) == dict(other.operands) and _extra_key(self.extra) == _extra_key(other.extra)
                and self.out == other.out)

    def __hash__(self) -> int:
        return hash((self.kind, self.scope, tuple(self.operands.items()), _extra_key(self.extra), self.out))

    def __repr__(self) -> str:
        ops = ", ".join(f"{k}={v.name}" for k, v in self.operands.items())
        ex = ", ".join(f"{k}={v!r}" for k, v in self.extra.items())
        out = f" -> {self.out.name}" if self.out is not None else ""
        scope = "" if self.scope is Scope.KERNEL else f" @{self.scope.value}"
        return f"OpSpec({self.kind}({', '.join(x for x in (ops, ex) if x)}){out}{scope})"


def scalar_key(v: Any) -> Any:
    """A scalar as compared by value: equal numbers are equal (``1 == 1.0``) but ``-0.0`` is not ``0.0``.

    Flags (bools) and anything that is not a real number compare as themselves.
    """
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
        return v
    try:
        f = float(v)
    except OverflowError:  # an int too large for a float: it compares as itself
        return v
    return (f, math.copysign(1.0, f))


def _extra_key(extra: Mapping[str, Any]) -> tuple:
    try:
        return tuple(sorted((k, scalar_key(v)) for k, v in extra.items()))
    except TypeError:  # unorderable mixed keys: insertion order still identifies the op
        return tuple((k, scalar_key(v)) for k, v in extra.items())


@dataclass(frozen=True, slots=True)
class CompositeCmd:
    """A flat composite command.

    ``rw_handles`` are the cross-composite read-write handles the scheduler
    tracks for hazards; ``scratch`` lists the recipe scratch the command's
    ops write (its intermediates and primary output). Like every byte range
    the ops touch, scratch counts for hazards (DESIGN.md §5): two commands
    sharing scratch are ordered. ``label`` and ``iter`` are annotations for
    the op_log, not shipped to the PE.
    """

    completion: Completion
    ops: tuple[OpSpec, ...]
    rw_handles: tuple[Handle, ...] = ()
    data_op: bool = True
    scratch: tuple[Handle, ...] = ()
    label: str = ""
    iter: int = -1
    #: Sum of the ops' logical bytes (ADR-0064 D2), computed once.
    logical_bytes: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        ops = self.ops
        object.__setattr__(self, "logical_bytes",
                           ops[0].logical_bytes if len(ops) == 1 else sum([op.logical_bytes for op in ops]))

    def __repr__(self) -> str:
        it = self.iter
        # a loop body's command carries a symbolic label (tl.iteration(j + 1)): written as text, never compared
        it = f", iter={it.text}" if isinstance(it, Index) else f", iter={it}" if it >= 0 else ""
        return (f"CompositeCmd(#{self.completion.cmd} {self.label!r}, {len(self.ops)} ops, "
                f"{self.logical_bytes} logical B{it})")


@dataclass(frozen=True, slots=True)
class DmaCmd:
    """A DMA copy from ``tl.load`` (HBM -> TCM) or ``tl.store`` (TCM -> HBM)."""

    completion: Completion
    src: Handle
    dst: Handle
    label: str = ""
    iter: int = -1
    #: in a ``tl.range`` body, a default label that names a source differing per iteration: the prefix
    #: (``"dma_load "``) the instantiated command's label puts before its source's name
    auto_label: str | None = field(default=None, compare=False, repr=False)

    #: 8 for the op plus 8 per handle (src, dst).
    logical_bytes = LOGICAL_BYTES_PER_OP + 2 * LOGICAL_BYTES_PER_HANDLE
    ops: tuple[OpSpec, ...] = ()

    def __repr__(self) -> str:
        return f"DmaCmd(#{self.completion.cmd} {self.src.name} -> {self.dst.name})"


Command = Union[CompositeCmd, DmaCmd]


def n_ops(cmd: Command) -> int:
    """Ops the scheduler plans for ``cmd`` (a DmaCmd counts as one)."""
    return 1 if isinstance(cmd, DmaCmd) else len(cmd.ops)


def segments(logical_bytes: int, cap: int) -> int:
    """``max(1, ceil(logical_bytes / cap))``: how many segments a command is dispatched in."""
    return max(1, -(-logical_bytes // cap))


def dispatch_cycles(logical_bytes: int, fixed: int, r: Fraction | float | int, cap: int) -> int:
    """``FIXED x segments + ceil(R x logical_bytes)`` in integer cycles.

    ``r`` is taken exactly (a Fraction, or a float read as the decimal it prints as).
    """
    return fixed * segments(logical_bytes, cap) + math.ceil(exact_fraction(r) * logical_bytes)
