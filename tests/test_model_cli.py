"""``kbwork step`` (DESIGN.md §15): the table, the bound line and the JSON form; every mistake exits 2 with one
``kbwork: error:`` line (argparse's usage for a malformed argument), never a traceback."""

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
def test_a_malformed_argument_is_argparse_s_usage_and_exit_2(capsys, argv, message):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: kbwork step") and message in err


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
        assert p.returncode == 2 and last.startswith(("kbwork: error:", "kbwork step: error:"))
