"""Stage kinds, engines, phases and the columnar table of all stages of a program.

A stage is one occupancy of one engine. The table is columnar (parallel
lists indexed by ``seq``) because the timeline walks tens of thousands of
stages and plain lists of ints are what Python iterates fastest.
"""

from __future__ import annotations

import enum
from typing import NamedTuple, Sequence


class Engine(enum.IntEnum):
    """The PE's units; the op_log ``engine`` column holds their names."""

    PE_CPU = 0
    PE_SCHEDULER = 1
    PE_DMA = 2
    PE_GEMM = 3
    PE_MATH = 4


class StageKind(enum.IntEnum):
    DISPATCH = 0
    PLAN = 1
    DMA_READ = 2
    FETCH = 3
    GEMM = 4
    MATH = 5
    DMA_WRITE = 6


class Phase(enum.IntEnum):
    """Where in its command's life a stage runs (op_log ``phase``, lower-case)."""

    DISPATCH = 0
    PLAN = 1
    PROLOGUE = 2
    TILE = 3
    K_EPILOGUE = 4
    TILE_EPILOGUE = 5
    POST = 6
    SINGLE = 7

    @property
    def label(self) -> str:
        return self.name.lower()


ENGINE_OF_KIND = {
    StageKind.DISPATCH: Engine.PE_CPU,
    StageKind.PLAN: Engine.PE_SCHEDULER,
    StageKind.DMA_READ: Engine.PE_DMA,
    StageKind.FETCH: Engine.PE_GEMM,
    StageKind.GEMM: Engine.PE_GEMM,
    StageKind.MATH: Engine.PE_MATH,
    StageKind.DMA_WRITE: Engine.PE_DMA,
}
_ENGINE_INT = [int(ENGINE_OF_KIND[k]) for k in StageKind]


class EngineSpec(NamedTuple):
    """One row of the engine table: an engine and how many stages it runs at once (its units)."""

    name: str
    capacity: int


def engine_table(topo) -> tuple[EngineSpec, ...]:
    """The engine table of a topology, in :class:`Engine` order.

    PE_DMA has ``topo.dma_channels`` channels; every other engine one unit.
    The timeline walks this table and the SimPy reference builds its
    resources from it, so a capacity is data, not code.
    """
    return tuple(EngineSpec(e.name, topo.dma_channels if e is Engine.PE_DMA else 1) for e in Engine)


def unit_names(engines: Sequence[EngineSpec]) -> tuple[str, ...]:
    """The op_log ``engine`` names of every unit, in track order.

    An engine with one unit keeps its name (``PE_DMA``); one with n > 1
    units names them ``PE_DMA0`` .. ``PE_DMA{n-1}``.
    """
    return tuple(name if cap == 1 else f"{name}{i}" for name, cap in engines for i in range(cap))


_FIELDS = ("kind", "phase", "cmd", "op_kind", "tile", "k_tile", "tensor", "nbytes", "dur", "preds", "effects")


class StageTable:
    """Every stage of a program, in creation (``seq``) order.

    Stages are appended as row tuples (cheap while plans are generated) and
    read as columns — ``kind, engine, phase, cmd, op_kind, tile, k_tile,
    tensor, nbytes, dur, preds, effects`` — built once after the last append.
    ``preds`` are the seqs a stage depends on; ``effects[seq]`` is its
    data-mode effect or ``None`` (only filled when ``with_effects`` is true).

    :meth:`seal` builds the columns and lets the row tuples go (a long run
    holds hundreds of thousands; freed at once, the garbage collector never
    has to walk them). Appending to a sealed table unseals it first.
    """

    __slots__ = ("rows", "with_effects", "_cols", "_n")

    def __init__(self, with_effects: bool = False):
        self.rows: list[tuple] | None = []
        self.with_effects = with_effects
        self._cols: dict[str, Sequence] | None = None
        self._n = 0

    def __len__(self) -> int:
        rows = self.rows
        return self._n if rows is None else len(rows)

    def __repr__(self) -> str:
        return f"StageTable({len(self)} stages{', sealed' if self.rows is None else ''})"

    def add(self, kind: int, phase: int, cmd: int, op_kind: str, tile: int, k_tile: int, tensor: str,
            nbytes: int, dur: int, preds: tuple[int, ...], effect: object = None) -> int:
        """Append one stage and return its seq."""
        rows = self.rows
        if rows is None:
            rows = self._unseal()
        rows.append((kind, phase, cmd, op_kind, tile, k_tile, tensor, nbytes, dur, preds, effect))
        self._cols = None
        return len(rows) - 1

    def touched(self) -> None:
        """Say that ``rows`` was appended to directly (drops the cached columns)."""
        self._cols = None

    def seal(self) -> None:
        """Build the columns now and drop the row tuples (see the class docstring)."""
        self.column("kind")
        self._n = len(self.rows) if self.rows is not None else self._n
        self.rows = None

    def _unseal(self) -> list[tuple]:
        cols = self._cols
        self.rows = list(zip(*(cols[f] for f in _FIELDS))) if cols and self._n else []
        return self.rows

    def set_effect(self, seq: int, effect: object) -> None:
        """Replace a stage's data-mode effect."""
        rows = self.rows if self.rows is not None else self._unseal()
        rows[seq] = rows[seq][:-1] + (effect,)
        self._cols = None

    def column(self, name: str) -> Sequence:
        """One column (a tuple indexed by seq)."""
        if self._cols is None:
            rows = self.rows if self.rows is not None else self._unseal()
            cols = list(zip(*rows)) if rows else [()] * len(_FIELDS)
            self._cols = dict(zip(_FIELDS, cols))
            self._cols["engine"] = tuple(map(_ENGINE_INT.__getitem__, self._cols["kind"]))
        return self._cols[name]

    kind = property(lambda self: self.column("kind"))
    engine = property(lambda self: self.column("engine"))
    phase = property(lambda self: self.column("phase"))
    cmd = property(lambda self: self.column("cmd"))
    op_kind = property(lambda self: self.column("op_kind"))
    tile = property(lambda self: self.column("tile"))
    k_tile = property(lambda self: self.column("k_tile"))
    tensor = property(lambda self: self.column("tensor"))
    nbytes = property(lambda self: self.column("nbytes"))
    dur = property(lambda self: self.column("dur"))
    preds = property(lambda self: self.column("preds"))
    effects = property(lambda self: self.column("effects"))

    def describe(self, seq: int) -> str:
        """A one-line human description of a stage (for errors and debugging)."""
        kind, cmd, op_kind, tile, k_tile, tensor = (self.column(f)[seq] for f in
                                                    ("kind", "cmd", "op_kind", "tile", "k_tile", "tensor"))
        return f"seq {seq}: {StageKind(kind).name} cmd {cmd} {op_kind} tile {tile} k {k_tile} {tensor}"
