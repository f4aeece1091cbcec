"""kbwork — a research workbench for kernels on an AHBM processing element.

Public surface (DESIGN.md §10): :func:`load_topology`, :class:`Simulator`,
:class:`Run`, the error family, and the submodules ``decode``, ``plots``,
``widgets`` as they land.
"""

from .config import Topology, load_topology
from .errors import (ConfigError, FileError, KbworkError, SimulationError, TcmOverflowError, TraceError,
                     ValidationError)
from .memory import Handle, Space
from .pe.commands import Completion, CompositeCmd, DmaCmd, OpSpec, Scope
from .sim import DeviceRun, Launch, Run, Simulator


def clear_caches() -> None:
    """Empty the simulator's one cache (the scheduler's plan templates, ``kbwork.pe.templates.PLAN_CACHE``).

    Results never depend on it; a run after clearing is slower, not different.
    """
    from .pe.templates import PLAN_CACHE

    PLAN_CACHE.clear()


__version__ = "0.1.0"

__all__ = ["Topology", "load_topology", "Simulator", "Run", "Launch", "DeviceRun", "Handle", "Space", "OpSpec", "Scope",
           "CompositeCmd", "DmaCmd", "Completion", "KbworkError", "ConfigError", "ValidationError",
           "TcmOverflowError", "SimulationError", "FileError", "TraceError", "clear_caches"]
