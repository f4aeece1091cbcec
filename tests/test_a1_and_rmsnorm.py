"""The ADR's two claims, measurable: a1 (the merge recipe as a MATH-only composite) as a third
decode variant, and a second recipe (rmsnorm) added by descriptor only (DESIGN.md §3, §7)."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

import kbwork
from kbwork import ValidationError, decode
from kbwork.pe.commands import dispatch_cycles

CALIBRATIONS = [dict(), dict(fixed_cycles=0), dict(fixed_cycles=400, r_cycles_per_byte=0.0),
                dict(fixed_cycles=7, r_cycles_per_byte=1.0), dict(fixed_cycles=160, r_cycles_per_byte=0.3)]


# --- a1 ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype,kv_len,tile", [("bf16", 1024, 128), ("fp32", 512, 64), ("fp16", 768, 256)])
def test_a1_equals_opt2_and_opt3_bit_for_bit(dtype, kv_len, tile):
    runs = {v: decode.run(v, kv_len=kv_len, tile=tile, dtype=dtype, seed=11) for v in ("opt2", "opt3", "a1")}
    for name in ("m", "l", "O"):
        a1 = getattr(runs["a1"], name)
        for other in ("opt2", "opt3"):
            assert np.array_equal(a1, getattr(runs[other], name)), (name, other)


def test_a1_emits_qk_then_the_recipe_alone_then_pv_reading_its_primary_out():
    r = decode.run("a1", kv_len=512, mode="timing")
    tile1 = [c for c in r.run.commands if c.iter == 1]
    assert [c.label for c in tile1] == ["qk", "merge", "pv"]
    qk, merge, pv = tile1
    assert [o.kind for o in merge.ops] == ["rmax", "max_elem", "exp_diff", "exp_diff", "rsum", "fma", "mul_bcast",
                                          "copy"]
    P = merge.ops[3].out
    assert pv.ops[0].kind == "gemm" and pv.ops[0].operands["a"] == P and P.pinned
    assert [h.name for h in merge.rw_handles] == ["m", "l", "O"]
    # P is pinned recipe scratch: pv streams V only
    log = r.op_log
    pv_reads = log[(log.cmd == pv.completion.cmd) & (log.stage == "DMA_READ")]
    assert list(pv_reads.tensor.astype(str)) == ["V[128:256]"]


def _closed_form(byte_list, topo) -> int:
    """DESIGN §4 by hand: Σ FIXED·segments + ceil(R·bytes)."""
    from fractions import Fraction

    r = Fraction(repr(float(topo.r_cycles_per_byte)))
    return sum(topo.fixed_cycles * max(1, -(-b // 1024)) + math.ceil(r * b) for b in byte_list)


@pytest.mark.parametrize("cal", CALIBRATIONS, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()) or "default")
def test_a1_dispatch_per_tile_equals_its_closed_form(cal):
    r = decode.run("a1", kv_len=1024, mode="timing", **cal)
    # qk 60 B, the merge 8 MATH ops = 240 B, pv gemm + add = 64 B
    assert r.command_bytes_per_tile == [60, 240, 64]
    want = _closed_form([60, 240, 64], r.topology)
    assert set(r.dispatch_per_tile) == {want} and set(r.closed_form_per_tile) == {want}


# --- rmsnorm -----------------------------------------------------------------------------------------
_DEFAULT = object()


def _rmsnorm_run(mode, x, g, W, dtype, *, scope=False, twice=None, eps=_DEFAULT):
    sim = kbwork.Simulator(mode=mode)
    put = (lambda n, a: sim.hbm(n, a, dtype=dtype)) if mode == "data" else \
          (lambda n, a: sim.hbm(n, shape=a.shape, dtype=dtype))
    xh, gh, Wh = put("x", x), put("g", g), put("W", W)
    Y = sim.hbm("Y", shape=(x.shape[0], W.shape[1]))
    extra = {} if eps is _DEFAULT else {"eps": eps}
    if twice is not None:
        x2h = put("x2", twice)
        Y2 = sim.hbm("Y2", shape=Y.shape)

    def kernel(tl):
        xt, gt = tl.load(xh, name="xt"), tl.load(gh, name="gt")
        ctx = tl.scratch_scope() if scope else _null()
        with ctx:
            done = tl.composite(prologue=[{"op": "rmsnorm", "x": xt, "g": gt, **extra}], op="gemm", b=Wh, out=Y,
                                label="rmsnorm+linear")
            assert done.primary_out is not None and done.primary_out.dtype == "fp32"
            if twice is not None:
                x2t = tl.load(x2h, name="x2t")
                tl.composite(prologue=[{"op": "rmsnorm", "x": x2t, "g": gt, **extra}], op="gemm", b=Wh, out=Y2)

    run = sim.run(kernel)
    return run, Y, (Y2 if twice is not None else None)


class _null:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def _rmsnorm_ref(x, g, W, dtype, eps=1e-6):
    rnd = lambda a: a.astype(kbwork.memory.DTYPES[dtype]).astype(np.float64)  # noqa: E731
    x, g, W = rnd(x), rnd(g), rnd(W)
    return (x / np.sqrt((x ** 2).mean(axis=1, keepdims=True) + eps) * g) @ W


@pytest.mark.parametrize("dtype,tol", [("bf16", 1e-2), ("fp32", 1e-5)])
@pytest.mark.parametrize("M,K,N", [(8, 128, 64), (7, 200, 130), (33, 300, 70), (1, 5, 3)])
def test_rmsnorm_linear_matches_numpy(dtype, tol, M, K, N):
    rng = np.random.default_rng(M * K + N)
    x = rng.standard_normal((M, K)).astype(np.float32) * 4
    g = (rng.standard_normal((1, K)) + 1).astype(np.float32)
    W = rng.standard_normal((K, N)).astype(np.float32)
    run, Y, _ = _rmsnorm_run("data", x, g, W, dtype)
    ref = _rmsnorm_ref(x, g, W, dtype)
    assert np.max(np.abs(run.read(Y) - ref)) <= tol * np.max(np.abs(ref))
    # against numpy on the unrounded inputs too: the bound the issue states
    exact = (x / np.sqrt((x.astype(np.float64) ** 2).mean(axis=1, keepdims=True) + 1e-6) * g) @ W
    assert np.max(np.abs(run.read(Y) - exact)) <= max(tol, 1e-5) * np.max(np.abs(exact)) * (4 if dtype == "bf16" else 1)
    timing, _, _ = _rmsnorm_run("timing", x, g, W, dtype)
    assert timing.to_csv() == run.to_csv()


def test_rmsnorm_inside_a_scope_and_twice_on_different_inputs():
    rng = np.random.default_rng(5)
    x, x2 = (rng.standard_normal((16, 96)).astype(np.float32) for _ in range(2))
    g = rng.standard_normal((1, 96)).astype(np.float32)
    W = rng.standard_normal((96, 40)).astype(np.float32)
    for scope in (False, True):
        run, Y, Y2 = _rmsnorm_run("data", x, g, W, "fp32", scope=scope, twice=x2, eps=1e-3)
        np.testing.assert_allclose(run.read(Y), _rmsnorm_ref(x, g, W, "fp32", 1e-3), rtol=1e-5, atol=1e-4)
        np.testing.assert_allclose(run.read(Y2), _rmsnorm_ref(x2, g, W, "fp32", 1e-3), rtol=1e-5, atol=1e-4)
        a, b = [c for c in run.commands if c.label != "" and c.ops and c.ops[-1].kind == "gemm"]
        assert (a.scratch == b.scratch) is (not scope)  # kernel scope shares one set; a scope makes its own


def test_rmsnorm_costs_4_bytes_for_eps_and_validates_it():
    rng = np.random.default_rng(1)
    x, g, W = rng.standard_normal((4, 32)), rng.standard_normal((1, 32)), rng.standard_normal((32, 8))
    run, _, _ = _rmsnorm_run("timing", x, g, W, "fp32")
    cmd = run.commands[-1]
    # rms_inv(x; eps) -> r: 8 + 2x8 + 4; mul_bcast: 8 + 3x8; mul: 8 + 3x8; gemm: 8 + 3x8 + 4x4
    assert [o.kind for o in cmd.ops] == ["rms_inv", "mul_bcast", "mul", "gemm"]
    assert cmd.logical_bytes == 28 + 32 + 32 + 48
    assert run.dispatch_cycles()[-1] == dispatch_cycles(140, 40, 0.0625, 1024)
    for bad, pattern in ((float("nan"), "eps is NaN"), ("1e-6", r"eps='1e-6' \(str\)"), (None, "eps=None")):
        with pytest.raises(ValidationError, match=r"recipe 'rmsnorm'.*" + pattern):
            _rmsnorm_run("timing", x, g, W, "fp32", eps=bad)


def test_rmsnorm_operands_must_be_tcm():
    sim = kbwork.Simulator(mode="timing")
    x = sim.hbm("x", shape=(4, 32))
    g = sim.hbm("g", shape=(1, 32))
    W = sim.hbm("W", shape=(32, 8))
    Y = sim.hbm("Y", shape=(4, 8))
    with pytest.raises(ValidationError, match=r"recipe 'rmsnorm': operand x=x is in HBM"):
        sim.run(lambda tl: tl.composite(prologue=[{"op": "rmsnorm", "x": x, "g": tl.load(g)}], op="gemm", b=W, out=Y))


# --- N-variant comparison ------------------------------------------------------------------------------
def test_three_variant_compare_through_the_api():
    cmp = decode.compare(kv_len=512, variants=("opt2", "opt3", "a1"), seed=2)
    assert cmp.variants == ("opt2", "opt3", "a1") and list(cmp.summary.index) == ["opt2", "opt3", "a1"]
    assert cmp.dispatch == {"opt2": 103, "opt3": 425, "a1": 143} == cmp.closed_form
    assert cmp.ratio == pytest.approx(425 / 103) and cmp.gate
    gates = cmp.gates.set_index("rule")
    assert list(gates.index) == ["opt3 > 2 x opt2", "a1 > 2 x opt2", "opt3 > 2 x a1"]
    assert gates.loc["a1 > 2 x opt2", "ratio"] == pytest.approx(143 / 103) and not gates.loc["a1 > 2 x opt2", "pass"]
    assert gates.loc["opt3 > 2 x a1", "pass"]
    assert set(cmp.max_abs_diffs) == {"opt2-opt3", "opt2-a1", "opt3-a1"}
    assert all(v == 0.0 for d in cmp.max_abs_diffs.values() for v in d.values())
    assert cmp.a1.variant == "a1" and cmp.dispatch_a1 == 143 and cmp.err_a1 == cmp.err_opt2
    d = cmp.to_dict()
    assert d["variants"] == ["opt2", "opt3", "a1"] and set(d["cycles"]) == {"opt2", "opt3", "a1"}
    with pytest.raises(AttributeError, match="variants are opt2, opt3, a1"):
        cmp.dispatch_opt9


def test_a_comparison_without_opt3_has_no_headline_gate_but_a_gate_report():
    cmp = decode.compare(kv_len=256, variants=("a1", "opt2"), mode="timing")
    assert cmp.gate is None and cmp.ratio is None and "ran a1, opt2" in cmp.ratio_note
    assert list(cmp.gates.rule) == ["a1 > 2 x opt2"]
    for bad, pattern in ((("opt2",), "two or more"), (("opt2", "opt2"), "twice"), ("opt2,opt3", "non-empty list or tuple"),
                         (("opt2", "opt9"), "'opt9' is unknown")):
        with pytest.raises(ValidationError, match=pattern):
            decode.compare(kv_len=256, variants=bad, mode="timing")


def test_three_variant_compare_through_the_cli(capsys):
    import json

    from kbwork.cli import main

    assert main(["compare", "--kv-len", "512", "--mode", "timing", "--variants", "opt2,opt3,a1", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["variants"] == ["opt2", "opt3", "a1"]
    assert d["dispatch_per_tile"] == {"opt2": 103, "opt3": 425, "a1": 143}
    assert {g["rule"] for g in d["gates"]} == {"opt3 > 2 x opt2", "a1 > 2 x opt2", "opt3 > 2 x a1"}
    assert main(["compare", "--kv-len", "512", "--mode", "timing", "--variants", "opt2,opt3,a1"]) == 0
    text = capsys.readouterr().out
    assert "a1" in text.splitlines()[3] and "gate a1 > 2 x opt2: FAIL (ratio 1.3883)" in text
    assert main(["run", "--variant", "a1", "--kv-len", "256", "--mode", "timing"]) == 0
    assert "DecodeRun(a1" in capsys.readouterr().out
