"""The sweep engine behind ``decode.sweep`` and ``model.sweep`` (DESIGN.md §12, §19).

A sweep computes rows at every point of the cartesian product of its axes: at
each point one row per *key* (a decode variant; a model step's case). What a
front end gives the engine is a :class:`Front`: the function a point runs, the
task it sends for a point, its row keys and columns, how a row read back from
a file is typed (refusing a value that cannot be one of its column's) and
whether a typed row agrees with itself. Everything else is here, once:

* the axes: their names (:func:`check_axis_names`), their values as lists of
  plain Python values (:func:`axis_values`, :func:`check_axes`) and the points
  (:func:`points`);
* running the points on this process, local processes or a Dask cluster
  (:mod:`kbwork.parallel`), with a ``tqdm`` bar, and the DataFrame, one row per
  (point, key) in point order whatever finished first (:func:`run`);
* the ``out=`` CSV and its record ``<out>.meta.json`` (:class:`SweepFile`):
  rows appended whole as points finish; the record (what decides the rows,
  written before the first row) compared on resume, a resume under anything
  else refused naming every difference (:func:`record_differences`); every row
  read back checked, a damaged file refused naming the line;
* the re-check of a row taken back on resume: the record keeps a digest of
  every line written, and a row whose line is not one of them (edited by
  hand) or that disagrees with itself (the front end's ``check_row``) is not
  taken back: it is computed again, with a warning naming the line and why.
"""

from __future__ import annotations

import csv
import hashlib
import io
import itertools
import json
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Hashable, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from . import atomic
from .errors import ValidationError

#: The record's field listing the digest of every CSV line written (:func:`row_digest`).
ROW_DIGESTS = "row_digests"


def check_switches(resume: Any, progress: Any) -> None:
    """Refuse a sweep's ``resume=`` or ``progress=`` that is not True or False (``progress="no"`` would draw a bar).

    Raises:
        ValidationError: naming the switch, what was given and what each value does.
    """
    if not isinstance(resume, (bool, np.bool_)):
        raise ValidationError(f"sweep: resume={resume!r}; pass True (continue the sweep in out=) or False.")
    if not isinstance(progress, (bool, np.bool_)):
        raise ValidationError(f"sweep: progress={progress!r}; pass True (a progress bar on stderr) or False.")


def check_resume_has_out(resume: Any, out: Any) -> None:
    """Refuse ``resume=True`` without an ``out=`` file to resume from.

    Raises:
        ValidationError: saying to pass the file.
    """
    if resume and out is None:
        raise ValidationError("sweep: resume=True continues the sweep recorded in out=, but no out= is given; pass "
                              "the file the sweep writes to (out='sweep.csv').")


# --- axes ------------------------------------------------------------------------------------------
def check_axis_names(axes: Iterable[str], allowed: Sequence[str]) -> None:
    """Refuse an axis not in ``allowed`` (the front end's axis list).

    Raises:
        ValidationError: naming every unknown axis and the axes there are.
    """
    unknown = [a for a in axes if a not in allowed]
    if unknown:
        raise ValidationError(f"sweep: unknown axis {', '.join(unknown)}; axes are {', '.join(allowed)}.")


def axis_values(axes: Mapping[str, Any], names: Sequence[str]) -> list[list]:
    """Each axis of ``names`` as a list of plain Python values: a list, tuple, range or array is its values, anything
    else a one-point axis; numpy scalars become Python numbers (the record is JSON, the rows compare by value)."""
    return [[v.item() if isinstance(v, np.generic) else v
             for v in (list(x) if isinstance(x, (list, tuple, range, np.ndarray)) else [x])]
            for x in (axes[n] for n in names)]


def check_axes(names: Sequence[str], values: Sequence[list], check_value: Callable[[str, Any], None]) -> None:
    """Refuse an axis without values; call ``check_value(name, value)`` (which raises) on every value.

    Raises:
        ValidationError: an empty axis; and whatever ``check_value`` raises.
    """
    for name, vals in zip(names, values):
        if not vals:
            raise ValidationError(f"sweep: axis {name!r} has no values; give at least one.")
        for val in vals:
            check_value(name, val)


def points(names: Sequence[str], values: Sequence[list]) -> list[dict[str, Any]]:
    """The cartesian product of the axes, in order (the last axis varies fastest), one dict per point."""
    return [dict(zip(names, p)) for p in itertools.product(*values)]


# --- values as the record and the file hold them ---------------------------------------------------
def json_value(x: Any) -> Any:
    """``x`` as it reads back from JSON (tuples become lists, numpy scalars Python numbers)."""
    return json.loads(json.dumps(x, default=lambda o: o.item() if isinstance(o, np.generic) else str(o)))


def same_value(a: Any, b: Any) -> bool:
    """Equal by value: ``0 == 0.0`` (an axis may mix ints and floats), but never a number and a string."""
    num = (int, float)
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, num) and isinstance(b, num):
        return a == b
    return type(a) is type(b) and a == b


def same_values(a: Any, b: Any) -> bool:
    """Two lists equal value for value (:func:`same_value`)."""
    return isinstance(a, list) and isinstance(b, list) and len(a) == len(b) and all(map(same_value, a, b))


def _field_is(text: str, want: Any) -> bool:
    """A CSV field is the axis value ``want`` it was written from: by value for a number (``2`` and ``2.0``), by
    text otherwise."""
    if isinstance(want, (int, float)) and not isinstance(want, bool):
        try:
            got: Any = int(text) if text.lstrip("-").isdigit() else float(text)
        except ValueError:
            return False
        return same_value(got, want)
    return text == str(want)


def row_digest(line: str) -> str:
    """The digest of one CSV line as written (without its newline): 16 hex digits."""
    return hashlib.blake2b(line.encode("utf-8"), digest_size=8).hexdigest()


# --- what a front end gives the engine -------------------------------------------------------------
@dataclass(frozen=True)
class Front:
    """What differs between two sweeps: the function a point runs and its rows' columns.

    ``read_row(fields, point, bad)`` types the metric columns of one CSV row read back (every column after the
    axes and the key columns, in :attr:`metrics` order), raising ``bad(column, want)`` for a value that cannot
    be one of its column's (the file is damaged, or another sweep's). ``check_row(row, point)`` says why a
    typed row (key and metric columns) disagrees with itself, or returns None; such a row is computed again.
    """

    #: the sweep's name in messages and on the progress bar (``"sweep"``, ``"model sweep"``)
    label: str
    #: the record's ``"what"`` (``"kbwork.decode.sweep"``)
    what: str
    #: the version of what a row means; a file of another is not resumed
    schema: int
    #: the module-level function a task runs (in a worker): ``point(task) -> rows``, each row a dict
    point: Callable[[Any], list[dict]]
    #: the task of a point, given the keys it must compute: ``task(point, keys)``
    task: Callable[[dict, tuple], Any]
    #: every point's row keys, in row order (a key is one column's value, or a tuple of several columns')
    keys: tuple[Hashable, ...]
    #: the columns that make a row's key (the first metrics)
    key_columns: tuple[str, ...]
    #: the columns after the axes: the key columns first
    metrics: tuple[str, ...]
    read_row: Callable[[dict[str, str], dict, Callable[[str, str], ValidationError]], dict[str, Any]]
    check_row: Callable[[dict[str, Any], dict], str | None]
    #: the front end's fields of the record (JSON values), including :attr:`keys_field` (a list)
    record: dict[str, Any]
    #: the record's field that lists the keys (``"variants"``, ``"cases"``)
    keys_field: str
    #: record fields a resume must find as they are, in the order differences are told
    compared: tuple[str, ...]
    #: record fields that are dicts of settings (a topology, a host): compared key by key, except the keys an
    #: axis sets at every point and ``name``
    setups: tuple[str, ...] = ()
    #: for some of :attr:`compared`, a comparison of their own: ``differs(recorded, now) -> words or None``
    differs: Mapping[str, Callable[[Any, Any], str | None]] = field(default_factory=dict)
    #: a point is taken back from a file only with every key's row (else all of it runs again)
    whole_points: bool = False
    #: what a ``point`` field that is not a whole number should be, in the refusal
    index_word: str = "a whole number >= 0"

    def key_of(self, row: Mapping[str, Any]) -> Hashable:
        """The key of ``row`` (its key columns' values)."""
        if len(self.key_columns) == 1:
            return row[self.key_columns[0]]
        return tuple(row[c] for c in self.key_columns)


def _key_text(key: Hashable) -> str:
    return ", ".join(map(str, key)) if isinstance(key, tuple) else str(key)


def make_record(front: Front, names: Sequence[str], values: Sequence[list]) -> dict[str, Any]:
    """Everything that decides a sweep's rows, as plain JSON values (the ``<out>.meta.json`` record, before the
    row digests): what it is, its schema, the axes and their values, the columns and the front end's fields."""
    return json_value({"what": front.what, "schema": front.schema,
                       "axes": [[n, vals] for n, vals in zip(names, values)], "columns": list(front.metrics),
                       **front.record})


def record_differences(front: Front, recorded: dict[str, Any], meta: dict[str, Any]) -> list[str]:
    """How the recorded sweep differs from this one, in words (empty: it may be resumed).

    A setting in :attr:`Front.setups` that an axis sets at every point decides no row and is not compared, nor
    is the setup's name.
    """
    diffs = []
    if recorded.get("schema") != meta["schema"]:
        diffs.append(f"it holds results of {front.label} schema {recorded.get('schema')!r} (kbwork "
                     f"{recorded.get('kbwork', '?')}), this kbwork's is {meta['schema']}, whose rows differ")
    rec_axes, axes = recorded.get("axes"), meta["axes"]
    rec_names = [a[0] for a in rec_axes] if isinstance(rec_axes, list) and all(
        isinstance(a, list) and len(a) == 2 for a in rec_axes) else None
    names = [a[0] for a in axes]
    if rec_names != names:
        shown = f"({', '.join(map(str, rec_names))})" if rec_names else repr(rec_axes)
        diffs.append(f"axes {shown} there, ({', '.join(names)}) here")
    else:
        moved = [f"axis {name!r} is {was} there, {now} here" for (name, was), (_, now) in zip(rec_axes, axes)
                 if not same_values(was, now)]
        if moved:
            diffs.append(f"the axes differ: {'; '.join(moved)}")
    for key in front.compared:
        was, now = recorded.get(key), meta[key]
        if key in front.differs:
            words = front.differs[key](was, now)
        else:
            words = None if was == now else f"{key} {was!r} there, {now!r} here"
        if words:
            diffs.append(words)
    swept = set(names)
    for part in front.setups:
        was, now = recorded.get(part), meta[part]
        if not isinstance(was, dict):
            diffs.append(f"the file records no {part}")
            continue
        for key in sorted(set(was) | set(now)):
            if key == "name" or key in swept:
                continue
            if key not in was or key not in now or not same_value(was[key], now[key]):
                diffs.append(f"{part} {key} is {was.get(key, '(absent)')} there, {now.get(key, '(absent)')} here")
    return diffs


# --- the file --------------------------------------------------------------------------------------
class SweepFile:
    """A sweep's rows on disk as they finish (``point`` first), and its record ``<path>.meta.json``.

    Opening it (fresh, or resumed after its record is read and compared) fills :attr:`done` with the rows taken
    back: point index -> key -> row (the point's axis values, then its metrics, typed). The record lists the
    digest of every line written (:data:`ROW_DIGESTS`), updated before the lines are: a line on file whose
    digest it lacks was not written by the sweep (or the system stopped between the two writes), and is
    computed again.
    """

    def __init__(self, path: str | Path, front: Front, names: Sequence[str], points: Sequence[dict]):
        self.path = Path(atomic.check_output_path(path, suffix=".csv", what="sweep out"))
        self.meta_path = Path(f"{self.path}.meta.json")
        atomic.check_output_path(self.meta_path, suffix=".json", what="sweep out's record")
        self.front, self.names, self.points = front, list(names), list(points)
        self.columns = ["point", *names, *front.metrics]
        self.header = ",".join(self.columns) + "\n"
        self.done: dict[int, dict[Hashable, dict]] = {}
        self.meta: dict[str, Any] = {}
        self.digests: list[str] = []

    # --- writing
    def rows_csv(self, rows: list[dict], point: int) -> str:
        """``rows`` of point ``point`` as CSV lines in :attr:`columns` order (no header)."""
        buf = io.StringIO()
        pd.DataFrame([{"point": point, **r} for r in rows], columns=self.columns).to_csv(
            buf, header=False, index=False, lineterminator="\n")
        return buf.getvalue()

    def write_record(self, sync: bool = True) -> None:
        """Write the record: :attr:`meta` and the digest of every line written (``sync``: :func:`atomic.write_with`'s)."""
        atomic.write_text(self.meta_path, json.dumps({**self.meta, ROW_DIGESTS: self.digests}, indent=1) + "\n",
                          sync=sync)

    def append(self, point: int, rows: list[dict]) -> None:
        """Add one finished point's rows to the file, whole (one write, undone if the system cuts it short),
        after their digests are in the record.

        Raises:
            FileError: the rows could not be written (the file is as it was).
        """
        text = self.rows_csv(rows, point)
        self.digests.extend(row_digest(line) for line in text.splitlines())
        # not flushed to disk: the rows are not either, and a row whose digest a crash lost only runs again
        self.write_record(sync=False)
        atomic.append_whole(self.path, text.encode("utf-8"), f"point {point}'s rows")

    def write_rows(self, rows_of: dict[int, list[dict]]) -> None:
        """Replace the file (atomically) by the header and each point's rows, in point order; the record's digests
        become those of these lines (written first)."""
        body = "".join(self.rows_csv(rows_of[i], i) for i in sorted(rows_of))
        self.digests = [row_digest(line) for line in body.splitlines()]
        self.write_record()
        atomic.write_text(self.path, self.header + body)

    # --- opening
    def refuse(self, why: str) -> ValidationError:
        """The refusal of a resume from this file, saying ``why``."""
        return ValidationError(f"sweep: cannot resume from {str(self.path)!r}: {why}")

    def not_a_record(self) -> ValidationError:
        return self.refuse(f"{self.meta_path.name} is not a kbwork {self.front.label} record; write to another file.")

    def open(self, resume: bool, meta: dict[str, Any]) -> None:
        """Start the file. If it holds rows: refuse unless ``resume``, refuse a record unlike ``meta`` (saying how),
        read every row (refusing a damaged one, computing again one that is not taken back), then record ``meta``
        and drop from the file what is not taken back. Otherwise write ``meta`` and the header.

        Raises:
            ValidationError: the file exists without ``resume``; its record is missing, unreadable, not this kind
                of sweep's or another sweep's; the file is not UTF-8, not this sweep's columns, or holds a damaged
                row (naming the line); all before anything is written.
        """
        self.meta = dict(meta)
        if not (self.path.exists() and self.path.stat().st_size):
            self.write_record()
            atomic.write_text(self.path, self.header)
            return
        if not resume:
            raise ValidationError(f"sweep: {str(self.path)!r} exists; pass resume=True to continue that sweep, "
                                  f"or remove the file to start afresh.")
        recorded = self.read_record()
        diffs = record_differences(self.front, recorded, meta)
        if diffs:
            raise self.refuse(f"another sweep wrote it (recorded in {self.meta_path.name}): {'; '.join(diffs)}. "
                              f"Resume with the same settings, or write to another file.")
        kept = self._read(recorded.get(ROW_DIGESTS))
        self.digests = kept.digests
        if kept.dropped:
            self.write_rows({i: list(rows.values()) for i, rows in self.done.items()})
        else:
            self.write_record()  # this sweep's settings (e.g. more variants) before any new row

    def read_record(self) -> dict[str, Any]:
        """The record, a dict naming this kind of sweep; a refusal saying what is wrong otherwise."""
        try:
            text = self.meta_path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise self.refuse(f"there is no {self.meta_path.name} beside it recording what decided its rows "
                              f"(a file written by hand or by an older kbwork); it cannot be checked, so write to "
                              f"another file or remove it to start afresh.") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise self.refuse(f"cannot read its record {self.meta_path.name} ({exc}); write to another file.") \
                from None
        try:
            recorded = json.loads(text)
        except ValueError as exc:
            raise self.refuse(f"its record {self.meta_path.name} is not valid JSON ({exc}); write to another "
                              f"file.") from None
        if not isinstance(recorded, dict) or recorded.get("what") != self.front.what \
                or not isinstance(recorded.get(self.front.keys_field), list) \
                or not isinstance(recorded.get(ROW_DIGESTS, []), list):
            raise self.not_a_record()
        return recorded

    def read_text(self) -> str:
        """The CSV's text; a refusal if it is not UTF-8 (not a file kbwork wrote)."""
        raw = self.path.read_bytes()
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise self.refuse(f"it is not UTF-8 text (byte {exc.start} is {raw[exc.start]:#04x}), so not a sweep "
                              f"file kbwork wrote; write to another file.") from None

    def _read(self, recorded_digests: list[str] | None) -> _Kept:
        """Read every row, check it, and keep in :attr:`done` the rows taken back.

        Raises:
            ValidationError: the file is not UTF-8, its header is not this sweep's, or a row is damaged (naming the
                line, the column and the value).
        """
        text = self.read_text()
        lines = text.split("\n")
        kept = _Kept(dropped=lines.pop() != "")  # text after the last newline: a write cut short
        if not lines or lines[0] + "\n" != self.header:
            got = lines[0] if lines else text
            raise self.refuse(f"its columns {got[:200]!r} are not this sweep's {','.join(self.columns)!r}; "
                              f"write to another file.")
        if recorded_digests is None:
            warnings.warn(f"{self.front.label}: {self.meta_path.name} records no row digests (an older kbwork wrote "
                          f"it), so the rows of {self.path.name} are checked for consistency only, not for being "
                          f"the rows written.", UserWarning, stacklevel=5)
        digests = None if recorded_digests is None else set(recorded_digests)
        first_line: dict[tuple[int, Hashable], int] = {}
        again: list[str] = []
        for number, line in enumerate(lines[1:], start=2):
            i, key, row = self._row(line, number)
            if (i, key) in first_line:
                raise self.refuse(f"line {number} repeats point {i}'s {_key_text(key)} row of line "
                                  f"{first_line[i, key]}; the file is damaged. Remove one of them or write to "
                                  f"another file.")
            first_line[i, key] = number
            digest = row_digest(line)
            why = [f"it is not a row this sweep wrote (its digest is not among those {self.meta_path.name} "
                   f"records: edited by hand?)"] if digests is not None and digest not in digests else []
            why += filter(None, [self.front.check_row(row, self.points[i])])
            if why:
                again.append(f"line {number} (point {i}, {_key_text(key)}): {', and '.join(why)}")
                kept.dropped = True
                continue
            kept.digests.append(digest)
            self.done.setdefault(i, {})[key] = {**self.points[i], **row}
        if self.front.whole_points:
            for i in [i for i, rows in self.done.items() if len(rows) != len(self.front.keys)]:
                del self.done[i]  # cut short, or a row to compute again: the whole point runs again
                kept.dropped = True
        if again:
            warnings.warn(f"{self.front.label}: {len(again)} row{'s' if len(again) > 1 else ''} of {self.path.name} "
                          f"not taken back, computed again: {'; '.join(again)}.", UserWarning, stacklevel=5)
        return kept

    def _row(self, line: str, number: int) -> tuple[int, Hashable, dict[str, Any]]:
        """One line as (point index, key, typed key and metric columns); a refusal naming what is damaged."""
        front = self.front
        (fields,) = list(csv.reader([line])) or [[]]
        if len(fields) != len(self.columns):
            raise self.refuse(f"line {number} has {len(fields)} fields, not {len(self.columns)}: {line[:120]!r}; "
                              f"the file is damaged. Remove that line (its point then runs again) or write to "
                              f"another file.")
        f = dict(zip(self.columns, fields))

        def bad(column: str, want: str) -> ValidationError:
            return self.refuse(f"line {number}: {column} is {f[column]!r}, not {want}; the file is damaged. "
                               f"Remove that line (its point then runs again) or write to another file.")

        text = f["point"]
        if not (text.isascii() and text.isdigit()):
            raise bad("point", front.index_word)
        i = int(text)
        if i >= len(self.points):
            raise bad("point", f"a point index of this sweep (0 to {len(self.points) - 1})")
        for name in self.names:
            want = self.points[i][name]
            if not _field_is(f[name], want):
                raise bad(name, f"point {i}'s {name} {want!r}")
        key = front.key_of(f)
        if key not in front.keys:
            if len(front.key_columns) == 1:
                raise bad(front.key_columns[0], f"one of this sweep's {front.keys_field} "
                                                f"({', '.join(map(_key_text, front.keys))})")
            raise self.refuse(f"line {number}: {', '.join(front.key_columns)} {_key_text(key)!r} is not one of this "
                              f"sweep's {front.keys_field} ({'; '.join(map(_key_text, front.keys))}); the file is "
                              f"damaged. Remove that line (its point then runs again) or write to another file.")
        row = {c: f[c] for c in front.key_columns}
        row.update(front.read_row(f, self.points[i], bad))
        return i, key, row


@dataclass
class _Kept:
    """What reading a file kept: the digests of the lines taken back, in file order, and whether the file holds
    anything else (a torn last line, a row to compute again, part of a point)."""

    dropped: bool
    digests: list[str] = field(default_factory=list)


# --- running a sweep -------------------------------------------------------------------------------
def run(front: Front, names: Sequence[str], values: Sequence[list], points: Sequence[dict], *, out: Any = None,
        resume: bool = False, progress: bool = True, workers: int | None = None, client: Any = None) -> pd.DataFrame:
    """Every key's row at every point (the axes and points already checked by the front end).

    Points run where :func:`kbwork.parallel.map_tasks` says (``client``, ``workers``); ``out`` (a ``.csv``) keeps
    each point's rows as it finishes, ``resume=True`` continues from it (:class:`SweepFile`), and the finished file
    is rewritten in point order.

    Returns:
        One row per (point, key), points in order, each point's keys in :attr:`Front.keys` order; columns: the
        axes, then :attr:`Front.metrics`.

    Raises:
        ValidationError: a bad ``client``; a bad ``out`` (or one that exists without ``resume=True``, holds another
            sweep or is damaged), before any point runs.
        Whatever a point raises (:func:`kbwork.parallel.map_tasks`), after the rows finished before it are saved.
    """
    from . import parallel

    with parallel.connected(client) as dask_client:  # a bad client is refused before the file is touched
        log = None
        if out is not None:
            log = SweepFile(out, front, names, points)
            log.open(resume, make_record(front, names, values))
        rows_of: dict[int, dict[Hashable, dict]] = {i: dict(rows) for i, rows in (log.done.items() if log else ())}
        todo = []
        for i in range(len(points)):
            missing = tuple(k for k in front.keys if k not in rows_of.get(i, {}))
            if missing:
                todo.append((i, front.keys if front.whole_points else missing))
        tasks = [front.task(points[i], missing) for i, missing in todo]

        def finished(k: int, rows: list[dict]) -> None:
            i = todo[k][0]
            rows_of.setdefault(i, {}).update((front.key_of(row), row) for row in rows)
            if log is not None:
                log.append(i, rows)

        parallel.map_tasks(front.point, tasks, client=dask_client, workers=workers,
                           progress=progress and sum(len(m) for _, m in todo) > 4, desc=front.label, unit="point",
                           on_result=finished)
    if log is not None:
        log.write_rows({i: [rows[k] for k in front.keys if k in rows] for i, rows in rows_of.items()})
    return pd.DataFrame([rows_of[i][k] for i in range(len(points)) for k in front.keys],
                        columns=[*names, *front.metrics])
