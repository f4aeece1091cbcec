"""A decode step's energy (DESIGN §18): joules recomputed from §18's formulas for a host-only and an AHBM step
(serial and ping-pong), the rows adding up, tokens per joule, watts, re-pricing without re-simulating, the
physical bound's least energy, and the sanity figures of the H200 alone."""

from __future__ import annotations

import json

import pytest

from kbwork import analysis
from kbwork import model as mdl
from kbwork.errors import ConfigError
from kbwork.model.energy import ENERGY_COLUMNS, grouped

PJ = 1e-12
LAYER = {"QKV": lambda m: (m.hidden, (m.heads + 2 * m.kv_heads) * m.head_dim),
         "O": lambda m: (m.heads * m.head_dim, m.hidden),
         "FFN up": lambda m: (m.hidden, 2 * m.ffn),
         "FFN down": lambda m: (m.ffn, m.hidden)}


def _gemm_joules(m, h, rows_per_half: list[int], nbytes: int = 2) -> float:
    """Every host GEMM of the step, §18: weights and activations (``nbytes`` each: 1 under W8A8) at
    8·gpu_hbm_pj_per_bit, FLOPs at flop_pj."""
    total = 0.0
    shapes = [(m.layers, *LAYER[n](m)) for n in LAYER] + [(1, m.hidden, m.vocab)]
    for b in rows_per_half:
        for times, n_in, n_out in shapes:
            total += times * ((n_in * n_out + b * (n_in + n_out)) * nbytes * 8 * h.gpu_hbm_pj_per_bit
                              + 2 * b * n_in * n_out * h.flop_pj) * PJ
    return total


def _host_busy_s(s) -> float:
    """Σ of the host's task durations: every GEMM (and the host's attention) of every layer, the LM head."""
    busy = 0.0
    for half in s._halves:
        busy += s.model.layers * sum(g.seconds for g in half.gemms.values()) + half.lm_head.seconds
        if s.placement == "host":
            busy += s.model.layers * half.attention_s
    return busy


def _check_rows(s) -> None:
    e = s.energy
    assert list(e.columns) == ENERGY_COLUMNS and (e["joules"] >= 0).all()
    assert e["joules"].sum() == pytest.approx(s.joules, rel=1e-12)
    assert s.tokens_per_j == s.batch / s.joules
    assert s.watts == s.joules / s.seconds
    assert grouped(e).sum() == pytest.approx(s.joules)


def test_a_host_only_step_s_joules_from_the_formulas():
    ctx = [1000, 2048, 3000]
    s = mdl.step("llama-3-8b", ctx, placement="host")
    m, h = s.model, s.host
    kv = sum(2 * m.kv_heads * c * m.head_dim * 2 for c in ctx)  # unpadded
    want = (_gemm_joules(m, h, [3]) + m.layers * kv * 8 * h.gpu_hbm_pj_per_bit * PJ
            + h.busy_w * _host_busy_s(s) + h.idle_w * s.seconds)
    assert s.joules == pytest.approx(want, rel=1e-9)
    assert h.busy_w * _host_busy_s(s) == pytest.approx(s.seconds * h.busy_w, rel=1e-9)  # the host never waits
    assert set(s.energy["resource"]) == {"host"}  # no device, no link
    _check_rows(s)


def test_an_fp8_host_step_s_joules_count_one_byte_per_weight_and_kv_element():
    ctx = [1000, 2048]
    s = mdl.step("llama-3-8b", ctx, placement="host", weight_dtype="fp8", kv_dtype="fp8")
    m, h = s.model, s.host
    kv = sum(2 * m.kv_heads * c * m.head_dim * 1 for c in ctx)  # e4m3fn: 1 byte per element
    want = (_gemm_joules(m, h, [2], nbytes=1) + m.layers * kv * 8 * h.gpu_hbm_pj_per_bit * PJ
            + h.busy_w * _host_busy_s(s) + h.idle_w * s.seconds)
    assert s.joules == pytest.approx(want, rel=1e-9)
    _check_rows(s)


@pytest.mark.parametrize("schedule", ["serial", "ping_pong"])
def test_an_ahbm_step_s_joules_from_the_formulas(schedule):
    ctx = [512, 640, 384]
    s = mdl.step("llama-3-8b", ctx, schedule=schedule, pes=8, hbm_channels=8, check_capacity=False)
    m, h, topo = s.model, s.host, s.device.topology
    halves = [2, 1] if schedule == "ping_pong" else [3]
    assert [x.rows for x in s._halves] == halves
    device = 0.0
    for r in s.attention_runs:  # one per half under ping-pong
        e = analysis.energy(r.run)
        device += e.loc[e["kind"] != "idle", "pj"].sum() * PJ
    q_and_o = sum(2 * b * m.heads * m.head_dim * 2 for b in halves)
    want = (_gemm_joules(m, h, halves) + h.busy_w * _host_busy_s(s) + h.idle_w * s.seconds
            + m.layers * device + topo.pe_idle_mw * 1e-3 * 8 * s.seconds
            + m.layers * q_and_o * 8 * h.link_pj_per_bit * PJ)
    assert s.joules == pytest.approx(want, rel=1e-9)
    _check_rows(s)
    # the device's part, by hand from one run's op_log: its DMA bytes at 8 · hbm_pj_per_bit
    e = s.energy.set_index(["part", "resource", "kind"])["joules"]
    dma = sum(int(r.run.op_log.loc[r.run.op_log.stage.isin(["DMA_READ", "DMA_WRITE"]), "bytes"].sum())
              for r in s.attention_runs)
    assert e[("attention", "device", "hbm")] == pytest.approx(m.layers * dma * 8 * topo.hbm_pj_per_bit * PJ)
    tl = s.timeline[s.timeline.resource == "host"]
    assert _host_busy_s(s) == pytest.approx(float((tl.end - tl.start).sum()) * 1e-6, rel=1e-9)


def test_the_least_energy_bounds_every_step_and_re_pricing_simulates_nothing():
    ctx = [2048] * 4
    b = mdl.physical_bound("llama-3-8b", ctx)
    host = mdl.step("llama-3-8b", ctx, placement="host")
    serial = mdl.step("llama-3-8b", ctx)
    pp = mdl.step("llama-3-8b", ctx, schedule="ping_pong")
    assert b.joules("host") <= host.joules and b.joules("ahbm_serial") <= serial.joules
    assert b.joules("ahbm") <= pp.joules and b.tokens_per_j("host") == 4 / b.joules("host")
    assert {"host_joules", "ahbm_tokens_per_j"} <= set(b.to_dict())
    # a bank-level PE (0.55 pJ/bit): the same seconds, fewer joules; with_energy agrees with a fresh step
    bank = mdl.step("llama-3-8b", ctx, hbm_pj_per_bit=0.55)
    again = serial.with_energy(hbm_pj_per_bit=0.55)
    assert bank.seconds == serial.seconds and bank.joules < serial.joules
    assert again.joules == pytest.approx(bank.joules, rel=1e-12) and again.attention is serial.attention
    assert serial.with_energy(busy_w=0, idle_w=0).joules < serial.joules
    assert serial.with_energy(busy_w=0).host.busy_w == 0 and serial.host.busy_w == 350
    free = serial.with_energy(**{k: 0 for k in ("hbm_pj_per_bit", "tcm_pj_per_byte", "mac_pj", "math_pj_per_element",
                                                  "dispatch_pj_per_cycle", "pe_idle_mw", "gpu_hbm_pj_per_bit",
                                                  "flop_pj", "idle_w", "busy_w", "link_pj_per_bit")})
    assert free.joules == 0 and free.tokens_per_j == float("inf")
    with pytest.raises(ConfigError, match=r"'pes' is not an energy key.*run model.step again"):
        serial.with_energy(pes=4)
    with pytest.raises(ConfigError, match=r"'mac_pj' is -1"):
        serial.with_energy(mac_pj=-1)
    with pytest.raises(ConfigError, match=r"'busy_w' is -1.0"):
        serial.with_energy(busy_w=-1)


def test_compare_rows_json_and_the_table_carry_the_energy(capsys):
    from kbwork.__main__ import main

    df = mdl.compare("llama-3-8b", [1024] * 2, variants=("opt2",))
    s = mdl.step("llama-3-8b", [1024] * 2)
    row = df[df.placement == "ahbm"].iloc[0]
    assert (row["joules"], row["tokens_per_j"], row["watts"]) == (s.joules, s.tokens_per_j, s.watts)
    assert main(["step", "--context", "1024", "--batch", "2", "--variants", "opt2", "--json", "--quiet"]) == 0
    case = json.loads(capsys.readouterr().out)["cases"][0]
    assert case["joules"] == s.joules and case["watts"] == s.watts
    assert sum(r["joules"] for r in case["energy"]) == pytest.approx(case["joules"])
    assert main(["step", "--context", "1024", "--batch", "2", "--variants", "opt2", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "J/step" in out and "tokens/J" in out and "energy, ahbm opt2 serial: " in out


def test_the_h200_alone_draws_what_an_h200_draws_under_decode():
    # DESIGN §18's sanity row: Llama-3-8B, batch 64 at 2k on the H200 alone: 400-700 W, 0.03-0.2 J/token
    s = mdl.step("llama-3-8b", [2048] * 64, placement="host")
    assert 400 <= s.watts <= 700 and 0.03 <= s.joules / s.batch <= 0.2


def test_the_energy_plots_draw_every_case_and_every_group():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd

    from kbwork import plots
    from kbwork.model.energy import GROUPS

    rows, bars = [], {}
    for b in (1, 4):
        host = mdl.step("llama-3-8b", [1024] * b, placement="host")
        dev = mdl.step("llama-3-8b", [1024] * b)
        for label, s in (("H200 alone", host), ("AHBM base die", dev),
                         ("AHBM bank", dev.with_energy(hbm_pj_per_bit=0.55))):
            rows.append({"case": label, "batch": b, "tokens_per_s": s.tokens_per_s, "tokens_per_j": s.tokens_per_j,
                         "fits": b == 1})
            bars[f"{label}, batch {b}"] = {**grouped(s.energy).to_dict(), "batch": b}
    ax = plots.tokens_per_j(pd.DataFrame(rows))
    gids = {a.get_gid() for a in ax.get_lines()}
    assert {"case:H200 alone", "case:AHBM base die", "case:AHBM bank", "case:AHBM bank:hollow"} <= gids
    assert ax.hollow and ax.get_xscale() == "log"
    frame = pd.DataFrame.from_dict(bars, orient="index")
    ax = plots.energy_bars(frame)
    drawn = {p.get_gid() for p in ax.patches}
    assert {"group:host busy", "group:HBM", "group:link"} <= drawn and "group:MAC" in drawn
    tops = [t.get_text() for t in ax.texts]
    assert len(tops) == len(frame) and all(t.startswith("idle ") for t in tops)
    # the bars' heights are the steps' mJ per token
    first = frame.iloc[0]
    assert sum(p.get_height() for p in ax.patches if p.get_x() < 0.5) == pytest.approx(
        sum(first[g] for g in GROUPS.values()) * 1e3 / first["batch"])
    plt.close("all")
    from kbwork.errors import ValidationError

    with pytest.raises(ValidationError, match="energy_bars: per="):
        plots.energy_bars(frame, per="layer")
    with pytest.raises(ValidationError, match="tokens_per_j: expected"):
        plots.tokens_per_j(frame)


def test_the_panel_s_energy_sliders_re_price_without_simulating(monkeypatch):
    from kbwork import model_panel

    panel = model_panel.StepPanel(model="llama-3-8b", batch=2, context=1024, variants=("opt2",),
                                  schedules=("serial",), draw=False)
    assert set(model_panel.ENERGY_CONTROLS) <= set(panel.values)
    before = panel.state["tokens_per_j"]["opt2 on AHBM, serial"]
    want = mdl.step("llama-3-8b", [1024] * 2, host={"busy_w": 300}, hbm_pj_per_bit=0.55)
    calls = []
    monkeypatch.setattr(model_panel.mdl, "step", lambda *a, **k: calls.append(a))  # any simulation would show
    state = panel.update(hbm_pj_per_bit=0.55, busy_w=300)
    assert calls == [] and state["tokens_per_j"]["opt2 on AHBM, serial"] > before
    assert state["tokens_per_j"]["opt2 on AHBM, serial"] == pytest.approx(want.tokens_per_j, rel=1e-12)
    assert panel.steps["H200 alone"].host.busy_w == 300 and "tokens/J" in panel.summary_html()
    with pytest.raises(ConfigError, match=r"'pe_idle_mw' is -1"):
        panel.update(pe_idle_mw=-1)
    assert panel.values["pe_idle_mw"] == 50.0 and panel.error
