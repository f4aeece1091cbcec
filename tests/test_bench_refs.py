"""The benchmark's references: SimPy replays kbwork's resolved stage graph to the same cycle."""

from __future__ import annotations

import pytest

import kbwork
from kbwork import decode
from kbwork.bench.references import heap_floor, numpy_attention, resolved_graph, simpy_replay
from kbwork.kernels.gemm import BENCHES
from test_core_timeline import build_and_run, make_program  # rootdir-relative: tests/ is on sys.path

simpy = pytest.importorskip("simpy")


def _programs():
    for pol in ("strict_fifo", "rw_aware"):
        for variant in ("opt2", "opt3"):
            yield f"{variant}-{pol}", decode.run(variant, kv_len=640, mode="timing", hazard_policy=pol).run.program
        yield f"decode-depth2-{pol}", decode.run("opt3", kv_len=384, mode="timing", hazard_policy=pol,
                                                   cmd_queue_depth=2, fixed_cycles=0).run.program
    for name, fn in BENCHES.items():
        yield name, fn(kbwork.Simulator(mode="timing")).run.program
    # two DMA channels: SimPy serves them as one resource of capacity 2, and must still agree stage by stage
    for pol in ("strict_fifo", "rw_aware"):
        for variant in ("opt2", "opt3"):
            yield f"{variant}-{pol}-2ch", decode.run(variant, kv_len=640, mode="timing", hazard_policy=pol,
                                                     dma_channels=2).run.program
        for seed in (1, 6):
            run, _ = build_and_run(make_program(seed, 14), seed, mode="timing", hazard_policy=pol, dma_channels=2)
            yield f"random{seed}-{pol}-2ch", run.program


def _waiting_program():
    sim = kbwork.Simulator(mode="timing", cmd_queue_depth=3)
    a = sim.hbm("A", shape=(64, 256), dtype="bf16")
    b = sim.hbm("B", shape=(256, 128), dtype="bf16")
    c = sim.hbm("C", shape=(64, 128), dtype="fp32")

    def kernel(tl, a, b, c):
        x = tl.alloc((64, 128), "fp32", name="x")
        done = tl.composite(op="gemm", a=a, b=b, out=x)
        tl.wait(done)
        for _ in range(4):
            tl.composite(op="math", math_op="copy", a=x, out=x)
        tl.store(x, c)

    return sim.run(kernel, a, b, c).program


@pytest.mark.parametrize("name,prog", list(_programs()) + [("wait", _waiting_program())],
                         ids=lambda x: x if isinstance(x, str) else "")
def test_simpy_replay_matches_kbwork_stage_by_stage(name, prog):
    g = resolved_graph(prog)
    assert g.capacity == [1, 1, prog.topo.dma_channels, 1, 1]
    start, end = simpy_replay(g)
    mism = [s for s in range(len(g)) if (start[s], end[s]) != (g.start[s], g.end[s])]
    assert not mism, f"{name}: {len(mism)} stages differ, first {prog.table.describe(mism[0])}: " \
                     f"simpy {start[mism[0]]}-{end[mism[0]]} vs kbwork {g.start[mism[0]]}-{g.end[mism[0]]}"
    # the floor ignores engine contention, so it can only finish earlier
    assert heap_floor(g) <= max(g.end)


def test_resolved_graph_holds_the_dynamic_edges():
    prog = decode.run("opt3", kv_len=512, mode="timing").run.program
    g = resolved_graph(prog)
    static = sum(len(p) for p in prog.table.preds)
    assert sum(len(d) for d in g.deps) > static  # hazard holds and queue waits became edges
    for s, deps in enumerate(g.deps):
        assert all(g.end[d] <= g.start[s] for d in deps)


def test_numpy_attention_matches_decode_reference():
    r = decode.run("opt2", kv_len=256, dtype="fp32")
    import numpy as np

    np.testing.assert_allclose(numpy_attention(r.q, r.k, r.v), r.reference, rtol=1e-4, atol=1e-5)


def test_bench_entry_point_writes_its_table(tmp_path, monkeypatch, capsys):
    # the benchmark itself, on one tiny case with short time budgets; speed is not asserted
    import json

    from kbwork import bench

    monkeypatch.setattr(bench, "MIN_SECONDS", 0.01)
    monkeypatch.setattr(bench, "compare_case", lambda kv, budget: {"kv_len": kv, "compare_ms": 1.0,
                                                                 "budget_ms": budget, "within_budget": True})
    monkeypatch.setattr(bench, "gantt_case", lambda: None)
    assert bench.main(["--kv-lens", "256", "--modes", "timing,data", "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "decode.json").read_text())["rows"]
    assert {(r["variant"], r["mode"]) for r in rows} == {(v, m) for v in ("opt2", "opt3") for m in ("timing", "data")}
    for r in rows:
        assert r["stages"] > 0 and r["wall_s"] > 0 and r["op_log_bytes_per_stage"] < 300
        if r["mode"] == "timing":
            assert r["simpy_match"] is True
            assert len(r["passes"]["wall_s"]) == bench.PASSES and r["wall_s"] == min(r["passes"]["wall_s"])
            assert r["speed_vs_simpy"] == pytest.approx(r["simpy_s"] / r["wall_s"])
    assert (tmp_path / "decode.csv").read_text().startswith("variant,kv_len,tile,mode")
    out = capsys.readouterr().out
    assert "time per tile" in out and "op_log: at most" in out


def test_bench_quiet_shows_no_progress_bar(tmp_path, monkeypatch, capsys):
    """``-q`` turns the progress bars off, as on every other command; without it a bar is drawn."""
    from kbwork import bench

    monkeypatch.setattr(bench, "MIN_SECONDS", 0.001)
    monkeypatch.setattr(bench, "compare_case", lambda kv, budget: {"kv_len": kv, "compare_ms": 1.0,
                                                                 "budget_ms": budget, "within_budget": True})
    monkeypatch.setattr(bench, "gantt_case", lambda: None)
    argv = ["--kv-lens", "256", "--modes", "timing", "--no-refs", "--out", str(tmp_path)]
    assert bench.main(argv) == 0
    assert "timing pass" in capsys.readouterr().err
    assert bench.main(argv + ["-q"]) == 0
    err = capsys.readouterr().err
    assert "timing pass" not in err and "decode" not in err.replace("decode.csv", "").replace("decode.json", "")
    assert "wrote" in err  # what was written is still said
