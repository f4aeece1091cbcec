"""What if one engine were faster: causal profiling by re-simulating a run's program (DESIGN §11)."""

from __future__ import annotations

import decimal
import numbers
from fractions import Fraction
from typing import Any, Sequence

import numpy as np
import pandas as pd

from ..config import exact_fraction
from ..errors import ValidationError
from ..oplog import ENGINE_NAMES
from .inputs import _run_of


#: The range of :func:`what_if`'s ``speedup``: from an engine a thousand times slower to a million times
#: faster (beyond that every stage of it takes one cycle anyway; a slower engine would push cycle counts
#: of long runs towards the int64 the timeline counts in).
SPEEDUP_RANGE = (Fraction(1, 1000), Fraction(10**6))


def _speedup_fraction(speedup: Any) -> Fraction:
    """``speedup`` as the exact fraction it is written as, or a ValidationError saying what is accepted.

    Every real number type is read exactly: ints (Python and numpy) as themselves, ``Fraction`` and
    ``Decimal`` as themselves,
    floats as the decimal they print as (``0.1`` is 1/10; a numpy float as its own type prints it, so
    ``np.float32(0.1)`` is 1/10 too).
    """
    low, high = SPEEDUP_RANGE

    def refuse(why: str) -> ValidationError:
        return ValidationError(f"what_if: speedup={speedup!r} {why}; pass a real number from {float(low):g} to "
                               f"{float(high):g} (2 = twice as fast, 0.5 = half as fast).")

    if isinstance(speedup, (bool, np.bool_)) or not isinstance(speedup, (numbers.Real, decimal.Decimal)):
        raise refuse(f"is a {type(speedup).__name__}, not a real number")
    try:
        factor: Fraction | None
        if isinstance(speedup, decimal.Decimal):
            factor = Fraction(speedup) if speedup.is_finite() else None
        elif isinstance(speedup, numbers.Integral):
            factor = Fraction(int(speedup))
        elif isinstance(speedup, numbers.Rational):
            factor = Fraction(int(speedup.numerator), int(speedup.denominator))
        else:
            value = float(speedup)
            factor = (None if not np.isfinite(value) else
                      Fraction(str(speedup)) if isinstance(speedup, np.floating) else exact_fraction(value))
    except (TypeError, ValueError, OverflowError, ZeroDivisionError):
        raise refuse("cannot be read as a number") from None
    if factor is None:
        raise refuse("is not finite")
    if factor <= 0:
        raise refuse("is not positive")
    if not low <= factor <= high:
        raise refuse("is out of range")
    return factor


def _engine_names(engine: Any) -> list[str]:
    """The engines ``what_if`` re-simulates: all of them for ``None``, else the names given, checked."""
    if engine is None:
        return list(ENGINE_NAMES)
    if isinstance(engine, str):
        names = [engine]
    elif isinstance(engine, (list, tuple, np.ndarray, pd.Index, pd.Series)) and len(engine):
        names = list(engine)
    else:
        raise ValidationError(f"what_if: engine={engine!r}; pass an engine name ({', '.join(ENGINE_NAMES)}), a "
                              f"non-empty list of them, or None for every engine.")
    for name in names:
        if not isinstance(name, str) or name not in ENGINE_NAMES:
            hint = (f" ({name!r} is a channel; name its engine)" if isinstance(name, str)
                    and name.rstrip("0123456789") in ENGINE_NAMES else "")
            raise ValidationError(f"what_if: unknown engine {name!r}{hint}; use one of {', '.join(ENGINE_NAMES)}.")
    return [str(name) for name in names]


def check_what_if(engine: str | Sequence[str] | None = None, speedup: Any = 2.0) -> tuple[list[str], Fraction]:
    """The arguments of :func:`what_if` checked, before anything is simulated (``decode.what_if`` checks
    them before it runs a decode).

    Returns:
        The engine names to re-simulate and the speedup as the exact fraction it is written as.

    Raises:
        ValidationError: as :func:`what_if`'s, for ``engine`` and ``speedup``.
    """
    factor = _speedup_fraction(speedup)
    return _engine_names(engine), factor


def what_if(run: Any, engine: str | Sequence[str] | None = None, speedup: float = 2.0) -> pd.DataFrame:
    """Causal profiling: re-simulate with one engine's stages ``speedup`` times faster.

    The run's own program is re-simulated in timing mode (the same stages,
    dependencies, hazards and queue) with every stage of the engine taking
    ``ceil(d / speedup)`` cycles instead of ``d``, ``speedup`` read as the
    exact decimal it is written as: speedup 1 reproduces the run exactly, a
    stage that takes time never becomes free, and a speedup below 1 slows
    the engine down. A DMA speedup applies to every channel.

    Args:
        run: a :class:`~kbwork.Run`, or anything whose ``.run`` is one (a
            ``decode.DecodeRun``). To start from a dict of ``decode.run``
            parameters, use ``decode.what_if``.
        engine: an engine name (``"PE_DMA"``, ``"PE_GEMM"``, ...), a list of
            them, or ``None`` for every engine (one row each).
        speedup: a real number of any type (int, float, numpy, ``Fraction``)
            in :data:`SPEEDUP_RANGE`, read exactly as written.

    Returns:
        One row per engine: ``engine``, ``speedup``, ``baseline_cycles`` (the
        run's), ``cycles`` (re-simulated), ``change_cycles`` (cycles −
        baseline), ``change`` (that as a fraction of the baseline) and
        ``end_to_end_speedup`` (baseline / cycles).

    Raises:
        ValidationError: an unknown engine (or an engine that is no name), a speedup that is no real
            number, not finite, or out of :data:`SPEEDUP_RANGE`, or an input that is none of the above;
            checked before anything is simulated.
    """
    names, factor = check_what_if(engine, speedup)
    resolved = _run_of(run)
    if resolved is None:
        how = " (for a dict of decode.run parameters, use decode.what_if)" if isinstance(run, dict) else ""
        raise ValidationError(f"what_if takes a Run or anything whose .run is one (a decode.DecodeRun), "
                              f"not {type(run).__name__}{how}.")
    run = resolved
    rows = []
    for name in names:
        cycles = run.rescaled(ENGINE_NAMES.index(name), factor).cycles
        base = run.cycles
        rows.append({"engine": name, "speedup": float(factor), "baseline_cycles": base, "cycles": cycles,
                     "change_cycles": cycles - base, "change": (cycles - base) / base if base else 0.0,
                     "end_to_end_speedup": base / cycles if cycles else float("nan")})
    return pd.DataFrame(rows)
