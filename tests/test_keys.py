"""One key table (DESIGN.md §19): every topology, host and model key's facts in one row, and everything that
reads them — the classes' fields, validation, the plan cache, both sweeps' axes, ``--set`` and the docs'
tables — agreeing with it. Also the inputs of issue 38.6: plausible ranges, ``name`` not a setting, a file
elsewhere that reports its path or is refused, "no such file"."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import shlex
from pathlib import Path

import pytest

import kbwork
from kbwork import config, decode, keydocs, keys
from kbwork import model as mdl
from kbwork.cli import main
from kbwork.config import apply_settings, load_topology
from kbwork.errors import ConfigError
from kbwork.model import load_host, load_model
from kbwork.model.files import HOSTS_DIR, MODELS_DIR

DOCS = Path(__file__).resolve().parent.parent / "docs"


# --- the tables and what reads them -------------------------------------------------------------------------
def test_the_classes_fields_are_the_tables_rows():
    assert [f.name for f in dataclasses.fields(kbwork.Topology)] == ["name", *keys.TOPOLOGY.names, "source"]
    assert [f.name for f in dataclasses.fields(mdl.Host)] == ["name", *keys.HOST.names, "source", "path"]
    assert [f.name for f in dataclasses.fields(mdl.Model)] == ["name", *keys.MODEL.names, "source", "path"]
    t = kbwork.Topology()
    assert all(getattr(t, r.name) == r.default for r in keys.TOPOLOGY.rows)
    with pytest.raises(dataclasses.FrozenInstanceError):
        t.pes = 2


def test_key_names_are_unique_across_the_topology_and_host_tables():
    assert not set(keys.TOPOLOGY.names) & set(keys.HOST.names)
    assert not set(config.sweepable_keys()) & set(keys.sweepable_host_keys())
    assert len(set(mdl.SWEEP_AXES)) == len(mdl.SWEEP_AXES)
    with pytest.raises(ValueError, match="appears twice"):
        keys.TOPOLOGY.with_row(keys.TOPOLOGY.rows[0])


def test_the_plan_cache_and_the_sweeps_read_the_table():
    assert config.planned_keys() == tuple(r.name for r in keys.TOPOLOGY.rows if r.planned)
    assert {"tile_k", "tcm_bytes", "dma_base_cycles", "channel_bytes_per_cycle"} <= set(config.planned_keys())
    assert not {"fixed_cycles", "pes", "hbm_gib", "hazard_policy"} & set(config.planned_keys())
    assert set(config.sweepable_keys()) <= set(decode.sweep_axes()) and decode.SWEEP_AXES == decode.sweep_axes()
    assert set(config.sweepable_keys()) | set(keys.sweepable_host_keys()) <= set(mdl.sweeps.sweep_axes())
    assert "attention_bandwidth" not in mdl.SWEEP_AXES and "name" not in mdl.SWEEP_AXES
    assert config.key_range("r_cycles_per_byte") == (0.0, 1e6) and config.key_range("fixed_cycles") == (0, 2**32)


@pytest.mark.parametrize("doc", ["machine.md", "model.md"])
def test_the_docs_key_tables_are_the_tables(doc):
    """``python -m kbwork.keydocs`` rewrites them after a row changes."""
    text = (DOCS / doc).read_text(encoding="utf-8")
    assert keydocs.render_docs(text, doc) == text, f"docs/{doc} is stale: run python -m kbwork.keydocs"
    for (where, _), table in keydocs.docs_tables().items():
        if where == doc:
            assert table in text


def test_the_docs_tables_say_each_key_s_facts():
    topo = keydocs.docs_tables()[("machine.md", "topology")]
    assert "| `hbm_gib` | inf | GiB |" in topo and "0.001 to 1e+06, or inf; not in the plan cache; sweepable" in topo
    assert "| `fixed_cycles` | 40 | cycles per segment | FIXED" in topo and "0 to 2**32" in topo
    assert "| `tile_k` | 128 | elements | k-tile depth — 1 to 2**32; keys the plan cache; sweepable |" in topo
    host = keydocs.docs_tables()[("model.md", "host")]
    assert "| `eta_flops` | fraction |" in host and "0.001 to 1; sweepable" in host
    assert "| `attention_bandwidth` | — |" in host and "not swept" in host
    assert "| `layers` | — | transformer blocks (`num_hidden_layers`) — 1 to 10000; sweepable |" in \
        keydocs.docs_tables()[("model.md", "model")]


@pytest.fixture
def widened(monkeypatch):
    """A topology key only this test has: one row in the table, and the field it gives ``Topology``."""
    row = keys.Key("widget_cycles", int, 7, "cycles", "a knob only this test has", zero=True, high=1000)
    monkeypatch.setattr(keys, "TOPOLOGY", keys.TOPOLOGY.with_row(row))

    @keys.key_fields(lambda: keys.TOPOLOGY)
    class Widened(config.Topology):
        """``Topology`` as importing kbwork builds it when the row is in kbwork/keys.py."""

    monkeypatch.setattr(config, "Topology", Widened)
    return Widened


def test_a_new_topology_key_is_one_row(widened, tmp_path):
    # loadable: by default, from a file, as an override, by --set
    assert load_topology().widget_cycles == 7 and isinstance(load_topology(), kbwork.Topology)
    f = tmp_path / "w.toml"
    f.write_text("[misc]\nwidget_cycles = 3\n")
    assert load_topology(f).widget_cycles == 3
    assert load_topology("ahbm-device-v1", widget_cycles=9).widget_cycles == 9
    assert apply_settings(load_topology(), [("widget_cycles", "5")]) == {"widget_cycles": 5}
    # validated, by name and range
    with pytest.raises(ConfigError, match=r"'widget_cycles' is -1; it cannot be negative"):
        load_topology(widget_cycles=-1)
    with pytest.raises(ConfigError, match=r"'widget_cycles' is 1001; the largest value kbwork accepts is 1000"):
        load_topology(widget_cycles=1001)
    with pytest.raises(ConfigError, match=r"--set widget_cycles=2\.5: widget_cycles takes a whole number"):
        apply_settings(load_topology(), [("widget_cycles", "2.5")])
    # documented
    table = keydocs.docs_tables()[("machine.md", "topology")]
    assert "| `widget_cycles` | 7 | cycles | a knob only this test has — 0 to 1000; not in the plan cache; " \
           "sweepable |" in table
    assert "widget_cycles" in keydocs.render_docs((DOCS / "machine.md").read_text(encoding="utf-8"), "machine.md")
    # sweepable, by both sweeps
    assert "widget_cycles" in config.sweepable_keys()
    df = decode.sweep(kv_len=[256], widget_cycles=[0, 5], variants=("opt2",), workers=1, progress=False)
    assert list(df["widget_cycles"]) == [0, 5] and (df["cycles"] > 0).all()
    steps = mdl.sweep(context=[512], widget_cycles=[1, 2], placements=("host",), workers=1, progress=False)
    assert list(steps["widget_cycles"]) == [1, 2]
    with pytest.raises(ConfigError, match=r"axis 'widget_cycles'.*'widget_cycles' is -3"):
        decode.sweep(kv_len=[256], widget_cycles=[-3], workers=1, progress=False)


# --- --set: all applied, then validated once ----------------------------------------------------------------
def test_set_applies_every_setting_then_validates_once():
    device = load_topology("ahbm-device-v1")  # 96 PEs on 96 channels
    for order in ([("pes", "8"), ("hbm_channels", "2")], [("hbm_channels", "2"), ("pes", "8")]):
        assert apply_settings(device, order) == {"pes": 8, "hbm_channels": 2}
    with pytest.raises(ConfigError, match=r"^--set pes=8, --set hbm_channels=3: topology keys 'pes' \(8\) and "
                                          r"'hbm_channels' \(3\): pes must be a multiple of hbm_channels"):
        apply_settings(device, [("pes", "8"), ("hbm_channels", "3")])
    # only the keys the user set are named; the device's own value is in the message
    with pytest.raises(ConfigError, match=r"^--set pes=7: topology keys 'pes' \(7\) and 'hbm_channels' \(96\)"):
        apply_settings(device, [("pes", "7")])
    with pytest.raises(ConfigError, match=r"^--set name=foo: name is not a setting; it names the topology"):
        apply_settings(device, [("name", "foo")])
    assert load_topology(device, name="other").name == "other"  # Python may still name a copy


def _documented_set_examples() -> list[list[str]]:
    """Every ``kbwork step ... --set`` command of docs/model.md, as argv."""
    out = []
    for line in (DOCS / "model.md").read_text(encoding="utf-8").splitlines():
        if line.startswith("kbwork step ") and "--set" in line:
            out.append(shlex.split(line.split("#", 1)[0])[1:])
    return out


def test_the_docs_set_examples_run_in_either_order(capsys):
    examples = _documented_set_examples()
    assert examples, "docs/model.md has no kbwork step --set example"
    for argv in examples:
        sets = [argv[i + 1] for i, a in enumerate(argv) if a == "--set"]
        rest = [a for i, a in enumerate(argv) if a != "--set" and (i == 0 or argv[i - 1] != "--set")]
        outs = []
        for order in (sets, sets[::-1]):
            assert main([*rest, *[x for s in order for x in ("--set", s)], "--json"]) == 0, argv
            outs.append(json.loads(capsys.readouterr().out))
        assert outs[0] == outs[1]
        device = outs[0]["cases"][0]["device"]
        assert all(device[k] == float(v) for k, v in (s.split("=") for s in sets))


def test_the_readme_set_example_runs_in_either_order(capsys):
    readme = (DOCS.parent / "README.md").read_text(encoding="utf-8")
    (example,) = re.findall(r"`(--set \S+ --set \S+)`", readme)
    sets = shlex.split(example)[1::2]
    outs = []
    for order in (sets, sets[::-1]):
        argv = ["compare", "--kv-len", "512", "--mode", "timing", *[x for s in order for x in ("--set", s)], "--json"]
        assert main(argv) == 0
        outs.append(json.loads(capsys.readouterr().out))
    assert outs[0] == outs[1]


def test_an_invalid_pair_on_the_command_line_names_both(capsys):
    argv = ["step", "--context", "1024", "--set", "pes=8", "--set", "hbm_channels=3"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("kbwork: error: --set pes=8, --set hbm_channels=3: topology keys 'pes' (8) and "
                          "'hbm_channels' (3)") and "\n" not in err
    assert main(["step", "--set", "name=foo"]) == 2
    assert "kbwork: error: --set name=foo: name is not a setting" in capsys.readouterr().err
    assert main(["compare", "--set", "name=foo"]) == 2
    assert "kbwork: error: --set name=foo: name is not a setting" in capsys.readouterr().err


# --- capacity keys and the host's measured attention table ---------------------------------------------------
def test_the_capacity_keys_of_the_shipped_files():
    assert load_topology("ahbm-device-v1").hbm_gib == 139 and math.isinf(load_topology("ahbm-pe-v1").hbm_gib)
    assert math.isinf(kbwork.Topology().hbm_gib)
    h = load_host("h200")
    assert h.gpu_hbm_gib == 139 and h.attention_bandwidth == "h200_decode_attention_bandwidth.csv"
    with pytest.raises(ConfigError, match=r"'hbm_gib' is 0; it must be positive"):
        load_topology(hbm_gib=0)
    with pytest.raises(ConfigError, match=r"'gpu_hbm_gib' must be a finite number"):
        load_host({"gpu_hbm_gib": math.inf})


def test_a_host_without_its_own_attention_table_is_refused(tmp_path):
    text = (HOSTS_DIR / "h200.toml").read_text()
    lines = text.splitlines()
    i = next(k for k, x in enumerate(lines) if x.startswith("attention_bandwidth"))
    without = "\n".join(lines[:i] + lines[i + 2:]).replace('name = "h200"', 'name = "h100"')
    p = tmp_path / "h100.toml"
    p.write_text(without)
    with pytest.raises(ConfigError, match=r"host key 'attention_bandwidth' missing.*own measured decode-attention "
                                          r"table.*never lends one host's table to another"):
        load_host(p)
    with pytest.raises(ConfigError, match=r"host 'h100' \(a mapping over h200's keys\) gives no attention_bandwidth"):
        load_host({"name": "h100", "hbm_tb_s": 3.35})
    with pytest.raises(ConfigError, match=r"'attention_bandwidth' is 'h100\.csv': no such table"):
        load_host({"name": "h100", "attention_bandwidth": "h100.csv"})
    assert load_host({"hbm_tb_s": 8.0}).attention_bandwidth == "h200_decode_attention_bandwidth.csv"  # a variant


def test_host_attention_reads_the_host_s_own_table(tmp_path):
    from kbwork.model.host import host_attention, measured_attention

    h200 = measured_attention()
    faster = h200.drop(columns="eta").copy()
    faster["seconds"] = faster["seconds"] / 1.05
    faster["gb_per_s"] = faster["kv_bytes"] / faster["seconds"] / 1e9
    faster = faster.drop(columns="fraction_of_4800_gb_per_s")
    faster["fraction_of_5000_gb_per_s"] = faster["gb_per_s"] / 5000
    table = tmp_path / "x_decode_attention.csv"
    faster.to_csv(table, index=False)
    x = load_host({"name": "x", "hbm_tb_s": 5.0, "attention_bandwidth": str(table)})
    a, b = host_attention("llama-3-8b", x, [32768] * 4), host_attention("llama-3-8b", "h200", [32768] * 4)
    assert a.eta == pytest.approx(b.eta * 1.05 * 4800 / 5000, rel=1e-4)


# --- inputs: plausible ranges, names and paths ----------------------------------------------------------------
GOOD = 'name = "t"\nlayers = 2\nhidden = 64\nheads = 4\nkv_heads = 2\nhead_dim = 16\nffn = 128\nvocab = 100\n'


@pytest.mark.parametrize("change, match", [
    (("layers = 2", "layers = 100000000000"), r"'layers' is 100000000000; the largest value kbwork accepts is 10000"),
    (("hidden = 64", "hidden = 2000000"), r"'hidden' is 2000000; the largest value kbwork accepts is 1000000"),
    (("vocab = 100", "vocab = 10000000"), r"'vocab' is 10000000; the largest"),
])
def test_a_model_key_beyond_its_plausible_range_is_refused_by_name(tmp_path, change, match):
    p = tmp_path / "m.toml"
    p.write_text(GOOD.replace(*change))
    with pytest.raises(ConfigError, match=match):
        load_model(p)


@pytest.mark.parametrize("over, match", [
    ({"hbm_tb_s": 1e300}, r"'hbm_tb_s' is 1\.000e\+300; it must lie between 0\.001 and 1000 \(TB/s\)"),
    ({"eta_flops": 1e-30}, r"'eta_flops' is 1e-30; it must lie between 0\.001 and 1 \(fraction\)"),
    ({"peak_tflops_bf16": 1e9}, r"'peak_tflops_bf16' is 1000000000\.0; it must lie between 0\.001 and 100000"),
    ({"launch_us": 1e6}, r"'launch_us' is 1000000\.0; it must lie between 0 and 10000 \(µs\)"),
    ({"handoff_us": 1e5}, r"'handoff_us' is 100000\.0; it must lie between"),
    ({"eta_bw": 0}, r"'eta_bw' is 0\.0; it must be positive"),
])
def test_a_host_key_beyond_its_plausible_range_is_refused_by_name(over, match):
    with pytest.raises(ConfigError, match=match):
        load_host(over)


def test_a_file_elsewhere_reports_its_path_or_is_refused_when_it_takes_a_shipped_name(tmp_path, capsys):
    p = tmp_path / "mine.toml"
    p.write_text((MODELS_DIR / "llama-3-8b.toml").read_text())
    same = load_model(p)
    assert same == load_model("llama-3-8b") and same.label == f"llama-3-8b (from {p})" and str(p) in repr(same)
    assert load_model("llama-3-8b").label == "llama-3-8b" and load_model("llama-3-8b").path is None
    p.write_text((MODELS_DIR / "llama-3-8b.toml").read_text().replace("layers = 32", "layers = 2"))
    with pytest.raises(ConfigError, match=r"names itself 'llama-3-8b', the shipped model .*but its layers differ "
                                          r"from it \(layers 2, not 32\); give it a name of its own"):
        load_model(p)
    h = tmp_path / "gpu.toml"
    h.write_text((HOSTS_DIR / "h200.toml").read_text().replace("handoff_us = 2.0", "handoff_us = 9.0"))
    with pytest.raises(ConfigError, match=r"names itself 'h200', the shipped host .*handoff_us 9\.0, not 2\.0"):
        load_host(h)
    h.write_text((HOSTS_DIR / "h200.toml").read_text().replace('name = "h200"', 'name = "gpu"'))
    assert load_host(h).label == f"gpu (from {h})"
    m = tmp_path / "tiny.toml"
    m.write_text(GOOD)
    assert main(["step", "--model", str(m), "--host", str(h), "--placement", "host", "--context", "128"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"t (from {m}) decode step") and f"gpu (from {h})" in out


def test_a_path_that_does_not_exist_says_no_such_file(tmp_path, capsys):
    missing = tmp_path / "nope.toml"
    for load, what in ((load_model, "model"), (load_host, "host"), (load_topology, "topology")):
        with pytest.raises(ConfigError, match=rf"^no such file: {re.escape(str(missing))} \(the {what} "):
            load(str(missing))
    assert main(["step", "--model", "nope.toml"]) == 2
    assert capsys.readouterr().err.startswith("kbwork: error: no such file: nope.toml (the model 'nope.toml')")
    with pytest.raises(ConfigError, match=r"model 'llama-9' not found"):  # a name is still looked up by name
        load_model("llama-9")
