"""A decode step of a model on the device (DESIGN.md §15): the attention against plain decode runs, every layer
simulated against one counted, ping-pong against serial, the accounting, the bound, and typed errors."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import kbwork
from kbwork import ConfigError, ValidationError, decode
from kbwork import model as mdl
from kbwork.model import Model, assign_tasks, gemm, load_device, load_host
from kbwork.model.device import attention_run

#: A 3-layer model small enough to simulate layer by layer in a test.
TINY = Model("tiny", layers=3, hidden=256, heads=4, kv_heads=2, head_dim=64, ffn=512, vocab=1000)
H200 = load_host()


def test_the_default_device_is_ahbm_device_v1():
    d = load_device()
    assert (d.pes, d.hbm_channels, d.channel_bytes_per_cycle) == (96, 96, 40)
    assert d.topology == kbwork.load_topology("ahbm-device-v1") and d.name == "ahbm-device-v1"
    assert d.pe == d.topology.replace(pes=1, hbm_channels=1)
    # every key but the device's are ahbm-pe-v1's (DESIGN §14; hbm_gib, the device's HBM, is §15's; sync_cycles,
    # its signal latency, §16's)
    keys = {k: v for k, v in d.topology.to_dict().items() if k not in ("name", "pes", "hbm_channels",
                                                                        "channel_bytes_per_cycle", "hbm_gib",
                                                                        "sync_cycles")}
    assert keys == {k: v for k, v in kbwork.load_topology().to_dict().items() if k in keys}
    one = load_device(kbwork.load_topology(fixed_cycles=80))                    # a Topology: one PE, §14's defaults
    assert (one.pes, one.hbm_channels, one.pe.fixed_cycles) == (1, 1, 80)
    assert load_device(d, pes=8, hbm_channels=8, fixed_cycles=0).pe.fixed_cycles == 0
    assert "96 PEs" in repr(d) and "96 channels x 40 B/cycle" in repr(d)
    with pytest.raises(ConfigError, match="multiple of hbm_channels"):
        load_device(pes=8, hbm_channels=3)


def test_a_one_task_step_s_attention_is_a_plain_decode_run():
    s = mdl.step(TINY.replace(kv_heads=1), [1000], pes=1, hbm_channels=1, tile=128)
    want = decode.run("opt2", kv_len=1024, group=4, head_dim=64, tile=128, mode="timing",
                      topology=kbwork.load_topology("ahbm-device-v1", pes=1, hbm_channels=1)).cycles
    assert len(s.tasks) == 1 and s.attention_cycles == want
    assert s.attention_runs[0].per_pe_cycles == (want,)


def test_a_pe_runs_its_tasks_back_to_back_and_the_layer_is_the_busiest_pe():
    contexts = [300, 1000, 128]
    s = mdl.step(TINY, contexts, variant="opt3", pes=4, hbm_channels=4, tile=128)
    topo = kbwork.load_topology("ahbm-device-v1", pes=1, hbm_channels=1)
    one = {n: decode.run("opt3", kv_len=n, group=2, head_dim=64, tile=128, mode="timing", topology=topo).cycles
           for n in (384, 1024, 128)}
    # tasks (s, h): (0,0) PE0 384, (0,1) PE1 384, (1,0) PE2 1024, (1,1) PE3 1024, (2,0) PE0 128, (2,1) PE1 128
    per_pe = (one[384] + one[128], one[384] + one[128], one[1024], one[1024])
    run = s.attention_runs[0]
    assert run.per_pe_cycles == per_pe and s.attention_cycles == max(per_pe) == run.cycles
    assert run.busiest_pe == int(np.argmax(per_pe))
    assert s.attention is run.run and sorted(s.attention.pes) == [0, 1, 2, 3]
    assert [t.pe for t in s.tasks] == [0, 1, 2, 3, 0, 1]


def test_attention_is_never_shorter_than_its_busiest_channel():
    for contexts, pes in (([8192] * 3, 96), ([1000, 5000, 300, 20000], 4)):
        s = mdl.step("llama-3-8b", contexts, pes=pes, hbm_channels=pes)
        run = s.attention_runs[0]
        kv = {}
        for t in s.tasks:
            kv[t.pe] = kv.get(t.pe, 0) + 2 * t.padded_context * 128 * 2
        assert run.channel_bound_cycles == max(kv.values()) / 40
        assert run.cycles >= run.channel_bound_cycles


def _layer_by_hand(m: Model, contexts, device, variant: str, tile: int) -> float:
    """One layer simulated on its own: its attention on a fresh device run, its GEMMs by the roofline."""
    tasks = assign_tasks(contexts, kv_heads=m.kv_heads, pes=device.pes, tile=tile)
    cycles = attention_run(tasks, device, variant, tile, group=m.group, head_dim=m.head_dim).cycles
    b = len(contexts)
    gemms = [gemm(H200, b, m.hidden, (m.heads + 2 * m.kv_heads) * m.head_dim),
             gemm(H200, b, m.heads * m.head_dim, m.hidden), gemm(H200, b, m.hidden, 2 * m.ffn),
             gemm(H200, b, m.ffn, m.hidden)]
    return sum(g.seconds for g in gemms) + 2 * H200.handoff_s + cycles / (device.pe.clock_ghz * 1e9)


def test_simulating_every_layer_equals_simulating_one_and_counting_it():
    contexts = [700, 128, 2000]
    device = load_device(pes=4, hbm_channels=4)
    s = mdl.step(TINY, contexts, variant="a1", pes=4, hbm_channels=4)
    every = sum(_layer_by_hand(TINY, contexts, device, "a1", 128) for _ in range(TINY.layers))
    lm = gemm(H200, 3, TINY.hidden, TINY.vocab).seconds
    assert s.seconds == pytest.approx(every + lm, rel=1e-12)
    assert s.timeline["end"].max() * 1e-6 == pytest.approx(s.seconds, rel=1e-12)
    assert sorted(set(s.timeline.layer)) == [0, 1, 2]


def test_ping_pong_layers_simulated_one_by_one_give_the_step():
    contexts = [700, 128, 2000]
    s = mdl.step(TINY, contexts, schedule="ping_pong", pes=4, hbm_channels=4)
    device = load_device(pes=4, hbm_channels=4)
    jobs = []
    for hi, (h, part, first) in enumerate((("A", contexts[:2], 0), ("B", contexts[2:], 2))):
        prev = ()
        for layer in range(TINY.layers):   # every layer's attention its own device run
            tasks = assign_tasks(part, kv_heads=2, pes=4, tile=128, first_sequence=first)
            cycles = attention_run(tasks, device, "opt2", 128, group=2, head_dim=64).cycles
            g = {n: gemm(H200, len(part), *shape).seconds for n, shape in
                 (("qkv", (256, 512)), ("o", (256, 256)), ("up", (256, 1024)), ("down", (512, 256)))}
            q, a, o = f"q{h}{layer}", f"a{h}{layer}", f"o{h}{layer}"
            jobs += [mdl.Job(q, "host", g["qkv"], prev, (layer, hi, 0)),
                     mdl.Job(a, "device", cycles / 1.25e9, ((q, 2e-6),), (layer, hi, 1)),
                     mdl.Job(o, "host", g["o"] + g["up"] + g["down"], ((a, 2e-6),), (layer, hi, 2))]
            prev = ((o, 0.0),)
        jobs.append(mdl.Job(f"lm{h}", "host", gemm(H200, len(part), 256, 1000).seconds, prev, (2, hi, 3)))
    assert s.seconds == pytest.approx(mdl.list_schedule(jobs)["end"].max(), rel=1e-12)
    assert [t.sequence for t in s.tasks] == [0, 0, 1, 1, 2, 2] and [t.pe for t in s.tasks] == [0, 1, 2, 3, 0, 1]


def test_ping_pong_beats_serial_for_llama_3_8b_batch_16_at_8k():
    serial = mdl.step("llama-3-8b", [8192] * 16)
    pp = mdl.step("llama-3-8b", [8192] * 16, schedule="ping_pong")
    assert pp.seconds <= serial.seconds
    # attention outweighs the doubled weight traffic here: the device is busy most of the step
    assert pp.shares["ahbm"] > 0.5 * pp.seconds
    assert [r.half for r in pp.attention_runs] == ["A", "B"] and len(pp.tasks) == 16 * 8


def test_a_ping_pong_step_runs_the_whole_batch_only_when_serial_seconds_or_notes_is_read(monkeypatch):
    import copy
    import pickle

    import kbwork.model.steps as steps_module

    runs = []

    def counting(tasks, *args, **kwargs):
        runs.append(len(tasks))
        return attention_run(tasks, *args, **kwargs)

    monkeypatch.setattr(steps_module, "attention_run", counting)
    contexts = [8192] * 4   # 32 tasks on 96 PEs: ping-pong is slower, so a note says why
    pp = mdl.step("llama-3-8b", contexts, schedule="ping_pong")
    assert runs == [16, 16]   # the two halves
    steps_module.compare_row(pp)   # a sweep's row and compare's: seconds, bound, energy
    pp.breakdown, pp.timeline, pp.shares_frame, pp.memory
    untouched = copy.copy(pp)
    assert runs == [16, 16]
    serial_s = pp.serial_seconds
    assert runs == [16, 16, 32]   # the whole batch, once
    assert pp.notes == pp.notes and pp.serial_seconds == serial_s and runs == [16, 16, 32]
    assert untouched.notes == pp.notes and runs == [16, 16, 32, 32]   # a copy made before the read runs its own
    # equal to an eager computation: the serial step of the same batch, and the note made from it
    serial = mdl.step("llama-3-8b", contexts)
    assert serial_s == serial.seconds and serial.serial_seconds is None and serial.notes == ()
    assert pp.notes == (steps_module._ping_pong_slower(pp.model, pp.device, pp._halves, serial._halves[0],
                                                        pp.seconds, serial.seconds),)
    assert pp.to_dict()["serial_seconds"] == serial_s and pp.to_dict()["notes"] == list(pp.notes)
    # a step of the host placement has nothing to run later and pickles as before
    host = mdl.step("llama-3-8b", contexts, placement="host", schedule="ping_pong")
    assert pickle.loads(pickle.dumps(host)).notes == host.notes and host.serial_seconds is None


def test_with_one_sequence_ping_pong_is_serial():
    for contexts in ([8192], [300]):
        serial = mdl.step("llama-3-8b", contexts)
        pp = mdl.step("llama-3-8b", contexts, schedule="ping_pong")
        assert pp.seconds == pytest.approx(serial.seconds, rel=1e-12)
        assert pp.timeline[["task", "start", "end"]].equals(serial.timeline[["task", "start", "end"]])
        assert any("ping-pong is the serial schedule" in n for n in pp.notes)


def test_breakdown_adds_up_to_the_step():
    for kw in (dict(), dict(schedule="ping_pong"), dict(placement="host")):
        s = mdl.step("llama-3-8b", [4096] * 4, **kw)
        b = s.breakdown
        assert list(b.columns) == ["phase", "resource", "bound", "per_layer_us", "per_step_us"]
        assert b.per_step_us.sum() == pytest.approx(s.seconds * 1e6, rel=1e-9)
        assert s.tokens_per_s == pytest.approx(4 / s.seconds)
        assert b.set_index("phase").loc["QKV", "per_step_us"] == pytest.approx(
            32 * b.set_index("phase").loc["QKV", "per_layer_us"])
    assert list(s.breakdown.phase) == ["QKV", "attention", "O", "FFN up", "FFN down", "LM head"]   # host: no handoff
    pp = mdl.step("llama-3-8b", [4096] * 4, schedule="ping_pong").breakdown
    assert pp.phase.iloc[-1] == "overlap" and pp.per_step_us.iloc[-1] <= 0


def test_what_bounds_a_step():
    # 160 GiB of KV over the device's 139 GiB: timed anyway, for what bounds a long attention on a full device
    s = mdl.step("llama-3-70b", [32768] * 16, check_capacity=False)
    assert s.bound_kind == "ahbm" and s.bound.startswith("ahbm: busiest PE ")
    assert ("latency-bound" in s.bound) or ("throughput-bound" in s.bound)   # kbwork explain's words
    assert max(s.shares, key=s.shares.get) == "ahbm"
    host = mdl.step("llama-3-8b", [1024] * 4, placement="host")
    assert host.bound == host.bound_kind == "host bandwidth"
    big = mdl.step("llama-3-8b", [128] * 1024, placement="host")   # 1024 rows: past the roofline's ridge
    assert big.bound == "host flops"
    assert set(s.shares_frame.what) == {"ahbm", "host bandwidth", "host flops", "handoff"}


def test_the_host_placement_in_a_step_reproduces_the_measured_table():
    from kbwork.model.host import measured_attention

    for row in measured_attention().itertuples():
        # the measured rows time one layer's attention alone: beside 70B's 131 GiB of weights most of their
        # KV caches would not fit an H200, which this comparison of attention times does not need
        s = mdl.step("llama-3-70b", [row.context] * row.batch, placement="host", check_capacity=False)
        t_attn = s.breakdown.set_index("phase").loc["attention", "per_layer_us"] * 1e-6
        assert row.kv_bytes / (t_attn - 0.53e-6) / 1e9 == pytest.approx(row.gb_per_s, rel=1e-9)
        assert s.padding.total == 0 and s.attention_cycles is None


def test_padding_is_reported_and_simulated():
    s = mdl.step(TINY, [1000, 129], pes=4, hbm_channels=4)
    assert s.padding.per_sequence == (24, 127) and s.padding.total == 151
    assert [t.padded_context for t in s.tasks] == [1024, 1024, 256, 256]


def test_compare_runs_every_variant_and_the_host_once():
    df = mdl.compare(TINY, [512] * 2, pes=4, hbm_channels=4)
    assert list(df.columns) == ["variant", "placement", "schedule", "seconds", "tokens_per_s",
                                "attention_us_per_layer", "bound_kind", "bound", "fits",
                                "joules", "tokens_per_j", "watts"]  # DESIGN §18's energy columns
    assert list(zip(df.variant, df.placement)) == [("opt2", "ahbm"), ("opt3", "ahbm"), ("a1", "ahbm"),
                                                   ("-", "host")]
    assert (df.tokens_per_s == 2 / df.seconds).all()
    one = mdl.step(TINY, [512] * 2, variant="opt3", pes=4, hbm_channels=4)
    assert df.seconds[1] == one.seconds
    pp = mdl.compare(TINY, [512] * 2, variants=["opt2"], schedule="ping_pong", pes=4, hbm_channels=4)
    assert list(pp.schedule) == ["ping_pong", "serial"]   # the host placement is serial


def test_a_step_is_a_plain_json_record():
    import json

    d = mdl.step(TINY, [512, 700], pes=4, hbm_channels=4, schedule="ping_pong").to_dict()
    json.dumps(d, allow_nan=False)
    assert {"seconds", "tokens_per_s", "breakdown", "bound"} <= set(d)
    assert d["breakdown"][-1]["phase"] == "overlap" and d["breakdown"][-1]["per_layer_us"] is None
    assert "tokens/s" in repr(mdl.step(TINY, [512], pes=1, hbm_channels=1))


@pytest.mark.parametrize("contexts, match", [
    ([], "contexts is empty"),
    (8192, r"contexts must be a list of KV lengths, one per sequence .*\[8192\] \* 16"),
    ("8192", "contexts must be a list"),
    ([8192, 1.5], r"contexts\[1\] is 1.5 \(float\)"),
    ([8192, "8"], r"contexts\[1\] is '8' \(str\)"),
    ([True], r"contexts\[0\] is True \(bool\)"),
    ([0], r"contexts\[0\] is 0; every context is a positive int"),
    ([512, -3], r"contexts\[1\] is -3"),
    (np.ones((2, 2), int), "one-dimensional"),
    ([1 << 26], r"contexts\[0\] = 67108864 is 524288 tiles"),
])
def test_bad_contexts_are_validation_errors_naming_the_entry(contexts, match):
    with pytest.raises(ValidationError, match=match):
        mdl.step("llama-3-8b", contexts)


@pytest.mark.parametrize("kw, error, match", [
    (dict(variant="opt9"), ValidationError, r"decode variant 'opt9' is unknown; use one of 'opt2', 'opt3', 'a1'"),
    (dict(placement="gpu"), ValidationError, r"placement 'gpu' is unknown; use one of 'ahbm', 'host'"),
    (dict(schedule="pingpong"), ValidationError, r"schedule 'pingpong' is unknown; use one of 'serial', 'ping_pong'"),
    (dict(tile=0), ValidationError, "tile must be a positive int"),
    (dict(tile=True), ValidationError, "tile must be a positive int"),
    (dict(host={"handoff": 1}), ConfigError, r"unknown host key 'handoff'.*Did you mean 'handoff_us'"),
    (dict(host="h100"), ConfigError, "host 'h100' not found"),
    (dict(fixed_cycle=1), ConfigError, r"unknown topology key 'fixed_cycle'.*Did you mean 'fixed_cycles'"),
    (dict(pes=0), ConfigError, "topology key 'pes' is 0; it must be positive"),
    (dict(pes=96, hbm_channels=64), ConfigError, r"'pes' \(96\) and 'hbm_channels' \(64\): pes must be a multiple"),
    (dict(channel_bytes_per_cycle=0), ConfigError, "'channel_bytes_per_cycle' is 0; it must be positive"),
    (dict(channel_bytes_per_cycle="fast"), ConfigError, "'channel_bytes_per_cycle' must be a positive number or inf"),
    (dict(device=3), ConfigError, "topology must be a name"),
])
def test_bad_settings_are_typed_errors_naming_the_thing(kw, error, match):
    with pytest.raises(error, match=match):
        mdl.step("llama-3-8b", [512] * 2, **kw)


def test_bad_models_and_compare_arguments_are_typed_errors():
    with pytest.raises(ConfigError, match="model 'llama-2' not found"):
        mdl.step("llama-2", [512])
    with pytest.raises(ConfigError, match="model must be a name"):
        mdl.step(None, [512])
    with pytest.raises(ValidationError, match="variants must be a non-empty list"):
        mdl.compare("llama-3-8b", [512], variants="opt2")
    with pytest.raises(ValidationError, match="placements must be a non-empty list"):
        mdl.compare("llama-3-8b", [512], placements=())
    with pytest.raises(ValidationError, match="named twice"):
        mdl.compare("llama-3-8b", [512], variants=("opt2", "opt2"))
    with pytest.raises(ValidationError, match="decode variant 'x'"):
        mdl.compare("llama-3-8b", [512], variants=("opt2", "x"))
    # a host placement asked for ping-pong runs serial and says so
    s = mdl.step("llama-3-8b", [512], placement="host", schedule="ping_pong")
    assert s.schedule == "serial" and "host placement is serial" in s.notes[0]
    assert isinstance(s.timeline, pd.DataFrame)


def test_a_step_s_attention_is_its_device_run_and_equals_the_plain_simulation():
    """PEs sharing channels (2 per channel) and uneven task lists: the attention is the device run, with every
    reduction, equal to the plain simulation of the same launches."""
    from kbwork.model.device import attention_run

    contexts = [1000, 300, 2000, 700, 128]
    s = mdl.step(TINY, contexts, variant="opt3", pes=4, hbm_channels=2, channel_bytes_per_cycle=64)
    run = s.attention
    device = load_device(pes=4, hbm_channels=2, channel_bytes_per_cycle=64)
    plain = attention_run(s.tasks, device, "opt3", 128, group=TINY.group, head_dim=TINY.head_dim,
                          steady_state=False, reductions=False)
    assert run.to_csv() == plain.to_csv() and s.attention_cycles == plain.cycles == run.cycles
    assert sorted(set(run.op_log.pe)) == [0, 1, 2, 3]
    assert run.reductions.contended_channels == (0, 1)
    assert s.attention_runs[0].cycles >= s.attention_runs[0].channel_bound_cycles
    assert "ahbm" in s.bound or s.bound_kind != "ahbm"


# --- keywords a step or a comparison does not take; limits on the batch ---------------------------
@pytest.mark.parametrize("call, match", [
    (lambda: mdl.step("llama-3-8b", [256], mode="data"),
     r"model.step: a model step is timing-only \(DESIGN.md §15\): it takes no mode=; drop mode='data'"),
    (lambda: mdl.step("llama-3-8b", [256], mode="timing"),
     r"timing-only \(DESIGN.md §15\): it takes no mode=; drop mode='timing'"),
    (lambda: mdl.step("llama-3-8b", [256], variants=["opt2"]),
     "model.step: one step runs one decode variant: pass variant=.*model.compare takes variants="),
    (lambda: mdl.step("llama-3-8b", [256], placements=("host",)), "one step has one placement: pass placement="),
    (lambda: mdl.compare("llama-3-8b", [256], variant="opt2"),
     r"model.compare: it takes variants=, a list or tuple \(e.g. variants=\('opt2',\)\), not variant="),
    (lambda: mdl.compare("llama-3-8b", [256], variant="opt3"), r"variants=\('opt3',\)"),
    (lambda: mdl.compare("llama-3-8b", [256], placement="host"), r"it takes placements=.*placements=\('host',\)"),
    (lambda: mdl.compare("llama-3-8b", [256], mode="data"), "model.compare: a model step is timing-only"),
    (lambda: mdl.per_head_contention("llama-3-8b", 256, pes=4), "it sets pes and hbm_channels itself"),
    (lambda: mdl.per_head_contention("llama-3-8b", 256, mode="data"), "timing mode only"),
    (lambda: mdl.per_head_contention("llama-3-8b", 256, variant="opt2"), "it takes variants="),
])
def test_a_keyword_of_another_function_says_what_to_pass(call, match):
    with pytest.raises(ValidationError, match=match):
        call()


@pytest.mark.parametrize("call", [
    lambda: mdl.step("llama-3-8b", [256], fixed_cycle=1),
    lambda: mdl.compare("llama-3-8b", [256], fixed_cycle=1),
])
def test_a_misspelt_topology_key_is_still_an_unknown_topology_key(call):
    with pytest.raises(ConfigError, match=r"unknown topology key 'fixed_cycle'.*Did you mean 'fixed_cycles'"):
        call()


@pytest.mark.parametrize("call, match", [
    (lambda: mdl.step("llama-3-8b", [128] * (mdl.checks.MAX_BATCH + 1), placement="host"),
     r"model.step: the batch \(len\(contexts\)\) is 1048577 sequences; a step takes at most 1048576"),
    (lambda: mdl.step("llama-3-8b", [128] * 8193),
     r"model.step: batch 8193 x 8 KV heads is 65544 decode tasks per layer on the device; a step simulates at "
     r"most 65536 .*a batch of at most 8192 for this model.*placement='host'"),
    (lambda: mdl.step("llama-3-8b", [128] * 8193, schedule="ping_pong"), "65544 decode tasks"),
    (lambda: mdl.compare("llama-3-8b", [128] * 8193), "model.compare: batch 8193 x 8 KV heads"),
])
def test_a_batch_beyond_what_a_step_can_simulate_is_refused_at_once(call, match):
    with pytest.raises(ValidationError, match=match):
        call()


def test_the_device_task_limit_counts_sequences_times_kv_heads(monkeypatch):
    monkeypatch.setattr(mdl.checks, "MAX_DEVICE_TASKS", 4)
    assert mdl.step(TINY, [128, 128], pes=2, hbm_channels=1).batch == 2          # 2 x 2 KV heads = 4
    with pytest.raises(ValidationError, match="6 decode tasks"):
        mdl.step(TINY, [128] * 3, pes=2, hbm_channels=1)
    assert mdl.step(TINY, [128] * 3, placement="host").batch == 3               # nothing simulated


@pytest.mark.parametrize("call, error, match", [
    (lambda: mdl.Device("ahbm-device-v1"), ConfigError,
     r"Device: topology must be a kbwork Topology .*got 'ahbm-device-v1' \(a str\). To load one by name, use "
     r"model.load_device\('ahbm-device-v1'\)"),
    (lambda: mdl.Device(None), ConfigError, r"topology must be a kbwork Topology .*got None \(a NoneType\)\.$"),
    (lambda: load_device().home_channel(96), ValidationError, "pe must be an int from 0 to 95"),
    (lambda: load_device().home_channel("0"), ValidationError, "pe must be an int from 0 to 95.*got '0'"),
])
def test_a_device_refuses_what_is_not_one(call, error, match):
    with pytest.raises(error, match=match):
        call()
