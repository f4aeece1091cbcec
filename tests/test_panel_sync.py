"""One control-sync routine for both panels (:func:`kbwork.widgets.sync_controls`): a call to ``update`` moves
the controls without asking for another run, widening a slider or a dropdown that cannot show the value."""

from __future__ import annotations

import pytest

from kbwork.widgets import sync_controls

W = pytest.importorskip("ipywidgets")


class _Panel:
    """What the routine reads of a panel: its controls, its values and the flag its change handler checks."""

    def __init__(self, controls, values):
        self._widgets, self.values, self._quiet, self.seen = controls, values, False, []
        for name, ctl in controls.items():
            ctl.observe(lambda ch, name=name: self.seen.append((name, ch["new"], self._quiet)), names="value")


def test_sync_moves_each_kind_of_control_quietly():
    panel = _Panel({"fixed": W.IntSlider(value=40, min=0, max=200),
                    "tile": W.Dropdown(options=[64, 128], value=128),
                    "context": W.Dropdown(options=[("1k", 1024), ("4k", 4096)], value=1024),
                    "summary": W.HTML()},
                   {"fixed": 300, "tile": 96, "context": 2048, "summary": "unused"})
    sync_controls(panel, ["fixed", "tile", "context", "absent"], label=lambda name, v: f"{v // 1024}k")
    assert panel._widgets["fixed"].max == 300 and panel._widgets["fixed"].value == 300
    assert list(panel._widgets["tile"].options) == [64, 96, 128] and panel._widgets["tile"].value == 96
    assert list(panel._widgets["context"].options) == [("1k", 1024), ("2k", 2048), ("4k", 4096)]
    assert panel._widgets["context"].value == 2048
    # every change the controls reported (new options reset a dropdown first) came while the flag was up, so no
    # handler asked for a run; it is down now
    assert dict((n, v) for n, v, _ in panel.seen) == {"fixed": 300, "tile": 96, "context": 2048}
    assert all(quiet for _, _, quiet in panel.seen) and panel._quiet is False


def test_the_flag_comes_down_when_a_value_is_missing():
    panel = _Panel({"tile": W.Dropdown(options=[64, 128], value=128)}, {})
    with pytest.raises(KeyError):
        sync_controls(panel, ["tile"])
    assert panel._quiet is False


def test_both_panels_sync_through_it(monkeypatch):
    from kbwork import model_panel, widgets

    calls = []
    monkeypatch.setattr(widgets, "sync_controls", lambda panel, names, label=None: calls.append(type(panel).__name__))
    monkeypatch.setattr(model_panel, "sync_controls", lambda panel, names, label=None: calls.append(type(panel).__name__))
    widgets.CalibrationPanel._sync_controls(widgets.CalibrationPanel.__new__(widgets.CalibrationPanel), ["fixed"])
    model_panel.StepPanel._sync_controls(model_panel.StepPanel.__new__(model_panel.StepPanel), ["batch"])
    assert calls == ["CalibrationPanel", "StepPanel"]
