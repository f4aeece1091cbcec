"""Every mistake in the arguments, for every subcommand, is one ``kbwork: error: ...`` line on stderr and exit
status 2 (the usage stays in ``--help``); and ``kbwork bench`` at the smallest sizes it accepts ends without a
traceback."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import kbwork
from kbwork.__main__ import main  # the command's entry point: cli.main with the benchmark passed in

REPO = Path(kbwork.__file__).resolve().parent.parent


def _cli(argv, capsys):
    try:
        code = main(list(argv))
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("argv, message", [
    (["compare", "--kv-len", "x"], "argument --kv-len: expected"),
    (["compare", "--variants", "opt2"], "argument --variants: expected two or more different variants"),
    (["compare", "--kv_len", "256"], "unrecognized arguments: --kv_len 256 (did you mean --kv-len?)"),
    (["explain", "--top", "0"], "argument --top: expected an integer between 1 and 100, got 0"),
    (["explain", "--hazard-policy", "rwaware"], "did you mean 'rw_aware'?"),
    (["run"], "the following arguments are required: --variant"),
    (["run", "--variant", "opt4"], "argument --variant: invalid choice: 'opt4'"),
    (["run", "opt2"], "a variant is named with --variant: write --variant opt2, not opt2 alone"),
    (["golden"], "one of the arguments --check --update is required"),
    (["golden", "--check", "--update"], "argument --update: not allowed with argument --check"),
    (["step", "--batch", "0"], "argument --batch: expected a positive integer, got 0"),
    (["step", "--set", "tcm_bytes"], "argument --set: expected key=value with a topology key"),
    (["step", "--bogus"], "unrecognized arguments: --bogus"),
    # one --variants type for every command line: the same refusal in the same words
    (["explain", "--variants", "opt2,,a1"], "argument --variants: 'opt2,,a1' has an empty entry"),
    (["step", "--variants", "opt2,,a1"], "argument --variants: 'opt2,,a1' has an empty entry"),
    (["step", "--variants", "a1,a1"], "argument --variants: expected one or more different variants"),
    (["bench", "--suite", "devic"], "did you mean 'device'?"),
    (["bench", "--kv-lens", "x"], "argument --kv-lens: expected"),
    (["bench", "--suite", "loops", "--kv-lens", "4096"], "--kv-lens does not apply to --suite loops"),
    (["compre"], "argument command: invalid choice: 'compre'"),
    ([], "the following arguments are required: command"),
], ids=lambda x: " ".join(x) if isinstance(x, list) else None)
def test_an_argparse_mistake_is_one_error_line_and_exit_2(capsys, argv, message):
    code, out, err = _cli(argv, capsys)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("kbwork: error: ") and message in err, err
    assert "usage:" not in err


def test_the_usage_stays_in_help(capsys):
    code, out, err = _cli(["step", "--help"], capsys)
    assert code == 0 and out.startswith("usage: kbwork step") and err == ""


def test_the_installed_command_s_mistake_is_one_line_too():
    p = subprocess.run([sys.executable, "-m", "kbwork", "step", "--batch", "0"], capture_output=True, text=True,
                       timeout=120, cwd=REPO)
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr == "kbwork: error: argument --batch: expected a positive integer, got 0\n"


def test_the_steady_suite_at_its_smallest_sizes_prints_its_table(tmp_path, monkeypatch, capsys):
    """One tile is too few for a steady state (no period): the table says "-" where it gave a TypeError."""
    from kbwork import bench
    from kbwork.bench import steady

    cold = steady.cold_start
    monkeypatch.setattr(steady, "cold_start", lambda: cold(repeats=1))  # fresh interpreters are slow, not at issue
    argv = ["--suite", "steady", "--kv-lens", "128", "--sweep-points", "1", "--no-dask", "--out", str(tmp_path)]
    assert bench.main(argv) == 0
    out = capsys.readouterr().out
    rows = json.loads((tmp_path / "steady.json").read_text())["steady_vs_full"]
    assert {r["variant"] for r in rows} == {"opt2", "opt3", "a1"} and all(r["period_tiles"] is None for r in rows)
    table = [line.split() for line in out.splitlines()[1:4]]
    assert [(t[0], t[1], t[-1]) for t in table] == [("opt2", "128", "-"), ("opt3", "128", "-"), ("a1", "128", "-")]
