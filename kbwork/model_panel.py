"""An ipywidgets panel over a model's decode step: channel bandwidth, PEs per channel, FIXED and the energy
keys, redrawn live.

:class:`StepPanel` runs one decode step (DESIGN.md §15) per case — each decode
variant under each schedule on the AHBM device, and the H200 alone — and draws
their tokens per second as bars beside the physical bounds of
:mod:`kbwork.model.bounds`. Its sliders set the device's
``channel_bytes_per_cycle``, the PEs per channel (``pes = PEs per channel x
hbm_channels``: the HBM keeps its channels, more PEs share each one) and
``fixed_cycles``; dropdowns pick the model, the batch, the context, and the weights' and the KV cache's
dtypes (``bf16`` or ``fp8``, DESIGN.md §17). The
energy sliders (DESIGN.md §18: the device's ``hbm_pj_per_bit`` ... ``pe_idle_mw``
and the host's ``gpu_hbm_pj_per_bit`` ... ``link_pj_per_bit``) re-price the
steps already simulated (:meth:`kbwork.model.Step.with_energy`): moving one
simulates nothing, and each case shows its tokens per joule and watts.

The update logic is a plain method (:meth:`StepPanel.update`), so tests drive
it without a browser. The panel's figure is made once: an update moves its
bars, labels and bound lines and replaces the PNG of one ``ipywidgets.Image``,
so the picture changes in place and nothing is appended to the output.

A case whose weights and KV cache do not fit where they are placed (DESIGN.md §15) is run all the same
and drawn as a hollow bar, and the legend says so: a slider never fails for capacity.
"""

from __future__ import annotations

import html
import io
import numbers
from typing import Any, Sequence

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from . import model as mdl
from .errors import KbworkError, ValidationError
from . import keys as _keys
from .model.bounds import BOUND_KINDS, bound_kind_of, physical_bound
from .model.energy import HOST_ENERGY_KEYS, STEP_ENERGY_KEYS
from .model.cli import figure
from .model.schedule import SCHEDULES
from .model.steps import _check_choice, cases
from .plots import VARIANT_COLORS
from .plots.model import BOUND_FORMULAS, BOUND_NAMES, BOUND_STYLE, HOST_COLOR, case_label, context_label
from .widgets import error_box_html, sync_controls

#: The controls that change the timing (a change runs every step again).
TIMING_CONTROLS = ("model", "batch", "context", "channel_bytes_per_cycle", "pes_per_channel", "fixed_cycles",
                   "weight_dtype", "kv_dtype", "mapping", "merge")
#: What the two dtype controls offer (DESIGN.md §17).
DTYPES = ("bf16", "fp8")
#: The energy controls (a change re-prices the steps already run): the device's energy keys, then the host's.
ENERGY_CONTROLS = STEP_ENERGY_KEYS
#: The controls, in the order :attr:`StepPanel.values` lists them.
CONTROLS = (*TIMING_CONTROLS, *ENERGY_CONTROLS)
#: Each energy slider's largest value (at least the key's own value).
_ENERGY_MAX = {"hbm_pj_per_bit": 5.0, "tcm_pj_per_byte": 4.0, "mac_pj": 1.0, "math_pj_per_element": 1.0,
               "dispatch_pj_per_cycle": 20.0, "pe_idle_mw": 200.0, "gpu_hbm_pj_per_bit": 6.0, "flop_pj": 0.5,
               "idle_w": 200.0, "busy_w": 700.0, "link_pj_per_bit": 2.0}


def _positive_int(name: str, v: Any, *, zero: bool = False) -> int:
    ok = isinstance(v, numbers.Integral) and not isinstance(v, (bool, np.bool_)) and (v >= 0 if zero else v > 0)
    if not ok:
        raise ValidationError(f"StepPanel.update: {name} must be a {'whole number >= 0' if zero else 'positive int'}"
                              f", got {v!r} ({type(v).__name__}).")
    return int(v)


class StepPanel:
    """Sliders for channel bandwidth, PEs per channel and FIXED over one decode step, and its tokens/s.

    Every change runs the step for every case (``variants`` x ``schedules`` on the device, then the
    H200 alone) and redraws one bar per case, each labelled with its tokens/s and its share of its
    physical bound, beside the bound lines (the H200 alone, AHBM serial, AHBM overlapped; one line
    when two coincide).

    Args:
        model, batch, context: the step (every sequence at ``context``).
        channel_bytes_per_cycle, pes_per_channel, fixed_cycles: the device settings (default: the
            device's own).
        variants, schedules: the cases on the device.
        device, host: as :func:`kbwork.model.step` takes them; the panel keeps the device's
            ``hbm_channels`` and sets ``pes = pes_per_channel x hbm_channels``.
        draw: build and update the figure (``False``: numbers only).
        **energy: energy keys (:data:`ENERGY_CONTROLS`) priced instead of the device's and host's own.

    Attributes:
        values: the control values last run.
        state: the last result (see :meth:`update`).
        steps: the last :class:`kbwork.model.Step` of each case, by its label (priced under the energy
            controls).
        bound: the last :class:`kbwork.model.PhysicalBound`.
        error: the message of the last setting that could not be run (``None`` once one could).
        figure: the panel's Figure, the same object for the panel's life.

    Raises:
        ValidationError / ConfigError: bad initial values, variants or schedules.
    """

    MODELS = ("llama-3-8b", "llama-3-70b")
    BATCHES = (1, 4, 16, 64)
    CONTEXTS = (1024, 4096, 16384, 32768, 131072)
    DPI = 80

    def __init__(self, *, model: str = "llama-3-8b", batch: int = 16, context: int = 32768,
                 channel_bytes_per_cycle: float | None = None, pes_per_channel: int = 1,
                 fixed_cycles: int | None = None, variants: Sequence[str] = ("opt2", "opt3"),
                 schedules: Sequence[str] = ("serial", "ping_pong"), device: Any = mdl.DEVICE_V1,
                 host: Any = "h200", draw: bool = True, weight_dtype: str = "bf16", kv_dtype: str = "bf16",
                 mapping: str = "sequence", merge: str = "device", **energy: Any):
        if isinstance(schedules, str) or not isinstance(schedules, (list, tuple)) or not schedules \
                or len(set(schedules)) != len(schedules):
            raise ValidationError(f"StepPanel: schedules must be a non-empty list or tuple of distinct schedules "
                                  f"such as ('serial', 'ping_pong'), got {schedules!r}.")
        for s in schedules:
            _check_choice("schedule", s, SCHEDULES, "StepPanel")
        variants = list(variants) if isinstance(variants, (list, tuple)) else variants
        self.cases = [(v, p, s) for v, p in cases(variants, ["ahbm", "host"], "StepPanel")
                      for s in (schedules if p == "ahbm" else ("serial",))]
        self.device = mdl.load_device(device)
        self.host = mdl.load_host(host)
        self.values: dict[str, Any] = dict(
            model=model, batch=batch, context=context,
            channel_bytes_per_cycle=(self.device.channel_bytes_per_cycle if channel_bytes_per_cycle is None
                                     else channel_bytes_per_cycle),
            pes_per_channel=pes_per_channel,
            fixed_cycles=self.device.topology.fixed_cycles if fixed_cycles is None else fixed_cycles,
            weight_dtype=weight_dtype, kv_dtype=kv_dtype, mapping=mapping, merge=merge,
            **{k: getattr(self.host if k in HOST_ENERGY_KEYS else self.device.topology, k) for k in ENERGY_CONTROLS})
        self.draw = draw
        self._simulated: dict[str, Any] = {}  # each case's step as simulated, before the energy controls
        self.state: dict[str, Any] = {}
        self.steps: dict[str, Any] = {}
        self.bound: Any = None
        self.error: str | None = None
        self.figure: Figure | None = None
        self._artists: dict[str, Any] = {}
        self._widgets: dict[str, Any] = {}
        self._box = None
        self._quiet = False
        self._run(self._checked(energy))

    def __repr__(self) -> str:
        best = max(self.state["cases"], key=lambda c: c["tokens_per_s"])
        return f"StepPanel({self.setting_text()}: best {best['label']}, {figure(best['tokens_per_s'])} tokens/s)"

    # --- the logic -----------------------------------------------------------------------------
    def _checked(self, changes: dict[str, Any]) -> dict[str, Any]:
        unknown = [k for k in changes if k not in CONTROLS]
        if unknown:
            raise ValidationError(f"StepPanel.update: unknown control(s) {unknown}; controls are {list(CONTROLS)}.")
        v = {**self.values, **changes}
        mdl.load_model(v["model"])
        v["batch"] = _positive_int("batch", v["batch"])
        v["context"] = _positive_int("context", v["context"])
        v["pes_per_channel"] = _positive_int("pes_per_channel", v["pes_per_channel"])
        v["fixed_cycles"] = _positive_int("fixed_cycles", v["fixed_cycles"], zero=True)
        bw = v["channel_bytes_per_cycle"]
        if isinstance(bw, (bool, np.bool_)) or not isinstance(bw, numbers.Real) or not bw > 0:
            raise ValidationError(f"StepPanel.update: channel_bytes_per_cycle must be a positive number, got "
                                  f"{bw!r}.")
        for name in ("weight_dtype", "kv_dtype"):
            if v[name] not in DTYPES:
                raise ValidationError(f"StepPanel.update: {name} must be one of {', '.join(DTYPES)}, got {v[name]!r}.")
        for name, choices in (("mapping", mdl.MAPPINGS), ("merge", mdl.MERGES)):
            if v[name] not in choices:
                raise ValidationError(f"StepPanel.update: {name} must be one of {', '.join(choices)}, got {v[name]!r}.")
        for k in ENERGY_CONTROLS:  # each refused by name (negative, NaN, not a number); 0 is a free resource
            v[k] = (_keys.HOST if k in HOST_ENERGY_KEYS else _keys.TOPOLOGY).check(k, v[k])
        return v

    def device_for(self, values: dict[str, Any] | None = None) -> Any:
        """The device a setting runs on: the panel's device with ``pes``, ``channel_bytes_per_cycle`` and
        ``fixed_cycles`` set (``hbm_channels`` kept)."""
        v = self.values if values is None else values
        return self.device.replace(pes=int(v["pes_per_channel"]) * self.device.hbm_channels,
                                   channel_bytes_per_cycle=v["channel_bytes_per_cycle"],
                                   fixed_cycles=int(v["fixed_cycles"]))

    def update(self, **changes: Any) -> dict[str, Any]:
        """Apply new control values (:data:`CONTROLS`), run every case, redraw; the controls move too. A change
        of energy controls alone re-prices the steps already run (nothing is simulated).

        Returns:
            The new :attr:`state`: the values, ``pes``, ``cases`` (one dict per case: ``label``,
            ``variant``, ``placement``, ``schedule``, ``tokens_per_s``, ``seconds``, ``bound_kind``, ``fits``,
            ``joules``, ``tokens_per_j``, ``watts``, the ``physical_bound`` it is held to and ``of_bound``),
            ``tokens_per_s`` and ``tokens_per_j`` (label -> each) and ``bounds`` (bound kind -> the most
            tokens/s).

        Raises:
            ValidationError / ConfigError: an unknown control or a value that cannot be run. The panel
                shows the message and keeps the last setting that could (:attr:`error`).
        """
        try:
            values = self._checked(changes)
        except KbworkError as exc:
            self._fail(exc)
            raise
        timing_same = all(values[k] == self.values[k] for k in TIMING_CONTROLS) and self._simulated
        state = self._price(values) if timing_same else self._run(values)
        self._sync_controls(changes)
        return state

    def _run(self, values: dict[str, Any]) -> dict[str, Any]:
        contexts = [values["context"]] * values["batch"]
        try:
            dev = self.device_for(values)
            dtypes = {k: values[k] for k in ("weight_dtype", "kv_dtype")}
            # capacity is shown (a hollow bar), not refused: every setting the controls reach draws
            steps = {case_label(v, p, s): mdl.step(values["model"], contexts, variant=v, device=dev,
                                                   host=self.host, placement=p, schedule=s, check_capacity=False,
                                                   mapping=values["mapping"], merge=values["merge"], **dtypes)
                     for v, p, s in self.cases}
        except KbworkError as exc:
            self._fail(exc)
            raise
        self._simulated = steps
        self.bound = physical_bound(values["model"], contexts, host=self.host, device=dev, **dtypes)
        return self._price(values)

    def _price(self, values: dict[str, Any]) -> dict[str, Any]:
        """Price the simulated steps under the energy controls of ``values`` (nothing is simulated) and redraw."""
        energy = {k: values[k] for k in ENERGY_CONTROLS}
        steps = {label: st.with_energy(**energy) for label, st in self._simulated.items()}
        self.values, self.steps, self.error = values, steps, None
        dev = next(iter(steps.values())).device
        rows = []
        for (v, p, s), (label, st) in zip(self.cases, steps.items()):
            kind = bound_kind_of(p, s)
            rows.append({"label": label, "variant": v if p == "ahbm" else "-", "placement": p, "schedule": s,
                         "tokens_per_s": st.tokens_per_s, "seconds": st.seconds, "bound_kind": st.bound_kind,
                         "fits": st.fits, "joules": st.joules, "tokens_per_j": st.tokens_per_j, "watts": st.watts,
                         "physical_bound": kind, "of_bound": st.tokens_per_s / self.bound.tokens_per_s(kind)})
        self.state = {**values, "pes": dev.pes, "cases": rows,
                      "tokens_per_s": {r["label"]: r["tokens_per_s"] for r in rows},
                      "tokens_per_j": {r["label"]: r["tokens_per_j"] for r in rows},
                      "bounds": {k: self.bound.tokens_per_s(k) for k in self._bound_kinds()}}
        self._render()
        return self.state

    def _bound_kinds(self) -> list[str]:
        present = {bound_kind_of(p, s) for _, p, s in self.cases}
        return [k for k in BOUND_KINDS if k in present]

    # --- what the panel says -------------------------------------------------------------------
    def setting_text(self) -> str:
        """The setting last run, in words."""
        v = self.values
        return (f"{v['model']}, batch {v['batch']}, context {context_label(v['context'])}; "
                f"{v['pes_per_channel'] * self.device.hbm_channels} PEs ({v['pes_per_channel']} per channel) on "
                f"{self.device.hbm_channels} channels x {v['channel_bytes_per_cycle']:g} B/cycle, "
                f"FIXED {v['fixed_cycles']} cycles"
                + "".join(f"; {w} {v[k]}" for w, k in (("weights", "weight_dtype"), ("KV", "kv_dtype"))
                          if v[k] != "bf16")
                + (f"; {v['mapping']} mapping, merge on the {v['merge']}" if v["mapping"] != "sequence" else ""))

    def summary_html(self) -> str:
        """One line per case: tokens/s, its share of its bound and what bounds the step."""
        lines = [f"{'case':<28}{'tokens/s':>10}{'of bound':>10}{'tokens/J':>12}{'W':>8}  bound by"]
        for r in self.state["cases"]:
            # significant digits, not fixed decimals: no nonzero rate prints as 0.0
            lines.append(f"{r['label']:<28}{figure(r['tokens_per_s']):>10}{r['of_bound']:>10.0%}"
                         f"{figure(r['tokens_per_j'], 2):>12}{r['watts']:>8.0f}  {r['bound_kind']}" + ("" if r["fits"] else "  (does not fit)"))
        return (f"<div style='font-family:monospace;line-height:1.35'>{html.escape(self.setting_text())}"
                f"<pre style='margin:2px 0'>{html.escape(chr(10).join(lines))}</pre></div>")

    def message_html(self) -> str:
        """The last error as a boxed message (empty when the last setting could be run)."""
        return "" if self.error is None else error_box_html("run", self.error, self.setting_text())

    def _fail(self, exc: Exception) -> None:
        self.error = f"{type(exc).__name__}: {exc}"
        if self._widgets:
            self._widgets["message"].value = self.message_html()

    # --- drawing -------------------------------------------------------------------------------
    def _build_figure(self) -> None:
        """The figure, once: one bar per case (top to bottom in case order), one line per bound."""
        n = len(self.cases)
        fig = Figure(figsize=(10.5, 2.4 + 0.5 * n), dpi=self.DPI, layout="constrained")
        FigureCanvasAgg(fig)
        ax = fig.add_subplot()
        ys = np.arange(n)[::-1]
        colors = [HOST_COLOR if p == "host" else VARIANT_COLORS.get(v, "#999999") for v, p, _ in self.cases]
        bars = ax.barh(ys, np.zeros(n), height=0.62, color=colors)
        for bar, (_, p, s) in zip(bars, self.cases):
            if p == "ahbm" and s != "serial":
                bar.set_hatch("//")
                bar.set_edgecolor("white")
        ax.set_yticks(ys, [case_label(*c) for c in self.cases])
        texts = [ax.text(0, y, "", va="center", ha="left", fontsize=9) for y in ys]
        lines = {}
        for k in self._bound_kinds():
            color, style = BOUND_STYLE[k]
            lines[k] = ax.axvline(0, color=color, linestyle=style, linewidth=3, alpha=0.55, gid=f"bound:{k}")
        ax.set_xlabel("tokens/s")
        ax.grid(True, axis="x", alpha=0.3)
        self._artists = {"ax": ax, "bars": bars, "texts": texts, "lines": lines, "colors": colors,
                         "legend": None, "title": ax.set_title("", loc="left", fontsize=10)}
        self.figure = fig

    def _update_artists(self) -> None:
        a = self._artists
        rows = self.state["cases"]
        bounds = self.state["bounds"]
        hi = max([*bounds.values(), *(r["tokens_per_s"] for r in rows)])
        for bar, text, r, color in zip(a["bars"], a["texts"], rows, a["colors"]):
            bar.set_width(r["tokens_per_s"])
            # a case that does not fit: the outline alone (hatched ping-pong keeps its hatch, in the colour)
            bar.set_fill(r["fits"])
            bar.set_edgecolor(color if not r["fits"] else ("white" if bar.get_hatch() else color))
            bar.set_linewidth(1.0 if r["fits"] else 1.6)
            text.set_x(r["tokens_per_s"] + 0.01 * hi)
            text.set_text(f"{figure(r['tokens_per_s'])}  ({r['of_bound']:.0%} of its bound; bound by {r['bound_kind']}); "
                          f"{figure(r['tokens_per_j'], 2)} tokens/J at {r['watts']:.0f} W"
                          + ("" if r["fits"] else "; does not fit"))
        # one legend entry per distinct bound; a bound equal to an earlier one is hidden under it
        shown, handles = [], []
        for k, line in a["lines"].items():
            line.set_xdata([bounds[k], bounds[k]])
            same = next((g for g in shown if np.isclose(bounds[g[0]], bounds[k], rtol=1e-9)), None)
            if same is None:
                shown.append([k])
                line.set_visible(True)
            else:
                same.append(k)
                line.set_visible(False)
        for g in shown:
            line = a["lines"][g[0]]
            line.set_label(f"bound, {' = '.join(BOUND_NAMES[k] for k in g)}: {bounds[g[0]]:,.0f} tokens/s "
                           f"({' = '.join(BOUND_FORMULAS[k] for k in g)})")
            handles.append(line)
        if not all(r["fits"] for r in rows):
            from matplotlib.patches import Patch

            handles.append(Patch(facecolor="none", edgecolor="#444444",
                                 label="hollow bar: does not fit (weights + KV cache over the HBM they are placed in)"))
        ax = a["ax"]
        ax.set_xlim(0, hi * 1.3)
        if a["legend"] is not None:
            a["legend"].remove()
        a["legend"] = self.figure.legend(handles=handles, loc="outside lower center", fontsize=8, frameon=False)
        v = self.values
        a["title"].set_text(
            f"decode tokens/s of {v['model']}, batch {v['batch']}, context {context_label(v['context'])}\n"
            f"AHBM: {self.state['pes']} PEs ({v['pes_per_channel']} per channel) on {self.device.hbm_channels} "
            f"channels x {v['channel_bytes_per_cycle']:g} B/cycle, FIXED {v['fixed_cycles']} cycles · "
            f"host {self.host.name} ({self.host.hbm_tb_s:g} TB/s) · weights {v['weight_dtype']}, KV {v['kv_dtype']}")

    def _render(self) -> None:
        if self.draw:
            if self.figure is None:
                self._build_figure()
            self._update_artists()
        if self._widgets:
            self._widgets["summary"].value = self.summary_html()
            self._widgets["message"].value = self.message_html()
            if self.draw:
                self._widgets["figure"].value = self.png()

    def png(self) -> bytes:
        """The figure as it stands, as PNG bytes (what the panel's Image shows)."""
        buf = io.BytesIO()
        self.figure.savefig(buf, format="png", dpi=self.DPI)
        return buf.getvalue()

    # --- the widgets ---------------------------------------------------------------------------
    def _sync_controls(self, names: Any) -> None:
        """Move the named controls to :attr:`values` without running another step (a context the dropdown
        lacks is labelled as the others are, ``4k``)."""
        sync_controls(self, names, label=lambda name, value: context_label(value) if name == "context" else str(value))

    def _on_change(self, name: str, change: dict[str, Any]) -> None:
        if self._quiet:
            return
        try:
            values = self._checked({name: change["new"]})
            self._price(values) if name in ENERGY_CONTROLS and self._simulated else self._run(values)
        except KbworkError:
            pass  # the message is in the panel
        except Exception as exc:  # noqa: BLE001 - a bug; a widget callback has nowhere to raise to
            self.error = f"unexpected {type(exc).__name__} (a bug in kbwork, please report it): {exc}"
            if self._widgets:
                self._widgets["message"].value = self.message_html()

    def widget(self):
        """Build (once) and return the ipywidgets box; needs ``ipywidgets`` (the ``lab`` extra).

        Sliders ask for a new step when let go (``continuous_update=False``), so a drag is one run.
        """
        if self._box is not None:
            return self._box
        import ipywidgets as W

        v = self.values
        style = {"description_width": "150px"}
        lay = W.Layout(width="460px")
        bw = float(v["channel_bytes_per_cycle"])
        w = {
            "channel_bytes_per_cycle": W.FloatSlider(
                value=bw, min=4.0, max=max(160.0, bw), step=4.0, readout_format=".0f",
                description="channel B/cycle", continuous_update=False, style=style, layout=lay),
            "pes_per_channel": W.IntSlider(value=int(v["pes_per_channel"]), min=1,
                                           max=max(4, int(v["pes_per_channel"])), description="PEs per channel",
                                           continuous_update=False, style=style, layout=lay),
            "fixed_cycles": W.IntSlider(value=int(v["fixed_cycles"]), min=0, max=max(400, int(v["fixed_cycles"])),
                                        step=10, description="FIXED (cycles)", continuous_update=False, style=style,
                                        layout=lay),
            "model": W.Dropdown(options=sorted({*self.MODELS, str(v["model"])}), value=v["model"],
                                description="model", style={"description_width": "70px"}),
            "batch": W.Dropdown(options=sorted({*self.BATCHES, int(v["batch"])}), value=int(v["batch"]),
                                description="batch", style={"description_width": "70px"}),
            "context": W.Dropdown(options=[(context_label(c), c) for c in sorted({*self.CONTEXTS, int(v["context"])})],
                                  value=int(v["context"]), description="context", style={"description_width": "70px"}),
            "weight_dtype": W.Dropdown(options=list(DTYPES), value=v["weight_dtype"], description="weights",
                                       style={"description_width": "70px"}),
            "kv_dtype": W.Dropdown(options=list(DTYPES), value=v["kv_dtype"], description="KV cache",
                                   style={"description_width": "70px"}),
            "mapping": W.Dropdown(options=list(mdl.MAPPINGS), value=v["mapping"], description="mapping",
                                  style={"description_width": "70px"}),
            "merge": W.Dropdown(options=list(mdl.MERGES), value=v["merge"], description="merge",
                                style={"description_width": "70px"}),
        }
        energy_lay = W.Layout(width="330px")
        for k in ENERGY_CONTROLS:
            hi = max(_ENERGY_MAX.get(k, 2 * float(v[k]) or 1.0), float(v[k]))
            w[k] = W.FloatSlider(value=float(v[k]), min=0.0, max=hi, step=hi / 200, readout_format=".3g",
                                 description=k, continuous_update=False, style={"description_width": "140px"},
                                 layout=energy_lay)
        for name, ctl in w.items():
            ctl.add_class(f"kbwork-{name.replace('_', '-')}")
            ctl.observe(lambda ch, name=name: self._on_change(name, ch), names="value")
        parts = {"summary": W.HTML(), "message": W.HTML()}
        if self.draw:
            parts["figure"] = W.Image(format="png", layout=W.Layout(max_width="100%", height="auto"))
        self._widgets = dict(w, **parts)
        energy_box = W.HBox([W.VBox([w[k] for k in ENERGY_CONTROLS if k not in HOST_ENERGY_KEYS]),
                             W.VBox([w[k] for k in HOST_ENERGY_KEYS])])
        self._box = W.VBox([W.HBox([W.VBox([w["channel_bytes_per_cycle"], w["pes_per_channel"], w["fixed_cycles"]]),
                                    W.VBox([w["model"], w["batch"], w["context"]]),
                                    W.VBox([w["weight_dtype"], w["kv_dtype"]]), W.VBox([w["mapping"], w["merge"]])]),
                            W.HTML("<b>energy</b> (pJ, mW, W: re-priced without simulating again)"), energy_box,
                            parts["message"], parts["summary"], *([parts["figure"]] if self.draw else [])])
        self._box.add_class("kbwork-step-panel")
        self._render()
        return self._box

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.widget())
