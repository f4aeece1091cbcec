"""One palette and one way of writing things, for every plot: the colours of stage kinds, engines, causes and
variants, axis labels and facet titles in words, text that reads on its fill, cycle and µs axes."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any, Iterable, Mapping

import matplotlib
import matplotlib.axis
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.ticker import FuncFormatter, MaxNLocator

from ..errors import ValidationError
from ..oplog import STAGE_NAMES


#: One colour per stage kind (colour-blind friendly, Okabe-Ito based).
STAGE_COLORS = {
    "DISPATCH": "#999999",
    "PLAN": "#CC79A7",
    "DMA_READ": "#0072B2",
    "FETCH": "#56B4E9",
    "GEMM": "#D55E00",
    "MATH": "#009E73",
    "DMA_WRITE": "#E69F00",
}
#: One colour per engine, the colour of the stage kind it mostly runs (attribution by engine).
ENGINE_COLORS = {
    "PE_CPU": STAGE_COLORS["DISPATCH"],
    "PE_SCHEDULER": STAGE_COLORS["PLAN"],
    "PE_DMA": STAGE_COLORS["DMA_READ"],
    "PE_GEMM": STAGE_COLORS["GEMM"],
    "PE_MATH": STAGE_COLORS["MATH"],
}
#: One colour per critical-path cause (Paul Tol's vibrant scheme; attribution by cause, path links).
CAUSE_COLORS = {
    "engine": "#BBBBBB",
    "dependency": "#33415C",
    "hazard": "#CC3311",
    "queue": "#EE7733",
    "wait": "#33BBEE",
    "scheduler": "#EE3377",
    "order": "#009988",
    "after": "#AA3377",
}
#: Hatch pattern by tensor: the stages that move it (DMA_READ, DMA_WRITE, and FETCH of it as the
#: streamed operand) are hatched. A tensor is named by its base name, the part before any ``[rows]``
#: slice: decode's V tiles (``V[0:128]``, ...) are hatched, its K tiles plain.
TENSOR_HATCH = {"V": "////"}
#: One colour per decode variant (sweep plots, the winner map, what-if bars); other variants take
#: :data:`PALETTE` colours.
VARIANT_COLORS = {"opt2": "#0072B2", "opt3": "#D55E00", "a1": "#009E73"}
#: The colour of the hazard-hold bars on a Gantt.
HOLD_COLOR = "#7B1E3A"
#: Every other category, in order: Okabe-Ito's colour-blind-safe eight, then Paul Tol's muted nine.
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#56B4E9", "#CC79A7", "#F0E442", "#999999",
           "#332288", "#88CCEE", "#44AA99", "#117733", "#999933", "#DDCC77", "#CC6677", "#882255", "#AA4499")


class DensityWarning(UserWarning):
    """A Gantt window holds more stages on one row than the Axes has pixels across: they smear."""


#: Sweep axes and decode parameters in words, with their unit: facet titles and axis labels.
AXIS_WORDS = {
    "fixed_cycles": ("FIXED", "cycles"), "r_cycles_per_byte": ("R", "cycles/byte"), "kv_len": ("kv length", "tokens"),
    "tile": ("tile", "rows"), "group": ("group G", "query rows"), "head_dim": ("head dim d", None),
    "dtype": ("dtype", None), "hazard_policy": ("hazard policy", None), "dma_channels": ("DMA channels", None),
}
#: Values in words (hazard policies).
VALUE_WORDS = {"strict_fifo": "strict FIFO", "rw_aware": "rw-aware"}


def _words_of(name: Any, where: str) -> tuple[Any, str | None]:
    if not isinstance(name, Hashable):
        raise ValidationError(f"{where}: name must be a column or index level name (e.g. 'kv_len'), got "
                              f"{type(name).__name__} {name!r:.60}.")
    return AXIS_WORDS.get(name, (name, None))


def axis_label(name: str) -> str:
    """An axis label for a sweep column: ``"fixed_cycles"`` -> ``"FIXED (cycles)"``; others as given.

    Raises:
        ValidationError: ``name`` cannot name a column (a list, a dict, ...).
    """
    words, unit = _words_of(name, "axis_label")
    return f"{words} ({unit})" if unit else words


def facet_title(name: str, value: Any) -> str:
    """A facet's title: ``("fixed_cycles", 0)`` -> ``"FIXED = 0 cycles"``, ``("hazard_policy", "rw_aware")``
    -> ``"hazard policy = rw-aware"``.

    Raises:
        ValidationError: ``name`` cannot name a column (a list, a dict, ...).
    """
    words, unit = _words_of(name, "facet_title")
    return f"{words} = {_fmt_value(value)}" + (f" {unit}" if unit else "")


def text_color(fill: Any) -> str:
    """Black or white, whichever reads on ``fill`` (any matplotlib colour).

    Raises:
        ValidationError: ``fill`` is not a matplotlib colour.
    """
    try:
        r, g, b = matplotlib.colors.to_rgb(fill)
    except (TypeError, ValueError):
        raise ValidationError(f"text_color: fill={fill!r:.60} is not a matplotlib colour; pass e.g. '#0072B2', "
                              f"'white' or an (r, g, b) tuple.") from None
    return "white" if 0.299 * r + 0.587 * g + 0.114 * b < 0.5 else "black"

_PALETTE = np.array([matplotlib.colors.to_rgba(STAGE_COLORS[k]) for k in STAGE_NAMES])
_MOVERS = ("DMA_READ", "DMA_WRITE", "FETCH")


# --- small helpers ---------------------------------------------------------------------------------------
def cycle_axis(axis: matplotlib.axis.Axis) -> None:
    """Integer cycle ticks on ``axis`` (``ax.xaxis``): whole numbers with thousands separators, no
    scientific notation and no offset (never "1e6" in a corner).

    Raises:
        ValidationError: ``axis`` is not a matplotlib Axis (an Axes, say: pass ``ax.xaxis`` or ``ax.yaxis``).
    """
    if not isinstance(axis, matplotlib.axis.Axis):
        raise ValidationError(f"cycle_axis: axis must be a matplotlib Axis (ax.xaxis or ax.yaxis), got "
                              f"{type(axis).__name__}.")
    axis.set_major_locator(MaxNLocator(nbins="auto", steps=[1, 2, 2.5, 5, 10], integer=True))
    axis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:,.0f}"))


def _new_axes(figsize: tuple[float, float]) -> plt.Axes:
    _, ax = plt.subplots(figsize=figsize, layout="constrained")
    return ax


def _us_axis(ax: plt.Axes, clock_ghz: float | None) -> None:
    if clock_ghz:
        per_us = clock_ghz * 1e3
        sec = ax.secondary_xaxis("top", functions=(lambda c: c / per_us, lambda u: u * per_us))
        sec.set_xlabel("µs")


def _fmt_value(v: Any) -> str:
    """A tick or facet value: ints with thousands separators, known words (:data:`VALUE_WORDS`), everything
    else as it prints."""
    if isinstance(v, (int, np.integer)) and not isinstance(v, bool):
        return f"{v:,}"
    return VALUE_WORDS.get(v, str(v)) if isinstance(v, str) else str(v)


def _variant_colors(names: Iterable[str]) -> dict[str, str]:
    """:data:`VARIANT_COLORS`, and for any other variant (in the order given) the next :data:`PALETTE`
    colour that no variant has."""
    free = [c for c in PALETTE if c not in VARIANT_COLORS.values()]
    out, k = {}, 0
    for n in names:
        if n in VARIANT_COLORS:
            out[n] = VARIANT_COLORS[n]
        else:
            out[n] = free[k % len(free)]
            k += 1
    return out


def _color_for(by: str, name: str) -> str:
    if by == "cause":
        return CAUSE_COLORS.get(name, "#777777")
    base = name.rstrip("0123456789")
    color = ENGINE_COLORS.get(base, "#777777")
    if base != name:  # a DMA channel: the engine's colour, lighter for higher channels
        k = int(name[len(base):])
        rgb = np.array(matplotlib.colors.to_rgb(color))
        color = matplotlib.colors.to_hex(rgb + (1 - rgb) * min(0.6, 0.3 * k))
    return color


def describe(params: Mapping[str, Any]) -> str:
    """A one-line description of a decode run's parameters for a title: sizes, then the calibration.

    ``params`` is ``DecodeRun.params`` (or ``Comparison.params``), e.g.
    ``"kv_len 4096, tile 128, G 8, d 128, bf16 · ahbm-pe-v1: FIXED 40, R 0.0625, strict_fifo"``.

    Raises:
        ValidationError: ``params`` is not a mapping.
    """
    if not isinstance(params, Mapping):
        raise ValidationError(f"describe: params must be a mapping of decode parameters (DecodeRun.params), got "
                              f"{type(params).__name__}.")
    sizes = ", ".join(f"{k} {params[key]}" for k, key in (("kv_len", "kv_len"), ("tile", "tile"), ("G", "group"),
                                                          ("d", "head_dim")) if key in params)
    if "dtype" in params:
        sizes += f", {params['dtype']}"
    calib = []
    if "fixed_cycles" in params:
        calib.append(f"FIXED {params['fixed_cycles']}")
    if "r_cycles_per_byte" in params:
        calib.append(f"R {params['r_cycles_per_byte']:g}")
    if "hazard_policy" in params:
        calib.append(str(params["hazard_policy"]))
    topo = f"{params['topology']}: " if "topology" in params else ""
    return sizes + (f" · {topo}{', '.join(calib)}" if calib else "")
