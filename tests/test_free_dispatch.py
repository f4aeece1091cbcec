"""FIXED = R = 0: every dispatch costs 0, the ratio is undefined, the gate fails, nothing raises (DESIGN.md §7)."""

from __future__ import annotations

import json

import pytest

from kbwork import decode
from kbwork.cli import main as cli_main


@pytest.fixture(scope="module")
def free():
    return decode.compare(kv_len=256, mode="timing", fixed_cycles=0, r_cycles_per_byte=0)


def test_compare_reports_an_undefined_ratio_and_a_failed_gate(free):
    assert (free.dispatch_opt2, free.dispatch_opt3) == (0, 0)
    assert (free.closed_form_opt2, free.closed_form_opt3) == (0, 0)
    assert free.ratio is None and free.closed_form_ratio is None
    assert free.gate is False and free.closed_form_gate is False
    assert "0 cycles per tile" in free.ratio_note and "fails" in free.ratio_note
    assert "ratio undefined" in repr(free) and "gate FAIL" in repr(free)
    assert list(free.summary["dispatch_per_tile"]) == [0, 0]
    assert free.cycles_opt2 > 0 and free.speedup > 0  # the rest of the comparison is still there


def test_to_dict_is_json_with_null_ratios_and_a_note(free):
    d = json.loads(json.dumps(free.to_dict()))
    assert d["ratio"] is None and d["closed_form_ratio"] is None
    assert d["ratio_note"] == free.ratio_note
    assert d["gate"]["pass"] is False and d["gate"]["closed_form_pass"] is False


def test_a_defined_ratio_has_no_note():
    c = decode.compare(kv_len=256, mode="timing", fixed_cycles=0)  # R alone still costs something
    assert c.ratio is not None and c.ratio_note is None and c.to_dict()["ratio_note"] is None


def test_cli_compare_succeeds_and_says_undefined(capsys):
    assert cli_main(["compare", "--kv-len", "256", "--fixed", "0", "--r", "0"]) == 0
    out = capsys.readouterr().out
    assert "dispatch ratio opt3/opt2: undefined" in out
    assert "gate opt3 > 2 x opt2: FAIL" in out
    assert cli_main(["compare", "--kv-len", "256", "--mode", "timing", "--fixed", "0", "--r", "0", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["ratio"] is None and d["ratio_note"]


def test_cli_gantt_tiles_beyond_the_run_are_clamped_with_a_note(tmp_path, capsys):
    png = tmp_path / "g.png"
    assert cli_main(["compare", "--kv-len", "256", "--mode", "timing", "--fixed", "0", "--r", "0",
                     "--gantt", str(png), "--gantt-tiles", "9"]) == 0
    err = capsys.readouterr().err
    assert "the run has 2 tiles; --gantt draws 2, not 9" in err and f"wrote {png}" in err
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_calibration_panel_at_zero_dispatch_cost():
    from kbwork.widgets import CalibrationPanel

    panel = CalibrationPanel(fixed=0, r=0.0, kv_len=512, draw=False)
    assert panel.state["ratio"] is None and panel.state["gate"] is False
    assert panel.ratio_text() == ("dispatch ratio undefined (every dispatch costs 0); "
                                  "gate opt3 > 2 x opt2: FAIL")
    assert "ratio undefined" in panel.summary_html() and "#cf222e" in panel.summary_html()
    assert "ratio undefined, gate FAIL" in repr(panel)
    panel.update(fixed=40)  # back to a defined ratio
    assert panel.state["ratio"] > 2 and "PASS" in panel.ratio_text()


@pytest.mark.parametrize("change,pattern", [
    (dict(tile=0), r"tile must be a positive int, got 0"),
    (dict(kv_len=-1), r"kv_len must be a positive int"),
    (dict(fixed="40"), r"FIXED \(fixed=, .*\) is a whole number of cycles >= 0; got '40' \(str\)"),
])
def test_calibration_panel_bad_controls(change, pattern):
    from kbwork.errors import ValidationError
    from kbwork.widgets import CalibrationPanel

    panel = CalibrationPanel(kv_len=512, draw=False)
    with pytest.raises(ValidationError, match=pattern):
        panel.update(**change)
