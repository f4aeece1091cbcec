"""A resumable sweep file: the CSV of finished rows and its record ``<path>.meta.json``.

``decode.sweep`` and ``model.sweep`` each keep their rows on disk as points
finish, so a sweep cut short resumes from the file. What decides the rows is
recorded beside them before the first row; a resume under anything else is
refused, saying what differs. :class:`SweepFile` is what the two share: the
paths (checked before any work), their two switches (``resume=``,
``progress=``), opening a file (fresh, or resumed after its record is read and
compared), reading its text, writing rows (a point's whole, or the file anew),
and the refusals, each naming the file and what to do. How rows are read back
and checked is each sweep's.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np
import pandas as pd

from . import atomic
from .errors import ValidationError


def check_switches(resume: Any, progress: Any) -> None:
    """Refuse a sweep's ``resume=`` or ``progress=`` that is not True or False (``progress="no"`` would draw a bar).

    Raises:
        ValidationError: naming the switch, what was given and what each value does.
    """
    if not isinstance(resume, (bool, np.bool_)):
        raise ValidationError(f"sweep: resume={resume!r}; pass True (continue the sweep in out=) or False.")
    if not isinstance(progress, (bool, np.bool_)):
        raise ValidationError(f"sweep: progress={progress!r}; pass True (a progress bar on stderr) or False.")


class SweepFile:
    """A sweep's CSV at ``path`` and its record beside it; ``record`` is the ``"what"`` the record must name,
    ``columns`` the CSV's (``point`` first)."""

    def __init__(self, path: str | Path, record: str, noun: str, columns: Iterable[str]):
        self.path = Path(atomic.check_output_path(path, suffix=".csv", what="sweep out"))
        self.meta_path = Path(f"{self.path}.meta.json")
        atomic.check_output_path(self.meta_path, suffix=".json", what="sweep out's record")
        self.record, self.noun = record, noun
        self.columns = list(columns)
        self.header = ",".join(self.columns) + "\n"

    def rows_csv(self, rows: list[dict], point: int) -> str:
        """``rows`` of point ``point`` as CSV lines in :attr:`columns` order (no header)."""
        buf = io.StringIO()
        pd.DataFrame([{"point": point, **r} for r in rows], columns=self.columns).to_csv(
            buf, header=False, index=False, lineterminator="\n")
        return buf.getvalue()

    def append(self, point: int, rows: list[dict]) -> None:
        """Add one finished point's rows to the file, whole: one write, undone if the system cuts it short.

        Raises:
            FileError: the rows could not be written (the file is as it was).
        """
        atomic.append_whole(self.path, self.rows_csv(rows, point).encode("utf-8"), f"point {point}'s rows")

    def write_rows(self, rows_of: dict[int, list[dict]]) -> None:
        """Replace the file (atomically) by the header and each point's rows, in point order."""
        atomic.write_text(self.path, self.header + "".join(self.rows_csv(rows_of[i], i) for i in sorted(rows_of)))

    def refuse(self, why: str) -> ValidationError:
        """The refusal of a resume from this file, saying ``why``."""
        return ValidationError(f"sweep: cannot resume from {str(self.path)!r}: {why}")

    def open(self, resume: bool, meta: dict[str, Any],
             differences: Callable[[dict, dict], list[str]]) -> dict[str, Any] | None:
        """Start the file: if it holds rows, refuse unless ``resume``, and refuse a record that ``differences``
        finds unlike ``meta``; return the record read. Otherwise write ``meta`` and :attr:`header`; return None.

        Raises:
            ValidationError: the file exists without ``resume``, or its record is missing, unreadable, not this
                kind of sweep's, or another sweep's.
        """
        if not (self.path.exists() and self.path.stat().st_size):
            self.write_record(meta)
            atomic.write_text(self.path, self.header)
            return None
        if not resume:
            raise ValidationError(f"sweep: {str(self.path)!r} exists; pass resume=True to continue that sweep, "
                                  f"or remove the file to start afresh.")
        recorded = self.read_record()
        diffs = differences(recorded, meta)
        if diffs:
            raise self.refuse(f"another sweep wrote it (recorded in {self.meta_path.name}): {'; '.join(diffs)}. "
                              f"Resume with the same settings, or write to another file.")
        return recorded

    def write_record(self, meta: dict[str, Any]) -> None:
        atomic.write_text(self.meta_path, json.dumps(meta, indent=1) + "\n")

    def read_record(self) -> dict[str, Any]:
        """The record, a dict naming :attr:`record`; a refusal saying what is wrong otherwise."""
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
        if not isinstance(recorded, dict) or recorded.get("what") != self.record:
            raise self.not_a_record()
        return recorded

    def not_a_record(self) -> ValidationError:
        return self.refuse(f"{self.meta_path.name} is not {self.noun}; write to another file.")

    def read_text(self) -> str:
        """The CSV's text; a refusal if it is not UTF-8 (not a file kbwork wrote)."""
        raw = self.path.read_bytes()
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise self.refuse(f"it is not UTF-8 text (byte {exc.start} is {raw[exc.start]:#04x}), so not a sweep "
                              f"file kbwork wrote; write to another file.") from None
