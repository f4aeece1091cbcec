"""The critical path's cycles by engine unit and by cause (DESIGN §11), and as a sweep row's columns."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..device import CAUSES
from ..oplog import ENGINE_NAMES
from .inputs import _resolve_run_only


def attribution(run) -> pd.DataFrame:
    """The critical path's cycles by engine unit and by cause (DESIGN §11).

    Of a device run, its critical path: the PE that finishes last's
    (``run.critical_path()``); of one PE of it, ``attribution(run.pe(p))``.

    Each row of ``run.critical_path()`` counts its ``end - start`` once to its
    engine and once to the cause of its incoming link (the first row's is
    ``dependency``). The path runs from cycle 0 to ``run.cycles`` without gaps,
    so each of the two sums is ``run.cycles`` exactly.

    Returns:
        Long form: ``by`` (``"engine"`` or ``"cause"``), ``name`` (every engine
        unit in track order, then every cause of ``device.walk.CAUSES``, zeros
        included), ``cycles`` and ``fraction`` (of ``run.cycles``).
    """
    run = _resolve_run_only(run)
    path = run.critical_path()
    dur = (path["end"] - path["start"]).to_numpy(np.int64)
    tracks = run.units  # the op_log's engine categories; a device's op_log is not built for them
    by_engine = np.bincount(pd.Categorical(path["engine"], categories=tracks).codes, weights=dur,
                            minlength=len(tracks)).astype(np.int64)
    by_cause = np.bincount(path["cause"].cat.codes.to_numpy(), weights=dur, minlength=len(CAUSES)).astype(np.int64)
    cycles = np.concatenate((by_engine, by_cause))
    total = run.cycles
    return pd.DataFrame({"by": ["engine"] * len(tracks) + ["cause"] * len(CAUSES),
                         "name": list(tracks) + list(CAUSES), "cycles": cycles,
                         "fraction": cycles / total if total else np.zeros(len(cycles))})


#: The columns ``decode.sweep(..., attribution=True)`` adds (:func:`path_cycles`): the critical path's
#: cycles by engine (every DMA channel summed into ``path_PE_DMA``), then by cause.
PATH_COLUMNS = tuple(f"path_{n}" for n in (*ENGINE_NAMES, *CAUSES))


def path_cycles(run) -> dict[str, int]:
    """:func:`attribution` of one run as a flat record, the same keys for every run (what a sweep row holds).

    Args:
        run: a :class:`~kbwork.Run` or a ``decode.DecodeRun``.

    Returns:
        :data:`PATH_COLUMNS` -> cycles: ``path_<engine>`` for every engine of
        ``ENGINE_NAMES`` (a DMA engine's channels summed) and ``path_<cause>``
        for every cause, zeros included. Each of the two groups adds up to the
        run's end-to-end cycles.
    """
    att = attribution(_resolve_run_only(run))
    out = dict.fromkeys(PATH_COLUMNS, 0)
    for by, name, cycles in zip(att["by"], att["name"], att["cycles"]):
        out[f"path_{name.rstrip('0123456789') if by == 'engine' else name}"] += int(cycles)
    return out
