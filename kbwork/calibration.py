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
    """A least-squares line ``time = fixed + r × bytes`` and how well it fits."""

    fixed: float
    r: float
    residuals: np.ndarray
    unit: str

    def __repr__(self) -> str:
        return (f"DispatchFit(FIXED={self.fixed:.4g} {self.unit}, R={self.r:.4g} {self.unit}/byte, "
                f"max |residual| {np.max(np.abs(self.residuals)):.3g} {self.unit})")

    def in_cycles(self, clock_ghz: float) -> tuple[float, float]:
        """(FIXED cycles, R cycles/byte) at ``clock_ghz`` when the fit is in µs."""
        if self.unit != "us":
            raise ValidationError(f"in_cycles converts a fit in µs; this one is in {self.unit}.")
        return self.fixed * clock_ghz * 1e3, self.r * clock_ghz * 1e3


def fit_dispatch(df: pd.DataFrame, bytes_col: str = "arg_bytes", time_col: str = "graph_us_per_launch",
                 unit: str = "us") -> DispatchFit:
    """Fit ``time = FIXED + R × bytes`` by least squares.

    Raises:
        ValidationError: a missing column or fewer than two points.
    """
    for col in (bytes_col, time_col):
        if col not in df.columns:
            raise ValidationError(f"fit_dispatch: no column {col!r}; columns are {list(df.columns)}.")
    if len(df) < 2:
        raise ValidationError("fit_dispatch needs at least two points.")
    x = df[bytes_col].to_numpy(float)
    y = df[time_col].to_numpy(float)
    r, fixed = np.polyfit(x, y, 1)
    return DispatchFit(float(fixed), float(r), y - (fixed + r * x), unit)
