"""The exact steady state (DESIGN.md §12, kbwork/device/steady.py): for any tl.range loop, a timing run that
inserts whole periods once the state repeats gives the full simulation's results exactly — cycles, the op_log
byte for byte, the critical path, the holds — and falls back, saying why, where it cannot."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import kbwork
from kbwork import analysis, decode
from kbwork.errors import ValidationError
from kbwork.kernels import gqa_decode as gq


def assert_same(full, fast):
    """Every result of a steady-state run equals the full run's."""
    assert fast.cycles == full.cycles
    assert fast.n_stages == full.n_stages and len(fast.commands) == len(full.commands)
    assert fast.to_csv() == full.to_csv()
    assert fast.critical_path().equals(full.critical_path())
    assert fast.holds().equals(full.holds())
    assert np.array_equal(fast.dispatch_cycles(), full.dispatch_cycles())
    assert analysis.attribution(fast).equals(analysis.attribution(full))


# 60 configurations: every variant and policy, and the knobs that change the schedule's shape
_KNOBS = [{}, {"fixed_cycles": 0}, {"fixed_cycles": 400, "r_cycles_per_byte": 0.5}, {"cmd_queue_depth": 2},
          {"cmd_queue_depth": 16}, {"dma_channels": 2}, {"tile_buffers": 3}, {"dma_base_cycles": 1000},
          {"math_cost_exp": 16}, {"gemm_base_cycles": 200}]
CONFIGS = [dict(variant=v, hazard_policy=p, **knob)
           for v, p, knob in itertools.product(("opt2", "opt3", "a1"), ("strict_fifo", "rw_aware"), _KNOBS)]


def _decode_pair(cfg, kv_len=8192, **sizes):
    cfg = dict(cfg)
    variant = cfg.pop("variant")
    kw = dict(kv_len=kv_len, mode="timing", **sizes, **cfg)
    return (decode.run(variant, steady_state=False, **kw).run, decode.run(variant, **kw).run)


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
def test_the_steady_state_equals_the_full_run(cfg):
    full, fast = _decode_pair(cfg)
    assert full.steady_state.path == "full" and full.steady_state.reason == "steady_state=False"
    assert_same(full, fast)


def test_most_decode_configurations_take_the_steady_path():
    paths = [_decode_pair(cfg, kv_len=4096)[1].steady_state for cfg in CONFIGS[:20]]
    assert sum(p.path == "steady" for p in paths) >= 18, [p for p in paths if p.path != "steady"]
    steady = next(p for p in paths if p.path == "steady")
    assert steady.period == 2 and steady.proven_at >= 2 and steady.reason is None and steady.inserted > 0


@pytest.mark.parametrize("sizes", [dict(tile=64), dict(group=4, head_dim=64), dict(dtype="fp32", tile=256),
                                   dict(group=32, head_dim=256, tile=32), dict(dtype="fp16")])
def test_the_steady_state_holds_across_sizes(sizes):
    for cfg in (dict(variant="opt2", hazard_policy="strict_fifo"), dict(variant="opt3", hazard_policy="rw_aware")):
        full, fast = _decode_pair(cfg, kv_len=8192, **sizes)
        assert fast.steady_state.path == "steady"
        assert_same(full, fast)


# --- any kernel, not decode alone ----------------------------------------------------------------------------
def _stream_sim(n=48, rows=64, cols=64, mode="timing"):
    sim = kbwork.Simulator(mode=mode)
    X = sim.hbm("X", shape=(n * rows, cols), dtype="bf16")
    Y = sim.hbm("Y", shape=(n * rows, cols), dtype="bf16")
    W = sim.hbm("W", shape=(cols, cols), dtype="bf16")
    out = sim.hbm("out", shape=(n * rows, cols), dtype="fp32")
    out2 = sim.hbm("out2", shape=(n * rows, cols), dtype="fp32")
    return sim, X, Y, W, out, out2


def _stream(tl, X, W, out, *, n, rows=64):
    """``out[j] = X[j] @ W``: a read-only stream in, a strided write out."""
    Wt = tl.load(W, name="Wt")
    for j in tl.range(n):
        with tl.iteration(j):
            tl.composite(op="gemm", a=X[j * rows:(j + 1) * rows], b=Wt, out=out[j * rows:(j + 1) * rows],
                         epilogue=[{"op": "scale", "factor": 0.5}])


def _both(kernel, *args, **kw):
    out = []
    for steady in (False, True):
        sim, X, Y, W, o, o2 = _stream_sim()
        handles = {"X": X, "Y": Y, "W": W, "out": o, "out2": o2}
        out.append(sim.run(kernel, *[handles[a] for a in args], steady_state=steady, **kw))
    return out


def test_a_streaming_kernel_that_writes_out_j_takes_the_steady_path():
    full, fast = _both(_stream, "X", "W", "out", n=48)
    assert fast.steady_state.path == "steady", fast.steady_state
    assert_same(full, fast)


def _two_loops(tl, X, Y, W, out, out2, *, n, rows=64):
    Wt = tl.load(W, name="Wt")
    for j in tl.range(n):
        with tl.iteration(j):
            tl.composite(op="gemm", a=X[j * rows:(j + 1) * rows], b=Wt, out=out[j * rows:(j + 1) * rows])
    tl.composite(op="math", math_op="fill", out=tl.alloc((8, 8), "fp32", name="between"), value=1.0)
    for j in tl.range(n):
        with tl.iteration(j):
            tl.composite(op="gemm", a=Y[j * rows:(j + 1) * rows], b=Wt, out=out2[j * rows:(j + 1) * rows])


def test_two_loops_in_one_kernel_are_accelerated_one_after_another():
    full, fast = _both(_two_loops, "X", "Y", "W", "out", "out2", n=48)
    state = fast.steady_state
    assert state.path == "steady" and len(state.loops) == 2
    assert all("steady: period" in line for line in state.loops), state.loops
    assert len(fast.program.loops) == 2
    assert_same(full, fast)


def test_a_body_with_python_side_effects_is_traced_once_on_both_paths():
    calls = []

    def odd_merge(tl, st, Sj, Vj):
        calls.append(1)
        if len(calls) == 40:  # would change tile 40 of a Python loop; a traced body runs once
            tl.composite(op="math", math_op="copy", a=st.m, out=st.scratch["spare"], label="spare")
        gq._merge_opt2(tl, st, Sj, Vj)

    def setup(tl, st):
        st.scratch["spare"] = tl.alloc((st.m.shape[0], 1), "fp32", name="spare")

    gq.VARIANTS["odd"] = gq.Variant("odd", odd_merge, "a merge with a per-call side effect", setup=setup)
    try:
        runs = []
        for steady in (False, True):
            calls.clear()
            runs.append(decode.run("odd", kv_len=128 * 64, mode="timing", steady_state=steady).run)
            assert len(calls) == 2  # the body once, the peeled last tile once
        full, fast = runs
        assert fast.steady_state.path == "steady"
        assert_same(full, fast)
        assert "spare" not in set(full.op_log["label"])
    finally:
        del gq.VARIANTS["odd"]


def _breaking(tl, X, W, out, *, n, rows=64):
    """Each iteration writes out[0:rows] and reads out[j] back: the fixed write meets the moving read at
    j = 0 only, so the hazards differ between iterations."""
    Wt = tl.load(W, name="Wt")
    for j in tl.range(n):
        with tl.iteration(j):
            tl.composite(op="gemm", a=X[j * rows:(j + 1) * rows], b=Wt, out=out[0:rows])
            tl.composite(op="gemm", a=out[j * rows:(j + 1) * rows], b=Wt, out=out[0:rows])


def test_a_loop_that_breaks_shift_invariance_runs_in_full_and_says_why():
    full, fast = _both(_breaking, "X", "W", "out", n=40)
    state = fast.steady_state
    assert state.path == "full" and "overlaps in some iterations and not in others" in state.reason, state
    assert state.period is None and state.proven_at is None
    assert fast.to_csv() == full.to_csv() and fast.cycles == full.cycles


def test_too_short_a_loop_runs_in_full_and_says_so():
    r = decode.run("opt2", kv_len=128 * 6, mode="timing").run
    assert r.steady_state.path == "full" and "too few" in r.steady_state.reason


def test_a_program_without_loops_says_so():
    sim = kbwork.Simulator(mode="timing")
    A = sim.hbm("A", shape=(64, 64), dtype="bf16")
    run = sim.run(lambda tl, a: tl.load(a), A)
    assert run.steady_state.path == "full" and "no tl.range loop" in run.steady_state.reason


def test_data_mode_computes_every_number():
    r = decode.run("opt2", kv_len=128 * 40, mode="data").run
    assert r.steady_state.path == "full" and "data mode" in r.steady_state.reason


# --- the switch ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("bad", [0, 1, None, np.False_, np.True_, "yes", 1.0])
def test_steady_state_takes_a_bool_only(bad):
    with pytest.raises(ValidationError, match="steady_state must be True or False"):
        decode.run("opt2", kv_len=1024, mode="timing", steady_state=bad)
    sim, X, Y, W, o, o2 = _stream_sim()
    with pytest.raises(ValidationError, match="Simulator.run: steady_state must be True or False"):
        sim.run(_stream, X, W, o, n=48, steady_state=bad)
    with pytest.raises(ValidationError, match="steady_state must be True or False"):
        decode.run("opt2", kv_len=1024, mode="data", steady_state=bad)


def test_steady_state_is_never_passed_to_the_kernel():
    got = {}

    def kernel(tl, X, W, out, **kw):
        got.update(kw)
        _stream(tl, X, W, out, n=48)
    sim, X, Y, W, o, o2 = _stream_sim()
    sim.run(kernel, X, W, o, steady_state=False, flavour="plain")
    assert got == {"flavour": "plain"}


# --- the fast path is a Run like any other -------------------------------------------------------------------
def test_the_fast_paths_program_and_commands_read_like_the_full_runs():
    full, fast = _decode_pair(dict(variant="opt3", hazard_policy="strict_fifo"), kv_len=128 * 80)
    assert fast.steady_state.path == "steady"
    for idx in (0, 7, -1, -13, slice(10, 20), slice(-5, None), slice(None, None, 97)):
        assert repr(fast.commands[idx]) == repr(full.commands[idx])
        assert list(np.atleast_1d(fast.program.labels[idx])) == list(np.atleast_1d(full.program.labels[idx]))
        assert list(np.atleast_1d(fast.program.iters[idx])) == list(np.atleast_1d(full.program.iters[idx]))
    for idx in (0, 5, -1, -40, len(full.program.table) // 2):
        assert fast.program.table.preds[idx] == full.program.table.preds[idx]
    assert fast.program.table.preds[-3:] == full.program.table.preds[-3:]
    assert list(fast.program.waits[-2:]) == list(full.program.waits[-2:])
    assert [tuple(x) for x in fast.program.reads[100:104]] == [tuple(x) for x in full.program.reads[100:104]]
    assert list(fast.program.dispatch_seq) == list(full.program.dispatch_seq)
    assert fast.program.edge_reach() == full.program.edge_reach()
    assert len(fast.commands) == len(full.commands) and list(fast.commands) == list(full.commands)
    assert analysis.dispatch_per_tile_from_run(fast).equals(analysis.dispatch_per_tile_from_run(full))


def test_what_if_on_a_steady_run_equals_what_if_on_the_full_run():
    full, fast = _decode_pair(dict(variant="opt2", hazard_policy="strict_fifo"), kv_len=128 * 64)
    for engine in ("PE_DMA", "PE_GEMM"):
        a = analysis.what_if(full, engine=engine, speedup=2)
        b = analysis.what_if(fast, engine=engine, speedup=2)
        assert a.equals(b)


def test_a_million_token_run_costs_its_simulated_stretch():
    r = decode.run("opt3", kv_len=1 << 20, mode="timing").run
    assert r.steady_state.path == "steady" and r.steady_state.inserted > 3000
    ex = r.program._ex  # what was simulated: a few dozen iterations, not eight thousand
    assert len(ex.sched.table) < r.n_stages // 50
