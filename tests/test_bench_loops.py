"""``kbwork bench --suite loops`` at tiny sizes: it runs, writes its rows with the right keys, and its floors
are what the suite says they are. Speed is never asserted."""

from __future__ import annotations

import json

import numpy as np
import pytest

from kbwork import decode

ROW_KEYS = {"measure", "variant", "num_label", "den_label", "kv_len", "unit", "num", "den", "ratio", "target", "met"}


def test_numpy_flash_decode_reproduces_decode_run():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    from kbwork.bench.loops import numpy_flash_decode

    q, k, v = decode.make_inputs(512, 8, 128, "bf16", 0)
    O = numpy_flash_decode(*(x.astype(ml_dtypes.bfloat16) for x in (q, k, v)))
    for variant in ("opt2", "opt3"):
        r = decode.run(variant, q=q, k=k, v=v, mode="data")
        assert O.dtype == np.float32 and np.max(np.abs(O - r.O)) <= 1e-6


def test_heap_loop_pushes_and_pops_everything():
    from kbwork.bench.loops import heap_loop

    assert heap_loop(0) is None and heap_loop(100) is None


def test_interleaved_calls_each_side_in_turn():
    from kbwork.bench.loops import interleaved

    calls = []
    t = interleaved({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, 0.0, repeats=3, warmup=1)
    assert set(t) == {"a", "b"} and calls == ["a", "b"] * 4


def test_loops_suite_runs_at_tiny_sizes_and_writes_its_rows(tmp_path, monkeypatch, capsys):
    pytest.importorskip("ml_dtypes")
    from kbwork import bench
    from kbwork.bench import loops

    monkeypatch.setattr(bench, "MIN_SECONDS", 0.0)
    monkeypatch.setattr(bench, "WARMUP_RUNS", 1)
    # 24 and 40 tiles: enough for the steady state to prove its period at both sizes
    monkeypatch.setattr(loops, "STEADY_KV", (24 * 128, 40 * 128))
    monkeypatch.setattr(loops, "FULL_KV", 512)
    monkeypatch.setattr(loops, "DATA_KV", 512)
    monkeypatch.setattr(loops, "RSS_KV", 1024)
    monkeypatch.setattr(loops, "RSS_RUNS", 1)
    code = bench.main(["--suite", "loops", "--out", str(tmp_path)])
    out, err = capsys.readouterr()
    result = json.loads((tmp_path / "loops.json").read_text())
    rows = result["rows"]
    assert [(r["measure"], r["variant"]) for r in rows] == (
        [("steady", v) for v in ("opt2", "opt3", "a1")] + [("full", v) for v in ("opt2", "opt3")]
        + [("data", v) for v in ("opt2", "opt3")] + [("rss", "opt2+opt3")])
    for r in rows:
        assert ROW_KEYS <= set(r), ROW_KEYS - set(r)
        assert r["num"] > 0 and r["den"] > 0 and r["ratio"] == pytest.approx(r["num"] / r["den"])
        assert r["target"] == loops.TARGETS[r["measure"]] and r["met"] == (r["ratio"] <= r["target"])
        if r["measure"] != "rss":
            assert len(r["passes"]["num"]) == bench.PASSES and r["num"] == min(r["passes"]["num"])
            assert r["den"] == min(r["passes"]["den"])
    by = {(r["measure"], r["variant"]): r for r in rows}
    assert all(by["steady", v]["path"] == by["steady", v]["path_ref"] == "steady" for v in ("opt2", "opt3", "a1"))
    assert by["full", "opt2"]["path"] == by["full", "opt3"]["path"] == "full"
    assert by["full", "opt2"]["stages"] == decode.run("opt2", kv_len=512, mode="timing").run.n_stages
    assert all(by["data", v]["floor_within_tolerance"] for v in ("opt2", "opt3"))
    rss = by["rss", "opt2+opt3"]
    assert rss["den"] == 2 * 1024 * 128 * 4 and rss["runs"][0]["peak_rss"] >= rss["runs"][0]["rss_after_import"]
    # started by a forked shell: the interpreter's ru_maxrss is its own, not this (larger) process's peak
    assert abs(rss["runs"][0]["peak_rss"] - rss["runs"][0]["vmhwm"]) <= 1 << 20
    assert set(result["machine"]) >= {"python", "numpy", "pandas", "date"}
    assert code == 0 and "CHECK FAILED" not in err
    assert "met?" in out and "numpy floor reproduces decode.run's O" in out



def test_loops_suite_says_when_a_check_fails(monkeypatch):
    from kbwork.bench import loops

    row = {"measure": "steady", "variant": "opt2", "path": "full", "path_ref": "steady", "reason": "why"}
    assert loops.checks_failed({"rows": [row]}) == ["opt2: the steady measure ran the full / steady path (why)"]
    # a ru_maxrss carried over from the process that started the interpreter is not its own peak
    run = {"peak_rss": 900 << 20, "vmhwm": 100 << 20, "peak_rss_at_import": 900 << 20, "vmhwm_at_import": 80 << 20}
    assert "not the interpreter's own peak" in loops.checks_failed({"rows": [{"measure": "rss", "runs": [run]}]})[0]


def test_loops_suite_refuses_kv_lens(capsys):
    from kbwork import bench

    with pytest.raises(SystemExit) as exc:
        bench.main(["--suite", "loops", "--kv-lens", "4096"])
    assert exc.value.code == 2 and "--kv-lens does not apply" in capsys.readouterr().err


def test_interleaved_calls_a_fast_side_several_times_per_round_of_a_slow_one(monkeypatch):
    """A side 10 times faster than the other is called about 10 times a round, so the slow side is not run
    until the fast one has its seconds."""
    import types

    from kbwork.bench import loops
    from kbwork.bench.loops import interleaved

    # a clock the two sides advance by their own durations: the counts follow from the rule, not from how
    # long this machine's sleep takes under load
    clock = [0.0]
    monkeypatch.setattr(loops, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
    calls = []

    def slow():
        calls.append("s")
        clock[0] += 0.05

    def fast():
        calls.append("f")
        clock[0] += 0.005

    t = interleaved({"s": slow, "f": fast}, 0.1, repeats=2, warmup=1, batch=True)
    timed = calls[2:]
    assert set(t) == {"s", "f"} and timed[0] == "s"
    # each round is one slow call, then slowest / fast = 10 fast ones, until both have 0.1 s and 2 calls
    assert timed == (["s"] + ["f"] * 10) * 2
