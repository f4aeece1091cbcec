"""tl.range traced once (DESIGN.md §13): what a body may do, what it may not, and that tracing changes nothing.

A body runs once with a symbolic index; anything that needs a concrete value is a TraceError naming the
expression and the fix; a kernel written with a plain Python loop and the same kernel written with
tl.range give byte-identical op_logs and numbers.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

import kbwork
from kbwork import decode
from kbwork.errors import TraceError, ValidationError
from kbwork.kernels import gqa_decode as gq


def _sim(mode="timing", rows=64, n=8, cols=32):
    sim = kbwork.Simulator(mode=mode)
    rng = np.random.default_rng(0)
    X = sim.hbm("X", rng.standard_normal((rows * n, cols)), dtype="bf16")
    W = sim.hbm("W", rng.standard_normal((cols, cols)), dtype="bf16")
    out = sim.hbm("out", shape=(rows * n, cols), dtype="fp32")
    return sim, X, W, out


def _body_run(body, n=8, rows=64):
    """Run a kernel whose loop body is ``body(tl, j, X, Wt, out)`` over ``n`` iterations."""
    sim, X, W, out = _sim(rows=rows, n=n)

    def kernel(tl, X, W, out):
        Wt = tl.load(W, name="Wt")
        for j in tl.range(n):
            body(tl, j, X, Wt, out)
    return sim.run(kernel, X, W, out)


def _gemm(tl, j, X, Wt, out, rows=64):
    tl.composite(op="gemm", a=X[j * rows:(j + 1) * rows], b=Wt, out=out[j * rows:(j + 1) * rows])


# --- misuses: each a TraceError (or a ValidationError naming the iteration) that names the expression --------
def _alloc_in_body(tl, j, X, Wt, out):
    tl.alloc((8, 8), "fp32", name="tmp")


def _full_in_body(tl, j, X, Wt, out):
    tl.full((8, 8), 0.0, "fp32", name="z")


def _load_in_body(tl, j, X, Wt, out):
    tl.load(X[j * 64:(j + 1) * 64])


def _ring_in_body(tl, j, X, Wt, out):
    tl.ring(2, (8, 8), "fp32", name="R")


def _nested(tl, j, X, Wt, out):
    for i in tl.range(2):
        pass


def _branch(tl, j, X, Wt, out):
    if j:
        _gemm(tl, j, X, Wt, out)


def _compare(tl, j, X, Wt, out):
    if j == 3:
        _gemm(tl, j, X, Wt, out)


def _modulo(tl, j, X, Wt, out):
    _gemm(tl, j % 2, X, Wt, out)


def _python_range(tl, j, X, Wt, out):
    for _ in range(j):
        pass


def _list_index(tl, j, X, Wt, out):
    [X, X][j]


def _int(tl, j, X, Wt, out):
    int(j + 1)


def _numpy_index(tl, j, X, Wt, out):
    np.arange(4)[j]


def _extent(tl, j, X, Wt, out):
    X[0:j + 1]


def _square(tl, j, X, Wt, out):
    X[j * j:j * j + 1]


def _label(tl, j, X, Wt, out):
    tl.composite(op="gemm", a=X[j * 64:(j + 1) * 64], b=Wt, out=out[j * 64:(j + 1) * 64], label=f"tile {j}")


def _scalar(tl, j, X, Wt, out):
    tl.composite(op="gemm", a=X[j * 64:(j + 1) * 64], b=Wt, out=out[j * 64:(j + 1) * 64],
                 epilogue=[{"op": "scale", "factor": j}])


def _dict_key(tl, j, X, Wt, out):
    {j: 1}


def _float_division(tl, j, X, Wt, out):
    X[j / 2:j / 2 + 1]


def _out_of_range(tl, j, X, Wt, out):
    tl.composite(op="gemm", a=X[(j + 1) * 64:(j + 2) * 64], b=Wt, out=out[j * 64:(j + 1) * 64])


MISUSES = [
    (_alloc_in_body, TraceError, r"TCM allocation 'tmp' inside a tl\.range body"),
    (_full_in_body, TraceError, r"TCM allocation 'z' inside a tl\.range body"),
    (_load_in_body, TraceError, r"TCM allocation 'X\[64\*j:64\*j \+ 64\]_tcm' inside a tl\.range body"),
    (_ring_in_body, TraceError, r"TCM allocation 'R0' inside a tl\.range body"),
    (_nested, TraceError, r"tl\.range inside a tl\.range body.*flatten"),
    (_branch, TraceError, r"bool\(j\).*peel that iteration out of the loop"),
    (_compare, TraceError, r"bool\(j == 3\)"),
    (_modulo, TraceError, r"j % 2"),
    (_python_range, TraceError, r"j used as a Python int"),
    (_list_index, TraceError, r"j used as a Python int.*list"),
    (_int, TraceError, r"int\(j \+ 1\)"),
    (_numpy_index, TraceError, r"j used as a numpy value \(an array index"),
    (_extent, TraceError, r"X\[0:j \+ 1\]: the extent j \+ 1 changes with the index"),
    (_square, TraceError, r"\(j\) \* \(j\) is not affine"),
    (_label, TraceError, r"format\(j\)"),
    (_scalar, TraceError, r"factor=j is a tl\.range index"),
    (_dict_key, TraceError, r"hash\(j\)"),
    (_float_division, TraceError, r"j / 2"),
    (_out_of_range, ValidationError, r"X\[64\*j \+ 64:64\*j \+ 128\] at the last iteration \(j = 7\) is rows 512:576"),
]


@pytest.mark.parametrize("body,cls,pattern", MISUSES, ids=[m[0].__name__.strip("_") for m in MISUSES])
def test_a_misuse_in_a_body_names_the_expression_and_the_fix(body, cls, pattern):
    with pytest.raises(cls, match=pattern) as err:
        _body_run(body)
    assert type(err.value) is cls or cls is ValidationError


def test_break_out_of_a_body_is_refused_at_the_next_call():
    sim, X, W, out = _sim()

    def kernel(tl, X, W, out):
        Wt = tl.load(W, name="Wt")
        for j in tl.range(8):
            _gemm(tl, j, X, Wt, out)
            break
        tl.composite(op="gemm", a=X[0:64], b=Wt, out=out[0:64])
    with pytest.raises(TraceError, match="left early"):
        sim.run(kernel, X, W, out)


def test_an_index_used_after_its_loop_or_a_body_completion_waited_on_outside_is_refused():
    sim, X, W, out = _sim()

    def late_index(tl, X, W, out):
        Wt = tl.load(W, name="Wt")
        for j in tl.range(8):
            _gemm(tl, j, X, Wt, out)
        X[j * 64:(j + 1) * 64]
    with pytest.raises(TraceError, match="has ended"):
        sim.run(late_index, X, W, out)

    def late_wait(tl, X, W, out):
        Wt = tl.load(W, name="Wt")
        for j in tl.range(8):
            done = tl.composite(op="gemm", a=X[j * 64:(j + 1) * 64], b=Wt, out=out[j * 64:(j + 1) * 64])
        tl.wait(done)
    with pytest.raises(TraceError, match=r"tl\.wait\(Completion\(cmd=1\)\): that command belongs to a tl\.range"):
        sim.run(late_wait, X, W, out)


@pytest.mark.parametrize("use", ["copy", "store", "load", "recipe", "rw", "in the next loop"])
def test_a_handle_made_in_a_body_used_after_its_loop_is_refused_naming_the_last_iteration_s_tensor(use):
    # a Python loop leaves its last iteration's slice in the variable; the body traced once leaves a handle
    # that is a different tensor in every iteration: a command after the loop naming it is refused (it was
    # iteration 0's tensor in every such command before, a number the Python loop does not compute)
    sim = kbwork.Simulator(mode="timing")
    X = sim.hbm("X", shape=(32, 16), dtype="fp32")
    Y = sim.hbm("Y", shape=(8, 16), dtype="fp32")

    def k(tl, X, Y):
        buf = tl.alloc((8, 16), "fp32", name="buf")
        S = tl.ring(2, (8, 16), "fp32", name="S")
        m, l = (tl.full((8, 1), 0.0, "fp32", name=n) for n in "ml")
        kept = {}
        for j in tl.range(4):
            with tl.iteration(j):
                kept["x"], kept["s"] = X[j * 8:(j + 1) * 8], S[j]
                tl.composite(op="math", math_op="copy", a=kept["x"], out=kept["s"])
        if use == "copy":
            tl.composite(op="math", math_op="copy", a=kept["x"], out=buf)
        elif use == "store":
            tl.store(kept["s"], Y)
        elif use == "load":
            tl.load(kept["x"], name="again")
        elif use == "recipe":
            tl.composite(op="math", prologue=[{"op": "softmax_merge", "s": kept["s"], "m": m, "l": l, "O": buf}])
        elif use == "rw":
            tl.composite(op="math", math_op="copy", a=buf, out=buf, rw_handles=[kept["s"]])
        else:
            for i in tl.range(2):
                tl.composite(op="math", math_op="copy", a=kept["s"], out=buf)
    last = "X[24:32]" if use in ("copy", "load") else "S1"
    with pytest.raises(TraceError, match=rf"was made in the body of a tl.range loop that has ended.*"
                                         rf"the last iteration's is {re.escape(last)}"):
        sim.run(k, X, Y)


def test_tl_iteration_of_an_index_is_checked_at_the_first_and_last_iteration():
    with pytest.raises(ValidationError, match=r"tl\.iteration\(j - 1\) is -1 at the first iteration \(j = 0\)"):
        def body(tl, j, X, Wt, out):
            with tl.iteration(j - 1):
                _gemm(tl, j, X, Wt, out)
        _body_run(body)


# --- what a body may do ----------------------------------------------------------------------------------
def test_an_empty_range_emits_nothing_but_its_body_is_traced():
    sim, X, W, out = _sim()

    def kernel(tl, X, W, out, n):
        Wt = tl.load(W, name="Wt")
        for j in tl.range(n):
            tl.composite(op="gemm", a=X[(j + 8) * 64:(j + 9) * 64], b=Wt, out=out[j * 64:(j + 1) * 64])
    run = sim.run(kernel, X, W, out, n=0)  # the slice lies outside X: no iteration runs, nothing is checked
    assert len(run.commands) == 1

    def broken(tl, X, W, out):
        Wt = tl.load(W, name="Wt")
        for j in tl.range(0):
            int(j)
    with pytest.raises(TraceError, match=r"int\(j\)"):
        sim.run(broken, X, W, out)


def test_a_ring_slot_is_the_index_mod_n_concrete_or_symbolic():
    sim, X, W, out = _sim()
    seen = {}

    def kernel(tl, X, W, out):
        S = tl.ring(3, (64, 32), "fp32", name="S")
        seen["peeled"] = S[7].name
        Wt = tl.load(W, name="Wt")
        for j in tl.range(6):
            tl.composite(op="gemm", a=X[j * 64:(j + 1) * 64], b=Wt, out=S[j + 1])
    run = sim.run(kernel, X, W, out)
    assert seen["peeled"] == "S1"
    gemms = [c for c in run.commands if c.ops and c.ops[0].kind == "gemm"]
    assert [c.ops[0].out.name for c in gemms] == ["S1", "S2", "S0", "S1", "S2", "S0"]
    assert run.program.loops[0].period == 3


def test_a_body_runs_once_and_a_run_calls_its_kernel_once():
    calls = {"kernel": 0, "body": 0}
    sim, X, W, out = _sim()

    def kernel(tl, X, W, out):
        calls["kernel"] += 1
        Wt = tl.load(W, name="Wt")
        for j in tl.range(8):
            calls["body"] += 1
            _gemm(tl, j, X, Wt, out)
    run = sim.run(kernel, X, W, out)
    assert calls == {"kernel": 1, "body": 1} and len(run.commands) == 9
    loop = run.program.loops[0]
    assert (loop.first_cmd, loop.cmds_per_iter, loop.iterations, loop.period) == (1, 1, 8, 1)


def test_start_stop_step_ranges_and_affine_labels():
    sim, X, W, out = _sim(n=10)

    def kernel(tl, X, W, out):
        Wt = tl.load(W, name="Wt")
        for j in tl.range(9, 1, -2):  # 9, 7, 5, 3
            with tl.iteration(2 * j + 1):
                tl.composite(op="gemm", a=X[j * 64:(j + 1) * 64], b=Wt, out=out[(9 - j) * 64:(10 - j) * 64])
    run = sim.run(kernel, X, W, out)
    gemms = run.commands[1:]
    assert [c.iter for c in gemms] == [19, 15, 11, 7]
    assert [c.ops[0].operands["a"].name for c in gemms] == ["X[576:640]", "X[448:512]", "X[320:384]", "X[192:256]"]
    assert [c.ops[0].out.name for c in gemms] == ["out[0:64]", "out[128:192]", "out[256:320]", "out[384:448]"]


# --- the Python-loop form and the tl.range form are the same program -----------------------------------------
def _decode_python_loop(tl, q, k, v, out, *, variant, tile):
    """gqa_decode exactly, with a plain Python loop: the program every tile emits, spelt out."""
    spec = gq.VARIANTS[variant]
    G, d = q.shape
    n_tiles = k.shape[0] // tile
    scale = 1.0 / math.sqrt(d)
    Q = tl.load(q, name="Q", label="dma_load Q")
    m = tl.full((G, 1), -math.inf, "fp32", name="m", label="fill m")
    l = tl.full((G, 1), 0.0, "fp32", name="l", label="fill l")
    O = tl.full((G, d), 0.0, "fp32", name="O", label="fill O")
    st = gq.DecodeState(m, l, O, tl.ring(2, (G, tile), "fp32", name="S"))
    if spec.setup is not None:
        spec.setup(tl, st)

    def qk(j):
        with tl.iteration(j):
            tl.composite(op="gemm", a=Q, b=k[j * tile:(j + 1) * tile], trans_b=True, out=st.S[j],
                         epilogue=[{"op": "scale", "factor": scale}], label="qk")

    qk(0)
    for j in range(n_tiles):
        if j + 1 < n_tiles:
            qk(j + 1)
        with tl.iteration(j):
            spec.merge(tl, st, st.S[j], v[j * tile:(j + 1) * tile])
    tl.composite(op="math", math_op="div_bcast", a=O, b=l, out=O, label="div_bcast O")
    tl.store(O, out, label="dma_store O")


def _decode_inputs(sim, kv_len, group=8, head_dim=64, seed=3):
    q, k, v = decode.make_inputs(kv_len, group, head_dim, "bf16", seed)
    return (sim.hbm("q", q, dtype="bf16"), sim.hbm("K", k, dtype="bf16"), sim.hbm("V", v, dtype="bf16"),
            sim.hbm("out", shape=(group, head_dim), dtype="fp32"))


@pytest.mark.parametrize("variant", list(gq.VARIANTS))
@pytest.mark.parametrize("mode", ["timing", "data"])
def test_the_python_loop_and_tl_range_forms_give_byte_identical_op_logs_and_numbers(variant, mode):
    runs = []
    for kernel in (_decode_python_loop, gq.gqa_decode):
        sim = kbwork.Simulator(mode=mode)
        handles = _decode_inputs(sim, 1024)
        runs.append(sim.run(kernel, *handles, variant=variant, tile=128, steady_state=False))
    a, b = runs
    assert a.to_csv() == b.to_csv()
    if mode == "data":
        for name in ("m", "l", "O", "out"):
            assert np.array_equal(a.read(name), b.read(name), equal_nan=True)
    assert not a.program.loops and len(b.program.loops) == 1


def test_a_streaming_kernel_is_the_same_program_in_both_forms():
    def python_form(tl, X, W, out):
        Wt = tl.load(W, name="Wt")
        for j in range(8):
            with tl.iteration(j):
                x = X[j * 64:(j + 1) * 64]
                tl.composite(op="gemm", a=x, b=Wt, out=out[j * 64:(j + 1) * 64])
                with tl.scratch_scope():
                    tl.load(x)

    def traced(tl, X, W, out):
        Wt = tl.load(W, name="Wt")
        for j in tl.range(8):
            with tl.iteration(j):
                x = X[j * 64:(j + 1) * 64]
                tl.composite(op="gemm", a=x, b=Wt, out=out[j * 64:(j + 1) * 64])
                with tl.scratch_scope():
                    tl.load(x)
    logs = []
    for kernel in (python_form, traced):
        for mode in ("timing", "data"):
            sim, X, W, out = _sim(mode=mode)
            r = sim.run(kernel, X, W, out)
            logs.append((mode, r.to_csv(), r.read(out) if mode == "data" else None))
    (_, t1, _), (_, d1, n1), (_, t2, _), (_, d2, n2) = logs
    assert t1 == t2 and d1 == d2 and np.array_equal(n1, n2)
    assert "dma_load X[448:512]" in t2 and "X[448:512]_tcm" not in t2


def test_a_slice_of_a_tile_loaded_in_a_body_scope_is_that_slice_in_every_iteration():
    # the loaded tile is named after its source (X[2:4]_tcm in iteration 1); a row slice of it keeps that name
    def kernel(tl, X, loop):
        o = tl.full((1, 32), 0.0, "fp32", name="o")
        for j in range(8) if loop == "python" else tl.range(8):
            with tl.scratch_scope():
                xt = tl.load(X[2 * j:2 * j + 2])
                tl.composite(op="math", math_op="copy", a=xt[1:2], out=o, label="copy row")
    runs = []
    for loop in ("python", "tl.range"):
        sim, X, _, _ = _sim(mode="data", rows=2)
        runs.append(sim.run(kernel, X, loop))
    python, traced = runs
    assert traced.to_csv() == python.to_csv()
    assert np.array_equal(traced.read("o"), python.read("o"))
    assert traced.commands[-1].ops[0].operands["a"].name == "X[14:16]_tcm[1:2]"


def test_a_recipe_in_a_body_under_a_scope_opened_outside_the_body_is_refused():
    # a Python loop would allocate the recipe's scratch in that scope once per iteration; a body is traced once
    sim = kbwork.Simulator(mode="timing")
    V = sim.hbm("V", shape=(4, 1), dtype="fp32")

    def kernel(tl):
        s, m, l, O = (tl.full((1, 1), v, "fp32", name=n) for n, v in (("s", 0.0), ("m", -math.inf), ("l", 0.0),
                                                                       ("O", 0.0)))
        with tl.scratch_scope():
            for j in tl.range(4):
                tl.composite(op="gemm", b=V[j:j + 1], out=O,
                             prologue=[{"op": "softmax_merge", "s": s, "m": m, "l": l, "O": O}])
    with pytest.raises(TraceError, match=r"recipe 'softmax_merge' allocates its scratch in a tl\.scratch_scope\(\) "
                                         r"opened outside the tl\.range body.*Open the scratch scope inside the body"):
        sim.run(kernel)


# --- waits around and at the end of a body, as a Python loop places them ---------------------------------------
def _wait_kernel(loop, n, where, rel, T=32):
    def kernel(tl, X, W, out):
        Wt = tl.load(W, name="Wt")
        pre = tl.composite(op="gemm", a=X[0:T], b=Wt, out=out[0:T], label="pre")
        if where in ("before", "both"):
            tl.wait(pre)  # holds the loop's first command
        for j in tl.range(n) if loop == "tl" else range(n):
            with tl.iteration(j):
                c = tl.composite(op="gemm", a=X[j * T:(j + 1) * T], b=Wt, out=out[(j + 1) * T:(j + 2) * T],
                                 label="g")
                if where in ("end", "both"):
                    tl.wait(c if rel else pre)  # the last thing of the body: holds the next iteration's first command
        tl.composite(op="math", math_op="fill", out=Wt, value=0.0, label="after")
    return kernel


@pytest.mark.parametrize("where,rel", [("before", True), ("end", True), ("end", False), ("both", True)])
@pytest.mark.parametrize("n", [0, 1, 3, 300])
def test_a_wait_before_a_loop_or_at_the_end_of_its_body_holds_what_a_python_loop_holds(where, rel, n):
    T = 32
    runs = {}
    for loop, steady in (("python", False), ("tl", False), ("tl", True)):
        sim = kbwork.Simulator(mode="timing")
        X = sim.hbm("X", shape=(max(n, 1) * T, 64), dtype="bf16")
        W = sim.hbm("W", shape=(64, 64), dtype="bf16")
        out = sim.hbm("out", shape=((max(n, 1) + 1) * T, 64), dtype="fp32")
        runs[loop, steady] = sim.run(_wait_kernel(loop, n, where, rel), X, W, out, steady_state=steady)
    py = runs["python", False]
    # a body command prints, its symbolic iter label as text (it used to raise a TraceError about an `if`)
    assert "iter=j" in repr(runs["tl", False].program.loops[0].body[0])
    for r in (runs["tl", False], runs["tl", True]):
        assert r.to_csv() == py.to_csv() and r.critical_path().equals(py.critical_path())
    log = py.op_log
    done = log.groupby("cmd")["end"].max()
    first = log[log.stage == "DISPATCH"].set_index("cmd")["ready"]
    if where in ("before", "both") and n:
        assert first[2] >= done[1]  # the loop's first command waited for 'pre'
    if where in ("end", "both") and rel:
        for c in range(3, 3 + n):   # each iteration's first command (and 'after') waited for the one before
            assert first[c] >= done[c - 1]
    fast = runs["tl", True].steady_state
    if n == 300:
        want = "full" if where in ("end", "both") and rel else "steady"
        assert fast.path == want, fast
        if want == "full":
            assert "a tl.wait at the end of its body" in fast.reason and "waits on the one before it" in fast.reason


def test_a_tl_range_iterated_twice_is_two_loops_as_a_python_range_is():
    sim, X, W, out = _sim(mode="data", n=3)
    logs, seen = [], {}
    for use in (False, True):
        def kernel(tl, X, W, out):
            Wt = tl.load(W, name="Wt")
            r = seen["range"] = tl.range(3) if use else range(3)
            for j in r:
                tl.composite(op="gemm", a=X[j * 64:(j + 1) * 64], b=Wt, out=out[j * 64:(j + 1) * 64])
            for j in r:
                tl.composite(op="math", math_op="fill", out=Wt, value=0.0)
        run = sim.run(kernel, X, W, out)
        logs.append((run.to_csv(), run.read(out).tobytes(), len(run.commands)))
        if use:
            assert len(run.program.loops) == 2 and repr(seen["range"]) == "tl.range(3)"
    assert logs[0] == logs[1] and logs[1][2] == 7


def test_run_read_of_a_handle_kept_from_a_body_reads_the_last_iteration_s_tensor():
    got = {}
    for use in (False, True):
        sim = kbwork.Simulator(mode="data")
        X = sim.hbm("X", np.arange(24 * 16, dtype=np.float32).reshape(24, 16))
        Y = sim.hbm("Y", shape=(24, 16), dtype="fp32")
        keep = {}

        def kernel(tl, X, Y, n=3):
            S = tl.ring(2, (8, 16), "fp32", name="S")
            for j in tl.range(n) if use else range(n):
                keep["x"], keep["s"] = X[j * 8:(j + 1) * 8], S[j]
                tl.composite(op="math", math_op="copy", a=X[j * 8:(j + 1) * 8], out=S[j])
                tl.store(S[j], Y[j * 8:(j + 1) * 8])
        run = sim.run(kernel, X, Y)
        got[use] = (run.read(keep["x"]).tobytes(), run.read(keep["s"]).tobytes())
    assert got[False] == got[True]
    sim = kbwork.Simulator(mode="data")
    X = sim.hbm("X", np.ones((8, 16), np.float32))
    keep = {}

    def empty(tl, X):
        for j in tl.range(0):
            keep["x"] = X[j * 8:(j + 1) * 8]
        tl.load(X, name="Xt")
    run = sim.run(empty, X)
    with pytest.raises(ValidationError, match=r"a tl.range that ran no iteration"):
        run.read(keep["x"])


def test_a_completion_made_from_the_index_is_a_trace_error_naming_it():
    def body(tl, j, X, Wt, out):
        _gemm(tl, j, X, Wt, out)
        tl.wait(kbwork.Completion(j))
    with pytest.raises(TraceError, match=r"tl\.wait\(Completion\(j\)\): a command id that is a tl\.range index"):
        _body_run(body)


def test_a_launch_of_more_commands_than_an_op_log_can_hold_is_refused_when_its_loop_closes():
    sim, X, W, out = _sim()

    def kernel(tl, X, W, out):
        Wt = tl.load(W, name="Wt")
        for j in tl.range(2 ** 62):  # len() of such a run would not even fit an index-sized int
            tl.composite(op="gemm", a=X[0:64], b=Wt, out=out[0:64])
    with pytest.raises(ValidationError, match=r"a tl\.range of 4,611,686,018,427,387,904 iterations with 1 "
                                              r"command\(s\) in its body makes the launch 4,611,686,018,427,387,905 "
                                              r"commands; a launch holds at most 67,108,864"):
        sim.run(kernel, X, W, out)


def test_a_steady_run_too_long_for_a_stage_table_gives_its_cycles_and_refuses_its_tables(monkeypatch):
    from kbwork import analysis
    from kbwork.device import expand
    monkeypatch.setattr(expand, "MAX_TABLE_STAGES", 1000)
    sim, X, W, out = _sim()

    def kernel(tl, X, W, out):
        Wt = tl.load(W, name="Wt")
        for j in tl.range(500):
            tl.composite(op="gemm", a=X[0:64], b=Wt, out=out[0:64])
    run = sim.run(kernel, X, W, out)
    full = sim.run(kernel, X, W, out, steady_state=False)   # every stage simulated: its tables exist
    assert run.n_stages == full.n_stages > 1000 and run.cycles == full.cycles
    assert (run.dispatch_cycles() == full.dispatch_cycles()).all()
    for what in (lambda: run.op_log, run.critical_path, lambda: analysis.utilization(run)):
        with pytest.raises(kbwork.SimulationError, match=rf"this run has {run.n_stages:,} stages, .* made for at "
                                                         r"most 1,000\. run\.cycles, run\.steady_state"):
            what()
    assert len(full.op_log) == full.n_stages
