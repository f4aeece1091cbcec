"""Recipes: named ops that TLContext expands into flat MATH OpSpecs (ADR-0065 D5).

A recipe lives on the compiler side only. The PE scheduler never imports this
module and has no recipe branches; it sees the expanded op list.

To add a recipe, add a :class:`RecipeDescriptor` to ``RECIPE_DESCRIPTORS``:
declare its operands and their roles, its scratch (each shaped like one of
its operands), its primary output (if the head op should consume it) and its
engine sequence.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal, Mapping


@dataclass(frozen=True)
class PrimaryOutSpec:
    """The recipe's implicit output: shape and dtype derived from an operand."""

    from_shape: str
    from_dtype: str
    transform: Literal["identity"] = "identity"
    name: str = "P"
    binds: str = "a"  # the head GEMM operand it is auto-bound to


@dataclass(frozen=True)
class EngineOp:
    """One step of a recipe: ``kind(*srcs) -> dst`` on ``engine``.

    ``srcs`` and ``dst`` name recipe operands, scratch or the primary output;
    ``srcs`` map in order onto the op's operand ports (``a``, ``b``, ``c``).
    """

    engine: Literal["MATH"]
    kind: str
    srcs: tuple[str, ...]
    dst: str

    def __repr__(self) -> str:
        return f"{self.kind}({', '.join(self.srcs)}) -> {self.dst}"


@dataclass(frozen=True)
class RecipeDescriptor:
    """What TLContext needs to validate and expand a recipe."""

    name: str
    operands: Mapping[str, Literal["R", "RW"]]
    primary_out: PrimaryOutSpec | None
    tile_alignment: Literal["single_shot", "tile_aligned"]
    scratch_like: Mapping[str, str]          # scratch name -> operand whose shape/dtype it takes
    internal_scratch_bytes_fn: Callable[..., int]
    engine_seq: tuple[EngineOp, ...]
    doc: str = ""

    @property
    def rw_operands(self) -> tuple[str, ...]:
        """The RW operands in declaration order (they become the command's ``rw_handles``)."""
        return tuple(n for n, role in self.operands.items() if role == "RW")

    def __repr__(self) -> str:
        ops = ", ".join(f"{n}:{r}" for n, r in self.operands.items())
        return f"RecipeDescriptor({self.name}({ops}), {len(self.engine_seq)} steps)"


RECIPE_DESCRIPTORS: dict[str, RecipeDescriptor] = {}

RECIPE_DESCRIPTORS["softmax_merge"] = RecipeDescriptor(
    name="softmax_merge",
    operands={"s": "R", "m": "RW", "l": "RW", "O": "RW"},
    primary_out=PrimaryOutSpec(from_shape="s", from_dtype="s", transform="identity", name="P", binds="a"),
    tile_alignment="single_shot",
    scratch_like={"m_loc": "m", "m_new": "m", "corr": "m", "l_loc": "l"},
    # m_loc + m_new + corr + P + l_loc, for G query rows, TILE columns, element size bpe.
    internal_scratch_bytes_fn=lambda G, TILE, d, bpe: bpe * (G + G + G + G * TILE + G),
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
