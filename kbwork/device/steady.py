"""The exact steady state of ``tl.range`` loops (DESIGN.md §12), and running a program through the event loop.

(The proof and the insertion are filled in below; :func:`simulate_program` is what a run calls.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import ValidationError
from ..pe.engines import DataExecutor
from ..pe.scheduler import Program, Schedule
from .loop import new_pe, run
from .records import Timeline, schedule_of, timeline_of


def check_steady_state(value: Any, where: str) -> None:
    """Refuse anything but ``True`` or ``False`` for ``steady_state=`` (DESIGN.md §12).

    Raises:
        ValidationError: naming ``where`` and the value.
    """
    if value is not True and value is not False:
        raise ValidationError(f"{where}: steady_state must be True or False, got {value!r} "
                              f"({type(value).__name__}).")


@dataclass(frozen=True)
class SteadyState:
    """Which path a run took (``run.steady_state``).

    ``path`` is ``"steady"`` (some loop's remaining periods were inserted) or
    ``"full"`` (every stage simulated; ``reason`` says why). ``period`` is the
    proven period in iterations (or None), ``proven_at`` the iteration at
    which the proof closed (or None).
    """

    path: str
    period: int | None = None
    proven_at: int | None = None
    reason: str | None = None
    inserted: int = 0

    def __repr__(self) -> str:
        if self.path == "steady":
            return (f"SteadyState(steady: period {self.period} iterations, proven at iteration {self.proven_at}, "
                    f"{self.inserted} periods inserted)")
        return f"SteadyState(full: {self.reason})"


def simulate_program(prog: Program, memory=None, *, steady_state: bool = True,
                     why_full: str = "steady_state=False") -> tuple[Timeline, Schedule, SteadyState]:
    """Run ``prog`` through the event loop (with the data-mode executor when ``memory`` is given)."""
    pe = new_pe(prog)
    if memory is not None:
        executor = DataExecutor(memory)
        with executor.quiet():
            run(pe, executor.apply)
    else:
        run(pe)
    sched = schedule_of(pe, prog.trace.commands, prog.loops)
    return timeline_of(pe, sched), sched, SteadyState("full", reason=why_full)
