"""A dependency-free, one-line progress bar for sweeps (stderr, redrawn in place)."""

from __future__ import annotations

import sys
import time
from typing import Iterable, Iterator, TypeVar

T = TypeVar("T")


def progress(items: Iterable[T], total: int | None = None, desc: str = "", enabled: bool = True,
             width: int = 24) -> Iterator[T]:
    """Yield ``items`` while drawing ``desc [#####.....] k/n elapsed`` on stderr."""
    items = list(items) if total is None else items
    n = len(items) if total is None else total  # type: ignore[arg-type]
    if not enabled or n == 0:
        yield from items
        return
    t0 = time.monotonic()
    for i, item in enumerate(items):
        _draw(desc, i, n, t0, width)
        yield item
    _draw(desc, n, n, t0, width)
    print(file=sys.stderr, flush=True)


def _draw(desc: str, k: int, n: int, t0: float, width: int) -> None:
    filled = int(width * k / n)
    bar = "#" * filled + "." * (width - filled)
    print(f"\r{desc} [{bar}] {k}/{n} {time.monotonic() - t0:5.1f}s", end="", file=sys.stderr, flush=True)
