"""A resumable sweep file: the CSV of finished rows and its record ``<path>.meta.json``.

``decode.sweep`` and ``model.sweep`` each keep their rows on disk as points
finish, so a sweep cut short resumes from the file. What decides the rows is
recorded beside them before the first row; a resume under anything else is
refused, saying what differs. :class:`SweepFile` is what the two share: the
paths (checked before any work), opening a file (fresh, or resumed after its
record is read and compared), reading its text, and the refusals, each naming
the file and what to do. How rows are read back and checked is each sweep's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

from . import atomic
from .errors import ValidationError


class SweepFile:
    """A sweep's CSV at ``path`` and its record beside it; ``record`` is the ``"what"`` the record must name."""

    def __init__(self, path: str | Path, record: str, noun: str):
        self.path = Path(atomic.check_output_path(path, suffix=".csv", what="sweep out"))
        self.meta_path = Path(f"{self.path}.meta.json")
        atomic.check_output_path(self.meta_path, suffix=".json", what="sweep out's record")
        self.record, self.noun = record, noun

    def refuse(self, why: str) -> ValidationError:
        """The refusal of a resume from this file, saying ``why``."""
        return ValidationError(f"sweep: cannot resume from {str(self.path)!r}: {why}")

    def open(self, resume: bool, meta: dict[str, Any], differences: Callable[[dict, dict], list[str]],
             header: str) -> dict[str, Any] | None:
        """Start the file: if it holds rows, refuse unless ``resume``, and refuse a record that ``differences``
        finds unlike ``meta``; return the record read. Otherwise write ``meta`` and ``header``; return None.

        Raises:
            ValidationError: the file exists without ``resume``, or its record is missing, unreadable, not this
                kind of sweep's, or another sweep's.
        """
        if not (self.path.exists() and self.path.stat().st_size):
            self.write_record(meta)
            atomic.write_text(self.path, header)
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
