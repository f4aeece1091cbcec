"""The exact steady state (DESIGN.md §12, kbwork/steady.py): a timing-mode decode computed from a
short run with whole periods inserted reads exactly like the full simulation — cycles, per-tile
dispatch, the op_log byte for byte, the critical path, holds, utilisation, attribution, what-if."""

from __future__ import annotations

import numpy as np
import pytest

import kbwork
from kbwork import analysis, decode, steady

CONFIGS = [dict(), dict(fixed_cycles=0), dict(fixed_cycles=400), dict(r_cycles_per_byte=1.0),
           dict(hazard_policy="rw_aware"), dict(cmd_queue_depth=2), dict(cmd_queue_depth=32),
           dict(tile=64), dict(tile=256), dict(group=1), dict(group=32), dict(head_dim=64), dict(head_dim=256),
           dict(dma_channels=2), dict(tile_buffers=1), dict(tile_buffers=3, tile_k=64),
           dict(fixed_cycles=0, r_cycles_per_byte=0), dict(hazard_policy="rw_aware", cmd_queue_depth=2),
           dict(dma_channels=3, hazard_policy="rw_aware"), dict(cmd_queue_depth=1)]


def _pair(variant: str, n_tiles: int, **cfg):
    tile = cfg.pop("tile", 128)
    kw = dict(kv_len=n_tiles * tile, tile=tile, mode="timing", **cfg)
    return decode.run(variant, **kw), decode.run(variant, steady_state=False, **kw)


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()) or "default")
@pytest.mark.parametrize("variant", ["opt2", "opt3", "a1"])
def test_steady_state_reads_exactly_like_the_full_run(variant, cfg):
    # a deep queue warms up for longer: its runs need more tiles than the proof's short program
    fast, full = _pair(variant, 97 if cfg.get("cmd_queue_depth") == 32 else 49, **cfg)
    st = fast.run.steady_state
    assert st.path == "steady" and st.inserted > 0 and st.period >= 1, st
    assert full.run.steady_state.path == "full" and "steady_state=False" in full.run.steady_state.reason
    assert fast.cycles == full.cycles and fast.run.n_stages == full.run.n_stages
    assert len(fast.run.commands) == len(full.run.commands)
    assert fast.dispatch_per_tile.equals(full.dispatch_per_tile)
    assert fast.closed_form_per_tile.equals(full.closed_form_per_tile)
    assert fast.command_bytes_per_tile == full.command_bytes_per_tile
    assert fast.to_csv() == full.to_csv()  # every column, ready included, byte for byte
    assert fast.run.critical_path().equals(full.run.critical_path())
    assert fast.run.holds().equals(full.run.holds())
    assert analysis.utilization(fast.op_log).equals(analysis.utilization(full.op_log))
    assert analysis.attribution(fast.run).equals(analysis.attribution(full.run))
    assert analysis.waits(fast.run).equals(analysis.waits(full.run))


@pytest.mark.parametrize("variant,n_tiles", [("opt3", 1000), ("opt2", 777), ("a1", 131)])
def test_long_and_odd_runs(variant, n_tiles):
    fast, full = _pair(variant, n_tiles)
    assert fast.run.steady_state.path == "steady"
    assert (n_tiles - fast.run.steady_state.short_tiles) % fast.run.steady_state.period == 0
    assert fast.to_csv() == full.to_csv()
    assert fast.run.critical_path().equals(full.run.critical_path())


def test_what_if_on_a_steady_run_equals_the_full_runs():
    fast, full = _pair("opt3", 40, hazard_policy="rw_aware")
    assert analysis.what_if(fast).equals(analysis.what_if(full))


def test_compare_and_sweep_take_the_steady_path_and_agree_with_full_runs():
    cmp = decode.compare(kv_len=64 * 128, mode="timing", variants=("opt2", "opt3", "a1"))
    assert all(r.run.steady_state.path == "steady" for r in cmp.runs.values())
    full = {v: decode.run(v, kv_len=64 * 128, mode="timing", steady_state=False) for v in cmp.variants}
    assert cmp.cycles == {v: r.cycles for v, r in full.items()}
    sw = decode.sweep(kv_len=[64 * 128], fixed_cycles=[0, 40], workers=1, progress=False)
    assert list(sw.cycles[sw.fixed_cycles == 40]) == [full["opt2"].cycles, full["opt3"].cycles]


def test_the_program_and_commands_describe_the_full_run_lazily():
    fast, full = _pair("opt2", 60)
    prog = fast.run.program
    assert isinstance(prog, steady.PeriodicProgram) and repr(prog.commands).endswith("commands)")
    assert len(prog.commands) == len(full.run.commands)
    assert list(prog.iters) == list(full.run.program.iters) and list(prog.labels) == full.run.program.labels
    assert [c.label for c in fast.run.commands] == [c.label for c in full.run.commands]  # built on demand
    assert prog.full().logical_bytes == full.run.program.logical_bytes


def test_which_path_ran_is_said():
    fast, _ = _pair("opt3", 48)
    st = fast.run.steady_state
    assert f"proven from tile {st.from_tile}" in repr(st) and f"period {st.period} tiles" in repr(st)
    assert "steady state" in repr(fast.run)
    small = decode.run("opt3", kv_len=8 * 128, mode="timing")
    assert small.run.steady_state.path == "full" and "fewer than" in small.run.steady_state.reason
    data = decode.run("opt3", kv_len=64 * 128, mode="data")
    assert data.run.steady_state.path == "full" and "data mode" in data.run.steady_state.reason
    with pytest.raises(kbwork.ValidationError, match="steady_state must be True, False or None"):
        decode.run("opt3", kv_len=64 * 128, mode="timing", steady_state="yes")


def test_a_program_with_no_period_falls_back_and_says_so():
    """A loop whose every iteration moves more bytes than the last is never periodic."""
    def launch(n, snapshots=None, durations=None):
        sim = kbwork.Simulator(mode="timing")
        src = sim.hbm("src", shape=(n, 64), dtype="fp32")

        def kernel(tl):
            for j in range(n):
                with tl.iteration(j):
                    tl.load(src[0:j + 1], name=f"x{j}")
        return sim._launch(kernel, (), {}, snapshots, durations)

    loop = steady.LoopProgram(launch=launch, emit=lambda n: launch(n).program,
                              boundaries=lambda n: list(range(n - 1)), tail=lambda n: n - 1,
                              regions=lambda run: [])
    run, state = steady.run_steady(loop, 80)
    assert run is None and state.path == "full"
    assert f"no period of up to {steady.MAX_PERIOD} tiles proven within the first {steady.PROBE_TILES} tiles" \
        in state.reason and repr(state).startswith("SteadyState(full:")
    run, state = steady.run_steady(loop, 30)  # the probe is the whole run: it is returned as the full run
    assert run is not None and run.n_stages == launch(30).n_stages and state.path == "full"


def test_the_period_needs_equal_states_and_a_periodic_program():
    loop = decode._TimingLoop(kbwork.load_topology(), "opt3", 8, 128, 128, "bf16")
    snaps = dict.fromkeys(loop.program().boundaries(20))
    run = loop.launch(20, snaps)
    bounds = loop.program().boundaries(20)
    a, b, c = snaps[bounds[4]], snaps[bounds[6]], snaps[bounds[5]]
    assert steady._equivalent(a, b)
    shifted = a.shifted(b.t - a.t, b.seq - a.seq, b.cmd - a.cmd)
    assert shifted == b and all(e[0] >= b.t for e in shifted.events)
    # one tile on, the event loop's state may match too, but qk writes S1 where it wrote S0: the
    # footprints differ, so a period of one tile is refused and two tiles is the period
    regions = loop.regions(run)
    why = steady._periodic(run, bounds[4], loop.program().tail(20) - (c.cmd - a.cmd), c.cmd - a.cmd,
                           c.seq - a.seq, 1, regions)
    assert why is not None and "touches other bytes" in why
    assert steady._find_period(loop.program(), run, 20, snaps, steady._margin(loop.program(), run, 20))[1] == 2
