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
import math
import numbers
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

from ..config import sweepable_keys
from ..errors import ConfigError, KbworkError, ValidationError
from ..keys import sweepable_host_keys
from ..sweepfile import SweepFile, check_switches
from .checks import check_batch, check_device_tasks, refuse_misnamed
from .device import DEVICE_KEYS, DEVICE_V1, load_device
from .files import load_host, load_model
from .schedule import SCHEDULES
from .steps import AHBM, COMPARE_COLUMNS, DEFAULT_VARIANTS, NO_VARIANT, _check_choice, _check_tile, \
    check_contexts, compare_row, step
from .steps import cases as _cases

def sweep_axes() -> tuple[str, ...]:
    """What :func:`sweep` can sweep: the model, the batch (every sequence at ``context``), the context, the tile,
    every sweepable host key and every sweepable topology key (the device keys first), as the key tables say
    (:func:`kbwork.keys.sweepable_host_keys`, :func:`kbwork.config.sweepable_keys`)."""
    topo = sweepable_keys()
    return ("model", "batch", "context", "tile", *sweepable_host_keys(), *(k for k in DEVICE_KEYS if k in topo),
            *(k for k in topo if k not in DEVICE_KEYS))


#: :func:`sweep_axes` when kbwork was imported.
SWEEP_AXES = sweep_axes()
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
    point's rows as it finishes, with its ``point`` index, and ``<out>.meta.json`` beside it (written
    before the first row) records what decides the rows: the axes, the cases, the host, the device's
    topology and every swept model's content. ``resume=True`` continues a sweep from that file under the
    same record (anything else is refused, saying what differs); every row read back is checked, and the
    file is rewritten in point order at the end.

    Returns:
        One row per (point, case): the axis values (``model``, ``batch``, ``context`` first), then
        ``variant`` (``"-"`` for the host), ``placement``, ``schedule``, ``seconds``, ``tokens_per_s``,
        ``attention_us_per_layer``, ``bound_kind``, ``bound``, ``fits`` (whether the step's weights and KV
        cache fit where they are placed; a point that does not is timed all the same). Its ``attrs`` record the host and the
        device the steps ran on (``"host"``: the host keys, ``"device"``: every topology key, before the
        swept axes), so :func:`~kbwork.model.with_bounds` and ``plots.tokens_per_s`` draw that device's bound.

    Raises:
        ValidationError: an unknown axis (``variant=``, ``placement=``, ``schedule=`` and ``mode=`` say what
            the sweep takes instead), an axis without values, a value of the wrong type (naming the axis), a
            batch beyond :data:`~kbwork.model.checks.MAX_BATCH` or, on the device, beyond
            :data:`~kbwork.model.checks.MAX_DEVICE_TASKS` tasks per layer, a bad variant, placement or
            schedule, shared channels, a bad ``out`` (or one that exists without ``resume=True``, or holds
            another sweep); all before the first point runs.
        ConfigError: a bad model, host, device or key value.
    """
    from .. import parallel

    refuse_misnamed(axes, "sweep")
    known = sweep_axes()
    unknown = [a for a in axes if a not in known]
    if unknown:
        raise ValidationError(f"sweep: unknown axis {', '.join(unknown)}; axes are {', '.join(known)}.")
    if "context" not in axes:
        raise ValidationError("sweep: give a context axis (KV lengths, e.g. context=[1024, 8192, 32768]).")
    check_switches(resume, progress)
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
    log = (_SweepLog(out, names, todo_cases, points, bool(resume),
                     _sweep_meta(names, values, todo_cases, base_host, base_device)) if out is not None else None)
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
        log.write_rows(rows_of)
    df = pd.DataFrame([row for i in range(len(points)) for row in rows_of[i]], columns=[*names, *METRICS])
    record_setup(df, base_host, base_device)
    return df


#: The keys of a sweep frame's ``attrs`` that record the host and the device its steps ran on (before the
#: swept axes, which are columns).
SETUP_ATTRS = ("host", "device")


def record_setup(frame: pd.DataFrame, host: Any, device: Any) -> None:
    """Record ``host`` and ``device`` in ``frame.attrs`` (``"host"``: the host keys, ``"device"``: every
    topology key), as plain JSON values: pandas keeps them through selections and through ``pd.concat`` of
    frames that record the same, and ``to_parquet`` stores them."""
    frame.attrs["host"] = load_host(host).to_dict()
    frame.attrs["device"] = load_device(device).topology.to_dict()


def recorded_setup(frame: Any, where: str) -> tuple[Any, Any]:
    """The host and device a sweep frame records (:func:`record_setup`), each ``None`` when it records
    none (a frame built by hand, read from a CSV, or concatenated from sweeps of different setups).

    Raises:
        ValidationError: a record that is not a valid host or device (naming the attribute).
    """
    from ..config import Topology

    attrs = getattr(frame, "attrs", None) or {}
    host = device = None
    try:
        if attrs.get("host") is not None:
            host = load_host(dict(attrs["host"]))
        if attrs.get("device") is not None:
            device = load_device(Topology().replace(**dict(attrs["device"])))
    except (KbworkError, TypeError, ValueError) as exc:
        raise ValidationError(f"{where}: the frame's attrs record no valid host and device ({exc}); drop "
                              f"frame.attrs['host'] and frame.attrs['device'] and pass host= and device=.") from None
    return host, device


def setup_of(frame: Any, host: Any, device: Any, where: str) -> tuple[Any, Any]:
    """The host and device to read ``frame`` (a sweep) at: ``host`` and ``device`` where given, else the ones
    the frame records (:func:`recorded_setup`), else ``h200`` and ``ahbm-device-v1``. A Host and a Device.

    Raises:
        ValidationError: the frame records an invalid host or device.
        ConfigError: a bad ``host`` or ``device``.
    """
    rec_host, rec_device = recorded_setup(frame, where)
    return (load_host(host if host is not None else rec_host if rec_host is not None else "h200"),
            load_device(device if device is not None else rec_device if rec_device is not None else DEVICE_V1))


def _check_axis_value(name: str, val: Any, base_host: Any, base_device: Any) -> None:
    try:
        if name == "model":
            load_model(val)
        elif name in ("batch", "context", "tile"):
            _positive_int(name, val)
            if name == "batch":
                check_batch(int(val), "sweep", "axis 'batch'")
        elif name in sweepable_host_keys():
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
    host_keys = {k: v for k, v in point.items() if k in sweepable_host_keys()}
    dev_keys = {k: v for k, v in point.items() if k in sweepable_keys()}
    tile = point.get("tile", 128)
    _check_tile(tile, "sweep")
    check_contexts([point["context"]], tile, "sweep")
    if on_device:
        check_device_tasks(point["batch"], load_model(point["model"]).kv_heads, "sweep")
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
                 schedule=schedule, tile=point.get("tile", 128), check_capacity=False)  # rows carry fits
        rows.append({**point, **compare_row(s)})
    return rows


def _same(a: Any, b: Any) -> bool:
    """A value read back from the CSV equals the point's (``2`` and ``2.0`` are the same number)."""
    if isinstance(a, numbers.Real) and isinstance(b, numbers.Real) and not isinstance(a, bool) \
            and not isinstance(b, bool):
        return float(a) == float(b)
    return str(a) == str(b)


#: The version of a model sweep's rows; a file of another schema is not resumed.
SWEEP_SCHEMA = 3  # 2: the fits column; 3: joules, tokens_per_j, watts (DESIGN §18)


def _sweep_meta(names: list[str], values: list[list], todo_cases: list[tuple[str, str, str]], base_host: Any,
                base_device: Any) -> dict[str, Any]:
    """Everything that decides a model sweep's rows, as plain JSON values (the ``<out>.meta.json`` sidecar):
    the axes, the cases, the host, the device's topology and the content of every model swept."""
    from .. import __version__
    from ..decode import _json_value

    def fields(x: Any) -> dict[str, Any]:
        d = dataclasses.asdict(x)
        d.pop("source", None)
        return d

    models = {str(m): fields(load_model(m)) for m in values[names.index("model")]}
    return _json_value({"what": "kbwork.model.sweep", "schema": SWEEP_SCHEMA, "kbwork": __version__,
                        "axes": [[n, vals] for n, vals in zip(names, values)], "cases": todo_cases,
                        "columns": list(METRICS), "host": fields(base_host),
                        "device": base_device.topology.to_dict(), "models": models})


def _meta_differences(recorded: dict[str, Any], meta: dict[str, Any]) -> list[str]:
    """How the recorded sweep differs from this one, in words (empty: it may be resumed). A host or device
    key that an axis sets at every point decides no row and is not compared."""
    from ..decode import _same_value, _same_values

    diffs = []
    if recorded.get("schema") != meta["schema"]:
        diffs.append(f"it holds results of model sweep schema {recorded.get('schema')!r} (kbwork "
                     f"{recorded.get('kbwork', '?')}), this kbwork's is {meta['schema']}, whose rows differ")
    rec_axes = recorded.get("axes")
    if not isinstance(rec_axes, list) or [a[0] if isinstance(a, list) and a else a for a in rec_axes] != \
            [a[0] for a in meta["axes"]]:
        diffs.append(f"the axes differ: {rec_axes!r} there, {[a[0] for a in meta['axes']]} here")
    else:
        moved = [f"axis {name!r} is {was} there, {now} here" for (name, was), (_, now) in zip(rec_axes, meta["axes"])
                 if not _same_values(was, now)]
        if moved:
            diffs.append(f"the axes differ: {'; '.join(moved)}")
    for key in ("cases", "columns", "models"):
        if recorded.get(key) != meta[key]:
            diffs.append(f"{key} {recorded.get(key)} there, {meta[key]} here")
    swept = {a[0] for a in meta["axes"]}
    for part in ("host", "device"):
        was, now = recorded.get(part), meta[part]
        if not isinstance(was, dict):
            diffs.append(f"the file records no {part}")
            continue
        for key in sorted(set(was) | set(now)):
            if key == "name" or key in swept:
                continue
            if key not in was or key not in now or not _same_value(was[key], now[key]):
                diffs.append(f"{part} {key} is {was.get(key, '(absent)')} there, {now.get(key, '(absent)')} here")
    return diffs


class _SweepLog(SweepFile):
    """A sweep's rows on disk as they finish (``point`` first), so the sweep can resume from the file.

    The sidecar ``<path>.meta.json`` records what decides the rows (:func:`_sweep_meta`), written before
    the first row; a resume under anything else is refused, saying what differs. Every row read back is
    checked; a damaged one is refused, never returned.
    """

    def __init__(self, path: str | Path, names: list[str], todo_cases: list[tuple[str, str, str]],
                 points: list[dict], resume: bool, meta: dict[str, Any]):
        super().__init__(path, "kbwork.model.sweep", "a kbwork model sweep record", ["point", *names, *METRICS])
        self.done: dict[int, list[dict]] = {}
        if self.open(resume, meta, _meta_differences) is not None:
            self._read(names, todo_cases, points)
            self.write_rows(self.done)  # without the rows of points cut short, which run again

    def _read(self, names: list[str], todo_cases: list[tuple[str, str, str]], points: list[dict]) -> None:
        text = self.read_text()
        if not text.endswith("\n"):  # a write cut short: drop the torn last line
            text = text[:text.rfind("\n") + 1]
        try:
            df = pd.read_csv(io.StringIO(text), keep_default_na=False, dtype=str)
        except (pd.errors.ParserError, pd.errors.EmptyDataError, ValueError) as exc:
            raise self.refuse(f"it is not a sweep file ({exc}).") from None
        if list(df.columns) != self.columns:
            raise self.refuse(f"its columns {list(df.columns)} are not this sweep's {self.columns}; write to "
                              f"another file.")
        want_cases = [[v if p == AHBM else NO_VARIANT, p, s] for v, p, s in todo_cases]  # as the rows show them
        for number, fields in enumerate(df.to_dict(orient="records"), start=2):
            if not (fields["point"].isascii() and fields["point"].isdigit()):
                raise self.refuse(f"line {number}: point is {fields['point']!r}, not a point index; the file is "
                                  f"damaged. Remove that line (its point then runs again) or write to another file.")
        df["point"] = df["point"].astype(int)
        for point, group in df.groupby("point", sort=True):
            i = int(point)
            got = group[["variant", "placement", "schedule"]].values.tolist()
            if not 0 <= i < len(points) or got != want_cases:
                continue  # a point cut short (or from another sweep): run it again
            want = points[i]
            rows = []
            for number, fields in zip(group.index + 2, group.to_dict(orient="records")):
                if not all(_same(_number_or_text(fields[n]), want[n]) for n in names):
                    raise self.refuse(f"its point {i} is { {n: fields[n] for n in names} }, this sweep's is "
                                      f"{want}; the axes differ.")
                rows.append({**want, **self._metrics(fields, number, want)})
            self.done[i] = rows

    def _metrics(self, fields: dict[str, str], number: int, point: dict) -> dict[str, Any]:
        """One row's metrics, typed and checked (``tokens_per_s`` is the batch over ``seconds``)."""
        def bad(column: str, want: str) -> ValidationError:
            return self.refuse(f"line {number}: {column} is {fields[column]!r}, not {want}; the file is damaged. "
                               f"Remove that line (its point then runs again) or write to another file.")

        row: dict[str, Any] = {c: fields[c] for c in ("variant", "placement", "schedule")}
        for column, positive in (("seconds", True), ("tokens_per_s", True), ("attention_us_per_layer", False),
                                 ("joules", False), ("tokens_per_j", False), ("watts", False)):
            try:
                v = float(fields[column])
            except ValueError:
                raise bad(column, "a number") from None
            if column == "tokens_per_j" and v == math.inf and float(fields["joules"]) == 0:
                row[column] = v  # every energy key 0: a free step
                continue
            if not math.isfinite(v) or v < 0 or (positive and v == 0):
                raise bad(column, "a finite number > 0" if positive else "a finite number >= 0")
            row[column] = v
        if not math.isclose(row["tokens_per_s"], point["batch"] / row["seconds"], rel_tol=1e-9):
            raise bad("tokens_per_s", f"the batch {point['batch']} over seconds {row['seconds']!r}")
        for column in ("bound_kind", "bound"):
            if not fields[column]:
                raise bad(column, "what bounds the step")
            row[column] = fields[column]
        if fields["fits"] not in ("True", "False"):
            raise bad("fits", "True or False")
        row["fits"] = fields["fits"] == "True"
        return row


def _number_or_text(text: str) -> Any:
    """A CSV field as the value it was written from: a number if it reads as one, else the text."""
    try:
        return int(text) if text.lstrip("-").isdigit() else float(text)
    except ValueError:
        return text
