"""Engines come from the topology's engine table: PE_DMA with dma_channels channels (DESIGN §1, §5, §6).

With n > 1 channels a free channel takes the oldest ready DMA stage, the lowest-numbered free channel
first; the op_log names the channel (PE_DMA0, PE_DMA1, ...), each channel is its own Gantt and Perfetto
track and utilisation row. With one channel nothing moves (the goldens check that byte for byte).
"""

from __future__ import annotations

import io
import json
import math

import numpy as np
import pandas as pd
import pytest

import kbwork
from kbwork import analysis, decode, plots
from kbwork.oplog import ENGINE_NAMES, read_csv
from kbwork.pe.stages import EngineSpec, engine_table, unit_names
from test_core_timeline import RANDOM_SEEDS, build_and_run, check_plan_rules, interpret, make_program

ceil = math.ceil
DMA = ("DMA_READ", "DMA_WRITE")


def test_the_engine_table_follows_the_topology():
    assert engine_table(kbwork.load_topology()) == tuple(EngineSpec(n, 1) for n in ENGINE_NAMES)
    table = engine_table(kbwork.load_topology(dma_channels=3))
    assert [e.capacity for e in table] == [1, 1, 3, 1, 1]
    assert unit_names(table) == ("PE_CPU", "PE_SCHEDULER", "PE_DMA0", "PE_DMA1", "PE_DMA2", "PE_GEMM", "PE_MATH")
    assert unit_names(engine_table(kbwork.load_topology())) == ENGINE_NAMES


@pytest.mark.parametrize("value", [0, -1, 1.5, True, "2"])
def test_dma_channels_must_be_a_positive_int(value):
    with pytest.raises(kbwork.ConfigError, match="dma_channels"):
        kbwork.load_topology(dma_channels=value)


def test_one_channel_keeps_the_plain_engine_name():
    log = decode.run("opt3", kv_len=512, mode="timing").op_log
    assert list(log.engine.cat.categories) == list(ENGINE_NAMES)
    assert set(log[log.stage.isin(DMA)].engine) == {"PE_DMA"}


def _schedule(run) -> list[tuple]:
    log = run.op_log
    return list(zip(log.stage.astype(str), log.engine.astype(str), log.start, log.end))


def test_two_channels_by_hand_a_gemm_streaming_both_operands():
    """gemm(a=A 32x128 bf16, b=B 128x128 bf16, both HBM, out=C 32x128 fp32 HBM): one tile, one k-tile.
    With two channels A and B are read at once (A, the lower seq, on channel 0); the write-back takes the
    lowest-numbered free channel."""
    def run(channels):
        sim = kbwork.Simulator(mode="timing", dma_channels=channels)
        a = sim.hbm("A", shape=(32, 128), dtype="bf16")
        b = sim.hbm("B", shape=(128, 128), dtype="bf16")
        c = sim.hbm("C", shape=(32, 128), dtype="fp32")
        return sim.run(lambda tl: tl.composite(op="gemm", a=a, b=b, out=c))

    d = (0, 40 + ceil(0.0625 * 48))                      # gemm: 3 handles, 4 scalars = 48 B -> 43
    p = (d[1], d[1] + 10)
    ra = (p[1], p[1] + 200 + ceil(32 * 128 * 2 / 64))    # 8192 B -> 328
    rb = (p[1], p[1] + 200 + ceil(128 * 128 * 2 / 64))   # 32768 B -> 712, beside it on channel 1
    f = (rb[1], rb[1] + ceil((8192 + 32768) / 128))      # FETCH after both reads
    g = (f[1], f[1] + 16 + 1 * 4 * 128)
    w = (g[1], g[1] + 200 + ceil(32 * 128 * 4 / 64))     # channel 0 is free again
    two = run(2)
    assert _schedule(two) == [("DISPATCH", "PE_CPU", *d), ("PLAN", "PE_SCHEDULER", *p),
                              ("DMA_READ", "PE_DMA0", *ra), ("DMA_READ", "PE_DMA1", *rb),
                              ("FETCH", "PE_GEMM", *f), ("GEMM", "PE_GEMM", *g), ("DMA_WRITE", "PE_DMA0", *w)]
    assert two.cycles == 2069
    one = run(1)
    assert one.cycles == 2069 + (ra[1] - ra[0])  # one channel: B waits for A
    assert list(one.op_log.engine.astype(str)) == ["PE_CPU", "PE_SCHEDULER"] + ["PE_DMA"] * 2 + ["PE_GEMM"] * 2 \
        + ["PE_DMA"]


def test_two_channels_by_hand_three_loads():
    """Three tl.load of 131072 B (2248 cycles each): the second starts at once on channel 1, the third takes
    channel 0 when the first ends (channel 1 is busy 42 cycles longer) and is the critical path's end."""
    sim = kbwork.Simulator(mode="timing", dma_channels=2)
    xs = [sim.hbm(n, shape=(64, 512), dtype="fp32") for n in ("x", "y", "z")]
    run = sim.run(lambda tl: [tl.load(x) for x in xs])
    dma = 200 + 131072 // 64
    r0 = (52, 52 + dma)                                   # DISPATCH 42, PLAN 10
    r1 = (94, 94 + dma)                                   # DISPATCH 42..84, PLAN 84..94
    r2 = (r0[1], r0[1] + dma)                             # ready at 136; both channels busy until 2300 / 2342
    reads = run.op_log[run.op_log.stage == "DMA_READ"]
    assert list(zip(reads.engine.astype(str), reads.ready, reads.start, reads.end)) == [
        ("PE_DMA0", 52, *r0), ("PE_DMA1", 94, *r1), ("PE_DMA0", 136, *r2)]
    path = run.critical_path()
    assert list(zip(path.seq, path.engine.astype(str), path.cause.astype(str))) == [
        (0, "PE_CPU", "dependency"), (1, "PE_SCHEDULER", "dependency"), (2, "PE_DMA0", "dependency"),
        (8, "PE_DMA0", "engine")]
    util = analysis.utilization(run.op_log).set_index("engine")
    assert list(util.index) == ["PE_CPU", "PE_SCHEDULER", "PE_DMA0", "PE_DMA1", "PE_GEMM", "PE_MATH"]
    assert (util.busy_cycles["PE_DMA0"], util.busy_cycles["PE_DMA1"], util.stages["PE_GEMM"]) == (2 * dma, dma, 0)


def check_channels(run) -> None:
    """The op_log against an independent replay of the rule: DMA stages in (start, seq) order each take the
    lowest-numbered channel free at their start; no channel runs two stages at once; the pool never idles
    while a DMA stage is ready (ready treats the channels as one pool)."""
    log = run.op_log
    n = run.topology.dma_channels
    dma = log[log.stage.isin(DMA)].sort_values(["start", "seq"])
    assert (dma.end > dma.start).all()  # no zero-length transfer, so one pass per instant
    free = [0] * n
    for row in dma.itertuples():
        ch = min(i for i in range(n) if free[i] <= row.start)
        assert row.engine == f"PE_DMA{ch}", row
        free[ch] = row.end
    for row in dma.itertuples():
        if row.start > row.ready:  # every channel was busy from ready to start
            for ch in range(n):
                on = dma[dma.engine == f"PE_DMA{ch}"]
                covered = np.clip(np.minimum(on.end, row.start) - np.maximum(on.start, row.ready), 0, None).sum()
                assert covered == row.start - row.ready
    others = log[~log.stage.isin(DMA)]
    assert (others.engine.astype(str) == others.stage.map({"DISPATCH": "PE_CPU", "PLAN": "PE_SCHEDULER",
                                                           "FETCH": "PE_GEMM", "GEMM": "PE_GEMM",
                                                           "MATH": "PE_MATH"})).all()


@pytest.mark.parametrize("variant", ["opt2", "opt3"])
@pytest.mark.parametrize("policy", ["strict_fifo", "rw_aware"])
def test_two_channels_on_decode(variant, policy):
    run = decode.run(variant, kv_len=640, mode="timing", hazard_policy=policy, dma_channels=2).run
    check_channels(run)
    check_plan_rules(run)
    assert {"PE_DMA0", "PE_DMA1"} <= set(run.op_log.engine.astype(str))


@pytest.mark.parametrize("seed", RANDOM_SEEDS)
@pytest.mark.parametrize("policy", ["strict_fifo", "rw_aware"])
def test_two_channels_on_random_programs_keep_program_order_semantics(seed, policy):
    """In data mode, with transfers overlapping on two channels, the numbers still equal a sequential
    interpretation of the program, and timing mode schedules the very same stages."""
    steps = make_program(seed, n_steps=14)
    run, data = build_and_run(steps, seed, hazard_policy=policy, dma_channels=2)
    check_channels(run)
    assert (run.op_log.engine == "PE_DMA1").any()  # transfers did overlap
    check_plan_rules(run)
    for name, ref in interpret(steps, data).items():
        scale = max(1.0, float(np.abs(ref).max()))
        np.testing.assert_allclose(run.read(name).astype(np.float32), ref, rtol=1e-4, atol=1e-4 * scale,
                                   err_msg=name)
    timing, _ = build_and_run(steps, seed, mode="timing", hazard_policy=policy, dma_channels=2)
    assert timing.to_csv() == run.to_csv()


def test_two_channels_are_deterministic():
    def once():
        r = decode.run("opt3", kv_len=1024, mode="timing", dma_channels=2).run
        return r.to_csv(), json.dumps(r.to_perfetto())

    assert once() == once()
    steps = make_program(4, 14)
    a, _ = build_and_run(steps, 4, mode="timing", dma_channels=2)
    b, _ = build_and_run(steps, 4, mode="timing", dma_channels=2)
    assert a.to_csv() == b.to_csv()


def test_each_channel_is_its_own_track():
    run = decode.run("opt2", kv_len=1024, mode="timing", dma_channels=2).run
    log = run.op_log
    trace = run.to_perfetto()
    names = {e["tid"]: e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "thread_name"}
    assert list(names.values()) == ["PE_CPU", "PE_SCHEDULER", "PE_DMA0", "PE_DMA1", "PE_GEMM", "PE_MATH"]
    xs = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert [names[e["tid"]] for e in xs] == list(log.engine.astype(str))
    ax = plots.gantt(log)
    assert [t.get_text() for t in ax.get_yticklabels()] == list(names.values())
    # and the CSV round trip keeps the channels, in track order
    back = read_csv(io.StringIO(run.to_csv()))
    pd.testing.assert_frame_equal(back, log)


def test_what_if_speeds_up_every_channel():
    run = decode.run("opt2", kv_len=512, mode="timing", dma_channels=2).run
    wi = analysis.what_if(run, engine="PE_DMA", speedup=1).iloc[0]
    assert wi.cycles == run.cycles
