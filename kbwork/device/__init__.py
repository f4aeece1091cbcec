"""The device side: the event loop over a PE's units, its records, the critical-path walk and the steady state.

``loop`` runs a program stage by stage (lowering commands as it reaches
them); ``records`` turns what it left into arrays (:class:`Timeline`) and the
lowered schedule; ``walk`` finds what bound each stage and the critical
path; ``steady`` proves periodicity at loop boundaries and inserts whole
periods. Nothing here imports the kernel language.
"""

from __future__ import annotations

from typing import Callable, Sequence

from ..pe.scheduler import Schedule
from ..pe.stages import StageTable
from .loop import PeState, new_pe, run, step
from .records import FrontEnd, Timeline, front_end, schedule_of, timeline_of
from .walk import AFTER, CAUSES, DEPENDENCY, ENGINE, HAZARD, LAUNCH, ORDER, QUEUE, SCHEDULER, TIE_ORDER, WAIT, Bindings


def simulate(sched: Schedule, apply: Callable[[object], None] | None = None, edges: list[list[int]] | None = None,
             *, dur: Sequence[int] | None = None) -> Timeline:
    """Run a schedule lowered beforehand (:func:`kbwork.pe.scheduler.schedule`) and return its :class:`Timeline`.

    Args:
        sched: the static schedule.
        apply: data mode: called with each stage's effect when it ends, in (end, seq) order.
        edges: if given (one empty list per stage), receives the dynamic dependencies the run resolved
            (see :func:`.loop.run`).
        dur: every stage's duration in cycles, instead of the stage table's.

    Raises:
        SimulationError: the program deadlocks.
        ValueError: ``dur`` does not have one entry per stage.
    """
    if dur is not None:
        if len(dur) != len(sched.table):
            raise ValueError(f"simulate: dur has {len(dur)} entries; the program has {len(sched.table)} stages.")
        table = StageTable(sched.table.with_effects)
        for name in ("kind", "engine", "phase", "cmd", "op_kind", "tile", "k_tile", "_tensor", "nbytes", "effects",
                     "cbase", "lpreds", "xpreds", "lsucc", "npred", "pending_names"):
            setattr(table, name, getattr(sched.table, name))
        table.dur = list(dur)
        sched = Schedule(sched.topo, table, sched.ctab, sched.commands, sched.loops, sched.reach)
    pe = new_pe(sched)
    run(pe, apply, edges)
    return timeline_of(pe, sched)


__all__ = ["PeState", "new_pe", "run", "step", "simulate", "Timeline", "FrontEnd", "front_end", "schedule_of",
           "timeline_of", "Bindings", "CAUSES", "ENGINE", "DEPENDENCY", "HAZARD", "QUEUE", "WAIT", "SCHEDULER",
           "ORDER", "LAUNCH", "AFTER", "TIE_ORDER"]
