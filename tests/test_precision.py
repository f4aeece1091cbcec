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
