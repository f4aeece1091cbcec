"""The plots' argument checks: one checker per kind of argument, so every plot refuses the same mistake in the
same words; and what a plot may be given as a run (an op_log, a Run, a decode.DecodeRun, several by name)."""

from __future__ import annotations

import math
import numbers
from collections.abc import Hashable
from typing import Any, Iterable, Mapping

import matplotlib.axes
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.rcsetup import validate_hatch

from ..errors import ValidationError


def _is_real(x: Any) -> bool:
    # a bool is an int to Python, but clock_ghz=True or dpi=False is a slip, never a setting
    return isinstance(x, numbers.Real) and not isinstance(x, (bool, np.bool_))


def _is_int(x: Any) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, (bool, np.bool_))


def _check_ax(ax: Any, where: str) -> plt.Axes | None:
    """``ax`` itself, once it is None or an Axes."""
    if ax is not None and not isinstance(ax, matplotlib.axes.Axes):
        raise ValidationError(f"{where}: ax must be a matplotlib Axes (or None for a new figure), got "
                              f"{type(ax).__name__} {ax!r:.60}.")
    return ax


def _check_positive(x: Any, name: str, where: str, hint: str, *, optional: bool = True) -> Any:
    """``x`` itself, once it is a positive finite real (or None, when ``optional``)."""
    if x is None and optional:
        return x
    if not _is_real(x) or not math.isfinite(x) or x <= 0:
        raise ValidationError(f"{where}: {name} must be {'None or ' if optional else ''}a positive finite real "
                              f"number ({hint}), got {x!r}.")
    return x


def _check_clock(clock_ghz: Any, where: str, *, auto: bool = False) -> Any:
    """``clock_ghz`` itself, once it is None, a positive finite real or (where ``auto``) ``"auto"``."""
    if auto and isinstance(clock_ghz, str) and clock_ghz == "auto":
        return clock_ghz
    if clock_ghz is None or (_is_real(clock_ghz) and math.isfinite(clock_ghz) and clock_ghz > 0):
        return clock_ghz
    also, own = (", 'auto'", "; 'auto' for the runs' own clock") if auto else ("", "")
    raise ValidationError(f"{where}: clock_ghz must be None{also} or a positive finite real number (the clock in "
                          f"GHz for the µs axis, e.g. 1.25; None for no µs axis{own}), got {clock_ghz!r}.")


def _check_dpi(dpi: Any, where: str) -> Any:
    return _check_positive(dpi, "dpi", where, "the resolution the figure will be saved at, e.g. 150; None for "
                                              "the figure's")


def _check_int(x: Any, name: str, where: str, hint: str, *, low: int = 1, optional: bool = False) -> Any:
    """``x`` itself, once it is an int (not a bool) of at least ``low`` (or None, when ``optional``)."""
    if x is None and optional:
        return x
    if not _is_int(x) or x < low:
        what = "a positive int" if low == 1 else "a non-negative int" if low == 0 else f"an int >= {low}"
        raise ValidationError(f"{where}: {name} must be {'None or ' if optional else ''}{what} ({hint}), "
                              f"got {x!r}.")
    return x


def _check_flag(x: Any, name: str, where: str) -> Any:
    if not isinstance(x, (bool, np.bool_)):
        raise ValidationError(f"{where}: {name} must be True or False, got {x!r}.")
    return x


def _check_hatch(hatch: Any, where: str) -> Any:
    """``hatch`` itself, once it is None or a mapping tensor base name (str) -> matplotlib hatch pattern (str)."""
    how = ("hatch must be None or a mapping of tensor base name (str) -> matplotlib hatch pattern (str), e.g. "
           "{'V': '////'}")
    if hatch is None:
        return hatch
    if not isinstance(hatch, Mapping):
        raise ValidationError(f"{where}: {how}; got {type(hatch).__name__} {hatch!r:.60}.")
    for name, pat in hatch.items():
        if not isinstance(name, str) or not isinstance(pat, str):
            raise ValidationError(f"{where}: {how}; got {name!r}: {pat!r}.")
        try:
            validate_hatch(pat)
        except ValueError as e:
            raise ValidationError(f"{where}: hatch[{name!r}] = {pat!r} is not a matplotlib hatch pattern ({e}); "
                                  f"use the characters / \\ | - + x o O . *, e.g. '////'.") from None
    return hatch


def _check_tiles(tiles: Any, where: str) -> list[int]:
    """``tiles`` as a list, once it is an iterable of tile numbers (ints)."""
    how = "tiles must be an iterable of tile numbers (ints): pass [3] or range(3)"
    if isinstance(tiles, (str, bytes, Mapping)) or not isinstance(tiles, Iterable):
        raise ValidationError(f"{where}: {how}, got {tiles!r:.60}.")
    out = list(tiles)
    bad = [t for t in out if not _is_int(t)]
    if bad:
        raise ValidationError(f"{where}: {how}; {bad[0]!r} is not an int.")
    return out


def _check_window(window: Any, where: str) -> None:
    if window is None:
        return
    try:
        lo, hi = (float(x) for x in window)
    except (TypeError, ValueError):
        raise ValidationError(f"{where}: window={window!r}; pass (start, end) cycles.") from None
    if not lo < hi:
        raise ValidationError(f"{where}: window={window!r} is empty; pass start < end.")


def _check_options(options: Mapping[str, Any], allowed: Iterable[str], where: str, to: str) -> None:
    unknown = [k for k in options if k not in allowed]
    if unknown:
        raise ValidationError(f"{where}: unknown option(s) {', '.join(map(repr, unknown))}; {where} passes "
                              f"only {', '.join(allowed)} on to {to}.")


def _looks_like_op_log(x: Any) -> bool:
    return isinstance(x, pd.DataFrame) and {"stage", "engine", "start", "end"} <= set(x.columns)


def _check_table(x: Any, name: str, where: str, source: str, shape: str, fix: str, *,
                 labels: bool = False) -> pd.DataFrame:
    """``x`` itself, once it is a non-empty DataFrame of numbers (with ``labels``, its rows and columns labelled
    with numbers too) as ``source`` returns. An op_log, the usual slip, is named as one, with ``fix``."""
    want = f"{where}: {name} must be {source} output ({shape})"
    if _looks_like_op_log(x):
        raise ValidationError(f"{want}, not an op_log; {fix}.")
    if not isinstance(x, pd.DataFrame) or x.empty or x.shape[1] == 0:
        what = type(x).__name__ if not isinstance(x, pd.DataFrame) else "an empty DataFrame"
        raise ValidationError(f"{want} (a non-empty DataFrame), got {what}.")
    bad = [c for c, dtype in x.dtypes.items() if not pd.api.types.is_numeric_dtype(dtype)]
    if bad:
        raise ValidationError(f"{want}: its column(s) {', '.join(map(repr, bad[:5]))} do not hold numbers.")
    for what, idx in [("rows", x.index)] + ([("columns", x.columns)] if labels else []):
        if not pd.api.types.is_numeric_dtype(idx):
            raise ValidationError(f"{want}: its {what} must be labelled with numbers, not {list(idx[:3])!r}.")
    return x


def _run_parts(x: Any) -> tuple[pd.DataFrame, Any, dict | None]:
    """``(op_log, Run or None, decode params or None)`` of an op_log, a Run or a decode.DecodeRun."""
    from ..sim import Run

    if isinstance(x, pd.DataFrame):
        return x, None, None
    if isinstance(x, Run):
        return x.op_log, x, None
    inner = getattr(x, "run", None)
    if isinstance(inner, Run):
        return inner.op_log, inner, dict(getattr(x, "params", {}) or {}) or None
    raise ValidationError(f"expected an op_log DataFrame, a Run or a decode.DecodeRun, not {type(x).__name__}.")


def _named_runs(runs: Any, second: Any, where: str) -> dict[str, Any]:
    """The variants to draw, by name: from a Comparison, a mapping, or the old two-op_log call (the call of
    the days of two variants, which names them opt2 and opt3)."""
    if isinstance(runs, pd.DataFrame):
        if not isinstance(second, pd.DataFrame):
            raise ValidationError(f"{where}: given one op_log, pass the second too ({where}(op_log_a, "
                                  f"op_log_b)), or pass a dict name -> op_log or a decode.Comparison.")
        return {"opt2": runs, "opt3": second}
    if second is not None:
        raise ValidationError(f"{where}: a second positional argument goes only with two op_logs; with "
                              f"{type(runs).__name__} pass the other options by name (tiles=..., tile=...).")
    items = getattr(runs, "runs", runs)
    if not isinstance(items, Mapping):
        raise ValidationError(f"{where} takes a decode.Comparison, a dict name -> op_log (or run), or two "
                              f"op_logs, not {type(runs).__name__}.")
    if not items:
        raise ValidationError(f"{where}: no variants given.")
    return {str(k): v for k, v in items.items()}


def _check_column_name(name: Any, arg: str, where: str) -> None:
    if not isinstance(name, str):
        raise ValidationError(f"{where}: {arg} must be the name of a sweep column (a str, e.g. 'kv_len'), got "
                              f"{type(name).__name__} {name!r:.60}.")


def _check_baseline(sweep_df: pd.DataFrame, baseline: Any, where: str) -> None:
    """The baseline variant must be one the sweep ran: scaling's and cycles_bars' ratios divide by it."""
    variants = sorted(set(sweep_df["variant"]))
    if not isinstance(baseline, str) or baseline not in variants:
        raise ValidationError(f"{where}: baseline {baseline!r} is not in the sweep (variants: "
                              f"{', '.join(map(str, variants))}).")


def _check_center(center: Any, where: str) -> None:
    if not _is_real(center) or not math.isfinite(center):
        raise ValidationError(f"{where}: center must be a finite real number (the value the colours centre on, "
                              f"e.g. 1.0 for ratios), got {center!r}.")


def _level_list(x: str | Iterable[str] | None, name: str, where: str) -> list[str]:
    """An index level, or several, as a list (none for None)."""
    if x is None:
        return []
    if isinstance(x, str):
        return [x]
    if isinstance(x, Iterable) and not isinstance(x, Mapping):
        levels = list(x)
        if all(isinstance(v, Hashable) for v in levels):
            return levels
    raise ValidationError(f"{where}: {name} must be an index level name or a list of them (e.g. 'kv_len' or "
                          f"['kv_len', 'tile']), got {x!r:.60}.")
