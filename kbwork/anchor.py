"""The measured anchor of decode's numerics: FlashAttention decode outputs from a real H200 (DESIGN.md §17).

``data/measured/h200_flash_decode/`` holds, for each stored n, a file ``decode_n{n}.npz`` with the H200's
outputs (``flash_bf16``, ``math_bf16``, ``math_fp32``, ``o_pt_bf16``) and a float64 reference ``o_ref``; its
README gives the seed whose ``decode.run(..., seed=seed, dtype="bf16", mode="data")`` inputs are the GPU's
inputs, and their checksum. Everything here reads whatever files are stored: a new n is one more file (and a
README row).

>>> from kbwork import anchor
>>> anchor.stored()                  # one row per stored n: n, seed, input_checksum, path
>>> anchor.numerics()                # kbwork's fp32 path and bf16 kernel beside the H200, at every stored n
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from . import decode
from .config import DATA_DIR
from .errors import ValidationError

#: Where the H200 outputs live.
ANCHOR_DIR = DATA_DIR / "measured" / "h200_flash_decode"
#: The decode shape of every stored output (the README's): group 8, head_dim 128, one KV head, tile 128.
GROUP, HEAD_DIM, TILE = 8, 128, 128
#: The H200 outputs each file holds beside ``o_ref``.
GPU_OUTPUTS = ("flash_bf16", "math_bf16", "math_fp32", "o_pt_bf16")
#: The precision of "a bf16 kernel as a GPU computes it" (DESIGN.md §17).
BF16_KERNEL = dict(p_dtype="bf16", out_dtype="bf16")

_FILE = re.compile(r"^decode_n(\d+)\.npz$")
_ROW = re.compile(r"^\|\s*(\d+)\s*\|\s*(\d+)\s*\|\s*(-?[0-9.eE+-]+)\s*\|")


@dataclass(frozen=True)
class Point:
    """One stored n: its seed, the checksum of its inputs (``None`` when the README has no row for it) and its
    file."""

    n: int
    seed: int
    input_checksum: float | None
    path: Path

    def arrays(self) -> dict[str, np.ndarray]:
        """The file's arrays by name (``o_ref`` float64, the GPU outputs float32), each (8, 128)."""
        with np.load(self.path) as z:
            return {k: np.asarray(z[k]) for k in z.files}


def _readme_rows(directory: Path) -> dict[int, tuple[int, float]]:
    """``n -> (seed, input_checksum)`` from the README's table."""
    readme = directory / "README.md"
    rows = {}
    if readme.is_file():
        for line in readme.read_text(encoding="utf-8").splitlines():
            m = _ROW.match(line.strip())
            if m:
                rows[int(m.group(1))] = (int(m.group(2)), float(m.group(3)))
    return rows


def points(directory: str | Path | None = None) -> list[Point]:
    """Every stored n, smallest first: the README's seed and checksum for it; for a file the README has no row
    for, the seed the file stores (``seed``) or, failing that, the README's rule (every row's seed is the same
    offset plus n), and no checksum.

    Raises:
        ValidationError: no stored file, or a file whose seed cannot be told.
    """
    directory = ANCHOR_DIR if directory is None else Path(directory)
    rows = _readme_rows(directory)
    offsets = {seed - n for n, (seed, _) in rows.items()}
    out = []
    for path in sorted(directory.glob("decode_n*.npz")):
        m = _FILE.match(path.name)
        if m is None:
            continue
        n = int(m.group(1))
        if n in rows:
            seed, checksum = rows[n]
        else:
            with np.load(path) as z:
                stored = int(z["seed"]) if "seed" in z.files else None
            if stored is None and len(offsets) != 1:
                raise ValidationError(f"{path}: the README has no row for n = {n} and the file stores no seed; "
                                      f"add its row (| n | seed | input_checksum | ...) to {directory / 'README.md'}.")
            seed, checksum = (stored if stored is not None else next(iter(offsets)) + n), None
        out.append(Point(n, seed, checksum, path))
    if not out:
        raise ValidationError(f"no H200 decode outputs (decode_n<n>.npz) in {directory}.")
    return sorted(out, key=lambda p: p.n)


def stored(directory: str | Path | None = None) -> pd.DataFrame:
    """:func:`points` as a table: ``n, seed, input_checksum, path``."""
    return pd.DataFrame([dict(n=p.n, seed=p.seed, input_checksum=p.input_checksum, path=str(p.path))
                         for p in points(directory)])


def checksum(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> float:
    """The README's input checksum: ``K.sum() + V.sum() + q.sum()``, each in float64, added in that order."""
    return float(np.asarray(k, np.float64).sum()) + float(np.asarray(v, np.float64).sum()) + \
        float(np.asarray(q, np.float64).sum())


def errors(o: np.ndarray, ref: np.ndarray) -> tuple[float, float]:
    """``(max |o - ref|, mean |o - ref|)`` in float64."""
    e = np.abs(np.asarray(o, np.float64) - np.asarray(ref, np.float64))
    return float(e.max()), float(e.mean())


def run_point(point: Point, variant: str = "opt2", **precision: str) -> decode.DecodeRun:
    """``decode.run`` of ``variant`` on the stored point's inputs (its seed, bf16), with ``precision``
    (``p_dtype``, ``out_dtype``, ``kv_dtype``) applied."""
    return decode.run(variant, kv_len=point.n, group=GROUP, head_dim=HEAD_DIM, tile=TILE, dtype="bf16",
                      mode="data", seed=point.seed, **precision)


def numerics(variants: Sequence[str] = ("opt2", "opt3", "a1"), directory: str | Path | None = None) -> pd.DataFrame:
    """Three numerics side by side at every stored n: kbwork's fp32 path (the default precision), kbwork's bf16
    kernel (``p_dtype="bf16", out_dtype="bf16"``) and the H200's own outputs, each against the float64
    reference the file stores.

    Returns:
        One row per (n, numerics, source): ``n``, ``numerics`` (``"fp32 path"``, ``"bf16 kernel"``, ``"H200"``),
        ``source`` (a variant, or the GPU output's name), ``max_abs_err``, ``mean_abs_err``, their ratios to
        the H200 ``flash_bf16``'s (``max_ratio``, ``mean_ratio``), and for kbwork's rows ``variants_bit_equal``
        (whether every variant's m, l and O are bit for bit the first variant's under that precision).

    Raises:
        ValidationError: no stored output; a stored point whose regenerated inputs do not match its checksum.
    """
    rows = []
    for p in points(directory):
        arr = p.arrays()
        ref = arr["o_ref"]
        flash_max, flash_mean = errors(arr["flash_bf16"], ref)
        for numerics_name, precision in (("fp32 path", {}), ("bf16 kernel", BF16_KERNEL)):
            runs = [run_point(p, v, **precision) for v in variants]
            if p.input_checksum is not None:
                got = checksum(runs[0].q, runs[0].k, runs[0].v)
                if got != p.input_checksum:
                    raise ValidationError(f"{p.path}: the inputs of seed {p.seed} sum to {got!r}, not the README's "
                                          f"{p.input_checksum!r}; they are not the GPU's inputs.")
            equal = all(all(np.array_equal(getattr(r, a), getattr(runs[0], a)) for a in ("m", "l", "O"))
                        for r in runs[1:])
            for v, r in zip(variants, runs):
                mx, mean = errors(r.O, ref)
                rows.append(dict(n=p.n, numerics=numerics_name, source=v, max_abs_err=mx, mean_abs_err=mean,
                                 variants_bit_equal=equal))
        for name in GPU_OUTPUTS:
            if name in arr:
                mx, mean = errors(arr[name], ref)
                rows.append(dict(n=p.n, numerics="H200", source=name, max_abs_err=mx, mean_abs_err=mean,
                                 variants_bit_equal=None))
        for row in rows:
            if row["n"] == p.n:
                row["max_ratio"] = row["max_abs_err"] / flash_max if flash_max else math.nan
                row["mean_ratio"] = row["mean_abs_err"] / flash_mean if flash_mean else math.nan
    cols = ["n", "numerics", "source", "max_abs_err", "mean_abs_err", "max_ratio", "mean_ratio", "variants_bit_equal"]
    return pd.DataFrame(rows, columns=cols)
