"""The op_log: one row per executed stage, as a pandas DataFrame (DESIGN.md §6).

Columns, in this order: ``seq, cmd, iter, label, stage, engine, op_kind,
phase, tile, k_tile, tensor, bytes, ready, start, end``. The canonical CSV
has the same order, no index and ``\\n`` line endings; the Perfetto/Chrome-trace
export has one track per engine unit (each DMA channel its own) with times in
µs from the topology clock.
"""

from __future__ import annotations

import functools
import io
import json
import re
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from .pe.scheduler import Program
from .pe.stages import Engine, Phase, StageKind, unit_names
from .pe.timeline import Timeline

COLUMNS = ("seq", "cmd", "iter", "label", "stage", "engine", "op_kind", "phase", "tile", "k_tile", "tensor",
           "bytes", "ready", "start", "end")
INT_COLUMNS = ("seq", "cmd", "iter", "tile", "k_tile", "bytes", "ready", "start", "end")
ENGINE_NAMES = tuple(e.name for e in Engine)
STAGE_NAMES = tuple(k.name for k in StageKind)
PHASE_NAMES = tuple(p.label for p in Phase)


_STAGE_DTYPE = pd.CategoricalDtype(STAGE_NAMES)
_PHASE_DTYPE = pd.CategoricalDtype(PHASE_NAMES)
_CHANNEL = re.compile(r"^(.*?)(\d+)$")


@functools.lru_cache(maxsize=256)
def _dtype(categories: tuple[str, ...]) -> pd.CategoricalDtype:
    # building a CategoricalDtype validates its categories (an Index): reuse it across runs
    return pd.CategoricalDtype(list(categories))


def _categorical(values: Sequence[str]) -> pd.Categorical:
    """A categorical with sorted categories (the same categories ``read_csv`` rebuilds)."""
    cats = tuple(sorted(set(values)))
    index = {c: i for i, c in enumerate(cats)}
    codes = np.fromiter(map(index.__getitem__, values), dtype=np.int32, count=len(values))
    return pd.Categorical.from_codes(codes, dtype=_dtype(cats), validate=False)


def build_op_log(prog: Program, timeline: Timeline) -> pd.DataFrame:
    """Assemble the op_log DataFrame of a simulated program (rows in seq order).

    ``engine`` names the unit each stage ran on (``PE_DMA0``, ``PE_DMA1``, ...
    when PE_DMA has several channels); its categories are every unit, in
    track order. String columns are categoricals (a byte or two per row
    instead of a pointer to a string object), so a million-stage op_log
    stays small. Their codes are built here, in range by construction, so
    pandas does not check them.
    """
    t = prog.table
    n = len(t)
    cmd = np.array(t.cmd, dtype=np.int64)
    labels = tuple(sorted(set(prog.labels)))
    label_code = {lab: i for i, lab in enumerate(labels)}
    cmd_label = np.array([label_code[lab] for lab in prog.labels], dtype=np.int32)
    data = {
        "seq": np.arange(n, dtype=np.int64),
        "cmd": cmd,
        "iter": np.array(prog.iters, dtype=np.int64)[cmd] if n else np.zeros(0, np.int64),
        "label": pd.Categorical.from_codes(cmd_label[cmd] if n else np.zeros(0, np.int32), dtype=_dtype(labels),
                                           validate=False),
        "stage": pd.Categorical.from_codes(np.array(t.kind, dtype=np.int8), dtype=_STAGE_DTYPE, validate=False),
        "engine": pd.Categorical.from_codes(timeline.unit, dtype=_dtype(unit_names(timeline.engines)),
                                            validate=False),
        "op_kind": _categorical(t.op_kind),
        "phase": pd.Categorical.from_codes(np.array(t.phase, dtype=np.int8), dtype=_PHASE_DTYPE, validate=False),
        "tile": np.array(t.tile, dtype=np.int64),
        "k_tile": np.array(t.k_tile, dtype=np.int64),
        "tensor": _categorical(t.tensor),
        "bytes": np.array(t.nbytes, dtype=np.int64),
        "ready": timeline.ready,
        "start": timeline.start,
        "end": timeline.end,
    }
    return _frame(data, n)


def engine_tracks(names: Sequence[str] | pd.Series) -> tuple[str, ...]:
    """The engine units named in ``names``, in track order (``ENGINE_NAMES`` order, channels by number).

    A categorical column gives its categories (every unit of the run, used or
    not); plain names give every engine plus the channels that appear
    (``PE_DMA0`` .. the highest seen) in place of their engine.

    Raises:
        ValueError: a name that is neither an engine nor a channel of one.
    """
    if isinstance(names, pd.Series) and isinstance(names.dtype, pd.CategoricalDtype):
        return tuple(names.cat.categories)
    channels: dict[str, int] = {}
    for name in sorted(set(names)):
        if name in ENGINE_NAMES:
            continue
        m = _CHANNEL.match(name)
        if m is None or m.group(1) not in ENGINE_NAMES:
            raise ValueError(f"op_log engine {name!r} is not one of {', '.join(ENGINE_NAMES)} "
                             f"or a channel of one (PE_DMA0, PE_DMA1, ...).")
        channels[m.group(1)] = max(channels.get(m.group(1), 0), int(m.group(2)) + 1)
    return tuple(e if e not in channels else f"{e}{i}" for e in ENGINE_NAMES for i in range(channels.get(e, 1)))


_COLUMN_INDEX = pd.Index(COLUMNS)


def _frame(data: dict[str, object], n: int) -> pd.DataFrame:
    """A DataFrame over ``data`` (already typed, one array per column, in COLUMNS order).

    ``DataFrame._from_arrays`` skips the per-column inference that
    ``DataFrame(dict)`` repeats for arrays we built with their final dtypes;
    for a short run that inference is most of the op_log's cost. It is not
    public API, so any other pandas takes the public constructor.
    """
    try:
        return pd.DataFrame._from_arrays(list(data.values()), columns=_COLUMN_INDEX, index=pd.RangeIndex(n),
                                         verify_integrity=False)
    except (AttributeError, TypeError):  # pragma: no cover - a pandas without it
        return pd.DataFrame(data, copy=False)


def check_schema(op_log: pd.DataFrame) -> None:
    """Raise ``ValueError`` naming the problem if ``op_log`` does not have the op_log schema."""
    if tuple(op_log.columns) != COLUMNS:
        raise ValueError(f"op_log columns are {list(op_log.columns)}; expected {list(COLUMNS)}.")
    for col in INT_COLUMNS:
        if not pd.api.types.is_integer_dtype(op_log[col]):
            raise ValueError(f"op_log column {col!r} must be integer, is {op_log[col].dtype}.")


def to_csv(op_log: pd.DataFrame, path: str | Path | None = None) -> str:
    """Write the canonical CSV (to ``path`` if given) and return it as a string."""
    check_schema(op_log)
    buf = io.StringIO()
    op_log.to_csv(buf, index=False, lineterminator="\n")
    text = buf.getvalue()
    if path is not None:
        Path(path).write_text(text, newline="")
    return text


def read_csv(path: str | Path) -> pd.DataFrame:
    """Read an op_log CSV back with the same dtypes :func:`build_op_log` gives (a lossless round trip;
    ``engine``'s categories are the engines and the channels that appear, see :func:`engine_tracks`).

    Raises:
        ValueError: the file does not have the op_log schema.
    """
    df = pd.read_csv(path, keep_default_na=False, dtype={c: "int64" for c in INT_COLUMNS})
    check_schema(df)
    for col, dtype in (("stage", _STAGE_DTYPE), ("phase", _PHASE_DTYPE)):
        df[col] = pd.Categorical(df[col], dtype=dtype)
    df["engine"] = pd.Categorical(df["engine"], dtype=_dtype(engine_tracks(df["engine"])))
    for col in ("label", "op_kind", "tensor"):
        df[col] = _categorical(list(df[col]))
    return df


def to_perfetto(op_log: pd.DataFrame, path: str | Path | None = None, clock_ghz: float = 1.25,
                process_name: str = "AHBM PE") -> dict:
    """Export as Chrome-trace JSON (``"ph": "X"`` events) that Perfetto's UI opens.

    One thread (track) per engine unit, named by metadata events; ``ts``/``dur`` in
    µs from ``clock_ghz``. Each event's ``args`` carry the op_log columns.

    Returns:
        The trace as a dict (also written to ``path`` if given).
    """
    check_schema(op_log)
    per_us = clock_ghz * 1e3
    tracks = engine_tracks(op_log["engine"])
    events: list[dict] = [{"ph": "M", "name": "process_name", "pid": 1, "tid": 0,
                           "args": {"name": process_name}}]
    for i, name in enumerate(tracks):
        events.append({"ph": "M", "name": "thread_name", "pid": 1, "tid": i, "args": {"name": name}})
        events.append({"ph": "M", "name": "thread_sort_index", "pid": 1, "tid": i, "args": {"sort_index": i}})
    track_of = {n: i for i, n in enumerate(tracks)}
    cols = op_log[list(COLUMNS)].itertuples(index=False, name=None)
    for seq, cmd, it, label, stage, engine, op_kind, phase, tile, k_tile, tensor, nbytes, ready, start, end in cols:
        name = f"{stage} {op_kind}" + (f" {tensor}" if tensor else "")
        events.append({
            "name": name, "cat": stage, "ph": "X", "pid": 1, "tid": track_of[engine],
            "ts": start / per_us, "dur": (end - start) / per_us,
            "args": {"seq": int(seq), "cmd": int(cmd), "iter": int(it), "label": label, "phase": phase,
                     "tile": int(tile), "k_tile": int(k_tile), "bytes": int(nbytes), "ready_cycle": int(ready),
                     "start_cycle": int(start), "end_cycle": int(end)},
        })
    trace = {"traceEvents": events, "displayTimeUnit": "ns",
             "otherData": {"clock_ghz": clock_ghz, "source": "kbwork"}}
    if path is not None:
        Path(path).write_text(json.dumps(trace, separators=(",", ":")))
    return trace
