"""argparse types shared by every command line of kbwork (``kbwork``, ``kbwork step``, ``kbwork bench``).

Each is a function ``str -> value`` that raises :class:`argparse.ArgumentTypeError`
with what it expected, so the command reports ``kbwork: error: argument --flag: expected ...``
and exits with status 2 (never a traceback). A foundation: it imports nothing
from kbwork, so the subcommands' modules of every rank can share it.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Callable


def int_range(low: int, high: int | None = None) -> Callable[[str], int]:
    """An argparse type: an int in ``[low, high]`` (no upper bound when ``high`` is None)."""
    what = (f"an integer between {low} and {high}" if high is not None else
            "a positive integer" if low == 1 else "a non-negative integer" if low == 0 else f"an integer >= {low}")

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"expected {what}, got {value}")
        return value

    parse.__name__ = "int"  # argparse names the type in some messages
    return parse


def float_range(low: float, high: float = math.inf) -> Callable[[str], float]:
    """An argparse type: a finite float in ``[low, high]`` (no upper bound when ``high`` is inf)."""
    what = (f"a number between {low:g} and {high:g}" if math.isfinite(high) else
            "a non-negative number" if low == 0 else f"a number >= {low:g}")

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if not (math.isfinite(value) and low <= value <= high):
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        return value

    parse.__name__ = "float"
    return parse


positive_int = int_range(1)
nonnegative_int = int_range(0)
nonnegative_float = float_range(0.0)


def topology_setting(text: str) -> tuple[str, str]:
    """An argparse type: ``key=value`` (``--set tcm_bytes=2097152``); the key and value are checked later,
    against the topology, so the message can name the key (:func:`kbwork.config.setting_value`)."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip() or not value.strip():
        raise argparse.ArgumentTypeError(f"expected key=value with a topology key, e.g. tcm_bytes=2097152, "
                                         f"got {text!r}")
    return key.strip(), value.strip()


topology_setting.__name__ = "key=value"


def file_path(text: str) -> Path:
    """An argparse type: a non-empty path (``Path("")`` would be the current directory, ``.``)."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"expected a file path, got {text!r}")
    return Path(text)


file_path.__name__ = "path"
