"""kbwork — a research workbench for kernels on an AHBM processing element.

Public surface (DESIGN.md §10): :func:`load_topology`, :class:`Simulator`,
:class:`Run`, the error family, and the submodules ``decode``, ``plots``,
``widgets`` as they land.
"""

from .config import Topology, load_topology
from .errors import ConfigError, KbworkError, SimulationError, TcmOverflowError, ValidationError
from .memory import Handle, Space
from .pe.commands import Completion, CompositeCmd, DmaCmd, OpSpec, Scope
from .sim import Run, Simulator

__version__ = "0.1.0"

__all__ = ["Topology", "load_topology", "Simulator", "Run", "Handle", "Space", "OpSpec", "Scope",
           "CompositeCmd", "DmaCmd", "Completion", "KbworkError", "ConfigError", "ValidationError",
           "TcmOverflowError", "SimulationError"]
