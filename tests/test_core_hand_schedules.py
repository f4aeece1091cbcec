"""Whole schedules computed by hand from the DESIGN latency formulas (§1, §4, §5).

Every expected number below is written as the arithmetic of the formula that
produces it, with a comment naming the rule. The default topology is used
unless a test overrides a key (then the comment says so):

    dispatch  = FIXED x segments + ceil(R x logical_bytes)     FIXED 40, R 0.0625, cap 1024
    plan      = 8 + 2 x len(cmd.ops)                           (a DmaCmd counts as one op)
    DMA       = 200 + ceil(bytes / 64)
    FETCH     = ceil(bytes / 128)
    GEMM tile = 16 + ceil(tm/32) x ceil(tn/32) x tk
    MATH      = 8 + ceil(n_elements / 64) x cost   (+ ceil(log2(row_len)) for row reductions; cost 4 for exp)

logical bytes (§4): a DmaCmd is 8 + 2 x 8 = 24; an op is 8 + 8 x handles + 4 x scalars.
"""

from __future__ import annotations

import math

import kbwork

ceil = math.ceil


def rows(run) -> list[tuple]:
    log = run.op_log
    return list(zip(log.stage, log.engine, log.cmd, log.start, log.end))


def assert_schedule(run, expected: list[tuple]) -> None:
    got = rows(run)
    assert len(got) == len(expected), "\n" + run.op_log.to_string()
    for seq, (g, e) in enumerate(zip(got, expected)):
        assert tuple(g) == tuple(e), f"seq {seq}: got {g}, expected {e}\n{run.op_log.to_string()}"


def test_one_gemm_tile_with_a_loaded_and_b_streamed():
    """cmd 0: tl.load(A) (A is 16x64 bf16); cmd 1: gemm(a=A_tcm, b=tl.ref(B) 64x96 bf16, out=C 16x96 fp32 HBM).

    One output tile (16 <= 32 rows, 96 <= 128 cols) and one k-tile (64 <= 128).
    cmd 1 reads A_tcm, which cmd 0 is still writing when cmd 1's PLAN ends, so strict FIFO holds it
    until cmd 0 completes; only then does the B DMA_READ start. A is pinned, so it gets no DMA_READ.
    """
    sim = kbwork.Simulator(mode="timing")
    a = sim.hbm("A", shape=(16, 64), dtype="bf16")
    b = sim.hbm("B", shape=(64, 96), dtype="bf16")
    c = sim.hbm("C", shape=(16, 96), dtype="fp32")

    def kernel(tl):
        a_t = tl.load(a)
        tl.composite(op="gemm", a=a_t, b=tl.ref(b), out=c)

    run = sim.run(kernel)

    d0 = (0, 0 + 40 + ceil(0.0625 * 24))                   # DmaCmd: 24 logical bytes -> 42
    p0 = (d0[1], d0[1] + 8 + 2 * 1)                         # PLAN of a DmaCmd (one op)
    r0 = (p0[1], p0[1] + 200 + ceil(16 * 64 * 2 / 64))      # DMA_READ A: 2048 B
    lb1 = 8 + 8 * 3 + 4 * 4                                 # gemm: a, b, out + m, k, n, trans_b = 48
    d1 = (d0[1], d0[1] + 40 + ceil(0.0625 * lb1))           # PE_CPU free at 42, queue not full
    p1 = (max(d1[1], p0[1]), max(d1[1], p0[1]) + 8 + 2 * 1)  # after its DISPATCH and the previous PLAN
    assert p1[1] < r0[1]                                    # cmd 0 still in flight: hazard on A_tcm, hold
    b_bytes = 64 * 96 * 2
    rb = (r0[1], r0[1] + 200 + ceil(b_bytes / 64))          # released when cmd 0 completes
    f_bytes = 16 * 64 * 2 + b_bytes                         # FETCH a-tile + b-tile from TCM
    f = (rb[1], rb[1] + ceil(f_bytes / 128))
    g = (f[1], f[1] + 16 + ceil(16 / 32) * ceil(96 / 32) * 64)
    w = (g[1], g[1] + 200 + ceil(16 * 96 * 4 / 64))         # DMA_WRITE the fp32 tile to HBM

    assert_schedule(run, [
        ("DISPATCH", "PE_CPU", 0, *d0),
        ("PLAN", "PE_SCHEDULER", 0, *p0),
        ("DMA_READ", "PE_DMA", 0, *r0),
        ("DISPATCH", "PE_CPU", 1, *d1),
        ("PLAN", "PE_SCHEDULER", 1, *p1),
        ("DMA_READ", "PE_DMA", 1, *rb),
        ("FETCH", "PE_GEMM", 1, *f),
        ("GEMM", "PE_GEMM", 1, *g),
        ("DMA_WRITE", "PE_DMA", 1, *w),
    ])
    # the literal numbers, for a reader who wants to see them
    assert [e for *_, e in rows(run)] == [42, 52, 284, 85, 95, 676, 788, 996, 1292]
    log = run.op_log
    assert list(log.tensor) == ["", "", "A", "", "", "B", "A_tcm|B", "", "C"]
    assert list(log.bytes) == [24, 0, 2048, 48, 0, 12288, 14336, 0, 6144]
    assert run.cycles == 1292


def test_dependent_composites_hold_under_strict_fifo():
    """cmd 0: exp_diff(x 64x256, col 64x1) -> e;  cmd 1: rsum(e) -> s (reads cmd 0's out);
    cmd 2: fill z (8x64), independent of both.

    cmd 1's PLAN ends long before cmd 0's MATH does, so cmd 1 is held until cmd 0 completes;
    under strict FIFO the scheduler also takes no later command meanwhile, so cmd 2's PLAN waits
    for the hold to clear even though cmd 2 conflicts with nothing.
    """
    sim = kbwork.Simulator(mode="timing")

    def kernel(tl):
        x = tl.alloc((64, 256), "fp32", name="x")
        col = tl.alloc((64, 1), "fp32", name="col")
        e = tl.alloc((64, 256), "fp32", name="e")
        s = tl.alloc((64, 1), "fp32", name="s")
        z = tl.alloc((8, 64), "fp32", name="z")
        tl.composite(op="math", math_op="exp_diff", a=x, b=col, out=e)
        tl.composite(op="math", math_op="rsum", a=e, out=s)
        tl.composite(op="math", math_op="fill", out=z, value=0.0)

    run = sim.run(kernel)

    d0 = (0, 40 + ceil(0.0625 * (8 + 8 * 3)))                 # exp_diff: a, b, out = 32 B -> 42
    p0 = (d0[1], d0[1] + 8 + 2 * 1)
    m0 = (p0[1], p0[1] + 8 + ceil(64 * 256 / 64) * 4)          # 16384 elements, exp cost 4 -> 1032
    d1 = (d0[1], d0[1] + 40 + ceil(0.0625 * (8 + 8 * 2)))     # rsum: a, out = 24 B -> 42
    p1 = (d1[1], d1[1] + 8 + 2 * 1)
    assert p1[1] < m0[1]                                       # conflict with in-flight cmd 0: held
    m1 = (m0[1], m0[1] + 8 + ceil(64 * 256 / 64) * 1 + ceil(math.log2(256)))  # row reduction of 256
    d2 = (d1[1], d1[1] + 40 + ceil(0.0625 * (8 + 8 * 1 + 4 * 1)))  # fill: out + value = 20 B -> 42
    p2 = (m0[1], m0[1] + 8 + 2 * 1)                            # planned only once the hold clears
    m2 = (m1[1], m1[1] + 8 + ceil(8 * 64 / 64) * 1)            # ready at p2 end, PE_MATH busy with rsum

    assert_schedule(run, [
        ("DISPATCH", "PE_CPU", 0, *d0),
        ("PLAN", "PE_SCHEDULER", 0, *p0),
        ("MATH", "PE_MATH", 0, *m0),
        ("DISPATCH", "PE_CPU", 1, *d1),
        ("PLAN", "PE_SCHEDULER", 1, *p1),
        ("MATH", "PE_MATH", 1, *m1),
        ("DISPATCH", "PE_CPU", 2, *d2),
        ("PLAN", "PE_SCHEDULER", 2, *p2),
        ("MATH", "PE_MATH", 2, *m2),
    ])
    assert [s for _, _, _, s, _ in rows(run)] == [0, 42, 52, 42, 84, 1084, 84, 1084, 1356]
    assert run.cycles == 1372


def test_rw_aware_plans_the_independent_command_during_the_hold():
    """The same program under hazard_policy="rw_aware": cmd 1 still waits for cmd 0, but cmd 2
    (no conflict) is planned right away. Its MATH then queues behind cmd 0's on PE_MATH, and when
    cmd 0 completes both rsum (seq 5) and fill (seq 8) are ready: the lower seq goes first."""
    sim = kbwork.Simulator(mode="timing", hazard_policy="rw_aware")

    def kernel(tl):
        x = tl.alloc((64, 256), "fp32", name="x")
        col = tl.alloc((64, 1), "fp32", name="col")
        e = tl.alloc((64, 256), "fp32", name="e")
        s = tl.alloc((64, 1), "fp32", name="s")
        z = tl.alloc((8, 64), "fp32", name="z")
        tl.composite(op="math", math_op="exp_diff", a=x, b=col, out=e)
        tl.composite(op="math", math_op="rsum", a=e, out=s)
        tl.composite(op="math", math_op="fill", out=z, value=0.0)

    run = sim.run(kernel)
    d0, p0 = (0, 42), (42, 52)                                 # as in the strict_fifo test
    m0 = (52, 52 + 8 + 256 * 4)                                # exp_diff: 1084
    d1, p1 = (42, 84), (84, 94)
    m1 = (m0[1], m0[1] + 8 + 256 + 8)                          # rsum, released at cmd 0's completion
    d2 = (84, 84 + 40 + ceil(0.0625 * 20))
    p2 = (max(d2[1], p1[1]), max(d2[1], p1[1]) + 10)           # not held back by cmd 1's hold
    m2 = (m1[1], m1[1] + 8 + 8)                                # ready at 136, but PE_MATH is busy, then rsum first
    assert_schedule(run, [
        ("DISPATCH", "PE_CPU", 0, *d0), ("PLAN", "PE_SCHEDULER", 0, *p0), ("MATH", "PE_MATH", 0, *m0),
        ("DISPATCH", "PE_CPU", 1, *d1), ("PLAN", "PE_SCHEDULER", 1, *p1), ("MATH", "PE_MATH", 1, *m1),
        ("DISPATCH", "PE_CPU", 2, *d2), ("PLAN", "PE_SCHEDULER", 2, *p2), ("MATH", "PE_MATH", 2, *m2),
    ])
    assert p2 == (126, 136)


def test_double_buffered_k_tiles_wait_for_the_fetch_two_reads_back():
    """gemm(a=A 32x384 bf16 from HBM, b=tl.load(B 384x128 bf16), out=C 32x128 fp32 HBM), three k-tiles,
    with fetch_bytes_per_cycle overridden to 16 so the FETCHes are slow: the third A DMA_READ lands
    in the staging buffer of the first and must wait for k-tile 0's FETCH to end (tile_buffers = 2)."""
    sim = kbwork.Simulator(mode="timing", fetch_bytes_per_cycle=16)
    a = sim.hbm("A", shape=(32, 384), dtype="bf16")
    b = sim.hbm("B", shape=(384, 128), dtype="bf16")
    c = sim.hbm("C", shape=(32, 128), dtype="fp32")

    def kernel(tl):
        tl.composite(op="gemm", a=a, b=tl.load(b), out=c)

    run = sim.run(kernel)

    d0 = (0, 40 + ceil(0.0625 * 24))
    p0 = (d0[1], d0[1] + 10)
    rB = (p0[1], p0[1] + 200 + ceil(384 * 128 * 2 / 64))       # load B: 98304 B -> 1736 cycles
    d1 = (d0[1], d0[1] + 40 + ceil(0.0625 * 48))
    p1 = (d1[1], d1[1] + 10)                                   # held: cmd 1 reads B_tcm, cmd 0 writes it
    a_dma = 200 + ceil(32 * 128 * 2 / 64)                      # one A k-tile: 8192 B -> 328
    fetch = ceil((32 * 128 * 2 + 128 * 128 * 2) / 16)          # 40960 B at 16 B/cycle -> 2560
    gemm = 16 + ceil(32 / 32) * ceil(128 / 32) * 128           # 528
    ra0 = (rB[1], rB[1] + a_dma)                               # released when cmd 0 completes
    f0 = (ra0[1], ra0[1] + fetch)
    ra1 = (ra0[1], ra0[1] + a_dma)                             # second buffer: free, DMA engine next
    ra2 = (f0[1], f0[1] + a_dma)                               # buffer 0 again: waits for FETCH k0
    g0 = (f0[1], f0[1] + gemm)                                 # GEMM k0 (seq 7) beats FETCH k1 (seq 9)
    f1 = (g0[1], g0[1] + fetch)
    g1 = (f1[1], f1[1] + gemm)                                 # GEMM k1 (seq 10) beats FETCH k2 (seq 12)
    f2 = (g1[1], g1[1] + fetch)
    g2 = (f2[1], f2[1] + gemm)
    w = (g2[1], g2[1] + 200 + ceil(32 * 128 * 4 / 64))

    assert_schedule(run, [
        ("DISPATCH", "PE_CPU", 0, *d0),
        ("PLAN", "PE_SCHEDULER", 0, *p0),
        ("DMA_READ", "PE_DMA", 0, *rB),
        ("DISPATCH", "PE_CPU", 1, *d1),
        ("PLAN", "PE_SCHEDULER", 1, *p1),
        ("DMA_READ", "PE_DMA", 1, *ra0),
        ("FETCH", "PE_GEMM", 1, *f0),
        ("GEMM", "PE_GEMM", 1, *g0),
        ("DMA_READ", "PE_DMA", 1, *ra1),
        ("FETCH", "PE_GEMM", 1, *f1),
        ("GEMM", "PE_GEMM", 1, *g1),
        ("DMA_READ", "PE_DMA", 1, *ra2),
        ("FETCH", "PE_GEMM", 1, *f2),
        ("GEMM", "PE_GEMM", 1, *g2),
        ("DMA_WRITE", "PE_DMA", 1, *w),
    ])
    assert ra2[0] > ra1[1]  # the buffer rule, not the DMA engine, set that start
    log = run.op_log
    assert list(log.k_tile) == [-1, -1, -1, -1, -1, 0, 0, 0, 1, 1, 1, 2, 2, 2, -1]
    assert run.cycles == 11836
