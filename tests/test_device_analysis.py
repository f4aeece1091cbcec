"""Seeing a device run (DESIGN §14): contention per DMA stage, the channels' load (by hand, against the
cycle-stepped reference, conservation and bandwidth on random runs), utilisation, waits and attribution per
PE, explain's contention sentence, the Perfetto counters and the device Gantt."""

from __future__ import annotations

import math
from fractions import Fraction

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

import kbwork  # noqa: E402
from kbwork import Launch, ValidationError, analysis, decode, plots  # noqa: E402
from kbwork.analysis.channels import FlowMismatch, channel_loads, steps_table  # noqa: E402
from kbwork.kernels.gqa_decode import gqa_decode  # noqa: E402

from device_cases import random_device_case, resolved_device_graph  # noqa: E402  (tests/ is on sys.path)
from reference_device import simulate as reference  # noqa: E402
from test_device import FREE_FRONT, busy, decode_inputs, load, two_loads  # noqa: E402


def hand_run():
    """Two PEs on one 40 B/cycle channel, each loading 4096 bytes at cycle 0 (dispatch and plan free)."""
    sim = kbwork.Simulator(mode="timing", pes=2, hbm_channels=2, channel_bytes_per_cycle=40, **FREE_FRONT)
    x = [sim.hbm(f"x{p}", shape=(1024,), dtype="fp32", channel=0) for p in range(2)]
    return sim.run_device({0: [Launch(load, x[0])], 1: [Launch(load, x[1])]})


def per_cycle(run) -> dict[int, dict[int, Fraction]]:
    """channel -> {cycle: bytes moved in it} (non-zero cycles only), from one-cycle bins, exact."""
    f = analysis.channels_over_time(run, bins=list(range(run.cycles + 1)), exact=True)
    return {int(c): {int(t): b for t, b in zip(g["t0"], g["bytes"]) if b} for c, g in f.groupby("channel")}


def dma_bytes_by_channel(run) -> dict[int, int]:
    log = run.op_log
    chan = run.stage_channels
    dma = log["stage"].isin(["DMA_READ", "DMA_WRITE"]).to_numpy() & (chan >= 0)
    return {int(c): int(log["bytes"].to_numpy()[dma & (chan == c)].sum()) for c in np.unique(chan[dma])}


@pytest.fixture(scope="module")
def cases():
    out = []
    for seed in range(20):
        case = random_device_case(seed)
        out.append((case, case.sim.run_device(case.plan)))
    return out


# --- contention and the channel load by hand ---------------------------------------------------------------------
def test_two_pes_sharing_a_channel_each_lose_102_cycles():
    run = hand_run()
    con = analysis.contention(run)
    assert list(con.columns) == ["seq", "pe", "cmd", "channel", "bytes", "alone", "actual", "lost"]
    assert all(str(d) == "int64" for d in con.dtypes)
    assert con[["pe", "channel", "bytes", "alone", "actual", "lost"]].values.tolist() == \
        [[0, 0, 4096, 303, 405, 102], [1, 0, 4096, 303, 405, 102]]
    ch = analysis.channels(run)
    assert list(ch.columns) == ["channel", "bytes", "busy_cycles", "busy_fraction", "peak_flows"]
    assert ch.values.tolist() == [[0, 8192, 205, 205 / 405, 2]]
    # both advance 20 B/cycle from 200; in cycle 404 each moves the 16 bytes it still needs
    steps = analysis.channel_steps(run, exact=True)
    assert steps.values.tolist() == [[0, 200, 404, 2, 40], [0, 404, 405, 2, 32]]
    assert per_cycle(run)[0] == {t: 40 for t in range(200, 404)} | {404: 32}


def test_staggered_loads_share_five_cycles_and_lose_two_each():
    run = two_loads(40, stagger=100)
    con = analysis.contention(run)
    assert con[["pe", "alone", "actual", "lost"]].values.tolist() == [[0, 303, 305, 2], [1, 303, 305, 2]]
    s = analysis.channel_steps(run, exact=True)
    # PE 0 alone, both (PE 0's last 16 bytes in cycle 304), PE 1 alone (its last 36 bytes in cycle 404)
    assert s.values.tolist() == [[0, 200, 300, 1, 40], [0, 300, 304, 2, 40], [0, 304, 305, 2, 36],
                                 [0, 305, 404, 1, 40], [0, 404, 405, 1, 36]]
    assert analysis.channels(run)["peak_flows"].tolist() == [2]


def test_alone_on_its_channel_loses_nothing_and_an_unconstrained_channel_never_shares():
    for run in (two_loads(40, channels=(0, 1)), two_loads(math.inf)):
        con = analysis.contention(run)
        assert (con["lost"] == 0).all() and (con["actual"] == con["alone"]).all()
    ch = analysis.channels(two_loads(math.inf))
    assert ch["peak_flows"].tolist() == [2] and ch["busy_cycles"].tolist() == [64]
    assert analysis.channels_over_time(two_loads(math.inf), bins=4)["utilisation"].isna().all()


def test_one_pe_s_dma_units_contend_too_and_a_decode_run_is_accepted():
    sim = kbwork.Simulator(mode="timing", channel_bytes_per_cycle=40, dma_channels=2, **FREE_FRONT)
    xs = [sim.hbm(f"x{i}", shape=(1024,), dtype="fp32") for i in range(2)]

    def two(tl, a, b):
        tl.load(a, name="a")
        tl.load(b, name="b")
    run = sim.run(two, *xs)
    assert analysis.contention(run)["lost"].tolist() == [102, 102]
    assert analysis.channels(run)["peak_flows"].tolist() == [2]
    r = decode.run("opt2", kv_len=512, mode="timing")
    con = analysis.contention(r)
    assert len(con) == int(r.op_log["stage"].isin(["DMA_READ", "DMA_WRITE"]).sum()) and (con["lost"] == 0).all()
    assert analysis.channels(r)["bytes"].tolist() == [int(con["bytes"].sum())]


# --- exact on random device runs ------------------------------------------------------------------------------
def test_conservation_and_bandwidth_on_random_device_runs(cases):
    for case, run in cases:
        want = dma_bytes_by_channel(run)
        ch = analysis.channels(run)
        assert dict(zip(ch["channel"].tolist(), ch["bytes"].tolist())) == want, case
        ot = analysis.channels_over_time(run, bins=37)
        assert (ot.groupby("channel")["bytes"].sum().to_dict()) == want, case  # exactly, in float64
        exact = analysis.channels_over_time(run, bins=53, exact=True)
        assert {c: sum(g["bytes"]) for c, g in exact.groupby("channel")} == want, case
        steps = analysis.channel_steps(run, exact=True)
        bw = run.topology.channel_fraction
        rate = run.topology.dma_bytes_per_cycle
        for c, g in steps.groupby("channel"):
            assert sum((t1 - t0) * v for t0, t1, v in zip(g["t0"], g["t1"], g["bytes_per_cycle"])) == want[c]
            cap = [min(k * rate, bw) if bw is not None else k * rate for k in g["flows"]]
            assert all(v <= m for v, m in zip(g["bytes_per_cycle"], cap)), case  # never over the bandwidth
            assert (g["t1"] > g["t0"]).all() and (g["t0"].to_numpy()[1:] == g["t1"].to_numpy()[:-1]).all()
        if bw is not None:
            assert (ot["bytes_per_cycle"] <= float(bw)).all() and (ot["utilisation"] <= 1).all()
        busy = steps[steps["flows"] > 0]
        per = busy.assign(n=busy["t1"] - busy["t0"]).groupby("channel")["n"].sum()
        assert ch.set_index("channel")["busy_cycles"].to_dict() == {**dict.fromkeys(want, 0), **per.to_dict()}


@pytest.mark.parametrize("seed", [0, 4, 5, 9, 17, 20])
def test_per_cycle_bytes_equal_the_cycle_stepped_reference(seed):
    case = random_device_case(seed)
    run = case.sim.run_device(case.plan)
    ref = reference(resolved_device_graph(case.sim, case.plan)[0])
    assert per_cycle(run) == {c: {t: b for t, b in m.items() if b} for c, m in ref.moved.items()
                              if any(m.values())}
    peak = analysis.channels(run).set_index("channel")["peak_flows"].to_dict()
    assert peak == {c: max(f.values()) for c, f in ref.flows.items()} | {c: 0 for c in peak if c not in ref.flows}


def test_many_flows_on_one_channel_stay_exact():
    """48 loads of different sizes on one channel of 40.5 B/cycle: k up to 48, a scale past int64."""
    sim = kbwork.Simulator(mode="timing", pes=48, channel_bytes_per_cycle=40.5, **FREE_FRONT)
    plan = {p: [Launch(load, sim.hbm(f"x{p}", shape=(64 * (p + 1),), dtype="fp32"))] for p in range(48)}
    run = sim.run_device(plan)
    ref = reference(resolved_device_graph(sim, plan)[0])
    assert per_cycle(run) == {0: {t: b for t, b in ref.moved[0].items() if b}}
    assert analysis.channels(run)["peak_flows"].tolist() == [48]
    ot = analysis.channels_over_time(run, bins=100)
    assert ot["bytes"].sum() == sum(64 * 4 * (p + 1) for p in range(48))


def test_replicated_groups_read_their_own_channels():
    def device(reductions):
        sim = kbwork.Simulator("ahbm-device-v1", mode="timing", pes=8, hbm_channels=4)
        plan = {p: [Launch(gqa_decode, *decode_inputs(sim, p, kv=256, channel=sim.topo.home_channel(p)),
                           variant="opt2", tile=128)] for p in range(8)}
        return sim.run_device(plan, reductions=reductions)
    fast, plain = device(True), device(False)
    assert fast.reductions.replicated_from  # the case this is about
    assert (fast.stage_channels == plain.stage_channels).all()
    assert analysis.channels(fast).equals(analysis.channels(plain))
    assert analysis.channels(fast)["channel"].tolist() == [0, 1, 2, 3]
    assert analysis.contention(fast).equals(analysis.contention(plain))


# --- per PE and for the device ------------------------------------------------------------------------------
def test_utilization_per_pe_and_for_the_device(cases):
    for case, run in cases:
        if len(run.pes) < 2:
            continue
        log = run.op_log
        u = analysis.utilization(log)
        assert list(u.columns) == ["pe", "engine", "stages", "busy_cycles", "busy_fraction"]
        for p in run.pes:
            mine = analysis.utilization(run.pe(p).op_log)
            row = u[u["pe"] == p]
            assert row["busy_cycles"].tolist() == mine["busy_cycles"].tolist()
            assert np.allclose(row["busy_fraction"], mine["busy_cycles"] / run.cycles)
        dev = analysis.utilization(log, per_pe=False)
        assert list(dev.columns) == ["engine", "stages", "busy_cycles", "busy_fraction"]
        assert dev["busy_cycles"].tolist() == u.groupby("engine", sort=False)["busy_cycles"].sum().tolist()
        assert dev["stages"].sum() == len(log)
        assert np.allclose(dev["busy_fraction"], dev["busy_cycles"] / (len(run.pes) * run.cycles))
        # over time: each PE's columns are its own op_log's over the device's bins
        ot = analysis.utilization_over_time(log, bins=20)
        assert ot.columns.names == ["pe", "engine"]
        edges = np.linspace(0.0, float(run.cycles), 21)
        for p in run.pes:
            assert np.allclose(ot[p].to_numpy(), analysis.utilization_over_time(run.pe(p).op_log, edges).to_numpy())
        assert np.allclose(analysis.utilization_over_time(log, bins=20, per_pe=False).to_numpy(),
                           ot.T.groupby(level="engine", sort=False).mean().T.to_numpy())
        break


def test_waits_and_attribution_per_pe(cases):
    case, run = next((c, r) for c, r in cases if len(r.pes) > 2)
    w = analysis.waits(run)
    assert list(w.columns[:3]) == ["pe", "stage", "engine"]
    for p in run.pes:
        mine = analysis.waits(run.pe(p))
        assert w[w["pe"] == p].drop(columns="pe").reset_index(drop=True).equals(mine)
    pooled = analysis.waits(run, per_pe=False)
    assert pooled["total"].sum() == w["total"].sum() and pooled["stages"].sum() == len(run.op_log)
    assert len(analysis.top_waits(run, 3)) <= 3
    att = analysis.attribution(run)
    assert att.equals(analysis.attribution(run.pe(run.last_pe())))
    assert att.groupby("by")["cycles"].sum().tolist() == [run.cycles, run.cycles]
    for p in run.pes:
        a = analysis.attribution(run.pe(p))
        assert a.groupby("by")["cycles"].sum().tolist() == [run.pe(p).cycles] * 2


def test_one_pe_outputs_are_unchanged():
    r = decode.run("opt3", kv_len=1024, mode="timing").run
    log = r.op_log
    u = analysis.utilization(log)
    assert list(u.columns) == ["engine", "stages", "busy_cycles", "busy_fraction"]
    assert u.equals(analysis.utilization(log, per_pe=False))
    assert analysis.utilization(log, per_pe=True).drop(columns="pe").equals(u)
    ot = analysis.utilization_over_time(log, bins=10)
    assert list(ot.columns) == list(u["engine"]) and ot.equals(analysis.utilization_over_time(log, 10, per_pe=False))
    w = analysis.waits(r)
    assert list(w.columns[:2]) == ["stage", "engine"] and w.equals(analysis.waits(r, per_pe=False))
    x = analysis.explain(r)
    assert x.bound["contended_channels"] == [] and x.bound["contention_cycles"] == 0
    assert "contended" not in x.sentence and "PE" not in x.report().splitlines()[0]
    assert "pes" not in x.to_dict()


# --- explain -----------------------------------------------------------------------------------------------
def test_explain_names_contention_above_five_percent_and_not_below():
    run = hand_run()
    x = analysis.explain(run)
    assert x.sentence.endswith("; channel 0 is contended: DMA stages on the critical path lost 102 cycles (25%) "
                               "to sharing it.")
    assert x.bound["contended_channels"] == [0] and x.bound["contention_cycles"] == 102
    assert "channel 0 contended" in x.short and "PE 0" in x.report().splitlines()[0]
    assert x.to_dict()["pes"] == 2 and x.to_dict()["bound"]["contended_channels"] == [0]
    # the threshold is a parameter; staggered, 2 cycles of 405 are lost: below 5 %, nothing is said
    assert "contended" not in analysis.explain(run, contended=0.3).sentence
    stag = analysis.explain(two_loads(40, stagger=100))
    assert stag.bound["contention_cycles"] == 2 and "contended" not in stag.sentence
    for quiet in (two_loads(40, channels=(0, 1)), two_loads(math.inf)):
        assert "contended" not in analysis.explain(quiet).sentence
    with pytest.raises(ValidationError, match="contended"):
        analysis.explain(run, contended=0)


def test_explain_of_a_device_speaks_for_the_pe_its_critical_path_runs_on():
    sim = kbwork.Simulator(mode="timing", pes=2, hbm_channels=1, channel_bytes_per_cycle=40)
    plan = {0: [Launch(gqa_decode, *decode_inputs(sim, 0, kv=512), variant="opt2", tile=128)],
            1: [Launch(busy, 50), Launch(gqa_decode, *decode_inputs(sim, 1, kv=512), variant="opt3", tile=128)]}
    run = sim.run_device(plan)
    x = analysis.explain(run)
    last = run.last_pe()
    assert x.pe == last and x.pes == 2
    assert x.utilization.equals(analysis.utilization(run.pe(last).op_log))
    assert x.holds == len(run.pe(last).holds())
    lost = analysis.path_contention(run)
    assert lost["fraction"] >= 0.05 and "is contended" in x.sentence and f"lost {lost['cycles']} cycles" in x.sentence


def test_explaining_a_device_run_reads_its_critical_path_s_pe_only(cases):
    """explain, attribution and path_contention of a device run give what the whole device op_log gives, and
    leave it unbuilt (96 decode tasks make 500,000 rows, and the path runs on one PE)."""
    from kbwork.oplog import engine_tracks

    seen = 0
    for case, _ in cases:
        run = case.sim.run_device(case.plan)
        if len(run.pes) < 2:
            continue
        seen += 1
        x = analysis.explain(run)
        att = analysis.attribution(run)
        lost = analysis.path_contention(run)
        assert run._op_log is None, case  # nothing above built the device's op_log
        assert run.units == engine_tracks(run.op_log["engine"]), case
        path = run.critical_path()
        con = analysis.contention(run)  # every PE's DMA rows, from the device op_log
        on = con[con["seq"].isin(path["seq"].to_numpy()) & (con["lost"] > 0)]
        assert lost["cycles"] == int(on["lost"].sum()), case
        assert lost["channels"] == {int(c): int(v) for c, v in on.groupby("channel")["lost"].sum().items()}, case
        assert att["name"].tolist()[:len(run.units)] == list(run.units), case
        assert x.bound["contention_cycles"] == lost["cycles"], case
    assert seen >= 5


# --- Perfetto ------------------------------------------------------------------------------------------------
def test_perfetto_has_a_process_per_pe_and_a_counter_per_channel():
    sim = kbwork.Simulator(mode="timing", pes=4, hbm_channels=2, channel_bytes_per_cycle=40)
    plan = {p: [Launch(gqa_decode, *decode_inputs(sim, p, kv=256, channel=sim.topo.home_channel(p)),
                       variant="opt2", tile=128)] for p in range(4)}
    run = sim.run_device(plan)
    trace = run.to_perfetto()
    ev = trace["traceEvents"]
    procs = {e["pid"]: e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "process_name"}
    assert sorted(procs.values()) == ["HBM channels", "PE 0", "PE 1", "PE 2", "PE 3"]
    cpid = next(p for p, n in procs.items() if n == "HBM channels")
    counters = [e for e in ev if e["ph"] == "C"]
    assert {e["pid"] for e in counters} == {cpid}
    assert {e["name"] for e in counters} == {"HBM channel 0", "HBM channel 1"}
    steps = analysis.channel_steps(run)
    for c in (0, 1):
        vals = [e["args"]["bytes per cycle"] for e in counters if e["name"] == f"HBM channel {c}"]
        assert vals[1:-1] == steps[steps["channel"] == c]["bytes_per_cycle"].tolist() and vals[-1] == 0.0
        assert max(vals) <= 40
    assert len([e for e in ev if e["ph"] == "X"]) == len(run.op_log)
    # one PE's run does not hold the other PEs' transfers: no counters rather than wrong ones
    assert not [e for e in run.pe(0).to_perfetto()["traceEvents"] if e["ph"] == "C"]
    # a PE other than 0 is named, alone too (PE 0 alone is the one-PE run's "AHBM PE")
    for p, want in ((0, "AHBM PE"), (2, "PE 2")):
        alone = run.pe(p).to_perfetto()["traceEvents"]
        assert [e["args"]["name"] for e in alone if e["name"] == "process_name"] == [want]
    one = decode.run("opt2", kv_len=512, mode="timing").to_perfetto()["traceEvents"]
    assert {e["name"] for e in one if e["ph"] == "C"} == {"HBM channel 0"}


# --- errors ------------------------------------------------------------------------------------------------
def test_bad_inputs_are_typed_errors_that_say_what_to_pass():
    run = hand_run()
    with pytest.raises(ValidationError, match="takes a Run"):
        analysis.contention(run.op_log)
    with pytest.raises(ValidationError, match="bins"):
        analysis.channels_over_time(run, bins=0)
    with pytest.raises(ValidationError, match="whole-cycle"):
        analysis.channels_over_time(run, bins=[0, 10.5, 20])
    with pytest.raises(ValidationError, match="exact"):
        analysis.channels_over_time(run, exact="yes")
    for f in (lambda: analysis.utilization(run.op_log, per_pe="yes"), lambda: analysis.waits(run, per_pe=1)):
        with pytest.raises(ValidationError, match="per_pe"):
            f()
    # PE 0 alone cannot account for its 405 cycles: PE 1's transfer is not in its op_log
    with pytest.raises(FlowMismatch, match=r"run\.pe\(p\)"):
        analysis.channels(run.pe(0))
    assert analysis.contention(run.pe(0))["lost"].tolist() == [102]  # row by row, it still knows
    edited = hand_run()
    edited.op_log.loc[2, "end"] = 250
    with pytest.raises(ValidationError, match="fewer than the 303"):
        analysis.contention(edited)
    with pytest.raises(FlowMismatch, match="seq 2"):
        analysis.channels(edited)


# --- the device Gantt --------------------------------------------------------------------------------------------
def test_device_gantt_draws_a_panel_per_pe_and_a_strip_per_channel():
    run = two_loads(40, stagger=100)
    fig = plots.device_gantt(run)
    assert isinstance(fig, plt.Figure)
    gids = [ax.get_gid() for ax in fig.axes if ax.get_gid()]
    assert gids == ["pe:0", "pe:1", "channel:0"]
    strip = next(ax for ax in fig.axes if ax.get_gid() == "channel:0")
    loads = [a for a in strip.patches if (a.get_gid() or "").startswith("channel-load:0")]
    assert {a.get_gid() for a in loads} == {"channel-load:0:1", "channel-load:0:2"}
    assert any(t.get_text().endswith("at most 2 flows at once") for t in strip.texts)
    assert "critical path on PE 1" in fig._suptitle.get_text()
    shared = {ax.get_shared_x_axes().joined(fig.axes[0], ax) for ax in fig.axes if ax.get_gid()}
    assert shared == {True}
    plt.close(fig)
    alone = plots.device_gantt(two_loads(40, channels=(0, 1)))  # a flow alone on each channel: "1 flow"
    assert [t.get_text().endswith("at most 1 flow at once") for ax in alone.axes if (ax.get_gid() or "")
            .startswith("channel:") for t in ax.texts] == [True, True]
    plt.close(alone)
    fig = plots.device_gantt(run, pes=[1], channels=False)
    assert [ax.get_gid() for ax in fig.axes if ax.get_gid()] == ["pe:1"]
    plt.close(fig)
    with pytest.raises(ValidationError, match="ran nothing"):
        plots.device_gantt(run, pes=[7])


def test_device_gantt_shows_a_few_pes_by_default():
    sim = kbwork.Simulator(mode="timing", pes=8, hbm_channels=4, channel_bytes_per_cycle=40, **FREE_FRONT)
    plan = {p: [Launch(load, sim.hbm(f"x{p}", shape=(256 * (p + 1),), dtype="fp32",
                                     channel=sim.topo.home_channel(p)))] for p in range(8)}
    run = sim.run_device(plan)
    assert run.last_pe() == 7 and plots.device.default_pes(run) == [0, 1, 6, 7]  # 7 and 6 share channel 3
    fig = plots.device_gantt(run)
    assert [ax.get_gid() for ax in fig.axes if ax.get_gid()] == ["pe:0", "pe:1", "pe:6", "pe:7", "channel:0",
                                                                  "channel:3"]
    plt.close(fig)
    # it read the shown PEs' op_logs and their channels' loads only: the device's op_log was not built
    assert run._op_log is None
    texts = {ax.get_gid(): ax.texts[0].get_text() for ax in fig.axes if str(ax.get_gid()).startswith("channel:")}
    table = analysis.channels(run).set_index("channel")  # from every PE's rows
    for c in (0, 3):
        row = table.loc[c]
        assert texts[f"channel:{c}"].startswith(f"HBM channel {c}: {int(row['bytes']):,} bytes, busy "
                                                f"{100 * row['busy_fraction']:.0f}% of the run, at most "
                                                f"{int(row['peak_flows'])} flow")
    steps = analysis.channel_steps(run)
    for c in (0, 3):
        mine = steps_table(channel_loads(run, only=[c]))
        assert mine.equals(steps[steps["channel"] == c].reset_index(drop=True))
