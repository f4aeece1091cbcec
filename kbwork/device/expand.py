"""A steady-state run in the numbering of the full run: the simulated records with the inserted periods in place.

The event loop numbers what it simulates densely: after a jump (:mod:`.steady`)
its seqs, command positions and cycles continue where they were, while the
program moved ``k`` periods on. Every record falls in one of three kinds of
region of an :class:`~kbwork.device.steady.Insertion`: before its block ends
(kept as simulated), one of its ``k`` copies of the block (the block's
records, ``m`` periods on), or after them (the simulated records, ``k``
periods on). What moves with a period:

* numbering — seqs, command positions, cycles — moves in every copy and in
  what follows (``m·dseq``, ``m·dcmd``, ``m·dt``);
* what a command *is* — its id in program order, its iteration and ``iter``
  label, the names its stages carry, its footprint — moves in the copies
  only: what follows the copies was simulated in its own iterations already
  (the cursor skipped to them).

Everything is built on first use, column by column, so a run of a million
iterations costs its simulated stretch until its op_log is asked for.
Insertions are applied last first (a later one lies at higher positions, so
an earlier one's shift then covers it too).
"""

from __future__ import annotations

from functools import cached_property
from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd

from ..errors import SimulationError
from ..memory import LoopHandle
from ..pe.commands import DmaCmd
from ..pe.program import Loop
from ..pe.scheduler import Program, Schedule, _spans_at
from ..pe.stages import RawStageTable
from ..pe.tiling import generate_plan_from_ops
from ..symbolic import Index
from .records import FrontEnd, LazyRows, Timeline, dispatch_ready, front_end


def _grow(a: np.ndarray, ins: Sequence, lo: Callable, hi: Callable, delta: Callable, moves_rest: bool = True,
          copy: Callable[[np.ndarray, Any, int], np.ndarray] | None = None) -> np.ndarray:
    """``a`` (indexed by simulated position) with every insertion's block ``a[lo:hi]`` repeated ``k`` times at
    ``hi``, the m-th copy shifted by ``m·delta`` (or made by ``copy(block, insertion, m)``), and what follows
    shifted by ``k·delta`` when ``moves_rest``."""
    for x in reversed(ins):
        l, h, k, d = lo(x), hi(x), x.k, delta(x)
        block, rest = a[l:h], a[h:]
        if copy is not None:
            reps = [copy(block, x, m) for m in range(1, k + 1)]
        elif d:
            reps = [(block[None, :] + (np.arange(1, k + 1, dtype=np.int64) * d)[:, None]).ravel()]
        else:
            reps = [np.tile(block, k)]
        a = np.concatenate([a[:h], *reps, rest + k * d if moves_rest and d else rest])
    return a


def _seq(x) -> tuple[int, int]:
    return x.s1, x.s2


def _cmd(x) -> tuple[int, int]:
    return x.c1, x.c2


def _grow_list(a: list, ins: Sequence, lo: Callable, hi: Callable, copy: Callable[[list, Any, int], list]) -> list:
    """:func:`_grow` for a list of objects: each copy made by ``copy(block, insertion, m)``, the rest kept."""
    for x in reversed(ins):
        l, h = lo(x), hi(x)
        block = a[l:h]
        out = a[:h]
        for m in range(1, x.k + 1):
            out += copy(block, x, m)
        a = out + a[h:]
    return a


#: The most stages a per-stage table of a steady-state run may be made for (the op_log, the critical path,
#: utilisation; a table of this many rows takes a few GiB). The steady state times longer runs without making
#: their stages, and their cycles, steady state and dispatch cycles need no table.
MAX_TABLE_STAGES = 1 << 26


class Expansion:
    """The insertions of one run and how a simulated position maps to the full run's (module docstring)."""

    def __init__(self, prog: Program, sched: Schedule, insertions: Sequence):
        self.prog, self.sched, self.ins = prog, sched, tuple(insertions)
        self.n_stages = len(sched.table) + sum(x.k * x.dseq for x in self.ins)
        self.n_cmds = len(sched.ctab) + sum(x.k * x.dcmd for x in self.ins)
        # where each insertion's copies start in the full run (seq, command, cycle), and the shifts after them
        self._real = []
        ds = dc = dt = 0
        for x in self.ins:
            self._real.append((x.s2 + ds, x.c2 + dc, ds, dc, dt))
            ds, dc, dt = ds + x.k * x.dseq, dc + x.k * x.dcmd, dt + x.k * x.dt
        self.dt_total = dt

    def periods(self) -> list[tuple[int, int, int]]:
        """``(dseq, lo, hi)`` per insertion: stages lo..hi-1 of the full run and their copies a period earlier
        both lie in the repeated stretch, with a period's margin at each end for what a binding looks back at
        (what ``Bindings`` copies the critical path over)."""
        out = []
        for x, (rs2, _, ds0, _, _) in zip(self.ins, self._real):
            out.append((x.dseq, x.s1 + ds0 + 2 * x.dseq, rs2 + (x.k - 1) * x.dseq))
        return out

    def stage(self, s: int) -> tuple[int, int, int, int]:
        """``(simulated seq, seq shift, command shift, cycle shift)`` of stage ``s`` of the full run."""
        q, ds, dc, dt = s, 0, 0, 0
        for x, (rs2, _, ds0, dc0, dt0) in zip(self.ins, self._real):
            if s < rs2:
                break
            m = (s - rs2) // x.dseq + 1
            if m <= x.k:
                return s - ds0 - m * x.dseq, ds0 + m * x.dseq, dc0 + m * x.dcmd, dt0 + m * x.dt
            q, ds, dc, dt = s - ds0 - x.k * x.dseq, ds0 + x.k * x.dseq, dc0 + x.k * x.dcmd, dt0 + x.k * x.dt
        return q, ds, dc, dt

    def real_cmd(self, c: int) -> int:
        """The full run's position of simulated command ``c`` (one the event loop simulated)."""
        return c + sum(x.k * x.dcmd for x in self.ins if c >= x.c2)

    def waits(self, sim_waits: Sequence[tuple[int, ...]]) -> list[tuple[int, ...]]:
        """Every command's ``tl.wait`` targets in the full run's numbering. A copy's command waits on the same
        iteration's commands, so on the copy's own; a target outside the block (before the loop) stays."""
        out: list[tuple[int, ...]] = []
        ins = sorted(self.ins, key=lambda x: x.c2)
        nxt = 0
        for c, ws in enumerate(sim_waits):
            while nxt < len(ins) and ins[nxt].c2 == c:
                x = ins[nxt]
                nxt += 1
                block = sim_waits[x.c1:x.c2]
                if not any(block):
                    out += [()] * (x.k * x.dcmd)
                    continue
                for m in range(1, x.k + 1):
                    out += [tuple(self.real_cmd(w) + m * x.dcmd if x.c1 <= w < x.c2 else self.real_cmd(w)
                                  for w in b) for b in block]
            out.append(tuple(self.real_cmd(w) for w in ws) if ws else ())
        for x in ins[nxt:]:  # an insertion ending the simulated commands (nothing simulated after it)
            out += [()] * (x.k * x.dcmd) if not any(sim_waits[x.c1:x.c2]) else \
                [tuple(self.real_cmd(w) + m * x.dcmd if x.c1 <= w < x.c2 else self.real_cmd(w) for w in b)
                 for m in range(1, x.k + 1) for b in sim_waits[x.c1:x.c2]]
        return out

    # --- arrays in the full run's numbering -------------------------------------------------------------
    def stages(self, a: Sequence, delta: str | None = None) -> np.ndarray:
        """A per-stage column in the full run's numbering; ``delta`` is what its values are: ``"seq"``,
        ``"cmd"``, ``"t"`` (they move with each period) or None (they do not)."""
        self.check_size()
        arr = np.asarray(a)
        return _grow(arr, self.ins, lambda x: x.s1, lambda x: x.s2, _delta(delta))

    def check_size(self) -> None:
        """Refuse to make per-stage tables of a run longer than :data:`MAX_TABLE_STAGES`.

        Raises:
            SimulationError: naming the stage count and what needs no table.
        """
        if self.n_stages > MAX_TABLE_STAGES:
            raise SimulationError(
                f"this run has {self.n_stages:,} stages, which the steady state timed without making them; a "
                f"per-stage table (the op_log, the critical path, utilisation, a trace file) is made for at most "
                f"{MAX_TABLE_STAGES:,}. run.cycles, run.steady_state and run.dispatch_cycles() need none; for "
                f"the rest, run fewer tl.range iterations.")

    def commands(self, a: Sequence, delta: str | None = None, in_copies_only: bool = False) -> np.ndarray:
        """A per-command column in the full run's numbering (``in_copies_only``: the values move in the copies,
        not in what follows them — what a command *is*)."""
        arr = np.asarray(a)
        return _grow(arr, self.ins, lambda x: x.c1, lambda x: x.c2, _delta(delta), moves_rest=not in_copies_only)


def _delta(kind: str | None) -> Callable:
    if kind is None:
        return lambda x: 0
    if kind == "seq":
        return lambda x: x.dseq
    if kind == "cmd":
        return lambda x: x.dcmd
    if kind == "t":
        return lambda x: x.dt
    if kind == "real":  # a command's id in program order: a period is p iterations of its loop's commands
        return lambda x: x.p * len(x.loop.body)
    raise ValueError(kind)


def _stage_names(prog: Program, loop: Loop, k: int, i: int) -> list[str]:
    """The op_log ``tensor`` of every stage of body command ``k`` in iteration ``i`` (DISPATCH and PLAN first)."""
    bc = prog.body_command(loop, k)
    if bc.template is not None:
        hn = [h.name_at(i) if h.__class__ is LoopHandle else h.name for h in bc.paths]
        tpl = bc.template.plan
        names = [t if t.__class__ is str else "|".join([hn[x] for x in t]) for t in tpl.tensors] + [""]
        return [names[x] for x in bc.template.tensor]
    return command_stage_names(prog, loop.command(i, k))


def command_stage_names(prog: Program, cmd: Any) -> list[str]:
    """The op_log ``tensor`` of every stage of the concrete command ``cmd`` (DISPATCH and PLAN first), planned
    again from the command itself."""
    if isinstance(cmd, DmaCmd):
        hbm = cmd.src if cmd.src.space.value == "hbm" else cmd.dst
        return ["", "", hbm.name]
    table = RawStageTable()
    generate_plan_from_ops(cmd, prog.topo, table, None, prog.latency, after=(0,))
    return ["", ""] + list(table.tensor)


def label_at(bc: Any, i: int) -> str:
    """The label of loop body command ``bc`` in iteration ``i``: a default DMA label names that iteration's rows
    ("dma_load K[256:384]"), any other is the body's."""
    if isinstance(bc, DmaCmd) and bc.auto_label is not None:
        src = bc.src
        return bc.auto_label + (src.name_at(i) if isinstance(src, LoopHandle) else src.name)
    return bc.label


class ExpandedTable:
    """The full run's stage table (the columns the op_log and the analysis read), built on first use."""

    def __init__(self, ex: Expansion):
        self._ex = ex
        self._t = ex.sched.table

    def __len__(self) -> int:
        return self._ex.n_stages

    def __repr__(self) -> str:
        return f"ExpandedTable({len(self)} stages, {len(self._t)} simulated)"

    def _col(self, name: str, delta: str | None = None, dtype: Any = np.int64) -> np.ndarray:
        return self._ex.stages(np.asarray(getattr(self._t, name), dtype), delta)

    kind = cached_property(lambda self: self._col("kind", dtype=np.int8))
    engine = cached_property(lambda self: self._col("engine", dtype=np.int8))
    phase = cached_property(lambda self: self._col("phase", dtype=np.int8))
    cmd = cached_property(lambda self: self._col("cmd", "cmd"))
    tile = cached_property(lambda self: self._col("tile"))
    k_tile = cached_property(lambda self: self._col("k_tile"))
    nbytes = cached_property(lambda self: self._col("nbytes"))
    dur = cached_property(lambda self: self._col("dur"))
    chan = cached_property(lambda self: self._col("chan"))

    @cached_property
    def op_kind(self) -> pd.Categorical:
        c = pd.Categorical(self._t.op_kind)
        return pd.Categorical.from_codes(self._ex.stages(c.codes.astype(np.int32)), categories=c.categories,
                                         validate=False)

    @cached_property
    def tensor(self) -> pd.Categorical:
        """Names: the simulated ones, and in each copy the names of its own iterations."""
        ex, ctab = self._ex, self._ex.sched.ctab
        ex.check_size()
        col = list(self._t.tensor)

        def copy(block: list, x, m: int) -> list:
            out: list[str] = []
            prog = x.prog or ex.prog
            for c in range(x.c1, x.c2):
                out += _stage_names(prog, x.loop, ctab.body[c], ctab.iteration[c] + m * x.p)
            return out
        names = _grow_list(col, ex.ins, lambda x: x.s1, lambda x: x.s2, copy)
        return pd.Categorical(names)

    @property
    def preds(self) -> "_ExpandedPreds":
        return _ExpandedPreds(self._ex)

    def column(self, name: str) -> Any:
        return getattr(self, name)

    def describe(self, s: int) -> str:
        q = self._ex.stage(s)[0]
        return f"seq {s} (simulated as {q}): " + self._t.describe(q).split(": ", 1)[1]


class _ExpandedPreds(LazyRows):
    """Every stage's dependencies in the full run, made on access from the simulated ones."""

    what = "stage"

    def __init__(self, ex: Expansion):
        self._ex = ex
        self._p = ex.sched.table.preds

    def __len__(self) -> int:
        return self._ex.n_stages

    def _at(self, s: int) -> tuple[int, ...]:
        q, ds, _, _ = self._ex.stage(s)
        return tuple(p + ds for p in self._p[q])


class _CommandColumn(Sequence):
    """A per-command column of the full run, made on first use (ints, negative ints and slices)."""

    def __init__(self, make: Callable[[], Sequence]):
        self._make, self._v = make, None

    def _all(self) -> Sequence:
        if self._v is None:
            self._v = self._make()
        return self._v

    def __len__(self) -> int:
        return len(self._all())

    def __getitem__(self, i: Any) -> Any:
        return self._all()[i]

    def __iter__(self):
        return iter(self._all())

    def __array__(self, dtype=None, copy=None):
        return np.asarray(self._all(), dtype=dtype)


class ExpandedSchedule:
    """The full run's schedule (as :class:`~kbwork.pe.scheduler.Schedule` reads), from the simulated one."""

    def __init__(self, prog: Program, sched: Schedule, ins: Sequence):
        self._ex = ex = Expansion(prog, sched, ins)
        self.topo, self.loops, self.reach = sched.topo, sched.loops, sched.reach
        self.commands = sched.commands
        self.table = ExpandedTable(ex)
        ct = sched.ctab
        self.dispatch_seq = _CommandColumn(lambda: ex.commands(ct.dispatch_seq, "seq"))
        self.plan_end = _CommandColumn(lambda: ex.commands(ct.plan_end, "seq"))
        self.logical_bytes = _CommandColumn(lambda: ex.commands(ct.logical_bytes))
        # the columns' makers see the expansion, never this object: a column holding its schedule would make
        # a reference cycle, and a dropped run would wait for the cyclic collector instead of being freed
        cls = type(self)
        self.labels = _CommandColumn(lambda: cls._labels(ex))
        self.iters = _CommandColumn(lambda: cls._iters(ex))
        self.waits = _CommandColumn(lambda: ex.waits(ct.waits))
        self.reads = _CommandColumn(lambda: cls._footprints(ex, ct.reads, "reads"))
        self.writes = _CommandColumn(lambda: cls._footprints(ex, ct.writes, "writes"))

    def __repr__(self) -> str:
        return f"Schedule({self._ex.n_cmds} commands, {self._ex.n_stages} stages, {self.topo.name}; steady state)"

    @property
    def simulated(self) -> Schedule:
        """The schedule the event loop simulated (its own numbering), before the periods were inserted."""
        return self._ex.sched

    @property
    def insertions(self) -> tuple:
        """The :class:`~kbwork.device.steady.Insertion` s, in the simulation's numbering."""
        return self._ex.ins

    @property
    def plan_seq(self) -> np.ndarray:
        return np.asarray(self.dispatch_seq) + 1

    @property
    def plan_first(self) -> np.ndarray:
        return np.asarray(self.dispatch_seq) + 2

    def edge_reach(self) -> int:
        return self.reach

    @property
    def n_commands(self) -> int:
        return self._ex.n_cmds

    @property
    def n_stages(self) -> int:
        return self._ex.n_stages

    def periods(self) -> list[tuple[int, int, int]]:
        """The inserted periods (``Expansion.periods``): the critical path repeats over them."""
        return self._ex.periods()

    @staticmethod
    def _iters(ex: Expansion) -> np.ndarray:
        ct = ex.sched.ctab
        iters = np.asarray(ct.iter, np.int64)
        for x in reversed(ex.ins):  # copy m of a block: each command's label moves m·p iterations times its slope
            block = iters[x.c1:x.c2]
            slope = np.array([(it.a if isinstance(it := x.loop.iters[ct.body[c]], Index) else 0)
                              for c in range(x.c1, x.c2)], np.int64)
            steps = np.arange(1, x.k + 1, dtype=np.int64) * x.p
            reps = (block[None, :] + slope[None, :] * steps[:, None]).ravel()
            iters = np.concatenate([iters[:x.c2], reps, iters[x.c2:]])
        return iters

    @staticmethod
    def _labels(ex: Expansion) -> list:
        ct = ex.sched.ctab

        def copy(block: list, x, m: int) -> list:
            out = list(block)
            for j, c in enumerate(range(x.c1, x.c2)):
                bc = x.loop.body[ct.body[c]]
                if isinstance(bc, DmaCmd) and bc.auto_label is not None:  # "dma_load K[256:384]": its own rows
                    out[j] = label_at(bc, ct.iteration[c] + m * x.p)
            return out
        return _grow_list(list(ct.label), ex.ins, lambda x: x.c1, lambda x: x.c2, copy)

    @staticmethod
    def _footprints(ex: Expansion, col: list, which: str) -> list:
        ct = ex.sched.ctab

        def copy(block: list, x, m: int) -> list:
            out = []
            prog = x.prog or ex.prog
            for c in range(x.c1, x.c2):
                bc = prog.body_command(x.loop, ct.body[c])
                out.append(_spans_at(getattr(bc, which), ct.iteration[c] + m * x.p))
            return out
        return _grow_list(list(col), ex.ins, lambda x: x.c1, lambda x: x.c2, copy)


class ExpandedTimeline:
    """The full run's :class:`~kbwork.device.records.Timeline`, each field built on first use."""

    def __init__(self, ex: Expansion, tl: Timeline, sched: ExpandedSchedule, strict: bool,
                 waited: Sequence[tuple[int, int]], launches: Sequence[tuple[int, int]] = (),
                 afters: Sequence[tuple[int, int]] = ()):
        self._ex, self._tl, self._sched, self._strict, self._waited = ex, tl, sched, strict, waited
        self._launches, self._afters = launches, afters
        self.engines = tl.engines
        #: the run's last cycle: the simulated one, every inserted period later (its last stage follows them)
        self.cycles = int(tl.end.max()) + ex.dt_total if len(tl.end) else 0

    def __repr__(self) -> str:
        return f"Timeline({self._ex.n_stages} stages; steady state)"

    @property
    def simulated(self) -> tuple[Timeline, Sequence, Sequence, Sequence]:
        """What :func:`expand` was given: the simulated timeline, the ``tl.wait`` clearances, the later launches'
        first commands and starts, and the ``after`` gates (each in the simulation's numbering)."""
        return self._tl, self._waited, self._launches, self._afters

    def dispatch_cycles(self, sched: Any = None) -> np.ndarray:
        """Each command's DISPATCH cycles in the full run, from the simulated commands' (a copy's are its
        block's): no stage array of the full run is built. (``sched``, the full run's schedule, is not read.)"""
        d = np.asarray(self._ex.sched.ctab.dispatch_seq, dtype=np.int64)
        return self._ex.commands(self._tl.end[d] - self._tl.start[d])

    start = cached_property(lambda self: self._ex.stages(self._tl.start, "t"))
    end = cached_property(lambda self: self._ex.stages(self._tl.end, "t"))
    unit = cached_property(lambda self: self._ex.stages(self._tl.unit))
    done = cached_property(lambda self: self._ex.commands(self._tl.done, "t"))

    @cached_property
    def _holds(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        tl, ex = self._tl, self._ex
        held, release = tl.held, tl.release
        counts = np.diff(tl.hit_ptr) if len(tl.hit_ptr) == len(held) + 1 else None
        for x in reversed(ex.ins):
            lo, hi = np.searchsorted(held, [x.c1, x.c2])
            blk_h, blk_r = held[lo:hi], release[lo:hi]
            parts_h, parts_r = [held[:hi]], [release[:hi]]
            for m in range(1, x.k + 1):
                parts_h.append(blk_h + m * x.dcmd)
                parts_r.append(blk_r + m * x.dt)
            parts_h.append(held[hi:] + x.k * x.dcmd)
            parts_r.append(release[hi:] + x.k * x.dt)
            held, release = np.concatenate(parts_h), np.concatenate(parts_r)
        if counts is None or not len(tl.hit):
            return held, release, tl.hit_ptr, tl.hit
        # rw_aware: what each hold waited for moves with the held command
        hits = np.split(tl.hit, tl.hit_ptr[1:-1]) if len(tl.held) else []
        lists = [h.tolist() for h in hits]
        held0 = tl.held.tolist()
        for x in reversed(ex.ins):
            lo, hi = np.searchsorted(np.asarray(held0), [x.c1, x.c2])
            block = lists[lo:hi]
            out = lists[:hi]
            h_out = held0[:hi]
            for m in range(1, x.k + 1):
                out += [[o + m * x.dcmd for o in h] for h in block]
                h_out += [c + m * x.dcmd for c in held0[lo:hi]]
            out += [[o + x.k * x.dcmd for o in h] for h in lists[hi:]]
            h_out += [c + x.k * x.dcmd for c in held0[hi:]]
            lists, held0 = out, h_out
        ptr = np.zeros(len(lists) + 1, np.int64)
        np.cumsum([len(h) for h in lists], out=ptr[1:])
        return held, release, ptr, np.asarray([o for h in lists for o in h], np.int64)

    held = property(lambda self: self._holds[0])
    release = property(lambda self: self._holds[1])
    hit_ptr = property(lambda self: self._holds[2])
    hit = property(lambda self: self._holds[3])

    @cached_property
    def front(self) -> FrontEnd:
        ex = self._ex
        done = self.done
        # a wait clears at the latest completion it names (in the full run's numbering)
        waited = [(c, max(int(done[w]) for w in ws)) for c, ws in enumerate(self._sched.waits) if ws] \
            if self._waited else []
        d = np.asarray(self._sched.dispatch_seq, np.int64)
        ex = self._ex
        moved = []  # a later launch's first command and start (and a gate's), moved by the periods inserted before
        for pairs in (self._launches, self._afters):
            out = []
            for c, when in pairs:
                dc = dt = 0
                for x in ex.ins:
                    if c >= x.c2:
                        dc, dt = dc + x.k * x.dcmd, dt + x.k * x.dt
                out.append((c + dc, when + dt))
            moved.append(out)
        return front_end(self._sched, d, self.start, self.end, self.done, self.held, self.release, self._strict,
                         waited, moved[0], moved[1])

    @cached_property
    def ready(self) -> np.ndarray:
        r = self._ex.stages(self._tl.ready, "t")
        f = self.front
        d = np.asarray(self._sched.dispatch_seq, np.int64)
        r[d] = dispatch_ready(f)
        r[d + 1] = np.maximum(np.maximum(f.p_dependency, f.p_order), f.p_scheduler)
        return r


def expand(prog: Program, sched: Schedule, tl: Timeline, insertions: Sequence,
           waited: Sequence[tuple[int, int]] = (), launches: Sequence[tuple[int, int]] = (),
           afters: Sequence[tuple[int, int]] = ()) -> tuple[ExpandedSchedule, ExpandedTimeline]:
    """The full run's schedule and timeline, from the simulated ones and the insertions (built lazily)."""
    xs = ExpandedSchedule(prog, sched, insertions)
    return xs, ExpandedTimeline(xs._ex, tl, xs, prog.topo.hazard_policy == "strict_fifo", waited, launches, afters)
