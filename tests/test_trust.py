"""No silently wrong numbers: recipe scratch in hazards, handle lifetimes, validated scalars and
host data, the one plan cache, and thread safety (DESIGN.md §2, §3, §5).

Each test reproduces a way kbwork once returned a wrong number without an error, and checks
that it now returns the right one or refuses with a ValidationError that names the thing.
"""

from __future__ import annotations

import dataclasses
import gc
import math
import threading

import numpy as np
import pytest

import kbwork
from kbwork import Completion, OpSpec, ValidationError, decode
from kbwork.memory import Handle, Space
from kbwork.pe import ops as pe_ops
from kbwork.pe.templates import PLAN_CACHE
from kbwork.sim import gc_paused
from kbwork.triton_emu.tl_recipes import (RECIPE_DESCRIPTORS, EngineOp, PrimaryOutSpec, RecipeDescriptor,
                                          ScratchSpec)

POLICIES = ["strict_fifo", "rw_aware"]
SMALL = dict(tile_m=8, tile_n=8, tile_k=8, tile_buffers=1, cmd_queue_depth=3)


# --- recipe scratch is written by its composite -----------------------------------------------------
@pytest.mark.parametrize("policy", POLICIES)
def test_bytes_a_scope_released_are_not_overwritten_while_the_recipe_is_in_flight(policy):
    # The merge is held behind the load of s; t6 takes the bytes the scope released (the recipe's
    # m_loc). Were scratch not a write of the merge, t6's fill would run first and the merge's rmax
    # would then overwrite t6 with 1.5.
    sim = kbwork.Simulator(hazard_policy=policy, **SMALL)
    V = sim.hbm("V", np.full((1, 1), 2.0, np.float32))
    s_h = sim.hbm("s_h", np.full((1, 1), 1.5, np.float32))
    out = sim.hbm("out", shape=(1, 1))

    def kernel(tl):
        m = tl.full((1, 1), -math.inf, "fp32", name="m")
        l = tl.full((1, 1), 0.0, "fp32", name="l")
        O = tl.full((1, 1), 0.0, "fp32", name="O")
        s = tl.load(s_h, name="s")
        with tl.scratch_scope():
            tl.composite(prologue=[{"op": "softmax_merge", "s": s, "m": m, "l": l, "O": O}], op="gemm", b=V,
                         out=O, epilogue=[{"op": "add", "other": O}])
            scratch = tl.commands[-1].scratch
        t6 = tl.full((1, 1), 0.0, "fp32", name="t6")
        assert any(t6.overlaps(h) for h in scratch)  # the case under test
        tl.store(t6, out)

    run = sim.run(kernel)
    assert run.read("t6")[0, 0] == 0.0 and run.read(out)[0, 0] == 0.0
    assert run.read("O")[0, 0] == 2.0 and run.read("l")[0, 0] == 1.0


@pytest.fixture
def exp_rows(monkeypatch):
    """A recipe with no RW operand (P = exp(s - c), P feeds the GEMM): sharers share only scratch."""
    rd = RecipeDescriptor(
        name="exp_rows", operands={"s": "R", "c": "R"}, scratch=(ScratchSpec("P", "s", "fp32"),),
        engine_seq=(EngineOp("MATH", "exp_diff", ("s", "c"), "P"),), primary_out=PrimaryOutSpec("P", "a"))
    monkeypatch.setitem(RECIPE_DESCRIPTORS, "exp_rows", rd)
    return rd


def _two_exp_rows(mode: str, policy: str, host: dict):
    sim = kbwork.Simulator(mode=mode, hazard_policy=policy)
    h = {n: (sim.hbm(n, x) if mode == "data" else sim.hbm(n, shape=x.shape)) for n, x in host.items()}
    outs = [sim.hbm(f"O{i}", shape=(8, 32)) for i in (1, 2)]

    def kernel(tl):
        t = {n: tl.load(h[n], name=n + "_t") for n in ("s1", "s2", "c1", "c2")}
        for i, o in zip((1, 2), outs):
            tl.composite(prologue=[{"op": "exp_rows", "s": t[f"s{i}"], "c": t[f"c{i}"]}], op="gemm",
                         b=h[f"V{i}"], out=o)

    return sim.run(kernel), outs


@pytest.mark.parametrize("policy", POLICIES)
def test_a_recipe_without_rw_operands_orders_the_composites_sharing_its_scratch(exp_rows, policy):
    rng = np.random.default_rng(3)
    host = {n: rng.standard_normal(shape).astype(np.float32)
            for n, shape in (("s1", (8, 64)), ("s2", (8, 64)), ("c1", (8, 1)), ("c2", (8, 1)),
                             ("V1", (64, 32)), ("V2", (64, 32)))}
    run, outs = _two_exp_rows("data", policy, host)
    a, b = run.commands[-2:]
    assert a.scratch == b.scratch  # kernel-scope scratch, shared
    for i, o in zip((1, 2), outs):
        want = np.exp(host[f"s{i}"] - host[f"c{i}"]) @ host[f"V{i}"]
        np.testing.assert_allclose(run.read(o), want, rtol=1e-5, atol=1e-4)
    # the new recipe needed no cache key: timing mode (planned through the cache) agrees stage for stage
    for _ in range(2):
        assert _two_exp_rows("timing", policy, host)[0].to_csv() == run.to_csv()


def test_recipe_scratch_is_in_the_write_footprint():
    from kbwork.pe.scheduler import footprint

    r = decode.run("opt2", kv_len=256, mode="timing")
    merge = next(c for c in r.run.commands if c.label == "pv_merge")
    _, writes = footprint(merge)
    assert all(h.span in writes for h in merge.scratch)


# --- handle lifetimes --------------------------------------------------------------------------------
def _fill_store(sim, target, value=1.0):
    def kernel(tl):
        x = tl.full(target.shape, value, "fp32", name="x")
        return tl.store(x, target)
    return kernel


def test_a_handle_of_another_simulator_is_refused():
    s1, s2 = kbwork.Simulator(), kbwork.Simulator()
    a1 = s1.hbm("A", np.ones((4, 4), np.float32))
    s2.hbm("A", np.zeros((4, 4), np.float32))
    with pytest.raises(ValidationError, match=r"tl\.load: handle 'A' comes from the HBM of simulator #\d+, not"):
        s2.run(lambda tl: tl.load(a1))
    with pytest.raises(ValidationError, match=r"handle 'A'.*another|comes from"):
        s2.run(lambda tl: tl.composite(op="math", math_op="copy", a=a1, out=tl.alloc((4, 4), name="y")))


def test_tcm_handles_and_completions_of_an_earlier_run_are_refused():
    sim = kbwork.Simulator()
    B = sim.hbm("B", shape=(4, 4))
    kept = {}

    def first(tl):
        kept["x"] = tl.full((4, 4), 3.0, "fp32", name="x")
        kept["done"] = tl.store(kept["x"], B)

    sim.run(first)
    with pytest.raises(ValidationError, match=r"tl\.store source: handle 'x' comes from the TCM of run 1.*TCM is fresh"):
        sim.run(lambda tl: tl.store(kept["x"], B))
    with pytest.raises(ValidationError, match=r"another run"):
        sim.run(lambda tl: (tl.full((4, 4), 0.0, name="y"), tl.wait(kept["done"])))

    def hand_built(tl):  # Completion(0) means command 0 of this run
        tl.full((4, 4), 0.0, name="y")
        tl.wait(Completion(0))
        tl.full((4, 4), 0.0, name="z")

    run = sim.run(hand_built)
    assert run.program.waits[1] == (0,)


def test_a_scratch_scope_handle_is_refused_after_the_scope():
    sim = kbwork.Simulator()
    B = sim.hbm("B", shape=(4, 4))

    def kernel(tl):
        with tl.scratch_scope():
            t = tl.full((4, 4), 1.0, "fp32", name="t")
            half = t[0:2]
        tl.full((4, 4), 2.0, "fp32", name="u")
        tl.store(half, B[0:2])

    with pytest.raises(ValidationError, match=r"handle 't\[0:2\]' was allocated inside a tl\.scratch_scope\(\) "
                                              r"that has closed after command #0"):
        sim.run(kernel)


def test_a_hand_built_handle_is_refused_and_origin_is_not_part_of_equality():
    sim = kbwork.Simulator(mode="timing")
    a = sim.hbm("A", shape=(4, 4))
    twin = Handle("A", Space.HBM, a.addr, a.shape, a.dtype, False)
    assert twin == a and hash(twin) == hash(a) and twin.origin is None and a.origin is not None
    with pytest.raises(ValidationError, match=r"handle 'A' was not made by this simulator"):
        sim.run(lambda tl: tl.load(twin))


def test_run_read_returns_its_own_numbers_after_the_simulator_ran_again():
    sim = kbwork.Simulator()
    C = sim.hbm("C", shape=(4, 4))
    D = sim.hbm("D", np.full((4, 4), 7.0, np.float32))

    def kernel(tl, v, target):
        x = tl.full((4, 4), v, "fp32", name="x")
        tl.store(x, target)

    r1 = sim.run(kernel, 1.0, C)
    r2 = sim.run(kernel, 2.0, C)
    assert (r1.read(C) == 1.0).all() and (r2.read(C) == 2.0).all()  # r1's own snapshot
    assert (r1.read("x") == 1.0).all() and (r2.read("x") == 2.0).all()  # each run's own TCM
    r3 = sim.run(kernel, 3.0, D)  # overwrites D, which r1 did not write
    with pytest.raises(kbwork.SimulationError, match=r"Run\.read\('D'\): a later run .*overwrote"):
        r1.read(D)
    assert (r3.read(D) == 3.0).all() and (r1.read(C) == 1.0).all()
    with pytest.raises(ValidationError, match=r"handle 'x' comes from the TCM of run 2"):
        r1.read(r2._tcm_names["x"][0])


def test_run_read_refuses_dead_and_ambiguous_names():
    sim = kbwork.Simulator()

    def kernel(tl):
        with tl.scratch_scope():
            tl.full((1, 1), 5.0, name="tmp")
        tl.full((1, 1), 1.0, name="twice")
        tl.full((1, 1), 2.0, name="twice")

    run = sim.run(kernel)
    with pytest.raises(ValidationError, match=r"'tmp' was allocated inside a tl\.scratch_scope\(\)"):
        run.read("tmp")
    with pytest.raises(ValidationError, match=r"the name 'twice' is given to 2 tensors"):
        run.read("twice")


# --- scalars and host data ----------------------------------------------------------------------------
BAD_SCALARS = [(None, r"factor=None"), ("abc", r"factor='abc' \(str\) is not a real number"),
               ([1.0], r"factor=\[1.0\] \(list\)"), (float("nan"), r"factor is NaN"),
               (True, r"factor=True \(bool\)"), (1e39, r"factor=1e\+39 is beyond the float32 range"),
               (10 ** 400, r"factor=1000.* is beyond the float32 range"),
               (np.array([1.0]), r"factor=array\(\[1\.\]\) \(ndarray\) is not a real"),
               (1 + 0j, r"factor=\(1\+0j\) \(complex\)")]


@pytest.mark.parametrize("mode", ["data", "timing"])
@pytest.mark.parametrize("value,pattern", BAD_SCALARS, ids=lambda v: repr(v)[:12])
def test_bad_scalars_are_refused_in_both_modes(mode, value, pattern):
    sim = kbwork.Simulator(mode=mode)

    def kernel(tl):
        x = tl.alloc((4, 4), "fp32", name="x")
        tl.composite(op="gemm", a=x, b=x, out=x, epilogue=[{"op": "scale", "factor": value}])

    with pytest.raises(ValidationError, match=r"command #0 op 1 \(scale\): " + pattern):
        sim.run(kernel)


def test_infinities_and_signed_zeros_are_scalars_and_negative_zero_is_not_zero():
    a = OpSpec("fill", extra={"value": 0.0})
    b = OpSpec("fill", extra={"value": -0.0})
    assert a != b and hash(a) != hash(b) and OpSpec("fill", extra={"value": 1}) == OpSpec("fill", extra={"value": 1.0})
    sim = kbwork.Simulator()
    run = sim.run(lambda tl: (tl.full((1, 1), -0.0, name="nz"), tl.full((1, 1), -math.inf, name="ninf")))
    assert np.signbit(run.read("nz")[0, 0]) and run.read("ninf")[0, 0] == -np.inf


@pytest.mark.parametrize("mode", ["data", "timing"])
def test_host_data_that_would_change_is_refused(mode):
    sim = kbwork.Simulator(mode=mode)
    with pytest.raises(ValidationError, match=r"sim\.hbm\('big'\): values up to 1e\+39 overflow fp32"):
        sim.hbm("big", np.array([1e39]))
    with pytest.raises(ValidationError, match=r"sim\.hbm\('h'\): values up to 7e\+04 overflow fp16"):
        sim.hbm("h", np.array([7e4]), dtype="fp16")
    with pytest.raises(ValidationError, match=r"sim\.hbm\('cx'\): the array is complex"):
        sim.hbm("cx", np.array([1 + 2j]))
    with pytest.raises(ValidationError, match=r"tensor 'sh': shape \(2\.5, 3\) must hold ints only"):
        sim.hbm("sh", shape=(2.5, 3))
    with pytest.raises(ValidationError, match=r"NaN or inf"):
        sim.hbm("n", np.array([np.nan]))
    assert sim.hbm("ok", np.array([6e4]), dtype="fp16").dtype == "fp16"


def test_fill_values_that_overflow_their_tensor_are_refused():
    with pytest.raises(ValidationError, match=r"value=70000\.0 overflows out=x's dtype fp16"):
        kbwork.Simulator(mode="timing").run(lambda tl: tl.full((2, 2), 7e4, "fp16", name="x"))


# --- the one cache -----------------------------------------------------------------------------------
def _exp_program(sim_mode: str):
    sim = kbwork.Simulator(mode=sim_mode)
    x = sim.hbm("x", np.zeros((8, 128), np.float32))

    def kernel(tl):
        a = tl.load(x, name="a")
        b = tl.alloc((8, 1), name="b")
        out = tl.alloc((8, 128), name="o")
        tl.composite(op="math", math_op="rmax", a=a, out=b)
        for j in range(4):
            with tl.iteration(j):
                tl.composite(op="math", math_op="exp_diff", a=a, b=b, out=out)

    return sim.run(kernel)


def test_editing_the_op_table_invalidates_planned_timing(monkeypatch):
    before = _exp_program("timing")  # records templates under the current table
    before = _exp_program("timing")
    cheap = dataclasses.replace(pe_ops.OPS["exp_diff"], exp_cost=False)
    monkeypatch.setitem(pe_ops.OPS, "exp_diff", cheap)
    timing, data = _exp_program("timing"), _exp_program("data")
    assert timing.to_csv() == data.to_csv()
    assert timing.cycles < before.cycles


def test_clear_caches_empties_the_plan_cache_and_changes_no_result():
    decode.run("opt3", kv_len=512, mode="timing")
    warm = decode.run("opt3", kv_len=512, mode="timing").to_csv()
    assert len(PLAN_CACHE) > 0
    kbwork.clear_caches()
    assert len(PLAN_CACHE) == 0
    assert decode.run("opt3", kv_len=512, mode="timing").to_csv() == warm


def test_no_module_keeps_a_cache_but_the_plan_cache():
    import ast
    import pathlib

    root = pathlib.Path(kbwork.__file__).parent
    found = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for d in node.decorator_list:
                    name = ast.unparse(d)
                    # functools.lru_cache / functools.cache memoise for the whole process (a per-instance
                    # cached_property does not)
                    if "lru_cache" in name or name.split("(")[0].split(".")[-1] == "cache":
                        found.append(f"{path.relative_to(root)}:{node.lineno} @{name}")
    assert found == [], f"process-wide memo caches besides PLAN_CACHE: {found}"


# --- threads -----------------------------------------------------------------------------------------
def test_runs_on_eight_threads_match_serial_runs_and_leave_the_collector_alone():
    points = [dict(variant=v, fixed_cycles=f, r_cycles_per_byte=r, hazard_policy=p)
              for v in ("opt2", "opt3") for f, r, p in ((0, 0.0625, "strict_fifo"), (40, 0.25, "rw_aware"),
                                                        (160, 0.0, "strict_fifo"), (7, 1.0, "rw_aware"))]

    def one(pt):
        r = decode.run(pt["variant"], kv_len=512, mode="data", fixed_cycles=pt["fixed_cycles"],
                       r_cycles_per_byte=pt["r_cycles_per_byte"], hazard_policy=pt["hazard_policy"])
        return r.to_csv(), r.O.tobytes()

    serial = [one(pt) for pt in points]
    for enabled in (True, False):
        (gc.enable if enabled else gc.disable)()
        kbwork.clear_caches()
        results: list = [None] * len(points)
        errors: list = []

        def work(i):
            try:
                results[i] = one(points[i])
            except Exception as exc:  # pragma: no cover - reported below
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(i,)) for i in range(len(points))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors and results == serial
        assert gc.isenabled() is enabled
    gc.enable()


def test_gc_paused_nests_across_threads():
    gc.enable()
    barrier = threading.Barrier(8)

    def work():
        with gc_paused():
            barrier.wait()
            assert not gc.isenabled()
            with gc_paused():
                pass

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert gc.isenabled()


def test_what_a_paused_block_keeps_is_handed_to_the_oldest_generation_and_a_freeze_of_others_is_left_alone():
    gc.enable()
    gc.collect()
    with gc_paused():
        kept = [[i] for i in range(1000)]  # made inside the block and still held after it
    oldest = {id(o) for o in gc.get_objects(generation=2)}
    assert all(id(x) in oldest for x in kept)  # promoted unscanned, not left for the young collections to walk
    assert gc.get_freeze_count() == 0 and gc.isenabled()

    gc.freeze()  # someone else's freeze (as before a fork): a paused block must not release it
    try:
        frozen = gc.get_freeze_count()
        with gc_paused():
            more = [[i] for i in range(10)]
        assert gc.get_freeze_count() == frozen and gc.isenabled()
        assert more
    finally:
        gc.unfreeze()

    gc.disable()  # a collector the caller turned off stays off, and nothing is moved
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
    # a cycle made in a block and dropped after it is still collected (by the next full collection)
    with gc_paused():
        a: list = []
        a.append(a)
    probe = id(a)
    del a
    gc.collect()
    assert probe not in {id(o) for o in gc.get_objects()}
