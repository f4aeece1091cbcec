"""Seed (ADR-0065) Tests 4, 5, 8, 11 and the other emit-time validation rules (DESIGN §3, §5, §8)."""

from __future__ import annotations

import math

import numpy as np
import pytest

import kbwork
from kbwork import OpSpec, Scope, ValidationError


def completions(log):
    return log.groupby("cmd").end.max()


def work(log):
    """The plan stages (everything but DISPATCH and PLAN)."""
    return log[~log.stage.isin(["DISPATCH", "PLAN"])]


# --- seed Test 4: a shared rw handle serializes two composites -------------------------------------
def _two_gemms_sharing(shared: bool, policy: str = "strict_fifo"):
    """Two multi-tile GEMM composites streaming from HBM; with ``shared`` they name the same rw handle."""
    sim = kbwork.Simulator(mode="timing", hazard_policy=policy)
    a = sim.hbm("A", shape=(64, 256), dtype="bf16")
    b1, b2 = sim.hbm("B1", shape=(256, 256), dtype="bf16"), sim.hbm("B2", shape=(256, 256), dtype="bf16")

    def kernel(tl):
        acc = tl.alloc((8, 8), "fp32", name="acc")
        other = tl.alloc((8, 8), "fp32", name="other")
        o1, o2 = tl.alloc((64, 256), "fp32", name="O1"), tl.alloc((64, 256), "fp32", name="O2")
        tl.composite(op="gemm", a=a, b=b1, out=o1, rw_handles=[acc], label="first")
        tl.composite(op="gemm", a=a, b=b2, out=o2, rw_handles=[acc if shared else other], label="second")

    return sim.run(kernel)


@pytest.mark.parametrize("policy", ["strict_fifo", "rw_aware"])
def test_composites_sharing_a_rw_handle_complete_in_order_without_interleaving(policy):
    run = _two_gemms_sharing(shared=True, policy=policy)
    log = run.op_log
    first, second = work(log[log.cmd == 0]), work(log[log.cmd == 1])
    assert run.program.commands[0].rw_handles == run.program.commands[1].rw_handles
    assert second.start.min() >= first.end.max()  # not one stage of #2 before #1 is done
    assert completions(log)[0] < completions(log)[1]


def test_without_the_shared_handle_the_same_composites_interleave():
    """Non-vacuity of the test above: nothing but the rw handle keeps them apart."""
    log = _two_gemms_sharing(shared=False).op_log
    first, second = work(log[log.cmd == 0]), work(log[log.cmd == 1])
    assert second.start.min() < first.end.max()


def _hold_then_independent(policy: str):
    """cmd 0: a long GEMM writing C (PE_DMA/PE_GEMM); cmd 1: reads C (held); cmd 2: an unrelated fill."""
    sim = kbwork.Simulator(mode="timing", hazard_policy=policy)
    a = sim.hbm("A", shape=(64, 256), dtype="bf16")
    b = sim.hbm("B", shape=(256, 256), dtype="bf16")

    def kernel(tl):
        c = tl.alloc((64, 256), "fp32", name="C")
        mx = tl.alloc((64, 1), "fp32", name="mx")
        z = tl.alloc((16, 16), "fp32", name="z")
        tl.composite(op="gemm", a=a, b=b, out=c, label="producer")
        tl.composite(op="math", math_op="rmax", a=c, out=mx, label="consumer")
        tl.composite(op="math", math_op="fill", out=z, value=0.0, label="independent")

    return sim.run(kernel).op_log


def test_rw_aware_lets_an_independent_command_overtake_a_held_one():
    log = _hold_then_independent("rw_aware")
    done = completions(log)
    w = work(log)
    first_start = w.groupby("cmd").start.min()
    assert first_start[1] >= done[0]          # the conflicting command still waits for its producer
    assert done[2] < first_start[1]           # the independent one ran (and finished) meanwhile
    assert done[2] < done[0]


def test_strict_fifo_forbids_overtaking():
    log = _hold_then_independent("strict_fifo")
    done = completions(log)
    first_start = work(log).groupby("cmd").start.min()
    plan2 = log[(log.stage == "PLAN") & (log.cmd == 2)].iloc[0]
    assert first_start[1] >= done[0]
    assert plan2.start >= done[0]             # the scheduler took no later command while #1 was held
    assert first_start[2] >= first_start[1]
    assert done[2] > first_start[1]           # #2 did not run ahead of the held #1


# --- seed Test 5: DMA insertion follows pinned ---------------------------------------------------------
@pytest.mark.parametrize("a_pinned,b_pinned", [(True, False), (False, False), (False, True), (True, True)])
def test_dma_read_only_for_operands_that_are_not_pinned(a_pinned, b_pinned):
    m, k, n = 40, 200, 300
    sim = kbwork.Simulator(mode="timing")
    a, b = sim.hbm("A", shape=(m, k), dtype="bf16"), sim.hbm("B", shape=(k, n), dtype="bf16")
    c = sim.hbm("C", shape=(m, n))

    def kernel(tl):
        aa = tl.load(a, name="A_tcm") if a_pinned else tl.ref(a)
        bb = tl.load(b, name="B_tcm") if b_pinned else tl.ref(b)
        tl.composite(op="gemm", a=aa, b=bb, out=c, label="g")

    run = sim.run(kernel)
    cmds = run.program.commands
    gemm_op = cmds[-1].ops[0]
    assert gemm_op.operands["a"].pinned == a_pinned and gemm_op.operands["b"].pinned == b_pinned
    log = run.op_log
    g = log[log.label == "g"]
    reads = g[g.stage == "DMA_READ"]
    n_steps = math.ceil(m / 32) * math.ceil(n / 128) * math.ceil(k / 128)
    want = ([] if a_pinned else ["A"]) + ([] if b_pinned else ["B"])
    assert sorted(set(reads.tensor)) == want
    assert len(reads) == len(want) * n_steps
    assert "A_tcm" not in set(reads.tensor) and "B_tcm" not in set(reads.tensor)
    fetch = g[g.stage == "FETCH"]
    assert set(fetch.tensor) == {f"{'A_tcm' if a_pinned else 'A'}|{'B_tcm' if b_pinned else 'B'}"}
    # the loads themselves are DmaCmds with a single DMA_READ of the HBM tensor
    loads = log[log.label.str.startswith("dma_load")]
    assert sorted(loads[loads.stage == "DMA_READ"].tensor) == sorted(
        (["A"] if a_pinned else []) + (["B"] if b_pinned else []))


def test_recipe_scratch_and_primary_out_get_no_dma():
    """opt2's #2 shape: softmax_merge prologue + gemm(b=tl.ref(V)) + add O; only V is DMA'd."""
    G, T, d = 8, 128, 64
    sim = kbwork.Simulator(mode="timing")
    v = sim.hbm("V", shape=(T, d), dtype="bf16")

    def kernel(tl):
        s = tl.alloc((G, T), "fp32", name="S")
        m = tl.full((G, 1), -math.inf, "fp32", name="m")
        l_ = tl.full((G, 1), 0.0, "fp32", name="l")
        o = tl.full((G, d), 0.0, "fp32", name="O")
        tl.composite(prologue=[{"op": "softmax_merge", "s": s, "m": m, "l": l_, "O": o}],
                     op="gemm", b=tl.ref(v), out=o, epilogue=[{"op": "add", "other": o}], label="merge")

    run = sim.run(kernel)
    cmd = run.program.commands[-1]
    p = cmd.ops[8].operands["a"]
    assert p.pinned and p.space == "tcm"
    assert all(h.pinned for h in cmd.scratch)
    log = run.op_log
    merge = log[log.label == "merge"]
    assert list(merge[merge.stage == "DMA_READ"].tensor) == ["V"]
    assert (merge[merge.phase == "prologue"].stage == "MATH").all()
    assert (merge.phase == "prologue").sum() == 8


# --- seed Test 8: two GEMMs in one composite --------------------------------------------------------------
def _gemm_op(a, b, out):
    return OpSpec("gemm", Scope.KERNEL, {"a": a, "b": b}, {"m": a.shape[0], "k": a.shape[1], "n": b.shape[1],
                                                           "trans_b": False}, out)


def test_two_gemms_in_one_composite_is_rejected_at_emit_time():
    sim = kbwork.Simulator(mode="timing")
    raised = []

    def kernel(tl):
        a, b = tl.alloc((8, 16), "fp32", name="a"), tl.alloc((16, 8), "fp32", name="b")
        c, d = tl.alloc((8, 8), "fp32", name="c"), tl.alloc((8, 8), "fp32", name="d")
        with pytest.raises(ValidationError) as err:
            tl.composite(ops=[_gemm_op(a, b, c), OpSpec("scale", Scope.OUTPUT_TILE, {}, {"factor": 2.0}),
                              _gemm_op(a, b, d)])
        raised.append(str(err.value))
        tl.composite(op="math", math_op="fill", out=c, value=0.0)  # the kernel goes on; nothing was emitted

    run = sim.run(kernel)
    assert [type(c).__name__ for c in run.program.commands] == ["CompositeCmd"]
    assert run.program.commands[0].ops[0].kind == "fill"
    msg = raised[0]
    assert "2 GEMM" in msg and "[0, 2]" in msg and "at most one" in msg


def test_a_gemm_epilogue_entry_is_rejected():
    sim = kbwork.Simulator(mode="timing")

    def kernel(tl):
        a, b = tl.alloc((8, 16), "fp32", name="a"), tl.alloc((16, 8), "fp32", name="b")
        c = tl.alloc((8, 8), "fp32", name="c")
        tl.composite(op="gemm", a=a, b=b, out=c, epilogue=[{"op": "gemm", "a": a, "b": b, "out": c}])

    with pytest.raises(ValidationError, match="gemm"):
        sim.run(kernel)


# --- seed Test 11: HBM operands outside the head op --------------------------------------------------------
@pytest.fixture
def hbm_setup():
    sim = kbwork.Simulator(mode="timing")
    hs = dict(a=sim.hbm("A", shape=(8, 16)), b=sim.hbm("B", shape=(16, 24)), o=sim.hbm("Obias", shape=(8, 24)),
              col=sim.hbm("colh", shape=(8, 1)), x=sim.hbm("Xh", shape=(8, 16)), c=sim.hbm("C", shape=(8, 24)))
    return sim, hs


@pytest.mark.parametrize("where", ["output_tile_add", "k_tile_add", "post_loop_operand", "prologue_operand",
                                   "prologue_out", "math_epilogue_operand", "recipe_operand"])
def test_hbm_operand_outside_the_head_op_is_rejected(hbm_setup, where):
    sim, h = hbm_setup
    name = {"output_tile_add": "Obias", "k_tile_add": "Obias", "post_loop_operand": "colh",
            "prologue_operand": "Xh", "prologue_out": "Xh", "math_epilogue_operand": "Obias",
            "recipe_operand": "Xh"}[where]

    def kernel(tl):
        c_t = tl.alloc((8, 24), "fp32", name="C_t")
        a_t = tl.alloc((8, 16), "fp32", name="A_t")
        if where == "output_tile_add":
            tl.composite(op="gemm", a=h["a"], b=h["b"], out=h["c"], epilogue=[{"op": "add", "other": h["o"]}])
        elif where == "k_tile_add":
            tl.composite(op="gemm", a=h["a"], b=h["b"], out=h["c"],
                         epilogue=[{"op": "add", "other": h["o"], "scope": "k_tile"}])
        elif where == "post_loop_operand":
            tl.composite(op="gemm", a=h["a"], b=h["b"], out=c_t,
                         epilogue=[{"op": "div_bcast", "a": c_t, "b": h["col"], "out": c_t, "scope": "kernel"}])
        elif where == "prologue_operand":
            tl.composite(op="gemm", a=a_t, b=h["b"], out=h["c"], prologue=[{"op": "copy", "a": h["x"], "out": a_t}])
        elif where == "prologue_out":
            tl.composite(op="gemm", a=a_t, b=h["b"], out=h["c"], prologue=[{"op": "copy", "a": a_t, "out": h["x"]}])
        elif where == "math_epilogue_operand":
            tl.composite(op="math", math_op="copy", a=h["x"], out=a_t[0:8],
                         epilogue=[{"op": "max_elem", "a": c_t, "b": h["o"], "out": c_t}])
        else:
            s = tl.ref(h["x"])
            m, l_, o = (tl.alloc((8, 1), "fp32", name="m"), tl.alloc((8, 1), "fp32", name="l"),
                        tl.alloc((8, 24), "fp32", name="O"))
            tl.composite(prologue=[{"op": "softmax_merge", "s": s, "m": m, "l": l_, "O": o}], op="gemm",
                         b=tl.ref(h["b"]), out=o)

    with pytest.raises(ValidationError) as err:
        sim.run(kernel)
    msg = str(err.value)
    assert "HBM" in msg and name in msg


def test_post_loop_accumulator_op_on_a_hbm_out_is_rejected(hbm_setup):
    """A KERNEL-scope scale after the GEMM updates the out in place with PE_MATH: the out must be in TCM."""
    sim, h = hbm_setup

    def kernel(tl):
        tl.composite(op="gemm", a=h["a"], b=h["b"], out=h["c"],
                     epilogue=[{"op": "scale", "factor": 2.0, "scope": "kernel"}])

    with pytest.raises(ValidationError, match=r"scale.*\bC\b.*HBM|HBM.*\bC\b"):
        sim.run(kernel)


def test_hbm_head_operands_are_streamed_with_a_dma_read(hbm_setup):
    sim, h = hbm_setup

    def kernel(tl):
        y = tl.alloc((8, 16), "fp32", name="Y")
        o_t = tl.load(h["o"], name="O_t")
        tl.composite(op="gemm", a=h["a"], b=tl.ref(h["b"]), out=h["c"], epilogue=[{"op": "add", "other": o_t}],
                     label="gemm")
        tl.composite(op="math", math_op="copy", a=h["x"], out=y, label="math")

    log = sim.run(kernel).op_log
    assert sorted(log[(log.label == "gemm") & (log.stage == "DMA_READ")].tensor) == ["A", "B"]
    assert list(log[(log.label == "math") & (log.stage == "DMA_READ")].tensor) == ["Xh"]
    assert list(log[(log.label == "gemm") & (log.stage == "DMA_WRITE")].tensor) == ["C"]


def test_math_head_cannot_stream_more_operands_than_staging_buffers():
    """Three HBM operands would share two staging buffers and clobber each other (a wrong number)."""
    sim = kbwork.Simulator(mode="data")
    x, y, z = (sim.hbm(n, np.full((4, 8), v, np.float32)) for n, v in (("x", 1.0), ("y", 2.0), ("z", 3.0)))

    def kernel(tl, streamed):
        out = tl.alloc((4, 8), "fp32", name="out")
        a = x if "x" in streamed else tl.load(x)
        b = y if "y" in streamed else tl.load(y)
        c = z if "z" in streamed else tl.load(z)
        tl.composite(op="math", math_op="fma", a=a, b=b, c=c, out=out)

    with pytest.raises(ValidationError) as err:
        sim.run(kernel, "xyz")
    assert "x" in str(err.value) and "z" in str(err.value) and "staging" in str(err.value)
    run = sim.run(kernel, "xz")  # two streamed operands fit the two buffers
    np.testing.assert_array_equal(run.read("out"), np.full((4, 8), 1.0 * 2.0 + 3.0, np.float32))


# --- other emit-time validation ----------------------------------------------------------------------------
def _emit(build):
    """Run ``build(tl, h)`` in a kernel and return the ValidationError it raises."""
    sim = kbwork.Simulator(mode="timing")
    h = {"a": sim.hbm("A", shape=(8, 16)), "b": sim.hbm("B", shape=(17, 24)), "c": sim.hbm("C", shape=(8, 24))}

    def kernel(tl):
        h["x"] = tl.alloc((8, 16), "fp32", name="x")
        h["y"] = tl.alloc((8, 15), "fp32", name="y")
        h["col"] = tl.alloc((8, 1), "fp32", name="col")
        h["bt"] = tl.alloc((16, 24), "fp32", name="bt")
        h["ct"] = tl.alloc((8, 24), "fp32", name="ct")
        build(tl, h)

    with pytest.raises(ValidationError) as err:
        sim.run(kernel)
    return str(err.value)


VALIDATION_CASES = {
    "gemm_shape_mismatch": (lambda tl, h: tl.composite(op="gemm", a=h["a"], b=h["b"], out=h["c"]),
                            ["shape mismatch", "B", "(17, 24)"]),
    "gemm_out_shape": (lambda tl, h: tl.composite(op="gemm", a=h["x"], b=h["bt"], out=h["y"]),
                       ["shape mismatch", "out=y", "(8, 15)"]),
    "flat_gemm_wrong_m": (lambda tl, h: tl.composite(ops=[OpSpec(
        "gemm", Scope.KERNEL, {"a": h["x"], "b": h["bt"]}, {"m": 9, "k": 16, "n": 24, "trans_b": False}, h["ct"])]),
        ["shape mismatch", "a=x", "(9, 16)"]),
    "math_broadcast": (lambda tl, h: tl.composite(op="math", math_op="max_elem", a=h["x"], b=h["y"], out=h["x"]),
                       ["max_elem", "do not broadcast", "y"]),
    "reduction_out_shape": (lambda tl, h: tl.composite(op="math", math_op="rmax", a=h["x"], out=h["x"]),
                            ["rmax", "(8, 1)", "out=x"]),
    "bcast_column": (lambda tl, h: tl.composite(op="math", math_op="div_bcast", a=h["x"], b=h["y"], out=h["x"]),
                     ["div_bcast", "b=y", "(8, 1)"]),
    "epilogue_other_shape": (lambda tl, h: tl.composite(op="gemm", a=h["x"], b=h["bt"], out=h["ct"],
                                                        epilogue=[{"op": "add", "other": h["x"]}]),
                             ["other=x", "(8, 16)", "(8, 24)"]),
    "unsupported_dtype_alloc": (lambda tl, h: tl.alloc((4, 4), "fp64", name="bad"), ["fp64", "not supported"]),
    "unsupported_dtype_int": (lambda tl, h: tl.alloc((4, 4), np.int32, name="bad"), ["int32", "not supported"]),
    "unknown_math_op": (lambda tl, h: tl.composite(op="math", math_op="relu", a=h["x"], out=h["x"]),
                        ["relu", "unknown"]),
    "unknown_epilogue_op": (lambda tl, h: tl.composite(op="gemm", a=h["x"], b=h["bt"], out=h["ct"],
                                                       epilogue=[{"op": "gelu"}]),
                            ["epilogue[0]", "gelu", "unknown"]),
    "unknown_flat_kind": (lambda tl, h: tl.composite(ops=[OpSpec("softmax", operands={"a": h["x"]}, out=h["x"])]),
                          ["softmax", "unknown op kind"]),
    "unknown_composite_op": (lambda tl, h: tl.composite(op="conv", a=h["x"], out=h["x"]), ["conv"]),
    "unknown_scope": (lambda tl, h: tl.composite(op="gemm", a=h["x"], b=h["bt"], out=h["ct"],
                                                 epilogue=[{"op": "scale", "factor": 2.0, "scope": "per_tile"}]),
                      ["per_tile", "scope", "k_tile"]),
    "unknown_flat_scope": (lambda tl, h: tl.composite(ops=[
        _gemm_op(h["x"], h["bt"], h["ct"]), OpSpec("scale", "per_tile", {}, {"factor": 2.0})]),
        ["per_tile", "scope"]),
    "tile_scope_non_accumulator": (lambda tl, h: tl.composite(op="gemm", a=h["x"], b=h["bt"], out=h["ct"], epilogue=[
        {"op": "div_bcast", "a": h["ct"], "b": h["col"], "out": h["ct"]}]), ["div_bcast", "output_tile", "kernel"]),
    "prologue_scope": (lambda tl, h: tl.composite(op="gemm", a=h["x"], b=h["bt"], out=h["ct"], prologue=[
        {"op": "copy", "a": h["x"], "out": h["x"], "scope": "k_tile"}]), ["prologue", "k_tile"]),
    "accumulator_with_out": (lambda tl, h: tl.composite(op="math", math_op="copy", a=h["x"], out=h["x"], epilogue=[
        {"op": "scale", "factor": 2.0, "out": h["x"]}]), ["scale", "out="]),
    "accumulator_head": (lambda tl, h: tl.composite(op="math", math_op="scale", factor=2.0),
                         ["scale"]),
    "missing_operand": (lambda tl, h: tl.composite(op="math", math_op="fma", a=h["x"], b=h["x"], out=h["x"]),
                        ["fma", "3 operand"]),
    "missing_scalar": (lambda tl, h: tl.composite(ops=[OpSpec("fill", out=h["x"])]), ["fill", "value"]),
    "math_out_in_hbm": (lambda tl, h: tl.composite(op="math", math_op="copy", a=h["x"], out=h["a"]),
                        ["out=A", "HBM"]),
    "empty_composite": (lambda tl, h: tl.composite(ops=[]), ["at least one op"]),
    "handle_not_a_handle": (lambda tl, h: tl.composite(op="gemm", a=np.zeros((8, 16)), b=h["bt"], out=h["ct"]),
                            ["a=", "handle"]),
    "load_of_tcm": (lambda tl, h: tl.load(h["x"]), ["tl.load", "HBM"]),
    "store_shape": (lambda tl, h: tl.store(h["x"], h["c"]), ["x", "C", "(8, 16)", "(8, 24)"]),
    "bad_row_slice": (lambda tl, h: h["x"][6:3], ["x", "[6:3]", "8 rows"]),
}


@pytest.mark.parametrize("case", list(VALIDATION_CASES))
def test_emit_time_validation_names_the_offending_thing(case):
    build, fragments = VALIDATION_CASES[case]
    msg = _emit(build)
    for frag in fragments:
        assert frag in msg, f"{frag!r} not in {msg!r}"


def test_flat_opspec_accepts_scope_names():
    """A flat-form OpSpec given scope="k_tile" must behave as Scope.K_TILE, not vanish from the schedule."""
    assert OpSpec("scale", "k_tile", {}, {"factor": 2.0}) == OpSpec("scale", Scope.K_TILE, {}, {"factor": 2.0})
    sim = kbwork.Simulator(mode="data")
    A = np.arange(8 * 200, dtype=np.float32).reshape(8, 200) / 1000
    B = np.ones((200, 4), np.float32)
    a, b, c = sim.hbm("A", A), sim.hbm("B", B), sim.hbm("C", shape=(8, 4))

    def kernel(tl):
        tl.composite(ops=[OpSpec("gemm", "kernel", {"a": a, "b": b}, {"m": 8, "k": 200, "n": 4, "trans_b": False}, c),
                          OpSpec("scale", "k_tile", {}, {"factor": 0.5})])

    run = sim.run(kernel)
    assert (run.op_log.phase == "k_epilogue").sum() == 2
    acc = np.zeros((8, 4))
    for ks in (slice(0, 128), slice(128, 200)):
        acc = (acc + A[:, ks] @ B[ks]) * 0.5
    np.testing.assert_allclose(run.read("C"), acc, rtol=1e-6)


def test_hbm_placement_errors():
    sim = kbwork.Simulator(mode="timing")
    with pytest.raises(ValidationError, match="int8.*not supported"):
        sim.hbm("x", np.zeros((2, 2), np.float32), dtype="int8")
    sim.hbm("dup", shape=(2, 2))
    with pytest.raises(ValidationError, match="dup"):
        sim.hbm("dup", shape=(2, 2))
    with pytest.raises(ValidationError, match="shape"):
        sim.hbm("noshape")
    with pytest.raises(ValidationError, match="shape"):
        sim.hbm("rank3", shape=(2, 2, 2))
    data = kbwork.Simulator(mode="data")
    with pytest.raises(ValidationError, match="NaN"):
        data.hbm("nan", np.array([[1.0, np.nan]], np.float32))
