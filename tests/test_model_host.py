"""The host side of a step by hand (DESIGN.md §15): one GEMM's roofline on each side of the ridge, the layer's
GEMM shapes, the GPU-only attention against the measured H200 table; and the task mapping with its padding."""

from __future__ import annotations

import math

import pytest

from kbwork import ConfigError, ValidationError
from kbwork.model import assign_tasks, gemm, host_attention, layer_gemms, lm_head, load_host, load_model
from kbwork.model.host import HOST_BANDWIDTH, HOST_FLOPS, eta_attention, measured_attention, weight_bytes
from kbwork.model.tasks import Padding, Task

H200 = load_host()


def test_a_large_gemm_is_bound_by_host_flops_by_hand():
    g = gemm(H200, 4096, 4096, 4096, name="big")
    flops = 2 * 4096 * 4096 * 4096 / (989e12 * 0.8)                          # 173.7 us
    bytes_ = (4096 * 4096 + 4096 * (4096 + 4096)) * 2 / (4.8e12 * 0.86)      # 24.4 us
    assert g.bound == HOST_FLOPS == "host flops"
    assert g.flops_s == pytest.approx(flops, rel=1e-12) and g.bytes_s == pytest.approx(bytes_, rel=1e-12)
    assert g.seconds == pytest.approx(flops + 0.53e-6, rel=1e-12)
    assert g.seconds * 1e6 == pytest.approx(174.23, abs=0.01)


def test_a_one_row_gemm_is_bound_by_host_bandwidth_by_hand():
    g = gemm(H200, 1, 4096, 14336)
    bytes_ = (4096 * 14336 + 1 * (4096 + 14336)) * 2 / (4.8e12 * 0.86)
    assert g.bound == HOST_BANDWIDTH == "host bandwidth"
    assert g.seconds == pytest.approx(bytes_ + 0.53e-6, rel=1e-12)
    assert g.seconds * 1e6 == pytest.approx(28.989, abs=0.001)   # 117,477,376 B at 4.128 TB/s + 0.53
    # the ridge: at equal times the GEMM counts as bandwidth-bound
    h = load_host({"peak_tflops_bf16": 1.0, "eta_flops": 1.0, "hbm_tb_s": 1.0, "eta_bw": 1.0})
    tie = gemm(h, 1, 2, 2)   # 2*1*2*2 = 8 flops; (4 + 1*4) * 2 = 16 bytes: 8e-12 s vs 16e-12 s
    assert tie.bound == HOST_BANDWIDTH


def test_a_layer_s_gemms_have_the_design_s_shapes():
    m = load_model("llama-3-8b")
    shapes = {n: (g.n_in, g.n_out, g.rows) for n, g in layer_gemms(m, H200, 16).items()}
    assert shapes == {"QKV": (4096, (32 + 2 * 8) * 128, 16), "O": (32 * 128, 4096, 16),
                      "FFN up": (4096, 2 * 14336, 16), "FFN down": (14336, 4096, 16)}
    lm = lm_head(m, H200, 16)
    assert (lm.n_in, lm.n_out) == (4096, 128256)
    per_layer, head = weight_bytes(m)
    assert per_layer == 2 * (4096 * 6144 + 4096 * 4096 + 4096 * 28672 + 14336 * 4096)
    assert head == 2 * 4096 * 128256


def test_the_host_placement_reproduces_the_measured_table_at_its_three_contexts():
    table = measured_attention()
    assert list(table.context) == [8192, 32768, 131072]
    m = load_model("llama-3-70b")          # 8 KV heads x group 8, head_dim 128: the table's shape
    for row in table.itertuples():
        assert (row.kv_heads, row.group, row.head_dim) == (m.kv_heads, m.group, m.head_dim)
        a = host_attention(m, H200, [row.context] * row.batch)
        assert a.kv_bytes == row.kv_bytes
        gb_per_s = a.kv_bytes / (a.seconds - H200.launch_s) / 1e9
        assert gb_per_s == pytest.approx(row.gb_per_s, rel=1e-12)
        assert a.eta == pytest.approx(row.fraction_of_4800_gb_per_s, abs=1e-4)


def test_eta_attention_is_linear_in_log2_context_and_clamped():
    t = measured_attention()
    e8, e32, e128 = t.eta
    assert eta_attention(16384) == pytest.approx((e8 + e32) / 2, rel=1e-12)
    assert eta_attention(65536) == pytest.approx((e32 + e128) / 2, rel=1e-12)
    assert eta_attention(8192 * 2 ** 0.25) == pytest.approx(e8 + (e32 - e8) / 8, rel=1e-12)
    assert eta_attention(128) == eta_attention(8192) == pytest.approx(e8)
    assert eta_attention(1 << 22) == pytest.approx(e128)


def test_host_attention_reads_contexts_as_given_at_their_arithmetic_mean():
    m = load_model("llama-3-8b")
    a = host_attention(m, H200, [1000, 9000, 20000])
    assert a.kv_bytes == 2 * 8 * (1000 + 9000 + 20000) * 128 * 2      # unpadded
    assert a.mean_context == 10000 and a.eta == eta_attention(10000)
    assert a.seconds == pytest.approx(a.kv_bytes / (4.8e12 * a.eta) + 0.53e-6, rel=1e-12)


def test_tasks_go_round_robin_in_sequence_then_kv_head_order():
    tasks = assign_tasks([1000, 128, 129], kv_heads=2, pes=4, tile=128)
    assert tasks[:2] == (Task(0, 0, 0, 0, 1000, 1024), Task(1, 0, 1, 1, 1000, 1024))
    assert [(t.sequence, t.kv_head, t.pe) for t in tasks] == [(0, 0, 0), (0, 1, 1), (1, 0, 2), (1, 1, 3),
                                                              (2, 0, 0), (2, 1, 1)]
    assert [t.padded_context for t in tasks] == [1024, 1024, 128, 128, 256, 256]
    half_b = assign_tasks([512], kv_heads=2, pes=4, tile=128, first_sequence=5)
    assert [(t.index, t.sequence, t.pe) for t in half_b] == [(0, 5, 0), (1, 5, 1)]   # mapped from PE 0


def test_padding_is_reported_per_sequence_and_in_total():
    p = Padding.of([1000, 128, 129], 128)
    assert p.padded == (1024, 128, 256) and p.per_sequence == (24, 0, 127) and p.total == 151
    assert p.fraction == pytest.approx(151 / 1257)
    assert list(p.to_frame().padding) == [24, 0, 127]
    assert "151 keys over 3 sequences" in repr(p)
    assert Padding.of([4096] * 4, 128).total == 0
    assert math.isclose(Padding.of([1], 64).fraction, 63)


# --- bad input: typed errors naming the argument ---------------------------------------------------
def test_gemm_takes_a_host_as_load_host_does():
    want = gemm(H200, 16, 4096, 4096)
    assert gemm("h200", 16, 4096, 4096) == want                       # a name, as step(host=...) takes
    assert gemm({"eta_bw": 0.5}, 1, 64, 64) == gemm(load_host({"eta_bw": 0.5}), 1, 64, 64)
    m = load_model("llama-3-8b")
    assert layer_gemms("llama-3-8b", "h200", 4) == layer_gemms(m, H200, 4)
    assert lm_head("llama-3-8b", "h200", 4) == lm_head(m, H200, 4)
    assert host_attention("llama-3-8b", "h200", [1000, 3000]) == host_attention(m, H200, [1000, 3000])


@pytest.mark.parametrize("call, error, match", [
    (lambda: gemm(5, 1, 64, 64), ConfigError, r"host must be a name \(e.g. 'h200'\).*got 5 \(a int\)"),
    (lambda: gemm("h100", 1, 64, 64), ConfigError, "host 'h100' not found"),
    (lambda: gemm(H200, 0, 64, 64), ValidationError, r"host GEMM 'gemm': rows must be a positive int, got 0"),
    (lambda: gemm(H200, 1, 64.0, 64), ValidationError, "n_in must be a positive int, got 64.0"),
    (lambda: layer_gemms(None, H200, 1), ConfigError, "model must be a name"),
    (lambda: layer_gemms("llama-3-8b", [], 1), ConfigError, "host must be a name"),
    (lambda: lm_head("llama-3-8b", H200, -2), ValidationError, "'LM head': rows must be a positive int, got -2"),
    (lambda: host_attention("llama-3-8b", H200, []), ValidationError, "model.host_attention: contexts is empty"),
    (lambda: host_attention("llama-3-8b", H200, [0]), ValidationError,
     r"model.host_attention: contexts\[0\] is 0; every context is a positive int"),
    (lambda: host_attention("llama-3-8b", H200, [512, -3]), ValidationError, r"contexts\[1\] is -3"),
    (lambda: host_attention("llama-3-8b", H200, 512), ValidationError, "contexts must be a list of KV lengths"),
    (lambda: host_attention("llama-3-8b", H200, ["8"]), ValidationError, r"contexts\[0\] is '8' \(str\)"),
    (lambda: load_model("llama-3-8b").kv_bytes("x"), ValidationError, "Model.kv_bytes: context must be a positive"),
])
def test_host_helpers_refuse_bad_input_with_typed_errors(call, error, match):
    with pytest.raises(error, match=match):
        call()


@pytest.mark.parametrize("kw, match", [
    (dict(pes=0), r"model.assign_tasks: pes must be a positive int, got 0 \(int\); e.g. pes=96"),
    (dict(pes=1.5), r"pes must be a positive int, got 1.5 \(float\)"),
    (dict(tile=0), r"model.assign_tasks: tile must be a positive int .*got 0 \(int\); e.g. tile=128"),
    (dict(tile="128"), r"tile must be a positive int .*got '128' \(str\)"),
    (dict(kv_heads=0), r"kv_heads must be a positive int, got 0"),
    (dict(kv_heads=None), r"kv_heads must be a positive int, got None \(NoneType\)"),
    (dict(first_sequence=-1), r"first_sequence must be a non-negative int, got -1"),
    (dict(first_sequence="0"), r"first_sequence must be a non-negative int, got '0'"),
    (dict(contexts=256), "contexts must be a list of KV lengths"),
    (dict(contexts=[256, 0]), r"contexts\[1\] is 0"),
    (dict(contexts=["a"]), r"contexts\[0\] is 'a' \(str\)"),
])
def test_assign_tasks_refuses_bad_input_naming_the_argument(kw, match):
    with pytest.raises(ValidationError, match=match):
        assign_tasks(**{**dict(contexts=[256], kv_heads=2, pes=1, tile=128), **kw})


def test_assign_tasks_of_no_sequences_is_no_tasks():
    assert assign_tasks([], kv_heads=2, pes=4, tile=128) == ()


@pytest.mark.parametrize("contexts, tile, match", [
    ([128], 0, r"model.Padding.of: tile must be a positive int"),
    ([], 128, "model.Padding.of: contexts is empty"),
    ([0], 128, r"model.Padding.of: contexts\[0\] is 0"),
    (128, 128, "model.Padding.of: contexts must be a list"),
])
def test_padding_refuses_bad_input(contexts, tile, match):
    with pytest.raises(ValidationError, match=match):
        Padding.of(contexts, tile)
