"""The op_log: one row per executed stage, as a pandas DataFrame (DESIGN.md §6).

Columns, in this order: ``seq, pe, cmd, iter, label, stage, engine, op_kind,
phase, tile, k_tile, tensor, bytes, ready, start, end``. The canonical CSV
has the same order, no index and ``\\n`` line endings; the Perfetto/Chrome-trace
export has one track per engine unit (each DMA channel its own) with times in
µs from the topology clock.
"""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from . import atomic
from .errors import FileError, ValidationError
from .pe.scheduler import Schedule as Program
from .pe.stages import Engine, Phase, StageKind, unit_names
from .device.records import Timeline

COLUMNS = ("seq", "pe", "cmd", "iter", "label", "stage", "engine", "op_kind", "phase", "tile", "k_tile", "tensor",
           "bytes", "ready", "start", "end")
INT_COLUMNS = ("seq", "pe", "cmd", "iter", "tile", "k_tile", "bytes", "ready", "start", "end")
ENGINE_NAMES = tuple(e.name for e in Engine)
STAGE_NAMES = tuple(k.name for k in StageKind)
PHASE_NAMES = tuple(p.label for p in Phase)


_STAGE_DTYPE = pd.CategoricalDtype(STAGE_NAMES)
_PHASE_DTYPE = pd.CategoricalDtype(PHASE_NAMES)
_CHANNEL = re.compile(r"^(.*?)(\d+)$")


def _dtype(categories: tuple[str, ...]) -> pd.CategoricalDtype:
    return pd.CategoricalDtype(list(categories))


def _categorical(values: Sequence[str] | pd.Categorical) -> pd.Categorical:
    """A categorical with sorted categories (the same categories ``read_csv`` rebuilds); one already
    built that way (a steady-state run's columns) is taken as it is."""
    if isinstance(values, pd.Categorical):
        return values
    cats = tuple(sorted(set(values)))
    index = {c: i for i, c in enumerate(cats)}
    codes = np.fromiter(map(index.__getitem__, values), dtype=np.int32, count=len(values))
    return pd.Categorical.from_codes(codes, dtype=_dtype(cats), validate=False)


def build_op_log(prog: Program, timeline: Timeline, pe: int = 0, seq_offset: int = 0) -> pd.DataFrame:
    """Assemble the op_log DataFrame of a simulated program (rows in seq order) run on PE ``pe``, its stages
    numbered from ``seq_offset`` (a device run numbers its PEs' stages one PE after another).

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
        "seq": np.arange(seq_offset, seq_offset + n, dtype=np.int64),
        "pe": np.full(n, pe, dtype=np.int64),
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
        # copies: the op_log is the user's to edit, the timeline's arrays stay what the run recorded
        "ready": timeline.ready.copy(),
        "start": timeline.start.copy(),
        "end": timeline.end.copy(),
    }
    return _frame(data, n)


def engine_tracks(names: Sequence[str] | pd.Series) -> tuple[str, ...]:
    """The engine units named in ``names``, in track order (``ENGINE_NAMES`` order, channels by number).

    A categorical column gives its categories (every unit of the run, used or
    not); plain names give every engine plus the channels that appear
    (``PE_DMA0`` .. the highest seen) in place of their engine.

    Raises:
        ValidationError: ``names`` is not a list of names, or holds a name that is neither an engine nor a
            channel of one.
    """
    if isinstance(names, pd.Series) and isinstance(names.dtype, pd.CategoricalDtype):
        return tuple(names.cat.categories)
    if isinstance(names, (str, bytes)) or not isinstance(names, (Sequence, pd.Series, pd.Index, np.ndarray)):
        raise ValidationError(f"engine_tracks: names must be a list of engine unit names (an op_log's engine "
                              f"column), got {type(names).__name__} {names!r:.60}.")
    channels: dict[str, int] = {}
    for name in sorted(pd.unique(np.asarray(names, dtype=object)), key=str):
        if not isinstance(name, str):
            raise ValidationError(f"op_log engine {name!r} is not an engine unit name; names are "
                                  f"{', '.join(ENGINE_NAMES)} or a channel of one (PE_DMA0, PE_DMA1, ...).")
        if name in ENGINE_NAMES:
            continue
        m = _CHANNEL.match(name)
        if m is None or m.group(1) not in ENGINE_NAMES:
            raise ValidationError(f"op_log engine {name!r} is not one of {', '.join(ENGINE_NAMES)} "
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


def require_columns(df: pd.DataFrame, columns: Sequence[str], where: str) -> None:
    """Raise a ``ValidationError`` naming ``where`` unless ``df`` is a DataFrame holding ``columns``."""
    if not isinstance(df, pd.DataFrame):
        raise ValidationError(f"{where}: expected an op_log DataFrame (Run.op_log), got {type(df).__name__}.")
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise ValidationError(f"{where}: the DataFrame has no column(s) {', '.join(missing)}; pass an op_log "
                              f"(Run.op_log).")


def check_schema(op_log: pd.DataFrame) -> None:
    """Raise a ``ValidationError`` naming the problem if ``op_log`` does not have the op_log schema."""
    if not isinstance(op_log, pd.DataFrame):
        raise ValidationError(f"expected an op_log DataFrame (Run.op_log), got {type(op_log).__name__}.")
    if tuple(op_log.columns) != COLUMNS:
        raise ValidationError(f"op_log columns are {list(op_log.columns)}; expected {list(COLUMNS)}.")
    for col in INT_COLUMNS:
        if not pd.api.types.is_integer_dtype(op_log[col]):
            raise ValidationError(f"op_log column {col!r} must be integer, is {op_log[col].dtype}.")


def to_csv(op_log: pd.DataFrame, path: str | Path | None = None) -> str:
    """Write the canonical CSV (to ``path`` if given) and return it as a string.

    Raises:
        ValidationError: not an op_log, or a ``path`` that is not a file path. FileError: it cannot be written.
    """
    if path is not None:
        atomic.as_path(path, "to_csv: path")
    check_schema(op_log)
    buf = io.StringIO()
    op_log.to_csv(buf, index=False, lineterminator="\n")
    text = buf.getvalue()
    if path is not None:
        atomic.write_text(path, text)  # whole or not at all: a failed write keeps the old file
    return text


def read_csv(path: str | Path) -> pd.DataFrame:
    """Read an op_log CSV back with the same dtypes :func:`build_op_log` gives (a lossless round trip;
    ``engine``'s categories are the engines and the channels that appear, see :func:`engine_tracks`).

    Raises:
        ValidationError: the file is not an op_log CSV (not CSV, or not the op_log's columns and types).
        FileError: the file cannot be read (an OSError too).
    """
    try:
        df = pd.read_csv(path, keep_default_na=False, dtype={c: "int64" for c in INT_COLUMNS})
    except OSError as exc:
        raise FileError(exc.errno, exc.strerror or str(exc), str(path)) from None
    except (ValueError, pd.errors.ParserError, UnicodeDecodeError) as exc:  # EmptyDataError is a ValueError
        raise ValidationError(f"{str(path)!r} is not an op_log CSV: {exc}") from None
    check_schema(df)
    for col, dtype in (("stage", _STAGE_DTYPE), ("phase", _PHASE_DTYPE)):
        df[col] = pd.Categorical(df[col], dtype=dtype)
    df["engine"] = pd.Categorical(df["engine"], dtype=_dtype(engine_tracks(df["engine"])))
    for col in ("label", "op_kind", "tensor"):
        df[col] = _categorical(list(df[col]))
    return df


def cycles_to_ns(cycles: Sequence[int] | np.ndarray, clock_ghz: float) -> np.ndarray:
    """Cycles as whole nanoseconds at ``clock_ghz``: ``cycles / clock_ghz`` rounded to the nearest
    integer, halves to even (``numpy.rint``). Monotone, so stages that do not overlap in cycles do not
    overlap in nanoseconds."""
    return np.rint(np.asarray(cycles, dtype=np.float64) / clock_ghz).astype(np.int64)


def _us(ns: np.ndarray) -> np.ndarray:
    """Whole nanoseconds as microseconds that a reader turns back into exactly ``ns``.

    ``ns / 1000`` is not always enough: ``1001 / 1000 * 1000`` is
    1000.9999999999999, which truncates to 1000. Such values move up by one
    unit in the last place, so ``us * 1000`` lands in ``[ns, ns + 0.5)`` and
    both truncation and rounding give ``ns``.
    """
    us = ns / 1000.0
    for _ in range(4):
        low = us * 1000.0 < ns
        if not low.any():
            break
        us[low] = np.nextafter(us[low], np.inf)
    return us


def to_perfetto(op_log: pd.DataFrame, path: str | Path | None = None, clock_ghz: float = 1.25,
                process_name: str = "AHBM PE", critical_path: pd.DataFrame | None = None,
                counters: dict[str, Sequence[tuple[int, float]]] | None = None) -> dict:
    """Export as Chrome-trace JSON (``"ph": "X"`` events) that Perfetto's UI opens.

    One process per PE (``process_name`` for PE 0 alone, else ``PE p``), one
    thread (track) per engine unit of it, in track order (each DMA channel its
    own), named by metadata events. Times are whole nanoseconds from
    ``clock_ghz`` (:func:`cycles_to_ns`), rounded before ``dur`` is taken, and
    written in µs (``ts = ns(start) / 1000``, ``dur = (ns(end) - ns(start)) /
    1000``) such that ``× 1000`` gives the nanoseconds back whether the reader
    rounds or truncates: no two slices of one track overlap in Perfetto. There
    is no ``displayTimeUnit`` key (Perfetto would then read ``ts`` as ns).
    Each event's ``args`` carry the op_log columns.

    ``critical_path`` (rows with a ``seq`` column, as ``Run.critical_path()``
    returns) is drawn as one flow through its stages: the path's events carry
    ``bind_id`` with ``flow_out`` (the first), ``flow_in`` (the last) or both,
    Perfetto's flow format that binds to the event itself, and an arg
    ``cause`` when the path gives one.

    ``counters`` (name -> ``(cycle, value)`` steps, e.g. each HBM channel's
    bytes per cycle in use) become counter tracks (``"ph": "C"``) of their own
    process.

    Returns:
        The trace as a dict (also written to ``path`` if given).

    Raises:
        ValidationError: ``op_log`` does not have the op_log schema, ``clock_ghz`` is not a positive
            number, a critical-path seq is not in the op_log, or ``path`` is not a file path.
        FileError: ``path`` cannot be written.
    """
    if path is not None:
        atomic.as_path(path, "to_perfetto: path")
    check_schema(op_log)
    if isinstance(clock_ghz, bool) or not isinstance(clock_ghz, (int, float)) or not 0 < clock_ghz < float("inf"):
        raise ValidationError(f"to_perfetto: clock_ghz must be a positive number of GHz, got {clock_ghz!r}.")
    tracks = engine_tracks(op_log["engine"])
    pes = sorted(pd.unique(op_log["pe"].to_numpy()).tolist()) or [0]
    events: list[dict] = []
    for p in pes:
        name = process_name if pes == [0] else f"PE {p}"  # a PE other than 0 is named, even alone
        events.append({"ph": "M", "name": "process_name", "pid": p + 1, "tid": 0, "args": {"name": name}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": p + 1, "tid": 0, "args": {"sort_index": p}})
        for i, tname in enumerate(tracks):
            events.append({"ph": "M", "name": "thread_name", "pid": p + 1, "tid": i, "args": {"name": tname}})
            events.append({"ph": "M", "name": "thread_sort_index", "pid": p + 1, "tid": i,
                           "args": {"sort_index": i}})
    track_of = {n: i for i, n in enumerate(tracks)}
    ns_start = cycles_to_ns(op_log["start"].to_numpy(), clock_ghz)
    ns_end = cycles_to_ns(op_log["end"].to_numpy(), clock_ghz)
    ts = _us(ns_start).tolist()
    dur = _us(ns_end - ns_start).tolist()
    flow: dict[int, dict] = {}
    if critical_path is not None and len(critical_path):
        row_of = {int(q): i for i, q in enumerate(op_log["seq"].to_numpy())}
        seqs = critical_path["seq"].to_numpy()
        causes = critical_path["cause"].astype(str).tolist() if "cause" in critical_path else [None] * len(seqs)
        last = len(seqs) - 1
        for k, (q, cause) in enumerate(zip(seqs.tolist(), causes)):
            if q not in row_of:
                raise ValidationError(f"critical-path stage {q} is not in the op_log.")
            mark: dict = {"bind_id": 1}
            if k < last:
                mark["flow_out"] = True
            if k > 0:
                mark["flow_in"] = True
            if cause is not None:
                mark["cause"] = cause
            flow[row_of[q]] = mark
    cols = op_log[list(COLUMNS)].itertuples(index=False, name=None)
    for i, (seq, pe, cmd, it, label, stage, engine, op_kind, phase, tile, k_tile, tensor, nbytes, ready, start,
            end) in enumerate(cols):
        name = f"{stage} {op_kind}" + (f" {tensor}" if tensor else "")
        event = {
            "name": name, "cat": stage, "ph": "X", "pid": int(pe) + 1, "tid": track_of[engine], "ts": ts[i],
            "dur": dur[i],
            "args": {"seq": int(seq), "pe": int(pe), "cmd": int(cmd), "iter": int(it), "label": label,
                     "phase": phase,
                     "tile": int(tile), "k_tile": int(k_tile), "bytes": int(nbytes), "ready_cycle": int(ready),
                     "start_cycle": int(start), "end_cycle": int(end)},
        }
        mark = flow.get(i)
        if mark is not None:
            cause = mark.pop("cause", None)
            if cause is not None:
                event["args"]["cause"] = cause
            event.update(mark)
        events.append(event)
    if counters:
        cpid = max(pes) + 2
        events.append({"ph": "M", "name": "process_name", "pid": cpid, "tid": 0, "args": {"name": "HBM channels"}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": cpid, "tid": 0,
                       "args": {"sort_index": max(pes) + 1}})
        for cname, steps in counters.items():
            cyc = np.asarray([c for c, _ in steps], np.int64)
            cts = _us(cycles_to_ns(cyc, clock_ghz)).tolist()
            for t_us, (_, v) in zip(cts, steps):
                events.append({"ph": "C", "name": cname, "pid": cpid, "tid": 0, "ts": t_us,
                               "args": {"bytes per cycle": float(v)}})
    trace = {"traceEvents": events, "otherData": {"clock_ghz": clock_ghz, "source": "kbwork"}}
    if path is not None:
        atomic.write_text(path, json.dumps(trace, separators=(",", ":")))
    return trace


def concat_op_logs(logs: Sequence[pd.DataFrame]) -> pd.DataFrame:
    """Several op_logs (a device's PEs, each numbered in the device's seq) as one, the categorical columns'
    categories united (sorted, as ``read_csv`` rebuilds them) so the result keeps the op_log's dtypes."""
    if len(logs) == 1:
        return logs[0]
    data = {}
    for col in COLUMNS:
        parts = [lg[col] for lg in logs]
        if isinstance(parts[0].dtype, pd.CategoricalDtype) and col not in ("stage", "phase", "engine"):
            cats = sorted(set().union(*(p.cat.categories for p in parts)))
            dtype = pd.CategoricalDtype(cats)
            data[col] = pd.Categorical(pd.concat([p.astype(dtype) for p in parts], ignore_index=True), dtype=dtype)
        elif isinstance(parts[0].dtype, pd.CategoricalDtype):
            cats = parts[0].cat.categories
            if col == "engine":  # every PE has the same units
                cats = max((p.cat.categories for p in parts), key=len)
            dtype = pd.CategoricalDtype(list(cats))
            data[col] = pd.Categorical(pd.concat([p.astype(dtype) for p in parts], ignore_index=True), dtype=dtype)
        else:
            data[col] = np.concatenate([p.to_numpy() for p in parts])
    return _frame(data, sum(len(lg) for lg in logs))
