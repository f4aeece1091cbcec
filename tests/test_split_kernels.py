"""Split-KV's kernels (DESIGN.md §16): the ``state_merge`` recipe by descriptor, ``fma`` broadcasting a per-row
factor, ``gqa_decode_partial`` and ``gqa_merge`` on one PE in program order (no launch dependency needed)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kbwork import ValidationError
from kbwork.kernels.gqa_decode import gqa_decode
from kbwork.kernels.split import gqa_decode_partial, gqa_merge
from kbwork.sim import Launch, Simulator
from kbwork.triton_emu.tl_recipes import RECIPE_DESCRIPTORS

VARIANTS = ("opt2", "opt3", "a1")
DTYPES = ("bf16", "fp16", "fp32")


def test_state_merge_is_a_descriptor_with_the_designs_operands_scratch_and_steps():
    r = RECIPE_DESCRIPTORS["state_merge"]
    assert dict(r.operands) == {"m_b": "R", "l_b": "R", "O_b": "R", "m": "RW", "l": "RW", "O": "RW"}
    assert [(s.name, s.shape) for s in r.scratch] == [("m_new", "m"), ("ca", "m"), ("cb", "m"), ("lb", "l"),
                                                      ("Ob", "O")]
    assert r.primary_out is None
    assert [(e.kind, e.srcs, e.dst) for e in r.engine_seq] == [
        ("max_elem", ("m", "m_b"), "m_new"), ("exp_diff", ("m", "m_new"), "ca"),
        ("exp_diff", ("m_b", "m_new"), "cb"), ("mul_bcast", ("l_b", "cb"), "lb"), ("fma", ("l", "ca", "lb"), "l"),
        ("mul_bcast", ("O_b", "cb"), "Ob"), ("fma", ("O", "ca", "Ob"), "O"), ("copy", ("m_new",), "m")]


def _fma_kernel(tl, a, b, c, out):
    A, B, C = tl.load(a, name="A"), tl.load(b, name="B"), tl.load(c, name="C")
    R = tl.alloc(A.shape, "fp32", name="R")
    tl.composite(op="math", math_op="fma", a=A, b=B, c=C, out=R)
    tl.store(R, out)


def test_fma_broadcasts_a_per_row_b():
    rng = np.random.default_rng(3)
    a, b, c = rng.standard_normal((4, 8)), rng.standard_normal((4, 1)), rng.standard_normal((4, 8))
    sim = Simulator(mode="data")
    args = [sim.hbm(n, x, dtype="fp32") for n, x in (("a", a), ("b", b), ("c", c))]
    out = sim.hbm("out", shape=(4, 8), dtype="fp32")
    r = sim.run(_fma_kernel, *args, out)
    f32 = [x.astype(np.float32) for x in (a, b, c)]
    assert np.array_equal(r.read("out"), f32[0] * f32[1] + f32[2])


def _reference(q, K, V) -> np.ndarray:
    q, K, V = (x.astype(np.float64) for x in (q, K, V))
    s = q @ K.T / math.sqrt(q.shape[1])
    p = np.exp(s - s.max(axis=1, keepdims=True))
    return (p / p.sum(axis=1, keepdims=True)) @ V


def _split_run(q, K, V, cuts, *, variant, dtype, tile, out_dtype="fp32"):
    """Partials over K[cuts[i]:cuts[i+1]] then their merge, all on PE 0 in program order."""
    G, d = q.shape
    sim = Simulator(mode="data")
    qh, kh, vh = (sim.hbm(n, x, dtype=dtype) for n, x in (("q", q), ("K", K), ("V", V)))
    launches, parts = [], []
    for c, (a, b) in enumerate(zip(cuts, cuts[1:])):
        st = tuple(sim.hbm(f"{n}{c}", shape=s, dtype="fp32") for n, s in (("m", (G, 1)), ("l", (G, 1)),
                                                                          ("O", (G, d))))
        parts.append(st)
        launches.append(Launch(gqa_decode_partial, qh, kh[a:b], vh[a:b], *st, variant=variant, tile=tile))
    out = sim.hbm("out", shape=(G, d), dtype=out_dtype)
    launches.append(Launch(gqa_merge, parts, out))
    return sim.run_device({0: launches})


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_random_splits_merge_within_the_tolerance_of_float64(variant, dtype):
    rng = np.random.default_rng(hash((variant, dtype)) % 2**32)
    G, d, T = 4, 32, 16
    for k in (1 + int(rng.integers(0, 8)), 8):
        sizes = 1 + rng.integers(0, 4, k)                  # tiles per part, random
        N = int(sizes.sum()) * T
        cuts = [0, *np.cumsum(sizes * T).tolist()]
        q, K, V = (rng.standard_normal(s) for s in ((G, d), (N, d), (N, d)))
        r = _split_run(q, K, V, cuts, variant=variant, dtype=dtype, tile=T)
        ref = _reference(r.read("q"), r.read("K"), r.read("V"))
        assert np.abs(r.read("out") - ref).max() <= 1e-5, (k, sizes)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("out_dtype", ["fp32", "bf16"])
def test_one_part_is_the_unsplit_decode_bit_for_bit(variant, out_dtype):
    rng = np.random.default_rng(5)
    G, d, T, N = 8, 64, 32, 128
    q, K, V = (rng.standard_normal(s) for s in ((G, d), (N, d), (N, d)))
    split = _split_run(q, K, V, [0, N], variant=variant, dtype="bf16", tile=T, out_dtype=out_dtype)
    sim = Simulator(mode="data")
    args = [sim.hbm(n, x, dtype="bf16") for n, x in (("q", q), ("K", K), ("V", V))]
    out = sim.hbm("out", shape=(G, d), dtype=out_dtype)
    whole = sim.run(gqa_decode, *args, out, variant=variant, tile=T)
    assert np.array_equal(split.read("out"), whole.read("out"))


def test_a_partial_stores_the_unsplit_decodes_state():
    """The partial's m, l and O are the decode's state before its divide: O / l is the decode's output."""
    rng = np.random.default_rng(6)
    G, d, T, N = 2, 16, 16, 64
    q, K, V = (rng.standard_normal(s) for s in ((G, d), (N, d), (N, d)))
    r = _split_run(q, K, V, [0, N], variant="opt2", dtype="fp32", tile=T)
    m, l, O = r.read("m0"), r.read("l0"), r.read("O0")
    s = r.read("q").astype(np.float64) @ r.read("K").astype(np.float64).T / math.sqrt(d)
    np.testing.assert_allclose(m, s.max(axis=1, keepdims=True), rtol=1e-6)
    np.testing.assert_allclose(l, np.exp(s - s.max(axis=1, keepdims=True)).sum(axis=1, keepdims=True), rtol=1e-5)
    assert np.array_equal(O / l, r.read("out"))


def test_merge_emits_one_state_merge_composite_per_further_part():
    rng = np.random.default_rng(7)
    G, d, T = 2, 16, 16
    q, K, V = (rng.standard_normal(s) for s in ((G, d), (4 * T, d), (4 * T, d)))
    r = _split_run(q, K, V, [0, T, 3 * T, 4 * T], variant="opt2", dtype="bf16", tile=T)
    merges = [c for c in r.commands if c.label == "state_merge"]
    assert len(merges) == 2
    assert [o.kind for o in merges[0].ops] == ["max_elem", "exp_diff", "exp_diff", "mul_bcast", "fma", "mul_bcast",
                                              "fma", "copy"]
    assert [h.name for h in merges[0].rw_handles] == ["m", "l", "O"]


@pytest.mark.parametrize("bad, pattern", [
    (lambda sim, G, d: [], r"parts must be a non-empty list"),
    (lambda sim, G, d: [("m", "l")], r"part 0 must be an \(m, l, O\) triple"),
    (lambda sim, G, d: [(sim.hbm("m", shape=(G, 1), dtype="fp32"), sim.hbm("l", shape=(G, 1), dtype="bf16"),
                         sim.hbm("O", shape=(G, d), dtype="fp32"))], r"part 0: the state's l must be \(2, 1\) fp32"),
])
def test_merge_refuses_bad_parts(bad, pattern):
    sim = Simulator(mode="timing")
    out = sim.hbm("out", shape=(2, 16), dtype="fp32")
    with pytest.raises(ValidationError, match=pattern):
        sim.run(gqa_merge, bad(sim, 2, 16), out)


def test_partial_refuses_state_tensors_of_the_wrong_shape():
    sim = Simulator(mode="timing")
    q, k, v = (sim.hbm(n, shape=s, dtype="bf16") for n, s in (("q", (2, 16)), ("K", (32, 16)), ("V", (32, 16))))
    m, l = sim.hbm("m", shape=(2, 1), dtype="fp32"), sim.hbm("l", shape=(2, 1), dtype="fp32")
    o = sim.hbm("O", shape=(2, 8), dtype="fp32")
    with pytest.raises(ValidationError, match=r"gqa_decode_partial: the state's O must be \(2, 16\) fp32"):
        sim.run(gqa_decode_partial, q, k, v, m, l, o, tile=16)
