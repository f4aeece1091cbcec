"""Where a run's time goes (DESIGN §11), per-tile dispatch and its gate, and tables over sweeps.

Data in, data out: every function reads an op_log or a run (a
:class:`~kbwork.Run`, or anything whose ``.run`` is one, a
``decode.DecodeRun``) and returns a DataFrame or a number. One module per
thing computed, each name re-exported here (``kbwork.analysis.what_if``):

* :mod:`~kbwork.analysis.dispatch`: the per-tile dispatch read off an op_log, its closed form (the formula of
  DESIGN §4 applied to a tile's command bytes, no simulation; the two agree exactly), the dispatch-ratio
  :func:`gate` and its FIXED × R :func:`ratio_grid`;
* :mod:`~kbwork.analysis.busy`: :func:`utilization` and :func:`utilization_over_time` of an op_log;
* :mod:`~kbwork.analysis.critical`: :func:`attribution`, the critical path's cycles by engine and by cause,
  and :func:`path_cycles`, the same as a sweep row's columns;
* :mod:`~kbwork.analysis.stalls`: :func:`waits` and :func:`top_waits`, what stages waited for;
* :mod:`~kbwork.analysis.speedup`: :func:`what_if`, one engine faster, re-simulated;
* :mod:`~kbwork.analysis.explanation`: :func:`explain` (:class:`Explanation`: the numbers and one sentence
  saying what bounds a run) and the same over several runs;
* :mod:`~kbwork.analysis.energy`: :func:`energy`, a run's joules from its op_log's counts (DESIGN §18), and
  :func:`energy_by_kind`;
* :mod:`~kbwork.analysis.sweeps`: over a sweep's points, :func:`winners` and :func:`attribution_gap`;
* :mod:`~kbwork.analysis.channels`, :mod:`~kbwork.analysis.per_pe`: a device run's HBM channels, and its
  op_log read per PE or pooled.

This package sits below ``decode`` and ``model`` (DESIGN §9): they import it,
never the other way, so running a decode from parameters first is
``decode.what_if``'s job.
"""

from __future__ import annotations

from ..device import CAUSES  # noqa: F401  (the causes of attribution's rows, as analysis.CAUSES)
from ..oplog import ENGINE_NAMES  # noqa: F401  (its engines, as analysis.ENGINE_NAMES)
from .busy import utilization, utilization_over_time  # noqa: F401
from .channels import (CONTENDED, channel_steps, channels, channels_over_time, contention,  # noqa: F401
                       contention_words, path_contention)
from .critical import PATH_COLUMNS, attribution, path_cycles  # noqa: F401
from .dispatch import (GATE_FACTOR, closed_form, closed_form_per_tile, closed_form_per_tile_from_program,  # noqa: F401
                       command_bytes_per_tile, dispatch_per_tile, dispatch_per_tile_from_run, gate, ratio_grid)
from .energy import ENERGY_KEYS, KINDS as ENERGY_KINDS, energy, energy_by_kind, total_pj  # noqa: F401
from .explanation import (SATURATED, Explanation, attribution_table, attribution_wide, explain,  # noqa: F401
                          explain_all, utilization_wide)
from .speedup import SPEEDUP_RANGE, check_what_if, what_if  # noqa: F401
from .stalls import WAIT_COLUMNS, top_waits, waits  # noqa: F401
from .sweeps import attribution_gap, winners  # noqa: F401
