"""Plots of op_logs and of where a run's time went: pure functions that take DataFrames and an optional Axes.

Every function returns the matplotlib Axes (or Figure) it drew on, so a
notebook, a test and the command line call the same code. A function that
makes its own figure lays it out with ``constrained_layout``, so labels,
legends and the µs axis stay inside the figure when it is saved.

Artists the tests (and anyone styling a figure) look for carry a ``gid``:
``stages:<unit>`` (one PolyCollection of stages per engine unit),
``stages:<unit>:<hatch>`` (the hatched stages of one unit, e.g. V tiles),
``holds`` (one segment per hazard hold), ``critical-path`` (one outline per
critical-path stage), ``critical-path-links`` (one segment per change of
unit along the path), ``winners`` (the image of each winner-map panel) and
``threshold`` (the gate map's contour).

One palette everywhere: a stage kind, an engine, a critical-path cause and a
decode variant each have their colour (:data:`STAGE_COLORS`,
:data:`ENGINE_COLORS`, :data:`CAUSE_COLORS`, :data:`VARIANT_COLORS`); any
other category (a command of a tile, a variant without a colour of its own)
takes the next of :data:`PALETTE`. Text on a coloured fill is white on a dark
one and black on a light one. A figure has one µs axis (on top), facet titles
and axis labels in words (``FIXED = 0 cycles``, not ``fixed_cycles = 0``).

One module per kind of figure, each name re-exported here (``kbwork.plots.gantt``):
:mod:`~kbwork.plots.gantts` (Gantt charts, utilisation over time, variants side
by side), :mod:`~kbwork.plots.dispatch` (per-tile dispatch bars, the gate map),
:mod:`~kbwork.plots.breakdown` (critical-path attribution, what-if bars),
:mod:`~kbwork.plots.sweeps` (scaling, ratio heat maps, winner maps, grouped
cycles), :mod:`~kbwork.plots.device` (a device run's PEs and channels) and
:mod:`~kbwork.plots.model` (a model's decode step), :mod:`~kbwork.plots.energy` (a step's
energy: tokens/s against tokens/J, where the joules go); what they share is in
:mod:`~kbwork.plots.style` (the palette, words, axes) and
:mod:`~kbwork.plots.checks` (argument checks).
"""

from __future__ import annotations

from .breakdown import attribution, attribution_figure, what_if  # noqa: F401
from .checks import (_check_ax, _check_clock, _check_dpi, _check_flag, _check_hatch, _check_int,  # noqa: F401
                     _check_window, _is_int)
from .dispatch import dispatch_per_tile, gate_map  # noqa: F401
from .gantts import (HOLD_OFFSET, _Drawn, _gantt_handles, _tensor_base, commands_per_tile, compare_gantt,  # noqa: F401
                     gantt, gantt_or_utilization, tile_window, too_dense, utilization_over_time)
from .style import (_MOVERS, AXIS_WORDS, CAUSE_COLORS, ENGINE_COLORS, HOLD_COLOR, PALETTE, STAGE_COLORS,  # noqa: F401
                    TENSOR_HATCH, VALUE_WORDS, VARIANT_COLORS, DensityWarning, _variant_colors, axis_label, cycle_axis,
                    describe, facet_title, text_color)
from .sweeps import cycles_bars, ratio_heatmaps, ratio_norm, scaling, winner_map  # noqa: F401

# device.py and model.py draw with the helpers above, which they import from this package
from .device import device_gantt  # noqa: E402,F401
from .model import contention, ping_pong_gain, tokens_per_s, tokens_per_s_grid, variant_ratio  # noqa: E402,F401
from .energy import energy_bars, tokens_per_j  # noqa: E402,F401
