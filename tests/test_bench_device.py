"""``kbwork bench --suite device`` and ``--suite model`` at tiny sizes: they run, write their rows with the right
keys, check what they say they check, and say so when a row cannot run. Speed is never asserted."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from kbwork import decode

ROW_KEYS = {"measure", "variant", "num_label", "den_label", "unit", "num", "den", "ratio", "passes", "target",
            "met"}
ROOT = Path(__file__).resolve().parents[1]
#: 24 tiles: enough for the steady state to prove its period, jointly on a shared channel too.
KV = 24 * 128


@pytest.fixture
def tiny(monkeypatch):
    from kbwork import bench
    from kbwork.bench import device, model

    monkeypatch.setattr(bench, "MIN_SECONDS", 0.0)
    monkeypatch.setattr(bench, "WARMUP_RUNS", 1)
    monkeypatch.setattr(device, "KV", KV)
    monkeypatch.setattr(device, "DEVICE_PES", 3)
    monkeypatch.setattr(device, "BREAKDOWN_CALLS", 1)
    monkeypatch.setattr(device, "AB_KV", 512)
    monkeypatch.setattr(device, "AB_PASSES", 2)
    monkeypatch.setattr(device, "AB_FULL_RUNS", 1)
    monkeypatch.setattr(device, "AB_STEADY_RUNS", 1)
    monkeypatch.setattr(device, "AB_MIN_SECONDS", 0.0)
    monkeypatch.setattr(device, "AB_VARIANTS", ("opt2",))
    monkeypatch.setattr(model, "MODEL", "llama-3-8b")
    monkeypatch.setattr(model, "BATCH", 2)
    monkeypatch.setattr(model, "CONTEXT", 1024)
    monkeypatch.setattr(model, "MIXED_RANGE", (256, 1024))
    monkeypatch.setattr(model, "REF_KV", 512)
    monkeypatch.setattr(model, "SWEEP_BATCH", (1, 2))
    monkeypatch.setattr(model, "SWEEP_CONTEXT", (256, 512))
    monkeypatch.setattr(model, "SWEEP_HANDOFF_US", (0, 2))
    monkeypatch.setattr(model, "INTERACTIVE", (("llama-3-8b", 1, 512),))
    monkeypatch.setattr(model, "COLD_RUNS", 1)
    return bench


def _rows(tmp_path, name):
    result = json.loads((tmp_path / name).read_text())
    return result, {(r["measure"], r["path"] if r["measure"] == "before" else r["variant"]): r
                    for r in result["rows"]}


def _ratio_row_ok(r, passes):
    assert ROW_KEYS <= set(r), ROW_KEYS - set(r)
    assert r["num"] > 0 and r["den"] > 0 and r["ratio"] == pytest.approx(r["num"] / r["den"])
    assert len(r["passes"]["num"]) == len(r["passes"]["den"]) == len(r["passes"]["ratio"]) == passes
    assert r["num"] == min(r["passes"]["num"]) and r["den"] == min(r["passes"]["den"])


def test_device_suite_runs_at_tiny_sizes_and_writes_its_rows(tiny, tmp_path, capsys):
    from kbwork.bench import device

    # the "before" side is this very checkout: the mechanism (one interpreter per side, alternating) without
    # depending on the old commit being in the clone
    code = tiny.main(["--suite", "device", "--out", str(tmp_path), "--before", str(ROOT)])
    out, err = capsys.readouterr()
    result, by = _rows(tmp_path, "device.json")
    assert [r["measure"] for r in result["rows"]] == ["device", "shared", "before", "before"]
    for r in result["rows"][:2]:
        _ratio_row_ok(r, tiny.PASSES)
    for key in (("before", "full"), ("before", "steady")):
        _ratio_row_ok(by[key], 2)
    for r in result["rows"]:
        assert r["target"] == device.TARGETS[r["measure"]] and r["met"] == (r["ratio"] <= r["target"])
    dev = by["device", "opt2"]
    assert dev["pes"] == 3 and dev["kv_len"] == KV and dev["path"] == dev["path_ref"] == "steady"
    assert dev["cycles_ref"] == decode.run("opt2", kv_len=KV, mode="timing").cycles
    b = dev["breakdown"]
    assert set(b) == {"setup", "run_device", "emit", "simulate", "rest", "total"}
    _phases_add_up(b)
    prof = dev["profile"]
    assert prof["by_cumulative"] and any("gqa_decode" in f["function"] for f in prof["by_cumulative"])
    assert all(0 <= f["share"] <= 1.0 + 1e-9 for f in prof["by_cumulative"])
    shared = by["shared", "opt2"]
    assert shared["pes"] == 4 and shared["overrides"] == device.SHARED
    assert shared["steady_jointly"] and shared["op_log_equals_plain"]
    assert shared["cycles"] == shared["cycles_plain"] > shared["cycles_ref"]  # four PEs share one channel
    assert len(shared["steady_loops"]) == 4
    assert all(r["variant"] == "opt2" and r["kv_len"] == 512 for r in result["rows"][2:])
    for r in result["rows"][2:]:  # the best of each interpreter's runs, which are at least one
        assert all(n >= 1 for n in r["passes"]["num_runs"] + r["passes"]["den_runs"])
        assert all(b <= m for b, m in zip(r["passes"]["num"], r["passes"]["num_median"]))
    info = result["before"]
    assert info["before"] == str(ROOT) and "skipped" not in info and len(info["load_after_each_pass"]) == 2
    assert info["kbwork_before"].startswith(str(ROOT)) and info["kbwork_now"].startswith(str(ROOT))
    assert len(result["load_average_1min"]) == tiny.PASSES + 2
    assert set(result["machine"]) >= {"python", "numpy", "pandas", "date"}
    assert code == 0 and "CHECK FAILED" not in err
    assert "met?" in out and "steady state proven jointly on every PE: yes" in out


def test_device_suite_skips_the_old_code_row_when_the_commit_is_missing(tiny, tmp_path, monkeypatch, capsys):
    from kbwork.bench import device

    monkeypatch.setattr(device, "AB_COMMIT", "0" * 40)
    monkeypatch.setattr(device, "run_suite", _only_before(device))
    code = tiny.main(["--suite", "device", "--out", str(tmp_path)])
    out, err = capsys.readouterr()
    result, _ = _rows(tmp_path, "device.json")
    assert code == 0 and result["rows"] == []
    assert "is not in this clone" in result["before"]["skipped"] and "skipped" in out


def _only_before(device):
    def run_suite(*, before=None, instructions=False, show_progress=True):
        rows, info = device.before_rows(before, show_progress=show_progress)
        return {"rows": rows, "before": info, "load_average_1min": [0.0]}
    return run_suite


CACHEGRIND = """==1== Cachegrind, a high-precision tracing profiler
==1==
==1== I   refs:      9,411,934,007
"""


def test_instruction_counts_read_cachegrind_and_divide_the_runs_beyond_the_baseline(monkeypatch, tmp_path):
    from kbwork.bench import device

    assert device.valgrind_instructions(CACHEGRIND) == 9_411_934_007
    with pytest.raises(RuntimeError, match=r"no instruction count: valgrind: command failed"):
        device.valgrind_instructions("valgrind: command failed\n")
    # counts made up: each case's runs beyond the baseline, divided by the runs, per side
    per_case = {"opt2 full": 100, "opt2 steady": 20, "opt3 full": 180, "opt3 steady": 22}
    seen = []

    def fake(checkout, kv_len, case, n):
        seen.append((checkout, case, n))
        base = 9_000 if checkout == device.ROOT else 8_000
        return base + n * per_case.get(case, 0) * (1 if checkout == device.ROOT else 2)

    monkeypatch.setattr(device, "_instructions", fake)
    monkeypatch.setattr("shutil.which", lambda name: "/usr/bin/valgrind")
    # a directory without a kbwork package is no old checkout: skipped, saying so
    rows, info = device.instruction_rows(tmp_path, 512, runs=4, show_progress=False)
    assert rows == [] and "holds no kbwork package: the instruction counts are skipped" in info["skipped"]
    (tmp_path / "kbwork").mkdir()
    (tmp_path / "kbwork" / "__init__.py").write_text("")
    rows, info = device.instruction_rows(tmp_path, 512, runs=4, show_progress=False)
    assert [(r["variant"], r["path"], r["num"], r["den"]) for r in rows] == [
        ("opt2", "full", 100, 200), ("opt2", "steady", 20, 40), ("opt3", "full", 180, 360), ("opt3", "steady", 22, 44)]
    assert all(r["ratio"] == 0.5 for r in rows) and info["runs"] == 4
    assert [(c, n) for _, c, n in seen[:2]] == [("none", 0), ("opt2 full", 4)]
    lines = device.format_suite({"rows": [], "before": {"skipped": "x"}, "load_average_1min": [0.0],
                                 "instructions": {"rows": rows, **info}})
    assert any(line.strip().startswith("opt3 steady") and line.endswith("0.500x") for line in lines), lines
    # no valgrind: the counts are skipped, saying why
    monkeypatch.setattr("shutil.which", lambda name: None)
    rows, info = device.instruction_rows(tmp_path, 512, show_progress=False)
    assert rows == [] and "valgrind is not on the PATH" in info["skipped"]


def test_the_old_code_is_the_commits_tree(tmp_path):
    from kbwork.bench import device

    head = __import__("subprocess").run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True,
                                        text=True)
    if head.returncode:
        pytest.skip("not a git checkout")
    assert device.extract_commit("HEAD", tmp_path) is None
    assert (tmp_path / "kbwork" / "bench" / "__init__.py").is_file()
    assert "is not in this clone" in device.extract_commit("0" * 40, tmp_path / "none")


def test_the_one_pe_interpreter_refuses_a_kbwork_from_elsewhere(tmp_path):
    from kbwork.bench import device

    # the PYTHONPATH names a directory without kbwork: the interpreter finds the installed one and refuses it
    with pytest.raises(RuntimeError, match=r"failed \(status 1\): kbwork was imported from .*, not from"):
        device.ab_once(tmp_path, 512, 1, 1, ("opt2",))


def test_device_suite_says_when_a_check_fails():
    from kbwork.bench import device

    row = {"measure": "shared", "steady_jointly": False, "steady_loops": ["PE 0: loop 0: full"],
           "op_log_equals_plain": False}
    bad = device.checks_failed({"rows": [row]})
    assert len(bad) == 2 and "not proven jointly" in bad[0] and "PE 0: loop 0: full" in bad[0]
    assert "op_log differs" in bad[1]


def test_model_suite_runs_at_tiny_sizes_and_writes_its_rows(tiny, tmp_path, capsys):
    pytest.importorskip("distributed")
    from kbwork.bench import model

    code = tiny.main(["--suite", "model", "--out", str(tmp_path)])
    out, err = capsys.readouterr()
    result, by = _rows(tmp_path, "model.json")
    assert [r["measure"] for r in result["rows"]] == ["uniform", "mixed", "sweep"]
    for r in result["rows"]:
        _ratio_row_ok(r, tiny.PASSES)
        assert r["target"] == model.TARGETS[r["measure"]]
    uni, mixed, sweep = result["rows"]
    assert uni["met"] == (uni["ratio"] <= 250) and mixed["met"] == (mixed["ratio"] <= 7500)
    assert sweep["met"] == (sweep["ratio"] >= 1.6) and sweep["target_kind"] == "min"
    assert uni["contexts"] == [1024, 1024] and uni["model"] == "llama-3-8b"
    assert mixed["contexts"] == model.mixed_contexts() and all(256 <= c <= 1024 for c in mixed["contexts"])
    assert uni["cycles_ref"] == decode.run("opt2", kv_len=512, mode="timing").cycles
    assert sweep["points"] == 8 and sweep["frames_equal"] and sweep["frame_rows"] == 8
    assert sweep["workers_import_this_checkout"] and sweep["placement"] == "ahbm"
    (inter,) = result["interactive"]
    assert inter["model"] == "llama-3-8b" and inter["warm_s"] > 0 and inter["first_step_fresh_s"] > 0
    assert len(result["load_average_1min"]) == tiny.PASSES + 3
    assert code == 0 and "CHECK FAILED" not in err
    assert "met?" in out and "frames equal: yes" in out and "interactive: model.step('llama-3-8b'" in out


def test_model_suite_without_dask_says_the_sweep_row_is_skipped(tiny, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "distributed", None)  # import distributed raises ImportError
    code = tiny.main(["--suite", "model", "--out", str(tmp_path)])
    out, _ = capsys.readouterr()
    result, by = _rows(tmp_path, "model.json")
    sweep = by["sweep", "opt2"]
    assert code == 0 and "dask.distributed is not installed" in sweep["skipped"] and "met" not in sweep
    assert "skipped" in out and by["uniform", "opt2"]["met"] in (True, False)


def test_model_suite_says_when_a_check_fails():
    from kbwork.bench import model

    row = {"measure": "sweep", "frames_equal": False, "workers_import_this_checkout": False,
           "worker_kbwork": ["/elsewhere/kbwork/__init__.py"]}
    bad = model.checks_failed({"rows": [row]})
    assert len(bad) == 2 and "frames differ" in bad[0] and "/elsewhere" in bad[1]


@pytest.mark.parametrize("suite", ["device", "model"])
def test_device_and_model_suites_refuse_kv_lens(suite, capsys):
    from kbwork import bench

    with pytest.raises(SystemExit) as exc:
        bench.main(["--suite", suite, "--kv-lens", "4096"])
    assert exc.value.code == 2 and "--kv-lens does not apply" in capsys.readouterr().err


def test_before_applies_to_the_device_suite_only(capsys):
    from kbwork import bench

    with pytest.raises(SystemExit) as exc:
        bench.main(["--suite", "model", "--before", "/tmp"])
    assert exc.value.code == 2 and "--before applies to --suite device only" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        bench.main(["--suite", "loops", "--instructions"])
    assert exc.value.code == 2 and "--instructions applies to --suite device only" in capsys.readouterr().err


def test_interleaved_may_collect_garbage_before_each_timed_call(monkeypatch):
    import gc

    from kbwork.bench.loops import interleaved

    calls = []
    monkeypatch.setattr(gc, "collect", lambda *a: calls.append("gc"))
    interleaved({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, 0.0, repeats=2, warmup=1,
                collect=True)
    assert calls == ["a", "b"] + ["gc", "a", "gc", "b"] * 2


def _phases_add_up(b):
    # one call's phases, so they are parts of one another (up to float rounding), whatever the machine's speed
    assert min(b.values()) >= -1e-9
    assert b["emit"] + b["simulate"] + b["rest"] == pytest.approx(b["run_device"], abs=1e-9)
    assert b["setup"] + b["run_device"] == pytest.approx(b["total"], abs=1e-9)


def test_breakdown_reports_the_median_call_whose_phases_add_up(monkeypatch):
    from kbwork.bench import device

    totals = []
    real = device.device_launches

    def counted(*args, **kwargs):
        totals.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(device, "device_launches", counted)
    monkeypatch.setattr(device, "BREAKDOWN_CALLS", 3)  # the default is read at the call, so this counts
    b = device.breakdown(2, KV)
    assert len(totals) == 3
    _phases_add_up(b)
    assert len(device.breakdown(2, KV, calls=1)) == 6 and len(totals) == 4
