"""Following a launch (``triton_emu.follow``): in a device run, a later launch of a kind is checked call by call
against the first one, and a composite equal to the recorded one is lowered only when its command is read.

What must hold: the kernel is still called once per launch; every result (op_log, commands, errors and where
they are raised) is what lowering every call as it is made gives; a launch that differs anywhere — a name it
reads, state it keeps, a scalar, a tensor it aliases, a buffer it adds — stops following there and is lowered
as it goes; and a PE whose launches followed to the end takes the followed PE's records without its commands
being made."""

from __future__ import annotations

import gc
import math
import os
from collections import Counter

import pandas as pd
import pytest

import kbwork
from kbwork import analysis
from kbwork import Launch, ValidationError
from kbwork.kernels.gqa_decode import gqa_decode
from kbwork.pe.program import LazyTrace

from device_cases import random_device_case, random_replicated_case  # tests/ is on sys.path
from hypothesis import HealthCheck, given, settings
from test_fuzz_loops import Env, kernel_fn
from test_fuzz_loops import kernels as loop_kernels


def decode_device(pes: int, kv: int = 1024, **overrides):
    sim = kbwork.Simulator("ahbm-device-v1", mode="timing", **overrides)
    plan = {}
    for p in range(pes):
        ch = sim.topo.home_channel(p)
        q = sim.hbm(f"q{p}", shape=(4, 64), dtype="bf16", channel=ch)
        K = sim.hbm(f"K{p}", shape=(kv, 64), dtype="bf16", channel=ch)
        V = sim.hbm(f"V{p}", shape=(kv, 64), dtype="bf16", channel=ch)
        O = sim.hbm(f"O{p}", shape=(4, 64), dtype="fp32", channel=ch)
        plan[p] = [Launch(gqa_decode, q, K, V, O, variant="opt2", tile=128)]
    return sim, plan


def fill_store(sim, pes, kernel, **kw):
    """One launch of ``kernel(tl, x, y, **kw)`` per PE over its own (64,) fp32 tensors."""
    return {p: [Launch(kernel, sim.hbm(f"x{p}", shape=(64,), dtype="fp32", channel=p),
                       sim.hbm(f"y{p}", shape=(64,), dtype="fp32", channel=p), **kw)] for p in range(pes)}


def unlowered(run, p: int) -> bool:
    """Whether PE ``p``'s launches were never lowered (their traces not made)."""
    return all(isinstance(prog.trace, LazyTrace) and prog.trace.__dict__.get("_build") is not None
               for prog in run.pe(p)._source)


def same_as_plain(sim, plan, run=None, before=lambda: None):
    """``run`` (or a fresh reduced run) against the plain simulation: CSV, frames PE by PE, every command.
    ``before`` is called before each run (a kernel with state of its own starts afresh)."""
    before()
    run = sim.run_device(plan) if run is None else run
    before()
    plain = sim.run_device(plan, reductions=False, steady_state=False)
    assert run.to_csv() == plain.to_csv()
    for p in plain.pes:
        pd.testing.assert_frame_equal(run.pe(p).op_log, plain.pe(p).op_log)
        assert list(run.pe(p).commands) == list(plain.pe(p).commands)
    return run


def test_identical_launches_follow_the_first_and_are_never_lowered():
    sim, plan = decode_device(6)
    run = sim.run_device(plan)
    assert run.reductions.replicated_from == {p: 0 for p in range(1, 6)}
    assert not unlowered(run, 0) and all(unlowered(run, p) for p in range(1, 6))
    assert "not lowered yet" in repr(run.pe(3)._source[0].trace)
    same_as_plain(sim, plan, run)  # reading the commands lowers them, as they would have been
    assert not unlowered(run, 3)


def test_the_kernel_is_called_once_per_launch():
    calls = []

    def k(tl, x, y):
        calls.append(x.name)
        buf = tl.full(x.shape, 1.0, "fp32", name="buf")
        tl.store(buf, y)
    sim = kbwork.Simulator(mode="timing", pes=4, hbm_channels=4)
    plan = fill_store(sim, 4, k)
    for p in (1, 2):
        plan[p].append(Launch(k, sim.hbm(f"u{p}", shape=(64,), dtype="fp32", channel=p),
                              sim.hbm(f"w{p}", shape=(64,), dtype="fp32", channel=p)))
    run = sim.run_device(plan)
    assert calls == ["x0", "x1", "u1", "x2", "u2", "x3"]
    assert run.reductions.replicated_from == {2: 1, 3: 0}  # PEs of one kind follow the first of that kind
    same_as_plain(sim, plan, run)


def test_a_kernel_that_reads_a_name_stops_following_where_its_calls_differ():
    def k(tl, x, y):
        buf = tl.full(x.shape, 1.0, "fp32", name="buf")
        if x.name == "x2":  # PE 2 does one more thing
            tl.composite(op="math", math_op="copy", a=buf, out=buf)
        tl.store(buf, y)
    sim = kbwork.Simulator(mode="timing", pes=4, hbm_channels=4)
    plan = fill_store(sim, 4, k)
    run = same_as_plain(sim, plan)
    assert run.reductions.replicated_from == {1: 0, 3: 0}
    assert len(run.pe(2).commands) == 3 and len(run.pe(1).commands) == 2


def test_a_kernel_with_state_of_its_own_follows_only_while_its_calls_agree():
    seen = []

    def k(tl, x, y):
        seen.append(x)
        # the third call fills with 2.0, the fourth with -0.0, the fifth with an int: none is the recorded 0.0
        value = {3: 2.0, 4: -0.0, 5: 0}.get(len(seen), 0.0)
        buf = tl.full(x.shape, value, "fp32", name="buf")
        tl.store(buf, y)
    sim = kbwork.Simulator(mode="timing", pes=6, hbm_channels=6)
    plan = fill_store(sim, 6, k)
    run = same_as_plain(sim, plan, before=seen.clear)
    # a fill's value changes numbers, never times: every PE takes PE 0's records, but only 1 and 5 followed it
    assert run.reductions.replicated_from == {p: 0 for p in range(1, 6)}
    seen.clear()
    run = sim.run_device(plan)
    assert [unlowered(run, p) for p in range(6)] == [False, True, False, False, False, True]
    fills = [run.pe(p).commands[0].ops[0].extra["value"] for p in range(6)]
    assert fills[2] == 2.0 and math.copysign(1, fills[3]) == -1 and type(fills[4]) is int


@pytest.mark.parametrize("how", ["aliased tensors", "another buffer", "another label", "another tile"])
def test_a_launch_unlike_the_first_is_not_taken_for_it(how):
    def k(tl, a, b, y, *, tile=32, label="copy", pad=False):
        if pad:
            tl.alloc((16,), "fp32", name="pad")  # moves every buffer after it
        t = tl.load(a[0:tile], name="t")
        u = tl.load(b[0:tile], name="u")
        tl.composite(op="math", math_op="max_elem", a=t, b=u, out=t, label=label)
        tl.store(t, y[0:tile])
    sim = kbwork.Simulator(mode="timing", pes=3, hbm_channels=3)
    plan = {}
    for p in range(3):
        a, b, y = (sim.hbm(f"{n}{p}", shape=(64, 8), dtype="fp32", channel=p) for n in "aby")
        kw = {}
        if p == 2:
            kw = {"aliased tensors": {}, "another buffer": {"pad": True}, "another label": {"label": "max"},
                  "another tile": {"tile": 16}}[how]
            if how == "aliased tensors":
                b = a  # PE 2 reads one tensor twice, where the others read two
        plan[p] = [Launch(k, a, b, y, **kw)]
    run = same_as_plain(sim, plan)
    assert run.reductions.replicated_from == {1: 0}


def test_an_error_in_a_following_launch_is_the_error_lowering_every_call_gives():
    def k(tl, x, y, *, v=1.0):
        buf = tl.alloc(x.shape, "fp32", name="buf")
        tl.composite(op="math", math_op="copy", a=buf, out=buf)
        tl.composite(op="math", math_op="fill", out=buf, value=v)  # the NaN of PE 2 is refused here
        tl.store(buf, y)

    def plan_for(sim):
        plan = fill_store(sim, 3, k)
        plan[2] = [Launch(k, *plan[2][0].args, v=math.nan)]
        return plan
    messages = []
    for reductions in (True, False):
        sim = kbwork.Simulator(mode="timing", pes=3, hbm_channels=3)
        with pytest.raises(ValidationError) as e:
            sim.run_device(plan_for(sim), reductions=reductions)
        messages.append(str(e.value))
        assert e.traceback[-1].name == "check_scalar"
    assert messages[0] == messages[1] and messages[0].startswith("PE 2, launch 0: command #1 op 0 (fill)")


def test_a_handle_of_another_run_is_refused_in_a_following_launch_as_in_any():
    kept = {}

    def k(tl, x, y):
        buf = tl.full(x.shape, 1.0, "fp32", name="buf")
        kept.setdefault(x.name, buf)
        src = kept["x0"] if x.name == "x2" and "once" in kept else buf  # PE 2 of the second run: run 1's buffer
        tl.store(src, y)
    sim = kbwork.Simulator(mode="timing", pes=3, hbm_channels=3)
    plan = fill_store(sim, 3, k)
    sim.run_device(plan)
    kept.clear()
    sim.run_device(plan)
    kept["once"] = True
    kept.pop("x2", None)
    with pytest.raises(ValidationError, match="PE 2, launch 0: tl.store source: .*TCM is fresh for every run"):
        sim.run_device(plan)


def test_a_following_kernel_reads_its_own_commands_as_they_are():
    def k(tl, x, y):
        buf = tl.full(x.shape, 1.0, "fp32", name="buf")
        tl.composite(op="math", math_op="copy", a=buf, out=buf, label=tl.commands[-1].label + " again")
        tl.store(buf, y)
    sim = kbwork.Simulator(mode="timing", pes=3, hbm_channels=3)
    run = same_as_plain(sim, fill_store(sim, 3, k))
    assert run.pe(2).commands[1].label == "fill buf again"


@pytest.mark.parametrize("seed", range(40))
def test_random_runs_give_every_command_lowering_every_call_gives(seed):
    case = random_replicated_case(seed) if seed % 2 else random_device_case(seed)
    same_as_plain(case.sim, case.plan)


def test_what_if_on_a_run_with_followers_is_what_if_on_the_plain_run():
    sim, plan = decode_device(4)
    run = sim.run_device(plan)
    plain = sim.run_device(plan, reductions=False)
    a = analysis.what_if(run, engine="PE_DMA", speedup=2)
    b = analysis.what_if(plain, engine="PE_DMA", speedup=2)
    pd.testing.assert_frame_equal(a, b)


def test_nothing_follows_in_data_mode_or_without_reductions():
    for mode, reductions in (("data", True), ("timing", False)):
        sim = kbwork.Simulator("ahbm-device-v1", mode=mode)
        plan = {p: [Launch(gqa_decode, sim.hbm(f"q{p}", shape=(4, 64), dtype="bf16", channel=p),
                           *(sim.hbm(f"{n}{p}", shape=(256, 64), dtype="bf16", channel=p) for n in "KV"),
                           sim.hbm(f"O{p}", shape=(4, 64), dtype="fp32", channel=p), variant="opt2", tile=128)]
                for p in range(2)}
        run = sim.run_device(plan, reductions=reductions)
        assert not any(isinstance(prog.trace, LazyTrace) for p in run.pes for prog in run.pe(p)._source)


def test_a_failed_following_launch_leaves_nothing_for_the_cyclic_collector():
    def k(tl, x, y):
        buf = tl.full(x.shape, 1.0, "fp32", name="buf")
        if x.name == "x2":
            raise RuntimeError("the kernel's own error")
        tl.store(buf, y)
    gc.collect()
    was = gc.get_debug()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        sim = kbwork.Simulator(mode="timing", pes=3, hbm_channels=3)
        with pytest.raises(RuntimeError, match="the kernel's own error") as e:
            sim.run_device(fill_store(sim, 3, k))
        assert "PE 2, launch 0" in "".join(e.value.__notes__)
        del sim, e
        gc.collect()
        assert sorted({type(o).__name__ for o in gc.garbage}) == []
    finally:
        gc.set_debug(was)
        gc.garbage.clear()


def test_a_following_call_whose_scratch_cannot_be_made_raises_what_the_call_made_as_it_is_raises():
    # PE 1 opens its scratch scope before the loop, PE 0 inside the body: at the recipe both have one scope
    # open, so the call equals PE 0's, but PE 1's recipe would allocate its scratch in a scope opened outside
    # the body; the error comes from finding the scratch, which a following call does as it is made
    import contextlib

    def k(tl, s_src, y):
        outside = s_src.name == "s1"
        m = tl.full((4, 1), 0.0, "fp32", name="m")
        l = tl.full((4, 1), 0.0, "fp32", name="l")
        O = tl.full((4, 16), 0.0, "fp32", name="O")
        S = tl.ring(2, (4, 16), "fp32", name="S")
        with tl.scratch_scope() if outside else contextlib.nullcontext():
            for j in tl.range(2):
                with tl.iteration(j), (contextlib.nullcontext() if outside else tl.scratch_scope()):
                    tl.composite(op="math", prologue=[{"op": "softmax_merge", "s": S[j], "m": m, "l": l, "O": O}])
        tl.store(O, y)

    messages = []
    for reductions in (True, False):
        sim = kbwork.Simulator(mode="timing", pes=2, hbm_channels=2)
        plan = {p: [Launch(k, sim.hbm(f"s{p}", shape=(4, 16), dtype="fp32", channel=p),
                           sim.hbm(f"y{p}", shape=(4, 16), dtype="fp32", channel=p))] for p in range(2)}
        with pytest.raises(kbwork.TraceError) as e:
            sim.run_device(plan, reductions=reductions)
        messages.append(str(e.value))
        # raised while PE 1 followed PE 0 (with reductions), by the call made as it is made (without)
        assert any(entry.name == "composite" and entry.path.name == "follow.py" for entry in e.traceback) \
            == reductions
    assert messages[0] == messages[1]
    assert messages[0].startswith("PE 1, launch 0: command #3 (in a tl.range body) prologue[0]: recipe "
                                  "'softmax_merge' allocates its scratch in a tl.scratch_scope() opened outside")


def test_a_command_emitted_by_a_path_that_is_not_followed_ends_the_following():
    # an extension of the kernel language that emits a command of its own (not a recorded tl call): a PE
    # following another cannot tell whether its command equals the other's, so it stops following there
    def emit_copy(tl, a, out, label):
        args = ("math", a, None, None, out, False, "copy", None, None, (), (), None, (), label)
        cmd, _ = tl._lower_composite(args, tl._where(), tl._iter)
        tl._emit(cmd)

    def k(tl, x, y):
        buf = tl.full(x.shape, 1.0, "fp32", name="buf")
        emit_copy(tl, buf, buf, "copy " + x.name)  # each PE's own label
        tl.store(buf, y)
    sim = kbwork.Simulator(mode="timing", pes=3, hbm_channels=3)
    run = same_as_plain(sim, fill_store(sim, 3, k))
    assert [run.pe(p).commands[1].label for p in range(3)] == ["copy x0", "copy x1", "copy x2"]


# --- random tl.range kernels (tests/test_fuzz_loops.py's generator), one copy per PE ------------------------
FOLLOW_EXAMPLES = int(os.environ.get("KBWORK_FUZZ_FOLLOW_EXAMPLES", "40"))
FOLLOWED = Counter()


def fuzz_kernel(tl, *, spec, env):
    """The fuzz's kernel ``spec`` over the handles of ``env`` (one env per PE, one kernel function for all:
    the PEs' launches are then of one kind, and the later ones follow the first)."""
    kernel_fn(spec, env, True)(tl)


@settings(max_examples=FOLLOW_EXAMPLES, derandomize=True, database=None, deadline=None,
          suppress_health_check=list(HealthCheck), print_blob=False)
@given(loop_kernels())
def _fuzz_following(kur):
    k, u, _ = kur
    pes = 3
    sim = kbwork.Simulator(mode="timing", **k.topo, pes=pes, hbm_channels=pes)
    plan = {}
    for p in range(pes):
        hbm = {}
        for d in u.declare():
            data = d.data()
            name = f"{d.id}_{p}"
            hbm[d.id] = (sim.hbm(name, shape=d.shape, dtype=d.dtype, channel=p) if data is None
                         else sim.hbm(name, data, dtype=d.dtype, channel=p))
        plan[p] = [Launch(fuzz_kernel, spec=k, env=Env(k, hbm))]
    run = sim.run_device(plan)
    FOLLOWED["PEs"] += pes - 1
    FOLLOWED["followed to the end"] += sum(unlowered(run, p) for p in range(1, pes))
    same_as_plain(sim, plan, run)


def test_random_tl_range_kernels_on_every_pe_give_what_lowering_every_call_gives():
    FOLLOWED.clear()
    _fuzz_following()
    # the layouts are identical, so every later PE should follow the first to its end (a kernel naming a
    # buffer after its tensor, tl.load without name=, stops following at that load)
    assert FOLLOWED["followed to the end"] >= FOLLOWED["PEs"] // 2, FOLLOWED


def test_a_buffer_whose_scope_closed_is_refused_in_a_following_launch_though_it_was_paired_before():
    # PE 0 copies its buffer twice in the scope that made it; PE 1 closes that scope and opens another before
    # the second copy: one scope is open at each call in both, and PE 1's buffer was paired at the first copy,
    # but its second use is refused, as it is when every call is lowered as it is made
    def k(tl, x, y):
        late = x.name == "x1"
        with tl.scratch_scope():
            buf = tl.full(x.shape, 1.0, "fp32", name="buf")
            tl.composite(op="math", math_op="copy", a=buf, out=buf)
            if not late:
                tl.composite(op="math", math_op="copy", a=buf, out=buf)
        if late:
            with tl.scratch_scope():
                tl.composite(op="math", math_op="copy", a=buf, out=buf)
    messages = []
    for reductions in (True, False):
        sim = kbwork.Simulator(mode="timing", pes=2, hbm_channels=2)
        with pytest.raises(ValidationError, match="PE 1, launch 0: command #2 op 0 .copy.: handle 'buf' was "
                                                  "allocated inside a tl.scratch_scope.. that has closed") as e:
            sim.run_device(fill_store(sim, 2, k), reductions=reductions)
        messages.append(str(e.value))
    assert messages[0] == messages[1]


@pytest.mark.parametrize("who", ["every PE", "the recorded PE"])
def test_a_kernel_changing_its_own_lists_after_a_call_gets_the_commands_of_its_calls_as_they_were_made(who):
    # a composite is lowered from its arguments as they are when it is made: a kernel that edits its epilogue
    # list after one call (for the next) must not have the recorded call compared, or a put-off call lowered,
    # with the edited list. With "the recorded PE", only PE 0 edits, after its call, to what PE 1 passes at
    # that call: PE 1's call must not be taken for PE 0's
    def k(tl, x, y):
        buf = tl.full(x.shape, 1.0, "fp32", name="buf")
        tmp = tl.full(x.shape, 0.0, "fp32", name="tmp")
        other = x.name == "x1" and who == "the recorded PE"
        epi = [{"op": "add", "other": tmp} if other else {"op": "scale", "factor": 2.0}]
        tl.composite(op="math", math_op="copy", a=buf, out=buf, epilogue=epi)
        if x.name == "x0" or who == "every PE":
            epi[0].clear()
            epi[0].update({"op": "add", "other": tmp})
        tl.composite(op="math", math_op="copy", a=buf, out=buf, epilogue=epi)
        tl.store(buf, y)
    sim = kbwork.Simulator(mode="timing", pes=3, hbm_channels=3)
    run = same_as_plain(sim, fill_store(sim, 3, k))
    kinds = [[run.pe(p).commands[c].ops[1].kind for c in (2, 3)] for p in range(3)]
    assert kinds[0] == ["scale", "add"] and kinds[2] == ["scale", "add" if who == "every PE" else "scale"]
    assert kinds[1] == (["scale", "add"] if who == "every PE" else ["add", "add"])


def test_the_arguments_a_call_keeps_copies_are_where_a_composite_takes_lists():
    import inspect

    from kbwork.triton_emu.follow import LISTS
    from kbwork.triton_emu.tl_context import TLContext
    params = list(inspect.signature(TLContext.composite).parameters)[1:]
    assert params[LISTS] == ["prologue", "epilogue", "ops", "rw_handles"]
