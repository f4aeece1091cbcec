"""Sweeps of decode steps: :func:`sweep`, on local processes or a Dask cluster, resumable (DESIGN.md §12, §15).

A front end of the sweep engine (:mod:`kbwork.sweep`), as :func:`kbwork.decode.sweep` is: the engine takes the
cartesian product of the axes, runs each point as one task of :func:`kbwork.parallel.map_tasks` (same
DataFrame, same row order, wherever it ran) with a ``tqdm`` bar, and keeps the rows in an ``out=`` CSV as
points finish so a stopped sweep continues with ``resume=True``. What is this module's: the axes and their
checks, the point function (:func:`_sweep_point`: every case of a point, one :func:`~kbwork.model.step`
each, :func:`~kbwork.model.steps.compare_row` its row), the record's host, device and models, and what a row
read back must hold (:func:`_read_row`, :func:`_check_row`).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

from .. import sweep as _engine
from ..config import Topology, sweepable_keys
from ..errors import ConfigError, KbworkError, ValidationError
from .. import keys as _keys
from ..keys import sweepable_host_keys
from .checks import check_batch, check_device_tasks, refuse_misnamed
from .device import DEVICE_KEYS, DEVICE_V1, load_device
from .files import load_host, load_model
from .schedule import SCHEDULES
from .tasks import MAPPINGS, MERGES
from .steps import AHBM, BOUND_KINDS, COMPARE_COLUMNS, DEFAULT_VARIANTS, HANDOFF, NO_VARIANT, _check_choice, \
    _check_tile, check_contexts, compare_row, step
from .steps import cases as _cases

def sweep_axes() -> tuple[str, ...]:
    """What :func:`sweep` can sweep: the model, the batch (every sequence at ``context``), the context, the tile,
    the weights' and the KV cache's dtypes (``weight_dtype``, ``kv_dtype``: ``"bf16"`` | ``"fp8"``, over the
    model's own), every sweepable host key and every sweepable topology key (the device keys first), as the key tables say
    (:func:`kbwork.keys.sweepable_host_keys`, :func:`kbwork.config.sweepable_keys`)."""
    topo = sweepable_keys()
    return ("model", "batch", "context", "tile", *DTYPE_AXES, *MAPPING_AXES, *sweepable_host_keys(),
            *(k for k in DEVICE_KEYS if k in topo),
            *(k for k in topo if k not in DEVICE_KEYS))


#: The precision axes (DESIGN.md §17): model keys a point applies over its model's.
DTYPE_AXES = ("weight_dtype", "kv_dtype")
#: The split-KV axes (DESIGN.md §16): how a layer's attention is mapped to PEs and where split chunks merge.
MAPPING_AXES = {"mapping": MAPPINGS, "merge": MERGES}
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
    same record (anything else is refused, saying what differs); every row read back is checked: a damaged
    one refuses the file, naming the line; one that is not a row the sweep wrote (the record keeps a
    digest of every line) or that disagrees with itself (``tokens_per_s`` not the batch over ``seconds``,
    the attention of every layer longer than the step, ``bound`` not ``bound_kind``) runs again, with a
    warning naming the line and why, and so does the rest of its point. The file is rewritten in point
    order at the end.

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
            schedule, shared channels, ``resume=True`` without ``out``, a bad ``client``, a bad ``out`` (or
            one that exists without ``resume=True``, holds another sweep or is damaged); all before the first
            point runs.
        ConfigError: a bad model, host, device or key value.
    """
    refuse_misnamed(axes, "sweep")
    _engine.check_axis_names(axes, sweep_axes())  # read now: the key tables may have grown since import
    if "context" not in axes:
        raise ValidationError("sweep: give a context axis (KV lengths, e.g. context=[1024, 8192, 32768]).")
    _engine.check_switches(resume, progress)
    _engine.check_resume_has_out(resume, out)
    todo_cases = _case_list(variants, placements, schedules)
    base_host = load_host(host)
    base_device = load_device(device)
    axes = {**{k: v for k, v in _ALWAYS.items() if k not in axes}, **axes}
    names = ["model", "batch", "context"] + [n for n in axes if n not in ("model", "batch", "context")]
    values = _engine.axis_values(axes, names)
    _engine.check_axes(names, values, lambda name, val: _check_axis_value(name, val, base_host, base_device))
    points = _engine.points(names, values)
    for point in points:  # combinations (a context past the tile limit, pes vs channels): fail now
        _point_config(point, base_host, base_device, any(p == AHBM for _, p, _ in todo_cases))
    df = _engine.run(_sweep_front(names, values, todo_cases, base_host, base_device), names, values, points,
                     out=out, resume=resume, progress=progress, workers=workers, client=client)
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
        elif name in DTYPE_AXES:
            _keys.MODEL.check(name, val)
        elif name in MAPPING_AXES:
            _check_choice(name, val, MAPPING_AXES[name], "sweep")
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
                 schedule=schedule, tile=point.get("tile", 128), check_capacity=False,  # rows carry fits
                 **{k: point[k] for k in (*DTYPE_AXES, *MAPPING_AXES) if k in point})
        rows.append({**point, **compare_row(s)})
    return rows


#: The version of a model sweep's rows; a file of another schema is not resumed.
SWEEP_SCHEMA = 3  # 2: the fits column; 3: joules, tokens_per_j, watts (DESIGN §18)


def _sweep_front(names: list[str], values: list[list], todo_cases: list[tuple[str, str, str]], base_host: Any,
                 base_device: Any) -> _engine.Front:
    """What a model sweep gives the engine: its point function (:func:`_sweep_point`, every case of a point),
    one row per case, and its columns. The record holds the axes, the cases, the host, the device's topology and
    the content of every model swept."""
    from .. import __version__

    def fields(x: Any) -> dict[str, Any]:
        d = dataclasses.asdict(x)
        d.pop("source", None)
        return d

    models = {str(m): fields(load_model(m)) for m in values[names.index("model")]}
    return _engine.Front(
        label="model sweep", what="kbwork.model.sweep", schema=SWEEP_SCHEMA, point=_sweep_point,
        task=lambda point, _keys: (point, todo_cases, base_host, base_device),
        keys=tuple((v if p == AHBM else NO_VARIANT, p, s) for v, p, s in todo_cases),  # as the rows show them
        key_columns=("variant", "placement", "schedule"), metrics=METRICS, read_row=_read_row, check_row=_check_row,
        record={"kbwork": __version__, "cases": todo_cases, "host": fields(base_host),
                "device": base_device.topology.to_dict(), "models": models},
        keys_field="cases", compared=("cases", "columns", "models"), setups=("host", "device"),
        whole_points=True, index_word="a point index")


def _read_row(fields: dict[str, str], point: dict, bad: Any) -> dict[str, Any]:
    """A row's metrics read back from a sweep file, typed, in :data:`METRICS` order; ``bad(column, want)`` for
    a value its column cannot hold (times and rates finite and positive, the bounds named). A column of
    :func:`~kbwork.model.steps.compare_row` needs its reader here."""
    row: dict[str, Any] = {}
    for column in METRICS[3:]:
        if column in ("seconds", "tokens_per_s", "attention_us_per_layer", "joules", "tokens_per_j", "watts"):
            positive = column in ("seconds", "tokens_per_s")
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
        elif column in ("bound_kind", "bound"):
            if not fields[column]:
                raise bad(column, "what bounds the step")
            row[column] = fields[column]
        elif column == "fits":
            if fields[column] not in ("True", "False"):
                raise bad(column, "True or False")
            row[column] = fields[column] == "True"
        else:  # a new column of compare_row read back as text would differ from the row computed
            raise AssertionError(f"model sweep: no reader for column {column!r}; add one to _read_row")
    return row


def _check_row(row: dict[str, Any], point: dict) -> str | None:
    """Why a model sweep row disagrees with itself, or None: ``tokens_per_s`` is the batch over ``seconds``; the
    attention of every layer fits in the step; ``bound`` says ``bound_kind`` (with the device run's own bound
    after ``"ahbm: "``), a kind the placement can have."""
    seconds, batch = row["seconds"], point["batch"]
    if not math.isclose(row["tokens_per_s"], batch / seconds, rel_tol=1e-9):
        return f"tokens_per_s {row['tokens_per_s']!r} is not the batch {batch} over seconds {seconds!r}"
    layers = load_model(point["model"]).layers
    attention_s = row["attention_us_per_layer"] * 1e-6 * layers
    if attention_s > seconds * (1 + 1e-9):
        return (f"attention_us_per_layer {row['attention_us_per_layer']!r} over {layers} layers is "
                f"{attention_s!r} s, longer than the whole step ({seconds!r} s)")
    kind, bound = row["bound_kind"], row["bound"]
    if kind not in BOUND_KINDS or (row["placement"] != AHBM and kind in (AHBM, HANDOFF)):
        return f"bound_kind {kind!r} is not what can bound a step placed on {row['placement']}"
    if bound != kind and not (kind == AHBM and bound.startswith(f"{AHBM}: ")):
        return f"bound {bound!r} contradicts bound_kind {kind!r}"
    return None
