"""The op_log's ready column, the binding constraint of every stage, the critical path, holds, and the
analysis built on them (DESIGN §6, §11).

``check_ready`` and ``check_critical_path`` recompute every expectation from the op_log, the static
program and the DESIGN text (holds from the commands' footprints, queue slots from completions), never
by asking the timeline's own resolution. They run on the benches, on decode, and on the seeded random
programs of ``test_core_timeline`` under both hazard policies, queue depths 1-3 and ``tl.wait``.
"""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np
import pandas as pd
import pytest

import kbwork
from kbwork import analysis, decode
from kbwork.kernels.gemm import BENCHES
from kbwork.device import CAUSES
from test_core_timeline import RANDOM_SEEDS, _footprint, _overlap, build_and_run, make_program

ceil = math.ceil
FRONT = ("DISPATCH", "PLAN")


def _conflict(fp, c, o) -> bool:
    (rc, wc), (ro, wo) = fp[c], fp[o]
    return _overlap(rc, wo) or _overlap(wc, wo) or _overlap(wc, ro)


def completions(log) -> np.ndarray:
    return log.groupby("cmd").end.max().to_numpy()


def expected_holds(run) -> dict[int, int]:
    """held command -> the cycle its hold clears, from the footprints and the op_log (DESIGN §5): a command
    is held when, at its PLAN's end, an earlier command it conflicts with is still in flight; strict FIFO
    releases it when every earlier command has completed, rw_aware when those it conflicts with have."""
    log, cmds = run.op_log, run.program.commands
    done = completions(log)
    plan_end = log[log.stage == "PLAN"].end.to_numpy()
    fp = [_footprint(c) for c in cmds]
    strict = run.topology.hazard_policy == "strict_fifo"
    holds = {}
    for c in range(len(cmds)):
        hit = [o for o in range(c) if done[o] > plan_end[c] and _conflict(fp, c, o)]
        if hit:
            holds[c] = int(done[:c].max() if strict else done[hit].max())
    return holds


def unit_busy(log) -> dict[str, list[tuple[int, int]]]:
    busy = defaultdict(list)
    for e, s, t in zip(log.engine.astype(str), log.start, log.end):
        busy[e].append((int(s), int(t)))
    return busy


def busy_within(intervals, lo: int, hi: int) -> int:
    return sum(max(0, min(e, hi) - max(s, lo)) for s, e in intervals)


def check_ready(run, exact_holds: bool = True) -> None:
    """ready (DESIGN §6) against an independent computation, and start = ready unless the engine is busy."""
    log, prog, topo = run.op_log, run.program, run.topology
    ready, start, end = (log[c].to_numpy() for c in ("ready", "start", "end"))
    assert (ready <= start).all() and (ready >= 0).all()
    n_cmd = len(prog.commands)
    d, p = np.asarray(prog.dispatch_seq), np.asarray(prog.dispatch_seq) + 1
    done = completions(log)
    holds = run.holds()
    assert list(holds.columns) == ["cmd", "label", "plan_end", "release"]
    assert list(holds.cmd) == sorted(holds.cmd)
    assert (holds.plan_end == end[p[holds.cmd]]).all() and (holds.release >= holds.plan_end).all()
    assert list(holds.label) == [prog.labels[c] for c in holds.cmd]
    if exact_holds:
        assert dict(zip(holds.cmd, holds.release)) == expected_holds(run)
    release = end[p].copy()
    release[holds.cmd.to_numpy()] = holds.release.to_numpy()
    # a plan stage: the later of its command's release and the end of every dependency
    for s in np.flatnonzero(~log.stage.isin(FRONT).to_numpy()):
        c = log.cmd.iat[s]
        clears = [release[c] if q == p[c] else end[q] for q in prog.table.preds[s]]
        assert ready[s] == max(clears), f"seq {s}: ready {ready[s]}, constraints {clears}"
    # DISPATCH: previous DISPATCH's start, the queue slot (depth-th latest completion among 0..c-1), tl.wait
    depth = topo.cmd_queue_depth
    held = sorted(holds.cmd)
    for c in range(n_cmd):
        want = start[d[c - 1]] if c else 0
        if c >= depth:
            want = max(want, sorted(done[:c])[-depth])
        for w in prog.waits[c]:
            want = max(want, done[w])
        assert ready[d[c]] == want, f"DISPATCH of cmd {c}: ready {ready[d[c]]}, expected {want}"
        # PLAN: its DISPATCH's end, the previous PLAN's start, the release of a hold the scheduler is behind
        want = max(end[d[c]], start[p[c - 1]] if c else 0)
        if topo.hazard_policy == "strict_fifo":
            before = [h for h in held if h < c]
            if before:
                want = max(want, release[before[-1]])
        assert ready[p[c]] == want, f"PLAN of cmd {c}: ready {ready[p[c]]}, expected {want}"
    # waiting past ready means every unit of the engine (every DMA channel: one pool) was busy all along
    busy = unit_busy(log)
    units = list(log.engine.cat.categories)
    for s in np.flatnonzero(start > ready):
        base = str(log.engine.iat[s]).rstrip("0123456789")
        pool = [u for u in units if u.rstrip("0123456789") == base]
        for u in pool:
            assert busy_within(busy[u], ready[s], start[s]) == start[s] - ready[s], (s, u)


def check_critical_path(run, exact_holds: bool = True) -> pd.DataFrame:
    """The path is contiguous from 0 to cycles, and every link is the constraint DESIGN §11 names."""
    log, prog, topo = run.op_log, run.program, run.topology
    path = run.critical_path()
    assert list(path.columns) == list(log.columns) + ["cause"]
    assert set(path.cause.cat.categories) == set(CAUSES)
    pd.testing.assert_frame_equal(path.drop(columns="cause"), log.iloc[path.seq].reset_index(drop=True))
    assert path.start.iat[0] == 0 and path.end.iat[-1] == run.cycles
    assert (path.start.to_numpy()[1:] == path.end.to_numpy()[:-1]).all()
    assert path.cause.iat[0] == "dependency"
    assert path.seq.iat[-1] == log[log.end == run.cycles].seq.min()  # the lowest seq ending last
    done = completions(log)
    p_of = np.asarray(prog.dispatch_seq) + 1
    holds = dict(zip(run.holds().cmd, run.holds().release))
    fp = [_footprint(c) for c in prog.commands]
    strict = topo.hazard_policy == "strict_fifo"
    end = log.end.to_numpy()
    rows = list(path.itertuples(index=False))
    for prev, row in zip(rows, rows[1:]):
        preds = prog.table.preds[row.seq]
        completes = prev.stage not in FRONT and prev.end == done[prev.cmd]
        if row.cause == "engine":
            assert row.start > row.ready and prev.engine == row.engine and prev.start < prev.end
            continue
        assert row.start == row.ready, row
        if row.cause == "dependency":
            assert row.stage != "DISPATCH" and prev.seq in preds and not (row.stage == "PLAN" == prev.stage)
            if row.stage not in FRONT:  # the tie rule: no hold clears then, and the lowest seq of those that end
                held_now = row.cmd in holds and holds[row.cmd] == row.ready and p_of[row.cmd] in preds
                assert not held_now
                clears = [q for q in preds if (holds[row.cmd] if q == p_of[row.cmd] and row.cmd in holds
                                               else end[q]) == row.ready]
                assert prev.seq == min(clears)
        elif row.cause == "hazard":
            assert row.stage not in FRONT and holds.get(row.cmd) == row.start and p_of[row.cmd] in preds
            assert completes and prev.cmd < row.cmd
            if exact_holds and not strict:
                assert _conflict(fp, row.cmd, prev.cmd)
        elif row.cause == "queue":
            assert row.stage == "DISPATCH" and completes and prev.cmd < row.cmd
            assert row.cmd >= topo.cmd_queue_depth
        elif row.cause == "wait":
            assert row.stage == "DISPATCH" and completes and prev.cmd in prog.waits[row.cmd]
        elif row.cause == "scheduler":
            assert strict and row.stage == "PLAN" and completes
            assert any(h < row.cmd and r == row.start for h, r in holds.items())
        else:
            assert row.cause == "order" and prev.stage == row.stage and prev.cmd == row.cmd - 1
            assert prev.start == prev.end
    return path


def check_analysis(run) -> None:
    log = run.op_log
    # utilisation against a plain sum over the op_log
    util = analysis.utilization(log)
    assert list(util.engine) == list(log.engine.cat.categories)
    for row in util.itertuples():
        mine = log[log.engine == row.engine]
        assert row.stages == len(mine) and row.busy_cycles == int((mine.end - mine.start).sum())
        assert row.busy_fraction == pytest.approx(row.busy_cycles / run.cycles)
    # attribution: both sums are the run's cycles, exactly
    att = analysis.attribution(run)
    for by in ("engine", "cause"):
        assert att[att.by == by].cycles.sum() == run.cycles
    path = run.critical_path()
    for name, cycles in zip(att.name, att.cycles):
        col = "engine" if name in set(util.engine) else "cause"
        assert cycles == int((path.end - path.start)[path[col] == name].sum())
    # waits: the columns add up to each stage's wait; hazards are the holds, once per plan stage
    w = analysis.waits(run)
    parts = ["dependency", "hazard", "queue", "wait", "scheduler", "engine_busy"]
    assert (w[parts].sum(axis=1) == w.total).all() and (w[parts] >= 0).all().all()
    holds = run.holds()
    work = log[~log.stage.isin(FRONT)]
    held_for = dict(zip(holds.cmd, holds.release - holds.plan_end))
    assert w.hazard.sum() == sum(held_for.get(c, 0) for c in work.cmd)
    assert w.engine_busy.sum() == int((work.start - work.ready).sum())
    assert w.stages.sum() == len(log)


def check_all(run, exact_holds: bool = True) -> None:
    check_ready(run, exact_holds)
    check_critical_path(run, exact_holds)
    check_analysis(run)


# --- on the benches, decode and random programs ---------------------------------------------------------
@pytest.mark.parametrize("name", list(BENCHES))
@pytest.mark.parametrize("policy", ["strict_fifo", "rw_aware"])
def test_benches(name, policy):
    check_all(BENCHES[name](kbwork.Simulator(mode="timing", hazard_policy=policy)).run)


@pytest.mark.parametrize("variant", ["opt2", "opt3"])
@pytest.mark.parametrize("policy", ["strict_fifo", "rw_aware"])
@pytest.mark.parametrize("overrides", [{}, dict(cmd_queue_depth=2, fixed_cycles=0), dict(dma_channels=2)],
                         ids=["default", "depth2-free-dispatch", "two-channels"])
def test_decode(variant, policy, overrides):
    check_all(decode.run(variant, kv_len=640, mode="timing", hazard_policy=policy, **overrides).run)


@pytest.mark.parametrize("seed", RANDOM_SEEDS)
@pytest.mark.parametrize("policy", ["strict_fifo", "rw_aware"])
@pytest.mark.parametrize("depth", [1, 2, 3])
def test_random_programs(seed, policy, depth):
    steps = make_program(seed, n_steps=14)
    run, _ = build_and_run(steps, seed, mode="timing", hazard_policy=policy, cmd_queue_depth=depth)
    check_all(run)


def test_random_programs_bind_through_every_cause():
    """Non-vacuity: across the random programs, paths link through holds, queue slots, the blocked
    scheduler and engines, and the programs carry tl.waits (whose commands have always completed by
    then: the hand-computed test below puts a wait on a path)."""
    seen: set[str] = set()
    waits = 0
    for seed in RANDOM_SEEDS:
        for policy in ("strict_fifo", "rw_aware"):
            for depth in (1, 2, 3):
                run, _ = build_and_run(make_program(seed, 14), seed, mode="timing", hazard_policy=policy,
                                       cmd_queue_depth=depth)
                seen |= set(run.critical_path().cause.astype(str))
                waits += sum(map(len, run.program.waits))
    assert {"engine", "dependency", "hazard", "queue", "scheduler"} <= seen
    assert waits > 0


@pytest.mark.parametrize("policy", ["strict_fifo", "rw_aware"])
def test_zero_length_stages_bind_through_program_order(policy):
    # every stage but DMA and FETCH free: DISPATCH and PLAN take 0 cycles, so program order can bind
    zero = dict(fixed_cycles=0, r_cycles_per_byte=0, plan_base_cycles=0, plan_cycles_per_op=0,
                gemm_base_cycles=0, math_base_cycles=0)
    run, _ = build_and_run(make_program(7, 12), 7, mode="timing", hazard_policy=policy, **zero)
    # a command completing at the very cycle of a PLAN can still count as in flight: no exact holds here
    check_all(run, exact_holds=False)


def test_ready_is_in_the_op_log_and_its_csv():
    run = BENCHES["gemm_epilogues"](kbwork.Simulator(mode="timing")).run
    assert run.to_csv().splitlines()[0] == ("seq,pe,cmd,iter,label,stage,engine,op_kind,phase,tile,k_tile,tensor,"
                                            "bytes,ready,start,end")
    assert run.op_log.ready.dtype == np.int64


# --- critical paths by hand (DESIGN §1, §4 latencies) ------------------------------------------------------
def path_rows(run) -> list[tuple]:
    p = run.critical_path()
    return list(zip(p.seq, p.stage.astype(str), p.engine.astype(str), p.cmd, p.start, p.end, p.cause.astype(str)))


def _three_loads(**overrides):
    """Three independent tl.load of (64, 512) fp32 tensors: 131072 B each."""
    sim = kbwork.Simulator(mode="timing", **overrides)
    xs = [sim.hbm(n, shape=(64, 512), dtype="fp32") for n in ("x", "y", "z")]

    def kernel(tl):
        for x in xs:
            tl.load(x)

    return sim.run(kernel)


def test_critical_path_of_a_dma_bound_program():
    """The three DMA_READs queue on the one PE_DMA: after the first, each waits for the engine."""
    run = _three_loads()
    dispatch = 40 + ceil(0.0625 * 24)                   # a DmaCmd: 24 logical bytes -> 42
    plan = 8 + 2 * 1                                    # one op -> 10
    dma = 200 + ceil(64 * 512 * 4 / 64)                 # 131072 B -> 2248
    d0, p0 = (0, dispatch), (dispatch, dispatch + plan)
    r0 = (p0[1], p0[1] + dma)                           # 52 .. 2300
    r1 = (r0[1], r0[1] + dma)                           # ready at 84 + 10 = 94, PE_DMA busy until 2300
    r2 = (r1[1], r1[1] + dma)                           # ready at 136, PE_DMA busy until 4548
    assert path_rows(run) == [
        (0, "DISPATCH", "PE_CPU", 0, *d0, "dependency"),
        (1, "PLAN", "PE_SCHEDULER", 0, *p0, "dependency"),
        (2, "DMA_READ", "PE_DMA", 0, *r0, "dependency"),
        (5, "DMA_READ", "PE_DMA", 1, *r1, "engine"),
        (8, "DMA_READ", "PE_DMA", 2, *r2, "engine"),
    ]
    assert run.cycles == 6796
    assert list(run.op_log.ready) == [0, 42, 52, 0, 84, 94, 42, 126, 136]  # DISPATCH: the previous one's start
    att = analysis.attribution(run).set_index(["by", "name"]).cycles
    assert att["engine", "PE_DMA"] == 3 * dma and att["cause", "engine"] == 2 * dma
    assert run.holds().empty
    # a twice-as-fast PE_DMA: 1124 cycles a transfer, still back to back
    wi = analysis.what_if(run, engine="PE_DMA", speedup=2).iloc[0]
    assert (wi.baseline_cycles, wi.cycles) == (6796, 52 + 3 * ceil(dma / 2))


def test_critical_path_of_a_hazard_bound_program():
    """cmd 0: exp_diff(x 64x256, col) -> e; cmd 1: rsum(e) -> s, held until cmd 0 completes; cmd 2: fill z.
    The same program as test_core_hand_schedules.test_dependent_composites_hold_under_strict_fifo."""
    sim = kbwork.Simulator(mode="timing")

    def kernel(tl):
        x, col = tl.alloc((64, 256), "fp32", name="x"), tl.alloc((64, 1), "fp32", name="col")
        e, s, z = (tl.alloc(shape, "fp32", name=n) for shape, n in (((64, 256), "e"), ((64, 1), "s"),
                                                                    ((8, 64), "z")))
        tl.composite(op="math", math_op="exp_diff", a=x, b=col, out=e)
        tl.composite(op="math", math_op="rsum", a=e, out=s)
        tl.composite(op="math", math_op="fill", out=z, value=0.0)

    run = sim.run(kernel)
    d0 = (0, 40 + ceil(0.0625 * 32))                              # exp_diff: a, b, out = 32 B -> 42
    p0 = (d0[1], d0[1] + 10)
    m0 = (p0[1], p0[1] + 8 + ceil(64 * 256 / 64) * 4)             # 52 .. 1084
    m1 = (m0[1], m0[1] + 8 + ceil(64 * 256 / 64) + ceil(math.log2(256)))  # released at 1084 .. 1356
    m2 = (m1[1], m1[1] + 8 + ceil(8 * 64 / 64))                   # ready at 1094, PE_MATH busy until 1356
    assert path_rows(run) == [
        (0, "DISPATCH", "PE_CPU", 0, *d0, "dependency"),
        (1, "PLAN", "PE_SCHEDULER", 0, *p0, "dependency"),
        (2, "MATH", "PE_MATH", 0, *m0, "dependency"),
        (5, "MATH", "PE_MATH", 1, *m1, "hazard"),                 # the hold clears when cmd 0 completes
        (8, "MATH", "PE_MATH", 2, *m2, "engine"),
    ]
    assert run.cycles == m2[1] == 1372
    holds = run.holds()
    assert holds[["cmd", "plan_end", "release"]].values.tolist() == [[1, 94, 1084]]
    # cmd 2 conflicts with nothing, but strict FIFO plans nothing while cmd 1 is held
    assert run.bindings(7) == (CAUSES.index("scheduler"), 2)
    assert run.op_log.ready.tolist() == [0, 42, 52, 0, 84, 1084, 42, 1084, 1094]
    w = analysis.waits(run).set_index("stage")
    assert w.loc["MATH", "hazard"] == 1084 - 94                    # rsum held from its PLAN's end
    assert w.loc["MATH", "engine_busy"] == 1356 - 1094             # fill: ready, PE_MATH busy with rsum
    assert w.loc["PLAN", "scheduler"] == 1084 - 126                # PLAN 2 could go at its DISPATCH's end
    att = analysis.attribution(run).set_index(["by", "name"]).cycles
    assert att["cause", "hazard"] == 1356 - 1084 and att["cause", "engine"] == 16


@pytest.mark.parametrize("how", ["queue", "wait"])
def test_critical_path_through_a_queue_slot_or_a_wait(how):
    """Two fills (8x64 fp32): with cmd_queue_depth 1 the second DISPATCH waits for a queue slot, with
    tl.wait for the first's completion; either way it waits for the MATH of cmd 0 to end."""
    sim = kbwork.Simulator(mode="timing", cmd_queue_depth=1 if how == "queue" else 8)

    def kernel(tl):
        first = tl.composite(op="math", math_op="fill", out=tl.alloc((8, 64), "fp32", name="a"), value=0.0)
        if how == "wait":
            tl.wait(first)
        tl.composite(op="math", math_op="fill", out=tl.alloc((8, 64), "fp32", name="b"), value=1.0)

    run = sim.run(kernel)
    dispatch = 40 + ceil(0.0625 * 20)                   # fill: out + one scalar = 20 B -> 42
    d0, p0 = (0, dispatch), (dispatch, dispatch + 10)
    m0 = (p0[1], p0[1] + 8 + 512 // 64)                 # 52 .. 68
    d1 = (m0[1], m0[1] + dispatch)                      # the CPU resumes when cmd 0 completes
    p1 = (d1[1], d1[1] + 10)
    m1 = (p1[1], p1[1] + 16)
    assert path_rows(run) == [
        (0, "DISPATCH", "PE_CPU", 0, *d0, "dependency"), (1, "PLAN", "PE_SCHEDULER", 0, *p0, "dependency"),
        (2, "MATH", "PE_MATH", 0, *m0, "dependency"), (3, "DISPATCH", "PE_CPU", 1, *d1, how),
        (4, "PLAN", "PE_SCHEDULER", 1, *p1, "dependency"), (5, "MATH", "PE_MATH", 1, *m1, "dependency"),
    ]
    assert run.cycles == 136
    w = analysis.waits(run).set_index("stage")
    assert w.loc["DISPATCH", how] == 68 - 42


# --- Perfetto -----------------------------------------------------------------------------------------------
def _slices(trace) -> dict[int, list[tuple[float, float]]]:
    per = defaultdict(list)
    for e in trace["traceEvents"]:
        if e["ph"] == "X":
            per[e["tid"]].append((e["ts"], e["dur"]))
    return per


@pytest.mark.parametrize("kv_len", [1024, 131072])
def test_perfetto_slices_never_overlap_on_a_track(kv_len):
    """Whether Perfetto rounds or truncates ts x 1000 (and dur x 1000), no two slices of one track overlap;
    both give the same whole nanoseconds, those of the rounded cycles."""
    run = decode.run("opt3", kv_len=kv_len, mode="timing").run
    trace = run.to_perfetto()
    assert "displayTimeUnit" not in trace
    for conv in (math.trunc, round):
        for tid, xs in _slices(trace).items():
            ns = sorted((conv(ts * 1000), conv(dur * 1000)) for ts, dur in xs)
            bad = [i for i in range(1, len(ns)) if ns[i][0] < ns[i - 1][0] + ns[i - 1][1]]
            assert not bad, f"track {tid}: {len(bad)} overlaps under {conv.__name__}"
    xs = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    log = run.op_log
    want_ts = np.rint(log.start.to_numpy() / 1.25).astype(np.int64)
    want_end = np.rint(log.end.to_numpy() / 1.25).astype(np.int64)
    got_ts = np.array([math.trunc(e["ts"] * 1000) for e in xs])
    got_dur = np.array([math.trunc(e["dur"] * 1000) for e in xs])
    assert (got_ts == want_ts).all() and (got_dur == want_end - want_ts).all()
    assert (np.array([round(e["ts"] * 1000) for e in xs]) == want_ts).all()


def test_perfetto_marks_the_critical_path_with_flow_events():
    run = decode.run("opt2", kv_len=1024, mode="timing").run
    trace = run.to_perfetto()
    path = run.critical_path()
    flows = [e for e in trace["traceEvents"] if "bind_id" in e]
    assert [e["args"]["seq"] for e in flows] == list(path.seq)
    assert [e["args"]["cause"] for e in flows] == list(path.cause.astype(str))
    assert {e["bind_id"] for e in flows} == {1} and all(e["ph"] == "X" for e in flows)
    assert ("flow_out" in flows[0], "flow_in" in flows[0]) == (True, False)
    assert ("flow_out" in flows[-1], "flow_in" in flows[-1]) == (False, True)
    assert all(e.get("flow_in") and e.get("flow_out") for e in flows[1:-1])
    plain = kbwork.oplog.to_perfetto(run.op_log)  # without a path: no flows
    assert not any("bind_id" in e for e in plain["traceEvents"])


# --- analysis ------------------------------------------------------------------------------------------------
def test_utilization_over_time_adds_up_to_the_busy_cycles():
    run = decode.run("opt3", kv_len=2048, mode="timing").run
    log = run.op_log
    util = analysis.utilization(log).set_index("engine")
    for bins in (1, 7, 64):
        over = analysis.utilization_over_time(log, bins=bins)
        assert list(over.columns) == list(util.index) and len(over) == bins
        width = run.cycles / bins
        for engine in over.columns:
            assert (over[engine] * width).sum() == pytest.approx(util.busy_cycles[engine], rel=1e-9)
            assert over[engine].between(0, 1 + 1e-12).all()
    edges = [0, 100, 5000, run.cycles]
    over = analysis.utilization_over_time(log, bins=edges)
    assert list(over.index) == edges[:-1]
    cpu = log[log.engine == "PE_CPU"]
    assert over.PE_CPU.iat[0] * 100 == pytest.approx(busy_within(list(zip(cpu.start, cpu.end)), 0, 100))
    with pytest.raises(kbwork.ValidationError, match="bins"):
        analysis.utilization_over_time(log, bins=0)
    with pytest.raises(kbwork.ValidationError, match="bins"):
        analysis.utilization_over_time(log, bins=[5, 1])


def test_utilization_over_time_on_a_million_stages():
    """Vectorised: a million stages on five engines, each engine's stages back to back with gaps."""
    n = 1_000_000
    rng = np.random.default_rng(3)
    engine = rng.integers(0, 5, n)
    dur = rng.integers(0, 50, n)
    gap = rng.integers(0, 20, n)
    start = np.zeros(n, np.int64)
    for e in range(5):  # per engine: each stage starts after the previous one's end plus a gap
        m = engine == e
        t = np.cumsum(dur[m] + gap[m])
        start[m] = t - dur[m]
    names = np.array(kbwork.oplog.ENGINE_NAMES)[engine]
    log = pd.DataFrame({"engine": names, "start": start, "end": start + dur})
    over = analysis.utilization_over_time(log, bins=1000)
    width = log.end.max() / 1000
    for e, name in enumerate(kbwork.oplog.ENGINE_NAMES):
        assert (over[name] * width).sum() == pytest.approx(dur[engine == e].sum(), rel=1e-9)


def test_what_if_at_speedup_one_reproduces_the_baseline():
    r = decode.run("opt2", kv_len=512, mode="data")
    for wi in (analysis.what_if(r, speedup=1), analysis.what_if(r.run, speedup=1), decode.what_if(r, speedup=1),
               decode.what_if(dict(variant="opt2", kv_len=512, mode="data"), speedup=1)):
        assert list(wi.engine) == list(kbwork.oplog.ENGINE_NAMES)
        assert (wi.cycles == r.cycles).all() and (wi.baseline_cycles == r.cycles).all()
        assert (wi.change_cycles == 0).all() and (wi.end_to_end_speedup == 1).all()
    assert list(analysis.what_if(r, engine=["PE_GEMM", "PE_MATH"]).engine) == ["PE_GEMM", "PE_MATH"]


@pytest.mark.parametrize("kwargs,match", [
    (dict(engine="PE_TPU"), "unknown engine 'PE_TPU'"),
    (dict(engine="PE_DMA0"), "is a channel"),
    (dict(speedup=0), "speedup"),
    (dict(speedup=float("inf")), "speedup"),
    (dict(speedup=True), "speedup"),
])
def test_what_if_refuses_bad_arguments(kwargs, match):
    run = BENCHES["math_chain"](kbwork.Simulator(mode="timing")).run
    with pytest.raises(kbwork.ValidationError, match=match):
        analysis.what_if(run, **kwargs)


def test_what_if_refuses_what_it_cannot_run():
    with pytest.raises(kbwork.ValidationError, match="variant"):
        decode.what_if(dict(kv_len=512))
    with pytest.raises(kbwork.ValidationError, match="takes a Run"):
        analysis.what_if("opt2")
    with pytest.raises(kbwork.ValidationError, match="takes a Run"):
        decode.what_if("opt2")
    # the parameters form lives in decode, which sits above analysis (DESIGN §9, §11)
    with pytest.raises(kbwork.ValidationError, match=r"not dict \(for a dict of decode.run parameters, use "
                                                     r"decode.what_if\)"):
        analysis.what_if(dict(variant="opt2", kv_len=512))


def test_every_analysis_of_a_run_takes_the_run_or_what_holds_it():
    r = decode.run("opt2", kv_len=512, mode="timing")
    for given in (r, r.run):
        pd.testing.assert_frame_equal(analysis.utilization(given), analysis.utilization(r.op_log))
        pd.testing.assert_frame_equal(analysis.utilization_over_time(given, bins=7),
                                      analysis.utilization_over_time(r.op_log, bins=7))
        pd.testing.assert_series_equal(analysis.dispatch_per_tile(given), analysis.dispatch_per_tile(r.op_log))
        pd.testing.assert_series_equal(analysis.dispatch_per_tile_from_run(given), r.dispatch_per_tile)
        pd.testing.assert_frame_equal(analysis.attribution(given), analysis.attribution(r.run))
        pd.testing.assert_frame_equal(analysis.waits(given), analysis.waits(r.run))
        pd.testing.assert_frame_equal(analysis.top_waits(given), analysis.top_waits(r.run))
        assert analysis.path_cycles(given) == analysis.path_cycles(r.run)
        assert analysis.explain(given, "x").sentence == analysis.explain(r.run, "x").sentence
    with pytest.raises(kbwork.ValidationError, match="expected an op_log"):
        analysis.utilization("opt2")
    with pytest.raises(kbwork.ValidationError, match="expected a Run"):
        analysis.waits("opt2")


def test_what_if_slowing_the_cpu_moves_a_dispatch_bound_run():
    base = decode.run("opt3", kv_len=1024, mode="timing", hazard_policy="rw_aware")
    wi = analysis.what_if(base, engine="PE_CPU", speedup=0.5).iloc[0]
    assert wi.cycles > wi.baseline_cycles  # half-speed dispatch: every DISPATCH takes twice as long
