"""kbwork — a research workbench for kernels on an AHBM processing element.

Public surface (DESIGN.md §10): :func:`load_topology`, :class:`Simulator`,
:class:`Run`, the error family, and the submodules ``decode``, ``plots``,
``widgets`` as they land.
"""

from .config import Topology, load_topology
from .errors import (CapacityError, ConfigError, FileError, KbworkError, SimulationError, TcmOverflowError,
                     TraceError, ValidationError)
from .memory import Handle, Space
from .pe.commands import Completion, CompositeCmd, DmaCmd, OpSpec, Scope
from .sim import DeviceRun, Launch, Run, Simulator


def clear_caches() -> None:
    """Empty the simulator's one cache (the scheduler's plan templates, ``kbwork.pe.templates.PLAN_CACHE``).

    Results never depend on it; a run after clearing is slower, not different.
    """
    from .pe.templates import PLAN_CACHE

    PLAN_CACHE.clear()


def __getattr__(name: str):
    """``kbwork.decode`` (``plots``, ``model``, ...) before it is imported: an AttributeError that says how.

    The package root imports only the simulator's surface (it ranks with ``sim``, DESIGN §9, and so
    ``import kbwork`` loads neither matplotlib nor the widgets); the layers above it are imported by name.
    """
    if not name.startswith("_"):
        from importlib.util import find_spec

        if find_spec(f"{__name__}.{name}") is not None:
            raise AttributeError(f"module 'kbwork' has no attribute {name!r} until the submodule is imported: "
                                 f"`import kbwork.{name}` or `from kbwork import {name}`.", name=name, obj=None)
    raise AttributeError(f"module 'kbwork' has no attribute {name!r}", name=name, obj=None)


__version__ = "0.1.0"

__all__ = ["Topology", "load_topology", "Simulator", "Run", "Launch", "DeviceRun", "Handle", "Space", "OpSpec", "Scope",
           "CompositeCmd", "DmaCmd", "Completion", "KbworkError", "ConfigError", "ValidationError",
           "TcmOverflowError", "SimulationError", "FileError", "TraceError", "CapacityError", "clear_caches"]
