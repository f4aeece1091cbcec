"""model.sweep: one row per (point, case), the same frame serially, on local processes and on Dask, rows on disk
as points finish and a resumed sweep; bad axes refused before anything runs (DESIGN.md §12, §15)."""

from __future__ import annotations

import re

import pandas as pd
import pytest

from kbwork import ConfigError, ValidationError
from kbwork import model as mdl
from kbwork.model.device import load_device

AXES = dict(model="llama-3-8b", batch=[1, 4], context=[512, 1000], handoff_us=[0, 2.5])
CASES = dict(variants=("opt2", "a1"), placements=("ahbm", "host"), schedules=("serial", "ping_pong"))


@pytest.fixture(scope="module")
def serial():
    return mdl.sweep(workers=1, progress=False, **CASES, **AXES)


def test_a_sweep_row_is_the_step_at_that_point(serial):
    assert list(serial.columns[:4]) == ["model", "batch", "context", "handoff_us"]
    assert list(serial.columns[4:]) == ["variant", "placement", "schedule", "seconds", "tokens_per_s",
                                        "attention_us_per_layer", "bound_kind", "bound", "fits",
                                        "joules", "tokens_per_j", "watts"]  # DESIGN §18's energy columns
    per_point = [("opt2", "ahbm", "serial"), ("opt2", "ahbm", "ping_pong"), ("a1", "ahbm", "serial"),
                 ("a1", "ahbm", "ping_pong"), ("-", "host", "serial")]
    assert len(serial) == 8 * len(per_point)
    assert list(zip(serial.variant, serial.placement, serial.schedule))[:5] == per_point
    row = serial[(serial.batch == 4) & (serial.context == 1000) & (serial.handoff_us == 2.5)
                 & (serial.variant == "a1") & (serial.schedule == "ping_pong")].iloc[0]
    s = mdl.step("llama-3-8b", [1000] * 4, variant="a1", schedule="ping_pong", host={"handoff_us": 2.5})
    assert row.seconds == s.seconds and row.bound == s.bound and row.tokens_per_s == s.tokens_per_s


def test_local_processes_and_dask_give_the_serial_frame(serial):
    assert mdl.sweep(workers=2, progress=False, **CASES, **AXES).equals(serial)
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                                  dashboard_address=None) as cluster, distributed.Client(cluster) as client:
        assert mdl.sweep(client=client, progress=False, **CASES, **AXES).equals(serial)


def test_rows_go_to_disk_and_a_sweep_resumes(tmp_path, serial, monkeypatch):
    out = tmp_path / "steps.csv"
    assert mdl.sweep(out=out, workers=1, progress=False, **CASES, **AXES).equals(serial)
    lines = out.read_text().splitlines()
    assert lines[0].startswith("point,model,batch,context,handoff_us,variant") and len(lines) == 1 + len(serial)
    # cut the file in the middle of a point (and mid-line): the resumed sweep runs the rest again
    out.write_text("\n".join(lines[:13]) + "\n" + lines[13][:10])
    from kbwork.model import sweeps

    calls = []
    monkeypatch.setattr(sweeps, "step", lambda *a, **k: calls.append(a) or mdl.step(*a, **k))
    again = mdl.sweep(out=out, resume=True, workers=1, progress=False, **CASES, **AXES)
    assert len(calls) == 6 * 5   # points 0 and 1 were on file (5 rows each); 2 (cut short) to 7 ran again
    assert again.astype(str).equals(serial.astype(str))
    assert out.read_text().splitlines() == lines
    with pytest.raises(ValidationError, match="exists; pass resume=True"):
        mdl.sweep(out=out, workers=1, progress=False, **CASES, **AXES)
    with pytest.raises(ValidationError, match="the axes differ"):
        mdl.sweep(out=out, resume=True, workers=1, progress=False, **CASES,
                  **{**AXES, "handoff_us": [0, 3.0]})


def test_a_sweep_shows_a_bar_unless_told_not_to(capsys):
    mdl.sweep(context=[256, 512], batch=[1, 2, 4], variants=("opt2",), workers=1)
    err = capsys.readouterr().err
    assert "model sweep: 100%" in err and "6/6" in err
    mdl.sweep(context=[256, 512], batch=[1, 2, 4], variants=("opt2",), workers=1, progress=False)
    assert capsys.readouterr().err == ""


def test_every_axis_is_named_once():
    assert len(set(mdl.SWEEP_AXES)) == len(mdl.SWEEP_AXES)
    assert {"pes", "hbm_channels", "channel_bytes_per_cycle", "fixed_cycles", "handoff_us"} <= set(mdl.SWEEP_AXES)


def test_device_and_topology_axes():
    df = mdl.sweep(context=2048, batch=8, pes=64, hbm_channels=64, channel_bytes_per_cycle=[20, 40],
                   fixed_cycles=[0, 40], variants=("opt2",), workers=1, progress=False)
    assert list(df.columns[:7]) == ["model", "batch", "context", "pes", "hbm_channels", "channel_bytes_per_cycle",
                                    "fixed_cycles"]
    assert len(df) == 4
    row = df.iloc[1]   # channel 20, FIXED 40
    s = mdl.step("llama-3-8b", [2048] * 8, pes=64, hbm_channels=64, channel_bytes_per_cycle=20, fixed_cycles=40)
    assert row.seconds == s.seconds
    assert df.attention_us_per_layer[0] > df.attention_us_per_layer[2]   # a slower channel, a slower layer


@pytest.mark.parametrize("kw, error, match", [
    (dict(context=[512], batchs=[1]), ValidationError, r"unknown axis batchs"),
    (dict(batch=[1]), ValidationError, r"give a context axis"),
    (dict(context=[]), ValidationError, r"axis 'context' has no values"),
    (dict(context=[512, 0]), ValidationError, r"axis 'context' takes positive ints, got 0"),
    (dict(context=[512], batch=[1.5]), ValidationError, r"axis 'batch' takes positive ints, got 1.5"),
    (dict(context=[512], model=["llama-9"]), ConfigError, r"axis 'model': model 'llama-9' not found"),
    (dict(context=[512], handoff_us=[-1]), ConfigError, r"axis 'handoff_us':.*must be non-negative"),
    (dict(context=[512], fixed_cycles=[-1]), ConfigError, r"axis 'fixed_cycles'"),
    (dict(context=[512], pes=[100]), ConfigError, r"'pes' \(100\) and 'hbm_channels' \(96\): pes must be a multiple"),
    (dict(context=[512], pes=[0]), ConfigError, r"axis 'pes': topology key 'pes' is 0; it must be positive"),
    (dict(context=[512], hbm_channels=[5]), ConfigError, r"axis 'hbm_channels'|pes must be a multiple"),
    (dict(context=[512], schedules=("serial", "pp")), ValidationError, r"schedule 'pp' is unknown"),
    (dict(context=[512], variants=()), ValidationError, r"variants must be a non-empty list"),
    (dict(context=[512], resume="yes"), ValidationError, r"resume='yes'"),
])
def test_bad_sweeps_are_refused_before_anything_runs(kw, error, match):
    with pytest.raises(error, match=match):
        mdl.sweep(workers=1, progress=False, **kw)


def test_progress_is_true_or_false():
    with pytest.raises(ValidationError, match=r"progress='no'; pass True \(a progress bar on stderr\) or False"):
        mdl.sweep(workers=1, progress="no", context=[512])


def test_a_resume_is_refused_under_another_host_device_or_model(tmp_path):
    """The file's record (<out>.meta.json, written before the first row) decides: a resume under another host,
    device or model file says what differs instead of returning the old rows."""
    out = tmp_path / "s.csv"
    axes = dict(context=[1024], batch=[1, 2])
    first = mdl.sweep(out=out, placements=("host",), workers=1, progress=False, **axes)
    meta = (tmp_path / "s.csv.meta.json").read_text()
    assert '"what": "kbwork.model.sweep"' in meta and '"hbm_tb_s": 4.8' in meta
    again = mdl.sweep(out=out, resume=True, placements=("host",), workers=1, progress=False, **axes)
    assert again.equals(first)
    with pytest.raises(ValidationError, match=r"host hbm_tb_s is 4.8 there, 9.6 here"):
        mdl.sweep(out=out, resume=True, placements=("host",), host={"hbm_tb_s": 9.6}, workers=1, progress=False,
                  **axes)
    with pytest.raises(ValidationError, match=r"device channel_bytes_per_cycle is 40.0 there, 80.0? here"):
        mdl.sweep(out=out, resume=True, placements=("host",), device=load_device(channel_bytes_per_cycle=80),
                  workers=1, progress=False, **axes)
    model = tmp_path / "m.toml"
    # a name of its own: a file elsewhere that takes a shipped name with other values is refused
    model.write_text('name = "half-8b"\nlayers = 16\nhidden = 4096\nheads = 32\nkv_heads = 8\nhead_dim = 128\n'
                     'ffn = 14336\nvocab = 128256\n')
    out3 = tmp_path / "m.csv"
    mdl.sweep(out=out3, placements=("host",), model=str(model), workers=1, progress=False, **axes)
    model.write_text(model.read_text().replace("layers = 16", "layers = 8"))  # the same path, another model
    with pytest.raises(ValidationError, match=r"models .*'layers': 16.* there, .*'layers': 8.* here"):
        mdl.sweep(out=out3, resume=True, placements=("host",), model=str(model), workers=1, progress=False, **axes)
    # a handoff axis sets the host's handoff_us at every point: its base value decides no row
    out2 = tmp_path / "h.csv"
    mdl.sweep(out=out2, placements=("host",), handoff_us=[0, 1], workers=1, progress=False, **axes)
    mdl.sweep(out=out2, resume=True, placements=("host",), handoff_us=[0, 1], host={"handoff_us": 7},
              workers=1, progress=False, **axes)
    # the record's refusals are decode.sweep's (kbwork.sweep), naming this kind of sweep
    record = tmp_path / "h.csv.meta.json"
    for text, message in (("{not json", r"its record h\.csv\.meta\.json is not valid JSON"),
                          ('{"what": "kbwork.decode.sweep"}',
                           r"h\.csv\.meta\.json is not a kbwork model sweep record")):
        record.write_text(text)
        with pytest.raises(ValidationError, match=message):
            mdl.sweep(out=out2, resume=True, placements=("host",), handoff_us=[0, 1], workers=1, progress=False,
                      **axes)
    record.unlink()
    with pytest.raises(ValidationError, match=r"there is no h.csv.meta.json beside it"):
        mdl.sweep(out=out2, resume=True, placements=("host",), handoff_us=[0, 1], workers=1, progress=False, **axes)


@pytest.mark.parametrize("column, value, message", [
    ("seconds", "banana", "line 2: seconds is 'banana', not a number"),
    ("tokens_per_s", "-3", "line 2: tokens_per_s is '-3', not a finite number > 0"),
    ("bound", "", "line 2: bound is '', not what bounds the step"),
    ("point", "x", "line 2: point is 'x', not a point index"),
])
def test_a_damaged_row_is_refused_not_returned(tmp_path, column, value, message):
    # a row whose values are each possible but disagree (tokens_per_s not the batch over seconds) is computed
    # again with a warning instead: tests/test_sweep_engine.py
    out = tmp_path / "s.csv"
    axes = dict(context=[1024], batch=[1, 2])
    mdl.sweep(out=out, placements=("host",), workers=1, progress=False, **axes)
    lines = out.read_text().splitlines()
    header = lines[0].split(",")
    fields = lines[1].split(",")
    fields[header.index(column)] = value
    out.write_text("\n".join([lines[0], ",".join(fields), *lines[2:]]) + "\n")
    with pytest.raises(ValidationError, match=re.escape(message)):
        mdl.sweep(out=out, resume=True, placements=("host",), workers=1, progress=False, **axes)


@pytest.mark.parametrize("kw, match", [
    (dict(context=[512], variant="opt2"), r"sweep: it takes variants=, a list or tuple \(e.g. variants=\('opt2',\)\)"),
    (dict(context=[512], placement="host"), r"sweep: it takes placements=.*placements=\('host',\)"),
    (dict(context=[512], schedule="ping_pong"), r"sweep: it takes schedules=.*schedules=\('ping_pong',\)"),
    (dict(context=[512], mode="data"), r"sweep: a model step is timing-only .*no mode=; drop mode='data'"),
    (dict(contexts=[512]), r"sweep: it takes a context= axis"),
    (dict(context=[512], batch=[1, 1 << 21], placements=("host",)),
     r"sweep: axis 'batch' is 2097152 sequences; a step takes at most 1048576"),
    (dict(context=[512], batch=[8193]), r"sweep: batch 8193 x 8 KV heads is 65544 decode tasks per layer"),
])
def test_misnamed_arguments_and_batches_too_large_are_refused_before_anything_runs(kw, match):
    with pytest.raises(ValidationError, match=match):
        mdl.sweep(workers=1, progress=False, **kw)


def test_a_batch_too_large_for_the_device_is_fine_on_the_host_alone():
    df = mdl.sweep(context=[512], batch=[8193], placements=("host",), workers=1, progress=False)
    assert list(df.placement) == ["host"] and df.batch.iloc[0] == 8193


@pytest.mark.parametrize("device, host", [
    ("ahbm-device-v1", "h200"),
    (load_device(pes=48, hbm_channels=48, channel_bytes_per_cycle=64), {"hbm_tb_s": 8.0}),
])
def test_a_sweep_records_its_host_and_device_in_attrs(device, host):
    df = mdl.sweep(context=[512], placements=("host",), device=device, host=host, workers=1, progress=False)
    assert df.attrs["device"] == load_device(device).topology.to_dict()
    assert df.attrs["host"] == mdl.load_host(host).to_dict()
    rec_host, rec_device = mdl.sweeps.recorded_setup(df, "test")
    assert rec_device == load_device(device) and rec_host == mdl.load_host(host)
    # selections keep the record; so does a concat of sweeps on the same setup, not of different ones
    assert df[df.batch == 1].attrs == df.attrs
    assert pd.concat([df, df]).attrs == df.attrs
    other = mdl.sweep(context=[512], placements=("host",), device=load_device(pes=4, hbm_channels=4), workers=1,
                      progress=False)
    assert mdl.sweeps.recorded_setup(pd.concat([df, other]), "test") == (None, None)
