"""Handles and memory (DESIGN §2), topology loading (§1, §4, §10), errors, Run.read, Perfetto export (§6)."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

import kbwork
from kbwork import ConfigError, KbworkError, SimulationError, TcmOverflowError, ValidationError
from kbwork.memory import Handle, Space

#: DESIGN §1: the scheduler's staging buffers, tile_buffers per streamed operand slot (a: 32x128, b: 128x128),
#: sized for 4-byte elements, carved from the TCM before the kernel runs.
STAGING_BYTES = 2 * 32 * 128 * 4 + 2 * 128 * 128 * 4
TCM_BYTES = 1 << 20


# --- handles ------------------------------------------------------------------------------------------
def test_handles_are_frozen_values():
    h = Handle("x", Space.TCM, 128, (4, 8), "fp32", True)
    with pytest.raises(dataclasses.FrozenInstanceError):
        h.addr = 0  # type: ignore[misc]
    assert h == Handle("x", Space.TCM, 128, (4, 8), "fp32", True)
    assert hash(h) == hash(Handle("x", Space.TCM, 128, (4, 8), "fp32", True))
    assert (h.size, h.nbytes, h.end) == (32, 128, 256)


def test_space_is_truthful_and_pinned_iff_tcm():
    sim = kbwork.Simulator(mode="timing")
    x = sim.hbm("x", shape=(64, 32), dtype="bf16")
    seen: dict[str, Handle] = {}

    def kernel(tl):
        seen["ref"] = tl.ref(x)
        seen["slice"] = tl.ref(x)[0:16]
        seen["load"] = tl.load(x[16:32], name="x_part")
        seen["alloc"] = tl.alloc((8, 8), "fp16", name="scratch")
        seen["full"] = tl.full((8, 1), 0.0, name="acc")
        seen["tcm_slice"] = seen["load"][2:4]

    sim.run(kernel)
    assert x.space == "hbm" and x.space is Space.HBM and not x.pinned
    for key in ("ref", "slice"):
        assert seen[key].space == "hbm" and not seen[key].pinned
    for key in ("load", "alloc", "full", "tcm_slice"):
        assert seen[key].space == "tcm" and seen[key].pinned
    # a load allocates a fresh TCM buffer with the source's shape and dtype
    assert (seen["load"].shape, seen["load"].dtype, seen["load"].name) == ((16, 32), "bf16", "x_part")


def test_tl_ref_rejects_tcm_handles():
    sim = kbwork.Simulator(mode="timing")

    def kernel(tl):
        tl.ref(tl.alloc((2, 2), name="t"))

    with pytest.raises(ValidationError, match="HBM"):
        sim.run(kernel)


def test_row_slices_are_contiguous_named_views():
    sim = kbwork.Simulator(mode="timing")
    k = sim.hbm("K", shape=(512, 64), dtype="bf16")
    row = 64 * 2
    s = k[128:256]
    assert (s.name, s.space, s.addr, s.shape, s.dtype, s.pinned) == ("K[128:256]", k.space, k.addr + 128 * row,
                                                                      (128, 64), "bf16", False)
    assert s.nbytes == 128 * row and s.end == k.addr + 256 * row
    ss = s[32:64]
    assert (ss.name, ss.addr, ss.shape) == ("K[128:256][32:64]", k.addr + 160 * row, (32, 64))
    assert k[:10].addr == k.addr and k[500:].shape == (12, 64)
    v = sim.hbm("v", shape=(100,), dtype="fp32")
    assert (v[10:20].addr, v[10:20].shape) == (v.addr + 40, (10,))
    with pytest.raises(ValidationError, match="row slice"):
        k[::2]
    with pytest.raises(ValidationError, match="empty or out of range"):
        k[300:300]
    with pytest.raises(ValidationError):
        k[3]  # not a slice


def test_overlaps_use_byte_ranges_in_one_space():
    sim = kbwork.Simulator(mode="timing")
    k = sim.hbm("K", shape=(512, 64), dtype="bf16")
    other = sim.hbm("other", shape=(4, 4))
    assert k[0:128].overlaps(k[64:192]) and k[64:192].overlaps(k[0:128])
    assert not k[0:128].overlaps(k[128:256])              # adjacent, not overlapping
    assert k.overlaps(k[511:512]) and k[511:512].overlaps(k)
    assert not k.overlaps(other) and not other.overlaps(k)
    same_bytes_in_tcm = Handle("t", Space.TCM, k.addr, k.shape, k.dtype, True)
    assert not k.overlaps(same_bytes_in_tcm)              # same addresses, different memory
    # an aliasing view with another name and dtype still overlaps
    alias = Handle("alias", Space.HBM, k.addr + 10, (2,), "fp32", False)
    assert alias.overlaps(k[0:1])


def test_allocations_are_aligned_and_disjoint():
    sim = kbwork.Simulator(mode="timing")
    hs = [sim.hbm(f"h{i}", shape=(3, 5), dtype="bf16") for i in range(4)]
    assert all(h.addr % 64 == 0 for h in hs)
    assert all(not a.overlaps(b) for i, a in enumerate(hs) for b in hs[i + 1:])


# --- TCM scopes and overflow ----------------------------------------------------------------------------
def test_scratch_scope_releases_tcm_at_exit():
    sim = kbwork.Simulator(mode="timing")
    got: dict[str, Handle] = {}

    def kernel(tl):
        got["keep"] = tl.alloc((16, 16), name="keep")
        with tl.scratch_scope():
            got["s1"] = tl.alloc((64, 64), name="s1")
            with tl.scratch_scope():
                got["inner"] = tl.alloc((8, 8), name="inner")
            got["after_inner"] = tl.alloc((8, 8), name="after_inner")
        got["reuse"] = tl.alloc((64, 64), name="reuse")
        try:
            with tl.scratch_scope():
                got["doomed"] = tl.alloc((32, 32), name="doomed")
                raise RuntimeError("boom")
        except RuntimeError:
            pass
        got["after_error"] = tl.alloc((32, 32), name="after_error")
        tl.composite(op="math", math_op="fill", out=got["keep"], value=0.0)

    sim.run(kernel)
    assert got["after_inner"].addr == got["inner"].addr   # the inner scope's space came back
    assert got["reuse"].addr == got["s1"].addr            # the outer scope's too
    assert got["after_error"].addr == got["doomed"].addr  # released even when the block raises
    assert not got["keep"].overlaps(got["reuse"])


def test_kernel_scope_recipe_scratch_comes_from_the_top_of_the_tcm_and_the_two_ends_meet_at_overflow():
    from kbwork.memory import Arena
    tcm = Arena(Space.TCM, 4096, backed=False)
    low = tcm.alloc("low", (16,), "fp32")
    mark = tcm.mark()
    scoped = tcm.alloc("scoped", (100,), "fp32")
    top = tcm.alloc("top", (10,), "fp32", from_top=True)           # 40 B, aligned down below 4096
    assert (low.addr, scoped.addr, top.addr, tcm.high) == (0, 64, 4032, 4032) and tcm.free == 4032 - 464
    tcm.release(mark)                                               # a scope gives back both ends
    assert (tcm.top, tcm.high) == (64, 4096)
    tcm.alloc("top", (10,), "fp32", from_top=True)
    tcm.alloc("fill", (992,), "fp32")                               # 64 + 3968 = 4032: up to the top end
    with pytest.raises(TcmOverflowError, match=r"'more' \(4 B.*only 0 B of 4096 B are free"):
        tcm.alloc("more", (1,), "fp32", from_top=True)
    with pytest.raises(TcmOverflowError, match=r"only 0 B of 4096 B are free"):
        tcm.alloc("more", (1,), "fp32")

    sim = kbwork.Simulator(mode="timing")
    got = {}

    def kernel(tl):
        s, m, l, O = (tl.full((1, 1), v, "fp32", name=n) for n, v in (("s", 0.0), ("m", -np.inf), ("l", 0.0),
                                                                       ("O", 0.0)))
        with tl.scratch_scope():
            got["released"] = tl.alloc((8, 8), name="released")
        merged = tl.composite(op="math", prologue=[{"op": "softmax_merge", "s": s, "m": m, "l": l, "O": O}])
        got["P"] = merged.primary_out
        got["after"] = tl.alloc((8, 8), name="after")

    sim.run(kernel)
    # the recipe's scratch takes none of the bytes the scope released; the next allocation does
    assert got["P"].addr > got["after"].addr and got["after"].addr == got["released"].addr
    assert got["P"].end <= TCM_BYTES and not got["P"].overlaps(got["after"])


def test_every_run_starts_with_a_fresh_tcm_and_keeps_its_own_numbers():
    sim = kbwork.Simulator(mode="data")
    x = sim.hbm("x", np.arange(8, dtype=np.float32).reshape(2, 4))

    def kernel(tl, value):
        t = tl.load(x, name="t")
        tl.composite(op="math", math_op="copy", a=t, out=t, epilogue=[{"op": "scale", "factor": value}])

    r1 = sim.run(kernel, 2.0)
    r2 = sim.run(kernel, 3.0)
    assert r1.program.commands[0].dst.addr == r2.program.commands[0].dst.addr
    np.testing.assert_array_equal(r1.read("t"), np.arange(8).reshape(2, 4) * 2.0)
    np.testing.assert_array_equal(r2.read("t"), np.arange(8).reshape(2, 4) * 3.0)
    np.testing.assert_array_equal(r2.read("x"), np.arange(8).reshape(2, 4))  # HBM persists, untouched


def test_tcm_overflow_says_what_was_asked_what_is_free_and_who_holds_it():
    sim = kbwork.Simulator(mode="timing")

    def kernel(tl):
        tl.alloc((256, 256), "fp32", name="big1")
        tl.alloc((512, 512), "fp32", name="huge")

    with pytest.raises(TcmOverflowError) as err:
        sim.run(kernel)
    msg = str(err.value)
    asked = 512 * 512 * 4
    free = TCM_BYTES - STAGING_BYTES - 256 * 256 * 4
    assert "'huge'" in msg
    assert f"{asked} B" in msg
    assert f"only {free} B of {TCM_BYTES} B are free" in msg
    assert f"big1 {256 * 256 * 4} B" in msg and f"<staging buffers> {STAGING_BYTES} B" in msg
    assert isinstance(err.value, KbworkError) and isinstance(err.value, MemoryError)


def test_tcm_capacity_follows_the_topology():
    small = kbwork.Simulator(mode="timing", tcm_bytes=STAGING_BYTES + 4096)

    def kernel(tl, rows):
        tl.full((rows, 256), 0.0, "fp32", name="t")

    small.run(kernel, 4)  # exactly 4096 B: fits
    with pytest.raises(TcmOverflowError, match=r"only 4096 B"):
        small.run(kernel, 5)


# --- topology ------------------------------------------------------------------------------------------
DESIGN_DEFAULTS = dict(
    name="ahbm-pe-v1", clock_ghz=1.25,
    fixed_cycles=40, r_cycles_per_byte=0.0625, max_composite_logical_bytes=1024, cmd_queue_depth=8,
    plan_base_cycles=8, plan_cycles_per_op=2, hazard_policy="strict_fifo",
    dma_base_cycles=200, dma_bytes_per_cycle=64, dma_channels=1,
    fetch_bytes_per_cycle=128, gemm_base_cycles=16, mac_rows=32, mac_cols=32,
    tile_m=32, tile_n=128, tile_k=128, tile_buffers=2,
    math_base_cycles=8, math_elements_per_cycle=64, math_cost_exp=4, math_cost_other=1,
    tcm_bytes=1 << 20,
    pes=1, hbm_channels=1, channel_bytes_per_cycle=float("inf"),  # DESIGN §14: one PE alone
    hbm_gib=float("inf"),  # DESIGN §15 "Capacity: what fits": ahbm-pe-v1's HBM is unbounded
    sync_cycles=0,  # DESIGN §16: a launch dependency's signal latency, 0 unless a device sets it
    p_dtype="fp32",  # DESIGN §17: P written in fp32 unless asked
    # DESIGN §18: the energy keys, the same in both shipped topologies
    hbm_pj_per_bit=3.29, tcm_pj_per_byte=1.28, mac_pj=0.32, math_pj_per_element=0.32, dispatch_pj_per_cycle=8.0,
    pe_idle_mw=50.0,
)


def test_default_topology_has_the_design_numbers():
    topo = kbwork.load_topology()
    assert topo.to_dict() == DESIGN_DEFAULTS
    assert kbwork.load_topology("ahbm-pe-v1") == topo
    assert kbwork.Topology().to_dict() == DESIGN_DEFAULTS  # the dataclass defaults agree with the file
    assert kbwork.Simulator().topo == topo
    assert topo.cycles_to_us(40) == pytest.approx(0.032)  # FIXED = 32 ns at 1.25 GHz


def test_overrides_apply_everywhere():
    topo = kbwork.load_topology(fixed_cycles=80, r_cycles_per_byte=0.1, hazard_policy="rw_aware")
    assert (topo.fixed_cycles, topo.r_cycles_per_byte, topo.hazard_policy) == (80, 0.1, "rw_aware")
    rest = {k: v for k, v in topo.to_dict().items() if k not in ("fixed_cycles", "r_cycles_per_byte", "hazard_policy")}
    assert rest == {k: v for k, v in DESIGN_DEFAULTS.items() if k in rest}
    assert kbwork.load_topology().replace(tile_k=64).tile_k == 64
    assert kbwork.load_topology(topo, tile_k=64).fixed_cycles == 80
    sim = kbwork.Simulator(mode="timing", cmd_queue_depth=1, fixed_cycles=0)
    assert (sim.topo.cmd_queue_depth, sim.topo.fixed_cycles) == (1, 0)
    assert kbwork.Simulator(topo).topo is topo
    with pytest.raises(dataclasses.FrozenInstanceError):
        topo.fixed_cycles = 1  # type: ignore[misc]


def test_topology_from_a_toml_path(tmp_path):
    path = tmp_path / "fast.toml"
    path.write_text('name = "fast"\n[dispatch]\nfixed_cycles = 10\n[memory]\ntcm_bytes = 2097152\n')
    topo = kbwork.load_topology(path, cmd_queue_depth=4)
    assert (topo.name, topo.fixed_cycles, topo.tcm_bytes, topo.cmd_queue_depth) == ("fast", 10, 2 << 20, 4)
    assert topo.dma_base_cycles == 200  # keys the file leaves out keep their defaults
    run = kbwork.Simulator(str(path), mode="timing").run(lambda tl: tl.full((2, 2), 0.0, name="z"))
    assert run.op_log.iloc[0].end == 10 + 2  # fill: 20 logical bytes, ceil(0.0625 x 20) = 2
    # a file that names no machine is named after itself, not after the defaults it builds on
    unnamed = tmp_path / "my-pe.toml"
    unnamed.write_text("[memory]\ntcm_bytes = 2097152\n")
    topo = kbwork.load_topology(unnamed)
    assert (topo.name, topo.tcm_bytes, topo.fixed_cycles) == ("my-pe", 2 << 20, 40)
    assert kbwork.load_topology(unnamed, name="other").name == "other"


def test_a_topology_file_is_read_every_time_and_parsed_again_only_when_it_changed(tmp_path):
    path = tmp_path / "edited.toml"
    path.write_text("[dispatch]\nfixed_cycles = 10\n")
    first = kbwork.load_topology(path)
    assert kbwork.load_topology(path) is first  # the same bytes at the same path: the same frozen Topology
    path.write_text("[dispatch]\nfixed_cycles = 11\n")
    assert kbwork.load_topology(path).fixed_cycles == 11  # an edited file is what you get
    path.write_text("[dispatch]\nfixed_cycles = [")
    with pytest.raises(ConfigError, match="not valid TOML"):
        kbwork.load_topology(path)
    path.write_text("[dispatch]\nfixed_cycles = 10\n")
    assert kbwork.load_topology(path) == first
    other = tmp_path / "other.toml"  # another path with the same bytes: named after itself
    other.write_text(path.read_text())
    assert kbwork.load_topology(other).name == "other" and kbwork.load_topology(path).name == "edited"
    path.unlink()
    with pytest.raises(ConfigError, match="no such file"):
        kbwork.load_topology(path)


@pytest.mark.parametrize("overrides,key", [
    (dict(fixed_cycle=80), "fixed_cycle"),
    (dict(tile_size=64), "tile_size"),
    (dict(fixed_cycles=-1), "fixed_cycles"),
    (dict(r_cycles_per_byte=-0.5), "r_cycles_per_byte"),
    (dict(dma_bytes_per_cycle=0), "dma_bytes_per_cycle"),
    (dict(fetch_bytes_per_cycle=0), "fetch_bytes_per_cycle"),
    (dict(math_elements_per_cycle=0), "math_elements_per_cycle"),
    (dict(cmd_queue_depth=0), "cmd_queue_depth"),
    (dict(tile_buffers=0), "tile_buffers"),
    (dict(tile_k=0), "tile_k"),
    (dict(tcm_bytes=-1), "tcm_bytes"),
    (dict(clock_ghz=0.0), "clock_ghz"),
    (dict(clock_ghz=float("nan")), "clock_ghz"),
    (dict(max_composite_logical_bytes=0), "max_composite_logical_bytes"),
    (dict(tile_m=1.5), "tile_m"),
    (dict(dma_base_cycles="200"), "dma_base_cycles"),
    (dict(hazard_policy="random"), "hazard_policy"),
])
def test_bad_topology_values_are_config_errors_naming_the_key(overrides, key):
    with pytest.raises(ConfigError) as err:
        kbwork.load_topology(**overrides)
    assert repr(key) in str(err.value) or f"'{key}'" in str(err.value)
    with pytest.raises(ConfigError):
        kbwork.Simulator(**overrides)


def test_unknown_key_error_suggests_the_close_name():
    with pytest.raises(ConfigError, match=r"'fixed_cycle'.*Did you mean 'fixed_cycles'"):
        kbwork.load_topology(fixed_cycle=80)


def test_zero_is_allowed_where_it_means_free():
    topo = kbwork.load_topology(fixed_cycles=0, r_cycles_per_byte=0, dma_base_cycles=0)
    assert (topo.fixed_cycles, topo.r_cycles_per_byte, topo.dma_base_cycles) == (0, 0, 0)


def test_bad_topology_files_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="no-such-topology"):
        kbwork.load_topology("no-such-topology")
    bad = tmp_path / "bad.toml"
    bad.write_text("fixed_cycles = [")
    with pytest.raises(ConfigError, match="not valid TOML"):
        kbwork.load_topology(bad)
    unknown = tmp_path / "unknown.toml"
    unknown.write_text("[dispatch]\nfixed_cyclez = 3\n")
    with pytest.raises(ConfigError, match="fixed_cyclez"):
        kbwork.load_topology(unknown)
    twice = tmp_path / "twice.toml"
    twice.write_text("[a]\ntile_k = 64\n[b]\ntile_k = 32\n")
    with pytest.raises(ConfigError, match="tile_k"):
        kbwork.load_topology(twice)


# --- error family, Run misuse ---------------------------------------------------------------------------
def test_every_error_is_a_kbwork_error():
    for cls in (ConfigError, ValidationError, TcmOverflowError, SimulationError):
        assert issubclass(cls, KbworkError)
    assert issubclass(ConfigError, ValueError) and issubclass(ValidationError, ValueError)
    assert issubclass(KbworkError, Exception)
    raised = []
    for action in (lambda: kbwork.load_topology(nope=1),
                   lambda: kbwork.Simulator(mode="fast"),
                   lambda: kbwork.Simulator(mode="timing").run(lambda tl: None),
                   lambda: kbwork.Simulator(mode="timing").run(lambda tl: tl.alloc((4096, 4096), name="x"))):
        with pytest.raises(KbworkError) as err:
            action()
        raised.append(type(err.value))
    assert raised == [ConfigError, ValidationError, SimulationError, TcmOverflowError]


def test_simulator_mode_error_names_the_mode():
    with pytest.raises(ValidationError, match="'fast'"):
        kbwork.Simulator(mode="fast")


def test_run_read_in_timing_mode_is_a_clear_error():
    sim = kbwork.Simulator(mode="timing")
    x = sim.hbm("x", np.ones((2, 2), np.float32))
    run = sim.run(lambda tl: tl.load(x, name="t"))
    with pytest.raises(SimulationError, match=r"timing mode.*mode='data'"):
        run.read("t")
    with pytest.raises(SimulationError):
        run.read(x)


def test_run_read_by_name_and_by_handle():
    sim = kbwork.Simulator(mode="data")
    x = sim.hbm("x", np.arange(6, dtype=np.float32).reshape(2, 3), dtype="bf16")
    run = sim.run(lambda tl: tl.load(x, name="t"))
    assert run.read("t").dtype == np.dtype(kbwork.memory.DTYPES["bf16"])
    np.testing.assert_array_equal(run.read("t").astype(np.float32), np.arange(6).reshape(2, 3))
    np.testing.assert_array_equal(run.read(x), run.read("x"))
    out = run.read("t")
    out[...] = 0  # a copy: the run's numbers are not changed through it
    assert run.read("t").astype(np.float32).sum() == 15
    with pytest.raises(ValidationError, match="'nope'"):
        run.read("nope")


# --- Perfetto ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("clock_ghz", [1.25, 2.0])
def test_perfetto_export(tmp_path, clock_ghz):
    from kbwork.kernels.gemm import gemm_epilogues

    run = gemm_epilogues(kbwork.Simulator(mode="timing", clock_ghz=clock_ghz)).run
    log = run.op_log
    path = tmp_path / "trace.json"
    trace = run.to_perfetto(path)
    assert json.loads(path.read_text()) == trace
    events = trace["traceEvents"]
    xs = [e for e in events if e["ph"] == "X"]
    assert len(xs) == len(log)
    ns = lambda cycles: round(cycles / clock_ghz)  # noqa: E731  (whole ns, before dur is taken: DESIGN §6)
    tid_of: dict[str, int] = {}
    for e, row in zip(xs, log.itertuples()):
        assert e["ts"] == pytest.approx(ns(row.start) / 1e3, abs=1e-12)
        assert e["dur"] == pytest.approx((ns(row.end) - ns(row.start)) / 1e3, abs=1e-12)
        assert tid_of.setdefault(row.engine, e["tid"]) == e["tid"]  # one track per engine
        assert e["args"]["seq"] == row.seq and e["args"]["cmd"] == row.cmd
    assert len(set(tid_of.values())) == len(tid_of) == log.engine.nunique() == 5
    names = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    for engine, tid in tid_of.items():
        assert names[tid] == engine
    # the first stage is the DISPATCH of a DmaCmd: 40 + ceil(0.0625 x 24) = 42 cycles = 33.6 ns at 1.25 GHz,
    # 34 ns once rounded; 21 ns at 2 GHz
    assert (xs[0]["name"].split()[0], xs[0]["ts"]) == ("DISPATCH", 0)
    assert xs[0]["dur"] == pytest.approx({1.25: 0.034, 2.0: 0.021}[clock_ghz])
    assert "displayTimeUnit" not in trace
