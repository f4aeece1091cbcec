"""Simulator and Run: place host data, run a kernel, read the op_log and the numbers."""

from __future__ import annotations

import contextlib
import gc
from pathlib import Path
from time import perf_counter
from typing import Any, Callable, Iterator

import numpy as np
import pandas as pd

from .config import Topology, load_topology
from .errors import SimulationError, ValidationError
from .memory import DTYPES, Handle, Memory, canonical_dtype
from .oplog import build_op_log, to_csv, to_perfetto
from .pe.engines import DataExecutor
from .pe.scheduler import Program, schedule
from .pe.tiling import StagingRing
from .pe.timeline import CAUSES, Bindings, Timeline, simulate
from .triton_emu.tl_context import TLContext

MODES = ("data", "timing")


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector.

    A run allocates hundreds of thousands of small acyclic objects (stages,
    tuples, events); reference counting frees them, and the collector's
    repeated scans would otherwise cost a third of a timing-mode run.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


class Simulator:
    """One simulated PE with its HBM.

    ``mode="data"`` computes real numbers (numpy-backed memories);
    ``mode="timing"`` only schedules and is much faster. HBM persists across
    runs of the same simulator; every run starts with a fresh TCM.
    """

    def __init__(self, topology: Topology | str | None = None, mode: str = "data", **overrides: Any):
        if mode not in MODES:
            raise ValidationError(f"Simulator mode {mode!r} is unknown; use 'data' or 'timing'.")
        self.topo = load_topology(topology, **overrides)
        self.mode = mode
        self.memory = Memory(self.topo.tcm_bytes, backed=mode == "data")
        self._hbm: dict[str, Handle] = {}

    def __repr__(self) -> str:
        return f"Simulator({self.topo.name}, mode={self.mode!r}, {len(self._hbm)} HBM tensors)"

    def hbm(self, name: str, array: np.ndarray | None = None, *, shape: tuple[int, ...] | None = None,
            dtype: Any = None) -> Handle:
        """Place a host tensor in HBM and return its handle.

        Pass ``array`` (rounded to ``dtype``, default: the array's own dtype if
        supported, else fp32), or ``shape``/``dtype`` for an uninitialised
        (zeroed) output. In timing mode no bytes are kept.

        Raises:
            ValidationError: a duplicate name, or neither array nor shape.
        """
        if name in self._hbm:
            raise ValidationError(f"HBM tensor {name!r} already exists; pick another name.")
        if array is None:
            if shape is None:
                raise ValidationError(f"sim.hbm({name!r}): pass an array, or shape= (and dtype=) for an output.")
            dtype = canonical_dtype(dtype or "fp32")
        else:
            array = np.asarray(array)
            if dtype is None:
                try:
                    dtype = canonical_dtype(array.dtype)
                except ValidationError:
                    dtype = "fp32"
            dtype = canonical_dtype(dtype)
            shape = array.shape
        h = self.memory.hbm.alloc(name, tuple(shape), dtype)
        if array is not None and self.memory.backed:
            if not np.all(np.isfinite(array.astype(np.float64))):
                raise ValidationError(f"sim.hbm({name!r}): the array holds NaN or inf; pass finite values.")
            self.memory.hbm.view(h)[...] = array.astype(np.float32).astype(DTYPES[dtype])
        self._hbm[name] = h
        return h

    def run(self, kernel: Callable[..., Any], *args: Any, **kwargs: Any) -> "Run":
        """Run ``kernel(tl, *args, **kwargs)`` and simulate the commands it emits.

        Returns:
            A :class:`Run` with the op_log, the cycle count and (data mode) the numbers.

        Raises:
            ValidationError, TcmOverflowError: from the kernel's ``tl`` calls.
            SimulationError: the program deadlocks.
        """
        tcm = self.memory.new_tcm()
        ring_bytes = StagingRing.bytes_for(self.topo)
        staging = tcm.alloc("<staging buffers>", (ring_bytes // 4,), "fp32")
        with gc_paused():
            return self._run(kernel, staging, tcm, args, kwargs)

    def _run(self, kernel, staging, tcm, args, kwargs) -> "Run":
        t0 = perf_counter()
        tl = TLContext(self.topo, self.memory)
        kernel(tl, *args, **kwargs)
        if not tl.commands:
            raise SimulationError(f"kernel {getattr(kernel, '__name__', kernel)!r} emitted no commands.")
        data = self.mode == "data"
        t1 = perf_counter()
        prog = schedule(tl.commands, self.topo, waits=tl.waits, with_effects=data, staging_base=staging.addr)
        t2 = perf_counter()
        if data:
            executor = DataExecutor(self.memory)
            with executor.quiet():
                timeline = simulate(prog, executor.apply)
        else:
            timeline = simulate(prog)
        t3 = perf_counter()
        names = dict(self._hbm)
        names.update(tl.names)
        run = Run(self, prog, timeline, names, tcm)
        run.timings = {"emit": t1 - t0, "schedule": t2 - t1, "simulate": t3 - t2}
        return run


class Run:
    """The result of one kernel run.

    Attributes:
        op_log: one row per executed stage (built on first access).
        cycles: end-to-end cycles (the last stage's end).
        program: the scheduled :class:`Program` (commands and stage table).
        timeline: what the event loop recorded (``pe.timeline.Timeline``: start,
            end and ready of every stage, its unit, the hazard holds).
    """

    def __init__(self, sim: Simulator, prog: Program, timeline: Timeline, names: dict[str, Handle], tcm: Any):
        self.sim = sim
        self.topology = sim.topo
        self.mode = sim.mode
        self.program = prog
        # what the timeline recorded, as arrays (a million-entry list would be walked by the garbage
        # collector once the run re-enables it)
        self.timeline = timeline
        self._start = timeline.start
        self._end = timeline.end
        self._names = names
        self._tcm = tcm
        self._op_log: pd.DataFrame | None = None
        self._bindings: Bindings | None = None
        self.cycles = int(self._end.max()) if len(self._end) else 0
        #: wall-clock seconds of each phase (emit, schedule, simulate, op_log), for benchmarks
        self.timings: dict[str, float] = {}

    def __repr__(self) -> str:
        return (f"Run({self.mode}, {len(self.program.commands)} commands, {len(self._end)} stages, "
                f"{self.cycles} cycles = {self.topology.cycles_to_us(self.cycles):.3f} us)")

    @property
    def commands(self) -> tuple:
        return self.program.commands

    @property
    def n_stages(self) -> int:
        return len(self._end)

    @property
    def op_log(self) -> pd.DataFrame:
        if self._op_log is None:
            t0 = perf_counter()
            with gc_paused():
                self._op_log = build_op_log(self.program, self.timeline)
            self.timings["op_log"] = perf_counter() - t0
        return self._op_log

    def dispatch_cycles(self) -> np.ndarray:
        """PE_CPU cycles of each command's DISPATCH stage, indexed by command id.

        The same numbers as the op_log's DISPATCH rows (``end - start``),
        without building the op_log.
        """
        d = np.asarray(self.program.dispatch_seq, dtype=np.int64)
        return self._end[d] - self._start[d]

    def read(self, handle_or_name: Handle | str) -> np.ndarray:
        """A copy of a tensor's final contents, in its own dtype (bf16 via ml_dtypes).

        Raises:
            SimulationError: timing mode (no numbers were computed).
            ValidationError: an unknown name.
        """
        if self.mode != "data":
            raise SimulationError("this run was simulated in timing mode, which computes no numbers; "
                                  "use Simulator(mode='data').")
        h = handle_or_name
        if isinstance(h, str):
            if h not in self._names:
                raise ValidationError(f"no tensor named {h!r} in this run; known: {', '.join(sorted(self._names))}.")
            h = self._names[h]
        arena = self.sim.memory.hbm if h.space == "hbm" else self._tcm
        return arena.view(h).copy()

    def to_csv(self, path: str | Path | None = None) -> str:
        """The canonical op_log CSV (written to ``path`` if given)."""
        return to_csv(self.op_log, path)

    def to_perfetto(self, path: str | Path | None = None) -> dict:
        """The Chrome-trace/Perfetto JSON of the op_log, the critical path drawn as flow events
        (written to ``path`` if given)."""
        return to_perfetto(self.op_log, path, self.topology.clock_ghz, critical_path=self.critical_path())

    @property
    def bindings(self) -> Bindings:
        """What bound each stage's start (``pe.timeline.Bindings``): ``run.bindings(seq)`` is
        ``(cause code, stage)``, the code an index into ``pe.timeline.CAUSES``."""
        if self._bindings is None:
            self._bindings = Bindings(self.program, self.timeline)
        return self._bindings

    def critical_path(self) -> pd.DataFrame:
        """The chain of stages that sets the end-to-end time (DESIGN §11).

        From cycle 0 to ``cycles``: each row starts where the previous one
        ends. It ends at the lowest-seq stage among those ending at
        ``cycles`` and walks back through what bound each start; ties follow
        the fixed order of ``pe.timeline`` (hazard, scheduler, wait, queue,
        dependency, order; then the lowest seq).

        Returns:
            The path's op_log rows (a fresh index) plus ``cause``, a
            categorical of ``pe.timeline.CAUSES``: what bound the row's start,
            the link from the previous row (``dependency`` for the first row).
        """
        seqs, causes = self.bindings.critical_path()
        path = self.op_log.iloc[seqs].reset_index(drop=True)
        path["cause"] = pd.Categorical.from_codes(np.asarray(causes, np.int8), categories=list(CAUSES))
        return path

    def holds(self) -> pd.DataFrame:
        """One row per command a hazard held after its PLAN (DESIGN §5, §11).

        Returns:
            Columns ``cmd``, ``label``, ``plan_end`` (its PLAN's end) and
            ``release`` (the cycle the hold cleared), in command order. Under
            strict FIFO a hold clears when every earlier command has
            completed; under rw_aware when every command it conflicts with has.
        """
        tl, prog = self.timeline, self.program
        held = tl.held
        plan_end = self._end[np.asarray(prog.plan_seq, np.int64)[held]] if len(held) else np.zeros(0, np.int64)
        return pd.DataFrame({"cmd": held.astype(np.int64), "label": [prog.labels[c] for c in held.tolist()],
                             "plan_end": plan_end, "release": tl.release.astype(np.int64)})
