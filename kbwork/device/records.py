"""What a run of the event loop leaves behind: the stage records (:class:`Timeline`) and the schedule it lowered.

The loop records, besides every stage's start and end:

* ``ready`` of every stage: the cycle from which only its engine kept it
  waiting. For a plan stage, the instant its last unmet constraint cleared
  (its dependencies ended and its command was released). For DISPATCH, the
  later of the previous DISPATCH's start, the time its queue slot was free
  (for command c >= depth, the depth-th latest completion among commands
  0..c-1) and its ``tl.wait`` completions. For PLAN, the later of its
  DISPATCH's end, the previous PLAN's start and the release of a held
  command the scheduler was blocked behind. A stage starts at ``ready``
  unless its engine (for DMA, every channel) is busy then.
* the unit each stage ran on (which DMA channel);
* every hazard hold: the held command, the cycle its hold was released and,
  under ``rw_aware``, the commands it waited for.

DISPATCH and PLAN ``ready`` are computed here, from the whole arrays, as the
loop would have (:func:`front_end`): that way a run assembled from a
simulated stretch and inserted periods (the steady state) gets them right.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple, Sequence

import numpy as np

from ..pe.scheduler import Schedule
from ..pe.stages import EngineSpec
from .loop import PeState


class FrontEnd(NamedTuple):
    """Per command, the cycle each constraint of its DISPATCH and PLAN clears (-1: no such constraint).

    DISPATCH: ``d_order`` (the previous DISPATCH's start), ``d_queue`` (its
    queue slot is free), ``d_wait`` (its ``tl.wait`` completions), ``d_launch``
    (the first command of a launch after the first: the cycle the previous
    launch's last stage ended, DESIGN.md §14), ``d_after`` (the first command of a
    launch with ``after`` dependencies: the latest of their ends + ``sync_cycles``,
    DESIGN.md §16; None when no launch has one). PLAN:
    ``p_dependency`` (its DISPATCH's end), ``p_order`` (the previous PLAN's
    start), ``p_scheduler`` (strict FIFO: the release of the latest held
    command before it).
    """

    d_order: np.ndarray
    d_queue: np.ndarray
    d_wait: np.ndarray
    d_launch: np.ndarray
    p_dependency: np.ndarray
    p_order: np.ndarray
    p_scheduler: np.ndarray
    d_after: np.ndarray | None = None


@dataclass(eq=False)
class Timeline:
    """What one run of the event loop produced: int arrays indexed by seq unless said otherwise.

    Attributes:
        engines: the engine table the loop walked (``unit_names(engines)`` names the units).
        start, end: cycles of every stage.
        ready: the cycle from which only its engine kept each stage waiting (module docstring).
        unit: the unit each stage ran on (an index into ``unit_names(engines)``).
        done: per command, the cycle it completed.
        held, release: the held commands, ascending, and the cycle each hold was released.
        hit_ptr, hit: rw_aware: ``held[i]`` waited for the commands
            ``hit[hit_ptr[i]:hit_ptr[i + 1]]``; under strict_fifo (every earlier command) empty.
        front: the DISPATCH and PLAN constraints per command (:class:`FrontEnd`).
    """

    engines: tuple[EngineSpec, ...]
    start: np.ndarray
    end: np.ndarray
    ready: np.ndarray
    unit: np.ndarray
    done: np.ndarray
    held: np.ndarray
    release: np.ndarray
    hit_ptr: np.ndarray
    hit: np.ndarray
    front: FrontEnd

    def __repr__(self) -> str:
        return f"Timeline({len(self.end)} stages, {len(self.held)} holds)"

    @property
    def cycles(self) -> int:
        """The last stage's end (0 for no stage)."""
        return int(self.end.max()) if len(self.end) else 0

    def dispatch_cycles(self, sched: Any) -> np.ndarray:
        """PE_CPU cycles of each DISPATCH of ``sched`` (the schedule this timeline ran), by command."""
        d = np.asarray(sched.dispatch_seq, dtype=np.int64)
        return self.end[d] - self.start[d]


def dispatch_ready(f: FrontEnd) -> np.ndarray:
    """Every DISPATCH's ``ready``: the latest of its constraints."""
    r = np.maximum(np.maximum(np.maximum(f.d_order, f.d_queue), f.d_wait), f.d_launch)
    return r if f.d_after is None else np.maximum(r, f.d_after)


def ints(values: Sequence[int]) -> np.ndarray:
    return np.fromiter(values, dtype=np.int64, count=len(values))


class LazyRows(Sequence):
    """A sequence whose items are made on access, as a list is indexed: ints, negative ints and slices, an
    ``IndexError`` past the end. A subclass gives ``__len__`` and ``_at(i)`` for ``0 <= i < len``. (The records
    of a run that are never built whole: a steady run's or a joined run's dependencies, several launches'
    commands.)"""

    what = "item"

    def _at(self, i: int) -> Any:
        raise NotImplementedError

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self._at(x) for x in range(*i.indices(len(self)))]
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"{self.what} {i} out of range ({n} {self.what}s)")
        return self._at(i)


def front_end(prog, d: np.ndarray, start: np.ndarray, end: np.ndarray, done: np.ndarray, held: np.ndarray,
              release: np.ndarray, strict: bool, waited: Sequence[tuple[int, int]],
              launches: Sequence[tuple[int, int]] = (), afters: Sequence[tuple[int, int]] = ()) -> FrontEnd:
    """The cycles at which each DISPATCH and PLAN constraint clears, per command (see :class:`FrontEnd`).

    ``d`` holds the seq of each command's DISPATCH; its PLAN is the next stage.
    """
    ncmd = len(done)
    p = d + 1
    none = np.full(ncmd, -1, np.int64)
    d_order = none.copy()
    d_order[0:1] = 0                # the first command waits for nothing
    d_order[1:] = start[d[:-1]]
    # Commands >= c cannot complete before DISPATCH c starts, so the (c - depth + 1)-th completion of
    # all commands is that among 0..c-1: the depth-th latest of theirs.
    depth = prog.topo.cmd_queue_depth
    d_queue = none.copy()
    if ncmd > depth:
        d_queue[depth:] = np.sort(done)[:ncmd - depth]
    d_wait = none.copy()
    for c, when in waited:
        d_wait[c] = when
    d_launch = none.copy()
    for c, when in launches:  # (first command of a later launch, the cycle it started)
        d_launch[c] = when
    p_order = none.copy()
    p_order[1:] = start[p[:-1]]
    p_scheduler = none.copy()
    if strict and len(held):
        # strict FIFO plans nothing while a command is held, so PLAN c waits for the release of the
        # latest held command before it (earlier holds were released earlier still)
        latest = np.searchsorted(held, np.arange(ncmd), side="left") - 1
        blocked = latest >= 0
        p_scheduler[blocked] = release[latest[blocked]]
    d_after = None
    if len(afters):
        d_after = none.copy()
        for c, when in afters:  # (first command of a launch with dependencies, the cycle they cleared)
            d_after[c] = when
    return FrontEnd(d_order, d_queue, d_wait, d_launch, end[d], p_order, p_scheduler, d_after)


def schedule_of(pe: PeState, commands: Sequence, loops: tuple = ()) -> Schedule:
    """The schedule ``pe`` lowered while it ran (every command it simulated), as a :class:`Schedule`."""
    return Schedule(pe.cursor.topo, pe.table, pe.ctab, commands, loops, pe.cursor.reach)


def timeline_of(pe: PeState, sched: Schedule) -> Timeline:
    """The :class:`Timeline` of a PE that has run to its end."""
    start, end = ints(pe.start), ints(pe.end)
    ncmd = pe.n_lowered
    done = end[ints(pe.final_stage)] if ncmd else np.zeros(0, np.int64)
    held = ints(pe.held)
    release = ints([pe.release_at[c] for c in pe.held])
    hit_ptr = np.zeros(len(pe.hits) + 1, np.int64)
    np.cumsum([len(h) for h in pe.hits], out=hit_ptr[1:])
    hit = ints([o for h in pe.hits for o in h])
    ready = ints(pe.rdy)
    d = ints(pe.ctab.dispatch_seq)
    front = front_end(sched, d, start, end, done, held, release, pe.strict, pe.waited,
                      list(zip(pe.launch_first, pe.launch_start)), pe.after_at)
    ready[d] = dispatch_ready(front)
    ready[d + 1] = np.maximum(np.maximum(front.p_dependency, front.p_order), front.p_scheduler)
    return Timeline(pe.engines, start, end, ready, np.asarray(pe.unit, np.int16), done, held, release, hit_ptr,
                    hit, front)
