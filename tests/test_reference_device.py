"""The cycle-stepped device reference (tests/reference_device.py) on hand-computed cases, and its invariants
on random graphs. Every expected cycle below is worked out in the comments from DESIGN §14's flow rule."""

from __future__ import annotations

import math
import random
from fractions import Fraction

import pytest

from reference_device import DeviceGraph, Stage, exact, random_device_graph, simulate  # tests/ is on sys.path

INF = math.inf


def dma(pe: int, nbytes: int, channel: int = 0, deps: tuple[int, ...] = (), unit: str = "PE_DMA") -> Stage:
    return Stage((pe, unit), deps, nbytes=nbytes, channel=channel)


def op(pe: int, dur: int, deps: tuple[int, ...] = (), unit: str = "PE_CPU") -> Stage:
    return Stage((pe, unit), deps, dur=dur)


def graph(stages, *, base, rate, bw, capacity=None, release=None) -> DeviceGraph:
    cap = {st.resource: 1 for st in stages}
    cap.update(capacity or {})
    return DeviceGraph(stages, cap, dma_base_cycles=base, dma_bytes_per_cycle=rate,
                       channel_bytes_per_cycle=bw, release=release or {})


def ceil_div(a, b) -> int:
    return math.ceil(Fraction(a) / Fraction(b))


# 1. two PEs on one channel, starting together ----------------------------------------------------------

def test_two_pes_share_one_channel():
    # base 10, rate 64, channel 40 (< 2 x 64). Both start at 0 and join at 10.
    # k = 2: each advances min(64, 40/2) = 20 bytes/cycle. 1010 / 20 = 50.5 -> 51 cycles -> end 10 + 51 = 61.
    r = simulate(graph([dma(0, 1010), dma(1, 1010)], base=10, rate=64, bw=40))
    assert r.start == [0, 0]
    assert r.data_start == {0: 10, 1: 10}
    assert r.end == [61, 61]
    # 50 full cycles of 40 bytes, then the last cycle [60, 61): each needs 1010 - 1000 = 10 -> 20 moved
    assert all(r.moved[0][t] == 40 for t in range(10, 60)) and r.moved[0][60] == 20
    assert set(r.flows[0].values()) == {2}


def test_two_pes_unequal_sizes():
    # 600 and 1000 bytes, base 10, rate 64, channel 40. Shared: 20 each.
    # PE0: 600 / 20 = 30 cycles -> ends 10 + 30 = 40. PE1 then has 600, needs 400 alone at min(64, 40) = 40:
    # 10 cycles -> ends 50.
    r = simulate(graph([dma(0, 600), dma(1, 1000)], base=10, rate=64, bw=40))
    assert r.end == [40, 50]


def test_three_flows_exact_thirds():
    # channel 32, rate 16, base 5, three PEs of 64 bytes: each advances min(16, 32/3) = 32/3 per cycle.
    # 64 / (32/3) = 6 exactly -> end 5 + 6 = 11 (floating point could land a hair short of 64 and add a cycle).
    r = simulate(graph([dma(p, 64) for p in range(3)], base=5, rate=16, bw=32))
    assert r.end == [11, 11, 11]
    assert [r.moved[0][t] for t in range(5, 11)] == [32] * 6
    assert r.flow_bytes == {0: 64, 1: 64, 2: 64}


def test_fractional_channel_taken_as_written():
    # channel 40.5 = 81/2: two flows of 81 bytes, base 0, rate 64 -> 81/4 = 20.25 each; 81 / 20.25 = 4 -> end 4.
    r = simulate(graph([dma(0, 81), dma(1, 81)], base=0, rate=64, bw=40.5))
    assert r.end == [4, 4]
    assert exact(40.5) == Fraction(81, 2) and exact(0.1) == Fraction(1, 10) and exact(INF) is None


# 2. staggered ------------------------------------------------------------------------------------------

def test_staggered_alone_shared_alone():
    # base 10, rate 64, channel 40.
    # PE0: A = 6000 bytes, starts 0, joins 10, alone at 40/cycle.
    # PE1: a 100-cycle CPU stage, then B = 3000 bytes: starts 100, joins 110.
    # By 110, A advanced 100 x 40 = 4000; 2000 left at 20/cycle -> 100 cycles -> A ends 210.
    # By 210, B advanced 100 x 20 = 2000; 1000 left alone at 40/cycle -> 25 cycles -> B ends 235.
    stages = [dma(0, 6000), op(1, 100), dma(1, 3000, deps=(1,))]
    r = simulate(graph(stages, base=10, rate=64, bw=40))
    assert r.start == [0, 0, 100]
    assert r.data_start == {0: 10, 2: 110}
    assert r.end == [210, 100, 235]
    k = r.flows[0]
    assert [k[t] for t in (10, 109, 110, 209, 210, 234)] == [1, 1, 2, 2, 1, 1]
    assert 235 not in k and 9 not in k
    # the channel is saturated from 10 to 235: 225 x 40 = 9000 = 6000 + 3000
    assert all(v == 40 for v in r.moved[0].values()) and len(r.moved[0]) == 225


# 3. a partial last cycle: the unused bandwidth is not handed over --------------------------------------

def test_partial_last_cycle_is_not_handed_over():
    # base 0, rate 64, channel 40; A = 30 and B = 90 bytes on two PEs, both from cycle 0.
    # [0,1): k = 2, 20 each              -> A 20, B 20
    # [1,2): k = 2, A needs only 10 but still counts; B gets 20, not 30  -> A 30 (ends at 2), B 40
    # [2,3): B alone, 40                  -> B 80
    # [3,4): B needs 10                   -> B 90, ends at 4
    # (had A's unused 10 gone to B at [1,2), B would have 50, 90 at cycle 3 and end at 3.)
    r = simulate(graph([dma(0, 30), dma(1, 90)], base=0, rate=64, bw=40))
    assert r.end == [2, 4]
    assert r.moved[0] == {0: 40, 1: 30, 2: 40, 3: 10}
    assert r.flows[0] == {0: 2, 1: 2, 2: 1, 3: 1}


def test_join_and_leave_at_the_same_cycle():
    # base 0, rate 64, channel 40. A = 40 bytes from 0; C = 40 bytes behind a 1-cycle CPU stage on PE1.
    # [0,1): A alone, 40 -> A 40, ends at 1. C starts at 1 and joins at 1: A's leave and C's join change
    # no end at 1. [1,2): C alone, 40 -> ends at 2.
    r = simulate(graph([dma(0, 40), op(1, 1), dma(1, 40, deps=(1,))], base=0, rate=64, bw=40))
    assert r.end == [1, 1, 2]
    assert r.flows[0] == {0: 1, 1: 1}


# 4. 0 bytes, the inf channel, two DMA units of one PE --------------------------------------------------

def test_zero_byte_transfer_ends_at_its_data_phase_start_without_joining():
    # base 10, rate 64, channel 40. PE0 moves 0 bytes: starts 0, ends 10, never a flow; its dependant
    # (a 5-cycle CPU stage) runs 10..15. PE1 moves 400 alone: 400 / 40 = 10 -> ends 20 (had the 0-byte
    # transfer joined for [10,11), PE1 would get 20 there and end at 21).
    stages = [dma(0, 0), dma(1, 400), op(0, 5, deps=(0,))]
    r = simulate(graph(stages, base=10, rate=64, bw=40))
    assert r.end == [10, 20, 15] and r.start[2] == 10
    assert r.data_start[0] == 10 and 0 not in r.flow_bytes
    assert set(r.flows[0].values()) == {1}


def test_zero_cycle_stages_resolve_within_the_cycle():
    # base 0: a 0-byte DMA starts and ends at 0, then a 0-cycle CPU stage behind it, then a 7-cycle one:
    # all three start at 0. On a 1-unit GEMM, a 0-cycle stage (seq 3) frees its unit at 0 for seq 4.
    stages = [dma(0, 0), op(0, 0, deps=(0,)), op(0, 7, deps=(1,), unit="PE_MATH"),
              op(0, 0, unit="PE_GEMM"), op(0, 3, unit="PE_GEMM")]
    r = simulate(graph(stages, base=0, rate=64, bw=40))
    assert r.start == [0, 0, 0, 0, 0]
    assert r.end == [0, 0, 7, 0, 3]


def test_inf_channel_is_base_plus_ceil():
    # channel inf: 200 + ceil(1000 / 64) = 200 + ceil(15.625) = 216, however many flows share it
    r = simulate(graph([dma(p, 1000) for p in range(4)], base=200, rate=64, bw=INF))
    assert r.end == [216] * 4
    rng = random.Random(7)
    for _ in range(50):
        b, base, rate = rng.randint(0, 5000), rng.randint(0, 30), rng.choice([8, 16, 64])
        n = rng.randint(1, 4)
        r = simulate(graph([dma(p, b) for p in range(n)], base=base, rate=rate, bw=INF))
        assert r.end == [base + ceil_div(b, rate)] * n


def test_alone_on_a_finite_channel():
    # alone: base + ceil(b / min(rate, bw)); e.g. 200 + ceil(1000 / 40) = 225, 200 + ceil(1000 / 64) = 216
    assert simulate(graph([dma(0, 1000)], base=200, rate=64, bw=40)).end == [225]
    assert simulate(graph([dma(0, 1000)], base=200, rate=64, bw=100)).end == [216]


def test_two_dma_units_of_one_pe_share_like_two_pes():
    # PE0's PE_DMA has 2 units: exactly test_two_pes_share_one_channel's 61, 61.
    two_units = graph([dma(0, 1010), dma(0, 1010)], base=10, rate=64, bw=40, capacity={(0, "PE_DMA"): 2})
    assert simulate(two_units).end == [61, 61]
    # with 1 unit they run one after the other, alone: 10 + ceil(1010 / 40) = 10 + 26 = 36; then 36 + 36 = 72
    one_unit = simulate(graph([dma(0, 1010), dma(0, 1010)], base=10, rate=64, bw=40))
    assert one_unit.start == [0, 36] and one_unit.end == [36, 72]


def test_lowest_seq_first_and_release():
    # one CPU unit: seq 1 and 2 are both ready at 4 (behind seq 0); seq 1 goes first (4..9), seq 2 at 9..11.
    # seq 3 has release 50 and no deps: it starts at 50 on its own MATH unit.
    stages = [op(0, 4), op(0, 5, deps=(0,)), op(0, 2, deps=(0,)), op(0, 1, unit="PE_MATH")]
    r = simulate(graph(stages, base=0, rate=64, bw=40, release={3: 50}))
    assert r.start == [0, 4, 9, 50] and r.end == [4, 9, 11, 51]


def test_bad_graphs_are_refused():
    with pytest.raises(ValueError, match="capacity"):
        simulate(DeviceGraph([op(0, 1)], {}, 0, 64))
    with pytest.raises(ValueError, match="stuck"):
        simulate(graph([op(0, 1, deps=(1,)), op(0, 1, deps=(0,))], base=0, rate=64, bw=40))


# 5. invariants on random graphs ------------------------------------------------------------------------

def _check_invariants(g: DeviceGraph) -> None:
    r = simulate(g)
    st = g.stages
    n = len(st)
    rate, bw = exact(g.dma_bytes_per_cycle), exact(g.channel_bytes_per_cycle)
    alone_rate = rate if bw is None else min(rate, bw)
    ready_at = [max([g.release.get(s, 0)] + [r.end[d] for d in st[s].deps]) for s in range(n)]

    # every stage starts after its deps ended and its release; durations and data phases as the rules say
    for s in range(n):
        assert r.start[s] >= ready_at[s]
        if not st[s].is_dma:
            assert r.end[s] == r.start[s] + st[s].dur
            continue
        assert r.data_start[s] == r.start[s] + g.dma_base_cycles
        if st[s].nbytes == 0:
            assert r.end[s] == r.data_start[s] and s not in r.flow_bytes
        else:
            assert r.flow_bytes[s] == st[s].nbytes  # each flow moves exactly its bytes
            alone = math.ceil(st[s].nbytes / alone_rate)
            assert r.end[s] - r.data_start[s] >= alone
            if all(r.flows[st[s].channel][t] == 1 for t in range(r.data_start[s], r.end[s])):
                assert r.end[s] - r.data_start[s] == alone

    # per channel: each cycle moves at most the bandwidth (and k x rate); the flow counts match the stages
    channels = {st[s].channel for s in range(n) if st[s].is_dma}
    for c in channels:
        on_c = [s for s in range(n) if st[s].is_dma and st[s].channel == c and st[s].nbytes > 0]
        assert sum(r.moved.get(c, {}).values()) == sum(st[s].nbytes for s in on_c)
        for t, v in r.moved.get(c, {}).items():
            assert isinstance(v, Fraction) and 0 < v <= rate * r.flows[c][t]
            assert bw is None or v <= bw
        span = range(max(r.end) + 1)
        counts = {t: sum(r.data_start[s] <= t < r.end[s] for s in on_c) for t in span}
        assert {t: k for t, k in counts.items() if k} == r.flows.get(c, {})

    # per resource: never more running than its units; a ready stage waits only while all units are busy;
    # a stage ready strictly before t is never overtaken at t by a higher seq on its resource
    for res, cap in g.capacity.items():
        mine = [s for s in range(n) if st[s].resource == res]
        busy = [sum(r.start[s] <= t < r.end[s] for s in mine) for t in range(max(r.end) + 1)]
        assert max(busy) <= cap
        for s in mine:
            assert all(busy[t] == cap for t in range(ready_at[s], r.start[s]))
            for u in mine:
                if u > s and ready_at[s] < r.start[u] < r.start[s]:
                    pytest.fail(f"seq {u} overtook seq {s} at {r.start[u]}")


@pytest.mark.parametrize("chunk", range(4))
def test_invariants_on_random_graphs(chunk):
    for seed in range(chunk * 50, chunk * 50 + 50):  # 200 graphs in all
        g = random_device_graph(seed, cross_pe_deps=seed % 2 == 1)
        try:
            _check_invariants(g)
        except AssertionError as e:
            raise AssertionError(f"seed {seed}") from e


def test_random_graphs_are_seeded_and_varied():
    a, b = random_device_graph(3), random_device_graph(3)
    assert a == b
    gs = [random_device_graph(s) for s in range(200)]
    sizes = [len(g.stages) for g in gs]
    assert min(sizes) >= 5 and max(sizes) <= 40 and min(sizes) <= 7 and max(sizes) >= 38
    assert {g.channel_bytes_per_cycle for g in gs} == {10, 32, 40.5, 64, INF}
    assert any(st.is_dma and st.nbytes == 0 for g in gs for st in g.stages)
    assert any(not st.is_dma and st.dur == 0 for g in gs for st in g.stages)
    assert all(d < s for g in gs for s, st in enumerate(g.stages) for d in st.deps)
