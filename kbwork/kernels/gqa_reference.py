"""GQA decode's inputs and its numerical yardsticks, outside the simulator (DESIGN.md §7).

:func:`make_inputs` draws the standard-normal q, k, v a decode run uses;
:func:`reference` is softmax(scale·QKᵀ)·V in float64 and :func:`baseline` the
plain, non-tiled attention in the storage precision (FlashAttention's test
yardstick: a tiled kernel should be within about twice its error).
:func:`check_dtypes` and :func:`check_fp8_range` check a run's dtypes and its
fp8 K and V (DESIGN.md §17). ``kbwork.decode`` re-exports them.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..errors import ValidationError
from ..memory import DTYPE_MAX, DTYPES, canonical_dtype
from ..sim import chunks


def make_inputs(kv_len: int, group: int = 8, head_dim: int = 128, dtype: str = "bf16",
                seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Standard-normal q (G, d), k and v (N, d) from ``seed``, rounded to ``dtype``, as float32.

    Drawn directly in float32 and rounded in place, a chunk at a time: no copy of K or V is made.
    """
    rng = np.random.default_rng(seed)
    shapes = ((group, head_dim), (kv_len, head_dim), (kv_len, head_dim))
    out = []
    for s in shapes:
        x = rng.standard_normal(s, dtype=np.float32)
        if dtype != "fp32":
            for sl in chunks(x):
                x[sl] = x[sl].astype(DTYPES[dtype])
        out.append(x)
    return tuple(out)  # type: ignore[return-value]


def _round(x: np.ndarray, dtype: str) -> np.ndarray:
    return np.asarray(x, np.float32).astype(DTYPES[dtype]).astype(np.float32)


def _rounded(x: np.ndarray, dtype: str, name: str = "x") -> np.ndarray:
    """``x`` rounded to ``dtype``, as float32: ``x`` itself when it already is (a float32 array holding
    ``dtype`` values: inputs passed on from an earlier run), else a new array, made a chunk at a time.

    Raises:
        ValidationError: finite values of ``x`` that overflow ``dtype`` (NaN and inf are left for ``sim.hbm``
            to name).
    """
    if x.dtype == np.float32:
        if dtype == "fp32":
            return x
        target = DTYPES[dtype]
        with np.errstate(over="ignore", invalid="ignore"):
            if all(np.array_equal(x[sl], x[sl].astype(target).astype(np.float32)) for sl in chunks(x)):
                return x
    out = np.empty(x.shape, np.float32)
    with np.errstate(over="ignore", invalid="ignore"):  # what overflows is refused just below
        for sl in chunks(x):
            out[sl] = np.asarray(x[sl], np.float32).astype(DTYPES[dtype])
            if not np.isfinite(out[sl]).all() and np.isfinite(np.asarray(x[sl], np.float64)).all():
                # here, not in sim.hbm: it sees the rounded array, whose infs look like the caller's own
                big = max(float(np.max(np.abs(np.asarray(x[c], np.float64)))) for c in chunks(x))
                raise ValidationError(f"decode.run: {name} holds values up to {big:.4g}, which overflow {dtype} "
                                      f"(largest finite {DTYPE_MAX[dtype]:.4g}); they would be stored as inf. "
                                      f"Scale the data or use a wider dtype.")
    return out


#: What ``out_dtype`` may be (DESIGN.md §17).
OUT_DTYPES = ("fp32", "bf16")


def check_dtypes(dtype: Any, out_dtype: Any = "fp32", kv_dtype: Any = None,
                 where: str = "decode.run") -> tuple[str, str, str]:
    """``(dtype, out_dtype, kv_dtype)`` as canonical names, ``kv_dtype`` defaulting to ``dtype``.

    Raises:
        ValidationError: a dtype the PE does not hold; ``dtype="fp8"`` (fp8 is for K and V only: ``kv_dtype``);
            an ``out_dtype`` other than fp32 or bf16.
    """
    dtype = canonical_dtype(dtype)
    if dtype == "fp8":
        raise ValidationError(f"{where}: dtype 'fp8' would make q fp8 too; fp8 is a dtype of K and V: pass "
                              f"kv_dtype='fp8' (q stays in dtype, e.g. 'bf16').")
    kv_dtype = dtype if kv_dtype is None else canonical_dtype(kv_dtype)
    out = canonical_dtype(out_dtype) if isinstance(out_dtype, str) else out_dtype
    if out not in OUT_DTYPES:
        raise ValidationError(f"{where}: out_dtype {out_dtype!r} is not one of {', '.join(OUT_DTYPES)} (the "
                              f"dtype O is stored in).")
    return dtype, out, kv_dtype


def check_fp8_range(name: str, x: np.ndarray, where: str = "decode.run") -> None:
    """Refuse values ``x`` (as given, before any rounding) that fp8 (e4m3fn) cannot hold: NaN, or a magnitude
    above its largest finite value, 448 (DESIGN.md §17: no scale factor is applied, so nothing is clipped or
    turned into NaN silently).

    Raises:
        ValidationError: naming the tensor ``name`` and the value (the one of largest magnitude).
    """
    limit = DTYPE_MAX["fp8"]
    worst = 0.0
    for sl in chunks(x):
        c = np.asarray(x[sl], np.float64)
        if np.isnan(c).any():
            raise ValidationError(f"{where}: {name} holds NaN; fp8 K and V must be finite numbers within "
                                  f"±{limit:g}.")
        if c.size:
            i = int(np.argmax(np.abs(c)))
            if abs(c.flat[i]) > abs(worst):
                worst = float(c.flat[i])
    if abs(worst) > limit:
        raise ValidationError(f"{where}: {name} holds {worst:g}, outside fp8 (e4m3fn)'s range ±{limit:g}; "
                              f"kv_dtype='fp8' applies no scale factor. Scale {name} into ±{limit:g} or use "
                              f"kv_dtype='bf16'.")


#: Rows of K and V the float64 reference takes at a time (its float64 copies never hold more).
REFERENCE_BLOCK = 1 << 12


def reference(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """softmax(scale·QKᵀ)·V in float64 (scale = 1/sqrt(d)), from the given (already rounded) inputs.

    Computed in blocks of :data:`REFERENCE_BLOCK` rows of K and V: the scores (G × N) are the largest array.
    """
    q64 = np.asarray(q, np.float64)
    n = k.shape[0]
    s = np.empty((q.shape[0], n), np.float64)
    for r0 in range(0, n, REFERENCE_BLOCK):
        s[:, r0:r0 + REFERENCE_BLOCK] = q64 @ np.asarray(k[r0:r0 + REFERENCE_BLOCK], np.float64).T
    s /= math.sqrt(q.shape[1])
    s -= s.max(axis=1, keepdims=True)  # in place: the scores become the probabilities, no copy beside them
    p = np.exp(s, out=s)
    p /= p.sum(axis=1, keepdims=True)
    out = np.zeros((q.shape[0], v.shape[1]), np.float64)
    for r0 in range(0, n, REFERENCE_BLOCK):
        out += p[:, r0:r0 + REFERENCE_BLOCK] @ np.asarray(v[r0:r0 + REFERENCE_BLOCK], np.float64)
    return out


def baseline(q: np.ndarray, k: np.ndarray, v: np.ndarray, dtype: str) -> np.ndarray:
    """Plain, non-tiled attention computed in the storage precision ``dtype``.

    Every stored tensor (scores, probabilities, output) is rounded to
    ``dtype``; arithmetic runs in float32. This is the FlashAttention test
    suite's yardstick: a tiled kernel should be no more than ~2× its error.
    """
    s = _round((q @ k.T) * np.float32(1.0 / math.sqrt(q.shape[1])), dtype)
    p = np.exp(s - s.max(axis=1, keepdims=True))
    p = _round(p / p.sum(axis=1, keepdims=True, dtype=np.float32), dtype)
    return _round(p @ v, dtype).astype(np.float64)


def _max_abs(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))
