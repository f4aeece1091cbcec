"""What fits (DESIGN.md §15, "Capacity: what fits"): the parameter count and KV bytes, ``Step.memory`` and
``Step.fits``, the refusal of ``model.step`` and ``kbwork step``, ``fits`` in compare and sweep rows; and
``kbwork step``'s progress bar and ``--quiet``."""

from __future__ import annotations

import json

import pytest

import kbwork
from kbwork import model as mdl
from kbwork.cli import main
from kbwork.errors import CapacityError, ConfigError
from kbwork.model import capacity

GIB = 2 ** 30


def test_parameters_and_kv_bytes_by_hand():
    m8, m70 = mdl.load_model("llama-3-8b"), mdl.load_model("llama-3-70b")
    # per layer QKV 4096·(32+16)·128, O 32·128·4096, FFN 3·4096·14336; embedding and LM head 2·128256·4096
    assert capacity.parameters(m8) == 32 * (4096 * 48 * 128 + 32 * 128 * 4096 + 3 * 4096 * 14336) + 2 * 128256 * 4096
    assert round(capacity.parameters(m8) / 1e9, 2) == 8.03 and round(capacity.parameters(m70) / 1e9, 2) == 70.55
    assert capacity.weight_bytes(m70) == 2 * capacity.parameters(m70)
    assert round(capacity.weight_bytes(m70) / GIB, 1) == 131.4
    # K and V, 80 layers, 8 KV heads, head_dim 128, 2 bytes, 16 sequences of 32768 keys: 160 GiB
    assert capacity.kv_bytes(m70, [32768] * 16) == 2 * 80 * 8 * 128 * 2 * 16 * 32768 == 160 * GIB
    assert capacity.kv_bytes(m8, [1000, 24]) == 2 * 32 * 8 * 128 * 2 * 1024


def test_8b_at_batch_1_and_1k_fits_on_either_placement():
    for placement in ("ahbm", "host"):
        s = mdl.step("llama-3-8b", [1024], placement=placement)
        assert s.fits is True
        assert list(s.memory.columns) == ["where", "what", "bytes", "capacity_bytes"]
        kv = s.memory.set_index("what").loc["kv"]
        assert kv["where"] == ("device" if placement == "ahbm" else "host") and kv["bytes"] == 2 * 32 * 8 * 128 * 2 * 1024
        assert s.memory.set_index("what").loc["weights", "capacity_bytes"] == 139 * GIB


def test_70b_bf16_on_the_host_is_refused_with_the_numbers(monkeypatch):
    import kbwork.model.steps as steps

    def never(*a, **k):  # the check runs before anything is simulated
        raise AssertionError("simulated a step that does not fit")

    monkeypatch.setattr(steps, "attention_run", never)
    with pytest.raises(CapacityError) as info:
        mdl.step("llama-3-70b", [32768] * 16, placement="host")
    msg = str(info.value)
    assert isinstance(info.value, ConfigError) and isinstance(info.value, kbwork.KbworkError)
    for words in ("llama-3-70b", "batch 16", "on the host", "131.4 GiB of weights", "160.0 GiB of KV cache",
                  "291.4 GiB", "139.0 GiB (gpu_hbm_gib)", "24,857 tokens", "placement='ahbm'", "check_capacity=False"):
        assert words in msg, words
    with pytest.raises(CapacityError, match=r"on the device, 160\.0 GiB of KV cache exceed its 139\.0 GiB \(hbm_gib\)"):
        mdl.step("llama-3-70b", [32768] * 16)


def test_check_capacity_false_times_it_with_fits_false_and_the_memory_rows():
    s = mdl.step("llama-3-70b", [32768] * 16, placement="host", check_capacity=False)
    assert s.fits is False and s.tokens_per_s > 0 and "does not fit" in repr(s)
    rows = s.memory.set_index(["where", "what"])
    assert rows.loc[("host", "weights"), "bytes"] == 2 * capacity.parameters(mdl.load_model("llama-3-70b"))
    assert rows.loc[("host", "kv"), "bytes"] == 160 * GIB and set(rows.capacity_bytes) == {139 * GIB}
    d = s.to_dict()
    assert d["fits"] is False and [r["what"] for r in d["memory"]] == ["weights", "kv"]
    # the device's KV is the padded one; ahbm-pe-v1 is unbounded
    t = mdl.step("llama-3-8b", [1000], device="ahbm-pe-v1", check_capacity=False)
    assert t.fits and t.memory.set_index("what").loc["kv", "bytes"] == 2 * 32 * 8 * 128 * 2 * 1024
    assert t.memory.set_index("what").loc["kv", "capacity_bytes"] == float("inf")
    with pytest.raises(kbwork.ValidationError, match="check_capacity must be True or False"):
        mdl.step("llama-3-8b", [1024], check_capacity="no")


def test_the_capacity_keys_move_what_fits():
    assert kbwork.load_topology("ahbm-device-v1").hbm_gib == 139 and kbwork.load_topology().hbm_gib == float("inf")
    assert mdl.load_host().gpu_hbm_gib == 139
    assert mdl.step("llama-3-70b", [32768] * 16, hbm_gib=200, check_capacity=True).fits
    with pytest.raises(CapacityError, match=r"host=\{'gpu_hbm_gib': N\}"):
        mdl.step("llama-3-8b", [1024], placement="host", host={"gpu_hbm_gib": 10})
    with pytest.raises(ConfigError, match="hbm_gib"):
        kbwork.load_topology(hbm_gib=-1)


def test_a_sweep_across_the_boundary_has_both_fits_values_and_does_not_raise():
    # llama-3-70b on the device: 64 sequences of 4k are 80 GiB of KV (fits), 16 of 32k 160 GiB (does not)
    df = mdl.sweep(model="llama-3-70b", batch=[4, 16], context=[4096, 32768], variants=("opt2",),
                   placements=("ahbm", "host"), progress=False, workers=1)
    assert df.fits.dtype == bool and set(df.fits) == {True, False}
    for r in df.itertuples():
        kv = 2 * 80 * 8 * 128 * 2 * r.batch * r.context
        held = kv if r.placement == "ahbm" else kv + 2 * capacity.parameters(mdl.load_model("llama-3-70b"))
        assert r.fits == (held <= 139 * GIB)
    cmp = mdl.compare("llama-3-70b", [32768] * 16, variants=("opt2",))
    assert list(cmp.fits) == [False, False]


def test_a_resumed_sweep_reads_fits_back(tmp_path):
    out = tmp_path / "s.csv"
    a = mdl.sweep(model="llama-3-70b", batch=[1], context=[4096, 32768], variants=("opt2",),
                  placements=("ahbm", "host"), progress=False, workers=1, out=out)
    b = mdl.sweep(model="llama-3-70b", batch=[1], context=[4096, 32768], variants=("opt2",),
                  placements=("ahbm", "host"), progress=False, workers=1, out=out, resume=True)
    assert list(b.fits) == list(a.fits) == [True, True, True, False]


# --- kbwork step ----------------------------------------------------------------------------------------------
def test_kbwork_step_refuses_in_one_line_before_any_progress(capsys, monkeypatch):
    import kbwork.cli

    monkeypatch.setattr(kbwork.cli, "PROGRESS_DELAY", 0)  # a bar would show at once
    assert main(["step", "--model", "llama-3-70b", "--batch", "16", "--context", "32768"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and err.startswith("kbwork: error: kbwork step: llama-3-70b at batch 16")
    for words in ("--placement ahbm: on the device, 160.0 GiB of KV cache", "--placement host: on the host, "
                  "131.4 GiB of weights + 160.0 GiB", "--no-capacity-check", "--set hbm_gib=N"):
        assert words in err, words


def test_no_capacity_check_times_it_and_says_fits_false_on_stdout_only(capsys):
    argv = ["step", "--model", "llama-3-70b", "--batch", "16", "--context", "32768", "--variants", "opt2",
            "--no-capacity-check", "--quiet"]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert err == ""
    rows = [x.split() for x in out.splitlines() if x.startswith(("ahbm ", "host "))]
    assert [r[-1] for r in rows] == ["false", "false"] and "fits: false, host alone: host weights 131.4 GiB" in out
    assert main(argv + ["--json"]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    cases = json.loads(out)["cases"]
    assert [c["fits"] for c in cases] == [False, False]
    assert [(r["where"], r["what"]) for r in cases[0]["memory"]] == [("host", "weights"), ("device", "kv")]
    assert cases[0]["memory"][1]["bytes"] == 160 * GIB and cases[0]["memory"][1]["capacity_bytes"] == 139 * GIB


def test_kbwork_step_shows_its_phases_on_stderr_unless_quiet(capsys, monkeypatch):
    import kbwork.cli

    monkeypatch.setattr(kbwork.cli, "PROGRESS_DELAY", 0)
    argv = ["step", "--model", "llama-3-8b", "--batch", "2", "--context", "1024", "--variants", "opt2",
            "--schedule", "ping_pong"]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "opt2 on the device: one layer's attention (half A, 1 sequence, 8 tasks)" in err
    assert "the whole batch" not in err and "2 sequences, for the serial step to compare" in err
    assert "host: the schedule" in err and "/6 phases" in err   # 3 device runs and the schedule, the host's 2
    assert main(argv + ["--quiet"]) == 0
    assert capsys.readouterr().err == ""


def test_ping_pong_reports_each_half_and_says_when_it_is_slower_than_serial(capsys):
    s = mdl.step("llama-3-8b", [32768] * 2, schedule="ping_pong")
    serial = mdl.step("llama-3-8b", [32768] * 2)
    assert s.attention_cycles_per_half == {"A": s.attention_runs[0].cycles, "B": s.attention_runs[1].cycles}
    assert sum(s.attention_cycles_per_half.values()) == s.attention_cycles
    assert s.serial_seconds == pytest.approx(serial.seconds, rel=1e-12) and s.seconds > s.serial_seconds
    (note,) = s.notes
    assert "ping-pong is slower than serial for this batch" in note and "mapped from PE 0" in note
    assert "16 tasks on 96 PEs" in note
    fast = mdl.step("llama-3-8b", [32768] * 16, schedule="ping_pong")
    assert fast.seconds < fast.serial_seconds and not any("slower" in n for n in fast.notes)
    assert serial.attention_cycles_per_half is None and serial.serial_seconds is None
    assert main(["step", "--model", "llama-3-8b", "--batch", "2", "--context", "32768", "--variants", "opt2",
                 "--placement", "ahbm", "--schedule", "ping_pong", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "note: ping-pong is slower than serial" in out and "the sum of half A's" in out


def test_no_nonzero_figure_prints_as_zero(capsys):
    from kbwork.model.cli import figure

    assert figure(0.00074) == "0.000740" and figure(387.25) == "387.2" and figure(0.0) == "0.0"
    assert figure(22.59359, 3) == "22.594"
    assert main(["step", "--model", "llama-3-8b", "--batch", "1", "--context", "1024", "--variants", "opt2",
                 "--placement", "ahbm", "--set", "channel_bytes_per_cycle=1e-5", "--quiet"]) == 0
    (row,) = [x.split() for x in capsys.readouterr().out.splitlines() if x.startswith("ahbm ")]
    assert float(row[4]) > 0


def _json_keys(d: dict, prefix: str = "") -> set[str]:
    """Every key of ``kbwork step --json``'s object: the top level, each case's (``cases[].x``) and each record
    of a case's lists of records (``cases[].breakdown[].x``); the values of the model, host, device and shares
    objects are documented as keys of their own tables."""
    keys = set()
    for k, v in d.items():
        name = f"{prefix}{k}"
        keys.add(name)
        if isinstance(v, list) and v and isinstance(v[0], dict) and prefix in ("", "cases[]."):
            for row in v:
                keys |= _json_keys(row, f"{name}[].")
    return keys


def test_docs_list_every_key_kbwork_step_json_prints_with_its_unit(capsys):
    import re
    from pathlib import Path

    doc = (Path(__file__).resolve().parent.parent / "docs" / "model.md").read_text(encoding="utf-8")
    section = doc.split("\n### `kbwork step --json`", 1)[1].split("\n## ", 1)[0].split("\n### ", 1)[0]
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in section.splitlines()
            if line.startswith("| `")]
    documented = {r[0].strip("`") for r in rows}
    keys = set()
    for argv in (["--placement", "both", "--schedule", "ping_pong"], ["--placement", "ahbm"]):
        assert main(["step", "--model", "llama-3-8b", "--batch", "2", "--context", "512", "--variants", "opt2",
                     "--json", *argv]) == 0
        keys |= _json_keys(json.loads(capsys.readouterr().out))
    assert keys == documented
    # a unit wherever the key is a number of something
    for r in rows:
        if re.search(r"seconds|_us|cycles|bytes|tokens_per_s", r[0]):
            assert r[1], r


def test_docs_list_every_step_field():
    from pathlib import Path

    doc = (Path(__file__).resolve().parent.parent / "docs" / "model.md").read_text(encoding="utf-8")
    section = doc.split("\n### What a step reports", 1)[1].split("\n### ", 1)[0]
    documented = {name.strip().strip("`") for line in section.splitlines()
                  if line.startswith("| `") and not line.startswith("| `Step` field")
                  for name in line.strip().strip("|").split("|")[0].split(",")}
    s = mdl.step("llama-3-8b", [512] * 2, schedule="ping_pong")
    # properties, made on first read (serial_seconds and notes run the serial comparison's device run)
    fields = {k for k in vars(s) if not k.startswith("_")} | {"bound", "shares_frame", "serial_seconds", "notes"}
    assert fields == documented


def test_the_readme_synopsis_of_kbwork_step_lists_every_flag():
    import argparse
    import re
    from pathlib import Path

    from kbwork.model.cli import add_parser

    text = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")
    synopsis = text.split("\nkbwork step [", 1)[1].split("\nkbwork bench", 1)[0]
    sub = argparse.ArgumentParser(prog="kbwork").add_subparsers()
    flags = {o for a in add_parser(sub)._actions for o in a.option_strings if o.startswith("--") and o != "--help"}
    assert flags == set(re.findall(r"--[a-z][a-z-]*", synopsis))
