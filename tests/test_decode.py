"""Issue: softmax_merge recipe, the decode variants and their comparison (seed Tests 2, 3, 6, 7, 9, 10)."""

from __future__ import annotations

import json
import math

import ml_dtypes
import numpy as np
import pytest

import kbwork
from kbwork import analysis, decode
from kbwork.cli import main as cli_main
from kbwork.memory import Memory
from kbwork.pe.commands import CompositeCmd, Scope
from kbwork.triton_emu import RECIPE_DESCRIPTORS, TLContext

RECIPE_ORDER = ["rmax", "max_elem", "exp_diff", "exp_diff", "rsum", "fma", "mul_bcast", "copy"]


@pytest.fixture
def tl():
    topo = kbwork.load_topology()
    return TLContext(topo, Memory(topo.tcm_bytes, backed=False))


def _decode_state(tl, G=8, T=128, d=128):
    V = tl.mem.hbm.alloc("V", (4 * T, d), "bf16")
    S = tl.alloc((G, T), "fp32", name="S")
    m = tl.full((G, 1), -math.inf, "fp32", name="m")
    l = tl.full((G, 1), 0.0, "fp32", name="l")
    O = tl.full((G, d), 0.0, "fp32", name="O")
    return V, S, m, l, O


# --- seed Test 2 and Test 9: the lowering -------------------------------------------------------
def test_softmax_merge_lowers_to_ten_ops_with_rw_handles(tl):
    V, S, m, l, O = _decode_state(tl)
    tl.composite(prologue=[{"op": "softmax_merge", "s": S, "m": m, "l": l, "O": O}],
                 op="gemm", b=V[0:128], out=O, epilogue=[{"op": "add", "other": O}])
    cmd = tl.commands[-1]
    assert isinstance(cmd, CompositeCmd)
    assert len(cmd.ops) == 10
    assert [op.kind for op in cmd.ops[:8]] == RECIPE_ORDER
    assert all(op.scope is Scope.KERNEL for op in cmd.ops[:8])
    assert cmd.ops[8].kind == "gemm" and cmd.ops[9].kind == "add"
    assert cmd.rw_handles == (m, l, O)
    # the GEMM's a is auto-bound to the recipe's primary output P, shaped and typed like s
    P = cmd.ops[8].operands["a"]
    assert P.shape == S.shape and P.dtype == S.dtype and P.pinned and P.space == "tcm"
    assert cmd.ops[3].out == P  # exp_diff(s, m_new) -> P
    # every recipe address is filled and in TCM
    for op in cmd.ops[:8]:
        assert all(h.space == "tcm" for h in op.handles())
    # seed Test 9
    assert cmd.logical_bytes == 304 < 1024


def test_recipe_scratch_size_matches_descriptor(tl):
    V, S, m, l, O = _decode_state(tl, G=8, T=128)
    tl.composite(prologue=[{"op": "softmax_merge", "s": S, "m": m, "l": l, "O": O}],
                 op="gemm", b=V[0:128], out=O, epilogue=[{"op": "add", "other": O}])
    cmd = tl.commands[-1]
    rd = RECIPE_DESCRIPTORS["softmax_merge"]
    # m_loc + m_new + corr + l_loc (G x 1 each) + P (G x T), fp32
    assert sum(h.nbytes for h in cmd.scratch) == rd.scratch_bytes({"s": S, "m": m, "l": l, "O": O}) \
        == 4 * (4 * 8 + 8 * 128)
    # kernel scope: a second composite on the same state reuses the scratch (the TCM does not grow)
    top = tl.mem.tcm.top
    tl.composite(prologue=[{"op": "softmax_merge", "s": S, "m": m, "l": l, "O": O}],
                 op="gemm", b=V[128:256], out=O, epilogue=[{"op": "add", "other": O}])
    assert tl.mem.tcm.top == top
    assert tl.commands[-1].scratch == cmd.scratch


def test_recipe_scratch_lives_in_active_scratch_scope(tl):
    V, S, m, l, O = _decode_state(tl)
    top = tl.mem.tcm.top
    with tl.scratch_scope():
        tl.composite(prologue=[{"op": "softmax_merge", "s": S, "m": m, "l": l, "O": O}],
                     op="gemm", b=V[0:128], out=O, epilogue=[{"op": "add", "other": O}])
        assert tl.mem.tcm.top > top
    assert tl.mem.tcm.top == top


def test_decode_opt2_emits_two_commands_per_tile_opt3_ten():
    r2 = decode.run("opt2", kv_len=512, mode="timing")
    r3 = decode.run("opt3", kv_len=512, mode="timing")
    per2 = analysis.command_bytes_per_tile(r2.run.commands)
    per3 = analysis.command_bytes_per_tile(r3.run.commands)
    assert [len(v) for v in per2.values()] == [2] * 4
    assert [len(v) for v in per3.values()] == [10] * 4
    assert per2[0] == [60, 304]
    labels2 = [c.label for c in r2.run.commands]
    assert labels2[:5] == ["dma_load Q", "fill m", "fill l", "fill O", "qk"]
    assert labels2[-2:] == ["div_bcast O", "dma_store O"]


# --- seed Test 3: K before V --------------------------------------------------------------------
@pytest.mark.parametrize("kv_len,tile", [(128, 128), (1024, 128), (2048, 256), (512, 64)])
def test_k_before_v(kv_len, tile):
    log = decode.run("opt2", kv_len=kv_len, tile=tile, mode="timing").op_log
    merges = log[(log.label == "pv_merge") & (log.stage == "DISPATCH")]
    assert len(merges) == kv_len // tile
    for cmd in merges.cmd:
        mine = log[log.cmd == cmd]
        prologue = mine[(mine.stage == "MATH") & (mine.phase == "prologue")]
        assert len(prologue) == 8
        v_reads = mine[(mine.stage == "DMA_READ") & mine.tensor.str.startswith("V[")]
        assert len(v_reads) >= 1
        assert not mine[(mine.stage == "DMA_READ") & mine.tensor.str.startswith("K[")].size
        assert (v_reads.start >= prologue.end.max()).all()


# --- seed Test 6: numerical equivalence ----------------------------------------------------------
def _bf16_ulp(x: np.ndarray) -> np.ndarray:
    x = np.abs(np.asarray(x, np.float32)).astype(ml_dtypes.bfloat16)
    return (np.nextafter(x.astype(np.float32), np.float32(np.inf)).astype(ml_dtypes.bfloat16).astype(np.float32)
            - x.astype(np.float32))


@pytest.mark.parametrize("kv_len", [128, 2048])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_opt2_equals_opt3_and_matches_reference(kv_len, dtype):
    cmp = decode.compare(kv_len=kv_len, dtype=dtype, seed=7)
    r2, r3 = cmp.opt2, cmp.opt3
    for name in ("m", "l", "O"):
        a, b = getattr(r2, name), getattr(r3, name)
        if dtype == "fp32":
            assert np.max(np.abs(a - b)) <= 1e-6, name
        else:
            assert np.all((a == b) | (np.abs(a - b) <= _bf16_ulp(b))), name
    # the float64 reference, recomputed here independently of kbwork.decode
    q, k, v = (x.astype(np.float64) for x in (r2.q, r2.k, r2.v))
    s = q @ k.T / math.sqrt(q.shape[1])
    p = np.exp(s - s.max(axis=1, keepdims=True))
    ref = p / p.sum(axis=1, keepdims=True) @ v
    # plain non-tiled attention in the storage precision (every stored tensor rounded to dtype)
    rnd = (lambda x: x.astype(ml_dtypes.bfloat16).astype(np.float32)) if dtype == "bf16" else (lambda x: x)
    s32 = rnd((r2.q @ r2.k.T) * np.float32(1 / math.sqrt(q.shape[1])))
    p32 = np.exp(s32 - s32.max(axis=1, keepdims=True))
    p32 = rnd(p32 / p32.sum(axis=1, keepdims=True))
    base_err = np.max(np.abs(rnd(p32 @ r2.v) - ref))
    for r in (r2, r3):
        err = np.max(np.abs(r.O - ref))
        assert err <= 2 * base_err + 1e-6, (r.variant, err, base_err)
    assert cmp.numerics_ok
    # the final (m, l) are the softmax statistics of the scaled scores
    np.testing.assert_allclose(r2.m[:, 0], s.max(axis=1), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(r2.l[:, 0], np.exp(s - s.max(axis=1, keepdims=True)).sum(axis=1), rtol=1e-5)


def test_explicit_inputs_are_rounded_to_dtype():
    rng = np.random.default_rng(3)
    q, k, v = rng.standard_normal((4, 64)), rng.standard_normal((256, 64)), rng.standard_normal((256, 64))
    r = decode.run("opt2", q=q, k=k, v=v, tile=128, dtype="bf16")
    assert r.params["kv_len"] == 256 and r.params["group"] == 4 and r.params["head_dim"] == 64
    assert np.array_equal(r.k, k.astype(np.float32).astype(ml_dtypes.bfloat16).astype(np.float32))
    assert r.error < 1e-5


def test_ragged_kv_len_is_a_clear_error():
    with pytest.raises(kbwork.ValidationError, match="not a multiple of tile"):
        decode.run("opt2", kv_len=200, tile=128)
    with pytest.raises(kbwork.ValidationError, match="variant"):
        decode.run("opt4", kv_len=256)


# --- seed Test 7: the dispatch gate ------------------------------------------------------------
def test_dispatch_per_tile_default_calibration():
    cmp = decode.compare(kv_len=1024, mode="timing")
    d2, d3 = cmp.opt2.dispatch_per_tile, cmp.opt3.dispatch_per_tile
    assert list(d2.index) == list(range(8)) and list(d3.index) == list(range(8))
    assert (d2 == 103).all() and (d3 == 425).all()
    assert (d2 == cmp.opt2.closed_form_per_tile).all() and (d3 == cmp.opt3.closed_form_per_tile).all()
    assert cmp.gate and cmp.dispatch_opt3 > 2 * cmp.dispatch_opt2
    assert round(cmp.ratio, 2) == 4.13 == round(cmp.closed_form_ratio, 2)


def _by_hand(bytes_list, fixed, r):
    from fractions import Fraction

    return sum(fixed * max(1, -(-b // 1024)) + math.ceil(Fraction(repr(r)) * b) for b in bytes_list)


@pytest.mark.parametrize("fixed", [0, 1, 5, 40, 200])
@pytest.mark.parametrize("r", [0.0, 0.0625, 0.1, 0.5])
def test_simulated_ratio_equals_closed_form_over_grid(fixed, r):
    cmp = decode.compare(kv_len=384, mode="timing", fixed_cycles=fixed, r_cycles_per_byte=r)
    # closed form by hand from the commands' logical bytes (60, 304 | 60, 24, 32, 32, 32, 24, 40, 32, 24, 64)
    bytes2 = cmp.opt2.command_bytes_per_tile
    bytes3 = cmp.opt3.command_bytes_per_tile
    assert sorted(bytes2) == [60, 304]
    assert sorted(bytes3) == sorted([60, 24, 32, 32, 32, 24, 40, 32, 24, 64])
    h2, h3 = _by_hand(bytes2, fixed, r), _by_hand(bytes3, fixed, r)
    assert (cmp.opt2.dispatch_per_tile == h2).all() and (cmp.opt3.dispatch_per_tile == h3).all()
    if h2 == 0:
        return
    assert cmp.ratio == h3 / h2 == cmp.closed_form_ratio
    assert cmp.gate == (h3 > 2 * h2)


def test_gate_fails_when_fixed_is_small_against_r_bytes():
    assert decode.compare(kv_len=256, mode="timing").gate
    cmp = decode.compare(kv_len=256, mode="timing", fixed_cycles=0)
    assert not cmp.gate and not cmp.closed_form_gate
    assert cmp.ratio == pytest.approx(25 / 23)


# --- seed Test 10 and recipe validation ----------------------------------------------------------
def test_explicit_a_with_softmax_merge_is_rejected(tl):
    V, S, m, l, O = _decode_state(tl)
    with pytest.raises(kbwork.ValidationError, match=r"softmax_merge.*a=S.*Omit a="):
        tl.composite(prologue=[{"op": "softmax_merge", "s": S, "m": m, "l": l, "O": O}],
                     op="gemm", a=S, b=V[0:128], out=O)


@pytest.mark.parametrize("mutate,pattern", [
    (lambda e, h: e.pop("l"), r"softmax_merge.*missing operand\(s\) l"),
    (lambda e, h: e.update(x=h["S"]), r"softmax_merge.*unknown operand\(s\) x"),
    (lambda e, h: e.update(O=h["V"][0:8]), r"softmax_merge.*O=V\[0:8\].*RW"),
    (lambda e, h: e.update(s=h["V"][0:8]), r"softmax_merge.*s=V\[0:8\] is in HBM.*tl.load"),
    (lambda e, h: e.update(op="softmax_merj"), r"unknown op 'softmax_merj'.*softmax_merge"),
    (lambda e, h: e.update(O=h["S"]), r"softmax_merge.*alias"),
])
def test_recipe_operand_errors_name_recipe_operand_and_fix(tl, mutate, pattern):
    V, S, m, l, O = _decode_state(tl)
    entry = {"op": "softmax_merge", "s": S, "m": m, "l": l, "O": O}
    mutate(entry, {"S": S, "V": V})
    with pytest.raises(kbwork.ValidationError, match=pattern):
        tl.composite(prologue=[entry], op="gemm", b=V[0:128], out=O, epilogue=[{"op": "add", "other": O}])


def test_composite_over_the_cap_is_dispatched_in_segments():
    from kbwork.pe.commands import OpSpec

    sim = kbwork.Simulator(mode="timing")

    def kernel(tl):
        x = tl.alloc((8, 8), "fp32", name="x")
        y = tl.alloc((8, 8), "fp32", name="y")
        ops = [OpSpec("copy", operands={"a": x}, out=y)] * 50     # 50 x 24 = 1200 logical bytes
        tl.composite(ops=ops, label="big")

    run = sim.run(kernel)
    d = run.op_log[run.op_log.stage == "DISPATCH"].iloc[0]
    assert d.bytes == 1200
    assert d.end - d.start == 40 * 2 + math.ceil(0.0625 * 1200)


# --- the command line -------------------------------------------------------------------------
def test_cli_compare_json_has_every_field(capsys):
    assert cli_main(["compare", "--json", "--kv-len", "512"]) == 0
    d = json.loads(capsys.readouterr().out)
    for key in ("dispatch_per_tile", "ratio", "closed_form_ratio", "gate", "cycles", "max_abs_diff_opt2_opt3",
                "max_abs_err_vs_ref", "params", "closed_form_per_tile"):
        assert key in d, key
    assert d["dispatch_per_tile"] == {"opt2": 103, "opt3": 425}
    assert d["gate"]["pass"] is True
    assert set(d["max_abs_err_vs_ref"]) >= {"opt2", "opt3"}
    assert d["params"]["kv_len"] == 512


def test_cli_compare_table_and_errors(capsys):
    assert cli_main(["compare", "--kv-len", "256", "--mode", "timing", "--fixed", "0"]) == 0
    out = capsys.readouterr().out
    assert "gate opt3 > 2 x opt2: FAIL" in out
    assert cli_main(["compare", "--kv-len", "200"]) == 2
    assert "not a multiple of tile" in capsys.readouterr().err


def test_cli_run_npz_lets_anyone_recompute_the_reference(tmp_path, capsys):
    npz = tmp_path / "out.npz"
    csv = tmp_path / "log.csv"
    trace = tmp_path / "trace.json"
    assert cli_main(["run", "--variant", "opt2", "--kv-len", "512", "--npz", str(npz), "--oplog", str(csv),
                     "--trace", str(trace)]) == 0
    z = np.load(npz)
    q, k, v = (z[n].astype(np.float64) for n in ("q", "k", "v"))
    s = q @ k.T * float(z["scale"])
    p = np.exp(s - s.max(axis=1, keepdims=True))
    ref = p / p.sum(axis=1, keepdims=True) @ v
    assert np.max(np.abs(z["O"] - ref)) < 1e-5
    assert z["m"].shape == (8, 1) and z["l"].shape == (8, 1)
    assert csv.read_text().startswith("seq,pe,cmd,iter,label,stage,engine")
    assert json.loads(trace.read_text())["traceEvents"]


def test_dispatch_per_tile_without_op_log_equals_op_log_sum():
    for variant in ("opt2", "opt3"):
        r = decode.run(variant, kv_len=768, mode="timing", fixed_cycles=13, r_cycles_per_byte=0.3)
        fast = r.dispatch_per_tile
        slow = analysis.dispatch_per_tile(r.op_log)
        assert fast.index.tolist() == slow.index.tolist() == list(range(6))
        assert (fast.to_numpy() == slow.to_numpy()).all()


@pytest.mark.parametrize("variant", ["opt2", "opt3"])
def test_timing_and_data_mode_give_the_same_op_log(variant):
    # timing mode reuses the plans of repeated MATH commands; data mode generates every plan
    a = decode.run(variant, kv_len=640, mode="timing").to_csv()
    b = decode.run(variant, kv_len=640, mode="data").to_csv()
    assert a == b


def test_lowering_is_pure_equal_calls_give_equal_fresh_ops(tl):
    x = tl.alloc((8, 128), "fp32", name="x")
    y = tl.alloc((8, 1), "fp32", name="y")
    z = tl.alloc((8, 1), "fp32", name="z")
    tl.composite(op="math", math_op="rmax", a=x, out=y)
    tl.composite(op="math", math_op="rmax", a=x, out=y, label="again")
    tl.composite(op="math", math_op="rmax", a=x, out=z)
    c0, c1, c2 = tl.commands[-3:]
    assert c0.ops == c1.ops and c0.ops is not c1.ops and c1.label == "again"
    assert c2.ops != c0.ops and c2.ops[0].out == z
    assert set(vars(tl)) == {"topo", "mem", "hbm", "tcm", "waits", "names", "_segments", "_plain", "_plain_first",
                             "_ncmd", "_loop", "_n_loops", "_broken", "_iter", "_scopes", "_recipe_scratch",
                             "_token", "named_after"}
    # nothing cached beside what the program owns (its trace so far, and which buffers tl.load named after
    # their sources: what a binding names after its own)
    assert tl.named_after == {}
