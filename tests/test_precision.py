"""Precision knobs of a decode (DESIGN.md §17): P written in bf16, the output's and K/V's dtypes."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from kbwork import decode

G, D, T = 8, 128, 128


def _pv_fetch_bytes(r) -> int:
    log = r.op_log
    return int(log[(log.stage == "FETCH") & log.label.isin(["pv", "pv_merge"])].bytes.sum())


def test_p_dtype_default_is_fp32_and_the_timing_of_opt2_4k_is_unchanged():
    assert decode.run("opt2", kv_len=4096, mode="timing").cycles == 76_966
    assert decode.run("opt2", kv_len=4096, mode="timing", p_dtype="fp32").cycles == 76_966
    fast = decode.run("opt2", kv_len=4096, mode="timing", p_dtype="bf16").cycles
    assert fast <= 76_966


@pytest.mark.parametrize("variant", ["opt2", "opt3", "a1"])
def test_bf16_p_halves_what_p_v_fetches_of_p(variant):
    n = 1024
    fp32 = decode.run(variant, kv_len=n, mode="timing", steady_state=False)
    bf16 = decode.run(variant, kv_len=n, mode="timing", steady_state=False, p_dtype="bf16")
    # P is (G, T) per tile: 4 bytes per element in fp32, 2 in bf16; V's bytes are the same in both
    assert _pv_fetch_bytes(fp32) - _pv_fetch_bytes(bf16) == (n // T) * G * T * 2
    assert bf16.cycles <= fp32.cycles


def test_opt3_writes_p_rounded_to_bf16():
    r = decode.run("opt3", kv_len=256, p_dtype="bf16", seed=3)
    p = r.run.read("P").astype(np.float32)
    assert np.array_equal(p, p.astype(ml_dtypes.bfloat16).astype(np.float32))
    assert r.run.read("P").dtype == np.dtype(ml_dtypes.bfloat16)
    r32 = decode.run("opt3", kv_len=256, seed=3)
    assert r32.run.read("P").dtype == np.float32


def test_the_bf16_kernel_is_deterministic():
    kw = dict(kv_len=512, p_dtype="bf16", out_dtype="bf16", seed=7)
    a, b = decode.run("opt2", **kw), decode.run("opt2", **kw)
    assert a.O.tobytes() == b.O.tobytes()
    assert a.to_csv() == b.to_csv()


# --- kv_dtype="fp8" (e4m3fn) and out_dtype ------------------------------------------------------------------
def _qkv(n=256, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((G, D)).astype(np.float32), rng.standard_normal((n, D)).astype(np.float32),
            rng.standard_normal((n, D)).astype(np.float32))


def test_e4m3fn_round_trip_of_random_values_and_the_range_edges():
    from kbwork import Simulator
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((64, 16)) * 50).astype(np.float32)
    x[0, :4] = [448.0, -448.0, 0.0, 2.0 ** -9]  # the largest finite values and the smallest subnormal
    fp8 = x.astype(ml_dtypes.float8_e4m3fn).astype(np.float32)
    assert np.isfinite(fp8).all() and list(fp8[0, :4]) == [448.0, -448.0, 0.0, 2.0 ** -9]
    sim = Simulator()
    h = sim.hbm("K", fp8, dtype="fp8")
    assert h.dtype == "fp8" and h.nbytes == fp8.size  # 1 byte per element
    # through a decode: K and V already in fp8 come back exactly, ±448 included
    q, k, v = _qkv(128)
    k[0, 0], k[1, 1], v[2, 2], v[3, 3] = 448.0, -448.0, 448.0, -448.0
    k8 = k.astype(ml_dtypes.float8_e4m3fn).astype(np.float32)
    v8 = v.astype(ml_dtypes.float8_e4m3fn).astype(np.float32)
    r = decode.run("opt2", q=q, k=k8, v=v8, kv_dtype="fp8")
    assert np.array_equal(r.k, k8) and np.array_equal(r.v, v8)
    assert (r.k[0, 0], r.k[1, 1], r.v[2, 2], r.v[3, 3]) == (448.0, -448.0, 448.0, -448.0)
    # random values round to nearest e4m3fn: a second rounding changes nothing
    r2 = decode.run("opt2", q=q, k=k, v=v, kv_dtype="fp8")
    assert np.array_equal(r2.k, k8) and np.array_equal(r2.O, r.O)


@pytest.mark.parametrize("tensor, value", [("k", 449.0), ("v", -500.0), ("k", -500.0), ("v", 449.0)])
def test_fp8_refuses_a_value_outside_448_naming_tensor_and_value(tensor, value):
    from kbwork.errors import ValidationError
    q, k, v = _qkv(128)
    arrays = dict(q=q, k=k, v=v)
    arrays[tensor][5, 7] = value  # 449 would round to 448 in e4m3fn: the check is on the value as given
    with pytest.raises(ValidationError, match=rf"\b{tensor} holds {value:g}, outside fp8 \(e4m3fn\)'s range ±448"):
        decode.run("opt2", kv_dtype="fp8", **arrays)
    with pytest.raises(ValidationError, match=rf"\b{tensor} holds {value:g}"):  # timing mode checks them too
        decode.run("opt3", kv_dtype="fp8", mode="timing", **arrays)


@pytest.mark.parametrize("tensor", ["k", "v"])
def test_fp8_refuses_nan(tensor):
    from kbwork.errors import ValidationError
    q, k, v = _qkv(128)
    arrays = dict(q=q, k=k, v=v)
    arrays[tensor][3, 3] = np.nan
    with pytest.raises(ValidationError, match=rf"\b{tensor} holds NaN"):
        decode.run("opt2", kv_dtype="fp8", **arrays)


def test_fp8_is_for_k_and_v_and_out_dtype_is_fp32_or_bf16():
    from kbwork.errors import ValidationError
    with pytest.raises(ValidationError, match="kv_dtype='fp8'"):
        decode.run("opt2", kv_len=128, dtype="fp8")
    with pytest.raises(ValidationError, match="out_dtype 'fp16' is not one of fp32, bf16"):
        decode.run("opt2", kv_len=128, out_dtype="fp16")
    with pytest.raises(ValidationError, match="axis 'kv_dtype'"):
        decode.sweep(kv_dtype=["fp9"], progress=False)


@pytest.mark.parametrize("variant", ["opt2", "opt3", "a1"])
def test_fp8_k_and_v_move_exactly_half_the_bytes_of_bf16(variant):
    runs = {kv: decode.run(variant, kv_len=1024, kv_dtype=kv, mode="timing", steady_state=False)
            for kv in ("bf16", "fp8")}

    # K and V in HBM: 1024 x 128 elements each, 1 byte in fp8, 2 in bf16; every byte read once
    dma = {kv: r.op_log[(r.op_log.stage == "DMA_READ") & r.op_log.tensor.astype(str).str.match(r"^[KV]\b")]
           .bytes.sum() for kv, r in runs.items()}
    assert dma == {"bf16": 2 * 1024 * D * 2, "fp8": 2 * 1024 * D}
    qk = {kv: int(r.op_log.query("stage == 'FETCH' and label == 'qk'").bytes.sum()) for kv, r in runs.items()}
    assert qk["bf16"] - qk["fp8"] == 1024 * D  # K's FETCH halves; Q's (bf16) does not move
    fetch = {kv: _pv_fetch_bytes(r) for kv, r in runs.items()}
    assert fetch["bf16"] - fetch["fp8"] == 1024 * D  # V's FETCH halves; P's (fp32) does not move
    assert runs["fp8"].cycles < runs["bf16"].cycles


def test_out_dtype_bf16_rounds_o_once_at_the_store():
    r32 = decode.run("opt2", kv_len=256, seed=2)
    r16 = decode.run("opt2", kv_len=256, seed=2, out_dtype="bf16")
    assert np.array_equal(r16.O, r32.O.astype(ml_dtypes.bfloat16).astype(np.float32))
    stores = {n: int(r.op_log.query("label == 'dma_store O' and stage != 'DISPATCH'").bytes.sum()) for n, r in (("32", r32), ("16", r16))}
    assert stores == {"32": G * D * 4, "16": G * D * 2}
    assert r16.params["out_dtype"] == "bf16" and r32.params["out_dtype"] == "fp32"


def test_compare_and_sweep_take_the_precision_knobs():
    cmp = decode.compare(kv_len=256, variants=("opt2", "opt3", "a1"), kv_dtype="fp8", out_dtype="bf16",
                         p_dtype="bf16")
    assert cmp.params["kv_dtype"] == "fp8" and cmp.params["p_dtype"] == "bf16"
    assert all(d["O"] == 0.0 for d in cmp.max_abs_diffs.values())
    rows = decode.sweep(kv_len=[256], kv_dtype=["bf16", "fp8"], out_dtype=["fp32", "bf16"],
                        p_dtype=["fp32", "bf16"], progress=False, workers=1)
    assert len(rows) == 8 * 2
    cyc = rows.set_index(["kv_dtype", "out_dtype", "p_dtype", "variant"]).cycles
    assert cyc["fp8", "fp32", "fp32", "opt2"] < cyc["bf16", "fp32", "fp32", "opt2"]
    assert cyc["bf16", "fp32", "bf16", "opt2"] <= cyc["bf16", "fp32", "fp32", "opt2"]


def test_the_command_line_takes_the_precision_knobs(capsys):
    import json

    from kbwork.__main__ import main
    assert main(["compare", "--kv-len", "256", "--variants", "opt2,opt3,a1", "--set", "p_dtype=bf16",
                 "--out-dtype", "bf16", "--kv-dtype", "fp8", "--json", "-q"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert (d["params"]["p_dtype"], d["params"]["out_dtype"], d["params"]["kv_dtype"]) == ("bf16", "bf16", "fp8")
    assert all(v["O"] == 0.0 for v in d["max_abs_diff"].values())
    with pytest.raises(SystemExit) as exc:
        main(["run", "--variant", "opt2", "--kv-len", "256", "--out-dtype", "fp16"])
    assert exc.value.code == 2 and "argument --out-dtype: invalid choice: 'fp16'" in capsys.readouterr().err
