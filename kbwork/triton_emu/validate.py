"""Validating and lowering a composite's arguments (DESIGN.md §2, §3): scalars, the legacy form's entries,
the flat op list's invariants, and how an error names where an op sits.

What :class:`~kbwork.triton_emu.tl_context.TLContext` checks every call with; pure functions of their
arguments (nothing here reads a context).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import TraceError, ValidationError
from ..memory import DTYPE_MAX, Handle, Space
from ..pe.commands import OpSpec, Scope
from ..pe.ops import OPS
from ..symbolic import FIX, Index
from .tl_recipes import RECIPE_DESCRIPTORS, RecipeDescriptor

_SCOPES = {"kernel": Scope.KERNEL, "k_tile": Scope.K_TILE, "output_tile": Scope.OUTPUT_TILE}


_FP32_MAX = float(np.finfo(np.float32).max)


def _scope(value: Any, where: str) -> Scope:
    if isinstance(value, Scope):
        return value
    if isinstance(value, str) and value.lower() in _SCOPES:
        return _SCOPES[value.lower()]
    raise ValidationError(f"{where}: scope {value!r} is unknown; use one of {', '.join(_SCOPES)}.")


def _is_handle(x: Any) -> bool:
    return isinstance(x, Handle)


#: no flat indices: a composite without a recipe (a module constant: in TLContext, ``range`` is tl.range)
_NO_OPS = range(0)


def _is_int(x: Any) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def check_scalar(where: str, name: str, value: Any) -> None:
    """Refuse anything but a real number the PE can ship as a 4-byte scalar (DESIGN.md §2).

    ints, floats and numpy real scalars are accepted, ±inf included; ``None``,
    NaN, bools, strings, arrays, complex numbers and finite values beyond the
    float32 range are refused.

    Raises:
        ValidationError: naming ``where``, the scalar and what to pass instead.
    """
    if isinstance(value, Index):
        raise TraceError(f"{where}: {name}={value.text} is a tl.range index; a scalar the PE ships is a constant, "
                         f"the same in every iteration ({FIX}).")
    if value is None:
        raise ValidationError(f"{where}: {name}=None; give it a number (int or float).")
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValidationError(f"{where}: {name}={_show(value)} ({type(value).__name__}) is not a real number; "
                              f"scalars are ints or floats (±inf allowed).")
    try:
        f = float(value)
    except OverflowError:
        f = math.inf if value > 0 else -math.inf
        finite_input = True
    else:
        finite_input = math.isfinite(f) or isinstance(value, (int, np.integer))
    if math.isnan(f):
        raise ValidationError(f"{where}: {name} is NaN; scalars must be numbers (±inf allowed).")
    if finite_input and (not math.isfinite(f) or abs(f) > _FP32_MAX):
        raise ValidationError(f"{where}: {name}={_show(value)} is beyond the float32 range the PE ships scalars in "
                              f"(|x| <= {_FP32_MAX:.4g}); pass a smaller value, or ±inf on purpose.")


def _recipe_notes(rd: RecipeDescriptor, entry: str, first: int) -> tuple[int, int, str, str]:
    """How validation names the ops a recipe expanded into: ``(first flat index, steps, recipe, entry)``, put
    into words (``step 2 of recipe 'softmax_merge' in prologue[0]``) only when an error needs them."""
    return first, len(rd.engine_seq), rd.name, entry


def _made_by_recipe(notes: Sequence[tuple[int, int, str, str]]) -> range:
    """The flat indices of the ops a composite's recipe expanded into (a composite holds at most one recipe)."""
    if not notes:
        return _NO_OPS
    first, steps, _, _ = notes[0]
    return range(first, first + steps)


def _check_list(seq: Any, what: str) -> None:
    if seq.__class__ is list or seq.__class__ is tuple:
        return
    if isinstance(seq, (str, bytes, Mapping)) or not isinstance(seq, Sequence):
        raise ValidationError(f"{what} must be a list, got {type(seq).__name__} {seq!r}"
                              + ("; wrap the dict in a list: [{...}]." if isinstance(seq, Mapping) else "."))


# --- lowering helpers -------------------------------------------------------------------------
def _entry_kind(entry: Any, where: str) -> str:
    if not isinstance(entry, Mapping) or "op" not in entry:
        raise ValidationError(f"{where}: expected a dict with an 'op' key, e.g. {{'op': 'scale', 'factor': 0.5}}; "
                              f"got {entry!r}.")
    kind = entry["op"]
    if not isinstance(kind, str):
        raise ValidationError(f"{where}: 'op' must name an op or recipe (a string), got {kind!r}.")
    return kind


def _entry_op(entry: Any, where: str, default_scope: Scope) -> OpSpec:
    kind = _entry_kind(entry, where)
    if kind in RECIPE_DESCRIPTORS:
        raise ValidationError(f"{where}: recipe {kind!r} can only appear in prologue=[...].")
    if kind not in OPS or kind == "gemm":
        raise ValidationError(f"{where}: unknown op {kind!r}; MATH ops are {', '.join(k for k in OPS if k != 'gemm')} "
                              f"and recipes are {', '.join(RECIPE_DESCRIPTORS)}.")
    info = OPS[kind]
    scope = _scope(entry.get("scope", default_scope), where)
    operands: dict[str, Handle] = {}
    extra: dict[str, Any] = {}
    out = None
    for key, val in entry.items():
        if key in ("op", "scope"):
            continue
        if key == "out":
            out = val
        elif key in info.shipped:
            extra[key] = val
        else:
            operands[key] = val
    return OpSpec.built(kind, scope, operands, extra, out)


def _gemm_spec(a, b, out, trans_b, c) -> OpSpec:
    if c is not None:
        raise ValidationError("tl.composite(op='gemm') takes a, b and out; c= is for op='math'.")
    if not isinstance(trans_b, (bool, np.bool_)):
        raise ValidationError(f"tl.composite(op='gemm'): trans_b must be True or False, got {trans_b!r}.")
    for n, h in (("a", a), ("b", b), ("out", out)):
        if not _is_handle(h):
            raise ValidationError(f"tl.composite(op='gemm'): {n}= must be a tensor handle, got {h!r}.")
    if a.ndim != 2 or b.ndim != 2:
        raise ValidationError(f"GEMM operands must be 2-D: a={a!r}, b={b!r}.")
    M, K = a.shape
    N = b.shape[0] if trans_b else b.shape[1]
    return OpSpec.built("gemm", Scope.KERNEL, {"a": a, "b": b}, {"m": M, "k": K, "n": N, "trans_b": bool(trans_b)},
                        out)


def _math_head(math_op, a, b, c, out, value, factor) -> OpSpec:
    if not isinstance(math_op, str) or math_op not in OPS or math_op == "gemm":
        raise ValidationError(f"tl.composite(op='math'): math_op={math_op!r} is unknown; use one of "
                              f"{', '.join(k for k in OPS if k != 'gemm')}.")
    info = OPS[math_op]
    given = [(n, h) for n, h in (("a", a), ("b", b), ("c", c)) if h is not None]
    if len(given) != len(info.operands):
        raise ValidationError(f"math op {math_op!r} takes {len(info.operands)} operand(s) "
                              f"({', '.join(info.operands) or 'none'}) passed as a=, b=, c=; got "
                              f"{', '.join(n for n, _ in given) or 'none'}.")
    operands = {port: h for port, (_, h) in zip(info.operands, given)}
    extra = {key: val for key, val in (("value", value), ("factor", factor)) if val is not None}
    return OpSpec.built(math_op, Scope.KERNEL, operands, extra, out)


# --- validation (shared by both forms) ----------------------------------------------------------
def validate_ops(ops: tuple[OpSpec, ...], where: str | int = "composite") -> None:
    """Check a flat op list against DESIGN.md §3 invariants and §2's scalar rules.

    Raises:
        ValidationError: naming the op (position and kind), the operand and the fix.
    """
    _validate_ops(ops, f"command #{where}" if isinstance(where, int) else where)


def _validate_ops(ops: tuple[OpSpec, ...], where: str, notes: Sequence[tuple[int, int, str, str]] = (),
                  made: range = _NO_OPS) -> None:
    """:func:`validate_ops`; ``notes`` says where ops came from (recipe steps, :func:`_recipe_notes`), for the
    messages. The ops at ``made`` are a recipe's expansion (:func:`_made_by_recipe`), built from a descriptor
    checked when it was registered, on operands the expansion checked (TCM handles of this run) and on scratch
    it allocated in TCM: their operand names, handle types and spaces hold by construction and are not checked
    again; their scalars, scope, outputs and shapes are."""
    if not ops:
        raise ValidationError(f"{where}: a composite needs at least one op.")
    gemms = [i for i, o in enumerate(ops) if o.kind == "gemm"]
    if len(gemms) > 1:
        raise ValidationError(f"{where}: {len(gemms)} GEMM ops (at positions {gemms}); a composite holds at most "
                              f"one GEMM (ADR-0065 D6.1). Split it into one composite per GEMM.")
    head = gemms[0] if gemms else 0
    target: Handle | None = None
    for i, o in enumerate(ops):
        w = _Where((where, i, o.kind, notes))
        info = OPS.get(o.kind)
        if info is None:
            extra = (f"; recipes ({', '.join(RECIPE_DESCRIPTORS)}) are expanded by tl.composite"
                     if o.kind in RECIPE_DESCRIPTORS else "")
            raise ValidationError(f"{w}: unknown op kind {o.kind!r}; known kinds are {', '.join(OPS)}{extra}.")
        operands = o.operands
        trusted = i in made
        if not trusted and operands.keys() != info.operand_set:
            missing = [n for n in info.operands if n not in operands]
            unknown = [n for n in operands if n not in info.operands]
            raise ValidationError(f"{w}: operands {list(operands)} do not match; {o.kind} takes "
                                  f"{', '.join(info.operands) or 'no operands'}"
                                  + (f" (missing {', '.join(missing)})" if missing else "")
                                  + (f" (unknown {', '.join(map(str, unknown))})" if unknown else "") + ".")
        extra = o.extra
        if extra.keys() != info.shipped_set:
            raise ValidationError(f"{w}: scalars {list(extra)} do not match; {o.kind} takes "
                                  f"{', '.join(info.shipped) or 'none'}.")
        for n in info.scalars:
            check_scalar(w, n, extra[n])
        out = o.out
        for n, h in () if trusted else operands.items():
            if h.__class__ is not Handle and not isinstance(h, Handle):
                raise ValidationError(f"{w}: operand {n!r} must be a tensor handle, got {h!r}.")
            if i != head and h.space is not Space.TCM:
                raise ValidationError(f"{w}: {'prologue' if i < head else 'epilogue'} operand {n}={h.name} is in "
                                      f"HBM; only the head op may stream from HBM (ADR-0065 D6.7). tl.load it into "
                                      f"TCM first.")
        if info.accumulator:
            if out is not None:
                raise ValidationError(f"{w}: {o.kind} updates the accumulator in place and takes no out=.")
        elif not isinstance(out, Handle):
            raise ValidationError(f"{w}: out= must be a tensor handle, got {out!r}.")
        elif out.space is not Space.TCM and (i != head or not gemms):
            if i != head:
                raise ValidationError(f"{w}: {'prologue' if i < head else 'epilogue'} operand out={out.name} is in "
                                      f"HBM; only the head op may stream from HBM (ADR-0065 D6.7). tl.load it into "
                                      f"TCM first.")
            raise ValidationError(f"{w}: out={out.name} is in HBM; MATH ops write TCM. Write to a tl.alloc "
                                  f"handle and tl.store it.")
        if i < head and o.scope is not Scope.KERNEL:
            raise ValidationError(f"{w}: ops before the GEMM run once (scope 'kernel'), got {o.scope.value!r}.")
        if o.kind == "gemm":
            _check_gemm(o, w)
        elif gemms and i > head and o.scope is not Scope.KERNEL:
            if not info.accumulator:
                raise ValidationError(f"{w}: scope {o.scope.value!r} runs on the accumulator tile, which only "
                                      f"scale and add can do; use scope 'kernel' for a post-loop op.")
            other = operands.get("other")
            if other is not None and other.shape != ops[head].out.shape:
                raise ValidationError(f"{w}: other={other.name} has shape {other.shape}, the GEMM output "
                                      f"{ops[head].out.name} has {ops[head].out.shape}; they must match.")
        else:
            if gemms and i > head and info.accumulator and target.space is not Space.TCM:
                raise ValidationError(f"{w}: post-loop {o.kind} updates {target.name} in place, but {target.name} "
                                      f"is in HBM; MATH ops work on TCM. Give the GEMM a TCM out (tl.alloc) and "
                                      f"tl.store it, or use scope 'output_tile' to {o.kind} the accumulator.")
            _check_math(o, w, target, info)
        if out is not None:
            target = out


class _Where(tuple):
    """Where an op sits in a composite, ``(where, i, kind, notes)``, in words only when an error needs them
    (``f"{w}: ..."``). A tuple: one is made for every op validated, and making a tuple runs no Python code."""

    __slots__ = ()

    @property
    def note(self) -> str | None:
        """Which recipe step the op is, if a recipe made it."""
        i = self[1]
        for first, steps, recipe, entry in self[3]:
            if first <= i < first + steps:
                return f"step {i - first + 1} of recipe {recipe!r} in {entry}"
        return None

    def __str__(self) -> str:
        where, i, kind, _ = self
        note = self.note
        return f"{where} op {i} ({kind}{', ' + note if note else ''})"

    def __format__(self, spec: str) -> str:
        return format(str(self), spec)

    def __repr__(self) -> str:
        return f"_Where({str(self)!r})"


def _check_gemm(o: OpSpec, w: str) -> None:
    a, b, out = o.operands["a"], o.operands["b"], o.out
    M, K, N, tb = o.extra["m"], o.extra["k"], o.extra["n"], o.extra["trans_b"]
    if not all(_is_int(x) for x in (M, K, N)) or not isinstance(tb, (bool, np.bool_)):
        raise ValidationError(f"{w}: m, k, n must be ints and trans_b a bool; got m={M!r}, k={K!r}, n={N!r}, "
                              f"trans_b={tb!r}.")
    if a.ndim != 2 or b.ndim != 2 or out.ndim != 2:
        raise ValidationError(f"{w}: a, b and out must be 2-D (a {a.shape}, b {b.shape}, out {out.shape}).")
    want_b = (N, K) if tb else (K, N)
    if a.shape != (M, K) or b.shape != want_b or out.shape != (M, N):
        raise ValidationError(f"{w}: shape mismatch: a={a.name} {a.shape} must be (m, k)=({M}, {K}), "
                              f"b={b.name} {b.shape} must be {want_b}{' (trans_b)' if tb else ''}, "
                              f"out={out.name} {out.shape} must be ({M}, {N}).")


def _check_math(o: OpSpec, w: str, target: Handle | None, info) -> None:
    if info.accumulator:
        if target is None:
            raise ValidationError(f"{w}: {o.kind} updates the preceding op's output, but no earlier op has one.")
        other = o.operands.get("other")
        if other is not None and other.shape != target.shape:
            raise ValidationError(f"{w}: other={other.name} {other.shape} must match {target.name} {target.shape}.")
        return
    out = o.out
    if o.kind == "fill":
        v = float(o.extra["value"])
        limit = DTYPE_MAX[out.dtype]
        if math.isfinite(v) and abs(v) > limit:
            raise ValidationError(f"{w}: value={o.extra['value']!r} overflows out={out.name}'s dtype "
                                  f"{out.dtype} (|x| <= {limit:.6g}); it would be stored as inf.")
    if info.reduction:
        a = o.operands["a"]
        want = (a.shape[0], 1)
        if a.ndim != 2 or out.shape != want:
            raise ValidationError(f"{w}: {o.kind} reduces each row of a 2-D a={a.name} {a.shape} into out of "
                                  f"shape {want}; out={out.name} is {out.shape}.")
        return
    if o.kind in ("mul_bcast", "div_bcast"):
        a, b = o.operands["a"], o.operands["b"]
        if b.shape not in ((a.shape[0], 1), a.shape):
            raise ValidationError(f"{w}: b={b.name} {b.shape} must be a per-row column ({a.shape[0]}, 1).")
    shape = out.shape
    col = (shape[0], 1) if len(shape) == 2 else None
    for h in o.operands.values():
        if h.shape != shape and h.shape != col:
            break
    else:  # the common cases: nothing to broadcast, or a per-row column beside full rows
        return
    if _broadcast([h.shape for h in o.operands.values()] + [shape]) != shape:
        desc = ", ".join(f"{n}={h.name} {h.shape}" for n, h in o.operands.items())
        raise ValidationError(f"{w}: operand shapes ({desc}) do not broadcast to out={out.name} {out.shape}.")


def _broadcast(shapes: list[tuple[int, ...]]) -> tuple[int, ...] | None:
    """numpy's broadcast of ``shapes`` (None when they do not broadcast); small and allocation-free."""
    first = shapes[0]
    if all(s == first for s in shapes):
        return first
    nd = max(len(s) for s in shapes)
    dims = []
    for k in range(1, nd + 1):
        d = 1
        for s in shapes:
            if len(s) >= k and s[-k] != 1:
                if d != 1 and d != s[-k]:
                    return None
                d = s[-k]
        dims.append(d)
    return tuple(reversed(dims))


class At(tuple):
    """Where a composite call is, ``(command id, in a body)``, in words (``command #9 (in a tl.range body)``)
    written only when an error needs them."""

    __slots__ = ()

    def __new__(cls, ncmd: int, body: bool) -> "At":
        return tuple.__new__(cls, (ncmd, body))

    def __str__(self) -> str:
        ncmd, body = self
        return f"command #{ncmd}" + (" (in a tl.range body)" if body else "")

    def __format__(self, spec: str) -> str:
        return format(str(self), spec)

    def __repr__(self) -> str:
        return f"At({str(self)!r})"
