"""A launch that differs from one simulated before only in its loops' trip counts takes that one's records
(kbwork.device.lengths, docs/device.md "Exact reductions"). An exact reduction: every stage, every critical-path
link, equal to the plain simulation (one event loop, no reductions, no steady state)."""

from __future__ import annotations

import random

import pytest

import kbwork
from kbwork import Launch
from kbwork.device.lengths import length_key
from kbwork.kernels import gqa_decode as gq
from kbwork.kernels.split import gqa_decode_partial

from device_cases import stream_kernel  # tests/ is on sys.path

G, D, T = 4, 64, 16


@pytest.fixture
def calls(monkeypatch):
    """The launch lists ``simulate_pe`` is called with (their lengths), as the run goes."""
    import kbwork.device.steady as steady

    out: list[int] = []
    real = steady.simulate_pe
    monkeypatch.setattr(steady, "simulate_pe", lambda progs, *a, **k: out.append(len(progs)) or real(progs, *a, **k))
    return out


def _sim() -> kbwork.Simulator:
    return kbwork.Simulator(mode="timing", pes=2, hbm_channels=2, channel_bytes_per_cycle=40)


def _decode(sim, name: str, tiles: int, *, variant: str = "opt2", partial: bool = False, tile: int = T,
            k=None, v=None, g: int = G, d: int = D, kv_dtype: str = "bf16") -> Launch:
    """A decode launch over ``tiles`` tiles of its own K and V (or of ``k``, ``v``) on channel 0."""
    q = sim.hbm(f"{name}_q", shape=(g, d), dtype="bf16", channel=0)
    k = sim.hbm(f"{name}_K", shape=(tiles * tile, d), dtype=kv_dtype, channel=0) if k is None else k
    v = sim.hbm(f"{name}_V", shape=(tiles * tile, d), dtype=kv_dtype, channel=0) if v is None else v
    if partial:
        st = [sim.hbm(f"{name}_{x}", shape=s, dtype="fp32", channel=0) for x, s in (("m", (g, 1)), ("l", (g, 1)),
                                                                                   ("O", (g, d)))]
        return Launch(gqa_decode_partial, q, k, v, *st, variant=variant, tile=tile)
    return Launch(gq.gqa_decode, q, k, v, sim.hbm(f"{name}_out", shape=(g, d), dtype="fp32", channel=0),
                  variant=variant, tile=tile)


def _stream(sim, name: str, tiles: int, *, op: str, waits: bool = False, tile: int = 8) -> Launch:
    src = sim.hbm(f"{name}_src", shape=(tiles * tile, 32), dtype="fp32", channel=0)
    dst = sim.hbm(f"{name}_dst", shape=(tiles * tile, 32), dtype="fp32", channel=0)
    return Launch(stream_kernel, src, dst, tile=tile, op=op, waits=waits)


def _same_as_plain(sim, plan):
    run = sim.run_device(plan)
    plain = sim.run_device(plan, reductions=False, steady_state=False)
    assert run.cycles == plain.cycles
    assert run.to_csv() == plain.to_csv()
    assert run.critical_path()[["seq", "cause"]].equals(plain.critical_path()[["seq", "cause"]])
    return run


KINDS = [("decode", dict(variant=v)) for v in sorted(gq.VARIANTS)] + \
    [("partial", dict(variant=v)) for v in sorted(gq.VARIANTS)] + \
    [("stream", dict(op="direct")), ("stream", dict(op="copy")), ("stream", dict(op="copy", waits=True))]


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("kind", KINDS, ids=[f"{k}-{'-'.join(map(str, a.values()))}" for k, a in KINDS])
def test_launches_of_random_lengths_equal_the_plain_simulation(kind, seed, calls):
    """A PE alone on its home channel runs launches of one kernel at random lengths: some a whole number of
    periods apart, some not, some too short to go steady, one repeated; the channel rate, the hazard policy and
    a decode's group, head dim, tile and KV dtype drawn too. The run equals the plain simulation stage for
    stage and link for link, whichever launches took another length's records."""
    family, args = kind
    rng = random.Random(seed * 1009 + len(family))
    sim = kbwork.Simulator(mode="timing", pes=2, hbm_channels=2, channel_bytes_per_cycle=rng.choice([16, 40, 128]),
                           hazard_policy=rng.choice(["rw_aware", "strict_fifo"]))
    shape = dict(g=rng.choice([1, 4, 8]), d=rng.choice([64, 128]), tile=rng.choice([16, 32]),
                 kv_dtype=rng.choice(["bf16", "fp8"]))
    base = rng.randint(14, 30)
    lengths = [base, base + 2, base + 4 * rng.randint(1, 3), base + 1, rng.randint(2, 6), base + 6, base + 2,
               max(2, base - 2)]
    rng.shuffle(lengths)
    plan = {0: []}
    for i, n in enumerate(lengths):
        if family == "stream":
            plan[0].append(_stream(sim, f"s{i}", n, **args))
        else:
            plan[0].append(_decode(sim, f"d{i}", n, partial=family == "partial", **args, **shape))
    run = _same_as_plain(sim, plan)
    taken = run.reductions.other_lengths
    assert len(calls) - 1 + taken <= len(lengths)  # (the plain run is one more call)
    if family != "stream" or not args.get("waits"):
        assert taken >= 1, (lengths, str(run.reductions))
    else:  # the stores after the loop write fixed rows of a tensor the loop writes moving slices of: only a
        # launch of a length met before (whose names keep it from being replicated) takes another's records
        assert taken <= len(lengths) - len(set(lengths))


@pytest.mark.parametrize("variant", sorted(gq.VARIANTS))
def test_launches_a_whole_number_of_periods_apart_need_one_simulation(variant, calls):
    """N launches of lengths n, n + p, n + 2p, ... (p the period the steady state proves) are simulated once;
    ``run.reductions`` says the others were taken from it, and each is named by its own tensors."""
    sim = _sim()
    first = sim.run_device({0: [_decode(sim, "a", 24, variant=variant)]})
    p = first.steady_state.period
    assert first.steady_state.path == "steady" and p
    n = 5
    plan = {0: [_decode(sim, f"x{i}", 24 + (n - 1 - i) * p if i % 2 else 24 + i * p, variant=variant)
                for i in range(n)]}
    calls.clear()
    run = sim.run_device(plan)
    assert calls == [1]
    assert run.reductions.other_lengths == n - 1
    assert f"{n - 1} launches taken from a launch of other loop lengths" in str(run.reductions)
    tensors = set(run.op_log.tensor.astype(str))
    assert {f"x{i}_V[0:16]" for i in range(n)} <= tensors and "x3_V[368:384]" in tensors
    calls.clear()
    plain = sim.run_device(plan, reductions=False, steady_state=False)
    assert run.to_csv() == plain.to_csv()
    assert run.critical_path()[["seq", "cause"]].equals(plain.critical_path()[["seq", "cause"]])


def test_split_chunks_of_one_tensor_take_another_lengths_records(calls):
    """Partial decodes over chunks of one K and V (row slices of them, as the split mapping lays them out) of
    lengths a whole number of periods apart: one simulation, the rest taken, the run equal to the plain one."""
    sim = _sim()
    rows = [20, 22, 26, 20, 24]
    k = sim.hbm("K", shape=(sum(rows) * T, D), dtype="bf16", channel=0)
    v = sim.hbm("V", shape=(sum(rows) * T, D), dtype="bf16", channel=0)
    plan, at = {0: []}, 0
    for i, n in enumerate(rows):
        plan[0].append(_decode(sim, f"c{i}", n, partial=True, k=k[at * T:(at + n) * T], v=v[at * T:(at + n) * T]))
        at += n
    run = sim.run_device(plan)
    # (the fourth chunk has the first's length, but names of slices keep it from being replicated: it too takes
    # the first's records by its key)
    assert calls == [1] and run.reductions.other_lengths == 4
    _same_as_plain(sim, plan)


def _two_loops(tl, src, dst, *, tile: int, short: int):
    """A loop of ``short`` iterations (too few to go steady), then a long one over the rest of ``src``."""
    ring = tl.ring(2, (tile, src.shape[1]), "fp32", name="buf")
    for j in tl.range(short):
        with tl.iteration(j):
            tl.composite(op="math", math_op="copy", a=src[j * tile:(j + 1) * tile], out=ring[j])
    n = src.shape[0] // tile - short
    for j in tl.range(n):
        with tl.iteration(j):
            tl.composite(op="math", math_op="copy", a=src[(short + j) * tile:(short + j + 1) * tile], out=ring[j])
            tl.store(ring[j], dst[j * tile:(j + 1) * tile])


def test_a_launch_that_differs_in_anything_else_is_simulated(calls):
    """Another tile, another epilogue (the partial decode stores its state instead of dividing), a loop that
    was not accelerated run to another count, a count the period does not divide, or one too short to leave a
    period: each such launch is simulated, and every run equals the plain simulation."""
    sim = _sim()

    def check(plan, simulated, taken=0):
        calls.clear()
        run = sim.run_device(plan)
        assert len(calls) == simulated and run.reductions.other_lengths == taken, str(run.reductions)
        plain = sim.run_device(plan, reductions=False, steady_state=False)
        assert run.to_csv() == plain.to_csv()

    check({0: [_decode(sim, "a", 24), _decode(sim, "b", 26, tile=32)]}, 2)
    check({0: [_decode(sim, "c", 24), _decode(sim, "d", 26, partial=True)]}, 2)
    check({0: [_decode(sim, "e", 24), _decode(sim, "f", 25)]}, 2)   # (opt2's period is 2)
    check({0: [_decode(sim, "g", 24), _decode(sim, "h", 6)]}, 2)    # too short to go steady
    check({0: [_decode(sim, "i", 24), _decode(sim, "j", 30)]}, 1, 1)

    def two(name, short, tiles):
        src = sim.hbm(f"{name}_src", shape=(tiles * 8, 32), dtype="fp32", channel=0)
        dst = sim.hbm(f"{name}_dst", shape=((tiles - short) * 8, 32), dtype="fp32", channel=0)
        return Launch(_two_loops, src, dst, tile=8, short=short)
    check({0: [two("t0", 3, 43), two("t1", 3, 63)]}, 1, 1)  # the long loop 20 iterations on
    check({0: [two("t2", 3, 43), two("t3", 4, 44)]}, 2)     # the short loop one iteration on


def test_the_key_holds_no_length_and_no_name():
    """Two decodes of other lengths on other tensors have one key; another tile or another channel pattern
    another, and so has a length of the other parity (the last tile's merge, after the loop, reads the other slot
    of the two-slot score ring)."""
    sim = kbwork.Simulator(mode="timing", pes=2, hbm_channels=2)
    a = _decode(sim, "a", 20)
    b = _decode(sim, "b", 34)
    e = _decode(sim, "e", 33)
    q = sim.hbm("c_q", shape=(G, D), dtype="bf16", channel=1)
    c = Launch(gq.gqa_decode, q, *(sim.hbm(f"c_{x}", shape=(20 * T, D), dtype="bf16", channel=0) for x in "KV"),
               sim.hbm("c_out", shape=(G, D), dtype="fp32", channel=0), variant="opt2", tile=T)
    d = _decode(sim, "d", 10, tile=32)
    progs = _programs(sim, [a, b, c, d, e])
    keys = [length_key(p) for p in progs]
    assert all(k is not None for k in keys)
    assert keys[0][0] == keys[1][0]
    assert all(keys[0][0] != k[0] for k in keys[2:])
    assert keys[0][1] == (0,) and keys[2][1] == (1, 0)  # the channels, as the tensors meet them


def _programs(sim, launches):
    """Each launch's program, as a device run binds it (one trace per signature)."""
    return sim._programs({0: launches})[0][0]


def _records(res) -> dict:
    """Every column of a launch's records (timeline, schedule, steady state), as plain lists."""
    import numpy as np

    tl, sched, state = res
    out = {"state": state, "n": (sched.n_commands, sched.n_stages), "cycles": tl.cycles}
    for name in ("labels", "iters", "dispatch_seq", "plan_end", "waits", "reads", "writes", "logical_bytes"):
        out[name] = [x.tolist() if hasattr(x, "tolist") else x for x in getattr(sched, name)]
    t = sched.table
    for name in ("kind", "engine", "phase", "cmd", "op_kind", "tile", "k_tile", "nbytes", "dur", "chan", "tensor"):
        out[name] = list(np.asarray(getattr(t, name)).tolist())
    out["preds"] = list(t.preds)
    for name in ("start", "end", "ready", "unit", "done", "held", "release", "hit_ptr", "hit"):
        out[name] = np.asarray(getattr(tl, name)).tolist()
    out["front"] = [None if x is None else np.asarray(x).tolist() for x in tl.front]
    out["commands"] = [(c.completion.cmd, c.label, c.iter) for c in sched.commands]
    out["loops"] = [(lp.number, lp.iterations) for lp in sched.loops]
    return out


@pytest.mark.parametrize("make", [lambda s, n: _decode(s, f"x{n}", n, variant="opt2"),
                                  lambda s, n: _decode(s, f"x{n}", n, variant="opt3"),
                                  lambda s, n: _decode(s, f"x{n}", n, variant="a1", partial=True),
                                  lambda s, n: _stream(s, f"x{n}", n, op="copy"),
                                  lambda s, n: Launch(_two_streams, *(s.hbm(f"x{n}{x}", shape=(k * 8, 32), dtype="fp32",
                                                                           channel=0)
                                                                    for x, k in (("a", n), ("b", n), ("c", n + 4),
                                                                                 ("d", n + 4))), tile=8)],
                         ids=["opt2", "opt3", "a1-partial", "stream", "two-loops"])
def test_records_taken_from_another_length_are_the_launchs_own(make):
    """Every column of a launch's records taken from another length's (its schedule, stage table, timeline,
    DISPATCH and PLAN constraints and steady state) equals its own simulation's, longer and shorter."""
    from kbwork.device.lengths import from_other_length, steady_source
    from kbwork.device.steady import simulate_pe

    sim = _sim()
    a, longer, shorter = _programs(sim, [make(sim, 30), make(sim, 42), make(sim, 26)])
    ka = length_key(a)
    res_a = simulate_pe([a])
    src = steady_source(a, res_a, ka[1])
    assert src is not None
    for b in (longer, shorter):
        kb = length_key(b)
        assert kb[0] == ka[0]
        taken = from_other_length(b, [src], kb[1])
        assert taken is not None
        assert _records(taken) == _records(simulate_pe([b]))
    assert from_other_length(_programs(sim, [make(sim, 31)])[0], [src], ka[1]) is None  # not a whole period on


def test_a_loop_taken_at_another_count_passes_the_static_rule_there():
    """The steady state's static rule reads a loop's count; every loop a launch of the random cases ran at
    another length's records passes it at its own count (what the key's refusals guarantee)."""
    from kbwork.device.steady import shift_invariant

    sim = _sim()
    launches = [_decode(sim, f"d{n}{v}", n, variant=v) for n in (3, 9, 30) for v in sorted(gq.VARIANTS)]
    launches += [_decode(sim, f"p{n}", n, partial=True) for n in (4, 17)]
    launches += [_stream(sim, f"s{n}{op}", n, op=op) for n in (2, 5, 40) for op in ("direct", "copy")]
    for prog in _programs(sim, launches):
        assert length_key(prog) is not None
        assert all(shift_invariant(prog, lp) is None for lp in prog.loops)


def test_reductions_false_takes_no_other_lengths_records():
    """``reductions=False`` is the plain simulation: no launch takes another length's records, and the run with
    them is the same stage for stage."""
    sim = kbwork.Simulator(mode="timing")
    plan = {0: [_decode(sim, f"r{n}", n) for n in (20, 24, 28)]}
    run = sim.run_device(plan)
    assert run.reductions.other_lengths == 2
    off = sim.run_device(plan, reductions=False)
    assert off.reductions.other_lengths == 0
    assert run.to_csv() == off.to_csv()


def _two_streams(tl, src, dst, src2, dst2, *, tile: int):
    """Two streaming loops one after the other, each over its own pair of tensors."""
    for a, b in ((src, dst), (src2, dst2)):
        ring = tl.ring(2, (tile, a.shape[1]), "fp32", name="buf")
        for j in tl.range(a.shape[0] // tile):
            with tl.iteration(j), tl.scratch_scope():
                tl.composite(op="math", math_op="copy", a=a[j * tile:(j + 1) * tile], out=ring[j])
                tl.store(ring[j], b[j * tile:(j + 1) * tile])


@pytest.mark.parametrize("seed", range(3))
def test_two_accelerated_loops_of_random_counts_equal_the_plain_simulation(seed, calls):
    """A kernel of two loops, each long enough to go steady, at random counts of each: every launch equals the
    plain simulation, and launches whose counts differ by whole periods in both loops take one's records."""
    rng = random.Random(seed)
    sim = _sim()

    def two(name, n1, n2):
        ts = [sim.hbm(f"{name}_{x}", shape=(n * 8, 32), dtype="fp32", channel=0)
              for x, n in (("a", n1), ("b", n1), ("c", n2), ("d", n2))]
        return Launch(_two_streams, *ts, tile=8)
    counts = [(20, 20), (22, 24), (20 + 2 * rng.randint(1, 4), 20 + 2 * rng.randint(1, 4)), (21, 20), (20, 23),
              (rng.randint(2, 30), rng.randint(2, 30))]
    rng.shuffle(counts)
    plan = {0: [two(f"t{i}", a, b) for i, (a, b) in enumerate(counts)]}
    run = _same_as_plain(sim, plan)
    assert run.reductions.other_lengths >= 2
    assert len(run.steady_state.loops) >= 2


@pytest.mark.parametrize("mapping", ["sequence", "split"])
def test_a_layer_of_mixed_contexts_equals_the_plain_simulation(mapping):
    """A step's attention layer (DESIGN.md §15, §16) over contexts of many lengths on a small device: launches
    take other lengths' records, and every stage equals the plain run's."""
    from kbwork import model

    dev = model.load_device(pes=4, hbm_channels=4)
    contexts = [2048 + 256 * k for k in (0, 3, 1, 5, 2, 7, 4, 6)] + [1536, 2176]
    tasks = model.assign_tasks(contexts, kv_heads=2, pes=dev.pes, tile=128, mapping=mapping)
    plan = model.attention_plan(tasks, dev, "opt2", 128, group=4, head_dim=128)
    run = plan.run()
    assert run.reductions.other_lengths >= 4, str(run.reductions)
    plain = plan.run(steady_state=False, reductions=False)
    assert run.to_csv() == plain.to_csv()
    assert run.critical_path()[["seq", "cause"]].equals(plain.critical_path()[["seq", "cause"]])
