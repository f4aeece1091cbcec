"""Data mode computes what numpy computes (DESIGN §2, §3, §5).

Every reference is computed in the test from the dtype-rounded inputs, never
by calling kbwork. GEMM references follow the k-tile loop only where an
epilogue makes the tiling observable (a K_TILE op compounds per k-tile).
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

import kbwork
from kbwork import OpSpec, Scope
from kbwork.kernels.gemm import BENCHES

NP = {"bf16": ml_dtypes.bfloat16, "fp16": np.float16, "fp32": np.float32}
TILE_K = 128  # DESIGN §1 default tile_k


def rnd(x, dtype: str) -> np.ndarray:
    """``x`` rounded to ``dtype`` and back to float32."""
    return np.asarray(x, np.float32).astype(NP[dtype]).astype(np.float32)


def gemm_tol(k: int) -> dict:
    """float32 accumulation of k products of ~N(0, 1) values."""
    return dict(rtol=1e-5, atol=1e-4 * math.sqrt(k))


def inputs(seed: int, *shapes) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(np.float32) for s in shapes]


def k_chunks(k: int):
    return [slice(k0, min(k, k0 + TILE_K)) for k0 in range(0, k, TILE_K)]


# --- plain GEMM over many shapes ---------------------------------------------------------------
_EDGE_SHAPES = [
    (32, 128, 128),   # exactly one tile
    (1, 1, 1),
    (33, 129, 129),   # one past every tile edge
    (5, 17, 7),       # k < tile_k, tiny
    (64, 256, 256),   # exact multiples
    (31, 127, 255),   # one short of every edge
    (7, 300, 3),      # three k-tiles, ragged last
]


def _gemm_cases() -> list[dict]:
    rng = np.random.default_rng(20250101)
    shapes = list(_EDGE_SHAPES)
    while len(shapes) < 25:
        shapes.append((int(rng.integers(1, 97)), int(rng.integers(1, 301)), int(rng.integers(1, 301))))
    cases = []
    for i, (m, k, n) in enumerate(shapes):
        # the low four bits of i walk every (trans_b, a pinned, b pinned, out in TCM) combination
        cases.append(dict(m=m, k=k, n=n, trans_b=bool(i & 1), a_pin=bool(i & 2), b_pin=bool(i & 4),
                          out_tcm=bool(i & 8), dtype=("bf16", "fp16", "fp32")[i % 3], seed=100 + i))
    return cases


GEMM_CASES = _gemm_cases()


def _case_id(c: dict) -> str:
    return (f"{c['m']}x{c['k']}x{c['n']}-{c['dtype']}{'-tB' if c['trans_b'] else ''}"
            f"{'-pinA' if c['a_pin'] else ''}{'-pinB' if c['b_pin'] else ''}{'-tcmC' if c['out_tcm'] else ''}")


def run_plain_gemm(c: dict, out_dtype: str = "fp32"):
    m, k, n, dt, tb = c["m"], c["k"], c["n"], c["dtype"], c["trans_b"]
    A, B = inputs(c["seed"], (m, k), (n, k) if tb else (k, n))
    sim = kbwork.Simulator(mode="data")
    a, b = sim.hbm("A", A, dtype=dt), sim.hbm("B", B, dtype=dt)
    out = sim.hbm("C", shape=(m, n), dtype=out_dtype)

    def kernel(tl, a, b, out):
        aa = tl.load(a) if c["a_pin"] else tl.ref(a)
        bb = tl.load(b) if c["b_pin"] else tl.ref(b)
        dst = tl.alloc((m, n), out_dtype, name="C_tcm") if c["out_tcm"] else out
        tl.composite(op="gemm", a=aa, b=bb, out=dst, trans_b=tb)
        if c["out_tcm"]:
            tl.store(dst, out)

    run = sim.run(kernel, a, b, out)
    Af, Bf = rnd(A, dt).astype(np.float64), rnd(B, dt).astype(np.float64)
    ref = Af @ (Bf.T if tb else Bf)
    return run, ref


@pytest.mark.parametrize("case", GEMM_CASES, ids=_case_id)
def test_gemm_matches_numpy(case):
    run, ref = run_plain_gemm(case)
    got = run.read("C")
    assert got.dtype == np.float32 and got.shape == ref.shape
    np.testing.assert_allclose(got, ref, **gemm_tol(case["k"]))
    # the op_log really tiled it: one GEMM stage per (output tile, k-tile)
    n_tiles = -(-case["m"] // 32) * -(-case["n"] // 128) * -(-case["k"] // 128)
    assert (run.op_log.stage == "GEMM").sum() == n_tiles


def test_gemm_cases_cover_every_placement_and_dtype():
    combos = {(c["trans_b"], c["a_pin"], c["b_pin"], c["out_tcm"]) for c in GEMM_CASES}
    assert len(combos) == 16
    assert {c["dtype"] for c in GEMM_CASES} == {"bf16", "fp16", "fp32"}
    assert any(c["k"] < 128 for c in GEMM_CASES)
    assert any(c[d] % t for c in GEMM_CASES for d, t in (("m", 32), ("n", 128), ("k", 128)))


@pytest.mark.parametrize("out_dtype", ["bf16", "fp16"])
def test_gemm_output_is_rounded_to_its_dtype(out_dtype):
    case = dict(m=40, k=150, n=130, trans_b=False, a_pin=False, b_pin=True, out_tcm=False, dtype="bf16", seed=7)
    run, ref = run_plain_gemm(case, out_dtype=out_dtype)
    got = run.read("C")
    assert got.dtype == np.dtype(NP[out_dtype])
    want = rnd(ref, out_dtype)
    # the float32 accumulation may land on the other side of a rounding boundary: one ulp at most
    ulp = {"bf16": 2.0 ** -7, "fp16": 2.0 ** -10}[out_dtype]
    np.testing.assert_allclose(got.astype(np.float32), want, rtol=ulp, atol=1e-3)
    # and it is really rounded (not a float32 value stored in a wider buffer)
    assert np.array_equal(rnd(got.astype(np.float32), out_dtype), got.astype(np.float32))


# --- epilogue placements -----------------------------------------------------------------------
EPI_SHAPES = [(8, 40, 24), (40, 128, 130), (33, 300, 129), (70, 260, 200)]
_EPI_IDS = [f"{m}x{k}x{n}" for m, k, n in EPI_SHAPES]


def _epi_sim(m, k, n, seed, dtype="bf16"):
    A, B, O, O2 = inputs(seed, (m, k), (k, n), (m, n), (m, n))
    col = np.abs(inputs(seed + 1, (m, 1))[0]) + 0.5
    sim = kbwork.Simulator(mode="data")
    hs = dict(a=sim.hbm("A", A, dtype=dtype), b=sim.hbm("B", B, dtype=dtype), o=sim.hbm("O", O, dtype="fp32"),
              o2=sim.hbm("O2", O2, dtype="fp32"), col=sim.hbm("col", col, dtype="fp32"),
              out=sim.hbm("C", shape=(m, n), dtype="fp32"))
    return sim, hs, rnd(A, dtype), rnd(B, dtype), O, O2, col


@pytest.mark.parametrize("m,k,n", EPI_SHAPES + [(70, 260, 8)], ids=_EPI_IDS + ["70x260x8"])
@pytest.mark.parametrize("form", ["legacy", "flat"])
@pytest.mark.parametrize("b_pinned", [False, True], ids=["b_hbm", "b_tcm"])
def test_prologue_math_runs_before_the_gemm_reads_its_output(m, k, n, form, b_pinned):
    """A KERNEL MATH op before the GEMM writes the GEMM's ``a``; the GEMM must see the new values.

    With b pinned too, nothing but the prologue rule keeps the first FETCH from running right
    after the PLAN (and for a narrow n it would end before the prologue's MATH does).
    """
    sim, h, Af, Bf, _, _, col = _epi_sim(m, k, n, seed=11)

    def kernel(tl, a, b, colh, out):
        a_t = tl.load(a, name="A_tcm")
        col_t = tl.load(colh, name="col_tcm")
        a2 = tl.alloc((m, k), "fp32", name="A2")
        b = tl.load(b) if b_pinned else tl.ref(b)
        if form == "legacy":
            tl.composite(op="gemm", a=a2, b=b, out=out,
                         prologue=[{"op": "mul_bcast", "a": a_t, "b": col_t, "out": a2}])
        else:
            tl.composite(ops=[
                OpSpec("mul_bcast", Scope.KERNEL, {"a": a_t, "b": col_t}, {}, a2),
                OpSpec("gemm", Scope.KERNEL, {"a": a2, "b": b}, {"m": m, "k": k, "n": n, "trans_b": False}, out),
            ])

    run = sim.run(kernel, h["a"], h["b"], h["col"], h["out"])
    ref = (Af * col).astype(np.float64) @ Bf.astype(np.float64)
    np.testing.assert_allclose(run.read("C"), ref, **gemm_tol(k))
    log = run.op_log
    assert list(log[log.phase == "prologue"].op_kind) == ["mul_bcast"]


@pytest.mark.parametrize("m,k,n", EPI_SHAPES, ids=_EPI_IDS)
def test_prologue_copy_feeds_gemm(m, k, n):
    sim, h, Af, Bf, _, _, _ = _epi_sim(m, k, n, seed=12, dtype="fp16")

    def kernel(tl, a, b, out):
        a_t = tl.load(a)
        y = tl.alloc((m, k), "bf16", name="Y")  # the copy rounds fp16 -> bf16
        tl.composite(op="gemm", a=y, b=b, out=out, prologue=[{"op": "copy", "a": a_t, "out": y}])

    run = sim.run(kernel, h["a"], h["b"], h["out"])
    ref = rnd(Af, "bf16").astype(np.float64) @ Bf.astype(np.float64)
    np.testing.assert_allclose(run.read("C"), ref, **gemm_tol(k))


@pytest.mark.parametrize("m,k,n", EPI_SHAPES + [(16, 384, 64)], ids=_EPI_IDS + ["16x384x64"])
def test_k_tile_scale_compounds_per_k_tile(m, k, n):
    """acc = (acc + A_k B_k) * f after every k-tile: k-tile j ends up scaled by f ** (n_k - j)."""
    sim, h, Af, Bf, _, _, _ = _epi_sim(m, k, n, seed=13)
    f = 0.5

    def kernel(tl, a, b, out):
        tl.composite(op="gemm", a=a, b=b, out=out, epilogue=[{"op": "scale", "factor": f, "scope": "k_tile"}])

    run = sim.run(kernel, h["a"], h["b"], h["out"])
    acc = np.zeros((m, n), np.float64)
    for ks in k_chunks(k):
        acc = (acc + Af[:, ks].astype(np.float64) @ Bf[ks].astype(np.float64)) * f
    np.testing.assert_allclose(run.read("C"), acc, **gemm_tol(k))
    n_k = len(k_chunks(k))
    log = run.op_log
    assert (log.phase == "k_epilogue").sum() == n_k * -(-m // 32) * -(-n // 128)


@pytest.mark.parametrize("m,k,n", EPI_SHAPES, ids=_EPI_IDS)
def test_k_tile_add_adds_other_after_every_k_tile(m, k, n):
    sim, h, Af, Bf, O, _, _ = _epi_sim(m, k, n, seed=14)

    def kernel(tl, a, b, o, out):
        o_t = tl.load(o)
        tl.composite(op="gemm", a=tl.load(a), b=b, out=out, epilogue=[{"op": "add", "other": o_t, "scope": "k_tile"}])

    run = sim.run(kernel, h["a"], h["b"], h["o"], h["out"])
    acc = np.zeros((m, n), np.float64)
    for ks in k_chunks(k):
        acc = acc + Af[:, ks].astype(np.float64) @ Bf[ks].astype(np.float64) + O
    np.testing.assert_allclose(run.read("C"), acc, **gemm_tol(k))


@pytest.mark.parametrize("m,k,n", EPI_SHAPES, ids=_EPI_IDS)
@pytest.mark.parametrize("order", ["add_then_scale", "scale_then_add"])
def test_output_tile_epilogues_apply_in_op_order(m, k, n, order):
    sim, h, Af, Bf, O, _, _ = _epi_sim(m, k, n, seed=15)
    add = {"op": "add", "other": None}
    scale = {"op": "scale", "factor": 3.0}  # default scope: output_tile

    def kernel(tl, a, b, o, out):
        o_t = tl.load(o)
        epi = [dict(add, other=o_t), scale] if order == "add_then_scale" else [scale, dict(add, other=o_t)]
        tl.composite(op="gemm", a=a, b=b, out=out, epilogue=epi)

    run = sim.run(kernel, h["a"], h["b"], h["o"], h["out"])
    prod = Af.astype(np.float64) @ Bf.astype(np.float64)
    ref = (prod + O) * 3.0 if order == "add_then_scale" else prod * 3.0 + O
    np.testing.assert_allclose(run.read("C"), ref, **gemm_tol(k))
    tile_epi = run.op_log[run.op_log.phase == "tile_epilogue"]
    n_tiles = -(-m // 32) * -(-n // 128)
    assert len(tile_epi) == 2 * n_tiles
    assert list(tile_epi.op_kind[:2]) == (["add", "scale"] if order == "add_then_scale" else ["scale", "add"])


@pytest.mark.parametrize("m,k,n", EPI_SHAPES, ids=_EPI_IDS)
def test_output_tile_add_of_the_out_itself_accumulates(m, k, n):
    """``out = a @ b + out`` (the decode ``pv`` pattern) on a TCM out that already holds values."""
    sim, h, Af, Bf, O, _, _ = _epi_sim(m, k, n, seed=16)

    def kernel(tl, a, b, o, out):
        o_t = tl.load(o, name="O_tcm")
        tl.composite(op="gemm", a=a, b=b, out=o_t, epilogue=[{"op": "add", "other": o_t}])
        tl.store(o_t, out)

    run = sim.run(kernel, h["a"], h["b"], h["o"], h["out"])
    np.testing.assert_allclose(run.read("C"), Af.astype(np.float64) @ Bf + O, **gemm_tol(k))


@pytest.mark.parametrize("m,k,n", EPI_SHAPES, ids=_EPI_IDS)
def test_kernel_scope_post_loop_ops_run_once_on_the_finished_out(m, k, n):
    sim, h, Af, Bf, _, _, col = _epi_sim(m, k, n, seed=17)

    def kernel(tl, a, b, colh, out):
        col_t = tl.load(colh)
        c_t = tl.alloc((m, n), "fp32", name="C_tcm")
        mx = tl.alloc((m, 1), "fp32", name="mx")
        tl.composite(op="gemm", a=a, b=b, out=c_t, epilogue=[
            {"op": "div_bcast", "a": c_t, "b": col_t, "out": c_t, "scope": "kernel"},
            {"op": "scale", "factor": -2.0, "scope": "kernel"},  # accumulator op: the preceding out (C_tcm)
            {"op": "rmax", "a": c_t, "out": mx, "scope": "kernel"},
        ])
        tl.store(c_t, out)

    run = sim.run(kernel, h["a"], h["b"], h["col"], h["out"])
    ref = (Af.astype(np.float64) @ Bf / col) * -2.0
    np.testing.assert_allclose(run.read("C"), ref, **gemm_tol(k))
    np.testing.assert_allclose(run.read("mx"), ref.max(axis=1, keepdims=True), **gemm_tol(k))
    log = run.op_log
    assert list(log[log.phase == "post"].op_kind) == ["div_bcast", "scale", "rmax"]


@pytest.mark.parametrize("m,k,n", EPI_SHAPES, ids=_EPI_IDS)
@pytest.mark.parametrize("trans_b", [False, True])
def test_every_placement_in_one_composite(m, k, n, trans_b):
    """prologue + K_TILE + OUTPUT_TILE + KERNEL post-loop, in one GEMM composite."""
    A, B, O = inputs(18, (m, k), (n, k) if trans_b else (k, n), (m, n))
    col = np.abs(inputs(19, (m, 1))[0]) + 0.5
    sim = kbwork.Simulator(mode="data")
    a, b, o, colh = sim.hbm("A", A), sim.hbm("B", B, dtype="bf16"), sim.hbm("O", O), sim.hbm("col", col)
    out = sim.hbm("C", shape=(m, n), dtype="fp32")

    def kernel(tl, a, b, o, colh, out):
        a_t, o_t, col_t = tl.load(a), tl.load(o), tl.load(colh)
        a2 = tl.alloc((m, k), "bf16", name="A2")
        c_t = tl.alloc((m, n), "fp32", name="C_tcm")
        tl.composite(op="gemm", a=a2, b=tl.ref(b), out=c_t, trans_b=trans_b,
                     prologue=[{"op": "copy", "a": a_t, "out": a2}],
                     epilogue=[{"op": "scale", "factor": 0.75, "scope": "k_tile"},
                               {"op": "add", "other": o_t},
                               {"op": "scale", "factor": 2.0, "scope": "output_tile"},
                               {"op": "mul_bcast", "a": c_t, "b": col_t, "out": c_t, "scope": "kernel"}])
        tl.store(c_t, out)

    run = sim.run(kernel, a, b, o, colh, out)
    Af = rnd(A, "bf16").astype(np.float64)
    Bf = rnd(B, "bf16").astype(np.float64)
    Bf = Bf.T if trans_b else Bf
    acc = np.zeros((m, n))
    for ks in k_chunks(k):
        acc = (acc + Af[:, ks] @ Bf[ks]) * 0.75
    ref = (acc + O) * 2.0 * col
    np.testing.assert_allclose(run.read("C"), ref, **gemm_tol(k))
    assert set(run.op_log.phase) >= {"prologue", "tile", "k_epilogue", "tile_epilogue", "post"}


# --- MATH-only composites ----------------------------------------------------------------------
G, T = 12, 200


def _math_run(build, arrays: dict[str, np.ndarray], outs: dict[str, tuple]):
    """Load ``arrays`` into TCM, run ``build(tl, loaded, outs)`` and return the run."""
    sim = kbwork.Simulator(mode="data")
    hs = {name: sim.hbm(name, arr, dtype="fp32") for name, arr in arrays.items()}

    def kernel(tl):
        loaded = {name: tl.load(h, name=f"{name}_t") for name, h in hs.items()}
        allocated = {name: tl.alloc(shape, dtype, name=name) for name, (shape, dtype) in outs.items()}
        build(tl, loaded, allocated)

    return sim.run(kernel)


def _math_data(seed: int) -> dict[str, np.ndarray]:
    x, y, z = inputs(seed, (G, T), (G, T), (G, T))
    col = np.abs(inputs(seed + 1, (G, 1))[0]) + 0.5
    return {"x": x, "y": y, "z": z, "col": col}


MATH_CASES = {
    # "kind" or "kind/variant": (build(tl, t, o), numpy reference(d), out shape); scale and add are
    # accumulator ops, so they follow a copy head and update its out in place
    "copy": (lambda tl, t, o: tl.composite(op="math", math_op="copy", a=t["x"], out=o["r"]),
             lambda d: d["x"], (G, T)),
    "rmax": (lambda tl, t, o: tl.composite(op="math", math_op="rmax", a=t["x"], out=o["r"]),
             lambda d: d["x"].max(axis=1, keepdims=True), (G, 1)),
    "rsum": (lambda tl, t, o: tl.composite(op="math", math_op="rsum", a=t["x"], out=o["r"]),
             lambda d: d["x"].sum(axis=1, keepdims=True), (G, 1)),
    "max_elem": (lambda tl, t, o: tl.composite(op="math", math_op="max_elem", a=t["x"], b=t["y"], out=o["r"]),
                 lambda d: np.maximum(d["x"], d["y"]), (G, T)),
    "max_elem/col": (lambda tl, t, o: tl.composite(op="math", math_op="max_elem", a=t["col"], b=t["x"][0:G],
                                                   out=o["r"]),
                     lambda d: np.maximum(d["col"], d["x"]), (G, T)),
    "exp_diff/row": (lambda tl, t, o: tl.composite(op="math", math_op="exp_diff", a=t["x"], b=t["col"],
                                                   out=o["r"]),
                     lambda d: np.exp(d["x"] - d["col"]), (G, T)),
    "exp_diff/full": (lambda tl, t, o: tl.composite(op="math", math_op="exp_diff", a=t["x"], b=t["y"],
                                                    out=o["r"]),
                      lambda d: np.exp(d["x"] - d["y"]), (G, T)),
    "fma": (lambda tl, t, o: tl.composite(op="math", math_op="fma", a=t["x"], b=t["y"], c=t["z"], out=o["r"]),
            lambda d: d["x"] * d["y"] + d["z"], (G, T)),
    "fma/col": (lambda tl, t, o: tl.composite(op="math", math_op="fma", a=t["col"], b=t["col"], c=t["col"],
                                              out=o["r"]),
                lambda d: d["col"] * d["col"] + d["col"], (G, 1)),
    "mul_bcast": (lambda tl, t, o: tl.composite(op="math", math_op="mul_bcast", a=t["x"], b=t["col"], out=o["r"]),
                  lambda d: d["x"] * d["col"], (G, T)),
    "div_bcast": (lambda tl, t, o: tl.composite(op="math", math_op="div_bcast", a=t["x"], b=t["col"], out=o["r"]),
                  lambda d: d["x"] / d["col"], (G, T)),
    "fill": (lambda tl, t, o: tl.composite(op="math", math_op="fill", out=o["r"], value=-1.25),
             lambda d: np.full((G, T), -1.25, np.float32), (G, T)),
    "scale": (lambda tl, t, o: tl.composite(op="math", math_op="copy", a=t["x"], out=o["r"],
                                                      epilogue=[{"op": "scale", "factor": -3.0}]),
                        lambda d: d["x"] * np.float32(-3.0), (G, T)),
    "add": (lambda tl, t, o: tl.composite(op="math", math_op="copy", a=t["x"], out=o["r"],
                                                    epilogue=[{"op": "add", "other": t["y"]}]),
                      lambda d: d["x"] + d["y"], (G, T)),
    "mul": (lambda tl, t, o: tl.composite(op="math", math_op="mul", a=t["x"], b=t["y"], out=o["r"]),
            lambda d: d["x"] * d["y"], (G, T)),
    "mul/row": (lambda tl, t, o: tl.composite(op="math", math_op="mul", a=t["x"], b=t["x"][0:1], out=o["r"]),
                lambda d: d["x"] * d["x"][0:1], (G, T)),
    # rms_inv's eps is no legacy keyword (value=/factor=): the flat form passes it
    "rms_inv": (lambda tl, t, o: tl.composite(ops=[OpSpec("rms_inv", operands={"a": t["x"]}, extra={"eps": 0.5},
                                                          out=o["r"])]),
                lambda d: 1 / np.sqrt((d["x"].astype(np.float64) ** 2).mean(axis=1, keepdims=True) + 0.5), (G, 1)),
}


@pytest.mark.parametrize("name", list(MATH_CASES))
def test_math_op_matches_numpy(name):
    build, ref, shape = MATH_CASES[name]
    d = _math_data(seed=len(name))
    run = _math_run(build, d, {"r": (shape, "fp32")})
    got = run.read("r")
    want = np.broadcast_to(ref(d), shape)
    assert got.shape == shape
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_math_cases_cover_the_design_op_table():
    from kbwork.pe.ops import MATH_KINDS

    design_table = {"fill", "copy", "scale", "add", "rmax", "rsum", "max_elem", "exp_diff", "fma", "mul_bcast",
                    "div_bcast"}
    design_table |= {"mul", "rms_inv"}  # added with the rmsnorm recipe, documented in pe/ops.py
    assert set(MATH_KINDS) == design_table
    assert {name.split("/")[0] for name in MATH_CASES} == design_table


@pytest.mark.parametrize("out_dtype", ["bf16", "fp16"])
def test_math_result_is_rounded_to_the_destination_dtype(out_dtype):
    d = _math_data(seed=5)
    run = _math_run(lambda tl, t, o: tl.composite(op="math", math_op="exp_diff", a=t["x"], b=t["col"],
                                                  out=o["r"]), d, {"r": ((G, T), out_dtype)})
    got = run.read("r")
    assert got.dtype == np.dtype(NP[out_dtype])
    np.testing.assert_array_equal(got.astype(np.float32), rnd(np.exp(d["x"] - d["col"]), out_dtype))


def test_multi_op_math_composite_computes_a_softmax():
    d = _math_data(seed=21)

    def build(tl, t, o):
        tl.composite(ops=[OpSpec("rmax", operands={"a": t["x"]}, out=o["mx"]),
                          OpSpec("exp_diff", operands={"a": t["x"], "b": o["mx"]}, out=o["e"]),
                          OpSpec("rsum", operands={"a": o["e"]}, out=o["s"]),
                          OpSpec("div_bcast", operands={"a": o["e"], "b": o["s"]}, out=o["p"])], label="softmax")

    run = _math_run(build, d, {"mx": ((G, 1), "fp32"), "e": ((G, T), "fp32"), "s": ((G, 1), "fp32"),
                               "p": ((G, T), "fp32")})
    e = np.exp(d["x"] - d["x"].max(axis=1, keepdims=True))
    np.testing.assert_allclose(run.read("p"), e / e.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-7)
    log = run.op_log
    assert list(log[log.stage == "MATH"].op_kind) == ["rmax", "exp_diff", "rsum", "div_bcast"]
    assert set(log[log.stage == "MATH"].phase) == {"single"}


@pytest.mark.parametrize("kind", ["copy", "exp_diff", "max_elem"])
def test_math_head_streams_a_hbm_operand(kind):
    rng = np.random.default_rng(31)
    X = rng.standard_normal((G, T)).astype(np.float32)
    Y = rng.standard_normal((G, T)).astype(np.float32)
    col = rng.standard_normal((G, 1)).astype(np.float32)
    sim = kbwork.Simulator(mode="data")
    x, y, c = sim.hbm("x", X, dtype="bf16"), sim.hbm("y", Y), sim.hbm("col", col)

    def kernel(tl, x, y, c):
        r = tl.alloc((G, T), "fp32", name="r")
        if kind == "copy":
            tl.composite(op="math", math_op="copy", a=tl.ref(x), out=r)
        elif kind == "exp_diff":
            tl.composite(op="math", math_op="exp_diff", a=x, b=tl.load(c), out=r)
        else:
            tl.composite(op="math", math_op="max_elem", a=tl.load(y), b=x, out=r)

    run = sim.run(kernel, x, y, c)
    Xf = rnd(X, "bf16")
    want = {"copy": Xf, "exp_diff": np.exp(Xf - col), "max_elem": np.maximum(Y, Xf)}[kind]
    np.testing.assert_allclose(run.read("r"), want, rtol=1e-6, atol=1e-6)
    log = run.op_log
    head_cmd = log.cmd.max()
    reads = log[(log.cmd == head_cmd) & (log.stage == "DMA_READ")]
    assert list(reads.tensor) == ["x"] and list(reads.bytes) == [G * T * 2]
    math_stage = log[(log.cmd == head_cmd) & (log.stage == "MATH")].iloc[0]
    assert math_stage.start >= reads.end.max()


def test_math_head_streaming_two_hbm_operands():
    rng = np.random.default_rng(32)
    X, Y = rng.standard_normal((G, T)).astype(np.float32), rng.standard_normal((G, T)).astype(np.float32)
    sim = kbwork.Simulator(mode="data")
    x, y = sim.hbm("x", X), sim.hbm("y", Y)

    def kernel(tl, x, y):
        r = tl.alloc((G, T), "fp32", name="r")
        tl.composite(op="math", math_op="exp_diff", a=x, b=y, out=r)

    run = sim.run(kernel, x, y)
    np.testing.assert_allclose(run.read("r"), np.exp(X - Y), rtol=1e-6)


# --- benches -----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(BENCHES))
def test_bench_matches_its_numpy_expectation(name):
    res = BENCHES[name](kbwork.Simulator(mode="data"))
    assert res.expected
    for out, want in res.expected.items():
        np.testing.assert_allclose(res.run.read(out).astype(np.float32), want, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("name", list(BENCHES))
def test_bench_data_and_timing_mode_give_byte_identical_op_logs(name):
    data = BENCHES[name](kbwork.Simulator(mode="data")).run
    timing = BENCHES[name](kbwork.Simulator(mode="timing")).run
    assert data.to_csv() == timing.to_csv()
    assert data.cycles == timing.cycles > 0
