"""The one error family kbwork raises on bad input.

Every error names the offending thing and says how to fix it, so a researcher
never has to read a bare ``KeyError`` or a numpy traceback.
"""

from __future__ import annotations


class KbworkError(Exception):
    """Base class of every error kbwork raises on purpose."""


class ConfigError(KbworkError, ValueError):
    """A topology file or override is unknown or nonsensical."""


class CapacityError(ConfigError):
    """A model step whose weights or KV cache do not fit in the memory they are placed in (DESIGN.md §15,
    "Capacity: what fits"). The message names where, the GiB of weights and of KV, the capacity and the
    ways out."""


class ValidationError(KbworkError, ValueError):
    """A kernel emitted a command that breaks a design invariant."""


class TraceError(ValidationError):
    """A ``tl.range`` body used its symbolic index where a concrete value is needed, or broke a rule of
    tracing (a nested ``tl.range``, a TCM allocation in the body outside a scratch scope, ...).

    The message names the expression and the fix (DESIGN.md §13).
    """


class TcmOverflowError(KbworkError, MemoryError):
    """A TCM allocation does not fit in what is left of the TCM."""


class SimulationError(KbworkError, RuntimeError):
    """The timeline cannot make progress (a deadlock) or a run was misused."""


class FileError(KbworkError, OSError):
    """A file kbwork was asked to read or write cannot be (it names the file and why).

    Also an :class:`OSError` with the same ``errno``, ``strerror`` and
    ``filename``, so code that handles OS errors keeps working.
    """
