"""A launch is a trace times a binding (DESIGN.md §19): a device run calls a kernel once per abstract signature
(the kernel, its tensor arguments' shapes and dtypes, nested as a pytree, its scalars' values) and binds that
trace to every launch of the signature. What must hold: the count of calls; a kernel reading a tensor
argument's address, channel or contents is refused, naming the argument and the property; and every result
(op_log, commands, numbers, errors) is what tracing every launch by itself gives (``sim._trace_cache = False``,
the reference kept for these tests)."""

from __future__ import annotations

import math
import os

import numpy as np
import pandas as pd
import pytest

import kbwork
from kbwork import Launch, TraceError, ValidationError, analysis
from kbwork.kernels.gqa_decode import gqa_decode

from device_cases import random_device_case, random_replicated_case  # tests/ is on sys.path
from hypothesis import HealthCheck, given, settings
from test_fuzz_loops import Env, kernel_fn
from test_fuzz_loops import kernels as loop_kernels


def decode_device(pes: int, kv: int = 1024, mode: str = "timing", **overrides):
    sim = kbwork.Simulator("ahbm-device-v1", mode=mode, **overrides)
    plan = {}
    rng = np.random.default_rng(0)
    for p in range(pes):
        ch = sim.topo.home_channel(p)
        data = mode == "data"
        q = sim.hbm(f"q{p}", rng.standard_normal((4, 64)) if data else None, shape=None if data else (4, 64),
                    dtype="bf16", channel=ch)
        K = sim.hbm(f"K{p}", rng.standard_normal((kv, 64)) if data else None, shape=None if data else (kv, 64),
                    dtype="bf16", channel=ch)
        V = sim.hbm(f"V{p}", rng.standard_normal((kv, 64)) if data else None, shape=None if data else (kv, 64),
                    dtype="bf16", channel=ch)
        O = sim.hbm(f"O{p}", shape=(4, 64), dtype="fp32", channel=ch)
        plan[p] = [Launch(gqa_decode, q, K, V, O, variant="opt2", tile=128)]
    return sim, plan


def fill_store(sim, pes, kernel, **kw):
    """One launch of ``kernel(tl, x, y, **kw)`` per PE over its own (64,) fp32 tensors."""
    return {p: [Launch(kernel, sim.hbm(f"x{p}", shape=(64,), dtype="fp32", channel=p),
                       sim.hbm(f"y{p}", shape=(64,), dtype="fp32", channel=p), **kw)] for p in range(pes)}


def one_by_one(sim, plan, **kw):
    """The run with every launch traced by itself (the reference the trace cache must reproduce)."""
    sim._trace_cache = False
    try:
        return sim.run_device(plan, **kw)
    finally:
        sim._trace_cache = True


def same_as_one_by_one(sim, plan, run=None, before=lambda: None, **kw):
    """``run`` (or a fresh run) against the launches traced one by one and simulated plainly: CSV, frames PE by
    PE, every command. ``before`` is called before each run (a kernel with state of its own starts afresh)."""
    before()
    run = sim.run_device(plan, **kw) if run is None else run
    before()
    ref = one_by_one(sim, plan, reductions=False, steady_state=False)
    assert run.to_csv() == ref.to_csv()
    for p in ref.pes:
        pd.testing.assert_frame_equal(run.pe(p).op_log, ref.pe(p).op_log)
        assert list(run.pe(p).commands) == list(ref.pe(p).commands)
    return run


# --- how often a kernel is called ------------------------------------------------------------------------------
def test_a_kernel_is_called_once_for_identical_launches_and_once_per_signature():
    calls = []

    def k(tl, x, y, *, scale=1.0):
        calls.append((x.shape, x.dtype, scale))
        buf = tl.full(x.shape, scale, x.dtype, name="buf")
        tl.store(buf, y)
    sim = kbwork.Simulator(mode="timing", pes=16, hbm_channels=16)
    plan = {p: [Launch(k, sim.hbm(f"x{p}", shape=(64,), dtype="fp32", channel=p),
                       sim.hbm(f"y{p}", shape=(64,), dtype="fp32", channel=p))] for p in range(16)}
    run = sim.run_device(plan)
    assert len(calls) == 1
    assert run.reductions.replicated_from == {p: 0 for p in range(1, 16)}
    same_as_one_by_one(sim, plan, run, before=calls.clear)
    # two signatures: half the PEs over bf16 tensors of another shape
    calls.clear()
    sim = kbwork.Simulator(mode="timing", pes=16, hbm_channels=16)
    plan = {p: [Launch(k, sim.hbm(f"x{p}", shape=(64,) if p % 2 else (32, 4), dtype="fp32" if p % 2 else "bf16",
                                  channel=p),
                       sim.hbm(f"y{p}", shape=(64,) if p % 2 else (32, 4), dtype="fp32" if p % 2 else "bf16",
                               channel=p))] for p in range(16)}
    sim.run_device(plan)
    assert sorted(calls) == [((32, 4), "bf16", 1.0), ((64,), "fp32", 1.0)]
    # the cache lives with one run: a new run traces again
    sim.run_device(plan)
    assert len(calls) == 4


def test_a_scalar_that_differs_gives_one_trace_per_value():
    calls = []

    def k(tl, x, y, *, value):
        calls.append(value)
        buf = tl.full(x.shape, value, "fp32", name="buf")
        tl.store(buf, y)
    sim = kbwork.Simulator(mode="data", pes=6, hbm_channels=6)
    values = [1.0, 2.0, 1.0, -0.0, 0.0, 1]  # -0.0 is not 0.0, an int is not a float
    plan = {p: [Launch(k, sim.hbm(f"x{p}", shape=(64,), dtype="fp32", channel=p),
                       sim.hbm(f"y{p}", shape=(64,), dtype="fp32", channel=p), value=v)]
            for p, v in enumerate(values)}
    run = sim.run_device(plan)
    assert len(calls) == 5 and calls.count(1.0) == 2 and type(calls[-1]) is int  # 1 == 1.0: two calls
    fills = [run.pe(p).commands[0].ops[0].extra["value"] for p in range(6)]
    assert fills[:3] == [1.0, 2.0, 1.0] and math.copysign(1, fills[3]) == -1 and type(fills[5]) is int
    for p, v in enumerate(values):
        assert np.all(run.read(f"y{p}") == v)


def test_nested_lists_of_handle_tuples_are_a_pytree_whose_nesting_is_in_the_key():
    calls = []

    def merge(tl, parts, out):
        calls.append(len(parts))
        acc = tl.full(out.shape, 0.0, "fp32", name="acc")
        for a, b in parts:
            ta = tl.load(a)
            tb = tl.load(b[0:8])
            tl.composite(op="math", math_op="max_elem", a=acc, b=ta, out=acc)
            tl.composite(op="math", math_op="max_elem", a=acc, b=tb, out=acc)
        tl.store(acc, out)
    sim = kbwork.Simulator(mode="data", pes=4, hbm_channels=4)
    rng = np.random.default_rng(1)
    plan = {}
    for p in range(4):
        n = 2 if p < 3 else 3  # PE 3's list is longer: another signature
        parts = [(sim.hbm(f"a{p}_{i}", rng.standard_normal((8, 16)).astype(np.float32), channel=p),
                  sim.hbm(f"b{p}_{i}", rng.standard_normal((16, 16)).astype(np.float32), channel=p))
                 for i in range(n)]
        plan[p] = [Launch(merge, parts, sim.hbm(f"o{p}", shape=(8, 16), dtype="fp32", channel=p))]
    run = sim.run_device(plan)
    assert calls == [2, 3]
    for p in range(4):
        parts = plan[p][0].args[0]
        want = np.zeros((8, 16), np.float32)
        for a, b in parts:
            want = np.maximum(np.maximum(want, run.read(a)), run.read(b)[0:8])
        np.testing.assert_allclose(run.read(f"o{p}"), want, rtol=1e-6)
        assert {f"a{p}_0", f"b{p}_0[0:8]"} <= set(run.pe(p).op_log.tensor.astype(str))
        assert f"dma_load b{p}_0[0:8]" in set(run.pe(p).op_log.label.astype(str))
        assert {f"a{p}_0_tcm", f"b{p}_0[0:8]_tcm"} <= {c.dst.name for c in run.pe(p).commands if c.ops == ()}
    calls.clear()
    same_as_one_by_one(sim, plan, run)


# --- what a kernel may not read while it is traced ---------------------------------------------------------------
@pytest.mark.parametrize("prop,word", [("channel", "channel"), ("addr", "address"), ("end", "address"),
                                       ("span", "address"), ("contents", "contents")])
def test_a_kernel_that_branches_on_a_concrete_property_gets_a_trace_error_naming_the_argument_and_it(prop, word):
    def k(tl, x, out):
        if prop == "contents":
            np.asarray(out)
        elif getattr(out, prop):
            tl.composite(op="math", math_op="fill", out=tl.alloc(x.shape, "fp32", name="pad"), value=1.0)
        tl.store(tl.full(x.shape, 1.0, "fp32", name="b"), out)
    sim = kbwork.Simulator(mode="timing", pes=2, hbm_channels=2)
    plan = fill_store(sim, 2, k)
    with pytest.raises(TraceError) as e:
        sim.run_device(plan)
    msg = str(e.value)
    assert msg.startswith("PE 0, launch 0: ") and f"the {word} of tensor argument 'out' (y0)" in msg
    assert "scalar argument" in msg  # the fix


def test_a_slice_of_an_argument_names_its_path_and_name_shape_and_dtype_are_readable():
    def k(tl, parts, out, *, rows):
        assert (out.name, out.shape, out.dtype, out.ndim, len(out)) == ("y0", (64,), "fp32", 1, 64)
        assert parts[0][1:3].shape == (2, 8)
        parts[0][1:3].addr  # noqa: B018  (read on purpose)
    sim = kbwork.Simulator(mode="timing")
    t = sim.hbm("t", shape=(4, 8), dtype="fp32")
    with pytest.raises(TraceError, match=r"address of tensor argument 'parts\[0\]\[1:3\]' \(t\[1:3\]\)"):
        sim.run(k, [t], sim.hbm("y0", shape=(64,), dtype="fp32"), rows=2)


# --- every result is tracing every launch's --------------------------------------------------------------------
def test_decode_on_many_pes_from_one_trace_equals_tracing_each_stage_for_stage():
    sim, plan = decode_device(8)
    run = sim.run_device(plan)
    assert run.reductions.replicated_from == {p: 0 for p in range(1, 8)}
    assert not any("K0" in t for t in run.pe(5).op_log.tensor.astype(str))
    same_as_one_by_one(sim, plan, run)
    # and without reductions (every PE simulated, its program a binding of the one trace)
    same_as_one_by_one(sim, plan, reductions=False)


def test_decode_in_data_mode_from_one_trace_equals_tracing_each_value_for_value():
    sim, plan = decode_device(3, kv=512, mode="data")
    run = sim.run_device(plan)
    ref = one_by_one(sim, plan)
    assert run.to_csv() == ref.to_csv()
    for p in range(3):
        np.testing.assert_array_equal(run.read(f"O{p}"), ref.read(f"O{p}"))
        assert np.any(run.read(f"O{p}") != 0)


def test_a_launch_whose_tensors_alias_is_another_signature():
    calls = []

    def k(tl, a, b, y):
        calls.append(1)
        t = tl.load(a[0:32], name="t")
        u = tl.load(b[0:32], name="u")
        tl.composite(op="math", math_op="max_elem", a=t, b=u, out=t)
        tl.store(t, y[0:32])
    sim = kbwork.Simulator(mode="timing", pes=3, hbm_channels=3)
    plan = {}
    for p in range(3):
        a, b, y = (sim.hbm(f"{n}{p}", shape=(64, 8), dtype="fp32", channel=p) for n in "aby")
        plan[p] = [Launch(k, a, a if p == 2 else b, y)]
    run = same_as_one_by_one(sim, plan)
    assert len(calls) == 2 + 3  # two signatures in the run, three launches one by one
    assert run.reductions.replicated_from == {1: 0}


def test_an_error_while_tracing_names_the_launch_traced():
    def k(tl, x, y, *, v=1.0):
        buf = tl.alloc(x.shape, "fp32", name="buf")
        tl.composite(op="math", math_op="fill", out=buf, value=v)  # the NaN of PE 2 is refused here
        tl.store(buf, y)
    sim = kbwork.Simulator(mode="timing", pes=3, hbm_channels=3)
    plan = fill_store(sim, 3, k)
    plan[2] = [Launch(k, *plan[2][0].args, v=math.nan)]
    with pytest.raises(ValidationError, match=r"^PE 2, launch 0: command #0 op 0 \(fill\)"):
        sim.run_device(plan)


def test_python_side_effects_of_a_kernel_happen_once_per_signature_per_run():
    seen = []

    def k(tl, x, y):
        seen.append(x.name)  # the name of the launch traced
        tl.store(tl.full(x.shape, 1.0, "fp32", name="buf"), y)
    sim = kbwork.Simulator(mode="timing", pes=4, hbm_channels=4)
    plan = fill_store(sim, 4, k)
    run = sim.run_device(plan)
    assert seen == ["x0"]
    assert [run.pe(p).commands[-1].dst.name for p in range(4)] == ["y0", "y1", "y2", "y3"]
    assert [run.pe(p).commands[-1].label for p in range(4)] == ["dma_store buf"] * 4


@pytest.mark.parametrize("seed", range(20))
def test_random_runs_from_one_trace_per_signature_equal_tracing_every_launch(seed):
    case = random_replicated_case(seed) if seed % 2 else random_device_case(seed)
    same_as_one_by_one(case.sim, case.plan)


def test_what_if_on_a_run_from_one_trace_is_what_if_on_the_launches_traced_one_by_one():
    sim, plan = decode_device(4)
    a = analysis.what_if(sim.run_device(plan), engine="PE_DMA", speedup=2)
    b = analysis.what_if(one_by_one(sim, plan, reductions=False), engine="PE_DMA", speedup=2)
    pd.testing.assert_frame_equal(a, b)


# --- random tl.range kernels (tests/test_fuzz_loops.py's generator), one copy per PE ------------------------
EXAMPLES = int(os.environ.get("KBWORK_FUZZ_TRACE_EXAMPLES", "25"))


def fuzz_kernel(tl, hbm, *, spec):
    """The fuzz's kernel ``spec`` over ``hbm`` (a dict of the PE's tensors: a pytree argument)."""
    kernel_fn(spec, Env(spec, hbm), True)(tl)


@settings(max_examples=EXAMPLES, derandomize=True, database=None, deadline=None,
          suppress_health_check=list(HealthCheck), print_blob=False)
@given(loop_kernels())
def test_random_tl_range_kernels_on_every_pe_from_one_trace_equal_tracing_each(kur):
    k, u, _ = kur
    pes = 3
    sim = kbwork.Simulator(mode="timing", **k.topo, pes=pes, hbm_channels=pes)
    plan = {}
    for p in range(pes):
        hbm = {}
        for d in u.declare():
            data = d.data()
            name = f"{d.id}_{p}"
            hbm[d.id] = (sim.hbm(name, shape=d.shape, dtype=d.dtype, channel=p) if data is None
                         else sim.hbm(name, data, dtype=d.dtype, channel=p))
        plan[p] = [Launch(fuzz_kernel, hbm, spec=k)]
    same_as_one_by_one(sim, plan)


def test_tensor_arguments_inside_opspecs_prologue_entries_and_rw_handles_are_bound():
    from kbwork.pe.commands import OpSpec, Scope

    def k(tl, a, b, out):
        at = tl.load(a)
        tl.composite(ops=[OpSpec("gemm", Scope.KERNEL, {"a": at, "b": b}, {"m": 8, "k": 16, "n": 8, "trans_b": False},
                                 out)], rw_handles=[out])
        acc = tl.full((8, 8), 0.0, "fp32", name="acc")
        tl.composite(op="math", math_op="copy", a=acc, out=acc, epilogue=[{"op": "add", "other": acc}])
    sim = kbwork.Simulator(mode="data", pes=3, hbm_channels=3)
    rng = np.random.default_rng(2)
    plan = {p: [Launch(k, sim.hbm(f"a{p}", rng.standard_normal((8, 16)).astype(np.float32), channel=p),
                       sim.hbm(f"b{p}", rng.standard_normal((16, 8)).astype(np.float32), channel=p),
                       sim.hbm(f"o{p}", shape=(8, 8), dtype="fp32", channel=p))] for p in range(3)}
    run = sim.run_device(plan)
    for p in range(3):
        np.testing.assert_allclose(run.read(f"o{p}"), run.read(f"a{p}") @ run.read(f"b{p}"), rtol=1e-5, atol=1e-5)
        assert run.pe(p).commands[1].ops[0].operands["b"].name == f"b{p}"
        assert run.pe(p).commands[1].rw_handles[0].name == f"o{p}"
    same_as_one_by_one(sim, plan, run)


def test_a_tensor_named_like_a_buffer_of_a_later_iteration_is_simulated_not_misnamed():
    # a recipe's scratch in a body's scratch scope is named after the command it serves in each iteration
    # (softmax_merges3.P, softmax_merges5.P, ...): a tensor named so could not be told from it in a replica
    def k(tl, s_src, y):
        m = tl.full((4, 1), 0.0, "fp32", name="m")
        l = tl.full((4, 1), 0.0, "fp32", name="l")
        O = tl.full((4, 16), 0.0, "fp32", name="O")
        S = tl.ring(2, (4, 16), "fp32", name="S")
        for j in tl.range(3):
            with tl.iteration(j), tl.scratch_scope():
                tl.composite(op="math", prologue=[{"op": "softmax_merge", "s": S[j], "m": m, "l": l, "O": O}])
        tl.store(O, y)
    for names in (["s0", "s1"], ["softmax_merges4.P", "s1"]):
        sim = kbwork.Simulator(mode="timing", pes=2, hbm_channels=2)
        plan = {p: [Launch(k, sim.hbm(names[p], shape=(4, 16), dtype="fp32", channel=p),
                           sim.hbm(f"y{p}", shape=(4, 16), dtype="fp32", channel=p))] for p in range(2)}
        run = same_as_one_by_one(sim, plan)
        assert run.reductions.replicated_from == ({1: 0} if names[0] == "s0" else {})
