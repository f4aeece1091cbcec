"""GEMM and MATH benches: small kernels with numpy references, used by goldens,
tests and the timing benchmark.

Each bench places its inputs on a :class:`Simulator`, runs its kernel and
returns a :class:`BenchResult` holding the run and the float32 numpy result
each output should equal. Shapes default to sizes that leave ragged edge
tiles; ``scale`` grows them for benchmarks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..memory import DTYPES
from ..sim import Run, Simulator


@dataclass
class BenchResult:
    """A bench's run plus the numpy value each named output should hold."""

    name: str
    run: Run
    expected: dict[str, np.ndarray] = field(default_factory=dict)

    def __repr__(self) -> str:
        return f"BenchResult({self.name!r}, {self.run!r})"


def _round(x: np.ndarray, dtype: str) -> np.ndarray:
    """``x`` rounded to ``dtype`` and back to float32 (what the PE reads)."""
    return np.asarray(x, np.float32).astype(DTYPES[dtype]).astype(np.float32)


def _inputs(seed: int, *shapes: tuple[int, int]) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(np.float32) for s in shapes]


def gemm_hbm(sim: Simulator, *, m: int = 70, k: int = 300, n: int = 200, dtype: str = "bf16",
             trans_b: bool = False, seed: int = 0, scale: int = 1) -> BenchResult:
    """(a) ``C = A @ B`` with A, B and C all in HBM: every operand tile is DMA'd."""
    m, k, n = m * scale, k * scale, n * scale
    A, B = _inputs(seed, (m, k), (n, k) if trans_b else (k, n))
    a, b = sim.hbm("A", A, dtype=dtype), sim.hbm("B", B, dtype=dtype)
    c = sim.hbm("C", shape=(m, n), dtype="fp32")

    def kernel(tl, a, b, c):
        tl.composite(op="gemm", a=tl.ref(a), b=tl.ref(b), out=c, trans_b=trans_b, label="gemm")

    run = sim.run(kernel, a, b, c)
    Bf = _round(B, dtype)
    return BenchResult("gemm_hbm", run, {"C": _round(A, dtype) @ (Bf.T if trans_b else Bf)})


def gemm_pinned_a(sim: Simulator, *, m: int = 40, k: int = 200, n: int = 300, dtype: str = "bf16",
                  seed: int = 1, scale: int = 1) -> BenchResult:
    """(b) ``C = A @ B`` with A loaded by ``tl.load`` (pinned: no DMA_READ for it).

    ``scale`` grows n only, so the pinned A keeps fitting in the TCM.
    """
    n = n * scale
    A, B = _inputs(seed, (m, k), (k, n))
    a, b = sim.hbm("A", A, dtype=dtype), sim.hbm("B", B, dtype=dtype)
    c = sim.hbm("C", shape=(m, n), dtype="fp32")

    def kernel(tl, a, b, c):
        a_t = tl.load(a, name="A_tcm")
        tl.composite(op="gemm", a=a_t, b=b, out=c, label="gemm")

    run = sim.run(kernel, a, b, c)
    return BenchResult("gemm_pinned_a", run, {"C": _round(A, dtype) @ _round(B, dtype)})


def gemm_epilogues(sim: Simulator, *, m: int = 50, k: int = 260, n: int = 150, dtype: str = "bf16",
                   seed: int = 2, scale: int = 1) -> BenchResult:
    """(c) GEMM with a K_TILE epilogue, OUTPUT_TILE epilogues and a post-loop KERNEL op.

    ``scale 0.5`` runs on the running accumulator after every k-tile (so
    k-tile j's product ends up scaled by ``0.5 ** (n_k_tiles - j)``), ``add
    bias`` and ``scale 2`` per output tile,
    then ``div_bcast(C, rownorm)`` once after the loop; C lives in TCM and is
    stored to HBM by a DMA command. ``scale`` grows k only (C and bias stay in TCM).
    """
    k = k * scale
    A, B, bias = _inputs(seed, (m, k), (k, n), (m, n))
    rownorm = (np.abs(_inputs(seed + 100, (m, 1))[0]) + 1.0).astype(np.float32)
    a, b = sim.hbm("A", A, dtype=dtype), sim.hbm("B", B, dtype=dtype)
    bias_h = sim.hbm("bias", bias, dtype="fp32")
    norm_h = sim.hbm("rownorm", rownorm, dtype="fp32")
    out = sim.hbm("C", shape=(m, n), dtype="fp32")

    def kernel(tl, a, b, bias_h, norm_h, out):
        bias_t = tl.load(bias_h, name="bias_tcm")
        norm_t = tl.load(norm_h, name="rownorm_tcm")
        c_t = tl.alloc((m, n), "fp32", name="C_tcm")
        tl.composite(op="gemm", a=a, b=b, out=c_t, label="gemm_epilogues", epilogue=[
            {"op": "scale", "factor": 0.5, "scope": "k_tile"},
            {"op": "add", "other": bias_t},
            {"op": "scale", "factor": 2.0},
            {"op": "div_bcast", "a": c_t, "b": norm_t, "out": c_t, "scope": "kernel"},
        ])
        tl.store(c_t, out)

    run = sim.run(kernel, a, b, bias_h, norm_h, out)
    Af, Bf = _round(A, dtype), _round(B, dtype)
    tk = sim.topo.tile_k
    acc = np.zeros((m, n), np.float32)
    for k0 in range(0, k, tk):
        acc = (acc + Af[:, k0:k0 + tk] @ Bf[k0:k0 + tk]) * np.float32(0.5)
    expected = (acc + bias) * np.float32(2.0) / rownorm
    return BenchResult("gemm_epilogues", run, {"C": expected.astype(np.float32)})


def math_chain(sim: Simulator, *, rows: int = 24, cols: int = 200, seed: int = 3, scale: int = 1) -> BenchResult:
    """(d) MATH-only composites: a row softmax, one op per command and a fused pair.

    The first command streams x from HBM (a DMA_READ before the MATH head
    op); the others work on TCM. ``exp_diff`` + ``rsum`` run as one flat
    composite of two MATH ops.
    """
    from ..pe.commands import OpSpec

    rows, cols = rows * scale, cols * scale
    (X,) = _inputs(seed, (rows, cols))
    x = sim.hbm("X", X, dtype="fp32")
    y = sim.hbm("Y", shape=(rows, cols), dtype="fp32")

    def kernel(tl, x, y):
        xt = tl.alloc((rows, cols), "fp32", name="x")
        mx = tl.alloc((rows, 1), "fp32", name="mx")
        e = tl.alloc((rows, cols), "fp32", name="e")
        s = tl.alloc((rows, 1), "fp32", name="s")
        tl.composite(op="math", math_op="copy", a=x, out=xt, label="copy_in")
        tl.composite(op="math", math_op="rmax", a=xt, out=mx, label="rmax")
        tl.composite(ops=[OpSpec("exp_diff", operands={"a": xt, "b": mx}, out=e),
                          OpSpec("rsum", operands={"a": e}, out=s)], label="exp+rsum")
        tl.composite(op="math", math_op="div_bcast", a=e, b=s, out=xt, label="normalize")
        tl.store(xt, y)

    run = sim.run(kernel, x, y)
    ex = np.exp(X - X.max(axis=1, keepdims=True))
    return BenchResult("math_chain", run, {"Y": (ex / ex.sum(axis=1, keepdims=True)).astype(np.float32)})


#: Every bench by name; goldens are the op_logs of these at their default sizes.
BENCHES: dict[str, Callable[..., BenchResult]] = {
    "gemm_hbm": gemm_hbm,
    "gemm_pinned_a": gemm_pinned_a,
    "gemm_epilogues": gemm_epilogues,
    "math_chain": math_chain,
}
