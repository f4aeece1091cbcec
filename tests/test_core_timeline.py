"""Op_log invariants of the timeline (DESIGN §4, §5, §6).

``check_invariants`` recomputes every rule from the DESIGN text and the
run's own op_log / static program, never by calling the library's cost
functions. It runs on every bench and on seeded random programs, whose data
mode results are also compared against a sequential numpy interpretation of
the same command list (hazards must make the pipelined run equal program
order).
"""

from __future__ import annotations

import math
from fractions import Fraction

import ml_dtypes
import numpy as np
import pandas as pd
import pytest

import kbwork
from kbwork import DmaCmd, OpSpec, Scope
from kbwork.kernels.gemm import BENCHES

COLUMNS = ["seq", "pe", "cmd", "iter", "label", "stage", "engine", "op_kind", "phase", "tile", "k_tile", "tensor",
           "bytes", "ready", "start", "end"]
INT_COLUMNS = ["seq", "pe", "cmd", "iter", "tile", "k_tile", "bytes", "ready", "start", "end"]
ENGINE_OF = {"DISPATCH": "PE_CPU", "PLAN": "PE_SCHEDULER", "DMA_READ": "PE_DMA", "FETCH": "PE_GEMM",
             "GEMM": "PE_GEMM", "MATH": "PE_MATH", "DMA_WRITE": "PE_DMA"}
PHASES = {"dispatch", "plan", "prologue", "tile", "k_epilogue", "tile_epilogue", "post", "single"}
#: DESIGN §4: "A GEMM op ships four scalars (m, k, n, trans_b); scale and fill ship one; the other MATH ops ship none."
SCALARS = {"gemm": 4, "scale": 1, "fill": 1}


def design_logical_bytes(cmd) -> int:
    """DESIGN §4, computed from the command's ops (not by the library)."""
    if isinstance(cmd, DmaCmd):
        return 8 + 2 * 8
    total = 0
    for op in cmd.ops:
        n_handles = len(op.operands) + (op.out is not None)
        total += 8 + 8 * n_handles + 4 * SCALARS.get(op.kind, 0)
    return total


def design_dispatch_cycles(lb: int, topo) -> int:
    r = Fraction(str(topo.r_cycles_per_byte))
    segments = max(1, -(-lb // topo.max_composite_logical_bytes))
    return topo.fixed_cycles * segments + math.ceil(r * lb)


def completions(log: pd.DataFrame) -> pd.Series:
    """Per command, the end of its last stage."""
    return log.groupby("cmd").end.max()


def check_invariants(run) -> None:
    log, prog, topo = run.op_log, run.program, run.topology
    n_cmd = len(prog.commands)
    # --- schema (DESIGN §6) ------------------------------------------------------------------
    assert list(log.columns) == COLUMNS
    for col in INT_COLUMNS:
        assert log[col].dtype == np.int64, col
    assert list(log.seq) == list(range(len(log)))
    assert set(log.phase) <= PHASES
    assert (log.engine == log.stage.map(ENGINE_OF)).all()
    start, end = log.start.to_numpy(), log.end.to_numpy()
    assert (start >= 0).all() and (end >= start).all()
    assert run.cycles == end.max()
    # --- one engine, one stage at a time --------------------------------------------------------
    for engine, g in log.groupby("engine"):
        order = np.lexsort((g.end.to_numpy(), g.start.to_numpy()))
        s, e = g.start.to_numpy()[order], g.end.to_numpy()[order]
        bad = np.nonzero(s[1:] < e[:-1])[0]
        assert bad.size == 0, f"{engine}: stages overlap at {g.iloc[order[bad[0]]].seq}"
    # --- static dependencies --------------------------------------------------------------------
    for seq, preds in enumerate(prog.table.preds):
        for p in preds:
            assert start[seq] >= end[p], f"seq {seq} starts at {start[seq]} before its dependency {p} ends ({end[p]})"
    # --- DISPATCH: program order, FIXED x segments + ceil(R x bytes) ------------------------------
    d = log[log.stage == "DISPATCH"]
    assert list(d.cmd) == list(range(n_cmd))
    assert (d.start.to_numpy()[1:] >= d.end.to_numpy()[:-1]).all()
    for (_, row), cmd in zip(d.iterrows(), prog.commands):
        lb = design_logical_bytes(cmd)
        assert row.bytes == lb, (row.cmd, row.bytes, lb)
        assert row.end - row.start == design_dispatch_cycles(lb, topo), row.cmd
    # --- PLAN: dispatch order, after its DISPATCH, 8 + 2 x len(ops) -------------------------------
    p = log[log.stage == "PLAN"]
    assert list(p.cmd) == list(range(n_cmd))
    assert (p.start.to_numpy() >= d.end.to_numpy()).all()
    assert (p.start.to_numpy()[1:] >= p.end.to_numpy()[:-1]).all()
    n_ops = np.array([1 if isinstance(c, DmaCmd) else len(c.ops) for c in prog.commands])
    assert (p.end.to_numpy() - p.start.to_numpy() == topo.plan_base_cycles + topo.plan_cycles_per_op * n_ops).all()
    # --- a command's plan stages start after its PLAN ends -----------------------------------------
    rest = log[~log.stage.isin(["DISPATCH", "PLAN"])]
    assert set(rest.cmd) == set(range(n_cmd)), "every command has at least one plan stage"
    plan_end = p.end.to_numpy()[rest.cmd.to_numpy()]
    assert (rest.start.to_numpy() >= plan_end).all()
    # --- DMA and FETCH latencies (DESIGN §1) -------------------------------------------------------
    dma = log[log.stage.isin(["DMA_READ", "DMA_WRITE"])]
    want = topo.dma_base_cycles + -(-dma.bytes // topo.dma_bytes_per_cycle)
    assert (dma.end - dma.start == want).all()
    fetch = log[log.stage == "FETCH"]
    assert (fetch.end - fetch.start == -(-fetch.bytes // topo.fetch_bytes_per_cycle)).all()
    check_plan_rules(run)
    check_hazards(run)


def check_plan_rules(run) -> None:
    """DESIGN §5's within-command rules, read off the op_log alone (not from the static preds)."""
    log = run.op_log
    buffers = run.topology.tile_buffers
    for c, g in log.groupby("cmd"):
        g = g[~g.stage.isin(["DISPATCH", "PLAN"])]
        pro, post = g[g.phase == "prologue"], g[g.phase == "post"]
        loop = g[g.phase.isin(["tile", "k_epilogue", "tile_epilogue"])]
        for chained in (pro, post, g[g.phase == "single"]):
            assert (chained.start.to_numpy()[1:] >= chained.end.to_numpy()[:-1]).all(), c
        if len(pro):
            assert (loop.start >= pro.end.max()).all(), c      # tile 0 waits for the prologue
        if len(post):
            assert post.start.min() >= loop.end.max(), c       # post-loop waits for every tile
        fetches = loop[loop.stage == "FETCH"].sort_values("seq")
        for i, f in enumerate(fetches.itertuples()):
            step = loop[(loop.tile == f.tile) & (loop.k_tile == f.k_tile)]
            reads = step[step.stage == "DMA_READ"]
            assert (f.start >= reads.end).all(), c             # FETCH waits for its DMA_READs
            if i >= buffers:                                   # and a read reuses the buffer of step i - buffers
                assert (reads.start >= fetches.iloc[i - buffers].end).all(), c
            gemm = step[step.stage == "GEMM"].iloc[0]
            assert gemm.start >= f.end, c
            kepi = step[step.phase == "k_epilogue"]
            assert (kepi.start >= gemm.end).all() and (kepi.start.to_numpy()[1:] >= kepi.end.to_numpy()[:-1]).all()
            if f.k_tile > 0:                                   # same accumulator: after the previous k-tile
                prev = loop[(loop.tile == f.tile) & (loop.k_tile == f.k_tile - 1) & loop.stage.isin(["GEMM", "MATH"])]
                assert gemm.start >= prev.end.max(), c
        for t, tile in loop.groupby("tile"):
            body = tile[tile.k_tile >= 0]
            tepi = tile[tile.phase == "tile_epilogue"]
            assert (tepi.start >= body.end.max()).all(), c
            assert (tepi.start.to_numpy()[1:] >= tepi.end.to_numpy()[:-1]).all(), c
            write = tile[(tile.stage == "DMA_WRITE")]
            if len(write):
                assert write.start.iloc[0] >= tile[tile.stage != "DMA_WRITE"].end.max(), c


def _footprint(cmd):
    """Byte ranges read and written (DESIGN §5: every range the ops touch counts; rw_handles, outs and
    recipe scratch are writes)."""
    key = lambda h: (str(h.space), h.addr, h.addr + h.nbytes)  # noqa: E731
    if isinstance(cmd, DmaCmd):
        return [key(cmd.src)], [key(cmd.dst)]
    reads = [key(h) for op in cmd.ops for h in op.operands.values()]
    writes = ([key(op.out) for op in cmd.ops if op.out is not None] + [key(h) for h in cmd.rw_handles]
              + [key(h) for h in cmd.scratch])
    return reads, writes


def _overlap(xs, ys) -> bool:
    return any(s1 == s2 and lo1 < hi2 and lo2 < hi1 for s1, lo1, hi1 in xs for s2, lo2, hi2 in ys)


def check_hazards(run) -> None:
    """A command that conflicts with an earlier one never starts work before that one completes; under
    strict FIFO a held command waits for *every* earlier command and blocks later PLANs meanwhile."""
    log, cmds = run.op_log, run.program.commands
    done = completions(log).to_numpy()
    w = log[~log.stage.isin(["DISPATCH", "PLAN"])]
    first = w.groupby("cmd").start.min().to_numpy()
    plans = log[log.stage == "PLAN"]
    plan_start, plan_end = plans.start.to_numpy(), plans.end.to_numpy()
    fp = [_footprint(c) for c in cmds]
    strict = run.topology.hazard_policy == "strict_fifo"
    for c in range(len(cmds)):
        rc, wc = fp[c]
        held = False
        for o in range(c):
            ro, wo = fp[o]
            if _overlap(rc, wo) or _overlap(wc, wo) or _overlap(wc, ro):
                assert first[c] >= done[o], f"cmd {c} started before the conflicting cmd {o} completed"
                held |= done[o] > plan_end[c]
        if strict and held:
            assert first[c] >= done[:c].max()
            assert (plan_start[c + 1:] >= done[:c].max()).all()


# --- benches ------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(BENCHES))
@pytest.mark.parametrize("policy", ["strict_fifo", "rw_aware"])
def test_bench_invariants(name, policy):
    run = BENCHES[name](kbwork.Simulator(mode="timing", hazard_policy=policy)).run
    check_invariants(run)


@pytest.mark.parametrize("name", list(BENCHES))
def test_bench_runs_are_byte_identical(name):
    first = BENCHES[name](kbwork.Simulator(mode="timing")).run.to_csv()
    second = BENCHES[name](kbwork.Simulator(mode="timing")).run.to_csv()
    assert first == second
    assert first.startswith(",".join(COLUMNS) + "\n")
    assert "\r" not in first and first.endswith("\n")


def test_op_log_is_the_frame_the_public_constructor_builds():
    # oplog builds the frame through pandas' internal constructor for typed columns
    log = BENCHES["gemm_epilogues"](kbwork.Simulator(mode="timing")).run.op_log
    public = pd.DataFrame({c: log[c].array for c in log.columns})
    pd.testing.assert_frame_equal(log, public, check_exact=True)
    assert list(log.dtypes.astype(str)) == list(public.dtypes.astype(str))
    assert log.index.equals(pd.RangeIndex(len(log)))
    log.loc[0, "start"] = -5  # an ordinary, writable frame
    assert log.start.iloc[0] == -5


def test_csv_round_trips_and_is_written_to_a_path(tmp_path):
    from kbwork.oplog import read_csv

    run = BENCHES["gemm_epilogues"](kbwork.Simulator(mode="timing")).run
    path = tmp_path / "log.csv"
    text = run.to_csv(path)
    assert path.read_bytes() == text.encode()
    back = read_csv(path)
    pd.testing.assert_frame_equal(back, run.op_log, check_dtype=False)
    assert list(back.columns) == COLUMNS


# --- random programs ------------------------------------------------------------------------------
M, K, N = 40, 150, 136      # two m-tiles, two k-tiles, two n-tiles, all ragged
_BF16 = np.dtype(ml_dtypes.bfloat16)


def make_program(seed: int, n_steps: int) -> list[tuple]:
    """A seeded random list of steps over a fixed pool of tensors, with many read-after-write chains."""
    rng = np.random.default_rng(seed)
    mats = ["P0", "P1", "P2", "Zl"]
    cols = ["c0", "c1"]
    steps: list[tuple] = []
    loads = 0
    pick = lambda xs: xs[int(rng.integers(len(xs)))]  # noqa: E731
    for i in range(n_steps):
        r = rng.random()
        if r < 0.3:
            trans_b = bool(rng.integers(2))
            a = pick(["X", "Xl"])
            b = pick(["Wt", "Wtl"]) if trans_b else pick(["W", "Wl"])
            out = pick(["P0", "P1", "P2", "Y"])
            k_epi = [("scale", 0.5)] if rng.random() < 0.4 else []
            t_epi = []
            if rng.random() < 0.5:
                t_epi.append(("add", pick(mats)))
            if rng.random() < 0.4:
                t_epi.append(("scale", float(pick([0.25, 2.0]))))
            post = [("mul_bcast", pick(cols))] if out != "Y" and rng.random() < 0.5 else []
            steps.append(("gemm", a, b, trans_b, out, k_epi, t_epi, post))
        elif r < 0.75:
            kind = pick(["copy", "max_elem", "rmax", "rsum", "mul_bcast", "fma", "softmax_pair", "fill"])
            if kind in ("rmax", "rsum"):
                steps.append(("math", kind, (pick(mats),), pick(cols)))
            elif kind == "copy":
                steps.append(("math", kind, (pick(mats),), pick(mats[:3])))
            elif kind == "max_elem":
                steps.append(("math", kind, (pick(mats), pick(mats)), pick(mats[:3])))
            elif kind == "mul_bcast":
                steps.append(("math", kind, (pick(mats), pick(cols)), pick(mats[:3])))
            elif kind == "fma":
                steps.append(("math", kind, (pick(mats), pick(cols), pick(mats)), pick(mats[:3])))
            elif kind == "fill":
                steps.append(("math", kind, (), pick(mats[:3] + cols), float(rng.integers(-3, 4))))
            else:
                steps.append(("softmax_pair", pick(mats), pick(cols), pick(mats[:3])))
        elif r < 0.85:
            steps.append(("store", pick(mats[:3]), "Y"))
        elif r < 0.95:
            loads += 1
            name = f"Yl{loads}"
            steps.append(("load", "Y", name))
            mats.append(name)
        else:
            steps.append(("wait", int(rng.integers(i + 1))))
    return steps


def _inputs(seed: int):
    rng = np.random.default_rng(seed)
    f = lambda *s: (rng.standard_normal(s) * 0.5).astype(np.float32)  # noqa: E731
    return {"X": f(M, K), "W": f(K, N), "Wt": f(N, K), "Z": f(M, N)}


def build_and_run(steps, seed: int, mode: str = "data", **overrides):
    sim = kbwork.Simulator(mode=mode, **overrides)
    data = _inputs(seed)
    hbm = {"X": sim.hbm("X", data["X"], dtype="bf16"), "W": sim.hbm("W", data["W"], dtype="bf16"),
           "Wt": sim.hbm("Wt", data["Wt"], dtype="bf16"), "Z": sim.hbm("Z", data["Z"], dtype="fp32"),
           "Y": sim.hbm("Y", shape=(M, N), dtype="fp32")}

    def kernel(tl):
        h = dict(hbm)
        for name in ("X", "W", "Wt", "Z"):
            h[name + "l"] = tl.load(hbm[name], name=name + "l")
        for name in ("P0", "P1", "P2"):
            h[name] = tl.alloc((M, N), "fp32", name=name)
        for name in ("c0", "c1"):
            h[name] = tl.alloc((M, 1), "fp32", name=name)
        last = None
        for j, st in enumerate(steps):
            with tl.iteration(j):
                if st[0] == "gemm":
                    _, a, b, tb, out, k_epi, t_epi, post = st
                    epi = [{"op": "scale", "factor": f, "scope": "k_tile"} for _, f in k_epi]
                    epi += [{"op": "add", "other": h[x]} if kind == "add" else {"op": "scale", "factor": x}
                            for kind, x in t_epi]
                    epi += [{"op": kind, "a": h[out], "b": h[col], "out": h[out], "scope": "kernel"}
                            for kind, col in post]
                    last = tl.composite(op="gemm", a=h[a], b=h[b], out=h[out], trans_b=tb, epilogue=epi)
                elif st[0] == "math":
                    _, kind, srcs, out, *value = st
                    kw = dict(zip("abc", (h[s] for s in srcs)))
                    last = tl.composite(op="math", math_op=kind, out=h[out], value=value[0] if value else None, **kw)
                elif st[0] == "softmax_pair":
                    _, src, col, out = st
                    last = tl.composite(ops=[OpSpec("rmax", operands={"a": h[src]}, out=h[col]),
                                             OpSpec("exp_diff", operands={"a": h[src], "b": h[col]}, out=h[out])])
                elif st[0] == "store":
                    last = tl.store(h[st[1]], h[st[2]])
                elif st[0] == "load":
                    h[st[2]] = tl.load(h[st[1]], name=st[2])
                elif st[0] == "wait":
                    tl.wait(kbwork.Completion(min(st[1], len(tl.commands) - 1)))
        return last

    return sim.run(kernel), data


def interpret(steps, data, tile_k: int = 128) -> dict[str, np.ndarray]:
    """Run the steps sequentially in numpy (float32, rounding to each tensor's dtype on write)."""
    bf = lambda x: x.astype(_BF16).astype(np.float32)  # noqa: E731
    s = {"X": bf(data["X"]), "W": bf(data["W"]), "Wt": bf(data["Wt"]), "Z": data["Z"].copy(),
         "Y": np.zeros((M, N), np.float32)}
    for name in ("X", "W", "Wt", "Z"):
        s[name + "l"] = s[name].copy()
    for name in ("P0", "P1", "P2"):
        s[name] = np.zeros((M, N), np.float32)
    for name in ("c0", "c1"):
        s[name] = np.zeros((M, 1), np.float32)
    for st in steps:
        if st[0] == "gemm":
            _, a, b, tb, out, k_epi, t_epi, post = st
            A, B = s[a], (s[b].T if tb else s[b])
            acc = np.zeros((M, N), np.float32)
            for k0 in range(0, K, tile_k):
                acc = acc + A[:, k0:k0 + tile_k] @ B[k0:k0 + tile_k]
                for _, f in k_epi:
                    acc = acc * np.float32(f)
            for kind, x in t_epi:
                acc = acc + s[x] if kind == "add" else acc * np.float32(x)
            s[out] = acc
            for _, col in post:
                s[out] = s[out] * s[col]
        elif st[0] == "math":
            _, kind, srcs, out, *value = st
            v = [s[x] for x in srcs]
            if kind == "copy":
                r = v[0]
            elif kind == "max_elem":
                r = np.maximum(v[0], v[1])
            elif kind == "rmax":
                r = v[0].max(axis=1, keepdims=True)
            elif kind == "rsum":
                r = v[0].sum(axis=1, keepdims=True)
            elif kind == "mul_bcast":
                r = v[0] * v[1]
            elif kind == "fma":
                r = v[0] * v[1] + v[2]
            else:  # fill
                r = np.full(s[out].shape, value[0], np.float32)
            s[out] = np.broadcast_to(r, s[out].shape).astype(np.float32)
        elif st[0] == "softmax_pair":
            _, src, col, out = st
            s[col] = s[src].max(axis=1, keepdims=True)
            s[out] = np.exp(s[src] - s[col])
        elif st[0] == "store":
            s[st[2]] = s[st[1]].copy()
        elif st[0] == "load":
            s[st[2]] = s[st[1]].copy()
    return s


RANDOM_SEEDS = [1, 2, 3, 4, 5, 6]


@pytest.mark.parametrize("seed", RANDOM_SEEDS)
@pytest.mark.parametrize("policy", ["strict_fifo", "rw_aware"])
def test_random_program_invariants_and_sequential_semantics(seed, policy):
    steps = make_program(seed, n_steps=14)
    run, data = build_and_run(steps, seed, hazard_policy=policy)
    check_invariants(run)
    want = interpret(steps, data)
    for name, ref in want.items():
        assert np.isfinite(ref).all(), f"seed {seed} overflows; pick another seed"
        got = run.read(name).astype(np.float32)
        scale = max(1.0, float(np.abs(ref).max()))
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4 * scale, err_msg=f"{name} after {steps}")
    # timing mode schedules the very same stages at the very same cycles
    timing, _ = build_and_run(steps, seed, mode="timing", hazard_policy=policy)
    assert timing.to_csv() == run.to_csv()


def test_random_programs_exercise_holds_waits_and_loads():
    kinds = {st[0] for seed in RANDOM_SEEDS for st in make_program(seed, 14)}
    assert kinds == {"gemm", "math", "softmax_pair", "store", "load", "wait"}


@pytest.mark.parametrize("overrides", [dict(cmd_queue_depth=1), dict(cmd_queue_depth=2, tile_buffers=1),
                                       dict(fixed_cycles=0, r_cycles_per_byte=0.5, tile_m=16, tile_n=64,
                                            tile_k=64, max_composite_logical_bytes=64),
                                       dict(fixed_cycles=0, r_cycles_per_byte=0, plan_base_cycles=0,
                                            plan_cycles_per_op=0, dma_base_cycles=0, gemm_base_cycles=0,
                                            math_base_cycles=0)],
                         ids=["depth1", "depth2-buf1", "retuned", "zero-length-stages"])
def test_random_program_under_other_topologies(overrides):
    steps = make_program(7, n_steps=12)
    run, data = build_and_run(steps, 7, **overrides)
    check_invariants(run)
    want = interpret(steps, data, tile_k=run.topology.tile_k)
    for name, ref in want.items():
        np.testing.assert_allclose(run.read(name), ref, rtol=1e-4, atol=1e-4 * max(1.0, np.abs(ref).max()))


def test_dependent_composite_chain():
    """gemm -> rmax -> exp_diff -> rsum -> div_bcast -> gemm, each reading its predecessor's out."""
    rng = np.random.default_rng(41)
    A, B, V = (rng.standard_normal(s).astype(np.float32) for s in ((32, 64), (64, 96), (96, 48)))
    sim = kbwork.Simulator(mode="data")
    a, b, v = sim.hbm("A", A), sim.hbm("B", B), sim.hbm("V", V)
    out = sim.hbm("out", shape=(32, 48))

    def kernel(tl, a, b, v, out):
        s_ = tl.alloc((32, 96), "fp32", name="S")
        mx, sm = tl.alloc((32, 1), "fp32", name="mx"), tl.alloc((32, 1), "fp32", name="sm")
        e, p = tl.alloc((32, 96), "fp32", name="E"), tl.alloc((32, 96), "fp32", name="P")
        tl.composite(op="gemm", a=a, b=b, out=s_, label="s")
        tl.composite(op="math", math_op="rmax", a=s_, out=mx, label="rmax")
        tl.composite(op="math", math_op="exp_diff", a=s_, b=mx, out=e, label="exp")
        tl.composite(op="math", math_op="rsum", a=e, out=sm, label="rsum")
        tl.composite(op="math", math_op="div_bcast", a=e, b=sm, out=p, label="norm")
        tl.composite(op="gemm", a=p, b=v, out=out, label="pv")

    run = sim.run(kernel, a, b, v, out)
    check_invariants(run)
    S = A @ B
    P = np.exp(S - S.max(axis=1, keepdims=True))
    P /= P.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(run.read("out"), P @ V, rtol=1e-5, atol=1e-5)
    log = run.op_log
    done = completions(log)
    first_work = log[~log.stage.isin(["DISPATCH", "PLAN"])].groupby("cmd").start.min()
    for c in range(1, 6):  # each reads the previous command's out: held until it completes
        assert first_work[c] >= done[c - 1]


# --- legacy form == flat form (seed Test 1) ----------------------------------------------------------
def _legacy_vs_flat(program: str, form: str, mode: str):
    rng = np.random.default_rng(51)
    sim = kbwork.Simulator(mode=mode)
    A, B, O = (rng.standard_normal(s).astype(np.float32) for s in ((50, 260), (150, 260), (50, 150)))
    col = (np.abs(rng.standard_normal((50, 1))) + 1).astype(np.float32)
    a, b = sim.hbm("A", A, dtype="bf16"), sim.hbm("B", B, dtype="bf16")
    o, c = sim.hbm("O", O), sim.hbm("col", col)
    out = sim.hbm("C", shape=(50, 150))
    gemm_extra = {"m": 50, "k": 260, "n": 150, "trans_b": True}

    def kernel(tl):
        if program == "gemm":
            if form == "legacy":
                tl.composite(op="gemm", a=tl.ref(a), b=tl.ref(b), out=out, trans_b=True)
            else:
                tl.composite(ops=[OpSpec("gemm", Scope.KERNEL, {"a": a, "b": b}, gemm_extra, out)])
        elif program == "gemm_epilogues":
            a_t, o_t, c_t = tl.load(a), tl.load(o), tl.load(c)
            a2 = tl.alloc((50, 260), "bf16", name="A2")
            ct = tl.alloc((50, 150), "fp32", name="C_tcm")
            if form == "legacy":
                tl.composite(op="gemm", a=a2, b=b, out=ct, trans_b=True,
                             prologue=[{"op": "copy", "a": a_t, "out": a2}],
                             epilogue=[{"op": "scale", "factor": 0.5, "scope": "k_tile"},
                                       {"op": "add", "other": o_t},
                                       {"op": "scale", "factor": 2.0},
                                       {"op": "div_bcast", "a": ct, "b": c_t, "out": ct, "scope": "kernel"}])
            else:
                tl.composite(ops=[
                    OpSpec("copy", Scope.KERNEL, {"a": a_t}, {}, a2),
                    OpSpec("gemm", Scope.KERNEL, {"a": a2, "b": b}, gemm_extra, ct),
                    OpSpec("scale", Scope.K_TILE, {}, {"factor": 0.5}),
                    OpSpec("add", Scope.OUTPUT_TILE, {"other": o_t}),
                    OpSpec("scale", Scope.OUTPUT_TILE, {}, {"factor": 2.0}),
                    OpSpec("div_bcast", Scope.KERNEL, {"a": ct, "b": c_t}, {}, ct),
                ])
            tl.store(ct, out)
        else:  # math composite: head streams from HBM, then an accumulator op and a reduction
            y = tl.alloc((50, 150), "fp32", name="Y")
            s = tl.alloc((50, 1), "fp32", name="s")
            c_t = tl.load(c)
            if form == "legacy":
                tl.composite(op="math", math_op="exp_diff", a=o, b=c_t, out=y,
                             epilogue=[{"op": "scale", "factor": 0.25}, {"op": "rsum", "a": y, "out": s}])
            else:
                tl.composite(ops=[OpSpec("exp_diff", operands={"a": o, "b": c_t}, out=y),
                                  OpSpec("scale", extra={"factor": 0.25}),
                                  OpSpec("rsum", operands={"a": y}, out=s)])

    run = sim.run(kernel)
    names = {"gemm": ["C"], "gemm_epilogues": ["C"], "math": ["Y", "s"]}[program]
    values = [run.read(n) for n in names] if mode == "data" else []
    return run, values


@pytest.mark.parametrize("program", ["gemm", "gemm_epilogues", "math"])
@pytest.mark.parametrize("mode", ["timing", "data"])
def test_legacy_and_flat_forms_give_byte_identical_op_logs(program, mode):
    legacy, lv = _legacy_vs_flat(program, "legacy", mode)
    flat, fv = _legacy_vs_flat(program, "flat", mode)
    assert [c.ops for c in legacy.program.commands] == [c.ops for c in flat.program.commands]
    assert legacy.to_csv() == flat.to_csv()
    check_invariants(legacy)
    for x, y in zip(lv, fv):
        np.testing.assert_array_equal(x, y)


def test_legacy_lowering_is_the_flat_op_tuple():
    legacy, _ = _legacy_vs_flat("gemm_epilogues", "legacy", "timing")
    flat, _ = _legacy_vs_flat("gemm_epilogues", "flat", "timing")
    lc = [c for c in legacy.program.commands if not isinstance(c, DmaCmd)]
    fc = [c for c in flat.program.commands if not isinstance(c, DmaCmd)]
    assert len(lc) == len(fc) == 1
    assert lc[0].ops == fc[0].ops
    assert [op.kind for op in lc[0].ops] == ["copy", "gemm", "scale", "add", "scale", "div_bcast"]
    assert [op.scope for op in lc[0].ops] == [Scope.KERNEL, Scope.KERNEL, Scope.K_TILE, Scope.OUTPUT_TILE,
                                              Scope.OUTPUT_TILE, Scope.KERNEL]


# --- goldens ----------------------------------------------------------------------------------------
def test_goldens_round_trip(tmp_path):
    from kbwork import golden

    assert golden.check(tmp_path)  # nothing there yet: every golden is reported missing
    assert set(golden.update(tmp_path)) >= set(BENCHES)
    assert golden.check(tmp_path) == []
    assert golden.update(tmp_path) == []  # re-simulating changes nothing
    path = tmp_path / "gemm_hbm.csv"
    path.write_text(path.read_text().replace(",PE_DMA,", ",PE_GEMM,", 1))
    problems = golden.check(tmp_path)
    assert len(problems) == 1 and problems[0].startswith("gemm_hbm:")


def test_committed_goldens_match():
    from kbwork import golden

    assert golden.check() == []


# --- queue depth, tl.wait, segmentation --------------------------------------------------------------
def _independent_program(n_cmds: int, **overrides):
    """n math composites that only read a shared input: no hazards, each ~500 MATH cycles."""
    sim = kbwork.Simulator(mode="timing", **overrides)
    x = sim.hbm("x", shape=(32, 256))

    def kernel(tl):
        xt, col = tl.load(x), tl.alloc((32, 1), "fp32", name="col")
        for i in range(n_cmds):
            tl.composite(op="math", math_op="exp_diff", a=xt, b=col, out=tl.alloc((32, 256), "fp32", name=f"e{i}"))

    return sim.run(kernel)


@pytest.mark.parametrize("depth", [1, 2, 3])
def test_queue_depth_bounds_commands_in_flight(depth):
    run = _independent_program(10, cmd_queue_depth=depth)
    check_invariants(run)
    log = run.op_log
    done = completions(log).to_numpy()
    d_start = log[log.stage == "DISPATCH"].start.to_numpy()
    for c in range(depth, len(d_start)):
        # a command is in flight from its DISPATCH start to its completion
        assert d_start[c] >= done[c - depth]
        assert sum(1 for o in range(c) if done[o] > d_start[c]) <= depth - 1
    if depth == 1:
        assert (d_start[1:] >= done[:-1]).all()
    # the bound is what holds the CPU back: the (depth)th later dispatch waits exactly for a completion
    assert any(d_start[c] == done[c - depth] for c in range(depth, len(d_start)))


def test_default_queue_depth_lets_dispatch_run_ahead():
    run = _independent_program(10)
    log = run.op_log
    done = completions(log).to_numpy()
    d = log[log.stage == "DISPATCH"]
    assert run.topology.cmd_queue_depth == 8
    # back-to-back dispatch while earlier commands are still running
    assert (d.start.to_numpy()[1:] == d.end.to_numpy()[:-1]).sum() >= 7
    assert (d.start.to_numpy()[1:] < done[:-1]).any()


@pytest.mark.parametrize("wait_on", [0, 1])
def test_wait_stalls_the_next_dispatch_until_completion(wait_on):
    def program(wait: bool):
        sim = kbwork.Simulator(mode="timing")
        x = sim.hbm("x", shape=(64, 512))

        def kernel(tl):
            xt = tl.load(x)  # cmd 0
            col = tl.alloc((64, 1), "fp32", name="col")
            c1 = tl.composite(op="math", math_op="exp_diff", a=xt, b=col,
                              out=tl.alloc((64, 512), "fp32", name="e"))  # cmd 1
            tl.composite(op="math", math_op="fill", out=tl.alloc((8, 8), "fp32", name="z"), value=0.0)  # cmd 2
            if wait:
                tl.wait(c1 if wait_on == 1 else kbwork.Completion(0))
            tl.composite(op="math", math_op="fill", out=tl.alloc((8, 8), "fp32", name="w"), value=1.0)  # cmd 3

        return sim.run(kernel)

    waited, free = program(True), program(False)
    check_invariants(waited)
    for run in (waited, free):
        assert len(run.program.commands) == 4
    done = completions(waited.op_log)
    d3 = waited.op_log[(waited.op_log.stage == "DISPATCH") & (waited.op_log.cmd == 3)].iloc[0]
    assert d3.start >= done[wait_on]
    assert d3.start == done[wait_on]  # PE_CPU is otherwise idle: it resumes at the completion
    assert waited.program.waits[3] == (wait_on,)
    d3_free = free.op_log[(free.op_log.stage == "DISPATCH") & (free.op_log.cmd == 3)].iloc[0]
    assert d3_free.start < completions(free.op_log)[wait_on]  # without the wait it would not stall


def test_wait_on_a_not_yet_emitted_command_is_rejected():
    sim = kbwork.Simulator(mode="timing")

    def kernel(tl):
        tl.full((4, 4), 0.0, name="z")
        tl.wait(kbwork.Completion(5))

    with pytest.raises(kbwork.ValidationError, match="Completion"):
        sim.run(kernel)


@pytest.mark.parametrize("n_ops,segments", [(1, 1), (42, 1), (43, 2), (85, 2), (86, 3), (128, 3)])
def test_large_composites_dispatch_in_segments(n_ops, segments):
    """Each copy op is 8 + 2 x 8 = 24 logical bytes; the cap is 1024 per segment."""
    sim = kbwork.Simulator(mode="timing")

    def kernel(tl):
        x, y = tl.alloc((8, 16), "fp32", name="x"), tl.alloc((8, 16), "fp32", name="y")
        tl.composite(ops=[OpSpec("copy", operands={"a": x if i % 2 == 0 else y}, out=y if i % 2 == 0 else x)
                          for i in range(n_ops)], label="many")

    run = sim.run(kernel)
    check_invariants(run)
    d = run.op_log.iloc[0]
    lb = 24 * n_ops
    assert (d.stage, d.bytes) == ("DISPATCH", lb)
    assert max(1, math.ceil(lb / 1024)) == segments
    assert d.end - d.start == 40 * segments + math.ceil(0.0625 * lb)
    assert (run.op_log.stage == "MATH").sum() == n_ops


def test_dispatch_cost_follows_topology_overrides():
    sim = kbwork.Simulator(mode="timing", fixed_cycles=100, r_cycles_per_byte=0.1, max_composite_logical_bytes=50)

    def kernel(tl):
        x = tl.alloc((8, 16), "fp32", name="x")
        tl.composite(op="math", math_op="fill", out=x, value=1.0)   # 20 B: 1 segment
        tl.composite(op="math", math_op="copy", a=x, out=x)         # 24 B: 1 segment
        tl.composite(ops=[OpSpec("copy", operands={"a": x}, out=x)] * 3)  # 72 B: 2 segments

    run = sim.run(kernel)
    check_invariants(run)
    d = run.op_log[run.op_log.stage == "DISPATCH"]
    assert list(d.bytes) == [20, 24, 72]
    assert list(d.end - d.start) == [100 + 2, 100 + 3, 200 + 8]  # ceil(0.1 x 20), ceil(0.1 x 24) = 3 (not 2.4000...1)


def test_iteration_labels_the_iter_column():
    sim = kbwork.Simulator(mode="timing")

    def kernel(tl):
        x = tl.full((4, 4), 0.0, name="x")
        for j in range(3):
            with tl.iteration(j):
                tl.composite(op="math", math_op="copy", a=x, out=x, label=f"c{j}")
        tl.composite(op="math", math_op="fill", out=x, value=1.0)

    log = sim.run(kernel).op_log
    per_cmd = log.groupby("cmd").agg(iter=("iter", "unique"), label=("label", "unique"))
    assert [list(v) for v in per_cmd.iter] == [[-1], [0], [1], [2], [-1]]
    assert [list(v) for v in per_cmd.label] == [["fill x"], ["c0"], ["c1"], ["c2"], ["fill"]]
