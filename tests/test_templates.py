"""Plan templates (pe/templates.py): stamping a recorded plan must give exactly the stages the
plan generator would have produced — same rows, same dependencies, same staging-ring state.

Data mode never uses templates (it needs each stage's effect), so a data-mode op_log is the
reference; timing mode is run twice so the second run stamps from templates the first recorded.
"""

from __future__ import annotations

import pytest

import kbwork
from kbwork import decode
from kbwork.kernels.gemm import BENCHES
from kbwork.config import load_topology
from kbwork.oplog import build_op_log, to_csv
from kbwork.pe import templates
from kbwork.pe.engines import Latency
from kbwork.pe.scheduler import schedule
from kbwork.device import simulate

from test_core_timeline import build_and_run, make_program  # rootdir-relative: tests/ is on sys.path

TOPOLOGIES = [
    {},
    {"hazard_policy": "rw_aware"},
    {"tile_buffers": 3, "tile_k": 32},        # several k-tiles per command, more reads than buffers
    {"tile_buffers": 1, "cmd_queue_depth": 2},
    {"tile_m": 16, "tile_n": 48, "tile_k": 64},
]


def _log_without_templates(run) -> str:
    p = run.program
    prog = schedule(p.commands, p.topo, waits=[(b, t) for b, ws in enumerate(p.waits) for t in ws],
                    templates=False)
    return to_csv(build_op_log(prog, simulate(prog)))


def _stamped(run) -> int:
    """How many commands of ``run`` had a template to stamp from (so the test is not vacuous)."""
    known = templates.PLAN_CACHE.plans_for(run.topology)
    return sum(1 for c in run.commands if c.ops and isinstance(known.get(templates.signature_key(c)),
                                                                 templates.PlanTemplate))


@pytest.mark.parametrize("overrides", TOPOLOGIES, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "default")
@pytest.mark.parametrize("variant", ["opt2", "opt3"])
def test_decode_op_log_is_the_same_with_and_without_templates(variant, overrides):
    data = decode.run(variant, kv_len=1024, mode="data", **overrides).to_csv()
    for _ in range(2):  # the first run records, the second stamps every repeated command
        r = decode.run(variant, kv_len=1024, mode="timing", **overrides)
        assert r.to_csv() == data
    assert _log_without_templates(r.run) == data
    assert _stamped(r.run) >= 2 * r.n_tiles - 2  # qk and the merge/pv GEMM of (almost) every tile


# math_chain streams whole rows, which outgrow a small-tile staging buffer (and at scale 2 even
# the default one), so it runs at scale 1 and not under small tiles
BENCH_CASES = [pytest.param(name, overrides, id=f"{name}-{oid}")
               for name in BENCHES
               for overrides, oid in zip(TOPOLOGIES[:3], ("default", "rw_aware", "small_tiles"))
               if not (name == "math_chain" and oid == "small_tiles")]


@pytest.mark.parametrize("name, overrides", BENCH_CASES)
def test_benches_are_the_same_with_and_without_templates(name, overrides):
    scale = 1 if name == "math_chain" else 2
    data = BENCHES[name](kbwork.Simulator(mode="data", **overrides), scale=scale).run.to_csv()
    for _ in range(2):
        run = BENCHES[name](kbwork.Simulator(mode="timing", **overrides), scale=scale).run
        assert run.to_csv() == data
    assert _log_without_templates(run) == data


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("overrides", TOPOLOGIES, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "default")
def test_random_programs_are_the_same_with_and_without_templates(seed, overrides):
    steps = make_program(seed, 60)
    data = build_and_run(steps, seed, "data", **overrides)[0].to_csv()
    for _ in range(2):
        run = build_and_run(steps, seed, "timing", **overrides)[0]
        assert run.to_csv() == data
    assert _log_without_templates(run) == data


def test_random_programs_do_stamp():
    steps = make_program(1, 80)
    build_and_run(steps, 1, "timing")
    run = build_and_run(steps, 1, "timing")[0]
    assert _stamped(run) >= 10


def test_a_command_whose_named_handles_share_a_name_is_planned_afresh():
    # a GEMM streaming the same HBM tensor as a and b: "X|X" cannot say which operand is which,
    # so no template is recorded for it, and the schedule is still the generator's
    sim = kbwork.Simulator(mode="timing")
    x = sim.hbm("X", shape=(64, 64), dtype="bf16")
    y = sim.hbm("Y", shape=(64, 64), dtype="fp32")

    def kernel(tl):
        for j in range(4):
            with tl.iteration(j):
                tl.composite(op="gemm", a=x, b=x, trans_b=True, out=y)

    run = sim.run(kernel)
    assert templates.record(run.commands[0], run.topology, Latency(run.topology)) is None
    assert run.to_csv() == _log_without_templates(run)
    assert set(run.op_log.tensor.astype(str)) >= {"X", "X|X", "Y"}


def test_template_cache_is_keyed_by_what_plans_read_and_bounded():
    cache = templates.PlanCache(max_tables=4, max_plans=3)
    base = load_topology()
    # the calibration widget's moves do not touch plans: the same table serves them
    key = ("sig",)
    cache.plans_for(base).put(key, "tpl")
    same = [base.replace(fixed_cycles=0), base.replace(r_cycles_per_byte=0.5, cmd_queue_depth=2),
            base.replace(hazard_policy="rw_aware")]
    assert all(cache.plans_for(t).get(key) == "tpl" for t in same)
    assert cache.plans_for(base.replace(tile_k=64)).get(key) is templates.UNSEEN
    for i in range(6):  # more topologies than the bound: the least recently used go first
        cache.plans_for(base.replace(dma_base_cycles=100 + i)).put(key, i)
    assert len(cache._tables) == 4 and cache.plans_for(base).get(key) is templates.UNSEEN
    assert cache.plans_for(base.replace(dma_base_cycles=105)).get(key) == 5
    plans = cache.plans_for(base)
    for i in range(5):
        plans.put((i,), i)
    assert len(plans) == 3 and plans.get((0,)) is templates.UNSEEN and plans.get((4,)) == 4
    cache.clear()
    assert len(cache) == 0
    for f in ("tile_k", "tile_buffers", "math_cost_exp", "gemm_base_cycles", "tcm_bytes"):
        assert f in kbwork.config.planned_keys()


def test_templates_recorded_under_one_calibration_serve_another():
    decode.run("opt3", kv_len=1024, mode="timing", fixed_cycles=7)
    moved = decode.run("opt3", kv_len=1024, mode="timing", fixed_cycles=300, r_cycles_per_byte=0.25)
    assert _stamped(moved.run) >= 2 * moved.n_tiles - 2
    fresh = decode.run("opt3", kv_len=1024, mode="data", fixed_cycles=300, r_cycles_per_byte=0.25)
    assert moved.to_csv() == fresh.to_csv()


def test_a_template_has_a_readable_repr():
    r = decode.run("opt3", kv_len=512, mode="timing")
    r = decode.run("opt3", kv_len=512, mode="timing")
    pv = next(c for c in r.run.commands if c.label == "pv")
    tpl = templates.PLAN_CACHE.plans_for(r.topology).get(templates.signature_key(pv))
    assert repr(tpl) == "PlanTemplate(4 stages, staging buffers taken {'b': 1})"


def test_the_stage_table_reads_its_command_blocks_as_absolute_dependencies():
    """A table keeps each command's dependencies relative to its first stage (so a template extends lists);
    ``preds`` reads them back absolute, local ones first, and ``lsucc`` is exactly their reverse."""
    run = decode.run("opt3", kv_len=256, mode="timing", steady_state=False).run
    table = run.program.table
    assert len(table) == run.n_stages == len(table.preds)
    for s in range(len(table)):
        ps = table.preds[s]
        b = table.cbase[table.cmd[s]]
        assert all(q < s for q in ps)
        assert [q for q in ps if q >= b] == [b + x for x in table.lpreds[s]]
        assert all(q < b for q in table.xpreds[s])
        for y in table.lsucc[s]:
            assert table.kind[b + y] > 1 and s - b in table.lpreds[b + y]
    assert list(table.preds)[7] == table.preds[7] == table.preds[7 - len(table)]
    assert table.preds[3:6] == [table.preds[i] for i in (3, 4, 5)]
    assert "StageTable(" in repr(table) and table.describe(5).startswith("seq 5: ")
