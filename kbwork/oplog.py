"""The op_log: one row per executed stage, as a pandas DataFrame (DESIGN.md §6).

Columns, in this order: ``seq, cmd, iter, label, stage, engine, op_kind,
phase, tile, k_tile, tensor, bytes, start, end``. The canonical CSV has the
same order, no index and ``\\n`` line endings; the Perfetto/Chrome-trace
export has one track per engine with times in µs from the topology clock.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Sequence

import pandas as pd

from .pe.scheduler import Program
from .pe.stages import Engine, Phase, StageKind

COLUMNS = ("seq", "cmd", "iter", "label", "stage", "engine", "op_kind", "phase", "tile", "k_tile", "tensor",
           "bytes", "start", "end")
INT_COLUMNS = ("seq", "cmd", "iter", "tile", "k_tile", "bytes", "start", "end")
ENGINE_NAMES = tuple(e.name for e in Engine)
STAGE_NAMES = tuple(k.name for k in StageKind)
PHASE_NAMES = tuple(p.label for p in Phase)


def build_op_log(prog: Program, start: Sequence[int], end: Sequence[int]) -> pd.DataFrame:
    """Assemble the op_log DataFrame of a simulated program (rows in seq order)."""
    t = prog.table
    n = len(t)
    cmd = t.cmd
    labels, iters = prog.labels, prog.iters
    data = {
        "seq": range(n),
        "cmd": cmd,
        "iter": [iters[c] for c in cmd],
        "label": [labels[c] for c in cmd],
        "stage": [STAGE_NAMES[k] for k in t.kind],
        "engine": [ENGINE_NAMES[e] for e in t.engine],
        "op_kind": t.op_kind,
        "phase": [PHASE_NAMES[p] for p in t.phase],
        "tile": t.tile,
        "k_tile": t.k_tile,
        "tensor": t.tensor,
        "bytes": t.nbytes,
        "start": start,
        "end": end,
    }
    df = pd.DataFrame(data, columns=list(COLUMNS))
    for col in INT_COLUMNS:
        df[col] = df[col].astype("int64")
    return df


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
    """Read an op_log CSV back (empty strings stay empty, integers stay integers)."""
    df = pd.read_csv(path, keep_default_na=False, dtype={c: "int64" for c in INT_COLUMNS})
    check_schema(df)
    return df


def to_perfetto(op_log: pd.DataFrame, path: str | Path | None = None, clock_ghz: float = 1.25,
                process_name: str = "AHBM PE") -> dict:
    """Export as Chrome-trace JSON (``"ph": "X"`` events) that Perfetto's UI opens.

    One thread (track) per engine, named by metadata events; ``ts``/``dur`` in
    µs from ``clock_ghz``. Each event's ``args`` carry the op_log columns.

    Returns:
        The trace as a dict (also written to ``path`` if given).
    """
    check_schema(op_log)
    per_us = clock_ghz * 1e3
    events: list[dict] = [{"ph": "M", "name": "process_name", "pid": 1, "tid": 0,
                           "args": {"name": process_name}}]
    for i, name in enumerate(ENGINE_NAMES):
        events.append({"ph": "M", "name": "thread_name", "pid": 1, "tid": i, "args": {"name": name}})
        events.append({"ph": "M", "name": "thread_sort_index", "pid": 1, "tid": i, "args": {"sort_index": i}})
    eng_index = {n: i for i, n in enumerate(ENGINE_NAMES)}
    cols = op_log[list(COLUMNS)].itertuples(index=False, name=None)
    for seq, cmd, it, label, stage, engine, op_kind, phase, tile, k_tile, tensor, nbytes, start, end in cols:
        name = f"{stage} {op_kind}" + (f" {tensor}" if tensor else "")
        events.append({
            "name": name, "cat": stage, "ph": "X", "pid": 1, "tid": eng_index[engine],
            "ts": start / per_us, "dur": (end - start) / per_us,
            "args": {"seq": int(seq), "cmd": int(cmd), "iter": int(it), "label": label, "phase": phase,
                     "tile": int(tile), "k_tile": int(k_tile), "bytes": int(nbytes),
                     "start_cycle": int(start), "end_cycle": int(end)},
        })
    trace = {"traceEvents": events, "displayTimeUnit": "ns",
             "metadata": {"clock_ghz": clock_ghz, "source": "kbwork"}}
    if path is not None:
        Path(path).write_text(json.dumps(trace, separators=(",", ":")))
    return trace
