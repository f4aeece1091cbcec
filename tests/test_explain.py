"""Where the time goes, in words: analysis.explain, kbwork explain, compare's bound line, and the
numbers the README, docs and notebook 02 state."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

import kbwork
from kbwork import ValidationError, analysis, decode
from kbwork.cli import main as cli_main
from kbwork.device import CAUSES

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def strict():
    return decode.compare(kv_len=4096, mode="timing")


@pytest.fixture(scope="module")
def rw():
    return decode.compare(kv_len=4096, mode="timing", hazard_policy="rw_aware")


def _cli(argv, capsys):
    try:
        code = cli_main(list(argv))
    except SystemExit as exc:  # argparse's own errors
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


# --- analysis.explain --------------------------------------------------------------------------------------
def test_explain_gathers_the_analyses_of_a_run(strict):
    r = strict.opt2
    x = analysis.explain(r)
    assert x.name == "opt2" and x.cycles == r.cycles and x.hazard_policy == "strict_fifo"
    assert x.holds == len(r.run.holds())
    assert x.utilization.equals(analysis.utilization(r.op_log))
    assert x.attribution.equals(analysis.attribution(r.run))
    assert x.by("engine").sum() == x.by("cause").sum() == r.cycles
    assert list(x.by("cause").index) == list(CAUSES)
    # the same from the Run itself, under another name
    assert analysis.explain(r.run, "mine").sentence.startswith("mine is ")
    assert analysis.explain(r.run).name == "run"


def test_the_bound_is_derived_from_the_numbers(strict, rw):
    x = analysis.explain(strict.opt2)
    b = x.bound
    eng = x.by("engine")
    assert b["engine"] == eng.idxmax() == "PE_GEMM" and b["engine_cycles"] == eng.max()
    busy = x.utilization.set_index("engine")["busy_fraction"]
    assert b["busy_fraction"] == busy["PE_GEMM"] < analysis.SATURATED
    assert b["kind"] == "latency" and b["second_engine"] == "PE_DMA"
    causes = x.by("cause").drop("dependency")
    assert b["cause"] == causes.idxmax() == "hazard"
    assert x.sentence == ("opt2 is latency-bound: its critical path is 67% PE_GEMM and 31% PE_DMA work, and "
                          "PE_GEMM is busy 67% of the 76966 cycles; stages released by hazard holds carry 29% "
                          "of the path (35 commands held).")
    y = analysis.explain(rw.opt3)
    assert y.bound["kind"] == "throughput" and y.bound["engine"] == "PE_GEMM"
    assert y.bound["busy_fraction"] == pytest.approx(51712 / 56176)
    assert y.sentence.startswith("opt3 is throughput-bound on PE_GEMM: it is busy 92% of the 56176 cycles")
    # the threshold is a parameter, not a constant baked into the words
    assert analysis.explain(rw.opt3, saturated=0.95).bound["kind"] == "latency"
    assert analysis.explain(strict.opt2, saturated=0.5).bound["kind"] == "throughput"


def test_the_bound_follows_the_machine_a_slow_dma_makes_a_dma_bound_run():
    slow = decode.run("opt2", kv_len=2048, mode="timing", dma_bytes_per_cycle=4, dma_channels=1)
    x = analysis.explain(slow)
    assert x.bound["engine"] == "PE_DMA" and x.bound["kind"] == "throughput"
    assert "throughput-bound on PE_DMA" in x.sentence and "throughput-bound on PE_DMA" in x.short


def test_a_chain_of_exps_on_one_tensor_is_math_bound_and_held_by_hazards():
    sim = kbwork.Simulator(mode="timing")

    def kernel(tl):
        a = tl.alloc((64, 512), "fp32", name="a")
        for _ in range(6):
            tl.composite(op="math", math_op="exp_diff", a=a, b=a, out=a)

    x = analysis.explain(sim.run(kernel))
    assert (x.bound["kind"], x.bound["engine"], x.bound["cause"]) == ("throughput", "PE_MATH", "hazard")
    assert x.holds == 5 and "(5 commands held)" in x.sentence


def test_one_small_command_is_latency_bound_with_no_waiting_cause():
    sim = kbwork.Simulator(mode="timing")

    def kernel(tl):
        tl.full((8, 1), 0.0, "fp32", name="z")

    x = analysis.explain(sim.run(kernel))
    assert x.bound["kind"] == "latency" and x.bound["engine"] == "PE_CPU" and x.bound["cause"] is None
    assert x.by("cause")["dependency"] == x.cycles
    assert "carry" not in x.sentence and "after" not in x.short
    assert x.sentence.startswith("run is latency-bound: its critical path is ")


def test_top_waits_are_the_largest_cells_of_waits(strict):
    run = strict.opt3.run
    w = analysis.waits(run)
    top = analysis.top_waits(run, 4)
    assert len(top) == 4
    cells = sorted(((int(w.iloc[i][c]), w.iloc[i]["stage"], w.iloc[i]["engine"], c) for i in range(len(w))
                    for c in ("dependency", "hazard", "queue", "wait", "scheduler", "engine_busy")), reverse=True)
    assert list(top["cycles"]) == [c[0] for c in cells[:4]]
    first = top.iloc[0]
    row = w[(w.stage == first.stage) & (w.engine == first.engine)].iloc[0]
    assert row[first.cause] == first.cycles and row["stages"] == first.stages
    with pytest.raises(ValidationError, match="positive number"):
        analysis.top_waits(run, 0)


def test_explain_all_tables_and_json(strict, rw):
    xs = analysis.explain_all(strict)
    assert list(xs) == ["opt2", "opt3"]
    table = analysis.attribution_table(xs)
    assert list(table.columns) == ["variant", "by", "name", "cycles", "fraction"]
    for v, r in strict.runs.items():
        for by in ("engine", "cause"):
            assert table[(table.variant == v) & (table.by == by)]["cycles"].sum() == r.cycles
    wide = analysis.attribution_wide({**{f"{v} strict": r for v, r in strict.runs.items()},
                                      **{f"{v} rw": r for v, r in rw.runs.items()}}, by="cause")
    assert list(wide.index) == ["opt2 strict", "opt3 strict", "opt2 rw", "opt3 rw"]
    assert (wide.drop(columns="cycles").sum(axis=1) == wide["cycles"]).all()
    assert "queue" not in wide.columns  # zero everywhere, dropped
    util = analysis.utilization_wide(xs)
    assert util.loc["opt2", "PE_GEMM"] == pytest.approx(51712 / 76966)
    d = json.loads(json.dumps(xs["opt3"].to_dict()))
    assert d["cycles"] == 81979 and d["critical_path"]["engine"]["PE_MATH"] == 5583
    assert d["sentence"] == xs["opt3"].sentence and d["bound"]["kind"] == "latency"
    with pytest.raises(ValidationError, match="explain takes"):
        analysis.explain(strict.opt2.op_log)
    with pytest.raises(ValidationError, match="saturated"):
        analysis.explain(strict.opt2, saturated=0)
    with pytest.raises(ValidationError, match=r"explain: name=5 must be text"):
        analysis.explain(strict.opt2, name=5)
    with pytest.raises(ValidationError, match="explain_all takes"):
        analysis.explain_all([strict.opt2])
    with pytest.raises(ValidationError, match="by="):
        analysis.attribution_wide(xs, by="unit")


# --- kbwork explain ----------------------------------------------------------------------------------------
def test_kbwork_explain_prints_each_variant_and_what_bounds_it(capsys):
    code, out, err = _cli(["explain", "--kv-len", "4096"], capsys)
    assert code == 0 and not err
    assert "mode=timing" in out and "hazards=strict_fifo" in out
    blocks = {v: out[out.index(f"\n{v}: "):] for v in ("opt2", "opt3")}
    assert "opt2: 76966 cycles" in out and "opt3: 81979 cycles" in out
    for v, block in blocks.items():
        for unit in ("PE_CPU", "PE_SCHEDULER", "PE_DMA", "PE_GEMM", "PE_MATH"):
            assert f"\n  {unit}" in block
        assert "critical path by cause:" in block and "top waits" in block
    x = analysis.explain(decode.run("opt3", kv_len=4096, mode="timing"))
    assert f"  bound: {x.sentence}" in out
    assert out.rstrip().endswith("fastest end to end: opt2 (76966 cycles); opt3 takes 1.065x as long")


def test_kbwork_explain_json_png_and_one_variant(tmp_path, capsys):
    png = tmp_path / "where.png"
    code, out, err = _cli(["explain", "--variants", "a1", "--kv-len", "512", "--json", "--png", str(png),
                           "--top", "2", "--hazard-policy", "rw_aware"], capsys)
    assert code == 0
    d = json.loads(out)
    assert d["variants"] == ["a1"] and d["params"]["hazard_policy"] == "rw_aware"
    x = d["explain"]["a1"]
    assert sum(x["critical_path"]["engine"].values()) == sum(x["critical_path"]["cause"].values()) == x["cycles"]
    assert len(x["top_waits"]) == 2
    assert x["sentence"] == analysis.explain(decode.run("a1", kv_len=512, mode="timing",
                                                        hazard_policy="rw_aware")).sentence
    assert png.read_bytes()[:4] == b"\x89PNG" and f"wrote {png}" in err


@pytest.mark.parametrize("argv,pattern", [
    (["explain", "--variants", "opt9"], r"unknown variant\(s\) opt9"),
    (["explain", "--variants", "opt2,opt2"], r"one or more different variants"),
    (["explain", "--kv-len", "1000"], r"not a multiple of tile"),
    (["explain", "--png", "{tmp}/out.jpg"], r"--png: .* does not end in \.png"),
    (["explain", "--png", "{tmp}/missing/out.png"], r"--png: the directory .* does not exist"),
    (["explain", "--png", "{tmp}"], r"--png: .* is a directory"),
    (["explain", "--top", "0"], r"--top: expected an integer between 1 and 100"),
    (["explain", "--hazard-policy", "fifo"], r"invalid choice: 'fifo'"),
    (["explain", "--topology", "nope"], r"topology 'nope' not found"),
    (["explain", "--fixed", "-3"], r"--fixed: expected an integer"),
])
def test_kbwork_explain_mistakes_exit_2_before_simulating(argv, pattern, tmp_path, capsys, monkeypatch):
    from kbwork import sim

    def no_simulation(*a, **k):
        raise AssertionError("simulated before the arguments were checked")

    monkeypatch.setattr(sim, "simulate_device", no_simulation)
    code, out, err = _cli([a.replace("{tmp}", str(tmp_path)) for a in argv], capsys)
    assert code == 2
    assert re.search(pattern, err), err
    assert "Traceback" not in err and not out


# --- kbwork compare ----------------------------------------------------------------------------------------
def test_compare_adds_one_line_saying_what_bounds_each_variant(capsys, strict):
    code, out, _ = _cli(["compare", "--kv-len", "4096", "--mode", "timing"], capsys)
    assert code == 0
    lines = out.splitlines()
    bound = [ln for ln in lines if ln.startswith("what bounds each: ")]
    assert len(bound) == 1
    xs = analysis.explain_all(strict)
    assert bound[0] == "what bounds each: " + "; ".join(f"{v} {x.short}" for v, x in xs.items())
    assert "opt2 latency-bound (critical path 67% PE_GEMM, 31% PE_DMA; 29% after hazard holds)" in bound[0]
    # every line it printed before is still there, in order
    from kbwork.cli import format_comparison

    assert [ln for ln in lines if not ln.startswith("what bounds each")] == format_comparison(strict).splitlines()
    code, out, _ = _cli(["compare", "--kv-len", "4096", "--mode", "timing", "--json"], capsys)
    assert json.loads(out)["bound"] == {v: x.short for v, x in xs.items()}


def test_compare_gantt_draws_the_variants_asked_for(tmp_path, capsys, monkeypatch):
    from kbwork import plots

    figs = []
    orig = plots.compare_gantt
    monkeypatch.setattr(plots, "compare_gantt", lambda *a, **k: figs.append(orig(*a, **k)) or figs[-1])
    png = tmp_path / "cmp.png"
    code, _, err = _cli(["compare", "--variants", "opt2,a1", "--kv-len", "512", "--mode", "timing", "--gantt",
                         str(png)], capsys)
    assert code == 0 and png.stat().st_size > 0, err
    panels = [ax.get_title(loc="left").split(" (")[0] for ax in figs[0].axes if ax.get_gid() == "gantt"]
    assert panels == ["opt2", "a1"]
    code, _, err = _cli(["compare", "--variants", "opt3,a1,opt2", "--kv-len", "256", "--mode", "timing",
                         "--gantt", str(png), "--gantt-tiles", "5"], capsys)
    assert code == 0 and "the run has 2 tiles; --gantt draws 2, not 5" in err
    assert [ax.get_title(loc="left").split(" (")[0] for ax in figs[1].axes if ax.get_gid() == "gantt"] == \
        ["opt3", "a1", "opt2"]


# --- the numbers the prose states --------------------------------------------------------------------------
def _headline(strict, rw):
    return {"76,966": strict.cycles_opt2, "81,979": strict.cycles_opt3, "76,166": rw.cycles_opt2,
            "56,176": rw.cycles_opt3, "1.065": round(strict.cycles_opt3 / strict.cycles_opt2, 3),
            "1.356": round(rw.cycles_opt2 / rw.cycles_opt3, 3)}


def _notebook_markdown(name: str) -> str:
    nb = json.loads((ROOT / "notebooks" / name).read_text(encoding="utf-8"))
    return "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")


@pytest.mark.parametrize("where", ["README.md", "docs/explain.md", "notebooks/02_decode_opt2_vs_opt3.ipynb"])
def test_the_headline_numbers_in_the_prose_are_what_the_simulator_measures(where, strict, rw):
    text = _notebook_markdown(Path(where).name) if where.endswith(".ipynb") else (ROOT / where).read_text("utf-8")
    for shown, measured in _headline(strict, rw).items():
        if shown.startswith("1."):
            if shown in text:
                assert float(shown) == measured, (where, shown, measured)
        else:
            assert shown in text, f"{where} no longer states {shown}"
            assert int(shown.replace(",", "")) == measured, (where, shown, measured)
    assert rw.cycles_opt3 < rw.cycles_opt2 and strict.cycles_opt2 < strict.cycles_opt3


def test_the_mechanism_the_prose_gives_for_rw_aware_holds(rw):
    """opt3's qk(j+1) waits only for the micro-op that last read its S buffer; opt2's for the whole
    pv_merge of tile j-1 (README, docs/explain.md, notebooks 02 and 04)."""
    for v, waits_for in (("opt3", {"exp_diff P"}), ("opt2", {"pv_merge", "qk"})):
        run = rw.runs[v].run
        tl, labels = run.timeline, run.program.labels
        seen = set()
        for i, c in enumerate(tl.held):
            if labels[c] == "qk" and c > 10:
                seen |= {labels[h] for h in tl.hit[tl.hit_ptr[i]:tl.hit_ptr[i + 1]]}
        assert seen == waits_for, (v, seen)
    # and under strict FIFO each variant has one tile DMA per tile released by a hold on its critical path
    for v, tensor in (("opt2", "K"), ("opt3", "V")):
        cp = decode.run(v, kv_len=4096, mode="timing").run.critical_path()
        held = cp[(cp.stage == "DMA_READ") & (cp.cause == "hazard")]
        assert (held["tensor"].astype(str).str[0] == tensor).mean() > 0.9
        assert len(held) >= 0.9 * 32


def test_the_readme_first_screen_states_the_result_and_its_command():
    head = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()[:45]
    text = "\n".join(head)
    assert "## The headline result" in text and "kbwork explain" in text
    assert "rw_aware" in text and np.any(["76,966" in ln for ln in head])
