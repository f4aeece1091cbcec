"""The split mapping in a step (DESIGN.md §16): the assignment, a case computed by hand, a layer's plan in data
mode against float64, both merges' timing, the channel bound, and split = sequence where every unit is whole."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from kbwork import ValidationError
from kbwork import model as mdl
from kbwork.kernels.split import gqa_decode_partial, gqa_merge
from kbwork.model.device import attention_plan, load_device, partial_bytes
from kbwork.model.tasks import assign_tasks, padded
from kbwork.sim import Simulator


def _slow_split(contexts, kv_heads, pes, tile):
    """The assignment of §16 written out unit by unit: (s, h, pe, first key, last key + 1) per piece."""
    units = [(s, h, j) for s, c in enumerate(contexts) for h in range(kv_heads) for j in range(padded(c, tile) // tile)]
    W = len(units)
    owner = {}
    for p in range(pes):
        for u in range(p * W // pes, (p + 1) * W // pes):
            owner[u] = p
    pieces: dict[tuple, list] = {}
    for u, (s, h, j) in enumerate(units):
        lst = pieces.setdefault((s, h), [])
        if lst and lst[-1][0] == owner[u]:
            lst[-1][2] = (j + 1) * tile
        else:
            lst.append([owner[u], j * tile, (j + 1) * tile])
    return [(s, h, pe, a, b, len(lst) > 1) for (s, h), lst in pieces.items() for pe, a, b in lst]


@pytest.mark.parametrize("seed", range(6))
def test_the_split_assignment_is_the_designs(seed):
    rng = np.random.default_rng(seed)
    contexts = rng.integers(1, 3000, int(rng.integers(1, 6))).tolist()
    kv_heads, pes, tile = int(rng.integers(1, 5)), int(rng.integers(1, 40)), int(rng.choice([64, 128]))
    tasks = assign_tasks(contexts, kv_heads=kv_heads, pes=pes, tile=tile, mapping="split")
    got = [(t.sequence, t.kv_head, t.pe, *t.rows, t.split) for t in tasks]
    assert got == _slow_split(contexts, kv_heads, pes, tile)
    assert [t.index for t in tasks] == list(range(len(tasks)))
    for t in tasks:  # chunks numbered in split order, 0 for a whole task
        same = [u for u in tasks if (u.sequence, u.kv_head) == (t.sequence, t.kv_head)]
        assert t.chunk == same.index(t) and t.padded_context == padded(t.context, tile)


def test_twelve_sequences_of_eight_heads_on_96_pes_split_is_sequence_exactly():
    ctx = [4096] * 12
    assert (assign_tasks(ctx, kv_heads=8, pes=96, tile=128, mapping="split") ==
            assign_tasks(ctx, kv_heads=8, pes=96, tile=128))
    a = mdl.step("llama-3-8b", ctx, mapping="sequence")
    b = mdl.step("llama-3-8b", ctx, mapping="split")
    assert a.tasks == b.tasks and a.attention_cycles == b.attention_cycles and a.seconds == b.seconds
    assert b.breakdown.set_index("phase").loc["merge", "per_step_us"] == 0


# --- the case of §16 by hand ---------------------------------------------------------------------
def _alone(dev, G, d, kernel, *shapes):
    """Cycles of one launch alone on one PE of ``dev`` (its own channel)."""
    sim = Simulator(dev.pe, mode="timing")
    if kernel is gqa_merge:
        parts = [tuple(sim.hbm(f"{n}{c}", shape=s, dtype="fp32") for n, s in (("m", (G, 1)), ("l", (G, 1)),
                                                                             ("O", (G, d)))) for c in range(2)]
        return sim.run(gqa_merge, parts, sim.hbm("out", shape=(G, d), dtype="fp32")).cycles
    q, k, v = (sim.hbm(n, shape=s, dtype="bf16") for n, s in zip("qKV", shapes))
    st = [sim.hbm(n, shape=s, dtype="fp32") for n, s in (("m", (G, 1)), ("l", (G, 1)), ("O", (G, d)))]
    return sim.run(kernel, q, k, v, *st, variant="opt2", tile=128).cycles


@pytest.mark.parametrize("sync", [0, 100])
def test_the_hand_computed_case_two_pes_one_head_four_tiles(sync):
    G, d = 4, 128
    dev = load_device("ahbm-device-v1", pes=2, hbm_channels=2, sync_cycles=sync)
    tasks = assign_tasks([512], kv_heads=1, pes=2, tile=128, mapping="split")
    assert [(t.pe, t.chunk, t.rows, t.split) for t in tasks] == [(0, 0, (0, 256), True), (1, 1, (256, 512), True)]
    plan = attention_plan(tasks, dev, "opt2", 128, group=G, head_dim=d)
    assert [len(plan[p]) for p in plan] == [1, 2]          # PE 1: its chunk, then the merge
    assert plan.merges[(0, 0)] == (1, plan[1][1]) and plan[1][1].after == (plan[0][0],)
    run = plan.run()
    # each chunk alone: 2 tiles, each PE on its own channel, so neither waits for the other
    chunk = _alone(dev, G, d, gqa_decode_partial, (G, d), (256, d), (256, d))
    merge = _alone(dev, G, d, gqa_merge)
    log = run.op_log
    ends = log.groupby(["pe", "label"]).end.max()
    assert log[log.pe == 0].end.max() == chunk                                  # PE 0: its chunk
    assert ends[(1, "dma_store O")] == chunk + sync + merge                     # the merge's store ends last
    first_merge = log[(log.pe == 1) & (log.label == "dma_load m")]
    assert first_merge.start.min() == chunk + sync                              # after PE 0's chunk + sync
    assert run.cycles == chunk + sync + merge
    assert log[(log.pe == 1) & (log.label != "dma_load m") & (log.start < chunk + sync)].end.max() == chunk


# --- a layer's plan in data mode --------------------------------------------------------------
def _reference(q, K, V):
    q, K, V = (x.astype(np.float64) for x in (q, K, V))
    s = q @ K.T / math.sqrt(q.shape[1])
    p = np.exp(s - s.max(axis=1, keepdims=True))
    return (p / p.sum(axis=1, keepdims=True)) @ V


def _host_merge(parts):
    """The host's merge of partial states (m, l, O) in float64."""
    m = np.max([p[0] for p in parts], axis=0)
    l = sum(p[1] * np.exp(p[0] - m) for p in parts)
    O = sum(p[2] * np.exp(p[0] - m) for p in parts)
    return O / l


@pytest.mark.parametrize("merge", ["device", "host"])
@pytest.mark.parametrize("variant", ["opt2", "opt3", "a1"])
def test_a_layers_plan_in_data_mode_gives_every_heads_o_within_tolerance(merge, variant):
    G, d, tile, kv_heads = 4, 32, 16, 2
    contexts = [80, 200, 48]
    dev = load_device("ahbm-device-v1", pes=5, hbm_channels=5, sync_cycles=100)
    tasks = assign_tasks(contexts, kv_heads=kv_heads, pes=5, tile=tile, mapping="split")
    assert any(t.split for t in tasks) and any(not t.split for t in tasks)
    plan = attention_plan(tasks, dev, variant, tile, group=G, head_dim=d, merge=merge, mode="data", seed=3)
    assert bool(plan.merges) == (merge == "device")
    run = plan.run()
    for s in range(len(contexts)):
        for h in range(kv_heads):
            mine = [t for t in tasks if (t.sequence, t.kv_head) == (s, h)]
            names = [f"{s}.{h}.{t.chunk}" for t in mine] if mine[0].split else [f"{s}.{h}"]
            q = run.read(f"q{names[0]}")
            K = np.concatenate([run.read(f"K{n}") for n in names])
            V = np.concatenate([run.read(f"V{n}") for n in names])
            assert len(K) == padded(contexts[s], tile)
            if mine[0].split and merge == "host":
                got = _host_merge([tuple(run.read(f"{x}{n}").astype(np.float64) for x in "mlO") for n in names])
            else:
                got = run.read(f"out{s}.{h}")
            assert np.abs(got - _reference(q, K, V)).max() <= 1e-5, (s, h)


# --- a step under the split mapping --------------------------------------------------------------
@pytest.mark.parametrize("merge", ["device", "host"])
@pytest.mark.parametrize("contexts", [[32768], [3000, 700, 12000], [4096] * 5])
def test_split_attention_is_at_least_the_channel_bound(merge, contexts):
    s = mdl.step("llama-3-8b", contexts, mapping="split", merge=merge)
    for r in s.attention_runs:
        assert r.cycles >= r.channel_bound_cycles > 0
    assert s.mapping == "split" and s.merge == merge
    assert {t.pe for t in s.tasks} == set(range(96))  # every PE has work


def test_the_host_merge_is_timed_from_the_partial_bytes_and_sits_in_the_serial_layer():
    ctx = [32768, 5000]
    s = mdl.step("llama-3-8b", ctx, mapping="split", merge="host")
    m, h = s.model, s.host
    chunks: dict = {}
    for t in s.tasks:
        if t.split:
            chunks[(t.sequence, t.kv_head)] = chunks.get((t.sequence, t.kv_head), 0) + 1
    moved = sum(n * (2 * m.group + m.group * m.head_dim) * 4 + m.group * m.head_dim * 2 for n in chunks.values())
    assert s.merge_bytes == moved == partial_bytes(s.tasks, m.group, m.head_dim) > 0
    merge_s = moved / (h.hbm_bytes_per_s * h.eta_bw) + h.launch_s
    b = s.breakdown.set_index("phase")
    assert b.loc["merge", "per_layer_us"] == pytest.approx(merge_s * 1e6)
    assert b.loc["merge", "resource"] == "host"
    assert b["per_step_us"].sum() == pytest.approx(s.seconds * 1e6)
    d = mdl.step("llama-3-8b", ctx, mapping="split", merge="device")
    assert d.breakdown.set_index("phase").loc["merge", "per_step_us"] == 0 and d.merge_bytes == 0
    # the same device run but for the merge launches: the host merge's layer = device-merge's - merges + merge_s
    assert s.tasks == d.tasks
    layer_host = (s.seconds - s.breakdown.set_index("phase").loc["LM head", "per_step_us"] * 1e-6) / m.layers
    assert layer_host == pytest.approx(s._halves[0].attention_s + merge_s + sum(
        g.seconds for g in s._halves[0].gemms.values()) + 2 * h.handoff_s)


def test_a_host_merge_under_the_sequence_mapping_merges_nothing_and_says_so():
    seq = mdl.step("llama-3-8b", [4096, 2048], mapping="sequence", merge="host")
    dev = mdl.step("llama-3-8b", [4096, 2048], mapping="sequence", merge="device")
    assert seq.seconds == dev.seconds and seq.merge_bytes == 0
    assert any("merge='host' applies to mapping='split'" in n for n in seq.notes)
    assert not any("merge" in n for n in dev.notes)


def test_under_ping_pong_the_host_merge_is_a_host_task_between_attention_and_o_ffn():
    s = mdl.step("llama-3-8b", [8192] * 4, mapping="split", merge="host", schedule="ping_pong")
    tl = s.timeline
    merges = tl[tl.phase == "merge"]
    assert len(merges) == 2 * s.model.layers and set(merges.resource) == {"host"}
    for half in ("A", "B"):
        row = tl[(tl.half == half) & (tl.layer == 3)].set_index("phase")
        assert row.loc["attention", "end"] < row.loc["merge", "start"] <= row.loc["O+FFN", "start"]
        assert row.loc["merge", "end"] <= row.loc["O+FFN", "start"]


def test_capacity_and_energy_hold_under_the_split_mapping():
    a = mdl.step("llama-3-8b", [32768, 1000], mapping="sequence")
    for merge in ("device", "host"):
        b = mdl.step("llama-3-8b", [32768, 1000], mapping="split", merge=merge)
        assert b.memory.equals(a.memory) and b.fits
        e = b.energy.set_index(["part", "resource", "kind"])["joules"]
        assert b.joules == pytest.approx(float(e.sum())) and b.tokens_per_j > 0
        want = b.model.layers * b.merge_bytes * 8 * b.host.gpu_hbm_pj_per_bit * 1e-12
        assert e[("merge", "host", "hbm")] == pytest.approx(want)
    assert a.energy.set_index(["part", "resource", "kind"])["joules"][("merge", "host", "hbm")] == 0


def test_compare_sweep_and_json_carry_the_mapping():
    df = mdl.compare("llama-3-8b", [16384], variants=("opt2",), mappings=("sequence", "split"),
                     merges=("device", "host"))
    assert list(df.columns[:5]) == ["variant", "placement", "schedule", "mapping", "merge"]
    assert list(zip(df["mapping"], df["merge"]))[:3] == [("sequence", "device"), ("split", "device"), ("split", "host")]
    assert df.tokens_per_s[1] > df.tokens_per_s[0]
    sw = mdl.sweep(variants=("opt2",), context=[16384], mapping=["sequence", "split"], progress=False, workers=1)
    assert list(sw.mapping) == ["sequence", "split"] and sw.tokens_per_s[1] > sw.tokens_per_s[0]
    d = mdl.step("llama-3-8b", [16384], mapping="split", merge="host").to_dict()
    assert (d["mapping"], d["merge"]) == ("split", "host") and d["merge_bytes"] > 0
    json.dumps(d, allow_nan=False)
    with pytest.raises(ValidationError, match="mapping"):
        mdl.step("llama-3-8b", [1024], mapping="chunks")
    with pytest.raises(ValidationError, match="merge"):
        mdl.step("llama-3-8b", [1024], mapping="split", merge="gpu")


def test_kbwork_step_takes_mapping_and_merge(capsys):
    from kbwork.cli import main

    assert main(["step", "--context", "16384", "--variants", "opt2", "--placement", "ahbm", "--mapping", "split",
                 "--merge", "host", "--json", "-q"]) == 0
    case = json.loads(capsys.readouterr().out)["cases"][0]
    assert (case["mapping"], case["merge"]) == ("split", "host")


def test_the_step_panel_has_mapping_and_merge_controls():
    from kbwork.model_panel import StepPanel

    p = StepPanel(batch=1, context=16384, variants=("opt2",), schedules=("serial",), draw=False)
    before = p.state["tokens_per_s"]
    after = p.update(mapping="split", merge="host")["tokens_per_s"]
    label = next(k for k in before if k.startswith("opt2") or "ahbm" in k)
    assert after[label] > before[label] and "split mapping" in p.setting_text()
    with pytest.raises(ValidationError, match="mapping must be one of"):
        p.update(mapping="heads")


def test_the_simulated_split_targets_hold():
    """DESIGN §16's targets of the simulated machine (kbwork.bench.model.split_targets): 8B batch 1 32k tokens/s
    split / sequence >= 3, split attention >= 45 % (batch 1) and >= 50 % (batch 16) of the all-channel bound."""
    from kbwork.bench.model import format_suite, split_targets

    got = split_targets()
    assert [t["name"] for t in got["targets"]] == ["tokens_per_s_ratio_8b_b1", "channel_fraction_b1",
                                                   "channel_fraction_b16"]
    assert all(t["met"] and t["measured"] >= t["target"] for t in got["targets"])
    seq = [f for f in got["figures"] if f["mapping"] == "sequence"]
    assert all(f["all_channel_fraction"] < 0.45 for f in seq)  # what the split mapping improves on
    lines = format_suite({"rows": [], "interactive": [], "load_average_1min": [], "split": got})
    assert sum("split-KV:" in x for x in lines) == 3
