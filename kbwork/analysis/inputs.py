"""What the analyses take: a run (or anything whose ``.run`` is one) and an op_log, checked.

Every function of :mod:`kbwork.analysis` that reads a run takes a
:class:`~kbwork.Run` or anything whose ``.run`` is one (a ``decode.DecodeRun``);
these helpers find it, or name what was given instead.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from ..errors import ValidationError
from ..sim import Run


def _run_of(x: Any) -> Run | None:
    """``x`` if it is a :class:`~kbwork.Run`, its ``.run`` if that is one (a ``decode.DecodeRun``), else None."""
    if isinstance(x, Run):
        return x
    inner = getattr(x, "run", None)
    return inner if isinstance(inner, Run) else None


def _op_log_of(x: Any) -> Any:
    """The op_log of a Run (or of anything whose ``.run`` is one); anything else as given, for the
    caller's check to name."""
    run = None if isinstance(x, pd.DataFrame) else _run_of(x)
    return x if run is None else run.op_log


def _check_cycles(op_log: pd.DataFrame, where: str) -> None:
    """Refuse ``start``/``end`` columns that are not whole cycles (an op_log's are int64)."""
    for c in ("start", "end"):
        if not pd.api.types.is_integer_dtype(op_log[c].dtype):
            raise ValidationError(f"{where}: column {c!r} holds {op_log[c].dtype} values; an op_log's start and end "
                                  f"are whole cycles (int64). Pass run.op_log, or convert with .astype('int64') "
                                  f"after dropping missing rows.")


def _resolve_run_only(x: Any) -> Run:
    """:func:`_run_of` ``x``, or a ValidationError naming what was given."""
    run = _run_of(x)
    if run is not None:
        return run
    raise ValidationError(f"expected a Run, a decode.DecodeRun or an Explanation, not {type(x).__name__}.")
