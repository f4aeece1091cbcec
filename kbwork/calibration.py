"""Fitting the dispatch model ``FIXED + R × bytes`` to measured launch costs.

``data/measured/`` holds real tables (with their provenance in its README);
``fit_dispatch`` fits the line and reports the residuals, so a calibration
that is not a straight line shows rather than hides it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from .config import DATA_DIR
from .errors import ValidationError

MEASURED_DIR = DATA_DIR / "measured"

#: The argument sizes PE commands use, in logical bytes: from the small ones (a DMA command is 24)
#: to the segmentation cap (1,024; a larger command is dispatched in 1,024-byte segments, each paying
#: FIXED again). A fit meant as a PE calibration should cover this range and no more.
PE_COMMAND_BYTES = (24, 1024)


def load_measured(name: str = "h200_kernel_launch_cost") -> pd.DataFrame:
    """A measured table from ``data/measured/<name>.csv``.

    Raises:
        ValidationError: no such table (the message lists the known ones).
    """
    path = MEASURED_DIR / f"{name}.csv"
    if not path.is_file():
        known = sorted(p.stem for p in MEASURED_DIR.glob("*.csv"))
        raise ValidationError(f"no measured table {name!r}; known: {', '.join(known)}.")
    return pd.read_csv(path)


@dataclass(frozen=True)
class DispatchFit:
    """A least-squares line ``time = fixed + r × bytes`` and how well it fits.

    ``arg_bytes`` are the argument sizes of the points fitted, ``residuals``
    their measured time minus the line.
    """

    fixed: float
    r: float
    residuals: np.ndarray
    unit: str
    arg_bytes: np.ndarray | None = None

    def __repr__(self) -> str:
        over = "" if self.arg_bytes is None else f" over {self.arg_bytes.min():g}-{self.arg_bytes.max():g} B"
        return (f"DispatchFit(FIXED={self.fixed:.4g} {self.unit}, R={self.r:.4g} {self.unit}/byte{over}, "
                f"max |residual| {np.max(np.abs(self.residuals)):.3g} {self.unit})")

    def in_cycles(self, clock_ghz: float) -> tuple[float, float]:
        """(FIXED cycles, R cycles/byte) of a clock at ``clock_ghz``, when the fit is in µs.

        Whose clock decides what the numbers mean: the measuring device's
        gives its own cycles; to use a measured cost as a PE calibration (the
        same time on the PE), pass the PE's clock (``Topology.clock_ghz``).

        Raises:
            ValidationError: the fit is not in µs, or the clock is not a positive number.
        """
        if self.unit != "us":
            raise ValidationError(f"in_cycles converts a fit in µs; this one is in {self.unit}.")
        if isinstance(clock_ghz, bool) or not isinstance(clock_ghz, (int, float, np.floating)) or not clock_ghz > 0:
            raise ValidationError(f"in_cycles: clock_ghz must be a positive number of GHz, got {clock_ghz!r}.")
        return self.fixed * clock_ghz * 1e3, self.r * clock_ghz * 1e3


def fit_dispatch(df: pd.DataFrame, bytes_col: str = "arg_bytes", time_col: str = "graph_us_per_launch",
                 unit: str = "us", bytes_range: tuple[float, float] | None = None) -> DispatchFit:
    """Fit ``time = FIXED + R × bytes`` by least squares.

    ``bytes_range`` (inclusive) fits only the points whose argument size lies
    in it, e.g. :data:`PE_COMMAND_BYTES` for the sizes PE commands use.

    Raises:
        ValidationError: a missing column, a bad range, or fewer than two points (in the range).
    """
    for col in (bytes_col, time_col):
        if col not in df.columns:
            raise ValidationError(f"fit_dispatch: no column {col!r}; columns are {list(df.columns)}.")
    if bytes_range is not None:
        lo, hi = bytes_range
        if not lo <= hi:
            raise ValidationError(f"fit_dispatch: bytes_range {bytes_range!r} must be (low, high) with low <= high.")
        df = df[df[bytes_col].between(lo, hi)]
    if len(df) < 2:
        where = "" if bytes_range is None else f" with {bytes_col} in {bytes_range[0]:g}-{bytes_range[1]:g}"
        raise ValidationError(f"fit_dispatch needs at least two points{where}; got {len(df)}.")
    x = df[bytes_col].to_numpy(float)
    y = df[time_col].to_numpy(float)
    r, fixed = np.polyfit(x, y, 1)
    return DispatchFit(float(fixed), float(r), y - (fixed + r * x), unit, x)
