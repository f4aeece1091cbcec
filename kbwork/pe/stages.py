"""Stage kinds, engines, phases and the columnar table of all stages of a program.

A stage is one occupancy of one engine. The table is columnar (parallel
lists indexed by ``seq``) because the timeline walks tens of thousands of
stages and plain lists of ints are what Python iterates fastest.
"""

from __future__ import annotations

import enum


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


class StageTable:
    """Every stage of a program, in creation (``seq``) order.

    Columns: ``kind, phase, cmd, op_kind, tile, k_tile, tensor, nbytes, dur``
    and ``preds`` (the seqs of the stages it depends on). ``effects[seq]`` is
    the data-mode effect tuple(s) of the stage, or ``None``; it is only filled
    when ``with_effects`` is true.
    """

    __slots__ = ("kind", "engine", "phase", "cmd", "op_kind", "tile", "k_tile", "tensor", "nbytes",
                 "dur", "preds", "effects", "with_effects")

    def __init__(self, with_effects: bool = False):
        self.kind: list[int] = []
        self.engine: list[int] = []
        self.phase: list[int] = []
        self.cmd: list[int] = []
        self.op_kind: list[str] = []
        self.tile: list[int] = []
        self.k_tile: list[int] = []
        self.tensor: list[str] = []
        self.nbytes: list[int] = []
        self.dur: list[int] = []
        self.preds: list[tuple[int, ...]] = []
        self.effects: list[object] = []
        self.with_effects = with_effects

    def __len__(self) -> int:
        return len(self.kind)

    def __repr__(self) -> str:
        return f"StageTable({len(self)} stages)"

    def add(self, kind: int, phase: int, cmd: int, op_kind: str, tile: int, k_tile: int, tensor: str,
            nbytes: int, dur: int, preds: tuple[int, ...], effect: object = None) -> int:
        """Append one stage and return its seq."""
        seq = len(self.kind)
        self.kind.append(kind)
        self.engine.append(_ENGINE_INT[kind])
        self.phase.append(phase)
        self.cmd.append(cmd)
        self.op_kind.append(op_kind)
        self.tile.append(tile)
        self.k_tile.append(k_tile)
        self.tensor.append(tensor)
        self.nbytes.append(nbytes)
        self.dur.append(dur)
        self.preds.append(preds)
        self.effects.append(effect)
        return seq

    def describe(self, seq: int) -> str:
        """A one-line human description of a stage (for errors and debugging)."""
        return (f"seq {seq}: {StageKind(self.kind[seq]).name} cmd {self.cmd[seq]} "
                f"{self.op_kind[seq]} tile {self.tile[seq]} k {self.k_tile[seq]} {self.tensor[seq]}")
