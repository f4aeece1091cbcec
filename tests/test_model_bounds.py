"""The physical lower bound on a model's decode step, and one KV-head task beside others on a shared channel
(kbwork.model.bounds, kbwork.model.contention)."""

from __future__ import annotations

import math

import pandas as pd
import pytest

import kbwork
from kbwork import ConfigError, ValidationError, decode
from kbwork import model as mdl
from kbwork.model import Model

TINY = Model("tiny", layers=3, hidden=256, heads=4, kv_heads=2, head_dim=64, ffn=512, vocab=1000)


# --- the physical bound ----------------------------------------------------------------------------
def test_the_physical_bound_by_hand():
    b = mdl.physical_bound(TINY, [1000, 3000])
    per_layer = 256 * (4 + 2 * 2) * 64 + 4 * 64 * 256 + 256 * 2 * 512 + 512 * 256   # QKV, O, FFN up, FFN down
    weights = (3 * per_layer + 256 * 1000) * 2
    kv = 3 * sum(2 * 2 * c * 64 * 2 for c in (1000, 3000))
    flops = 2 * 2 * (3 * per_layer + 256 * 1000)
    assert (b.weight_bytes, b.kv_bytes, b.gemm_flops, b.batch) == (weights, kv, flops, 2)
    host_bw, dev_bw = 4.8e12, 96 * 40 * 1.25e9
    assert (b.host_bytes_per_s, b.device_bytes_per_s, b.host_flops_per_s) == (host_bw, dev_bw, 989e12)
    host = max(weights / host_bw, flops / 989e12)
    assert b.seconds("host") == pytest.approx(max((weights + kv) / host_bw, flops / 989e12))
    assert b.seconds("ahbm_serial") == pytest.approx(host + kv / dev_bw)
    assert b.seconds("ahbm") == pytest.approx(max(host, kv / dev_bw))
    assert b.tokens_per_s("ahbm") == pytest.approx(2 / b.seconds("ahbm"))
    assert set(mdl.BOUND_KINDS) == {"host", "ahbm_serial", "ahbm"}
    d = b.to_dict()
    assert d["ahbm_serial_tokens_per_s"] == pytest.approx(b.tokens_per_s("ahbm_serial")) and d["batch"] == 2
    # a device and host of other sizes, and unconstrained channels (the device's part is free)
    b2 = mdl.physical_bound(TINY, [1000], host={"hbm_tb_s": 9.6}, hbm_channels=48, channel_bytes_per_cycle=80)
    assert b2.host_bytes_per_s == 9.6e12 and b2.device_bytes_per_s == dev_bw
    free = mdl.physical_bound(TINY, [1000], channel_bytes_per_cycle=math.inf)
    assert free.device_s == 0 and free.seconds("ahbm_serial") == free.host_s
    with pytest.raises(ValidationError, match="unknown"):
        b.seconds("gpu")
    for bad in ([], [0], "1024", [1.5]):
        with pytest.raises(ValidationError, match="contexts"):
            mdl.physical_bound(TINY, bad)


@pytest.mark.parametrize("kw", [dict(placement="host"), dict(schedule="serial"), dict(schedule="ping_pong"),
                                dict(schedule="ping_pong", variant="opt3", channel_bytes_per_cycle=8),
                                dict(schedule="serial", pes=192, hbm_channels=96, channel_bytes_per_cycle=160)])
def test_no_step_beats_its_physical_bound(kw):
    for name, contexts in (("llama-3-8b", [2048] * 4), ("llama-3-70b", [1024, 8192, 300])):
        s = mdl.step(name, contexts, **kw)
        b = mdl.physical_bound(s.model, s.contexts, host=s.host, device=s.device)
        kind = mdl.bounds.bound_kind_of(s.placement, s.schedule)
        assert s.seconds >= b.seconds(kind)
        assert s.tokens_per_s <= b.tokens_per_s(kind)


def test_with_bounds_adds_each_row_s_bound():
    rows = pd.DataFrame({"model": ["llama-3-8b"] * 3, "batch": [4, 4, 4], "context": [2048] * 3,
                         "variant": ["opt2", "opt2", "-"], "placement": ["ahbm", "ahbm", "host"],
                         "schedule": ["serial", "ping_pong", "serial"], "tokens_per_s": [100.0, 200.0, 300.0],
                         "channel_bytes_per_cycle": [40, 80, 40]})
    out = mdl.with_bounds(rows)
    assert list(out["physical_bound"]) == ["ahbm_serial", "ahbm", "host"]
    b40 = mdl.physical_bound("llama-3-8b", [2048] * 4)
    b80 = mdl.physical_bound("llama-3-8b", [2048] * 4, channel_bytes_per_cycle=80)
    assert list(out["bound_tokens_per_s"]) == pytest.approx([b40.tokens_per_s("ahbm_serial"),
                                                             b80.tokens_per_s("ahbm"), b40.tokens_per_s("host")])
    assert list(out["of_bound"]) == pytest.approx(list(rows.tokens_per_s / out.bound_tokens_per_s))
    assert "physical_bound" not in rows.columns   # a copy
    with_own = mdl.with_bounds(rows.assign(bound="host bandwidth"))
    assert list(with_own["bound"]) == ["host bandwidth"] * 3     # the sweep's own column is kept
    with pytest.raises(ValidationError, match="columns"):
        mdl.with_bounds(rows.drop(columns="schedule"))


# --- one task beside others on a channel ------------------------------------------------------------
def test_per_head_contention_alone_is_a_plain_decode_run_and_sharing_costs_at_least_the_channel():
    df = mdl.per_head_contention(TINY, 1000, pes_per_channel=(1, 2, 3), variants=("opt2", "opt3"))
    assert list(df.columns) == ["pes_per_channel", "variant", "cycles", "channel_bound_cycles", "channel_busy"]
    assert list(zip(df.pes_per_channel, df.variant)) == [(k, v) for k in (1, 2, 3) for v in ("opt2", "opt3")]
    topo = kbwork.load_topology("ahbm-device-v1", pes=1, hbm_channels=1)
    for v in ("opt2", "opt3"):
        want = decode.run(v, kv_len=1024, group=2, head_dim=64, tile=128, mode="timing", topology=topo).cycles
        assert int(df[(df.pes_per_channel == 1) & (df.variant == v)].cycles.iloc[0]) == want
    kv = 2 * 1024 * 64 * 2                          # one task's K and V, padded to the tile
    assert list(df.channel_bound_cycles) == pytest.approx([k * kv / 40 for k in (1, 1, 2, 2, 3, 3)])
    assert (df.cycles >= df.channel_bound_cycles).all() and (df.channel_busy <= 1).all()
    # more PEs on the channel never make a task faster
    for v, g in df.groupby("variant"):
        assert g.sort_values("pes_per_channel").cycles.is_monotonic_increasing
    # overrides reach the device; more tasks than one sequence's KV heads take the next sequences
    wide = mdl.per_head_contention(TINY, 256, pes_per_channel=[5], variants=("a1",), hazard_policy="rw_aware",
                                   channel_bytes_per_cycle=64)
    assert len(wide) == 1 and wide.channel_bound_cycles.iloc[0] == pytest.approx(5 * 2 * 256 * 64 * 2 / 64)


@pytest.mark.parametrize("kw, error, match", [
    (dict(pes_per_channel=()), ValidationError, "distinct positive ints"),
    (dict(pes_per_channel=(1, 1)), ValidationError, "distinct positive ints"),
    (dict(pes_per_channel=(0,)), ValidationError, "distinct positive ints"),
    (dict(variants="opt2"), ValidationError, "variants"),
    (dict(variants=("opt9",)), ValidationError, "opt9"),
    (dict(fixed_cyles=3), ConfigError, "fixed_cycles"),
])
def test_per_head_contention_refuses_bad_arguments(kw, error, match):
    with pytest.raises(error, match=match):
        mdl.per_head_contention(TINY, 1024, **kw)


def test_with_bounds_takes_the_device_and_host_the_sweep_records():
    dev = mdl.load_device(channel_bytes_per_cycle=80)
    sw = mdl.sweep(context=[2048], batch=[4], variants=("opt2",), placements=("ahbm", "host"), device=dev,
                   host={"hbm_tb_s": 6.0}, workers=1, progress=False)
    out = mdl.with_bounds(sw)
    b = mdl.physical_bound("llama-3-8b", [2048] * 4, host={"hbm_tb_s": 6.0}, device=dev)
    assert list(out.bound_tokens_per_s) == pytest.approx([b.tokens_per_s("ahbm_serial"), b.tokens_per_s("host")])
    # given, host= and device= win over the record; a frame without one keeps the defaults
    given = mdl.with_bounds(sw, host="h200", device="ahbm-device-v1")
    plain = mdl.physical_bound("llama-3-8b", [2048] * 4)
    assert list(given.bound_tokens_per_s) == pytest.approx([plain.tokens_per_s("ahbm_serial"),
                                                            plain.tokens_per_s("host")])
    bare = pd.DataFrame(sw)
    bare.attrs = {}
    assert list(mdl.with_bounds(bare).bound_tokens_per_s) == list(given.bound_tokens_per_s)


def test_with_bounds_refuses_a_record_that_is_no_device():
    rows = pd.DataFrame({"model": ["llama-3-8b"], "batch": [1], "context": [512], "placement": ["host"],
                         "schedule": ["serial"], "tokens_per_s": [1.0]})
    rows.attrs["device"] = {"pes": "many"}
    with pytest.raises(ValidationError, match=r"with_bounds: the frame's attrs record no valid host and device "
                                              r"\(topology key 'pes' must be an integer.*pass host= and device="):
        mdl.with_bounds(rows)
