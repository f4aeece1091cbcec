"""Sweeps of decode steps: :func:`sweep`, on local processes or a Dask cluster, resumable (DESIGN.md §12, §15).

Like :func:`kbwork.decode.sweep`: the cartesian product of the axes, each point
one task of :func:`kbwork.parallel.map_tasks` (same DataFrame, same row order,
wherever it ran), a ``tqdm`` bar, and an ``out=`` CSV that receives the rows
as points finish so a stopped sweep continues with ``resume=True``.
"""

from __future__ import annotations

import dataclasses
import io
import itertools
import numbers
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

from ..config import Topology
from ..errors import ConfigError, ValidationError
from .device import DEVICE_KEYS, DEVICE_V1, load_device
from .files import HOST_KEYS, load_host, load_model
from .schedule import SCHEDULES
from .steps import AHBM, COMPARE_COLUMNS, DEFAULT_VARIANTS, NO_VARIANT, _check_choice, _check_tile, \
    check_contexts, compare_row, step
from .steps import cases as _cases

_TOPOLOGY_KEYS = tuple(f.name for f in dataclasses.fields(Topology) if f.name not in ("name", "source"))
_HOST_AXES = HOST_KEYS[1:]
#: What :func:`sweep` can sweep: the model, the batch (every sequence at ``context``), the context, the tile,
#: every host key, the device keys and every topology key.
SWEEP_AXES = ("model", "batch", "context", "tile", *_HOST_AXES, *DEVICE_KEYS, *_TOPOLOGY_KEYS)
#: The axes every sweep has, with their defaults (``context`` has none: it must be given).
_ALWAYS = {"model": "llama-3-8b", "batch": 1}
METRICS = ("variant", "placement", "schedule", *COMPARE_COLUMNS[3:])


def _case_list(variants: Any, placements: Any, schedules: Any) -> list[tuple[str, str, str]]:
    if isinstance(schedules, str) or not isinstance(schedules, (list, tuple)) or not schedules:
        raise ValidationError(f"sweep: schedules must be a non-empty list or tuple of {SCHEDULES}, got {schedules!r}.")
    for s in schedules:
        _check_choice("schedule", s, SCHEDULES, "sweep")
    if len(set(schedules)) != len(schedules):
        raise ValidationError(f"sweep: schedules {tuple(schedules)} name a schedule twice.")
    out = []
    for v, p in _cases(variants, placements, "sweep"):
        out += [(v, p, s) for s in schedules] if p == AHBM else [(v, p, "serial")]
    return out


def _positive_int(name: str, val: Any) -> None:
    if isinstance(val, (bool, np.bool_)) or not isinstance(val, numbers.Integral) or val <= 0:
        raise ValidationError(f"sweep: axis {name!r} takes positive ints, got {val!r} ({type(val).__name__}).")


def sweep(*, variants: Sequence[str] = DEFAULT_VARIANTS, placements: Sequence[str] = (AHBM,),
          schedules: Sequence[str] = ("serial",), device: Any = DEVICE_V1, host: Any = "h200",
          progress: bool = True, client: Any = None, workers: int | None = None, out: str | Path | None = None,
          resume: bool = False, **axes: Any) -> pd.DataFrame:
    """A decode step at every point of the cartesian product of ``axes``, for every case.

    Each axis is a list (a scalar is a one-point axis), e.g.
    ``sweep(model="llama-3-8b", batch=[1, 4, 16, 64], context=[1024, 8192, 32768], handoff_us=[0, 2, 8])``;
    the axes are :data:`SWEEP_AXES` (every sequence of a point has the point's ``context``; ``model``
    defaults to ``"llama-3-8b"`` and ``batch`` to 1; ``context`` must be given). The cases of a point are
    every variant on the device under every schedule, and the host alone once (serial), as
    ``placements`` asks.

    Points run on this machine's cores in processes (``workers=1``: here, in order; small sweeps always
    run here) or on a Dask cluster when ``client`` is a ``distributed.Client`` or a scheduler address
    (:mod:`kbwork.parallel`); the DataFrame is the same either way. ``out`` (a ``.csv``) receives each
    point's rows as it finishes, with its ``point`` index; ``resume=True`` continues a sweep from that
    file (the same axes and cases), and the file is rewritten in point order at the end.

    Returns:
        One row per (point, case): the axis values (``model``, ``batch``, ``context`` first), then
        ``variant`` (``"-"`` for the host), ``placement``, ``schedule``, ``seconds``, ``tokens_per_s``,
        ``attention_us_per_layer``, ``bound_kind``, ``bound``.

    Raises:
        ValidationError: an unknown axis, an axis without values, a value of the wrong type (naming the
            axis), a bad variant, placement or schedule, shared channels, a bad ``out`` (or one that exists
            without ``resume=True``, or holds another sweep); all before the first point runs.
        ConfigError: a bad model, host, device or key value.
    """
    from .. import parallel

    unknown = [a for a in axes if a not in SWEEP_AXES]
    if unknown:
        raise ValidationError(f"sweep: unknown axis {', '.join(unknown)}; axes are {', '.join(SWEEP_AXES)}.")
    if "context" not in axes:
        raise ValidationError("sweep: give a context axis (KV lengths, e.g. context=[1024, 8192, 32768]).")
    if not isinstance(resume, (bool, np.bool_)):
        raise ValidationError(f"sweep: resume={resume!r}; pass True (continue the sweep in out=) or False.")
    todo_cases = _case_list(variants, placements, schedules)
    base_host = load_host(host)
    base_device = load_device(device)
    axes = {**{k: v for k, v in _ALWAYS.items() if k not in axes}, **axes}
    names = ["model", "batch", "context"] + [n for n in axes if n not in ("model", "batch", "context")]
    values = [list(v) if isinstance(v, (list, tuple, range, np.ndarray)) else [v] for v in (axes[n] for n in names)]
    for name, vals in zip(names, values):
        if not vals:
            raise ValidationError(f"sweep: axis {name!r} has no values; give at least one.")
        for val in vals:
            _check_axis_value(name, val, base_host, base_device)
    points = [{n: (v.item() if isinstance(v, np.generic) else v) for n, v in zip(names, p)}
              for p in itertools.product(*values)]
    for point in points:  # combinations (a context past the tile limit, pes vs channels): fail now
        _point_config(point, base_host, base_device, any(p == AHBM for _, p, _ in todo_cases))
    log = _SweepLog(out, names, todo_cases, points, bool(resume)) if out is not None else None
    todo = [i for i in range(len(points)) if log is None or i not in log.done]
    tasks = [(points[i], todo_cases, base_host, base_device) for i in todo]
    rows_of: dict[int, list[dict]] = dict(log.done) if log is not None else {}

    def finished(k: int, rows: list[dict]) -> None:
        rows_of[todo[k]] = rows
        if log is not None:
            log.append(todo[k], rows)

    parallel.map_tasks(_sweep_point, tasks, client=client, workers=workers,
                       progress=progress and len(tasks) * len(todo_cases) > 4, desc="model sweep", unit="point",
                       on_result=finished)
    if log is not None:
        log.rewrite(rows_of)
    return pd.DataFrame([row for i in range(len(points)) for row in rows_of[i]], columns=[*names, *METRICS])


def _check_axis_value(name: str, val: Any, base_host: Any, base_device: Any) -> None:
    try:
        if name == "model":
            load_model(val)
        elif name in ("batch", "context", "tile"):
            _positive_int(name, val)
        elif name in _HOST_AXES:
            base_host.replace(**{name: val})
        elif name in ("pes", "hbm_channels"):  # alone here; against each other per point
            base_device.replace(**{"pes": val, "hbm_channels": 1} if name == "pes" else
                                {"pes": val, "hbm_channels": val})
        else:
            base_device.replace(**{name: val})
    except ConfigError as exc:
        raise ConfigError(f"sweep: axis {name!r}: {exc}") from None


def _point_config(point: dict, base_host: Any, base_device: Any, on_device: bool) -> tuple[Any, Any, dict]:
    """The host, device and topology overrides of one point (validated)."""
    host_keys = {k: v for k, v in point.items() if k in _HOST_AXES}
    dev_keys = {k: v for k, v in point.items() if k in DEVICE_KEYS or k in _TOPOLOGY_KEYS}
    tile = point.get("tile", 128)
    _check_tile(tile, "sweep")
    check_contexts([point["context"]], tile, "sweep")
    h = base_host.replace(**host_keys) if host_keys else base_host
    d = load_device(base_device, **dev_keys)
    return h, d, dev_keys


def _sweep_point(task: tuple) -> list[dict]:
    """Every case at one point: the rows :func:`sweep` returns for it (runs in a worker)."""
    point, todo_cases, base_host, base_device = task
    h, d, _ = _point_config(point, base_host, base_device, False)
    contexts = [point["context"]] * point["batch"]
    rows = []
    for variant, placement, schedule in todo_cases:
        s = step(point["model"], contexts, variant=variant, device=d, host=h, placement=placement,
                 schedule=schedule, tile=point.get("tile", 128))
        rows.append({**point, **compare_row(s)})
    return rows


def _same(a: Any, b: Any) -> bool:
    """A value read back from the CSV equals the point's (``2`` and ``2.0`` are the same number)."""
    if isinstance(a, numbers.Real) and isinstance(b, numbers.Real) and not isinstance(a, bool) \
            and not isinstance(b, bool):
        return float(a) == float(b)
    return str(a) == str(b)


class _SweepLog:
    """A sweep's rows on disk as they finish (``point`` first), so the sweep can resume from the file."""

    def __init__(self, path: str | Path, names: list[str], todo_cases: list[tuple[str, str, str]],
                 points: list[dict], resume: bool):
        from .. import atomic

        self.path = Path(atomic.check_output_path(path, suffix=".csv", what="sweep out"))
        self.columns = ["point", *names, *METRICS]
        self.done: dict[int, list[dict]] = {}
        if self.path.exists() and self.path.stat().st_size:
            if not resume:
                raise ValidationError(f"sweep: {str(self.path)!r} exists; pass resume=True to continue that sweep, "
                                      f"or remove the file to start afresh.")
            self._read(names, todo_cases, points)
            self.rewrite(self.done)  # without the rows of points cut short, which run again
        else:
            self.path.write_text(",".join(self.columns) + "\n")

    def _read(self, names: list[str], todo_cases: list[tuple[str, str, str]], points: list[dict]) -> None:
        text = self.path.read_text()
        if not text.endswith("\n"):  # a write cut short: drop the torn last line
            text = text[:text.rfind("\n") + 1]
        try:
            df = pd.read_csv(io.StringIO(text), keep_default_na=False)
        except (pd.errors.ParserError, pd.errors.EmptyDataError, ValueError) as exc:
            raise ValidationError(f"sweep: cannot resume from {str(self.path)!r}: it is not a sweep file ({exc}).") \
                from None
        if list(df.columns) != self.columns:
            raise ValidationError(f"sweep: cannot resume from {str(self.path)!r}: its columns {list(df.columns)} are "
                                  f"not this sweep's {self.columns}; write to another file.")
        want_cases = [[v if p == AHBM else NO_VARIANT, p, s] for v, p, s in todo_cases]  # as the rows show them
        for point, group in df.groupby("point", sort=True):
            i = int(point)
            got = group[["variant", "placement", "schedule"]].astype(str).values.tolist()
            if not 0 <= i < len(points) or got != want_cases:
                continue  # a point cut short (or from another sweep): run it again
            rows = group.drop(columns="point").to_dict(orient="records")
            want = points[i]
            if not all(_same(rows[0][n], want[n]) for n in names):
                raise ValidationError(f"sweep: cannot resume from {str(self.path)!r}: its point {i} is "
                                      f"{ {n: rows[0][n] for n in names} }, this sweep's is {want}; the axes differ.")
            self.done[i] = [{**want, **{k: r[k] for k in METRICS}} for r in rows]

    def _rows_csv(self, rows: list[dict], point: int) -> str:
        buf = io.StringIO()
        pd.DataFrame([{"point": point, **r} for r in rows], columns=self.columns).to_csv(
            buf, header=False, index=False, lineterminator="\n")
        return buf.getvalue()

    def append(self, point: int, rows: list[dict]) -> None:
        """Add one finished point's rows to the file."""
        with open(self.path, "a", newline="") as f:
            f.write(self._rows_csv(rows, point))

    def rewrite(self, rows_of: dict[int, list[dict]]) -> None:
        """Replace the file (atomically) by the header and ``rows_of`` in point order."""
        from .. import atomic

        atomic.write_text(self.path, ",".join(self.columns) + "\n"
                          + "".join(self._rows_csv(rows_of[i], i) for i in sorted(rows_of)))

