"""``kbwork step`` (DESIGN.md §15): the table, the bound line and the JSON form; every mistake exits 2 with one
``kbwork: error:`` line, never a traceback."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest

from kbwork import model as mdl
from kbwork.cli import main
from kbwork.model.cli import add_parser, cmd_step


def test_the_table_lists_every_case_and_what_bounds_each(capsys):
    assert main(["step", "--model", "llama-3-8b", "--batch", "4", "--context", "2048", "--variants", "opt2,a1"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0] == "llama-3-8b decode step: batch 4, context 2048; tile 128 (0 padded keys)"
    rows = [x.split() for x in lines if x.startswith(("ahbm ", "host "))]
    assert [r[:3] for r in rows] == [["ahbm", "opt2", "serial"], ["ahbm", "a1", "serial"], ["host", "-", "serial"]]
    s = mdl.step("llama-3-8b", [2048] * 4, variant="a1")
    assert float(rows[1][4]) == round(s.tokens_per_s, 1)
    bounds = [x for x in lines if x.startswith("bound, ")]
    host = mdl.step("llama-3-8b", [2048] * 4, placement="host")
    assert len(bounds) == 3 and bounds[2] == f"bound, host alone: {host.bound}"
    assert "fastest: " in out


def test_json_carries_seconds_tokens_breakdown_and_bound_per_case(capsys):
    assert main(["step", "--model", "llama-3-70b", "--context", "1000,4096,300", "--variants", "opt3",
                 "--placement", "ahbm", "--schedule", "ping_pong", "--handoff-us", "0", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["batch"] == 3 and d["contexts"] == [1000, 4096, 300] and d["model"]["name"] == "llama-3-70b"
    (case,) = d["cases"]
    assert {"seconds", "tokens_per_s", "breakdown", "bound"} <= set(case)
    s = mdl.step("llama-3-70b", [1000, 4096, 300], variant="opt3", schedule="ping_pong", host={"handoff_us": 0})
    assert case["seconds"] == s.seconds and case["bound"] == s.bound and case["schedule"] == "ping_pong"
    assert [r["phase"] for r in case["breakdown"]] == list(s.breakdown.phase)
    assert case["padding"] == 24 + 0 + 84


def test_one_context_for_the_whole_batch_or_one_per_sequence(capsys):
    assert main(["step", "--context", "512", "--batch", "3", "--placement", "host", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["contexts"] == [512] * 3
    assert main(["step", "--context", "512,640", "--batch", "2", "--placement", "host", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["contexts"] == [512, 640]


def test_the_subcommand_plugs_into_any_parser():
    p = argparse.ArgumentParser(prog="kbwork")
    sub = p.add_subparsers(dest="command", required=True)
    add_parser(sub)
    a = p.parse_args(["step", "--context", "256", "--placement", "host"])
    assert a.fn is cmd_step and a.context == (256,) and a.variants == ("opt2", "opt3", "a1")


@pytest.mark.parametrize("argv, message", [
    (["step", "--batch", "3", "--context", "512,1024"], "kbwork: error: --batch 3 does not match the 2 lengths"),
    (["step", "--model", "llama-9"], "kbwork: error: model 'llama-9' not found"),
    (["step", "--host", "h100"], "kbwork: error: host 'h100' not found"),
    (["step", "--device", "nope"], "kbwork: error: topology 'nope' not found"),
    (["step", "--context", "1073741824"], "kbwork: error: model.step: contexts[0] = 1073741824 is 8388608 tiles"),
])
def test_a_mistake_is_one_error_line_and_exit_2(capsys, argv, message):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1


@pytest.mark.parametrize("argv, message", [
    (["step", "--context", "0"], "argument --context: expected positive KV lengths, got 0"),
    (["step", "--context", "1k"], "argument --context: expected a positive KV length or a comma list"),
    (["step", "--context", "512,"], "argument --context: expected a positive KV length or a comma list"),
    (["step", "--batch", "0"], "argument --batch: expected a positive integer, got 0"),
    (["step", "--variants", "opt9"], "argument --variants: unknown variant(s) opt9"),
    (["step", "--variants", "opt2,opt2"], "argument --variants: expected one or more different variants"),
    (["step", "--placement", "gpu"], "argument --placement: invalid choice: 'gpu'"),
    (["step", "--schedule", "pingpong"], "argument --schedule: invalid choice: 'pingpong'"),
    (["step", "--handoff-us", "-1"], "argument --handoff-us: expected a non-negative number"),
])
def test_a_malformed_argument_is_one_error_line_and_exit_2(capsys, argv, message):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("kbwork: error: ") and err.count("\n") == 1 and message in err


@pytest.mark.parametrize("argv", [
    ["step", "--model", "llama-3-8b", "--context", "512", "--batch", "2", "--placement", "host"],
    ["step", "--batch", "2", "--context", "1,2,3"],
    ["step", "--tile", "x"],
])
def test_no_traceback_from_the_command_line(argv):
    p = subprocess.run([sys.executable, "-m", "kbwork", *argv], capture_output=True, text=True,
                       timeout=120)
    assert "Traceback" not in p.stderr
    if argv[-1] == "host":
        assert p.returncode == 0 and "host alone" in p.stdout
    else:
        last = p.stderr.strip().splitlines()[-1]
        assert p.returncode == 2 and last.startswith("kbwork: error:")


# --- --set, the batch limits and the TCM hint ---------------------------------------------------------------
def test_set_sets_a_topology_key_of_the_device(capsys):
    assert main(["step", "--context", "1024", "--batch", "2", "--variants", "opt2", "--placement", "ahbm",
                 "--set", "channel_bytes_per_cycle=80", "--set", "fixed_cycles=60", "--json"]) == 0
    (case,) = json.loads(capsys.readouterr().out)["cases"]
    s = mdl.step("llama-3-8b", [1024] * 2, channel_bytes_per_cycle=80, fixed_cycles=60)
    assert case["seconds"] == s.seconds
    assert case["device"]["channel_bytes_per_cycle"] == 80 and case["device"]["fixed_cycles"] == 60


@pytest.mark.parametrize("argv, message", [
    (["step", "--set", "fixed_cyles=3"], "kbwork: error: --set fixed_cyles=3: unknown topology key 'fixed_cyles'"),
    (["step", "--set", "tcm_bytes=x"], "kbwork: error: --set tcm_bytes=x: tcm_bytes takes a whole number"),
    (["step", "--set", "pes=0"], "kbwork: error: --set pes=0: topology key 'pes' is 0"),
    (["step", "--set", "handoff_us=3"], "kbwork: error: --set handoff_us=3: handoff_us is a host key, and --set "
                                        "sets topology keys of the device; use --handoff-us"),
    (["step", "--hazard-policy", "rw_aware", "--set", "hazard_policy=strict_fifo"],
     "kbwork: error: --set hazard_policy=strict_fifo: hazard_policy is already set by --hazard-policy rw_aware"),
    (["step", "--batch", "100000000", "--placement", "host"],
     "kbwork: error: --batch 100000000: a step takes at most 1048576 sequences; use a smaller --batch."),
    (["step", "--batch", "9000", "--context", "128"],
     "kbwork: error: a batch of 9000 x 8 KV heads of llama-3-8b is 72000 decode tasks per layer on the device; "
     "kbwork step simulates at most 65536 (a batch of at most 8192 for this model). Use a smaller --batch, or "
     "--placement host"),
])
def test_set_and_batch_mistakes_are_one_error_line_and_exit_2(capsys, argv, message):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1


def test_set_without_a_value_is_argparse_s_usage(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["step", "--set", "tcm_bytes"])
    assert exc.value.code == 2
    assert "argument --set: expected key=value with a topology key" in capsys.readouterr().err


def test_the_tcm_hint_names_kbwork_step_s_own_options_and_a_size_that_fits(capsys):
    from kbwork.cli import build_parser

    argv = ["step", "--context", "256", "--placement", "ahbm", "--device", "ahbm-pe-v1", "--variants", "opt2,opt3"]
    a = build_parser().parse_args([*argv, "--set", "tcm_bytes=16384"])
    hint = a.tcm_hint(a)       # what kbwork.cli.main is to add to a TCM overflow of kbwork step
    assert hint == (" On the command line: --set tcm_bytes=262144 (now 16384), a smaller --tile, or --device FILE "
                    "with that tcm_bytes.")
    assert "--topology" not in hint
    assert main([*argv, "--set", "tcm_bytes=131072"]) == 2 and "TCM overflow" in capsys.readouterr().err
    assert main([*argv, "--set", "tcm_bytes=262144"]) == 0


def test_the_tcm_hint_falls_back_to_words_when_it_cannot_size_the_tcm():
    a = argparse.Namespace(model="llama-9", device="ahbm-pe-v1", settings=[], hazard_policy=None, tile=128,
                           variants=("opt2",))
    assert mdl.cli.tcm_hint(a) == (" On the command line: --set tcm_bytes=N, a smaller --tile, or --device FILE "
                                   "with a larger tcm_bytes.")
