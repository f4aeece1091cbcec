"""The device (DESIGN §14): launches, placement, isolation, the flow rule by hand and against the cycle-stepped
reference, and the exact reductions against the plain simulation."""

from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd
import pytest

import kbwork
from kbwork import Launch, ValidationError
from kbwork.kernels.gqa_decode import gqa_decode

from device_cases import random_device_case, random_replicated_case, resolved_device_graph  # tests/ is on sys.path
from reference_device import simulate as reference

#: dispatch and plan cost nothing, so a load's DMA stage starts at its launch's start
FREE_FRONT = dict(fixed_cycles=0, r_cycles_per_byte=0, plan_base_cycles=0, plan_cycles_per_op=0)


def load(tl, x):
    tl.load(x, name="x")


def busy(tl, n):
    """A MATH stage of 8 + n cycles (a fill of 64·n fp32 elements) and nothing else."""
    tl.full((n, 64), 0.0, "fp32", name="z")


def dma_stage(run, pe):
    log = run.op_log
    row = log[(log.pe == pe) & (log.stage == "DMA_READ")]
    assert len(row) == 1
    return int(row.start.iloc[0]), int(row.end.iloc[0])


def two_loads(channel_bytes_per_cycle, *, stagger=0, channels=(0, 0), nbytes=4096, **over):
    sim = kbwork.Simulator(mode="timing", pes=2, hbm_channels=2, channel_bytes_per_cycle=channel_bytes_per_cycle,
                           **FREE_FRONT, **over)
    xs = [sim.hbm(f"x{p}", shape=(nbytes // 4,), dtype="fp32", channel=channels[p]) for p in range(2)]
    plan = {0: [Launch(load, xs[0])], 1: [Launch(load, xs[1])]}
    if stagger:
        plan[1].insert(0, Launch(busy, stagger - 8))
    return sim.run_device(plan)


# --- the flow rule by hand ---------------------------------------------------------------------------------------
def test_two_pes_on_one_channel_together_each_get_half():
    run = two_loads(40)
    # both join at 200 and advance 20 B/cycle: 4096 / 20 = 204.8 -> 205 cycles
    assert dma_stage(run, 0) == (0, 405) and dma_stage(run, 1) == (0, 405)
    assert run.cycles == 405


def test_alone_on_a_finite_channel_is_base_plus_ceil_at_the_channel_rate():
    run = two_loads(40, channels=(0, 1))
    assert dma_stage(run, 0) == (0, 200 + math.ceil(4096 / 40)) == dma_stage(run, 1)
    assert run.reductions.contended_channels == ()


def test_staggered_transfers_share_only_while_both_move():
    run = two_loads(40, stagger=100)
    # PE 0 alone 200..300 (4000 B), then both at 20 B/cycle: its last 96 B take 5 cycles -> 305.
    # PE 1 joins at 300, moves 100 B by 305, then 3996 B alone at 40 B/cycle: 100 cycles -> 405.
    assert dma_stage(run, 0) == (0, 305)
    assert dma_stage(run, 1) == (100, 405)


def test_a_wide_channel_never_slows_anyone():
    run = two_loads(128)     # 128 / 2 = 64 = the DMA rate: two flows never slow each other
    assert dma_stage(run, 0) == (0, 200 + 4096 // 64) == dma_stage(run, 1)
    assert run.reductions.contended_channels == ()
    assert two_loads(math.inf).cycles == 264


def test_a_fractional_channel_rate_is_taken_as_written():
    run = two_loads(40.5)
    # each gets 81/4 B/cycle: 4096 / (81/4) = 202.27 -> 203 cycles
    assert dma_stage(run, 0) == (0, 200 + 203)


def test_one_pe_s_dma_units_share_its_channel_like_pes_do():
    sim = kbwork.Simulator(mode="timing", channel_bytes_per_cycle=40, dma_channels=2, **FREE_FRONT)
    xs = [sim.hbm(f"x{i}", shape=(1024,), dtype="fp32") for i in range(2)]

    def two(tl, a, b):
        tl.load(a, name="a")
        tl.load(b, name="b")
    log = sim.run(two, *xs).op_log
    dma = log[log.stage == "DMA_READ"]
    assert list(dma.start) == [0, 0] and list(dma.end) == [405, 405]


# --- launches, the op_log, the critical path ---------------------------------------------------------------------
def decode_inputs(sim, pe, kv=512, channel=0, tag=""):
    q = sim.hbm(f"q{pe}{tag}", shape=(4, 64), dtype="bf16", channel=channel)
    K = sim.hbm(f"K{pe}{tag}", shape=(kv, 64), dtype="bf16", channel=channel)
    V = sim.hbm(f"V{pe}{tag}", shape=(kv, 64), dtype="bf16", channel=channel)
    O = sim.hbm(f"O{pe}{tag}", shape=(4, 64), dtype="fp32", channel=channel)
    return q, K, V, O


def test_launches_run_back_to_back_with_fresh_state_and_one_numbering():
    sim = kbwork.Simulator(mode="timing", pes=2, hbm_channels=2)
    a, b = decode_inputs(sim, 0), decode_inputs(sim, 0, tag="b")
    one = sim.run(gqa_decode, *a, variant="opt2", tile=128)
    run = sim.run_device({0: [Launch(gqa_decode, *a, variant="opt2", tile=128),
                              Launch(gqa_decode, *b, variant="opt3", tile=128)],
                          1: [Launch(gqa_decode, *decode_inputs(sim, 1, channel=1), variant="opt2", tile=128)]})
    log = run.op_log
    assert list(log.seq) == list(range(len(log)))
    p0 = log[log.pe == 0]
    n0 = len(one.op_log)
    first = p0.iloc[n0]                       # launch 1's first stage: its first DISPATCH
    assert first.stage == "DISPATCH" and first.cmd == one.op_log.cmd.max() + 1
    assert first.ready == first.start == one.cycles    # ready when launch 0's last stage ended
    assert set(p0.iloc[n0:].iter) == set(one.op_log.iter)     # iter is each launch's own
    assert run.pe(1).cycles == one.cycles                     # alone on its channel: PE 1 is a plain run
    assert run.cycles == int(log.end.max()) == run.pe(0).cycles
    cp = run.critical_path()
    assert set(cp.pe) == {0} and "launch" in set(cp.cause)
    assert cp.start.iloc[0] == 0 and cp.end.iloc[-1] == run.cycles


def test_a_device_run_is_deterministic_and_its_csv_has_the_pe_column():
    case = random_device_case(3)
    a = case.sim.run_device(case.plan).to_csv()
    b = case.sim.run_device(case.plan).to_csv()
    assert a == b and a.startswith("seq,pe,cmd,iter,")


# --- isolation ---------------------------------------------------------------------------------------------------
def copy_rows(tl, src, dst):
    t = tl.load(src, name="t")
    tl.store(t, dst)


def test_a_pe_writing_what_another_pe_reads_is_refused_naming_both_and_the_tensor():
    sim = kbwork.Simulator(mode="timing", pes=2)
    a = sim.hbm("a", shape=(64, 64), dtype="fp32")
    shared = sim.hbm("shared", shape=(64, 64), dtype="fp32")
    b = sim.hbm("b", shape=(32, 64), dtype="fp32")
    with pytest.raises(ValidationError, match=r"PE 0 writes tensor 'shared' and PE 1 reads"):
        sim.run_device({0: [Launch(copy_rows, a, shared)], 1: [Launch(copy_rows, shared, a[0:64])]})
    with pytest.raises(ValidationError, match=r"PE 1 writes tensor 'a' and PE 0 reads"):
        sim.run_device({0: [Launch(copy_rows, a, shared)], 1: [Launch(copy_rows, b, a[32:64])]})
    with pytest.raises(ValidationError, match=r"PE 0 writes tensor 'shared' and PE 1 writes"):
        sim.run_device({0: [Launch(copy_rows, a, shared)], 1: [Launch(copy_rows, b, shared[16:48])]})


def test_pes_may_share_read_only_tensors_and_write_their_own_rows_of_one():
    sim = kbwork.Simulator(mode="data", pes=2)
    src = sim.hbm("src", np.arange(64 * 64, dtype=np.float32).reshape(64, 64), dtype="fp32")
    out = sim.hbm("out", shape=(64, 64), dtype="fp32")
    run = sim.run_device({0: [Launch(copy_rows, src[0:32], out[0:32])],
                          1: [Launch(copy_rows, src[32:64], out[32:64])]})
    assert np.array_equal(run.read(out), run.read(src))


def test_isolation_sees_a_loop_s_moving_rows():
    sim = kbwork.Simulator(mode="timing", pes=2)
    from device_cases import stream_kernel
    src = sim.hbm("src", shape=(256, 32), dtype="fp32")
    dst = sim.hbm("dst", shape=(256, 32), dtype="fp32")
    other = sim.hbm("other", shape=(16, 32), dtype="fp32")
    # PE 0 streams src -> dst (rows 0..255 of dst, 16 at a time); PE 1 reads dst's rows 240..255
    with pytest.raises(ValidationError, match=r"PE 0 writes tensor 'dst' and PE 1 reads"):
        sim.run_device({0: [Launch(stream_kernel, src, dst, tile=16, op="copy")],
                        1: [Launch(copy_rows, dst[240:256], other)]})
    sim.run_device({0: [Launch(stream_kernel, src[0:240], dst[0:240], tile=16, op="copy")],
                    1: [Launch(copy_rows, src[240:256], dst[240:256])]})


@pytest.mark.parametrize("launches,match", [
    ([1, 2], r"expects a mapping PE -> \[Launch"),
    ({}, r"no launches"),
    ({2: []}, r"PE 2 is not a PE of"),
    ({0: []}, r"PE 0 must map to a non-empty list of Launch"),
    ({0: ["k"]}, r"PE 0 must map to a non-empty list of Launch"),
    ({True: []}, r"PE True is not a PE"),
])
def test_bad_launches_are_refused_before_anything_runs(launches, match):
    sim = kbwork.Simulator(mode="timing", pes=2)
    with pytest.raises(ValidationError, match=match):
        sim.run_device(launches)


def test_arguments_a_kernel_s_signature_refuses_are_a_validation_error_naming_the_kernel_and_its_launch():
    def load(tl, x):
        tl.load(x)

    def no_tl():
        pass

    def buggy(tl, x):
        return len(3)  # a TypeError inside the kernel is the kernel's own: it propagates as it is

    sim = kbwork.Simulator(mode="timing", pes=2)
    x = sim.hbm("x", shape=(4,), dtype="fp32")
    cases = [({1: [Launch(load)]}, r"kernel 'load' cannot be called as load\(tl\): missing a required argument: "
                                   r"'x'\. Its signature is load\(tl, x\)"),
             ({0: [Launch(load, x)], 1: [Launch(load, x, y=1)]},
              r"PE 1, launch 0: kernel 'load' cannot be called as load\(tl, x, y=1\): got an unexpected keyword"),
             ({0: [Launch(no_tl, x)]}, r"no_tl\(tl, x\): too many positional arguments.*def k\(tl, \*handles")]
    for plan, match in cases:
        with pytest.raises(ValidationError, match=match):
            sim.run_device(plan)
    with pytest.raises(ValidationError, match=r"kernel 'load' cannot be called as load\(tl, x, x\)"):
        sim.run(load, x, x)
    with pytest.raises(TypeError, match=r"has no len") as info:
        sim.run(buggy, x)
    assert not isinstance(info.value, ValidationError)
    # a single Launch is a list of one
    assert sim.run_device({1: Launch(load, x)}).op_log.equals(sim.run_device({1: [Launch(load, x)]}).op_log)


def test_a_misspelt_keyword_of_a_launch_is_named_with_the_one_meant_not_the_argument_it_left_missing():
    def k(tl, x, *, tile, variant="a"):
        tl.load(x)

    sim = kbwork.Simulator(mode="timing", pes=2)
    x = sim.hbm("x", shape=(4,), dtype="fp32")
    with pytest.raises(ValidationError, match=r"k\(tl, x, tle=4\): got an unexpected keyword argument 'tle' "
                                              r"\(did you mean 'tile'\?\)\. Its signature is k\(tl, x, \*, tile"):
        sim.run_device({1: [Launch(k, x, tle=4)]})
    with pytest.raises(ValidationError, match=r"'varaint' \(did you mean 'variant'\?\); got an unexpected keyword "
                                              r"argument 'zzz'\. Its"):
        sim.run(k, x, tile=4, varaint="b", zzz=1)
    # a keyword given already is not what another one meant
    with pytest.raises(ValidationError, match=r"unexpected keyword argument 'tiles'\. Its"):
        sim.run(k, x, tile=4, tiles=2)

    def first_after_tl(tl, /, tile, x):  # tl positional-only: the parameter after it can still be meant
        tl.load(x)

    with pytest.raises(ValidationError, match=r"'tle' \(did you mean 'tile'\?\)"):
        sim.run(first_after_tl, x=x, tle=4)


def test_home_channel_refuses_a_pe_the_topology_does_not_have():
    topo = kbwork.Simulator(mode="timing", pes=8, hbm_channels=4).topo
    assert [topo.home_channel(p) for p in range(8)] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert topo.home_channel(np.int64(5)) == 2
    for bad in (8, -1, 1.0, True, "0"):
        with pytest.raises(ValidationError, match=rf"home_channel: PE {bad!r} is not a PE of .* \(it has 8: 0 \.\. 7\)"):
            topo.home_channel(bad)


def test_an_error_inside_one_launch_of_a_device_run_names_that_launch():
    def k(tl, x, *, tcm_bytes=0, divide=False):
        tl.load(x)
        if tcm_bytes:
            tl.alloc((tcm_bytes // 4,), "fp32", name="big")
        if divide:
            return 1 / 0  # the kernel's own error: it keeps its class and message, and gets a note
        return None

    sim = kbwork.Simulator(mode="timing", pes=3)
    x, y = sim.hbm("x", shape=(8, 4), dtype="fp32"), sim.hbm("y", shape=(8, 4), dtype="fp32")
    with pytest.raises(ValidationError, match=r"^PE 2, launch 1: decode variant 'nope' is unknown"):
        sim.run_device({0: [Launch(k, x)], 2: [Launch(k, y), Launch(gqa_decode, x, y, y, x, variant="nope", tile=4)]})
    big = sim.topo.tcm_bytes * 2
    with pytest.raises(kbwork.TcmOverflowError, match=r"^PE 1, launch 0: TCM overflow allocating 'big'"):
        sim.run_device({0: [Launch(k, x)], 1: [Launch(k, y, tcm_bytes=big)]})
    with pytest.raises(ZeroDivisionError, match=r"^division by zero") as info:
        sim.run_device({0: [Launch(k, x)], 1: [Launch(k, y, divide=True)]})
    assert info.value.__notes__ == ["(raised while tracing PE 1, launch 0 of the device run)"]
    # one launch: the message is the kernel's, as from sim.run
    with pytest.raises(kbwork.TcmOverflowError, match=r"^TCM overflow allocating 'big'"):
        sim.run_device({1: [Launch(k, y, tcm_bytes=big)]})


def test_bad_channels_and_switches_are_refused():
    sim = kbwork.Simulator(mode="timing", pes=4, hbm_channels=2)
    # the message names the topology as the call changed it, not as its file says
    with pytest.raises(kbwork.KbworkError, match=r"channel=2 is not an HBM channel of ahbm-pe-v1 with pes=4, "
                                                 r"hbm_channels=2 \(it has 2: 0 \.\. 1\)"):
        sim.hbm("x", shape=(4,), dtype="fp32", channel=2)
    with pytest.raises(ValidationError, match=r"PE 4 is not a PE of ahbm-pe-v1 with pes=4, hbm_channels=2"):
        sim.run_device({4: [Launch(busy, 1)]})
    # a bandwidth is taken as the decimal written (DESIGN §4): a fraction with one is exact, one without refused
    from fractions import Fraction
    assert kbwork.load_topology(channel_bytes_per_cycle=Fraction(81, 2)).channel_fraction == Fraction(81, 2)
    for key in ("channel_bytes_per_cycle", "r_cycles_per_byte"):
        with pytest.raises(kbwork.ConfigError, match=rf"'{key}' is Fraction\(64, 3\), which has no exact decimal"):
            kbwork.load_topology(**{key: Fraction(64, 3)})
    with pytest.raises(ValidationError, match=r"reductions must be True or False"):
        sim.run_device({0: [Launch(busy, 1)]}, reductions="no")
    with pytest.raises(kbwork.ConfigError, match=r"multiple of hbm_channels"):
        kbwork.load_topology(pes=3, hbm_channels=2)


# --- the reductions and the reference ----------------------------------------------------------------------------
def test_identical_groups_are_simulated_once_and_keep_their_own_names():
    sim = kbwork.Simulator(mode="timing", pes=4, hbm_channels=4, channel_bytes_per_cycle=40)
    plan = {p: [Launch(gqa_decode, *decode_inputs(sim, p, channel=p), variant="opt2", tile=128)] for p in range(4)}
    run = sim.run_device(plan)
    assert (run.reductions.groups, run.reductions.simulated) == (4, 1)
    assert run.reductions.replicated_from == {1: 0, 2: 0, 3: 0}
    plain = sim.run_device(plan, reductions=False)
    assert run.to_csv() == plain.to_csv()
    assert set(run.pe(3).op_log.tensor) >= {"K3[0:128]", "q3"} and not any("K0" in t for t in run.pe(3).op_log.tensor)
    for p in plain.pes:
        pd.testing.assert_frame_equal(run.pe(p).op_log, plain.pe(p).op_log)


@pytest.mark.parametrize("chunk", range(4))
def test_replicated_runs_give_the_plain_simulation_s_op_log_frame(chunk):
    """Random runs the replication acts on (every PE one launch list over equally shaped tensors, names of
    several schemes, some like the kernels' TCM buffers): the op_log frame, dtypes and categories included, is
    the plain simulation's, for the device and PE by PE. Seeds 122, 220 and 313 are ones the text renaming got
    wrong (a TCM buffer named like a PE's tensor), 2011 one it got wrong for a ring slot ("buf0" beside a tensor
    buf0)."""
    replicated = 0
    for seed in [*range(20 * chunk, 20 * chunk + 20), *([122, 220, 313, 2011] if chunk == 0 else [])]:
        case = random_replicated_case(seed)
        run = case.sim.run_device(case.plan)
        plain = case.sim.run_device(case.plan, reductions=False, steady_state=False)
        replicated += bool(run.reductions.replicated_from)
        assert run.to_csv() == plain.to_csv(), case
        pd.testing.assert_frame_equal(run.op_log, plain.op_log)
        for p in plain.pes:
            pd.testing.assert_frame_equal(run.pe(p).op_log, plain.pe(p).op_log)
    assert replicated >= 3


def _named_decodes(names):
    sim = kbwork.Simulator(mode="timing", pes=len(names), hbm_channels=len(names), channel_bytes_per_cycle=40)
    plan = {}
    for p, (qn, kn, vn, on) in enumerate(names):
        q = sim.hbm(qn, shape=(4, 64), dtype="bf16", channel=p)
        K, V = (sim.hbm(n, shape=(512, 64), dtype="bf16", channel=p) for n in (kn, vn))
        O = sim.hbm(on, shape=(4, 64), dtype="fp32", channel=p)
        plan[p] = [Launch(gqa_decode, q, K, V, O, variant="opt2", tile=128)]
    return sim.run_device(plan), sim.run_device(plan, reductions=False)


def test_a_replica_s_op_log_is_the_plain_one_when_its_names_sort_otherwise():
    # PE 1's names sort in another order than PE 0's (K < V < out < q there, A < B < C < D here): the replica's
    # tensor column must still be the frame the plain simulation gives, its categories in sorted order
    run, plain = _named_decodes([("q", "K", "V", "out"), ("D", "C", "B", "A")])
    assert run.reductions.replicated_from == {1: 0}
    for p in plain.pes:
        pd.testing.assert_frame_equal(run.pe(p).op_log, plain.pe(p).op_log)
    pd.testing.assert_frame_equal(run.op_log, plain.op_log)
    assert list(run.pe(1).op_log.tensor.cat.categories) == sorted(set(run.pe(1).op_log.tensor.astype(str)))


@pytest.mark.parametrize("names", [
    [("q", "K", "V", "O"), ("D", "C", "B", "A")],            # the kernel's TCM accumulator is "O" too
    [("q|0", "K|0", "V|0", "o|0"), ("q|1", "K|1", "V|1", "o|1")],  # "|" joins a fetch's two names
    [("q[0]", "K[0]", "V[0]", "o[0]"), ("q[1]", "K[1]", "V[1]", "o[1]")],  # "[" starts a slice
], ids=["tcm-named-like-a-tensor", "bar", "bracket"])
def test_names_a_replica_could_not_rename_by_their_text_are_simulated(names):
    # a replica renames the names in its labels and tensor column by their text: with a TCM buffer named like
    # an HBM tensor it would call PE 1's store of its TCM "O" "dma_store A", and names holding "|" or "[" it
    # would split wrongly ("Q|K|0[0:128]"). Such a group is simulated, and the op_log is the plain one
    run, plain = _named_decodes(names)
    assert run.reductions.replicated_from == {} and run.reductions.simulated == 2
    pd.testing.assert_frame_equal(run.op_log, plain.op_log)
    if names[0][3] == "O":
        assert "dma_store O" in set(run.pe(1).op_log.label.astype(str))


@pytest.mark.parametrize("seed", range(10))
def test_random_device_runs_match_the_cycle_stepped_reference_stage_for_stage(seed):
    case = random_device_case(seed)
    g, start, end, _ = resolved_device_graph(case.sim, case.plan)
    ref = reference(g)
    assert ref.start == start and ref.end == end, case
    log = case.sim.run_device(case.plan, reductions=False, steady_state=False).op_log
    assert list(log.start) == start and list(log.end) == end, case


@pytest.mark.parametrize("chunk", range(4))
def test_reductions_and_the_steady_state_give_the_plain_simulation_s_op_log(chunk):
    for seed in range(100 + 10 * chunk, 110 + 10 * chunk):
        case = random_device_case(seed)
        plain_run = case.sim.run_device(case.plan, reductions=False, steady_state=False)
        plain = plain_run.to_csv()
        reduced = case.sim.run_device(case.plan)
        assert reduced.to_csv() == plain, case
        assert case.sim.run_device(case.plan, steady_state=False).to_csv() == plain, case
        # the frames too, dtypes and the categories' order included, PE by PE (a replica renames its tensors)
        for p in plain_run.pes:
            pd.testing.assert_frame_equal(reduced.pe(p).op_log, plain_run.pe(p).op_log)


@pytest.mark.parametrize("chunk", range(3))
def test_the_device_steady_state_gives_the_plain_simulation_s_op_log(chunk):
    """Loops long enough for the steady state: PEs per channel 1-4, channels 1-4, mixed launch lists, both
    hazard policies, every variant; each run equal to the plain simulation, and the joint steady state used."""
    joint = 0
    for seed in range(200 + 8 * chunk, 208 + 8 * chunk):
        case = random_device_case(seed, long=True)
        plain = case.sim.run_device(case.plan, reductions=False, steady_state=False)
        run = case.sim.run_device(case.plan)
        assert run.to_csv() == plain.to_csv(), case
        assert run.cycles == plain.cycles and run.critical_path().equals(plain.critical_path()), case
        joint += any("steady with the device" in line for line in run.steady_state.loops)
    assert joint >= 3, f"only {joint} of 8 runs used the joint steady state"


def test_four_pes_on_one_channel_are_steady_jointly_and_equal_the_full_run():
    sim = kbwork.Simulator(mode="timing", pes=4, hbm_channels=1, channel_bytes_per_cycle=64)
    plan = {p: [Launch(gqa_decode, *decode_inputs(sim, p, kv=4096, channel=0), variant="opt2", tile=128)]
            for p in range(4)}
    run = sim.run_device(plan)
    full = sim.run_device(plan, steady_state=False, reductions=False)
    assert run.steady_state.path == "steady" and run.steady_state.inserted > 0
    assert all("steady with the device" in line for line in run.steady_state.loops)
    assert run.to_csv() == full.to_csv()
    # four transfers share 64 B/cycle: the device takes longer than one PE alone, and no less than its bytes
    one = sim.run(gqa_decode, *decode_inputs(sim, 9, kv=4096), variant="opt2", tile=128)
    kv_bytes = 4 * 2 * 4096 * 64 * 2
    assert run.cycles > one.cycles and run.cycles >= kv_bytes / 64


def test_a_replica_renames_default_labels_and_names_made_from_its_tensors():
    def k(tl, x, y):
        t = tl.load(x)            # default label "dma_load x<p>", TCM name "x<p>_tcm"
        tl.store(t, y)
    sim = kbwork.Simulator(mode="timing", pes=3, hbm_channels=3)
    plan = {p: [Launch(k, sim.hbm(f"x{p}", shape=(64,), dtype="fp32", channel=p),
                       sim.hbm(f"y{p}", shape=(64,), dtype="fp32", channel=p))] for p in range(3)}
    run = sim.run_device(plan)
    assert run.reductions.simulated == 1
    assert run.to_csv() == sim.run_device(plan, reductions=False).to_csv()
    labels = run.op_log[run.op_log.stage == "DISPATCH"].label.astype(str).tolist()
    assert labels == [f"dma_{v} x{p}{s}" for p in range(3) for v, s in (("load", ""), ("store", "_tcm"))]


def test_a_replica_on_other_channels_reports_its_own_channels():
    sim = kbwork.Simulator(mode="timing", pes=4, hbm_channels=2, channel_bytes_per_cycle=40)
    plan = {p: [Launch(gqa_decode, *decode_inputs(sim, p, channel=sim.topo.home_channel(p)), variant="opt2",
                       tile=128)] for p in range(4)}
    run = sim.run_device(plan)
    plain = sim.run_device(plan, reductions=False)
    assert run.reductions.replicated_from == {2: 0, 3: 1}
    assert np.array_equal(run.stage_channels, plain.stage_channels)
    log = run.op_log
    dma = log.stage.isin(["DMA_READ", "DMA_WRITE"]).to_numpy()
    assert set(run.stage_channels[dma & (log.pe >= 2).to_numpy()]) == {1}


def test_equally_named_tcm_buffers_of_other_shapes_or_places_keep_groups_apart():
    # the keys of plain TCM handles are shared by name between the groups of a run; PEs whose buffers carry
    # the same names but another shape, dtype or address are different groups, simulated each
    def k(tl, x, y, *, pad):
        if pad:
            tl.alloc((16,), "fp32", name="pad")    # moves "buf" up
        buf = tl.alloc(x.shape, x.dtype, name="buf")
        tl.composite(op="math", math_op="fill", out=buf, value=1.0)
        tl.store(buf, y)
    sim = kbwork.Simulator(mode="timing", pes=5, hbm_channels=5)
    shapes = [(64,), (128,), (64,), (64,), (64,)]
    dtypes = ["fp32", "fp32", "fp32", "bf16", "fp32"]
    pads = [False, False, False, False, True]
    plan = {p: [Launch(k, sim.hbm(f"x{p}", shape=shapes[p], dtype=dtypes[p], channel=p),
                       sim.hbm(f"y{p}", shape=shapes[p], dtype=dtypes[p], channel=p), pad=pads[p])]
            for p in range(5)}
    run = sim.run_device(plan)
    assert run.reductions.replicated_from == {2: 0}
    assert run.reductions.simulated == 4
    plain = sim.run_device(plan, reductions=False)
    assert run.to_csv() == plain.to_csv()


@pytest.mark.parametrize("seed", range(12))
def test_dropping_the_stale_ends_a_reflow_leaves_in_the_heap_changes_nothing(seed, monkeypatch):
    # the heap drops them all at once when they are most of it (device.loop._drop_stale); here at every chance,
    # against never, on random device runs (data mode: the numbers too), with and without the steady state
    import kbwork.device.loop as loop

    def run(stale_min):
        monkeypatch.setattr(loop, "STALE_MIN", stale_min)
        case = random_device_case(7000 + seed, mode="data" if seed % 3 == 0 else "timing", long=seed % 2 == 1)
        r = case.sim.run_device(case.plan, reductions=seed % 4 < 2)
        return r.op_log, [r.read(f"p{pe}l0_dst") for pe in case.plan if f"p{pe}l0_dst" in r.sim._hbm] \
            if case.sim.mode == "data" else []

    (log_never, out_never), (log_always, out_always) = run(10 ** 18), run(-1)
    assert log_always.equals(log_never)
    assert all(np.array_equal(a, b) for a, b in zip(out_always, out_never))


def test_many_pes_on_one_channel_drop_stale_ends_and_equal_the_full_run(monkeypatch):
    # 24 PEs sharing one channel: every join and leave moves the others' ends, and the heap keeps the old ones
    # until they are dropped; steady and plain give the same op_log as a run that never drops them
    import kbwork.device.loop as loop

    sim = kbwork.Simulator(mode="timing", pes=24, hbm_channels=1, channel_bytes_per_cycle=64)
    plan = {p: [Launch(gqa_decode, *decode_inputs(sim, p, kv=1024), variant="opt2", tile=128)] for p in range(24)}
    dropped = []
    real = loop._drop_stale
    monkeypatch.setattr(loop, "_drop_stale", lambda dev: (dropped.append(len(dev.events)), real(dev)))
    steady = sim.run_device(plan)
    plain = sim.run_device(plan, steady_state=False, reductions=False)
    assert dropped, "the case no longer leaves enough stale ends to drop"
    monkeypatch.setattr(loop, "STALE_MIN", 10 ** 18)
    never = sim.run_device(plan, steady_state=False, reductions=False)
    assert steady.op_log.equals(never.op_log) and plain.op_log.equals(never.op_log)


def _isolation_by_pairs(uses, tensors):
    """The isolation check written as every pair of families of two PEs (what check_isolation's sweep must
    find): the message it raises, or None."""
    from kbwork.device.device import _families_meet, _tensor_at

    found = []
    for pa, ua in uses.items():
        for pb, ub in uses.items():
            if pa == pb:
                continue
            for fw in ua.writes:
                for fo, o_writes in [(f, False) for f in ub.reads] + [(f, True) for f in ub.writes]:
                    if not _families_meet(fw, fo):
                        continue
                    w, o = (pa, fw), (pb, fo)
                    if o_writes and pb < pa:
                        w, o = o, w
                    found.append(((min(pa, pb), max(pa, pb), w[0] > o[0], o_writes, w[1].hull[0], o[1].hull[0]),
                                  w, o, o_writes))
    if not found:
        return None
    _, w, o, o_writes = min(found, key=lambda x: x[0])
    name = _tensor_at(sorted(tensors, key=lambda h: h.addr), max(w[1].hull[0], o[1].hull[0]))
    return f"PE {w[0]} writes tensor {name!r} and PE {o[0]} {'writes' if o_writes else 'reads'}"


@pytest.mark.parametrize("seed", range(60))
def test_the_isolation_sweep_finds_what_comparing_every_pair_finds(seed):
    from kbwork.device.device import Family, Uses, check_isolation

    rng = np.random.default_rng(seed)
    sim = kbwork.Simulator(mode="timing")
    tensors = [sim.hbm(f"t{i}", shape=(int(rng.integers(1, 64)), 16), dtype="fp32") for i in range(4)]
    lo, hi = tensors[0].addr, tensors[-1].end
    uses = {}
    for pe in range(int(rng.integers(2, 6))):
        fams = []
        for _ in range(int(rng.integers(0, 5))):
            count = int(rng.integers(1, 5))
            size = int(rng.integers(1, 512))
            stride = int(rng.choice([0, size, -size, 2 * size]))
            addr = int(rng.integers(lo, hi - size))
            if stride:
                ends = [addr + stride * i for i in range(count)]
                if min(ends) < lo or max(ends) + size > hi:
                    stride = 0
            fams.append((Family(addr, stride, size, count), bool(rng.random() < 0.3)))
        uses[pe] = Uses(set(), [f for f, w in fams if not w], [f for f, w in fams if w])
    want = _isolation_by_pairs(uses, tensors)
    if want is None:
        check_isolation(dict.fromkeys(uses, ()), tensors, uses)
    else:
        with pytest.raises(ValidationError, match=re.escape(want)):
            check_isolation(dict.fromkeys(uses, ()), tensors, uses)
