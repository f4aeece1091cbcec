"""A run's energy (DESIGN §18): every kind's count recomputed by hand from the op_log, the steady path's counts
equal to the full path's, the energy keys changing no op_log byte, and the keys validated by name."""

from __future__ import annotations

import math

import numpy as np
import pytest

import kbwork
from kbwork import analysis, decode, load_topology
from kbwork.analysis.energy import ENERGY_KEYS, KINDS, UNITS, counts, energy, energy_by_kind, total_pj
from kbwork.errors import ConfigError, ValidationError
from kbwork.kernels.gemm import gemm_epilogues, gemm_hbm


def _math_elements_by_hand(run) -> int:
    """Σ over the op_log's MATH rows of n × cost (+ ceil(log2(row_len)) for a row reduction), n read off the
    row's op as DESIGN §1 states it: the largest operand or output (an epilogue on the accumulator: the tile)."""
    topo = run.topology
    log = run.op_log
    total = 0
    for cmd, rows in log[log.stage == "MATH"].groupby("cmd", sort=True):
        ops = run.commands[int(cmd)].ops
        gemm = next((op for op in ops if op.kind == "gemm"), None)
        # the ops that run once, in order (before the GEMM, after it with scope kernel, or a MATH-only command)
        once = [op for op in ops if op.kind != "gemm" and (gemm is None or op.scope.value == "kernel")]
        k = 0
        for r in rows.sort_values("seq").itertuples():
            op_kind = str(r.op_kind)
            cost = topo.math_cost_exp if op_kind in ("exp_diff", "rms_inv") else topo.math_cost_other
            if r.phase in ("k_epilogue", "tile_epilogue"):  # on the accumulator tile: tm x tn
                m, n = gemm.extra["m"], gemm.extra["n"]
                n_nt = -(-n // topo.tile_n)
                mi, ni = divmod(int(r.tile), n_nt)
                tm = min(m, (mi + 1) * topo.tile_m) - mi * topo.tile_m
                tn = min(n, (ni + 1) * topo.tile_n) - ni * topo.tile_n
                total += tm * tn * cost
                continue
            op = once[k]
            k += 1
            assert op.kind == op_kind
            sizes = [h.size for h in op.operands.values()] + ([op.out.size] if op.out is not None else [])
            total += max(sizes) * cost
            if op_kind in ("rmax", "rsum", "rms_inv") and op.operands["a"].shape[-1] > 1:
                total += math.ceil(math.log2(op.operands["a"].shape[-1]))
    return total


def _check_by_hand(run, macs: int) -> None:
    log = run.op_log
    e = energy(run)
    assert list(e.columns) == ["pe", "kind", "count", "unit", "pj"]
    assert list(e["kind"]) == list(KINDS) and list(e["unit"]) == [UNITS[k] for k in KINDS]
    c = dict(zip(e["kind"], e["count"]))
    dma = int(log.loc[log.stage.isin(["DMA_READ", "DMA_WRITE"]), "bytes"].sum())
    fetch = int(log.loc[log.stage == "FETCH", "bytes"].sum())
    disp = log[log.stage == "DISPATCH"]
    assert c["hbm"] == dma and c["tcm"] == dma + fetch
    assert c["mac"] == macs
    assert c["math"] == _math_elements_by_hand(run)
    assert c["dispatch"] == int((disp.end - disp.start).sum())
    assert c["idle"] == run.cycles
    t = run.topology
    pj = dict(zip(e["kind"], e["pj"]))
    assert pj["hbm"] == pytest.approx(8 * dma * t.hbm_pj_per_bit)
    assert pj["tcm"] == pytest.approx((dma + fetch) * t.tcm_pj_per_byte)
    assert pj["mac"] == pytest.approx(macs * t.mac_pj)
    assert pj["math"] == pytest.approx(c["math"] * t.math_pj_per_element)
    assert pj["dispatch"] == pytest.approx(c["dispatch"] * t.dispatch_pj_per_cycle)
    assert pj["idle"] == pytest.approx(run.cycles / t.clock_ghz * t.pe_idle_mw)  # mW x ns = pJ
    assert total_pj(run) == pytest.approx(e["pj"].sum())
    assert energy_by_kind(run).to_dict() == pytest.approx(pj)


@pytest.mark.parametrize("policy", ["strict_fifo", "rw_aware"])
@pytest.mark.parametrize("variant", ["opt2", "opt3"])
def test_each_kind_recomputed_by_hand_from_a_decode_op_log(variant, policy):
    r = decode.run(variant, kv_len=384, mode="timing", hazard_policy=policy)
    run = r.run
    assert run.topology.hazard_policy == policy
    # qk and pv: G x kv_len x head_dim MACs each (G 8, head_dim 128 by default), whatever the tiling
    _check_by_hand(run, 2 * 8 * 384 * 128)


def test_each_kind_recomputed_by_hand_for_a_ragged_gemm_with_epilogues():
    sim = kbwork.Simulator(mode="timing")
    run = gemm_epilogues(sim).run  # m=50, k=260, n=150: every tile edge ragged
    _check_by_hand(run, 50 * 260 * 150)  # the logical shape, not padded to the 32x32 array or the tiles
    # the MATH work by hand: scale after each of the 3 k-tiles, add and scale per output tile, div_bcast once
    c = dict(zip(energy(run)["kind"], energy(run)["count"]))
    assert c["math"] == (3 + 2 + 1) * 50 * 150
    hbm = gemm_hbm(kbwork.Simulator(mode="timing")).run
    _check_by_hand(hbm, 70 * 300 * 200)


def test_steady_path_counts_equal_full_path_counts_on_a_long_run():
    for variant in ("opt2", "opt3"):
        steady = decode.run(variant, kv_len=16384, mode="timing")
        full = decode.run(variant, kv_len=16384, mode="timing", steady_state=False)
        assert steady.run.steady_state.path == "steady" and full.run.steady_state.path == "full"
        a, b = counts(steady), counts(full)
        assert a.equals(b)
        assert a["count"].dtype == np.int64
        _check_by_hand(steady.run, 2 * 8 * 16384 * 128)


def test_energy_keys_change_no_op_log_byte_and_only_the_price():
    base = decode.run("opt2", kv_len=512, mode="timing")
    free = {k: 0 for k in ENERGY_KEYS}
    other = dict(hbm_pj_per_bit=0.55, tcm_pj_per_byte=9.0, mac_pj=2.0, math_pj_per_element=0.0,
                 dispatch_pj_per_cycle=1.5, pe_idle_mw=7.0)
    for keys in (free, other):
        r = decode.run("opt2", kv_len=512, mode="timing", **keys)
        assert r.run.to_csv() == base.run.to_csv()
        assert counts(r).equals(counts(base))
        assert energy(r)["pj"].sum() == pytest.approx(energy(base, **keys)["pj"].sum())
    assert energy(decode.run("opt2", kv_len=512, mode="timing", **free))["pj"].sum() == 0
    # re-pricing a run: the same counts, the bank-level PE's HBM at 0.55 of 3.29
    e, bank = energy(base), energy(base, hbm_pj_per_bit=0.55)
    assert (e["count"] == bank["count"]).all()
    assert bank["pj"][0] == pytest.approx(e["pj"][0] * 0.55 / 3.29)


def test_a_device_run_counts_every_pe_and_replicas_count_as_their_source():
    from kbwork import model

    s = model.step("llama-3-8b", [512] * 2, pes=8, hbm_channels=8, check_capacity=False)
    run = s.attention
    e = energy(run)
    assert sorted(set(e["pe"])) == list(range(8))
    log = run.op_log
    for p in range(8):
        mine = e[e["pe"] == p].set_index("kind")["count"]
        rows = log[log["pe"] == p]
        dma = int(rows.loc[rows.stage.isin(["DMA_READ", "DMA_WRITE"]), "bytes"].sum())
        assert mine["hbm"] == dma and mine["idle"] == run.cycles
        disp = rows[rows.stage == "DISPATCH"]
        assert mine["dispatch"] == int((disp.end - disp.start).sum())
    # 16 tasks on 8 PEs: every PE does two tasks' work, the same MACs
    macs = e[e["kind"] == "mac"]["count"]
    assert (macs == 2 * 4 * 512 * 128 * 2).all()
    if run.reductions.replicated_from:
        p, src = next(iter(run.reductions.replicated_from.items()))
        assert (e[e["pe"] == p]["count"].to_numpy() == e[e["pe"] == src]["count"].to_numpy()).all()


def test_explain_prints_the_run_s_energy_and_its_largest_kind():
    r = decode.run("opt2", kv_len=1024, mode="timing")
    x = analysis.explain(r)
    assert x.energy_largest == "hbm" and x.energy_pj == pytest.approx(total_pj(r))
    assert "energy: " in x.report() and "largest: hbm" in x.report()
    assert x.to_dict()["energy"]["largest"] == "hbm"


@pytest.mark.parametrize("key", ENERGY_KEYS)
def test_energy_keys_are_validated_by_name_and_zero_is_allowed(key):
    assert getattr(load_topology(**{key: 0}), key) == 0
    assert getattr(load_topology("ahbm-device-v1"), key) == getattr(load_topology(), key)
    with pytest.raises(ConfigError, match=rf"'{key}' is -1; it cannot be negative"):
        load_topology(**{key: -1})
    with pytest.raises(ConfigError, match=rf"'{key}' must be a finite number, got nan"):
        load_topology(**{key: float("nan")})
    with pytest.raises(ConfigError, match=rf"'{key}' must be a finite number, got the string '3'"):
        load_topology(**{key: "3"})
    r = decode.run("opt2", kv_len=256, mode="timing")
    with pytest.raises(ConfigError, match=rf"'{key}' is -1"):
        energy(r, **{key: -1})
    assert key in kbwork.config.sweepable_keys() and key not in kbwork.config.planned_keys()


def test_energy_refuses_what_is_not_a_run_or_an_energy_key():
    r = decode.run("opt2", kv_len=256, mode="timing")
    with pytest.raises(ConfigError, match=r"'hbm_pj_per_bits' is not an energy key.*Did you mean 'hbm_pj_per_bit'"):
        energy(r, hbm_pj_per_bits=1)
    with pytest.raises(ValidationError, match="expected a Run"):
        energy(r.run.op_log)


@pytest.mark.parametrize("key", ["gpu_hbm_pj_per_bit", "flop_pj", "idle_w", "busy_w", "link_pj_per_bit"])
def test_host_energy_keys_are_validated_by_name_and_zero_is_allowed(key):
    from kbwork.model import load_host

    assert getattr(load_host({key: 0}), key) == 0
    with pytest.raises(ConfigError, match=rf"'{key}' is -1.0; it must be non-negative"):
        load_host({key: -1})
    with pytest.raises(ConfigError, match=rf"'{key}' must be a finite number, got nan"):
        load_host({key: float("nan")})
    with pytest.raises(ConfigError, match=rf"'{key}' must be a finite number, got the string 'x'"):
        load_host({key: "x"})
