"""Recipes: named ops that TLContext expands into flat MATH OpSpecs (ADR-0065 D5).

A recipe lives on the compiler side only. The PE scheduler never imports this
module and has no recipe branches; it sees the expanded op list.

A :class:`RecipeDescriptor` is the whole recipe (DESIGN.md §3):

* ``operands``: name -> role, ``"R"`` (read) or ``"RW"`` (read and written in
  place; they become the command's ``rw_handles``). Every operand is TCM.
* ``params``: scalar parameters with their defaults (``None``: required). A
  recipe entry passes them by name (``{"op": "rmsnorm", ..., "eps": 1e-5}``);
  they are real numbers, validated like every scalar.
* ``scratch``: internal buffers, each a :class:`ScratchSpec` whose shape and
  dtype derive from the operands by a declared rule.
* ``primary_out``: the scratch buffer a head GEMM consumes (auto-bound to its
  ``a``) and the returned ``Completion.primary_out`` names, or ``None``.
* ``engine_seq``: the steps, each ``kind(*srcs) -> dst`` with the op's scalars
  bound to params or constants.

To add a recipe, add a descriptor to ``RECIPE_DESCRIPTORS`` (and a MATH op to
``kbwork/pe/ops.py`` if it needs a new one). Nothing else changes: TLContext
expands whatever is registered, the scheduler plans the flat ops, and the
plan cache keys on flat-op signatures only.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import re
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Literal, Mapping

from ..errors import ValidationError

_DIM = re.compile(r"^([A-Za-z_]\w*)\[(\d+)\]$")
#: The dtypes a recipe's scratch may name: what the MATH engine computes in. fp8 is a storage dtype of K and V
#: (DESIGN.md §17), never written by a recipe: without a scale factor a computed value may not fit it.
SCRATCH_DTYPES = ("bf16", "fp16", "fp32")


@dataclass(frozen=True)
class ScratchSpec:
    """One internal buffer of a recipe.

    ``shape`` is an operand name (the buffer takes that operand's shape) or a
    tuple of dimensions, each an int or ``"x[i]"`` (dimension ``i`` of operand
    ``x``). ``dtype`` is a dtype name (``"fp32"``) or an operand name (that
    operand's dtype).
    """

    name: str
    shape: str | tuple[int | str, ...]
    dtype: str

    def resolve(self, operands: Mapping[str, Any], dtypes: frozenset[str]) -> tuple[tuple[int, ...], str]:
        """The ``(shape, dtype)`` this buffer takes for the given operand handles."""
        if isinstance(self.shape, str):
            shape = tuple(operands[self.shape].shape)
        else:
            dims = []
            for d in self._dims:
                if d.__class__ is int:
                    dims.append(d)
                    continue
                name, i = d
                src = operands[name].shape
                if i >= len(src):
                    raise ValidationError(f"recipe scratch {self.name!r} takes dimension {i} of operand {name!r}, "
                                          f"which has shape {src}.")
                dims.append(src[i])
            shape = tuple(dims)
        dtype = self.dtype if self.dtype in dtypes else operands[self.dtype].dtype
        return shape, dtype

    @cached_property
    def _dims(self) -> tuple:
        """The shape rule's dimensions read once: an int, or ``(operand, index)`` for ``"x[i]"`` (a recipe is
        expanded for every composite that names it)."""
        out = []
        for d in self.shape:
            if isinstance(d, int):
                out.append(d)
            else:
                name, i = _DIM.match(d).groups()
                out.append((name, int(i)))
        return tuple(out)

    def refers_to(self) -> set[str]:
        """The operand names the rule reads."""
        names = {self.shape} if isinstance(self.shape, str) else {
            _DIM.match(d).group(1) for d in self.shape if isinstance(d, str)}
        return names


def _check_scratch_rule(where: str, s: ScratchSpec, operands: Mapping[str, str], dtypes: Mapping[str, Any]) -> None:
    """Refuse a scratch rule an expansion could not apply: a shape that is neither a name nor a tuple of
    positive ints and ``"x[i]"`` dimensions, a dtype that is neither a dtype nor an operand's name. (That the
    names are operands' is :meth:`ScratchSpec.refers_to`'s check, run after this one.)"""
    if not isinstance(s.name, str) or not s.name:
        raise ValidationError(f"{where}: scratch name {s.name!r} must be a non-empty string.")
    what = f"{where}: scratch {s.name!r}"
    if not isinstance(s.shape, str):  # (a name is an operand's: refers_to's check)
        if not isinstance(s.shape, tuple) or not s.shape:
            raise ValidationError(f"{what}: shape {s.shape!r} must be an operand's name or a non-empty tuple of "
                                  f"dimensions, each a positive int or 'x[i]' (dimension i of operand x).")
        for d in s.shape:
            ok = (_DIM.match(d) is not None if isinstance(d, str)
                  else isinstance(d, int) and not isinstance(d, bool) and d > 0)
            if not ok:
                raise ValidationError(f"{what}: dimension {d!r} of shape {s.shape!r} is neither a positive int "
                                      f"nor 'x[i]' (dimension i of operand x), e.g. ('x[0]', 1).")
    if not isinstance(s.dtype, str) or (s.dtype not in dtypes and s.dtype not in operands):
        raise ValidationError(f"{what}: dtype {s.dtype!r} is neither a dtype ({', '.join(dtypes)}) nor an "
                              f"operand whose dtype it takes ({', '.join(operands)}).")


@dataclass(frozen=True)
class PrimaryOutSpec:
    """The recipe's implicit output: one of its scratch buffers, auto-bound to the head GEMM's ``binds`` port."""

    name: str = "P"
    binds: str = "a"


@dataclass(frozen=True)
class EngineOp:
    """One step of a recipe: ``kind(*srcs) -> dst`` on ``engine``.

    ``srcs`` and ``dst`` name recipe operands or scratch; ``srcs`` map in order
    onto the op's operand ports (``a``, ``b``, ``c``). ``scalars`` binds each
    scalar the op ships to a recipe param (by name) or a constant number.
    """

    engine: Literal["MATH"]
    kind: str
    srcs: tuple[str, ...]
    dst: str
    scalars: Mapping[str, str | float] = field(default_factory=dict)

    def __repr__(self) -> str:
        sc = ", ".join(f"{k}={v}" for k, v in self.scalars.items())
        return f"{self.kind}({', '.join(self.srcs + ((sc,) if sc else ()))}) -> {self.dst}"


@dataclass(frozen=True)
class RecipeDescriptor:
    """What TLContext needs to validate and expand a recipe (see the module docstring)."""

    name: str
    operands: Mapping[str, Literal["R", "RW"]]
    scratch: tuple[ScratchSpec, ...]
    engine_seq: tuple[EngineOp, ...]
    primary_out: PrimaryOutSpec | None = None
    params: Mapping[str, float | None] = field(default_factory=dict)
    tile_alignment: Literal["single_shot"] = "single_shot"
    doc: str = ""

    def __post_init__(self) -> None:
        # A descriptor that names something it does not declare fails here, at import, not mid-kernel.
        where = f"recipe descriptor {self.name!r}"
        for n, role in self.operands.items():
            if role not in ("R", "RW"):
                raise ValidationError(f"{where}: operand {n!r} has role {role!r}; use 'R' or 'RW'.")
        scratch = [s.name for s in self.scratch]
        if len(set(scratch)) != len(scratch) or set(scratch) & set(self.operands) or set(scratch) & set(self.params):
            raise ValidationError(f"{where}: scratch, operand and param names must be distinct.")
        for s in self.scratch:
            _check_scratch_rule(where, s, self.operands, SCRATCH_DTYPES)
            if not s.refers_to() <= set(self.operands):
                raise ValidationError(f"{where}: scratch {s.name!r} derives from {sorted(s.refers_to())}, "
                                      f"which are not all operands ({', '.join(self.operands)}).")
        known = set(self.operands) | set(scratch)
        for step in self.engine_seq:
            missing = [x for x in step.srcs + (step.dst,) if x not in known]
            if missing:
                raise ValidationError(f"{where}: step {step!r} names {missing}, which are neither operands nor "
                                      f"scratch.")
            if step.dst in self.operands and self.operands[step.dst] != "RW":
                raise ValidationError(f"{where}: step {step!r} writes operand {step.dst!r}, which is not RW.")
            for k, v in step.scalars.items():
                if isinstance(v, str) and v not in self.params:
                    raise ValidationError(f"{where}: step {step!r} binds scalar {k!r} to {v!r}, which is not a "
                                          f"param ({', '.join(self.params) or 'none'}).")
        from ..pe.ops import OPS
        for step in self.engine_seq:
            if step.engine != "MATH":
                raise ValidationError(f"{where}: step {step!r} runs on engine {step.engine!r}; recipe steps are "
                                      f"MATH ops (engine 'MATH').")
            for k, v in step.scalars.items():
                if not isinstance(v, str) and (isinstance(v, bool) or not isinstance(v, numbers.Real)
                                               or math.isnan(v)):
                    raise ValidationError(f"{where}: step {step!r} binds scalar {k!r} to {v!r}; bind it to a "
                                          f"param's name or a number.")
            info = OPS.get(step.kind)
            if info is None or info.kind == "gemm" or len(step.srcs) != len(info.operands):
                raise ValidationError(f"{where}: step {step!r} is not a MATH op of the op table with "
                                      f"{len(step.srcs)} operand(s); fix the recipe descriptor.")
        if self.primary_out is not None and self.primary_out.name not in scratch:
            raise ValidationError(f"{where}: primary output {self.primary_out.name!r} is not one of its scratch "
                                  f"buffers.")
        for p, default in self.params.items():
            if default is not None and (isinstance(default, bool) or not isinstance(default, (int, float))
                                        or math.isnan(default)):
                raise ValidationError(f"{where}: param {p!r} has default {default!r}; use a number or None.")

    @cached_property
    def steps(self) -> tuple[tuple[str, tuple[str, ...], tuple[str, ...], str, dict], ...]:
        """Each step as ``(kind, operand ports, srcs, dst, scalars)``: what an expansion binds (checked at
        construction, so expanding only looks up names)."""
        from ..pe.ops import OPS

        return tuple((st.kind, OPS[st.kind].operands, st.srcs, st.dst, dict(st.scalars)) for st in self.engine_seq)

    @cached_property
    def rw_operands(self) -> tuple[str, ...]:
        """The RW operands in declaration order (they become the command's ``rw_handles``); read at every
        expansion, made once."""
        return tuple(n for n, role in self.operands.items() if role == "RW")

    @cached_property
    def alias_pairs(self) -> tuple[tuple[str, str], ...]:
        """``(rw, other)``: the operand pairs an expansion checks for aliasing, each pair once (an RW operand
        against every other operand, in declaration order, skipping the RW operands before it, which were
        already paired with it); made once."""
        rw = self.rw_operands
        return tuple((n, other) for k, n in enumerate(rw) for other in self.operands
                     if other != n and other not in rw[:k])

    def scratch_bytes(self, operands: Mapping[str, Any]) -> int:
        """Bytes of internal scratch (primary output included) for the given operand handles."""
        from ..memory import DTYPES

        total = 0
        for s in self.scratch:
            shape, dtype = s.resolve(operands, frozenset(DTYPES))
            total += math.prod(shape) * DTYPES[dtype].itemsize
        return total

    def __repr__(self) -> str:
        ops = ", ".join(f"{n}:{r}" for n, r in self.operands.items())
        params = ", ".join(f"{p}={d}" for p, d in self.params.items())
        return f"RecipeDescriptor({self.name}({ops}{'; ' + params if params else ''}), {len(self.engine_seq)} steps)"


RECIPE_DESCRIPTORS: dict[str, RecipeDescriptor] = {}

RECIPE_DESCRIPTORS["softmax_merge"] = RecipeDescriptor(
    name="softmax_merge",
    operands={"s": "R", "m": "RW", "l": "RW", "O": "RW"},
    # allocated in this order (the goldens name them softmax_merge0.m_loc, ..., softmax_merge0.P)
    scratch=(ScratchSpec("m_loc", "m", "m"), ScratchSpec("m_new", "m", "m"), ScratchSpec("corr", "m", "m"),
             ScratchSpec("l_loc", "l", "l"), ScratchSpec("P", "s", "s")),
    primary_out=PrimaryOutSpec(name="P", binds="a"),
    engine_seq=(
        EngineOp("MATH", "rmax", ("s",), "m_loc"),
        EngineOp("MATH", "max_elem", ("m", "m_loc"), "m_new"),
        EngineOp("MATH", "exp_diff", ("m", "m_new"), "corr"),
        EngineOp("MATH", "exp_diff", ("s", "m_new"), "P"),
        EngineOp("MATH", "rsum", ("P",), "l_loc"),
        EngineOp("MATH", "fma", ("l", "corr", "l_loc"), "l"),
        EngineOp("MATH", "mul_bcast", ("O", "corr"), "O"),
        EngineOp("MATH", "copy", ("m_new",), "m"),
    ),
    doc="Online-softmax merge of a score tile s into the running (m, l, O); emits P = exp(s - m_new).",
)

# The same merge writing P in bf16 (DESIGN.md §17, topology key p_dtype = "bf16"): P is rounded when exp_diff
# writes it, so rsum and the head GEMM read the rounded values, as FlashAttention's P·V does. Only the dtype
# of P differs; a decode kernel picks one of the two by :func:`softmax_merge_recipe`.
RECIPE_DESCRIPTORS["softmax_merge_p_bf16"] = dataclasses.replace(
    RECIPE_DESCRIPTORS["softmax_merge"], name="softmax_merge_p_bf16",
    scratch=RECIPE_DESCRIPTORS["softmax_merge"].scratch[:-1] + (ScratchSpec("P", "s", "bf16"),),
    doc="softmax_merge with P written in bf16 (rounded as written); S, m, l and O as the operands are.")


def softmax_merge_recipe(p_dtype: str) -> str:
    """The name of the softmax-merge recipe that writes P in ``p_dtype`` (``"fp32"``: P in the scores' dtype,
    ``"bf16"``: rounded to bf16).

    Raises:
        ValidationError: another dtype.
    """
    names = {"fp32": "softmax_merge", "bf16": "softmax_merge_p_bf16"}
    if p_dtype not in names:
        raise ValidationError(f"P dtype {p_dtype!r} has no softmax-merge recipe; use one of {', '.join(names)}.")
    return names[p_dtype]


# The second stateful recipe (DESIGN.md §16): merge a partial softmax state (m_b, l_b, O_b) of another chunk
# of the keys into the running (m, l, O), the log-sum-exp merge softmax_merge does for a score tile, done for
# states. O_b is unnormalised (divided by nothing yet), as gqa_decode_partial stores it.
RECIPE_DESCRIPTORS["state_merge"] = RecipeDescriptor(
    name="state_merge",
    operands={"m_b": "R", "l_b": "R", "O_b": "R", "m": "RW", "l": "RW", "O": "RW"},
    scratch=(ScratchSpec("m_new", "m", "m"), ScratchSpec("ca", "m", "m"), ScratchSpec("cb", "m", "m"),
             ScratchSpec("lb", "l", "l"), ScratchSpec("Ob", "O", "O")),
    engine_seq=(
        EngineOp("MATH", "max_elem", ("m", "m_b"), "m_new"),
        EngineOp("MATH", "exp_diff", ("m", "m_new"), "ca"),
        EngineOp("MATH", "exp_diff", ("m_b", "m_new"), "cb"),
        EngineOp("MATH", "mul_bcast", ("l_b", "cb"), "lb"),
        EngineOp("MATH", "fma", ("l", "ca", "lb"), "l"),
        EngineOp("MATH", "mul_bcast", ("O_b", "cb"), "Ob"),
        EngineOp("MATH", "fma", ("O", "ca", "Ob"), "O"),
        EngineOp("MATH", "copy", ("m_new",), "m"),
    ),
    doc="Merge of a partial softmax state (m_b, l_b, O_b) into the running (m, l, O): m_new = max(m, m_b), "
        "l = l·exp(m - m_new) + l_b·exp(m_b - m_new), O likewise (fma broadcasting the (G, 1) factor per row).",
)


RECIPE_DESCRIPTORS["rmsnorm"] = RecipeDescriptor(
    name="rmsnorm",
    operands={"x": "R", "g": "R"},
    params={"eps": 1e-6},
    scratch=(ScratchSpec("r", ("x[0]", 1), "fp32"), ScratchSpec("xn", "x", "fp32")),
    primary_out=PrimaryOutSpec(name="xn", binds="a"),
    engine_seq=(
        EngineOp("MATH", "rms_inv", ("x",), "r", scalars={"eps": "eps"}),
        EngineOp("MATH", "mul_bcast", ("x", "r"), "xn"),
        EngineOp("MATH", "mul", ("xn", "g"), "xn"),
    ),
    doc="RMS normalisation of the rows of x with per-column gain g: xn = x / sqrt(mean(x^2) + eps) * g "
        "(fp32 scratch), the head GEMM's a (rmsnorm + linear).",
)
