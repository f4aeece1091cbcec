"""The command line a new user meets first: --version, python -m kbwork, the help, --set and --topology on
every simulating subcommand, and a progress bar on long work (off with --quiet and --json)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import kbwork
from kbwork import cli, decode
from kbwork.__main__ import main  # the command's entry point: cli.main with the benchmark passed in

REPO = Path(kbwork.__file__).resolve().parent.parent


def _cli(argv, capsys):
    try:
        code = main(list(argv))
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def test_version_and_python_dash_m(capsys):
    code, out, _ = _cli(["--version"], capsys)
    assert code == 0 and out.strip() == f"kbwork {kbwork.__version__}"
    env = dict(os.environ, PYTHONPATH=str(REPO), MPLBACKEND="Agg")
    p = subprocess.run([sys.executable, "-m", "kbwork", "--version"], env=env, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0 and p.stdout.strip() == f"kbwork {kbwork.__version__}"
    p = subprocess.run([sys.executable, "-m", "kbwork", "compare", "--kv_len", "256"], env=env, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 2 and "did you mean --kv-len?" in p.stderr and "Traceback" not in p.stderr
    p = subprocess.run([sys.executable, "-m", "kbwork", "bench", "--help"], env=env, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0 and "usage: kbwork bench" in p.stdout


def test_a_misspelt_choice_says_which_was_meant(capsys):
    # a command, a flag's choice, and a tie between equally close choices (both are named); nothing close: no guess
    for argv, meant in ((["compre"], "did you mean 'compare'?"),
                        (["bench", "--suite", "devic"], "did you mean 'device'?"),
                        (["explain", "--hazard-policy", "rwaware"], "did you mean 'rw_aware'?"),
                        (["run", "--variant", "opt4"], "did you mean 'opt2' or 'opt3'?"),
                        (["run", "--variant", "zzz"], None)):
        code, out, err = _cli(argv, capsys)
        assert code == 2 and out == "" and "Traceback" not in err, argv
        line = err.strip().splitlines()[-1]
        assert f"invalid choice: {argv[-1]!r}" in line, line
        assert (line.endswith(meant) if meant else "did you mean" not in line), line


def test_a_variant_given_as_a_bare_word_is_refused_with_the_option_that_names_it(capsys):
    # what a newcomer types first: the variant without its option (argparse alone says --variant is required)
    for argv, want in ((["run", "opt2"], "kbwork: error: a variant is named with --variant: write --variant opt2, "
                                          "not opt2 alone"),
                       (["run", "--mode", "timing", "opt3"], "write --variant opt3, not opt3 alone"),
                       (["compare", "opt2", "opt3"], "write --variants opt2,opt3, not opt2 opt3 alone"),
                       (["explain", "opt2,a1", "--kv-len", "256"], "write --variants opt2,a1, not opt2,a1 alone"),
                       (["step", "a1"], "write --variants a1, not a1 alone")):
        code, out, err = _cli(argv, capsys)
        assert code == 2 and out == "" and "Traceback" not in err, argv
        assert err.strip().splitlines()[-1].endswith(want), err
    # a variant as an option's value is not a bare word; a word that names no variant is argparse's to refuse
    code, _, err = _cli(["run", "--variant", "opt2", "--mode", "timing", "--kv-len", "256", "-q"], capsys)
    assert code == 0, err
    code, _, err = _cli(["run", "opt4"], capsys)
    assert code == 2 and "the following arguments are required: --variant" in err
    code, _, err = _cli(["run", "--varaint", "opt3"], capsys)  # a misspelt option's value: the option is named
    assert code == 2 and "did you mean --variant?" in err and "alone" not in err


def test_the_script_starts_at_the_entry_point_and_cli_alone_refuses_bench(capsys):
    """``cli`` ranks below ``bench`` (DESIGN §9), so the benchmark is passed in by ``kbwork.__main__``."""
    text = (REPO / "pyproject.toml").read_text()
    assert 'kbwork = "kbwork.__main__:main"' in text
    code = cli.main(["bench", "--help"])
    _, err = capsys.readouterr()
    assert code == 2 and err.startswith("kbwork: error: bench: the benchmark runs from the kbwork command's entry")
    assert "python -m kbwork bench" in err and "pip install -e ." in err
    assert cli.main(["bench", "--help"], bench=lambda argv: 7 if argv == ["--help"] else 0) == 7


@pytest.mark.parametrize("command", ["compare", "explain", "run", "bench"])
def test_help_names_the_choices_shows_defaults_and_no_checkout_path(command, capsys):
    code, out, _ = _cli([command, "--help"], capsys)
    assert code == 0
    text = " ".join(out.split())
    assert str(REPO) not in text, "an absolute checkout path in the help"
    if command == "bench":
        for suite in ("decode (default;", "gemm (", "panel (", "steady ("):
            assert suite in text
        return
    assert "storage dtype of q, k, v (default bf16)" in text
    assert "--set KEY=VALUE" in text and "--topology NAME_OR_FILE" in text and "--quiet" in text
    if command == "run":
        from kbwork.kernels.gqa_decode import commands_per_tile
        assert [commands_per_tile(v) for v in ("opt2", "opt3", "a1")] == [2, 10, 3]
        for v in decode.VARIANTS:
            assert f"{v} ({commands_per_tile(v)} commands per tile" in text


def _cycles(argv, capsys):
    code, out, err = _cli(argv, capsys)
    assert code == 0, err
    return out


@pytest.mark.parametrize("how", ["set", "topology-file"])
def test_any_topology_key_from_the_command_line_on_every_simulating_subcommand(how, tmp_path, capsys):
    want = {v: decode.run(v, kv_len=512, mode="timing", dma_channels=2, dma_base_cycles=300).cycles
            for v in ("opt2", "opt3")}
    assert want != {v: decode.run(v, kv_len=512, mode="timing").cycles for v in want}
    if how == "set":
        extra = ["--set", "dma_channels=2", "--set", "dma_base_cycles=300"]
    else:
        path = tmp_path / "two-dma.toml"
        path.write_text("name = 'two-dma'\ndma_channels = 2\ndma_base_cycles = 300\n")
        extra = ["--topology", str(path)]
    base = ["--kv-len", "512", "--mode", "timing", *extra]
    out = _cycles(["run", "--variant", "opt2", *base], capsys)
    assert f"end-to-end {want['opt2']} cycles" in out
    assert json.loads(_cycles(["compare", *base, "--json"], capsys))["cycles"] == want
    explained = json.loads(_cycles(["explain", *base, "--json"], capsys))["explain"]
    assert {v: x["cycles"] for v, x in explained.items()} == want


@pytest.mark.parametrize("argv,phases", [
    (["run", "--variant", "opt2", "--kv-len", "256"], ["making the inputs and simulating opt2",
                                                       "the float64 reference"]),
    (["compare", "--kv-len", "256", "--mode", "timing"], ["simulating opt2, opt3", "finding what bounds each"]),
    (["explain", "--kv-len", "256", "--variants", "opt2,a1"], ["simulating opt2", "simulating a1",
                                                               "explaining where the time goes"]),
])
def test_a_progress_bar_of_the_phases_on_stderr_unless_quiet_or_json(argv, phases, capsys, monkeypatch):
    monkeypatch.setattr(cli, "PROGRESS_DELAY", 0.0)  # long work shows it; here every phase is short
    code, out, err = _cli(argv, capsys)
    assert code == 0
    for phase in phases:
        assert f"kbwork: {phase}" in err
    assert f"/{len(phases)} phases" in err and "phases" not in out
    code, _, err = _cli([*argv, "--quiet"], capsys)
    assert code == 0 and "phases" not in err
    if argv[0] != "run":
        code, out, err = _cli([*argv, "--json"], capsys)
        assert code == 0 and "phases" not in err and json.loads(out)


def test_no_bar_for_quick_work_and_none_left_behind_by_an_error(capsys, monkeypatch):
    code, _, err = _cli(["compare", "--kv-len", "256", "--mode", "timing"], capsys)
    assert code == 0 and "phases" not in err  # done before the bar's delay
    monkeypatch.setattr(cli, "PROGRESS_DELAY", 0.0)

    def fails(**kw):
        raise kbwork.SimulationError("stuck")

    monkeypatch.setattr(decode, "compare", fails)
    code, _, err = _cli(["compare", "--kv-len", "256", "--mode", "timing"], capsys)
    assert code == 2 and err.rstrip().endswith("kbwork: error: stuck")  # the error on a line of its own


def test_a_submodule_used_before_it_is_imported_says_how_to_import_it():
    """``import kbwork`` loads the simulator's surface only (no matplotlib); ``kbwork.plots`` before ``import
    kbwork.plots`` is an AttributeError that says how, and a name that is no submodule a plain one."""
    env = dict(os.environ, PYTHONPATH=str(REPO), MPLBACKEND="Agg")
    code = ("import sys, kbwork\n"
            "assert 'matplotlib' not in sys.modules\n"
            "for name in ('plots', 'decode', 'nothing'):\n"
            "    try:\n"
            "        getattr(kbwork, name)\n"
            "    except AttributeError as e:\n"
            "        print(e)\n"
            "import kbwork.plots\n"
            "print(kbwork.plots.__name__, hasattr(kbwork, 'nothing'))\n")
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines() == [
        "module 'kbwork' has no attribute 'plots' until the submodule is imported: `import kbwork.plots` or "
        "`from kbwork import plots`.",
        "module 'kbwork' has no attribute 'decode' until the submodule is imported: `import kbwork.decode` or "
        "`from kbwork import decode`.",
        "module 'kbwork' has no attribute 'nothing'",
        "kbwork.plots False"]
