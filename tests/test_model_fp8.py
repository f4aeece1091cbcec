"""FP8 in a decode step (DESIGN.md §17): W8A8 GEMMs at the host's FP8 peak, KV bytes by dtype on both
placements, in the capacity check and in the physical bound, recomputed here by hand from §15 and §17."""

from __future__ import annotations

import json

import pytest

from kbwork import model as mdl
from kbwork.errors import ConfigError

H200 = dict(peak_bf16=989e12, peak_fp8=1979e12, bw=4.8e12, eta_flops=0.8, eta_bw=0.86, launch=0.53e-6)


def _gemm_by_hand(rows: int, n_in: int, n_out: int, dtype: str) -> float:
    peak, nbytes = (H200["peak_fp8"], 1) if dtype == "fp8" else (H200["peak_bf16"], 2)
    flops_s = 2 * rows * n_in * n_out / (peak * H200["eta_flops"])
    bytes_s = (n_in * n_out + rows * (n_in + n_out)) * nbytes / (H200["bw"] * H200["eta_bw"])
    return max(flops_s, bytes_s) + H200["launch"]


@pytest.mark.parametrize("rows", [1, 64, 4096])
def test_an_fp8_gemm_by_hand(rows):
    for dtype in ("bf16", "fp8"):
        g = mdl.gemm("h200", rows, 4096, 14336, name="FFN", dtype=dtype)
        assert g.seconds == pytest.approx(_gemm_by_hand(rows, 4096, 14336, dtype), rel=1e-12)
        assert g.dtype == dtype
    # at 4096 rows the GEMM is compute-bound: the FP8 peak halves it (less the launch)
    big = {d: mdl.gemm("h200", 4096, 4096, 14336, dtype=d) for d in ("bf16", "fp8")}
    assert big["fp8"].flops_s == pytest.approx(big["bf16"].flops_s * 989 / 1979)


def test_a_host_step_in_fp8_by_hand():
    m = mdl.load_model("llama-3-8b")
    ctx = [2048] * 64
    s = mdl.step(m, ctx, placement="host", weight_dtype="fp8", kv_dtype="fp8")
    assert (s.weight_dtype, s.kv_dtype) == ("fp8", "fp8") and s.model.weight_dtype == "fp8"
    shapes = {"QKV": (4096, (32 + 16) * 128), "O": (32 * 128, 4096), "FFN up": (4096, 2 * 14336),
              "FFN down": (14336, 4096)}
    per_layer = sum(_gemm_by_hand(64, *shapes[n], "fp8") for n in shapes)
    # the KV cache streams 1 byte per element at the measured fraction of peak at the mean context
    kv = 64 * 2 * 8 * 2048 * 128 * 1
    eta = mdl.host.eta_attention(2048)
    attn = kv / (H200["bw"] * eta) + H200["launch"]
    assert s.host_attention.kv_bytes == kv
    want = 32 * (per_layer + attn) + _gemm_by_hand(64, 4096, 128256, "fp8")
    assert s.seconds == pytest.approx(want, rel=1e-12)
    mem = s.memory.set_index("what")["bytes"]
    assert mem["weights"] == mdl.capacity.parameters(m) * 1 and mem["kv"] == 2 * 32 * 8 * 128 * 1 * sum(ctx)


def test_a_device_step_with_fp8_kv_by_hand():
    ctx = [1024] * 2
    s8 = mdl.step("llama-3-8b", ctx, kv_dtype="fp8")
    s16 = mdl.step("llama-3-8b", ctx)
    log8, log16 = s8.attention.op_log, s16.attention.op_log

    def kv_dma(log):
        return int(log[(log.stage == "DMA_READ") & log.tensor.astype(str).str.match(r"^[KV]\d")].bytes.sum())

    # every task reads its K and V once: 2 sequences x 8 KV heads x 2 tensors x 1024 x 128 x bytes
    assert kv_dma(log16) == 2 * 8 * 2 * 1024 * 128 * 2 and kv_dma(log8) * 2 == kv_dma(log16)
    mem = s8.memory.set_index("what")["bytes"]
    assert mem["kv"] == 2 * 32 * 8 * 128 * 1 * sum(ctx) and mem["weights"] == 2 * mdl.capacity.parameters(s8.model)
    assert s8.attention_cycles < s16.attention_cycles
    # the device's channels carry half the bytes: the channel bound halves
    assert s8.attention_runs[0].channel_bound_cycles * 2 == pytest.approx(s16.attention_runs[0].channel_bound_cycles)
    # the host GEMMs stay bf16
    assert s8.breakdown.set_index("phase").loc["QKV", "per_layer_us"] == \
        s16.breakdown.set_index("phase").loc["QKV", "per_layer_us"]


def test_fp8_makes_70b_fit_and_the_capacity_message_says_so():
    from kbwork.errors import CapacityError
    with pytest.raises(CapacityError, match=r"weight_dtype='fp8' or kv_dtype='fp8' \(1-byte FP8 weights and KV"):
        mdl.step("llama-3-70b", [32768] * 2, placement="host")
    s = mdl.step("llama-3-70b", [32768] * 2, placement="host", weight_dtype="fp8")  # 65.7 GiB of weights
    assert s.fits
    with pytest.raises(ConfigError, match=r"'kv_dtype' is 'fp4'; use one of bf16, fp8"):
        mdl.step("llama-3-8b", [1024], kv_dtype="fp4")


def test_the_physical_bound_counts_bytes_by_dtype():
    b16 = mdl.physical_bound("llama-3-70b", [5120])
    b8 = mdl.physical_bound("llama-3-70b", [5120], weight_dtype="fp8", kv_dtype="fp8")
    assert b8.weight_bytes * 2 == b16.weight_bytes and b8.kv_bytes * 2 == b16.kv_bytes
    assert b8.host_flops_per_s == 1979e12 and b16.host_flops_per_s == 989e12
    s = mdl.step("llama-3-70b", [5120], placement="host", weight_dtype="fp8")
    assert s.seconds >= mdl.physical_bound(s.model, s.contexts, host=s.host).seconds("host")


def test_sweep_axes_and_the_cli_flags(capsys):
    from kbwork.cli import main
    assert {"weight_dtype", "kv_dtype"} <= set(mdl.sweeps.sweep_axes())
    df = mdl.sweep(model="llama-3-8b", batch=[64], context=[2048], weight_dtype=["bf16", "fp8"],
                   kv_dtype=["bf16", "fp8"], placements=("host",), progress=False, workers=1)
    tps = df.set_index(["weight_dtype", "kv_dtype"]).tokens_per_s
    assert 1.5 <= tps["fp8", "fp8"] / tps["bf16", "bf16"] <= 2.2
    bounded = mdl.with_bounds(df)
    assert (bounded.of_bound <= 1).all()
    assert main(["step", "--model", "llama-3-8b", "--batch", "4", "--context", "1024", "--placement", "host",
                 "--weight-dtype", "fp8", "--kv-dtype", "fp8", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    case = out["cases"][0]
    assert (case["weight_dtype"], case["kv_dtype"]) == ("fp8", "fp8") and out["model"]["weight_dtype"] == "fp8"
    assert main(["step", "--model", "llama-3-8b", "--batch", "4", "--context", "1024", "--placement", "host",
                 "--kv-dtype", "fp8"]) == 0
    assert "; KV fp8" in capsys.readouterr().out


def test_the_step_panel_has_dtype_controls():
    from kbwork.model_panel import CONTROLS, StepPanel
    assert {"weight_dtype", "kv_dtype"} <= set(CONTROLS)
    panel = StepPanel(model="llama-3-8b", batch=64, context=2048, variants=("opt2",), schedules=("serial",),
                      draw=False)
    before = panel.state["tokens_per_s"]["H200 alone"]
    state = panel.update(weight_dtype="fp8", kv_dtype="fp8")
    s = mdl.step("llama-3-8b", [2048] * 64, placement="host", weight_dtype="fp8", kv_dtype="fp8")
    assert state["tokens_per_s"]["H200 alone"] == pytest.approx(s.tokens_per_s) and s.tokens_per_s > 1.5 * before
    assert "weights fp8; KV fp8" in panel.setting_text()
    with pytest.raises(Exception, match="kv_dtype must be one of bf16, fp8"):
        panel.update(kv_dtype="fp4")
    pytest.importorskip("ipywidgets")
    box = StepPanel(model="llama-3-8b", batch=2, context=1024, variants=("opt2",), schedules=("serial",))
    box.widget()
    box._widgets["kv_dtype"].value = "fp8"
    assert box.state["kv_dtype"] == "fp8" and box.error is None
