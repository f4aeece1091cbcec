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


#: The columns :meth:`StageTable.add` takes (``preds`` absolute seqs), in its argument order; ``chan`` is the
#: HBM channel a DMA stage's bytes move on (-1 for every other stage).
COLUMNS = ("kind", "engine", "phase", "cmd", "op_kind", "tile", "k_tile", "tensor", "nbytes", "dur", "preds",
           "effects", "chan")


class RawStageTable:
    """A plan's stages as plain columns with absolute ``preds`` (what the planner appends to when a plan is
    recorded as a template or checked; :class:`StageTable` is the program's)."""

    __slots__ = COLUMNS + ("with_effects",)

    def __init__(self, with_effects: bool = False):
        for name in COLUMNS:
            setattr(self, name, [])
        self.with_effects = with_effects

    def __len__(self) -> int:
        return len(self.kind)

    def __repr__(self) -> str:
        return f"RawStageTable({len(self)} stages)"

    def add(self, kind: int, engine: int, phase: int, cmd: int, op_kind: str, tile: int, k_tile: int, tensor: str,
            nbytes: int, dur: int, preds: tuple[int, ...], effect: object = None, chan: int = -1) -> int:
        """Append one stage and return its seq."""
        s = len(self.kind)
        for name, v in zip(COLUMNS, (kind, engine, phase, cmd, op_kind, tile, k_tile, tensor, nbytes, dur, preds,
                                     effect, chan)):
            getattr(self, name).append(v)
        return s

    def set_effect(self, seq: int, effect: object) -> None:
        self.effects[seq] = effect


class StageTable:
    """Every stage of a program, in creation (``seq``) order, as columns (plain lists indexed by seq).

    ``kind, engine, phase, cmd, op_kind, tile, k_tile, tensor, nbytes, dur,
    effects, chan``: a stage names the engine it runs on (the planner sets it;
    the timeline never derives it), its command, what the op_log shows, its
    duration (a DMA stage's alone on its channel), in data mode its effect
    (``None`` otherwise), and for a DMA stage the HBM channel it moves bytes
    on (-1 otherwise).

    Dependencies are kept the way a command's stages are made — a block at a
    time — so that stamping a template extends lists instead of building a
    tuple per stage: ``cbase[c]`` is the first seq of command ``c`` (its
    DISPATCH; ``c`` is the stage's ``cmd``), ``lpreds[s]`` the dependencies
    inside the command as offsets from its first seq, ``xpreds[s]`` those on earlier commands' stages
    (staging-ring edges, and DISPATCH/PLAN program order) as seqs, and
    ``lsucc[s]`` the stages of the same command that wait for ``s`` (offsets;
    edges into DISPATCH and PLAN, which the front end orders, are left out).
    ``npred[s]`` counts ``lpreds`` of a plan stage. :attr:`preds` reads
    every dependency as absolute seqs, local ones first.

    Stages are appended a command at a time: :meth:`begin` opens a command
    at the next seq, then the planner appends (:meth:`add`) or a template is
    stamped (extending the lists directly).
    """

    __slots__ = ("kind", "engine", "phase", "cmd", "op_kind", "tile", "k_tile", "_tensor", "nbytes", "dur",
                 "effects", "chan", "lpreds", "xpreds", "lsucc", "npred", "cbase", "pending_names", "with_effects",
                 "_base")

    def __init__(self, with_effects: bool = False):
        for name in self.__slots__[:-2]:
            setattr(self, name, [])
        self.with_effects = with_effects
        self._base = 0

    @property
    def tensor(self) -> list[str]:
        """The handle names the stages move (op_log ``tensor``). A stamped loop iteration leaves its names to
        be filled in here, on first read (the event loop never reads them): ``pending_names`` holds a
        function per such block that writes them."""
        if self.pending_names:
            fills, self.pending_names = self.pending_names, []
            for fill in fills:
                fill(self._tensor)
        return self._tensor

    def __len__(self) -> int:
        return len(self.kind)

    def __repr__(self) -> str:
        return f"StageTable({len(self)} stages{', with effects' if self.with_effects else ''})"

    def begin(self) -> int:
        """Open the next command's block at the next seq (its DISPATCH's); return that seq."""
        self._base = len(self.kind)
        self.cbase.append(self._base)
        return self._base

    def add(self, kind: int, engine: int, phase: int, cmd: int, op_kind: str, tile: int, k_tile: int, tensor: str,
            nbytes: int, dur: int, preds: tuple[int, ...], effect: object = None, chan: int = -1) -> int:
        """Append one stage of the open command (``preds`` as absolute seqs) and return its seq."""
        s = len(self.kind)
        b = self._base
        self.kind.append(kind)
        self.engine.append(engine)
        self.phase.append(phase)
        self.cmd.append(cmd)
        self.op_kind.append(op_kind)
        self.tile.append(tile)
        self.k_tile.append(k_tile)
        self._tensor.append(tensor)
        self.nbytes.append(nbytes)
        self.dur.append(dur)
        self.effects.append(effect)
        self.chan.append(chan)
        local = tuple(p - b for p in preds if p >= b)
        self.lpreds.append(local)
        self.xpreds.append(tuple(p for p in preds if p < b))
        self.lsucc.append([])
        self.npred.append(len(local))
        if kind > _PLAN_KIND:  # the front end orders DISPATCH and PLAN
            lsucc = self.lsucc
            for x in local:
                lsucc[b + x].append(s - b)
        return s

    @property
    def preds(self) -> "_Preds":
        """Every stage's dependencies as absolute seqs (local ones first): ``preds[s]`` is a tuple. A view made
        on access (kept on the table, it would hold the table in a reference cycle)."""
        return _Preds(self)

    def column(self, name: str) -> Sequence:
        """One column by name (``preds`` included)."""
        if name == "preds":
            return self.preds
        if name not in COLUMNS:
            raise KeyError(name)
        return getattr(self, name)

    def set_effect(self, seq: int, effect: object) -> None:
        """Replace a stage's data-mode effect."""
        self.effects[seq] = effect

    def describe(self, seq: int) -> str:
        """A one-line human description of a stage (for errors and debugging)."""
        return (f"seq {seq}: {StageKind(self.kind[seq]).name} cmd {self.cmd[seq]} {self.op_kind[seq]} tile "
                f"{self.tile[seq]} k {self.k_tile[seq]} {self.tensor[seq]}")


_PLAN_KIND = int(StageKind.PLAN)


class _Preds(Sequence):
    """``StageTable.preds``: each stage's dependencies as absolute seqs, made on access."""

    __slots__ = ("_t",)

    def __init__(self, table: StageTable):
        self._t = table

    def __len__(self) -> int:
        return len(self._t.kind)

    def __getitem__(self, s):
        t = self._t
        if isinstance(s, slice):
            return [self[i] for i in range(*s.indices(len(t.kind)))]
        b = t.cbase[t.cmd[s]]
        x = t.xpreds[s]
        return tuple([b + q for q in t.lpreds[s]]) + x if x else tuple([b + q for q in t.lpreds[s]])

    def __iter__(self):
        t = self._t
        cbase = t.cbase
        for c, lp, x in zip(t.cmd, t.lpreds, t.xpreds):
            b = cbase[c]
            yield tuple([b + q for q in lp]) + x
