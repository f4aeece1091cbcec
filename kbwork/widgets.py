"""ipywidgets panels: tune the dispatch calibration and watch opt2 vs opt3 change.

The update logic is a plain method (:meth:`CalibrationPanel.update`) so tests
can drive it without a browser or a kernel; the widgets only call it.
"""

from __future__ import annotations

import numbers
from typing import Any

import matplotlib.pyplot as plt

from . import decode, plots
from .config import load_topology
from .errors import ValidationError


class CalibrationPanel:
    """Sliders for FIXED and R, controls for tile, kv length and group.

    Every change re-simulates both variants in timing mode and redraws the
    dispatch ratio (with its closed form), the gate verdict, the end-to-end
    cycles of both variants and a Gantt of the first tiles of each.

    Attributes:
        state: the last result as a dict (ratio, closed_form_ratio, gate, cycles, ...).
        comparison: the last :class:`kbwork.decode.Comparison`.
    """

    KV_LENS = (512, 1024, 2048, 4096, 8192, 16384, 32768)
    TILES = (32, 64, 128, 256)

    def __init__(self, *, fixed: int | None = None, r: float | None = None, tile: int = 128, kv_len: int = 4096,
                 group: int = 8, gantt_tiles: int = 2, draw: bool = True):
        topo = load_topology()
        self.values: dict[str, Any] = dict(fixed=topo.fixed_cycles if fixed is None else fixed,
                                           r=topo.r_cycles_per_byte if r is None else r,
                                           tile=tile, kv_len=kv_len, group=group)
        self.gantt_tiles = gantt_tiles
        self.draw = draw
        self.state: dict[str, Any] = {}
        self.comparison: decode.Comparison | None = None
        self.figure: plt.Figure | None = None
        self._widgets: dict[str, Any] = {}
        self._box = None
        self.update()

    def __repr__(self) -> str:
        s = self.state
        ratio = s.get("ratio")
        return (f"CalibrationPanel(FIXED={self.values['fixed']}, R={self.values['r']}, tile={self.values['tile']}, "
                f"kv_len={self.values['kv_len']}: ratio {'undefined' if ratio is None else f'{ratio:.3f}'}, "
                f"gate {'PASS' if s.get('gate') else 'FAIL'})")

    # --- the logic -----------------------------------------------------------------------------
    def update(self, **changes: Any) -> dict[str, Any]:
        """Apply new control values (``fixed``, ``r``, ``tile``, ``kv_len``, ``group``), re-simulate, redraw.

        Returns:
            The new :attr:`state`.

        Raises:
            ValidationError / ConfigError: an unknown control or a nonsensical value.
        """
        unknown = [k for k in changes if k not in self.values]
        if unknown:
            raise ValidationError(f"CalibrationPanel.update: unknown control(s) {unknown}; "
                                  f"controls are {list(self.values)}.")
        values = {**self.values, **changes}
        for name in ("tile", "kv_len", "group"):  # checked here: the kv_len rounding below divides by tile
            v = values[name]
            if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v <= 0:
                raise ValidationError(f"CalibrationPanel.update: {name} must be a positive int, got {v!r}.")
        for name in ("fixed", "r"):
            v = values[name]
            if isinstance(v, bool) or not isinstance(v, numbers.Real):
                raise ValidationError(f"CalibrationPanel.update: {name} must be a number, got {v!r}.")
        if values["kv_len"] % values["tile"]:
            values["kv_len"] = max(values["tile"], values["kv_len"] // values["tile"] * values["tile"])
        cmp = decode.compare(kv_len=int(values["kv_len"]), tile=int(values["tile"]), group=int(values["group"]),
                             mode="timing", fixed_cycles=int(values["fixed"]),
                             r_cycles_per_byte=float(values["r"]))
        self.values = values
        self.comparison = cmp
        self.state = {
            "fixed": values["fixed"], "r": values["r"], "tile": values["tile"], "kv_len": values["kv_len"],
            "group": values["group"],
            "dispatch_opt2": cmp.dispatch_opt2, "dispatch_opt3": cmp.dispatch_opt3,
            "ratio": cmp.ratio, "closed_form_ratio": cmp.closed_form_ratio,
            "gate": cmp.gate, "cycles_opt2": cmp.cycles_opt2, "cycles_opt3": cmp.cycles_opt3,
        }
        self._render()
        return self.state

    def ratio_text(self) -> str:
        """The one-line verdict the panel shows.

        At FIXED = R = 0 every dispatch costs 0 and the ratio has no value
        (DESIGN.md §7): the text says so and the gate fails.
        """
        s = self.state
        verdict = "PASS" if s["gate"] else "FAIL"
        if s["ratio"] is None or s["closed_form_ratio"] is None:
            return f"dispatch ratio undefined (every dispatch costs 0); gate opt3 > 2 x opt2: {verdict}"
        return (f"dispatch ratio opt3/opt2 = {s['ratio']:.3f} (closed form {s['closed_form_ratio']:.3f}); "
                f"gate opt3 > 2 x opt2: {verdict}")

    def summary_html(self) -> str:
        s = self.state
        color = "#1a7f37" if s["gate"] else "#cf222e"
        faster = "opt2" if s["cycles_opt2"] < s["cycles_opt3"] else "opt3"
        return (f"<div style='font-family:monospace'>"
                f"<b style='color:{color}'>{self.ratio_text()}</b><br>"
                f"dispatch per tile: opt2 {s['dispatch_opt2']} cycles, opt3 {s['dispatch_opt3']} cycles<br>"
                f"end-to-end: opt2 {s['cycles_opt2']} cycles, opt3 {s['cycles_opt3']} cycles "
                f"({faster} faster by {abs(s['cycles_opt3'] / s['cycles_opt2'] - 1) * 100:.1f}%)</div>")

    def _render(self) -> None:
        if self._widgets:
            self._widgets["summary"].value = self.summary_html()
        if not self.draw:
            return
        cmp = self.comparison
        if self.figure is not None:
            plt.close(self.figure)
        tiles = min(self.gantt_tiles, cmp.opt2.n_tiles)
        self.figure = plots.compare_gantt(cmp.opt2.op_log, cmp.opt3.op_log, tiles=tiles,
                                          clock_ghz=cmp.opt2.topology.clock_ghz)
        if self._widgets:
            out = self._widgets["plot"]
            out.clear_output(wait=True)
            with out:
                from IPython.display import display

                display(self.figure)
            plt.close(self.figure)

    # --- the widgets ---------------------------------------------------------------------------
    def widget(self):
        """Build (once) and return the ipywidgets box; needs ``ipywidgets`` (the ``lab`` extra)."""
        if self._box is not None:
            return self._box
        import ipywidgets as W

        v = self.values
        style = {"description_width": "90px"}
        lay = W.Layout(width="420px")
        w = {
            "fixed": W.IntSlider(value=int(v["fixed"]), min=0, max=200, step=1, description="FIXED",
                                 continuous_update=False, style=style, layout=lay),
            "r": W.FloatSlider(value=float(v["r"]), min=0.0, max=1.0, step=0.0125, readout_format=".4f",
                               description="R", continuous_update=False, style=style, layout=lay),
            "tile": W.Dropdown(options=list(self.TILES), value=int(v["tile"]), description="tile", style=style),
            "kv_len": W.Dropdown(options=list(self.KV_LENS), value=int(v["kv_len"]), description="kv length",
                                 style=style),
            "group": W.IntSlider(value=int(v["group"]), min=1, max=32, description="group",
                                 continuous_update=False, style=style, layout=lay),
        }
        w["fixed"].add_class("kbwork-fixed")
        summary = W.HTML(self.summary_html())
        summary.add_class("kbwork-summary")
        plot = W.Output()
        self._widgets = dict(w, summary=summary, plot=plot)
        for name, ctl in w.items():
            ctl.observe(lambda ch, name=name: self.update(**{name: ch["new"]}), names="value")
        self._box = W.VBox([W.HBox([W.VBox([w["fixed"], w["r"], w["group"]]), W.VBox([w["tile"], w["kv_len"]])]),
                            summary, plot])
        self._render()
        return self._box

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.widget())
