"""Launch dependencies and isolation with order (DESIGN.md §16): ``Launch(..., after=(...))`` and
``sync_cycles``, matched against the cycle-stepped reference, by hand, and across the reductions."""

from __future__ import annotations

import random

import numpy as np
import pytest

import kbwork
from kbwork import Launch, ValidationError

from device_cases import add_after, random_device_case, random_replicated_case, resolved_device_graph
from reference_device import simulate as reference

#: dispatch and plan cost nothing, so a load's DMA stage starts at its launch's start
FREE_FRONT = dict(fixed_cycles=0, r_cycles_per_byte=0, plan_base_cycles=0, plan_cycles_per_op=0)


def load(tl, x):
    tl.load(x, name="x")


def copy_rows(tl, src, dst):
    t = tl.load(src, name="t")
    tl.store(t, dst)


def rows(run, pe):
    log = run.op_log
    return log[log.pe == pe]


# --- by hand --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("sync", [0, 100])
def test_a_launch_after_another_pe_s_starts_sync_cycles_after_its_end(sync):
    """Two PEs on channels of their own, dispatch free: a load of 4096 bytes is one DMA stage of
    dma_base_cycles + 4096 / 64 = 200 + 64 = 264 cycles. PE 0 loads x0 (0 .. 264); PE 1 loads x1 after it, from
    264 + sync; then PE 1 loads again (program order), and PE 0's second launch waits for PE 1's first."""
    sim = kbwork.Simulator(mode="timing", pes=2, hbm_channels=2, sync_cycles=sync, **FREE_FRONT)
    x = [sim.hbm(f"x{p}", shape=(1024,), dtype="fp32", channel=p) for p in range(2)]
    a0 = Launch(load, x[0])
    b0 = Launch(load, x[1], after=(a0,))
    b1 = Launch(load, x[1])
    a1 = Launch(load, x[0], after=[b0])
    run = sim.run_device({0: [a0, a1], 1: [b0, b1]})
    dma = lambda pe: [(int(s), int(e)) for s, e in rows(run, pe).query("stage == 'DMA_READ'")[["start", "end"]]
                      .itertuples(index=False)]
    b0_start = 264 + sync
    b0_end = b0_start + 264
    assert dma(1) == [(b0_start, b0_end), (b0_end, b0_end + 264)]
    # PE 0's second launch: after b0, whose end + sync is later than a0's end (264)
    assert dma(0) == [(0, 264), (b0_end + sync, b0_end + sync + 264)]
    assert run.cycles == b0_end + sync + 264  # PE 1's second load ends at b0_end + 264, no later
    first = rows(run, 0).query("stage == 'DISPATCH'").iloc[1]
    assert int(first.ready) == int(first.start) == b0_end + sync
    path = run.critical_path()
    assert list(path.cause)[:2] == ["dependency", "after"]
    # PE 0 ends last (with sync 0, PE 1 too: the lowest PE is named): a0 -after-> b0 (PE 1) -after-> a1 (PE 0)
    if True:
        assert run.last_pe() == 0
        assert list(path.pe) == [0, 1, 1, 1, 0, 0, 0]
        assert list(path.cause) == ["dependency", "after", "dependency", "dependency", "after", "dependency",
                                    "dependency"]
        links = path[path.cause == "after"]
        before = path.shift(1)[path.cause == "after"]
        assert list(links.start - before.end) == [sync, sync]
    # the plain simulation agrees, and the dependency is no kernel argument: one trace serves all four
    plain = sim.run_device({0: [a0, a1], 1: [b0, b1]}, reductions=False, steady_state=False)
    assert plain.op_log.equals(run.op_log)


def test_a_launch_after_one_of_its_own_pe_waits_sync_cycles_too():
    sim = kbwork.Simulator(mode="timing", pes=1, sync_cycles=50, **FREE_FRONT)
    x = sim.hbm("x", shape=(1024,), dtype="fp32")
    a = Launch(load, x)
    b = Launch(load, x, after=(a,))
    run = sim.run_device({0: [a, b]})
    assert list(run.op_log.query("stage == 'DMA_READ'").start) == [0, 314]
    assert list(run.critical_path().cause) == ["dependency", "after", "dependency", "dependency"]


def test_sync_cycles_is_a_topology_key_the_device_sets_to_100():
    assert kbwork.Simulator(mode="timing", topology="ahbm-device-v1").topo.sync_cycles == 100
    assert kbwork.Simulator(mode="timing").topo.sync_cycles == 0
    with pytest.raises(kbwork.ConfigError, match="sync_cycles"):
        kbwork.Simulator(mode="timing", sync_cycles=-1)


# --- refusals -------------------------------------------------------------------------------------------------
def test_refusals_name_the_pe_and_the_launch_index():
    sim = kbwork.Simulator(mode="timing", pes=3)
    x = [sim.hbm(f"x{p}", shape=(64,), dtype="fp32") for p in range(3)]
    stray = Launch(load, x[0])
    with pytest.raises(ValidationError, match=r"PE 1, launch 1 is after Launch\(load\(x0\)\), which is not a launch "
                                              r"of this plan"):
        sim.run_device({0: [Launch(load, x[0])], 1: [Launch(load, x[1]), Launch(load, x[1], after=(stray,))]})
    twice = Launch(load, x[2])
    with pytest.raises(ValidationError, match=r"PE 2, launch 0 is the same Launch object as PE 0, launch 1"):
        sim.run_device({0: [Launch(load, x[0]), twice], 2: [twice]})
    with pytest.raises(ValidationError, match=r"PE 0, launch 1 is the same Launch object as PE 0, launch 0"):
        sim.run_device({0: [twice, twice]})
    # a cycle through after edges and program order: a1 after b0, b1 after a1, b0 after ... b1 (via program order)
    a0, a1 = Launch(load, x[0]), Launch(load, x[0])
    b0, b1 = Launch(load, x[1]), Launch(load, x[1])
    a0.after = (b1,)
    b0.after = (a1,)
    with pytest.raises(ValidationError, match=r"PE 0, launch 0 waits on itself through after edges and program "
                                              r"order \(PE 0 launch 0 -> .*PE 0 launch 0\)"):
        sim.run_device({0: [a0, a1], 1: [b0, b1]})
    selfish = Launch(load, x[0])
    selfish.after = (selfish,)
    with pytest.raises(ValidationError, match=r"PE 0, launch 0 is after itself"):
        sim.run_device({0: [selfish]})
    with pytest.raises(ValidationError, match=r"after must hold Launch objects only"):
        Launch(load, x[0], after=(1,))
    with pytest.raises(ValidationError, match=r"after must be an iterable of Launch"):
        Launch(load, x[0], after=3)
    # a later launch of the same PE: a cycle with program order
    c0, c1 = Launch(load, x[0]), Launch(load, x[0])
    c0.after = (c1,)
    with pytest.raises(ValidationError, match=r"PE 0, launch 0 waits on itself"):
        sim.run_device({0: [c0, c1]})


# --- isolation with order --------------------------------------------------------------------------------------
def test_a_cross_pe_read_is_allowed_with_an_edge_and_refused_without():
    sim = kbwork.Simulator(mode="timing", pes=2)
    src = sim.hbm("src", shape=(64, 64), dtype="fp32")
    mid = sim.hbm("mid", shape=(64, 64), dtype="fp32")
    out = sim.hbm("out", shape=(64, 64), dtype="fp32")
    w = Launch(copy_rows, src, mid)
    sim.run_device({0: [w], 1: [Launch(copy_rows, out[0:8], out[8:16]), Launch(copy_rows, mid, out, after=(w,))]})
    with pytest.raises(ValidationError, match=r"PE 0 writes tensor 'mid' and PE 1 reads the same bytes \(PE 0 launch "
                                              r"0, PE 1 launch 1\), and neither launch happens before the other"):
        sim.run_device({0: [Launch(copy_rows, src, mid)],
                        1: [Launch(copy_rows, out[0:8], out[8:16]), Launch(copy_rows, mid, out)]})
    # an edge into the wrong launch orders nothing: PE 1's launch 1 is after the writer, but its launch 0 reads
    w2 = Launch(copy_rows, src, mid)
    with pytest.raises(ValidationError, match=r"PE 0 writes tensor 'mid' and PE 1 reads the same bytes \(PE 0 "
                                              r"launch 0, PE 1 launch 0\)"):
        sim.run_device({0: [w2], 1: [Launch(copy_rows, mid, out), Launch(copy_rows, out[0:8], out[8:16], after=(w2,))]})


def test_happens_before_is_transitive_through_program_order_and_other_pes():
    """PE 0 writes mid; PE 1's launch 0 is after it, its launch 1 after that by program order; PE 2 reads mid
    after PE 1's launch 1: ordered, though no edge joins PE 0 and PE 2 directly. Both writing is ordered too."""
    sim = kbwork.Simulator(mode="data", pes=3)
    src = sim.hbm("src", np.arange(64 * 64, dtype=np.float32).reshape(64, 64), dtype="fp32")
    mid = sim.hbm("mid", shape=(64, 64), dtype="fp32")
    out = sim.hbm("out", shape=(64, 64), dtype="fp32")
    scratch = sim.hbm("scratch", shape=(16, 64), dtype="fp32")
    w = Launch(copy_rows, src, mid)
    p1a = Launch(copy_rows, scratch[0:8], scratch[8:16], after=(w,))
    p1b = Launch(copy_rows, scratch[0:8], scratch[8:16])
    r = Launch(copy_rows, mid, out, after=(p1b,))
    run = sim.run_device({0: [w], 1: [p1a, p1b], 2: [r]})
    assert np.array_equal(run.read(out), run.read(src))


@pytest.mark.parametrize("sync", [0, 100])
def test_data_mode_the_later_launch_sees_the_earlier_one_s_writes(sync):
    """A chain over three PEs through one tensor, each writing it in turn: the last value is the last writer's.
    The PEs share no contended channel, so only the after edges put them in one event loop."""
    sim = kbwork.Simulator(mode="data", pes=3, hbm_channels=3, sync_cycles=sync)
    a = sim.hbm("a", np.full((32, 64), 1.0, np.float32), dtype="fp32", channel=0)
    b = sim.hbm("b", np.full((32, 64), 2.0, np.float32), dtype="fp32", channel=1)
    buf = sim.hbm("buf", shape=(32, 64), dtype="fp32", channel=2)
    out = sim.hbm("out", shape=(32, 64), dtype="fp32", channel=0)
    first = Launch(copy_rows, a, buf)
    second = Launch(copy_rows, b, buf, after=(first,))
    third = Launch(copy_rows, buf, out, after=(second,))
    # listed with the reader on the lowest PE: PE order must not decide who runs first
    run = sim.run_device({0: [third], 1: [second], 2: [first]})
    assert np.array_equal(run.read(out), np.full((32, 64), 2.0, np.float32))
    plain = sim.run_device({0: [third], 1: [second], 2: [first]}, reductions=False)
    assert np.array_equal(plain.read(out), run.read(out)) and plain.to_csv() == run.to_csv()
    log = run.op_log
    assert log[log.pe == 0].start.min() >= log[log.pe == 1].end.max() + sync


# --- against the reference, and across the reductions ----------------------------------------------------------
@pytest.mark.parametrize("seed", range(40))
def test_random_dependency_runs_match_the_cycle_stepped_reference_stage_for_stage(seed):
    sync = random.Random(seed).choice([0, 0, 1, 7, 100])
    case = add_after(random_device_case(seed, sync_cycles=sync), seed)
    g, start, end, _ = resolved_device_graph(case.sim, case.plan)
    assert g.after or not any(x.after for v in case.plan.values() for x in v)
    ref = reference(g)
    assert ref.start == start and ref.end == end, case
    log = case.sim.run_device(case.plan, reductions=False, steady_state=False).op_log
    assert list(log.start) == start and list(log.end) == end, case


@pytest.mark.parametrize("chunk", range(3))
def test_reductions_and_the_steady_state_equal_the_plain_simulation_with_dependencies(chunk):
    for seed in range(300 + 6 * chunk, 306 + 6 * chunk):
        sync = random.Random(seed).choice([0, 3, 100])
        case = add_after(random_device_case(seed, long=seed % 2 == 0, sync_cycles=sync), seed, p_edge=0.4)
        plain = case.sim.run_device(case.plan, reductions=False, steady_state=False)
        reduced = case.sim.run_device(case.plan)
        assert reduced.to_csv() == plain.to_csv(), case
        assert reduced.critical_path()[["seq", "cause"]].equals(plain.critical_path()[["seq", "cause"]]), case


def test_replicated_groups_carry_their_dependencies():
    """Every PE runs one launch list; PE 2k+1's first launch waits for PE 2k's last: the pairs are groups and
    replicate; a last pair left without the edge is a group key of its own (its PEs may replicate each other,
    never a pair with the edge). Every run equals the plain simulation."""
    replicated = 0
    for seed in range(12):
        case = random_replicated_case(seed)
        pes = sorted(case.plan)
        rng = random.Random(seed)
        for p in pes[1::2]:
            if p == pes[-1] and len(pes) > 2 and rng.random() < 0.5:
                continue
            case.plan[p][0].after = (case.plan[p - 1][-1],)
        plain = case.sim.run_device(case.plan, reductions=False, steady_state=False)
        reduced = case.sim.run_device(case.plan)
        assert reduced.to_csv() == plain.to_csv(), case
        assert reduced.critical_path()[["seq", "pe", "cause"]].equals(plain.critical_path()[["seq", "pe", "cause"]])
        red = reduced.reductions
        for pe, src in red.replicated_from.items():
            assert bool(case.plan[pe][0].after) == bool(case.plan[src][0].after), case
        replicated += red.simulated < red.groups
    assert replicated >= 2


def test_a_dependency_s_wait_stops_the_steady_state_and_it_stays_exact():
    """A long stream on PE 0; PE 1 runs a short launch, then waits for PE 0's stream before a stream of its own:
    the device steady state must not insert periods while PE 1 waits, and the result equals the plain one."""
    from device_cases import stream_kernel

    sim = kbwork.Simulator(mode="timing", pes=2, hbm_channels=1, channel_bytes_per_cycle=40, sync_cycles=100)
    rng = np.random.default_rng(0)
    s0 = sim.hbm("s0", rng.standard_normal((60 * 16, 64)).astype(np.float32), dtype="fp32")
    d0 = sim.hbm("d0", shape=(60 * 16, 64), dtype="fp32")
    s1 = sim.hbm("s1", rng.standard_normal((50 * 16, 64)).astype(np.float32), dtype="fp32")
    d1 = sim.hbm("d1", shape=(50 * 16, 64), dtype="fp32")
    long0 = Launch(stream_kernel, s0, d0, tile=16, op="copy")
    plan = {0: [long0, Launch(stream_kernel, s0[0:160], d0[0:160], tile=16, op="copy")],
            1: [Launch(load, s1[0:8]), Launch(stream_kernel, s1, d1, tile=16, op="copy", after=(long0,))]}
    steady = sim.run_device(plan)
    plain = sim.run_device(plan, reductions=False, steady_state=False)
    assert steady.to_csv() == plain.to_csv()
    assert steady.steady_state.path == "steady"  # it engaged where no PE waited


def test_the_device_gantt_outlines_each_pe_s_stretch_of_a_path_across_pes():
    from kbwork import plots

    sim = kbwork.Simulator(mode="timing", pes=2, hbm_channels=2, sync_cycles=100, **FREE_FRONT)
    x = [sim.hbm(f"x{p}", shape=(1024,), dtype="fp32", channel=p) for p in range(2)]
    a = Launch(load, x[0])
    run = sim.run_device({0: [a], 1: [Launch(load, x[1], after=(a,))]})
    assert sorted(set(run.critical_path().pe)) == [0, 1]
    fig = plots.device_gantt(run)
    labels = [ax.get_ylabel() for ax in fig.axes if ax.get_ylabel().startswith("PE")]
    assert labels == ["PE 0 (critical path)", "PE 1 (critical path)"]
    import matplotlib.pyplot as plt
    plt.close(fig)


def fan_in_merge(tl, parts, dst):
    """Reads every part (on other PEs' channels) into one tile and stores it: a merge's traffic shape."""
    acc = tl.alloc(dst.shape, "fp32", name="acc")
    for part in parts:
        t = tl.load(part)
        tl.composite(op="math", math_op="copy", a=t, out=acc)
    tl.store(acc, dst)


def test_a_split_like_plan_replicates_goes_steady_and_equals_the_plain_run():
    """Two heads, each split over four PEs (a long decode per PE), merged on the head's last PE after the other
    three: the run goes in two phases (the decodes wait for nothing; the merges wait and read the other
    channels), the eight decodes are alike (one simulated, seven replicated) and go steady, the two merges are
    alike (one simulated), and every stage equals the plain simulation's."""
    from kbwork.kernels.gqa_decode import gqa_decode

    sim = kbwork.Simulator("ahbm-device-v1", mode="timing", pes=8, hbm_channels=8)
    plan = {}
    for h in range(2):
        outs, chunks = [], []
        for c in range(4):
            pe = 4 * h + c
            t = lambda name, shape, dtype: sim.hbm(f"{name}{h}.{c}", shape=shape, dtype=dtype, channel=pe)  # noqa: E731
            o = t("O", (4, 128), "fp32")
            chunks.append(Launch(gqa_decode, t("q", (4, 128), "bf16"), t("K", (4096, 128), "bf16"),
                                 t("V", (4096, 128), "bf16"), o, variant="opt2", tile=128))
            plan[pe] = [chunks[-1]]
            outs.append(o)
        last = 4 * h + 3
        plan[last].append(Launch(fan_in_merge, outs, sim.hbm(f"out{h}", shape=(4, 128), dtype="fp32", channel=last),
                                 after=chunks[:-1]))
    run = sim.run_device(plan)
    plain = sim.run_device(plan, reductions=False, steady_state=False)
    assert run.to_csv() == plain.to_csv()
    assert run.reductions.cut == {pe: (1, 1 if pe in (3, 7) else 0) for pe in range(8)}
    assert (run.reductions.groups, run.reductions.simulated) == (8 + 2, 1 + 1)
    assert "in two phases: 8 launches" in str(run.reductions)
    assert run.steady_state.path == "steady"
    # the merge's first DISPATCH: ready when PE 3's own decode has ended and 100 cycles after PEs 0-2's ends
    n_decode = int((rows(run, 0).stage == "DISPATCH").sum())  # the decode's commands (the same on every PE)
    pe3 = rows(run, 3)
    decode3_end = int(pe3[pe3.cmd < n_decode].end.max())
    merge = pe3[(pe3.cmd == n_decode) & (pe3.stage == "DISPATCH")].iloc[0]
    want = max(decode3_end, max(int(rows(run, p).end.max()) for p in range(3)) + 100)
    assert int(merge.ready) == int(merge.start) == want
    assert want == decode3_end + 100  # four equal chunks end together: the signal latency binds
    path = run.critical_path()  # so the path crosses to the lowest PE whose chunk ended then
    assert "after" in set(path.cause) and sorted(set(path.pe)) == [0, 3]


@pytest.mark.parametrize("sync", [0, 2000, 20000, 200000])
def test_a_gate_after_inserted_periods_counts_them(sync):
    """PE 0's short launch ends early; PE 1 streams long enough for the steady state to insert periods, then
    runs a launch after PE 0's: its gate compares PE 0's end (before the insertion) + sync with PE 1's own end
    (after it). Equal to the plain simulation for a sync below, inside and beyond the stream's length."""
    from device_cases import stream_kernel

    sim = kbwork.Simulator(mode="timing", pes=2, hbm_channels=2, sync_cycles=sync)
    rng = np.random.default_rng(1)
    s = sim.hbm("s", rng.standard_normal((80 * 16, 64)).astype(np.float32), dtype="fp32", channel=1)
    d = sim.hbm("d", shape=(80 * 16, 64), dtype="fp32", channel=1)
    x = sim.hbm("x", shape=(1024,), dtype="fp32", channel=0)
    short = Launch(load, x)
    plan = {0: [short], 1: [Launch(stream_kernel, s, d, tile=16, op="copy"), Launch(load, x, after=(short,))]}
    steady = sim.run_device(plan)
    plain = sim.run_device(plan, reductions=False, steady_state=False)
    assert steady.steady_state.path == "steady" and steady.steady_state.inserted > 0
    assert steady.to_csv() == plain.to_csv()
    last = rows(plain, 1).query("stage == 'DMA_READ'").iloc[-1]
    stream_end = int(rows(plain, 1).iloc[:-3].end.max())
    assert int(last.start) >= max(stream_end, int(rows(plain, 0).end.max()) + sync)
