"""Simulator and Run: place host data, run a kernel, read the op_log and the numbers."""

from __future__ import annotations

import contextlib
import difflib
import gc
import inspect
import itertools
import threading
from pathlib import Path
from time import perf_counter
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np
import pandas as pd

from .config import Topology, load_topology
from .errors import KbworkError, SimulationError, ValidationError
from .memory import (DTYPES, Handle, LoopHandle, Memory, Space, canonical_dtype, check_shape, chunks,  # noqa: F401
                     host_array, place)  # (chunks: decode reads host arrays a chunk at a time, as placement does)
from .oplog import build_op_log, concat_op_logs, to_csv, to_perfetto
from .device import CAUSES, Bindings, Timeline
from .device.device import Reductions, simulate_device
from .device.order import resolve_after
from .device.walk import device_path
from .device.loop import LaunchMemory
from .device.replay import FlowMismatch, counters_from, loads_from
from .device.steady import SteadyState, check_steady_state, simulate_pe
from .pe.scheduler import Program, ScheduleView
from .pe.stages import unit_names
from .pe.tiling import StagingRing
from .triton_emu.binding import Traced, params, signature, unwrap
from .triton_emu.tl_context import TLContext

MODES = ("data", "timing")


_gc_lock = threading.Lock()
_gc_pausers = 0
_gc_was_enabled = False


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector for the span of the block; safe to nest and to use from many threads.

    A run allocates hundreds of thousands of small acyclic objects (stages,
    tuples, events); reference counting frees them, and the collector's
    repeated scans would otherwise cost a third of a timing-mode run. The
    collector is process-wide, so the pauses of all threads are counted: the
    first one in records whether it was enabled, the last one out restores
    exactly that.
    """
    global _gc_pausers, _gc_was_enabled
    with _gc_lock:
        if _gc_pausers == 0:
            _gc_was_enabled = gc.isenabled()
            gc.disable()
        _gc_pausers += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_pausers -= 1
            if _gc_pausers == 0 and _gc_was_enabled:
                if gc.get_freeze_count() == 0:
                    # What the block made and still holds (a run's traces and records) outlives the next young
                    # collection, which would walk all of it once, tens of ms on a large run, to free nothing:
                    # freeze-and-unfreeze hands it to the oldest generation unscanned (garbage dies by
                    # reference counting as before; a cycle waits for the next full collection). Skipped when
                    # someone else froze objects, which unfreezing would release.
                    gc.freeze()
                    gc.unfreeze()
                gc.enable()


_serial = itertools.count(1)  # names simulators in error messages


class Simulator:
    """One simulated PE with its HBM.

    ``mode="data"`` computes real numbers (numpy-backed memories);
    ``mode="timing"`` only schedules and is much faster. HBM persists across
    runs of the same simulator; every run starts with a fresh TCM.
    """

    def __init__(self, topology: Topology | str | None = None, mode: str = "data", **overrides: Any):
        if not isinstance(mode, str) or mode not in MODES:
            raise ValidationError(f"Simulator mode {mode!r} is unknown; use 'data' or 'timing'.")
        self.topo = load_topology(topology, **overrides)
        #: the topology in error messages: its name and what the call changed of it ("ahbm-pe-v1 with pes=2")
        self.topology_text = self.topo.name + (" with " + ", ".join(f"{k}={v!r}" for k, v in overrides.items())
                                               if overrides else "")
        self.mode = mode
        self.label = f"simulator #{next(_serial)}"
        self.memory = Memory(self.topo.tcm_bytes, backed=mode == "data", label=self.label)
        self._hbm: dict[str, Handle] = {}
        #: per finished run, the HBM byte ranges it wrote (so an earlier run's reads can tell what moved)
        self._hbm_writes: list[tuple[tuple[int, int], ...]] = []
        #: a device run traces a kernel once per abstract signature (DESIGN.md §19); False traces every launch by
        #: itself, the plain reference the cache reproduces (for tests)
        self._trace_cache = True

    def __repr__(self) -> str:
        return f"Simulator({self.topo.name}, mode={self.mode!r}, {len(self._hbm)} HBM tensors)"

    def hbm(self, name: str, array: Any = None, *, shape: Any = None, dtype: Any = None, channel: int = 0) -> Handle:
        """Place a host tensor in HBM, on HBM channel ``channel``, and return its handle.

        Pass ``array`` (rounded to ``dtype``, default: the array's own dtype if
        supported, else fp32), or ``shape``/``dtype`` for an uninitialised
        (zeroed) output. In timing mode no bytes are kept, but the array is
        checked all the same. Every transfer of the tensor's bytes moves on its
        channel (DESIGN.md §14); a PE's home channel is
        ``topology.home_channel(pe)``.

        Raises:
            ValidationError: a bad or duplicate name, neither array nor shape (or
                both, disagreeing), a shape that is not 1-D/2-D ints, an array that
                is not real numbers (complex, bool, strings, objects), NaN or inf,
                values that overflow ``dtype`` (1e39 to fp32, 7e4 to fp16), or a
                channel the topology does not have.
        """
        if not isinstance(name, str) or not name:
            raise ValidationError(f"sim.hbm: the name must be a non-empty string, got {name!r}.")
        if name in self._hbm:
            raise ValidationError(f"HBM tensor {name!r} already exists; pick another name.")
        if isinstance(channel, (bool, np.bool_)) or not isinstance(channel, (int, np.integer)) or \
                not 0 <= channel < self.topo.hbm_channels:
            raise ValidationError(f"sim.hbm({name!r}): channel={channel!r} is not an HBM channel of "
                                  f"{self.topology_text} (it has {self.topo.hbm_channels}: 0 .. "
                                  f"{self.topo.hbm_channels - 1}).")
        arr = None
        if array is None:
            if shape is None:
                raise ValidationError(f"sim.hbm({name!r}): pass an array, or shape= (and dtype=) for an output.")
            dtype = canonical_dtype("fp32" if dtype is None else dtype)
            shape = check_shape(name, shape)
        else:
            arr = host_array(name, array)
            if shape is not None and check_shape(name, shape) != arr.shape:
                raise ValidationError(f"sim.hbm({name!r}): shape={shape!r} disagrees with the array's shape "
                                      f"{arr.shape}; pass one or the other.")
            if dtype is None:
                try:
                    dtype = canonical_dtype(arr.dtype)
                except ValidationError:
                    dtype = "fp32"
            dtype = canonical_dtype(dtype)
            shape = check_shape(name, arr.shape)
        hbm = self.memory.hbm
        top = hbm.top
        h = hbm.alloc(name, shape, dtype, int(channel))
        if arr is not None:
            try:  # checked and written a chunk at a time: no full-size copy of a large tensor beside it
                place(name, arr, dtype, hbm.view(h) if self.memory.backed else None)
            except ValidationError:
                hbm.drop_last(h, top)
                raise
        self._hbm[name] = h
        return h

    def reserve(self, nbytes: int) -> None:
        """Make room in HBM for ``nbytes`` of tensors about to be placed (data mode), so that placing them never
        regrows the HBM buffer (which briefly holds a large one twice). Optional: placement grows HBM anyway."""
        if self.memory.backed:
            self.memory.hbm.reserve(int(nbytes))

    def run(self, kernel: Callable[..., Any], *args: Any, steady_state: bool = True, **kwargs: Any) -> "Run":
        """Run ``kernel(tl, *args, **kwargs)`` once and simulate the commands it emits.

        Args:
            kernel: ``def k(tl, *handles, **scalars)`` (DESIGN.md §2); called exactly once.
            steady_state: timing mode: once a ``tl.range`` loop's schedule is proven periodic, insert
                its remaining periods instead of simulating them (DESIGN.md §12; identical results).
                Keyword-only and never passed to the kernel; must be a ``bool``. Data mode always
                simulates every stage (it computes every number).
            **kwargs: passed to the kernel.

        Returns:
            A :class:`Run` with the op_log, the cycle count and (data mode) the numbers;
            ``run.steady_state`` says which path ran.

        Raises:
            ValidationError, TcmOverflowError: from the kernel's ``tl`` calls, arguments the kernel's signature
                refuses, or a ``steady_state`` that is not a bool.
            SimulationError: the program deadlocks, or emits no commands.
        """
        if not callable(kernel):
            raise ValidationError(f"Simulator.run expects a kernel function def k(tl, ...), got {kernel!r}.")
        check_steady_state(steady_state, "Simulator.run")
        return self._run(kernel, args, kwargs, steady_state)

    def run_device(self, launches: Mapping[int, Sequence["Launch"]], *, steady_state: bool = True,
                   reductions: bool = True) -> "Run":
        """Run launches on the device's PEs (DESIGN.md §14): PE ``p`` runs ``launches[p]`` in order, back to back.

        Every PE starts at cycle 0; a launch's first DISPATCH is ready when the launch before it on that PE has
        ended and each launch in its ``after`` ended ``sync_cycles`` earlier (§16), and it sees a fresh TCM, staging
        ring, queue and hazard state. Before anything is simulated, a run is refused if a launch writes bytes a
        launch of another PE reads or writes and neither happens before the other (program order and ``after``).
        A kernel is called once per abstract signature of its launches (DESIGN.md §19: the kernel, its tensor
        arguments' shapes and dtypes, its scalars' values), and that trace is bound to each launch's tensors.

        Args:
            launches: PE -> its :class:`Launch` es, a list (PEs ``0 .. pes - 1`` of the topology; PEs not named run
                nothing); a single Launch is taken as a list of one.
            steady_state: timing mode: insert the remaining periods of ``tl.range`` loops once proven (DESIGN.md
                §12); keyword-only, a ``bool``. Data mode simulates every stage.
            reductions: split the PEs into groups that share no contended channel and replicate identical groups
                (DESIGN.md §14); ``False`` simulates every PE in one event loop, the plain simulation the
                reductions reproduce exactly (a check, not a setting that changes results).

        Returns:
            A :class:`Run` of the device: the op_log (with its ``pe`` column), per-PE runs (``run.pe(p)``), the
            critical path of the PE that finishes last, ``run.reductions`` (which exact reductions ran).

        Raises:
            ValidationError: bad launches (not a mapping of PEs to lists of Launch, a PE the topology does not
                have, arguments the kernel's signature refuses; an ``after`` launch not in the plan, a Launch placed
                twice, a cycle of waits), unordered PEs sharing bytes, or any error of a kernel's ``tl`` calls.
            SimulationError: a program deadlocks, or a launch emits no commands.

        In a run of several launches, an error raised while a kernel is traced says which launch raised it: a
        kbwork error's message starts with ``"PE p, launch i: "``; any other error (the kernel's own) keeps its
        message and gets that as a note.
        """
        check_steady_state(steady_state, "Simulator.run_device")
        if not isinstance(reductions, bool):
            raise ValidationError(f"Simulator.run_device: reductions must be True or False, got {reductions!r}.")
        plan = _check_launches(launches, self.topo, self.topology_text)
        return self._run_device(plan, steady_state, reductions)

    def _new_launch(self, label: str | None = None) -> tuple[Any, Handle]:
        """A fresh TCM for a kernel launch, with the scheduler's staging buffers allocated first."""
        tcm = self.memory.new_tcm(label)
        return tcm, tcm.alloc("<staging buffers>", (StagingRing.bytes_for(self.topo) // 4,), "fp32")

    def _trace(self, launch: "Launch", leaves: list, label: str | None, number: int) -> tuple[Traced, Any, Handle]:
        """Call the launch's kernel once on a fresh TCM, its tensor arguments (``leaves``, from
        :func:`~kbwork.triton_emu.binding.signature`) as parameters: the trace of its signature (numbered
        ``number``), the TCM and the staging buffers.

        Raises:
            ValidationError: the kernel cannot be called with these arguments (its signature refuses them).
            TraceError: the kernel read a tensor argument's address, channel or contents.
        """
        kernel = launch.kernel
        tcm, staging = self._new_launch(label)
        tl = TLContext(self.topo, self.memory)
        derived: dict[int, tuple] = {}
        args, kwargs = params(kernel, launch.args, launch.kwargs, leaves, derived)
        try:
            kernel(tl, *args, **kwargs)
        except TypeError:
            refused = _refused_call(kernel, tl, args, kwargs)
            if refused is None:  # raised inside the kernel, not by the call: the kernel's own error
                raise
            why, signature = refused
            name = getattr(kernel, "__name__", repr(kernel))
            given = ", ".join(["tl", *_call_args(args, kwargs)])
            raise ValidationError(f"{label + ': ' if label else ''}kernel {name!r} cannot be called as "
                                  f"{name}({given}): {why}. Its signature is {name}{signature}; a kernel is "
                                  f"def k(tl, *handles, **scalars) (DESIGN.md §2).") from None
        traced = Traced(number, tl.trace(), tuple(h for _, h in leaves), tl.names, derived, tl.named_after)
        return traced, tcm, staging

    def _run(self, kernel, args, kwargs, steady_state: bool = True) -> "Run":
        return self._run_device({0: [Launch(kernel, *args, **kwargs)]}, steady_state)

    def _run_device(self, plan: dict[int, list["Launch"]], steady_state: bool, reductions: bool = True) -> "Run":
        with gc_paused():
            t0 = perf_counter()
            data = self.mode == "data"
            after = resolve_after(plan)  # (refused before anything is traced: DESIGN.md §16)
            programs, memories, names, tcms = self._programs(plan)
            t1 = perf_counter()
            results, red = simulate_device(programs, self.topo, list(self._hbm.values()),
                                           memories if data else None, steady_state=steady_state and not data,
                                           why_full="data mode computes every number" if data else
                                           "steady_state=False", reduce=reductions, after=after)
            t2 = perf_counter()
            writes: tuple = ()
            snapshot: tuple = ()
            if data:
                writes = _merge([(lo, hi) for _, sched, _ in results.values() for ranges in sched.writes
                                 for is_tcm, lo, hi in ranges if not is_tcm])
                snapshot = tuple((lo, hi, self.memory.hbm.buf[lo:hi].copy()) for lo, hi in writes)
            self._hbm_writes.append(writes)
            index = len(self._hbm_writes) - 1
            runs = {}
            offset = 0
            hbm_names = dict(self._hbm)  # the tensors as this run saw them (read-only: one copy serves every PE)
            timings = {"emit": t1 - t0, "simulate": t2 - t1}
            for pe in sorted(results):
                timeline, sched, state = results[pe]
                r = Run(self, sched, timeline, hbm_names, names, tcms, index, snapshot, steady_state=state,
                        source=programs[pe], pe=pe, seq_offset=offset, reductions=red, timings=timings)
                offset += r.n_stages
                runs[pe] = r
                r._after = after
            return runs[0] if list(runs) == [0] else DeviceRun(self, runs, red, timings=timings, after=after)

    def _programs(self, plan: dict[int, list["Launch"]]) -> tuple[dict, dict, dict, list]:
        """Trace ``plan``'s launches, a kernel once per abstract signature (DESIGN.md §19), and bind each launch to
        its signature's trace: PE -> its programs, PE -> each launch's memory, the names the kernels gave, the
        TCMs (each launch has its own).

        The cache lives with this call (a new run traces again); ``self._trace_cache = False`` traces every launch
        by itself (the reference the cache must reproduce)."""
        data = self.mode == "data"
        programs: dict[int, list[Program]] = {}
        memories: dict[int, list[Any]] = {}
        names: dict[str, list[Handle]] = {}
        tcms: list[Any] = []
        several = len(plan) > 1 or any(len(v) > 1 for v in plan.values())
        traces: dict[Any, Traced] = {}
        staging_at: dict[int, int] = {}  # trace id -> the address of its launch's staging buffers
        cache = self._trace_cache
        for pe, lst in plan.items():
            programs[pe], memories[pe] = [], []
            for i, launch in enumerate(lst):
                label = f"PE {pe}, launch {i}" if several else None
                key, leaves = signature(launch.kernel, launch.args, launch.kwargs)
                if not cache:
                    key = (pe, i)
                traced = traces.get(key)
                if traced is None:
                    try:
                        traced, tcm, staging = self._trace(launch, leaves, label, len(traces))
                        staging_at[traced.id] = staging.addr
                    except Exception as e:
                        if label is not None:
                            _name_the_launch(e, label)
                        raise
                    if not traced.trace.n_commands:
                        kname = getattr(launch.kernel, "__name__", launch.kernel)
                        raise SimulationError(f"kernel {kname!r} emitted no commands"
                                              + (f" (PE {pe}, launch {i})." if several else "."))
                    traces[key] = traced
                elif data:  # the launch's own TCM for its numbers, laid out as the traced one's
                    tcm, _ = self._new_launch(label)
                else:  # timing mode keeps no bytes: the traced launch's TCM layout serves
                    tcm = None
                trace, given = traced.bind([h for _, h in leaves])
                programs[pe].append(Program(trace, self.topo, with_effects=data, staging_base=staging_at[traced.id]))
                memories[pe].append(LaunchMemory(self.memory.hbm, tcm))
                if tcm is not None:
                    tcms.append(tcm)
                for n, hs in given.items():
                    names.setdefault(n, []).extend(hs)
        return programs, memories, names, tcms

    def _read_hbm(self, h: Handle, run: "Run") -> np.ndarray:
        """``h``'s bytes as ``run`` left them: what it wrote from its snapshot, the rest from HBM if no later run moved it."""
        hbm = self.memory.hbm
        if run._index == len(self._hbm_writes) - 1:
            return hbm.view(h).copy()
        raw = hbm.buf[h.addr:h.end].copy()
        covered = np.zeros(h.nbytes, dtype=bool)
        for lo, hi, data in run._snapshot:
            a, b = max(lo, h.addr), min(hi, h.end)
            if a < b:
                raw[a - h.addr:b - h.addr] = data[a - lo:b - lo]
                covered[a - h.addr:b - h.addr] = True
        for later, ranges in enumerate(self._hbm_writes[run._index + 1:], start=run._index + 1):
            for lo, hi in ranges:
                a, b = max(lo, h.addr), min(hi, h.end)
                if a < b and not covered[a - h.addr:b - h.addr].all():
                    raise SimulationError(
                        f"Run.read({h.name!r}): a later run of {self.label} (run {later + 1}) overwrote this tensor "
                        f"in HBM after run {run._index + 1}, which did not write it. Read results before running "
                        f"again, or give each run its own Simulator.")
        return raw.view(DTYPES[h.dtype]).reshape(h.shape)


def _name_the_launch(e: BaseException, label: str) -> None:
    """Say in ``e`` which launch of a device run raised it (``label``: ``"PE 5, launch 0"``): among 96 launches of
    one kernel, its message alone does not tell. A kbwork error's message starts with the label (the same error,
    re-raised: its class and traceback are kept); any other error, the kernel's own, gets it as a note."""
    args = e.args
    if isinstance(e, KbworkError) and len(args) == 1 and isinstance(args[0], str):
        if not args[0].startswith(label + ":"):
            e.args = (f"{label}: {args[0]}",)
    else:
        e.add_note(f"(raised while tracing {label} of the device run)")


def _check_pe_number(p: Any) -> None:
    if isinstance(p, (bool, np.bool_)) or not isinstance(p, (int, np.integer)):
        raise ValidationError(f"run.pe({p!r}): a PE is named by its number, an int (run.pe(0)); got "
                              f"{type(p).__name__}.")


def _refused_call(kernel: Callable[..., Any], tl: Any, args: tuple, kwargs: dict) -> tuple[str, str] | None:
    """Why ``kernel(tl, *args, **kwargs)`` does not bind to the kernel's signature, and the signature; None when
    it binds (or the signature cannot be read)."""
    try:
        sig = inspect.signature(kernel)
    except (TypeError, ValueError):
        return None
    try:
        sig.bind(tl, *args, **kwargs)
    except TypeError as e:
        params = sig.parameters
        takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
        # the keywords a caller could mean: every parameter after tl that a keyword can set and none has
        meant = [n for n, p in list(params.items())[1:]
                 if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and n not in kwargs]
        unknown = [] if takes_any else [k for k in kwargs if k not in params]
        if unknown:  # a misspelt keyword is the mistake to name, not the argument it left missing
            why = []
            for k in unknown:
                close = difflib.get_close_matches(k, meant, n=1, cutoff=0.6)
                why.append(f"got an unexpected keyword argument {k!r}"
                           + (f" (did you mean {close[0]!r}?)" if close else ""))
            return "; ".join(why), str(sig)
        return str(e), str(sig)
    return None


def _perfetto_counters(run: "Run") -> dict:
    """The channel counter tracks of ``run`` (``device.replay``); none for one PE's run of a device whose channels
    other PEs shared (its op_log does not hold their transfers)."""
    log = run.op_log
    keep = log["stage"].isin(("DMA_READ", "DMA_WRITE")).to_numpy()
    col = {c: log[c].to_numpy(np.int64)[keep] for c in ("seq", "bytes", "start", "end")}
    chan = np.asarray(run.stage_channels, dtype=np.int64)[keep]
    try:
        return counters_from(loads_from(col["seq"], col["bytes"], col["start"], col["end"], chan, run.topology,
                                        "to_perfetto"))
    except FlowMismatch:
        return {}


def _merge(ranges: list[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    """Sorted, disjoint byte ranges covering ``ranges``."""
    out: list[list[int]] = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1]:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return tuple((lo, hi) for lo, hi in out)


def _path_frame(runs: dict, after: dict | None, pe: int) -> pd.DataFrame:
    """The critical path from PE ``pe``'s last stage, across ``after`` links (``device.walk.device_path``), as op_log
    rows with ``cause``."""
    parts = device_path({p: r.bindings for p, r in runs.items()}, after, runs[pe].topology.sync_cycles, pe)
    path = concat_op_logs([runs[p].op_log.iloc[seqs] for p, seqs, _ in parts]).reset_index(drop=True)
    causes = [c for _, _, cs in parts for c in cs]
    path["cause"] = pd.Categorical.from_codes(np.asarray(causes, np.int8), categories=list(CAUSES))
    return path


def _rescaled(prog: Program, engine: int, factor: Any) -> Program:
    """``prog`` (timing mode) with every stage of ``engine`` taking ``ceil(d / factor)`` cycles."""
    return Program(prog.trace, prog.topo, staging_base=prog.staging_base, scale={int(engine): factor})


class Launch:
    """One kernel launch on a PE of a device run: ``Launch(kernel, *args, after=(), **kwargs)`` (DESIGN.md §14,
    §16).

    ``kernel(tl, *args, **kwargs)`` is called once, when the run is traced. ``after``: launches of the same plan
    (on any PE) whose end, plus ``sync_cycles``, this launch's first DISPATCH waits for; not a kernel argument.
    """

    __slots__ = ("kernel", "args", "kwargs", "after")

    def __init__(self, kernel: Callable[..., Any], *args: Any, after: Any = (), **kwargs: Any):
        if not callable(kernel):
            raise ValidationError(f"Launch expects a kernel function def k(tl, ...), got {kernel!r}.")
        if "steady_state" in kwargs:
            raise ValidationError("Launch: steady_state is a setting of the run (sim.run_device(..., "
                                  "steady_state=...)), not an argument of the kernel.")
        after = (after,) if isinstance(after, Launch) else after
        try:
            after = tuple(after)
        except TypeError:
            raise ValidationError(f"Launch: after must be an iterable of Launch, got {after!r}.") from None
        if not all(isinstance(d, Launch) for d in after):
            raise ValidationError(f"Launch: after must hold Launch objects only, got {after!r}.")
        self.kernel, self.args, self.kwargs, self.after = kernel, args, kwargs, after

    def __repr__(self) -> str:
        args = ", ".join(_call_args(self.args, self.kwargs))
        return f"Launch({getattr(self.kernel, '__name__', self.kernel)}({args}))"


def _call_args(args: tuple, kwargs: dict) -> list[str]:
    """A kernel call's arguments as text, handles by name (``["q", "K", "variant='opt2'"]``)."""
    return [getattr(a, "name", repr(a)) for a in args] + [f"{k}={getattr(v, 'name', repr(v))}"
                                                          for k, v in kwargs.items()]


def _check_launches(launches: Any, topo: Topology, topology_text: str) -> dict[int, list[Launch]]:
    """``launches`` as PE -> list of Launch, in PE order; or a ValidationError saying what is wrong."""
    if not isinstance(launches, Mapping):
        raise ValidationError(f"run_device expects a mapping PE -> [Launch, ...], e.g. {{0: [Launch(k, a, b)]}}; "
                              f"got {type(launches).__name__}.")
    if not launches:
        raise ValidationError("run_device: no launches; give at least one PE a list of Launch.")
    out: dict[int, list[Launch]] = {}
    for pe in launches:
        if isinstance(pe, (bool, np.bool_)) or not isinstance(pe, (int, np.integer)) or not 0 <= pe < topo.pes:
            raise ValidationError(f"run_device: PE {pe!r} is not a PE of {topology_text} (it has {topo.pes}: "
                                  f"0 .. {topo.pes - 1}); give a device topology (pes=...) for more.")
        lst = launches[pe]
        if isinstance(lst, Launch):
            lst = [lst]
        if not isinstance(lst, (list, tuple)) or not lst or not all(isinstance(x, Launch) for x in lst):
            raise ValidationError(f"run_device: PE {pe} must map to a non-empty list of Launch(kernel, *args), "
                                  f"got {lst!r}.")
        out[int(pe)] = list(lst)
    return dict(sorted(out.items()))


class Run:
    """The result of one kernel run.

    Attributes:
        op_log: one row per executed stage (built on first access).
        cycles: end-to-end cycles (the last stage's end).
        program: the scheduled :class:`Program` (commands and stage table).
        timeline: what the event loop recorded (``device.records.Timeline``: start,
            end and ready of every stage, its unit, the hazard holds).
    """

    def __init__(self, sim: Simulator, prog: ScheduleView, timeline: Timeline, hbm_names: dict[str, Handle],
                 tcm_names: dict[str, list[Handle]], tcms: Sequence[Any], index: int = 0, snapshot: tuple = (), *,
                 steady_state: SteadyState | None = None, source: Sequence[Program] = (), pe: int = 0,
                 seq_offset: int = 0, reductions: Reductions | None = None, timings: dict[str, float] | None = None,
                 mode: str | None = None):
        self.sim = sim
        self.topology = sim.topo
        self.mode = sim.mode if mode is None else mode
        #: what the run simulated: the full schedule, an expanded steady one or a replica (``ScheduleView``)
        self.program = prog
        # what the timeline recorded, as arrays (a million-entry list would be walked by the garbage
        # collector once the run re-enables it); a steady-state run builds them on first use
        self.timeline = timeline
        self._hbm_names = hbm_names
        self._tcm_names = tcm_names
        self._tcms = list(tcms)
        self._index = index
        #: the PE it ran on, and where its stages start in the device's numbering
        self.pe_index, self.seq_offset = pe, seq_offset
        #: which exact reductions the device run used (``device.device.Reductions``)
        self.reductions = reductions
        #: the programs (one per launch) the run simulated (``what_if`` simulates them again)
        self._source = tuple(source)
        self._snapshot = snapshot
        self._op_log: pd.DataFrame | None = None
        self._bindings: Bindings | None = None
        self._after: dict | None = None  # the plan's launch dependencies (DESIGN.md §16)
        self.cycles = timeline.cycles
        #: in timing mode, how it was computed (``steady.SteadyState``); else None
        self.steady_state = steady_state
        #: wall-clock seconds of each phase (emit, schedule, simulate, op_log), for benchmarks
        self.timings: dict[str, float] = dict(timings or {})

    def __repr__(self) -> str:
        how = f"; {self.steady_state.path}" if self.steady_state is not None else ""
        return (f"Run({self.mode}, {len(self.program.commands)} commands, {self.n_stages} stages, "
                f"{self.cycles} cycles = {self.topology.cycles_to_us(self.cycles):.3f} us{how})")

    @property
    def _start(self) -> np.ndarray:
        return self.timeline.start

    @property
    def _end(self) -> np.ndarray:
        return self.timeline.end

    @property
    def commands(self):
        """Every command of the run, in program order: a sequence instantiated on access (a long loop's
        commands are made when read; ints, negative ints and slices work as on a list)."""
        return self.program.commands

    @property
    def n_stages(self) -> int:
        """How many stages the run has (those simulated and, on the steady path, those inserted)."""
        return len(self.program.table)

    @property
    def units(self) -> tuple[str, ...]:
        """The op_log ``engine`` name of every unit of the PE, used or not, in track order (the categories of the
        op_log's ``engine`` column, without building the op_log)."""
        return unit_names(self.timeline.engines)

    @property
    def stage_channels(self) -> np.ndarray:
        """The HBM channel each stage moves bytes on, aligned with the op_log's rows (-1 for a stage that is not
        a DMA of an HBM tensor)."""
        chan = np.asarray(self.program.table.chan, dtype=np.int64)
        return chan

    @property
    def pes(self) -> list[int]:
        """The PEs that ran something: this run's one."""
        return [max(self.pe_index, 0)]

    def pe(self, p: int) -> "Run":
        """PE ``p``'s run: this one, for the PE it ran on.

        Raises:
            ValidationError: ``p`` is not an int, or not that PE.
        """
        _check_pe_number(p)
        if p != max(self.pe_index, 0):
            raise ValidationError(f"PE {p} ran nothing in this run; it ran PE {max(self.pe_index, 0)}.")
        return self

    @property
    def op_log(self) -> pd.DataFrame:
        if self._op_log is None:
            t0 = perf_counter()
            with gc_paused():
                self._op_log = build_op_log(self.program, self.timeline, self.pe_index, self.seq_offset)
            self.timings["op_log"] = perf_counter() - t0
        return self._op_log

    def dispatch_cycles(self) -> np.ndarray:
        """PE_CPU cycles of each command's DISPATCH stage, indexed by command id.

        The same numbers as the op_log's DISPATCH rows (``end - start``),
        without building the op_log.
        """
        return self.timeline.dispatch_cycles(self.program)

    def read(self, handle_or_name: Handle | str) -> np.ndarray:
        """A copy of a tensor's contents at the end of this run, in its own dtype (bf16 via ml_dtypes).

        TCM handles read this run's own TCM. An HBM tensor reads what this run
        left there, even after the simulator ran again, as long as no later run
        overwrote bytes this run did not write. A handle kept from a ``tl.range``
        body reads its last iteration's tensor, as a Python loop leaves it.

        Raises:
            SimulationError: timing mode (no numbers were computed), or a later run
                overwrote the tensor.
            ValidationError: an unknown or ambiguous name; a handle of another
                simulator or another run, or one whose scratch scope had closed.
        """
        if self.mode != "data":
            raise SimulationError("this run was simulated in timing mode, which computes no numbers; "
                                  "use Simulator(mode='data').")
        # (a tensor argument the kernel kept is a parameter of its trace: the tensor of the launch traced)
        h = self._lookup(handle_or_name) if isinstance(handle_or_name, str) else unwrap(handle_or_name)
        if isinstance(h, LoopHandle) and (h.origin is None or h.origin.alive):
            # kept from a tl.range body: as a Python loop leaves it, the last iteration's (a buffer of a scratch
            # scope that has closed is refused below, as any)
            n = h.var.iterations if h.var is not None else 0
            if not n:
                raise ValidationError(f"Run.read({h.name!r}): a handle made in the body of a tl.range that ran no "
                                      f"iteration; no iteration left a tensor to read.")
            h = h.at(n - 1)
        if not isinstance(h, Handle):
            raise ValidationError(f"Run.read expects a tensor handle or a tensor name, got {handle_or_name!r}.")
        arena = self._tcm_of(h) if h.space is Space.TCM else self.sim.memory.hbm
        problem = arena.check(h)
        if problem is not None:
            raise ValidationError(f"Run.read: {problem}")
        if h.space is Space.TCM:
            return arena.view(h).copy()
        return self.sim._read_hbm(h, self)

    def _tcm_of(self, h: Handle) -> Any:
        """The TCM of this run that made ``h`` (every launch has its own), or the last one (which then refuses it)."""
        o = h.origin
        if o is not None and any(o.arena is t for t in self._tcms):
            return o.arena
        return self._tcms[-1]

    def _lookup(self, name: str) -> Handle:
        found = ([self._hbm_names[name]] if name in self._hbm_names else []) + self._tcm_names.get(name, [])
        if not found:
            known = sorted(set(self._hbm_names) | set(self._tcm_names))
            raise ValidationError(f"no tensor named {name!r} in this run; known: {', '.join(known)}.")
        valid = [h for h in found if (self._tcm_of(h) if h.space is Space.TCM else self.sim.memory.hbm).check(h)
                 is None]
        if len(valid) > 1:
            raise ValidationError(f"the name {name!r} is given to {len(valid)} tensors in this run "
                                  f"({', '.join(repr(h) for h in valid)}); pass the handle instead of the name.")
        return valid[0] if valid else found[-1]

    def rescaled(self, engine: int, factor: Any) -> "Run":
        """This run's trace re-simulated in timing mode with every stage of ``engine`` (an ``Engine`` code)
        taking ``ceil(d / factor)`` cycles instead of ``d`` (``analysis.what_if``); the steady state is used
        as the run used it. The kernel is not called again."""
        progs = [_rescaled(p, engine, factor) for p in self._source]
        deps = [tuple((0, j) for _, j in ds) for ds in self._after[self.pe_index]] if self._after else ()
        timeline, sched, state = simulate_pe(progs, None, steady_state=True, after=deps,
                                             sync=self.topology.sync_cycles)
        r = Run(self.sim, sched, timeline, self._hbm_names, self._tcm_names, self._tcms, self._index, (),
                steady_state=state, source=progs, pe=self.pe_index, seq_offset=self.seq_offset, mode="timing")
        r._after = self._after
        return r

    def to_csv(self, path: str | Path | None = None) -> str:
        """The canonical op_log CSV (written to ``path`` if given).

        Raises:
            ValidationError: ``path`` is not a file path. FileError: it cannot be written.
        """
        return to_csv(self.op_log, path)

    def to_perfetto(self, path: str | Path | None = None) -> dict:
        """The Chrome-trace/Perfetto JSON of the op_log, the critical path drawn as flow events, a counter track
        per HBM channel (bytes per cycle in use; ``analysis.channel_steps``) (written to ``path`` if given)."""
        return to_perfetto(self.op_log, path, self.topology.clock_ghz, critical_path=self.critical_path(),
                           counters=_perfetto_counters(self))

    @property
    def bindings(self) -> Bindings:
        """What bound each stage's start (``device.walk.Bindings``): ``run.bindings(seq)`` is
        ``(cause code, stage)``, the code an index into ``device.walk.CAUSES``."""
        if self._bindings is None:
            # a steady-state run: the critical path repeats with the inserted periods
            self._bindings = Bindings(self.program, self.timeline, self.program.periods())
        return self._bindings

    def critical_path(self) -> pd.DataFrame:
        """The chain of stages that sets the end-to-end time (DESIGN §11).

        From cycle 0 to ``cycles``: each row starts where the previous one
        ends. It ends at the lowest-seq stage among those ending at
        ``cycles`` and walks back through what bound each start; ties follow
        the fixed order of ``device.walk`` (hazard, scheduler, wait, queue,
        dependency, order; then the lowest seq).

        Returns:
            The path's op_log rows (a fresh index) plus ``cause``, a
            categorical of ``device.walk.CAUSES``: what bound the row's start,
            the link from the previous row (``dependency`` for the first row).
        """
        return _path_frame({self.pe_index: self}, self._after, self.pe_index)

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


class DeviceRun(Run):
    """The result of a device run (``Simulator.run_device``): one :class:`Run` per PE, and the device's view.

    ``op_log`` is every PE's, one after another (``seq`` numbers the stages PE by PE, launch by launch; ``cmd``
    a PE's commands across its launches); ``cycles`` the last cycle of any PE; ``critical_path()`` the chain of
    the PE that finishes last (the lowest such PE); ``holds()`` every PE's, with a ``pe`` column;
    ``pe(p)`` one PE's run; ``reductions`` which exact reductions ran. A device has no single program:
    ``run.pe(p).program`` is PE p's.
    """

    def __init__(self, sim: Simulator, runs: dict[int, Run], reductions: Reductions,
                 timings: dict[str, float] | None = None, after: dict | None = None):
        self.sim = sim
        self._after = after  # each launch's dependencies (DESIGN.md §16): the critical path follows them
        self.topology = sim.topo
        self.mode = sim.mode
        self.runs = runs
        self.reductions = reductions
        self.cycles = max(r.cycles for r in runs.values())
        self._op_log: pd.DataFrame | None = None
        self.timings: dict[str, float] = dict(timings or {})
        self.pe_index, self.seq_offset = -1, 0
        paths = [r.steady_state.path for r in runs.values()]
        first = next(r.steady_state for r in runs.values())
        self.steady_state = SteadyState(
            "steady" if "steady" in paths else "full",
            period=next((r.steady_state.period for r in runs.values() if r.steady_state.path == "steady"), None),
            proven_at=next((r.steady_state.proven_at for r in runs.values() if r.steady_state.path == "steady"),
                           None),
            reason=None if "steady" in paths else first.reason,
            inserted=sum(r.steady_state.inserted for r in runs.values()),
            loops=tuple(f"PE {p}: {line}" for p, r in runs.items() for line in r.steady_state.loops))

    def __repr__(self) -> str:
        n = len(self.runs)
        return (f"Run({self.mode}, device of {n} PE{'s' if n != 1 else ''}, {self.n_stages} stages, {self.cycles} cycles = "
                f"{self.topology.cycles_to_us(self.cycles):.3f} us; {self.reductions})")

    def pe(self, p: int) -> Run:
        """PE ``p``'s run (its program, timeline, op_log rows, critical path).

        Raises:
            ValidationError: ``p`` is not an int, or ran nothing.
        """
        _check_pe_number(p)
        if p not in self.runs:
            raise ValidationError(f"PE {p} ran nothing in this run; it ran PEs {sorted(self.runs)}.")
        return self.runs[p]

    @property
    def pes(self) -> list[int]:
        """The PEs that ran something, ascending."""
        return sorted(self.runs)

    @property
    def program(self):
        raise ValidationError("a device run has one program per PE: read run.pe(p).program.")

    @property
    def timeline(self):
        raise ValidationError("a device run has one timeline per PE: read run.pe(p).timeline.")

    @property
    def commands(self):
        """Every PE's commands, PE after PE (a sequence instantiated on access)."""
        from .device.steady import _Concat

        return _Concat([r.commands for r in self.runs.values()])

    @property
    def n_stages(self) -> int:
        return sum(r.n_stages for r in self.runs.values())

    @property
    def units(self) -> tuple[str, ...]:
        """Every PE's units (each PE has the same), as :attr:`Run.units`: the categories of the device op_log's
        ``engine`` column, without building it."""
        return max((r.units for r in self.runs.values()), key=len)

    @property
    def stage_channels(self) -> np.ndarray:
        """Every PE's :attr:`Run.stage_channels`, PE after PE (aligned with the device op_log)."""
        return np.concatenate([r.stage_channels for r in self.runs.values()])

    @property
    def op_log(self) -> pd.DataFrame:
        if self._op_log is None:
            t0 = perf_counter()
            with gc_paused():
                self._op_log = concat_op_logs([r.op_log for r in self.runs.values()])
            self.timings["op_log"] = perf_counter() - t0
        return self._op_log

    def dispatch_cycles(self) -> np.ndarray:
        """PE_CPU cycles of every DISPATCH, PE after PE (each PE's in command order)."""
        return np.concatenate([r.dispatch_cycles() for r in self.runs.values()])

    def last_pe(self) -> int:
        """The PE whose last stage ends last (the lowest one on a tie): the one the critical path runs on."""
        return min(p for p, r in self.runs.items() if r.cycles == self.cycles)

    @property
    def bindings(self) -> Bindings:
        return self.runs[self.last_pe()].bindings

    def critical_path(self) -> pd.DataFrame:
        """The critical path of the device: that of the PE that finishes last (DESIGN.md §14), and through an
        ``after`` link the path of the launch it waited for (§16); ``seq`` in the device's numbering, with the
        ``pe`` column."""
        return _path_frame(self.runs, self._after, self.last_pe())

    def holds(self) -> pd.DataFrame:
        """Every PE's hazard holds (``Run.holds``), with a ``pe`` column first."""
        frames = [r.holds().assign(pe=p)[["pe", "cmd", "label", "plan_end", "release"]] for p, r in self.runs.items()]
        return pd.concat(frames, ignore_index=True)

    def rescaled(self, engine: int, factor: Any) -> "Run":
        """Every PE's launches re-simulated with ``engine`` ``factor`` times faster (``analysis.what_if``)."""
        programs = {p: [_rescaled(x, engine, factor) for x in r._source] for p, r in self.runs.items()}
        results, red = simulate_device(programs, self.topology, list(self.sim._hbm.values()), None,
                                       after=self._after)
        runs = {}
        offset = 0
        for p in sorted(results):
            timeline, sched, state = results[p]
            r = Run(self.sim, sched, timeline, {}, {}, [], 0, (), steady_state=state, source=programs[p], pe=p,
                    seq_offset=offset, reductions=red, mode="timing")
            offset += r.n_stages
            runs[p] = r
            r._after = self._after
        return DeviceRun(self.sim, runs, red, after=self._after)

    def read(self, handle_or_name: Handle | str) -> np.ndarray:
        """As :meth:`Run.read` (every PE's tensors and TCMs are the run's)."""
        return next(iter(self.runs.values())).read(handle_or_name)

    def to_perfetto(self, path: str | Path | None = None) -> dict:
        """The Chrome-trace/Perfetto JSON: a process per PE (a track per unit), the critical path as flow events, a
        counter track per HBM channel under a process of its own."""
        return to_perfetto(self.op_log, path, self.topology.clock_ghz, critical_path=self.critical_path(),
                           counters=_perfetto_counters(self))
