"""Exact steady state: a long decode run from a short one with whole periods inserted (DESIGN.md §12).

Decode's schedule becomes exactly periodic after a few tiles. In timing mode a
run with n tiles is therefore computed from a shorter program of n_s tiles,
n_s ≡ n (mod p), with ``k = (n - n_s) / p`` periods of p tiles inserted; the
result — every stage's start, end, ready and unit, every completion and hazard
hold, hence the op_log, the critical path, utilisation and attribution — is
identical to the full simulation's. The rule, and what makes it exact:

**Boundaries.** The boundary of loop iteration j is the instant the DISPATCH of
the first command iteration j emits (``qk(j+1)``) starts. The state there is
read after every stage ending at that cycle has retired and before anything
starts (``pe.timeline.Snapshot``): the running stages (ends and units), every
engine's ready queue, the unmet dependencies of every stage not yet started in
the commands from the first incomplete one up to the farthest a static edge
reaches past the next dispatch (staging-ring edges reach ``tile_buffers``
reads ahead), the commands in flight and their stages left, which have
completed, the dispatch and plan counters and queue occupancy, and the hazard
holds (strict FIFO's held command; rw_aware's counts and waiters).

**The proof.** Two boundaries b1 < b2 = b1 + p (tiles) are equivalent when the
state at b2 equals the state at b1 with every time shifted by Δt, every seq by
Δseq and every command id by Δcmd (those of the two boundaries). Equal states
alone say nothing unless what comes after is equal too, so the program itself
is checked to be periodic from the earliest command the state at b1 can refer
to up to the tail: command c + Δcmd is command c shifted — its label, ``iter``
+ p, logical bytes, op signatures, waits, and every stage (kind, phase, op,
tile, duration, bytes, dependencies + Δseq, tensor names with the K/V slices p
tiles further) — and its hazard footprint is the same byte ranges, but for the
K and V slices, which move by p tiles' rows. K and V are only read, and no
command writes any byte of them (checked), so their addresses can decide no
hazard. The event loop is deterministic: from equivalent states, over programs
equal up to the shift, it does the same things Δt later.

**The short program.** It keeps the prefix (warm-up and the first proven
period), the proven period again, then at least ``max(cmd_queue_depth,
reach)`` commands before the tail, so the CPU's look-ahead into the tail is
simulated, not assumed. Every command before b2 must have completed before the
tail's first DISPATCH (checked): then nothing of the prefix depends on where
the tail sits.

**Extrapolation.** The full run is the short run with the period [b1, b2)
repeated k times after b2: stages and commands before b2 keep their times;
the m-th inserted copy of the period is the period shifted by m·(Δt, Δseq,
Δcmd, p tiles); the rest (b2 onwards, the tail included) is shifted by k
periods. DISPATCH and PLAN ``ready`` are recomputed from the full arrays as
the event loop computes them. The op_log rewrites ``seq``, ``cmd``, ``iter``,
the cycle columns and the K/V names in ``tensor`` for each copy.

When no period is proven within :data:`PROBE_TILES` tiles, or a check fails,
the run falls back to the full simulation, and ``run.steady_state`` says so
and why. ``decode.run(..., steady_state=False)`` forces the full run; data
mode always runs in full.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd

from .pe.commands import DmaCmd
from .pe.scheduler import Program
from .pe.stages import StageKind
from .pe.timeline import Snapshot, Timeline, _front_end
from .sim import Run

#: Fewer tiles than this run in full: the proof would cost as much as the run.
MIN_TILES = 24
#: The period must be proven within the first this many tiles; a shorter probe is tried first.
PROBE_TILES = 64
FIRST_PROBE_TILES = 16
#: The longest period looked for, in tiles.
MAX_PERIOD = 8


@dataclass(frozen=True)
class SteadyState:
    """Which path a timing-mode decode run took (``run.steady_state``).

    ``path`` is ``"steady"`` (the short program with ``inserted`` periods of
    ``period`` tiles, proven from tile ``from_tile``, each ``period_cycles``
    long) or ``"full"`` (with ``reason``).
    """

    path: str
    reason: str = ""
    period: int = 0
    from_tile: int = 0
    period_cycles: int = 0
    short_tiles: int = 0
    inserted: int = 0

    def __repr__(self) -> str:
        if self.path == "steady":
            return (f"SteadyState(steady: period {self.period} tiles = {self.period_cycles} cycles, proven from "
                    f"tile {self.from_tile}; {self.short_tiles} tiles simulated, {self.inserted} periods inserted)")
        return f"SteadyState(full: {self.reason})"


@dataclass(frozen=True)
class Strided:
    """A read-only HBM tensor a loop walks a tile at a time (K, V): its byte range and per-tile stride."""

    name: str
    addr: int
    end: int
    row_bytes: int
    rows_per_tile: int

    @property
    def stride(self) -> int:
        return self.row_bytes * self.rows_per_tile


# --- the proof ----------------------------------------------------------------------------------------
@dataclass
class _Shift:
    """Two equivalent boundaries of the short run and what separates them."""

    b1: int            # tiles
    b2: int
    cmd1: int          # command ids of the boundaries
    cmd2: int
    seq1: int          # DISPATCH seqs
    seq2: int
    dt: int            # cycles

    @property
    def p(self) -> int:
        return self.b2 - self.b1

    @property
    def dcmd(self) -> int:
        return self.cmd2 - self.cmd1

    @property
    def dseq(self) -> int:
        return self.seq2 - self.seq1


def _equivalent(a: Snapshot, b: Snapshot) -> bool:
    return a.shifted(b.t - a.t, b.seq - a.seq, b.cmd - a.cmd) == b


_SLICE = re.compile(r"([^|\[\]]+)\[(\d+):(\d+)\]")


def _rename(name: str, regions: dict[str, Strided], tiles: int) -> str:
    """``name`` with every slice of a strided tensor moved ``tiles`` tiles on (``K[0:128]`` -> ``K[256:384]``)."""
    if not tiles or "[" not in name:
        return name

    def move(m: re.Match) -> str:
        r = regions.get(m.group(1))
        if r is None:
            return m.group(0)
        rows = tiles * r.rows_per_tile
        return f"{m.group(1)}[{int(m.group(2)) + rows}:{int(m.group(3)) + rows}]"
    return _SLICE.sub(move, name)


def _move_range(rng: tuple, regions: Sequence[Strided], tiles: int) -> tuple:
    is_tcm, lo, hi = rng
    if not is_tcm:
        for r in regions:
            if r.addr <= lo and hi <= r.end:
                return (is_tcm, lo + tiles * r.stride, hi + tiles * r.stride)
    return rng


def _periodic(run: Run, first: int, last: int, dcmd: int, dseq: int, p: int,
              regions: Sequence[Strided]) -> str | None:
    """Check commands ``first .. last - 1`` of ``run`` against their twins ``dcmd`` on (module docstring),
    with the durations the run simulated; return what differs, or None."""
    prog = run.program
    table = prog.table
    kind, phase, op_kind, tile, k_tile = table.kind, table.phase, table.op_kind, table.tile, table.k_tile
    tensor, nbytes, preds = table.tensor, table.nbytes, table.preds
    dur = (run.timeline.end - run.timeline.start).tolist()
    by_name = {r.name: r for r in regions}
    cmds = prog.commands
    for c in range(first, last):
        d = c + dcmd
        a, b = cmds[c], cmds[d]
        if (a.__class__ is not b.__class__ or prog.labels[c] != prog.labels[d]
                or (prog.iters[c] < 0) != (prog.iters[d] < 0)
                or (prog.iters[c] >= 0 and prog.iters[d] != prog.iters[c] + p)
                or prog.logical_bytes[c] != prog.logical_bytes[d]
                or tuple(w + dcmd for w in prog.waits[c]) != tuple(prog.waits[d])):
            return f"command #{d} is not command #{c} one period on (label, iter, bytes or waits differ)"
        if not isinstance(a, DmaCmd) and [o.signature for o in a.ops] != [o.signature for o in b.ops]:
            return f"command #{d}'s ops are not command #{c}'s"
        for mine, theirs in ((prog.reads[c], prog.reads[d]), (prog.writes[c], prog.writes[d])):
            if tuple(_move_range(x, regions, p) for x in mine) != tuple(theirs):
                return f"command #{d} touches other bytes than command #{c} one period on"
        s0, s1 = prog.dispatch_seq[c], prog.plan_end[c]
        if prog.plan_end[d] - prog.dispatch_seq[d] != s1 - s0:
            return f"command #{d} has another number of stages than command #{c}"
        for s in range(s0, s1):
            t = s + dseq
            if (kind[s], phase[s], op_kind[s], tile[s], k_tile[s], nbytes[s], dur[s]) != \
                    (kind[t], phase[t], op_kind[t], tile[t], k_tile[t], nbytes[t], dur[t]) \
                    or tuple(q + dseq for q in preds[s]) != tuple(preds[t]) \
                    or _rename(tensor[s], by_name, p) != tensor[t]:
                return f"stage {t} is not stage {s} one period on"
    return None


def _unwritten(prog: Program, regions: Sequence[Strided]) -> str | None:
    """None when no command writes a byte of any strided tensor, else which one does."""
    for c, writes in enumerate(prog.writes):
        for is_tcm, lo, hi in writes:
            for r in regions:
                if not is_tcm and lo < r.end and r.addr < hi:
                    return f"command #{c} writes {r.name}, so its slices are not interchangeable"
    return None


# --- the extrapolated run -----------------------------------------------------------------------------
def _extend(a: np.ndarray, lo: int, hi: int, k: int, delta: int = 0, keep_negative: bool = False) -> np.ndarray:
    """``a[:hi]``, then ``a[lo:hi]`` k times, the m-th shifted by m·delta, then ``a[hi:]`` shifted by k·delta.

    ``keep_negative``: entries < 0 (``iter`` -1) are not shifted.
    """
    a = np.asarray(a)
    block, rest = a[lo:hi], a[hi:]
    if not delta:
        return np.concatenate([a[:hi], np.tile(block, k), rest])
    steps = (np.arange(1, k + 1, dtype=np.int64) * delta)[:, None]
    reps = block[None, :] + steps
    tail = rest + k * delta
    if keep_negative:
        reps = np.where(block[None, :] < 0, block[None, :], reps)
        tail = np.where(rest < 0, rest, tail)
    return np.concatenate([a[:hi], reps.ravel(), tail])


class _Map:
    """Where a stage or command of the full run comes from in the short run."""

    def __init__(self, sh: _Shift, k: int):
        self.sh, self.k = sh, k

    def seq(self, s: int) -> tuple[int, int]:
        """``(short seq, periods shifted)`` of full stage ``s``."""
        sh, k = self.sh, self.k
        if s < sh.seq2:
            return s, 0
        m = min(k, (s - sh.seq2) // sh.dseq + 1)
        return s - m * sh.dseq, m

    def cmd(self, c: int) -> tuple[int, int]:
        sh, k = self.sh, self.k
        if c < sh.cmd2:
            return c, 0
        m = min(k, (c - sh.cmd2) // sh.dcmd + 1)
        return c - m * sh.dcmd, m


class _Preds:
    """The full run's dependencies, computed on demand from the short run's."""

    def __init__(self, short: Sequence[tuple[int, ...]], where: _Map, n: int):
        self._short, self._where, self._n = short, where, n

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, s: int) -> tuple[int, ...]:
        q, m = self._where.seq(int(s))
        shift = m * self._where.sh.dseq
        return tuple(x + shift for x in self._short[q])


class PeriodicTable:
    """The full run's stage table (the columns ``build_op_log`` and ``Bindings`` read), built from the short
    one column by column on first use."""

    def __init__(self, short: Program, where: _Map, regions: dict[str, Strided]):
        self._t, self._where, self._regions = short.table, where, regions
        self._n = len(short.table) + where.k * where.sh.dseq
        self.preds = _Preds(short.table.preds, where, self._n)

    def _ints(self, name: str, delta: int = 0, dtype: type = np.int64) -> np.ndarray:
        sh = self._where.sh
        return _extend(np.asarray(self._t.column(name), dtype), sh.seq1, sh.seq2, self._where.k, delta)

    @cached_property
    def kind(self) -> np.ndarray:
        return self._ints("kind", dtype=np.int8)

    @cached_property
    def engine(self) -> np.ndarray:
        return self._ints("engine", dtype=np.int8)

    @cached_property
    def phase(self) -> np.ndarray:
        return self._ints("phase", dtype=np.int8)

    @cached_property
    def cmd(self) -> np.ndarray:
        return self._ints("cmd", self._where.sh.dcmd)

    @cached_property
    def tile(self) -> np.ndarray:
        return self._ints("tile")

    @cached_property
    def k_tile(self) -> np.ndarray:
        return self._ints("k_tile")

    @cached_property
    def nbytes(self) -> np.ndarray:
        return self._ints("nbytes")

    @cached_property
    def dur(self) -> np.ndarray:
        return self._ints("dur")

    @cached_property
    def op_kind(self) -> pd.Categorical:
        return self._strings("op_kind", None)

    @cached_property
    def tensor(self) -> pd.Categorical:
        return self._strings("tensor", self._regions)

    def _strings(self, name: str, regions: dict[str, Strided] | None) -> pd.Categorical:
        """A string column as a categorical (sorted categories, as ``build_op_log`` makes them), the
        slices of ``regions`` renamed p tiles on per inserted period; each distinct name renamed once."""
        sh, k = self._where.sh, self._where.k
        col = list(self._t.column(name))
        cats = sorted(set(col))
        index = {c: i for i, c in enumerate(cats)}
        codes = np.fromiter((index[x] for x in col), dtype=np.int64, count=len(col))
        block, rest = codes[sh.seq1:sh.seq2], codes[sh.seq2:]
        names = list(cats)

        def moved(src: np.ndarray, tiles: int) -> np.ndarray:
            if not regions:
                return src
            table = np.zeros(len(cats), np.int64)
            for i in np.unique(src).tolist():
                new = _rename(cats[i], regions, tiles)
                j = index.get(new)
                if j is None:
                    j = index[new] = len(names)
                    names.append(new)
                table[i] = j
            return table[src]

        full = np.concatenate([codes[:sh.seq2]] + [moved(block, m * sh.p) for m in range(1, k + 1)]
                              + [moved(rest, k * sh.p)])
        order = sorted(range(len(names)), key=names.__getitem__)
        rank = np.empty(len(names), np.int64)
        rank[order] = np.arange(len(names))
        return pd.Categorical.from_codes(rank[full].astype(np.int32), categories=[names[i] for i in order],
                                         validate=False)

    def __len__(self) -> int:
        return self._n

    def describe(self, seq: int) -> str:
        return (f"seq {seq}: {StageKind(int(self.kind[seq])).name} cmd {int(self.cmd[seq])} {self.op_kind[seq]} "
                f"tile {int(self.tile[seq])} k {int(self.k_tile[seq])} {self.tensor[seq]}")

    def __repr__(self) -> str:
        return f"PeriodicTable({len(self)} stages)"


class _PerCommand:
    """A per-command list of the full run (labels, waits), each entry read from the short run's."""

    def __init__(self, short: Sequence[Any], where: _Map, shift: Callable[[Any, int], Any]):
        self.short, self._where, self._shift = short, where, shift
        self._n = len(short) + where.k * where.sh.dcmd

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, c: int) -> Any:
        if not -self._n <= c < self._n:
            raise IndexError(c)
        c, m = self._where.cmd(c % self._n)
        return self._shift(self.short[c], m)

    def __iter__(self):
        return (self[c] for c in range(self._n))


class LazyCommands:
    """The full run's commands: the count at once, the command objects only when asked for (emitting the
    whole program, which is what the steady state avoids)."""

    def __init__(self, n: int, build: Callable[[], Sequence[Any]]):
        self._n, self._build, self._cmds = n, build, None

    def _all(self) -> Sequence[Any]:
        if self._cmds is None:
            self._cmds = self._build()
        return self._cmds

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i: Any) -> Any:
        return self._all()[i]

    def __iter__(self):
        return iter(self._all())

    def __repr__(self) -> str:
        return f"LazyCommands({self._n} commands{'' if self._cmds is None else ', built'})"


class PeriodicProgram:
    """The full run's program, as much as the analysis reads, built from the short program.

    ``commands`` is lazy (the full emission); :meth:`full` emits and schedules
    the whole program (what ``analysis.what_if`` re-simulates).
    """

    def __init__(self, short: Program, where: _Map, regions: dict[str, Strided], ncmd: int,
                 full: Callable[[], Program]):
        sh, k = where.sh, where.k
        self.topo = short.topo
        self.table = PeriodicTable(short, where, regions)
        lo, hi = sh.cmd1, sh.cmd2
        self.dispatch_seq = _extend(np.asarray(short.dispatch_seq, np.int64), lo, hi, k, sh.dseq)
        self.plan_seq = self.dispatch_seq + 1
        self.plan_first = self.dispatch_seq + 2
        self.plan_end = _extend(np.asarray(short.plan_end, np.int64), lo, hi, k, sh.dseq)
        self.iters = _extend(np.asarray(short.iters, np.int64), lo, hi, k, sh.p, keep_negative=True)
        self.logical_bytes = _extend(np.asarray(short.logical_bytes, np.int64), lo, hi, k)
        self.labels = _PerCommand(short.labels, where, lambda label, m: label)
        self.waits = _PerCommand(short.waits, where, lambda ws, m: tuple(w + m * sh.dcmd for w in ws))
        self._full = full
        self._program: Program | None = None
        self.commands = LazyCommands(ncmd, lambda: self.full().commands)

    def full(self) -> Program:
        """The whole program, emitted and scheduled (no simulation)."""
        if self._program is None:
            self._program = self._full()
        return self._program

    def __repr__(self) -> str:
        return f"PeriodicProgram({len(self.commands)} commands, {len(self.table)} stages, {self.topo.name})"


def _extend_timeline(short: Timeline, prog: PeriodicProgram, where: _Map) -> Timeline:
    sh, k = where.sh, where.k
    lo, hi = sh.seq1, sh.seq2
    start = _extend(short.start, lo, hi, k, sh.dt)
    end = _extend(short.end, lo, hi, k, sh.dt)
    ready = _extend(short.ready, lo, hi, k, sh.dt)
    unit = _extend(short.unit, lo, hi, k)
    done = _extend(short.done, sh.cmd1, sh.cmd2, k, sh.dt)
    # holds: those of commands before b2 as they are, the period's again per inserted period, the rest shifted
    held, release = short.held, short.release
    lo_h, hi_h = np.searchsorted(held, [sh.cmd1, sh.cmd2])
    held_f = _extend(held, lo_h, hi_h, k, sh.dcmd)
    release_f = _extend(release, lo_h, hi_h, k, sh.dt)
    if len(short.hit_ptr) == len(held) + 1:  # rw_aware: what each hold waited for
        counts_f = _extend(np.diff(short.hit_ptr), lo_h, hi_h, k)
        hit_ptr = np.zeros(len(counts_f) + 1, np.int64)
        np.cumsum(counts_f, out=hit_ptr[1:])
        hit = _extend(short.hit, short.hit_ptr[lo_h], short.hit_ptr[hi_h], k, sh.dcmd)
    else:  # strict FIFO waits for every earlier command and keeps no lists
        hit_ptr, hit = short.hit_ptr, short.hit
    d = prog.dispatch_seq
    strict = prog.topo.hazard_policy == "strict_fifo"
    waited = []
    if any(prog.waits.short):  # tl.wait: when each waiting DISPATCH could go (none in decode)
        waited = [(c, int(done[list(ws)].max())) for c, ws in enumerate(prog.waits) if ws]
    front = _front_end(prog, d, start, end, done, held_f, release_f, strict, waited)
    ready[d] = np.maximum(np.maximum(front.d_order, front.d_queue), front.d_wait)
    ready[d + 1] = np.maximum(np.maximum(front.p_dependency, front.p_order), front.p_scheduler)
    return Timeline(short.engines, start, end, ready, unit, done, held_f, release_f, hit_ptr, hit, front)


class SteadyRun(Run):
    """A timing-mode :class:`Run` computed by the steady state: a short run with whole periods inserted.

    Everything reads as the full run's: ``cycles``, ``n_stages``, ``program``
    (a :class:`PeriodicProgram`), ``commands`` (lazy), ``timeline`` and the
    ``op_log``, ``critical_path()``, ``holds()`` and the analysis on them
    (built on first access). ``steady_state`` says how it was computed;
    ``short`` is the run that was simulated.
    """

    def __init__(self, short: Run, where: _Map, regions: dict[str, Strided], state: SteadyState,
                 loop: LoopProgram, n_tiles: int):
        sh, k = where.sh, where.k
        self._loop, self._n_tiles = loop, n_tiles
        self.sim = short.sim
        self.topology = short.topology
        self.mode = short.mode
        self.short = short
        self.steady_state = state
        self._where = where
        self._regions = regions
        self.program = PeriodicProgram(short.program, where, regions, len(short.program.commands) + k * sh.dcmd,
                                       self._emit_full)
        self._timeline: Timeline | None = None
        self._n = len(short.timeline.end) + k * sh.dseq
        self.cycles = short.cycles + k * sh.dt
        self._hbm_names, self._tcm_names, self._tcm = short._hbm_names, {}, short._tcm
        self._index, self._snapshot = short._index, ()
        self._op_log = None
        self._bindings = None
        self.timings = dict(short.timings)

    def _emit_full(self) -> Program:
        return self._loop.emit(self._n_tiles)

    @property
    def timeline(self) -> Timeline:
        if self._timeline is None:
            self._timeline = _extend_timeline(self.short.timeline, self.program, self._where)
        return self._timeline

    @property
    def _start(self) -> np.ndarray:
        return self.timeline.start

    @property
    def _end(self) -> np.ndarray:
        return self.timeline.end

    @property
    def n_stages(self) -> int:
        return self._n

    @property
    def bindings(self):
        """As :attr:`Run.bindings`, told that the inserted periods repeat (the critical path copies them)."""
        if self._bindings is None:
            b = super().bindings
            sh, k = self._where.sh, self._where.k
            # stages whose schedule and whose copy a period earlier are both inside the repeated
            # stretch, with a period's margin at each end for what a binding looks back at
            b.period = (sh.dseq, sh.seq1 + 2 * sh.dseq, sh.seq2 + (k - 1) * sh.dseq)
        return self._bindings

    def with_durations(self, durations: Callable[[Program], list[int]]) -> Run:
        """The same run with every stage's duration replaced by ``durations(program)`` (applied to each
        program simulated), by the steady state again when a period is proven, else in full."""
        loop = replace(self._loop, durations=durations)
        run, state = run_steady(loop, self._n_tiles)
        if run is None:
            run = loop.run(self._n_tiles)
            run.steady_state = state
        return run

    def dispatch_cycles(self) -> np.ndarray:
        """PE_CPU cycles of each command's DISPATCH (the short run's, the period's repeated)."""
        sh, k = self._where.sh, self._where.k
        return _extend(self.short.dispatch_cycles(), sh.cmd1, sh.cmd2, k)

    def __repr__(self) -> str:
        return (f"Run(timing, {len(self.program.commands)} commands, {self._n} stages, {self.cycles} cycles = "
                f"{self.topology.cycles_to_us(self.cycles):.3f} us; steady state, {self.steady_state.inserted} "
                f"periods inserted)")


# --- the procedure ------------------------------------------------------------------------------------
@dataclass
class LoopProgram:
    """How to build the program of a tile loop at any length, for :func:`run_steady`.

    ``launch(n_tiles, snapshots, durations)`` runs it in timing mode, filling
    ``snapshots`` (command id -> ``Snapshot``); ``emit(n_tiles)`` emits and
    schedules it without simulating. ``boundaries(n_tiles)`` are the command
    ids of each loop iteration's first command (iteration j at index j), and
    ``tail(n_tiles)`` is the first command that is not a regular iteration's;
    the proof checks the program against both. ``regions(run)`` are the
    strided read-only tensors of a run.
    """

    launch: Callable[..., Run]
    emit: Callable[[int], Program]
    boundaries: Callable[[int], list[int]]
    tail: Callable[[int], int]
    regions: Callable[[Run], list[Strided]]
    min_tiles: int = MIN_TILES
    #: ``durations(program)`` replaces every stage's duration in each run (``analysis.what_if``)
    durations: Callable[[Program], list[int]] | None = None

    def run(self, n_tiles: int, snapshots: dict | None = None) -> Run:
        return self.launch(n_tiles, snapshots, self.durations)


def run_steady(loop: LoopProgram, n: int) -> tuple[Run | None, SteadyState]:
    """The run of ``n`` tiles by the steady state, or ``(None, why not)`` when it must run in full.

    A short probe looks for the period first, a longer one (up to
    :data:`PROBE_TILES` tiles) if that finds none. When a probe already is
    the whole run and no period helps, that full run is returned with the
    reason.
    """
    if n < loop.min_tiles:
        return None, SteadyState("full", f"{n} tiles: fewer than {loop.min_tiles}, a full run is as cheap")
    found: tuple[int, int] | str = "no probe ran"
    for size in (FIRST_PROBE_TILES, PROBE_TILES):
        probe_n = min(n, size)
        snaps: dict[int, Snapshot | None] = dict.fromkeys(loop.boundaries(probe_n))
        probe = loop.run(probe_n, snaps)
        whole = probe if probe_n == n else None
        margin = _margin(loop, probe, probe_n)
        found = _find_period(loop, probe, probe_n, snaps, margin)
        if not isinstance(found, str) or probe_n == n:
            break
    if isinstance(found, str):
        return whole, SteadyState("full", found)
    b1, p = found
    # the short program: the prefix, two proven periods, the margin before the tail, n_s = n (mod p);
    # the probe itself when it is long enough and congruent
    need = b1 + 2 * p + 1 + margin
    n_s = probe_n if probe_n >= need and (n - probe_n) % p == 0 else need + (n - need) % p
    for _ in range(4):  # a period more each time the prefix is still in flight when the tail starts
        if n_s >= n:
            return whole, SteadyState("full", f"the short program ({n_s} tiles) would not be shorter than the run")
        if n_s == probe_n:
            short, short_snaps = probe, snaps
        else:
            short_snaps = dict.fromkeys(loop.boundaries(n_s))
            short = loop.run(n_s, short_snaps)
        result = _prove(loop, short, n_s, short_snaps, b1, p)
        if isinstance(result, _Shift):
            break
        if result != _IN_FLIGHT:
            return whole, SteadyState("full", result)
        n_s += p
    else:
        return whole, SteadyState("full", _IN_FLIGHT)
    k = (n - n_s) // p
    where = _Map(result, k)
    regions = {r.name: r for r in loop.regions(short)}
    state = SteadyState("steady", period=p, from_tile=b1, period_cycles=result.dt, short_tiles=n_s, inserted=k)
    return SteadyRun(short, where, regions, state, loop, n), state


_IN_FLIGHT = "commands before the second boundary were still in flight when the tail's first DISPATCH started"


def _margin(loop: LoopProgram, run: Run, n: int) -> int:
    """Whole tiles the short program keeps between its second boundary's period and the tail:
    ``max(cmd_queue_depth, edge reach)`` commands, rounded up."""
    bounds = loop.boundaries(n)
    per_tile = bounds[1] - bounds[0] if len(bounds) > 1 else 1
    margin = max(run.program.topo.cmd_queue_depth, run.program.edge_reach())
    return -(-margin // per_tile)


def _find_period(loop: LoopProgram, run: Run, n: int, snaps: dict, margin: int) -> tuple[int, int] | str:
    """The earliest boundary b1 and shortest period p with equivalent states at b1 and b1 + p, leaving
    room for a further period and the margin before the tail; or why none was found."""
    bounds = loop.boundaries(n)
    prog = run.program
    reach = prog.edge_reach()
    regions = loop.regions(run)
    tail = loop.tail(n)
    for b1 in range(1, len(bounds)):
        a = snaps.get(bounds[b1])
        first = min(a.first_incomplete, a.cmd - reach - 1) if a is not None else -1
        if first < bounds[0]:
            continue  # the state still refers to the prologue, which no later boundary repeats
        for p in range(1, MAX_PERIOD + 1):
            b2 = b1 + p
            if b2 + p + margin + 1 > n:
                break
            b = snaps.get(bounds[b2])
            # equal states, and the same commands after them (the footprints of those in flight included)
            if b is not None and _equivalent(a, b) and \
                    _periodic(run, first, tail - (b.cmd - a.cmd), b.cmd - a.cmd, b.seq - a.seq, p, regions) is None:
                return b1, p
    return f"no period of up to {MAX_PERIOD} tiles proven within the first {n} tiles"


def _prove(loop: LoopProgram, run: Run, n: int, snaps: dict, b1: int, p: int) -> _Shift | str:
    """Every check of the module docstring on the short run; the shift, or what failed."""
    prog = run.program
    bounds = loop.boundaries(n)
    tail = loop.tail(n)
    b2 = b1 + p
    if b2 >= len(bounds):
        return "the short program is too short for two boundaries"
    a, b = snaps.get(bounds[b1]), snaps.get(bounds[b2])
    if a is None or b is None or not _equivalent(a, b):
        return f"the states at tiles {b1} and {b2} of the short program are not equivalent"
    sh = _Shift(b1, b2, a.cmd, b.cmd, a.seq, b.seq, b.t - a.t)
    reach = prog.edge_reach()
    if tail - sh.cmd2 < sh.dcmd + max(prog.topo.cmd_queue_depth, reach):
        return "too few commands between the second boundary and the tail"
    regions = loop.regions(run)
    why = _unwritten(prog, regions)
    if why is not None:
        return why
    first = min(a.first_incomplete, sh.cmd1 - reach - 1)
    if first < bounds[0]:
        return f"the state at tile {b1} still refers to the commands before the loop"
    why = _periodic(run, first, tail - sh.dcmd, sh.dcmd, sh.dseq, p, regions)
    if why is not None:
        return why
    tl = run.timeline
    if sh.cmd2 and int(tl.done[:sh.cmd2].max()) > int(tl.start[prog.dispatch_seq[tail]]):
        return _IN_FLIGHT
    return sh
