"""model.sweep: one row per (point, case), the same frame serially, on local processes and on Dask, rows on disk
as points finish and a resumed sweep; bad axes refused before anything runs (DESIGN.md §12, §15)."""

from __future__ import annotations

import pytest

from kbwork import ConfigError, ValidationError
from kbwork import model as mdl

AXES = dict(model="llama-3-8b", batch=[1, 4], context=[512, 1000], handoff_us=[0, 2.5])
CASES = dict(variants=("opt2", "a1"), placements=("ahbm", "host"), schedules=("serial", "ping_pong"))


@pytest.fixture(scope="module")
def serial():
    return mdl.sweep(workers=1, progress=False, **CASES, **AXES)


def test_a_sweep_row_is_the_step_at_that_point(serial):
    assert list(serial.columns[:4]) == ["model", "batch", "context", "handoff_us"]
    assert list(serial.columns[4:]) == ["variant", "placement", "schedule", "seconds", "tokens_per_s",
                                        "attention_us_per_layer", "bound_kind", "bound"]
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
