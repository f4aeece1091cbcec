"""A device run in two phases at a cut (kbwork.device.cut, DESIGN.md §14, §16): every PE's launches that wait for
nothing simulated apart, the rest together from where each PE's first phase ended. An exact reduction: every
stage, every critical-path link, equal to the plain simulation (one event loop, no reductions, no steady state).
"""

from __future__ import annotations

import random

import pytest

import kbwork
from kbwork import Launch
from kbwork.device.cut import cut_points
from kbwork.device.device import uses_of
from kbwork.device.order import resolve_after
from kbwork.memory import Handle

from device_cases import random_device_case, stream_kernel, straight_kernel  # tests/ is on sys.path


def _written(launch: Launch) -> Handle:
    """The tensor a launch of the random cases writes (its last tensor argument)."""
    return [a for a in launch.args if isinstance(a, Handle)][-1]


def merged_case(seed: int):
    """A random device case (``device_cases``; three in four with every PE's tensors on its home channel) where some PEs, in a random order, end with a launch that waits for
    launches of PEs before them in that order and reads what those wrote (rows of it, on their channels); some
    then go on with a stream of their own (what a PE adds on its home channel when the case's tensors are)."""
    rng = random.Random(seed * 31 + 7)
    home = seed % 4 != 0
    case = random_device_case(seed, long=seed % 3 != 0, max_pes=5, home=home, sync_cycles=rng.choice([0, 3, 100]))
    sim = case.sim
    nch = sim.topo.hbm_channels
    where = (lambda p: sim.topo.home_channel(p)) if home else (lambda p: rng.randrange(nch))  # noqa: E731
    pes = sorted(p for p, v in case.plan.items() if v)
    order = pes[:]
    rng.shuffle(order)
    for k, p in enumerate(order):
        earlier = [(q, j) for q in order[:k] for j in range(len(case.plan[q]))]
        if not earlier or rng.random() < 0.25:
            continue
        picks = rng.sample(earlier, min(len(earlier), rng.randint(1, 3)))
        # the last launch of a PE most often, as a split-KV merge waits for chunks; sometimes an earlier one
        picks = [(q, len(case.plan[q]) - 1) if rng.random() < 0.7 else (q, j) for q, j in picks]
        picks = sorted(set(picks))
        parts = [_written(case.plan[q][j]) for q, j in picks]
        parts = [h[0:min(8, h.shape[0])] for h in parts]
        out = sim.hbm(f"merge{p}", shape=(8, 64), dtype="fp32", channel=where(p))
        steps = [("load", x) for x in range(len(parts))] + [("store", 0)]
        case.plan[p].append(Launch(straight_kernel, parts, out, steps=steps,
                                   after=tuple(case.plan[q][j] for q, j in picks)))
        case.notes.append(f"PE {p}: merge after {picks}")
        if rng.random() < 0.4:
            n, tile = rng.randint(20, 40), 16
            src = sim.hbm(f"tail{p}_src", shape=(n * tile, 32), dtype="fp32", channel=where(p))
            dst = sim.hbm(f"tail{p}_dst", shape=(n * tile, 32), dtype="fp32", channel=where(p))
            case.plan[p].append(Launch(stream_kernel, src, dst, tile=tile, op="copy"))
            case.notes.append(f"PE {p}: a stream after its merge")
    return case


@pytest.mark.parametrize("chunk", range(4))
def test_a_run_in_two_phases_equals_the_plain_simulation(chunk):
    cut = 0
    for seed in range(700 + 10 * chunk, 710 + 10 * chunk):
        case = merged_case(seed)
        plain = case.sim.run_device(case.plan, reductions=False, steady_state=False)
        reduced = case.sim.run_device(case.plan)
        assert reduced.to_csv() == plain.to_csv(), case
        assert reduced.critical_path()[["seq", "pe", "cause"]].equals(
            plain.critical_path()[["seq", "pe", "cause"]]), case
        assert reduced.cycles == plain.cycles
        cut += bool(reduced.reductions.cut)
    assert cut >= 4  # the cut is taken in most of these runs (each has launches waiting on others)


def _plan_deps(case):
    deps = resolve_after(case.plan)
    progs = {p: case.sim._programs(case.plan)[0][p] for p in case.plan}
    uses = {p: [uses_of([x]) for x in progs[p]] for p in progs}
    return progs, uses, deps


@pytest.mark.parametrize("seed", range(700, 712))
def test_the_cut_keeps_every_transfer_of_the_first_phase_apart_from_the_second(seed):
    """The cut's two rules, checked on its result: a first-phase launch sharing a channel with another PE's
    second-phase launch happens before it; a second-phase launch after a first-phase one is after the last of
    that PE's first phase; and no PE's first phase goes past its first launch with a dependency."""
    from kbwork.device.order import Order

    case = merged_case(seed)
    progs, uses, deps = _plan_deps(case)
    n = cut_points(progs, uses, deps)
    order = Order(deps)
    for p in progs:
        first_dep = next((i for i, ds in enumerate(deps[p]) if ds), len(progs[p]))
        assert 0 <= n[p] <= first_dep
        for i in range(n[p]):
            for q in progs:
                for j in range(n[q], len(progs[q])):
                    if q != p and uses[p][i].channels & uses[q][j].channels:
                        assert order.before((p, i), (q, j)), (case, p, i, q, j)
        for i in range(n[p], len(progs[p])):
            for q, j in deps[p][i]:
                assert j >= n[q] or j == n[q] - 1, (case, p, i, q, j)


def test_a_split_layer_goes_in_two_phases_and_equals_the_plain_simulation():
    """A split-KV layer of a step (DESIGN.md §16) on a small device: its tasks and chunks are the first phase,
    the merges the second, and every stage equals the plain run's."""
    from kbwork import model

    dev = model.load_device(pes=8, hbm_channels=8)
    tasks = model.assign_tasks([768, 384, 2048], kv_heads=2, pes=dev.pes, tile=128, mapping="split")
    plan = model.attention_plan(tasks, dev, "opt2", 128, group=4, head_dim=128)
    run = plan.run()
    plain = plan.run(steady_state=False, reductions=False)
    assert run.to_csv() == plain.to_csv()
    red = run.reductions
    assert red.cut and all(after == (1 if pe in {p for p, _ in plan.merges.values()} else 0) * after
                           for pe, (_, after) in red.cut.items())
    assert sum(after for _, after in red.cut.values()) == len(plan.merges)


def test_a_first_phase_launch_sharing_a_channel_unordered_moves_the_cut_before_it():
    """PE 1's second launch waits for its first and reads PE 0's channel, while nothing orders it with PE 0's
    stream there: PE 0's stream may share cycles with it, so PE 0 has no first phase; PE 1's first launch has."""
    sim = kbwork.Simulator(mode="timing", pes=2, hbm_channels=2, sync_cycles=5, channel_bytes_per_cycle=40)
    a0, b0 = (sim.hbm(n, shape=(640, 32), dtype="fp32", channel=0) for n in ("a0", "b0"))
    a1, b1 = (sim.hbm(n, shape=(64, 32), dtype="fp32", channel=1) for n in ("a1", "b1"))
    z = Launch(stream_kernel, a1, b1, tile=16, op="copy")
    plan = {0: [Launch(stream_kernel, a0, b0, tile=16, op="copy"), Launch(stream_kernel, a0[0:64], b0[0:64],
                                                                          tile=16, op="copy")],
            1: [z, Launch(straight_kernel, [a0[0:8]], sim.hbm("m", shape=(8, 32), dtype="fp32", channel=1),
                          steps=[("load", 0), ("math", 0)], after=(z,))]}
    run = sim.run_device(plan)
    assert run.reductions.cut == {0: (0, 2), 1: (1, 1)}
    assert run.to_csv() == sim.run_device(plan, reductions=False, steady_state=False).to_csv()


def test_a_pe_alone_runs_launch_by_launch_and_an_equal_launch_is_replicated(monkeypatch):
    """A PE alone on its channel runs three streams, the first and third alike (the same signature, tensors laid
    out alike): two launches are simulated, the third takes the first's records under its own names, and the
    run equals the plain simulation stage for stage."""
    import kbwork.device.steady as steady

    calls = []
    real = steady.simulate_pe
    monkeypatch.setattr(steady, "simulate_pe", lambda progs, *a, **k: calls.append(len(progs)) or real(progs, *a, **k))
    sim = kbwork.Simulator(mode="timing", pes=2, hbm_channels=2, channel_bytes_per_cycle=40)
    x = [sim.hbm(f"x{i}", shape=(40 * 16, 32), dtype="fp32", channel=0) for i in range(2)]
    y = [sim.hbm(f"y{i}", shape=(40 * 16, 32), dtype="fp32", channel=0) for i in range(2)]
    u = sim.hbm("u", shape=(25 * 8, 64), dtype="bf16", channel=0)
    w = sim.hbm("w", shape=(25 * 8, 64), dtype="fp32", channel=0)
    # (op="direct": no tl.load, whose buffer would be named after the tensor and keep the launch from replicating)
    plan = {0: [Launch(stream_kernel, x[0], y[0], tile=16, op="direct"), Launch(stream_kernel, u, w, tile=8, op="copy"),
                Launch(stream_kernel, x[1], y[1], tile=16, op="direct")]}
    run = sim.run_device(plan)
    assert calls == [1, 1]
    plain = sim.run_device(plan, reductions=False, steady_state=False)
    assert run.to_csv() == plain.to_csv()
    log = run.op_log
    n = sim.run_device({0: [Launch(stream_kernel, x[0], y[0], tile=16, op="direct")]}).program.n_commands
    third = log[log.cmd >= log.cmd.max() + 1 - n]
    assert "y1[624:640]" in set(third.tensor.astype(str)) and not {"x0", "y0"} & {t.split("[")[0] for t in
                                                                                 third.tensor.astype(str)}
    assert run.steady_state.path == "steady"
    assert run.critical_path()[["seq", "cause"]].equals(plain.critical_path()[["seq", "cause"]])


def test_second_phase_groups_run_pe_by_pe_exactly_when_no_two_flows_meet(monkeypatch):
    """After the cut, a group of PEs that share contended channels but wait for none of one another runs PE by
    PE (each launch alone, equal launches replicated, moved to its begin and gates) when no two of its flows
    share a cycle of a channel, and in one loop otherwise; either way every stage and every critical-path link
    equals the plain simulation. Random merged cases reach both."""
    import kbwork.device.steady as steady

    together = []
    real = steady.simulate_group
    monkeypatch.setattr(steady, "simulate_group",
                        lambda *a, **k: together.append("begins" in k) or real(*a, **k))
    apart = together_runs = 0
    for seed in range(700, 760):
        case = merged_case(seed)
        plain = case.sim.run_device(case.plan, reductions=False, steady_state=False)
        together.clear()
        reduced = case.sim.run_device(case.plan)
        assert reduced.to_csv() == plain.to_csv(), case
        assert reduced.critical_path()[["seq", "pe", "cause"]].equals(
            plain.critical_path()[["seq", "pe", "cause"]]), case
        apart += reduced.reductions.apart
        together_runs += any(together)  # a second phase's group whose flows met, simulated in one loop
    assert apart >= 1 and together_runs >= 1


def test_a_split_layers_merges_run_pe_by_pe_and_one_merge_is_simulated(monkeypatch):
    """A split layer's merges read their neighbours' partials, which chains their PEs into contended groups;
    their few transfers never meet, so each group runs PE by PE, and the merges, bindings of one trace laid out
    alike, are simulated once."""
    import kbwork.device.steady as steady
    from kbwork import model

    dev = model.load_device(pes=8, hbm_channels=8)
    tasks = model.assign_tasks([768, 384, 2048, 1280], kv_heads=2, pes=dev.pes, tile=128, mapping="split")
    plan = model.attention_plan(tasks, dev, "opt2", 128, group=4, head_dim=128)
    assert len(plan.merges) >= 3
    simulated = []  # each launch simulated by itself: its tensor arguments' names
    real = steady.simulate_pe
    monkeypatch.setattr(steady, "simulate_pe", lambda progs, *a, **k: simulated.append(
        [h.name for h in progs[0].trace.binding.leaves]) or real(progs, *a, **k))
    run = plan.run()
    merges = [names for names in simulated if names[-1].startswith("out") and len(names) not in (4, 6)]
    # (a whole task binds q, K, V, out: 4; a chunk q, K, V, m, l, O: 6; a merge (m, l, O) per part, then out)
    assert 1 <= len(merges) <= len({len(launch.after) for _, launch in plan.merges.values()}) < len(plan.merges)
    plain = plan.run(steady_state=False, reductions=False)
    assert run.to_csv() == plain.to_csv()
    assert run.critical_path()[["seq", "pe", "cause"]].equals(plain.critical_path()[["seq", "pe", "cause"]])
    assert run.reductions.apart >= 1 and "run PE by PE" in str(run.reductions)


def _records(flows):
    """Fake records of one PE: ``flows`` as (engine, nbytes, channel, start, end) per stage."""
    import types

    import numpy as np

    cols = list(zip(*flows)) if flows else [(), (), (), (), ()]
    table = types.SimpleNamespace(engine=np.array(cols[0]), nbytes=np.array(cols[1]), chan=np.array(cols[2]))
    tl = types.SimpleNamespace(start=np.array(cols[3]), end=np.array(cols[4]))
    return tl, types.SimpleNamespace(table=table), None


def test_flows_meet_when_two_data_phases_share_a_cycle_of_a_watched_channel():
    from kbwork.device.flows import flows_meet
    from kbwork.pe.stages import Engine

    D, G = int(Engine.PE_DMA), int(Engine.PE_GEMM)
    a = _records([(D, 64, 3, 0, 10)])
    assert not flows_meet([a, _records([(D, 64, 3, 10, 20)])], [3], 0)  # one ends as the other joins
    assert flows_meet([a, _records([(D, 64, 3, 9, 20)])], [3], 0)
    assert not flows_meet([a, _records([(D, 64, 3, 8, 20)])], [3], 2)  # its access phase is no flow
    assert flows_meet([a, _records([(D, 64, 3, 7, 20)])], [3], 2)
    assert not flows_meet([a, _records([(D, 64, 4, 5, 20)])], [3], 0)  # another channel
    assert not flows_meet([a, _records([(D, 64, 4, 5, 20)])], [3, 5], 0)
    assert flows_meet([a, _records([(D, 64, 4, 5, 20)]), _records([(D, 8, 4, 19, 30)])], [3, 4], 0)
    assert not flows_meet([a, _records([(D, 0, 3, 5, 20)])], [3], 0)  # moves nothing: never joins
    assert not flows_meet([a, _records([(G, 64, 3, 5, 20)])], [3], 0)  # not a transfer
    assert flows_meet([_records([(D, 64, 3, 0, 10), (D, 64, 3, 30, 40)]), _records([(D, 8, 3, 12, 31)])], [3], 0)
    assert flows_meet([_records([(D, 64, 3, 0, 50), (D, 64, 3, 10, 20)])], [3], 0)  # one PE's own two
    assert not flows_meet([a, _records([])], [3], 0) and not flows_meet([a, a], [], 0)
