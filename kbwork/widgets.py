"""ipywidgets panels: tune the dispatch calibration and watch the decode variants change.

The update logic is a plain method (:meth:`CalibrationPanel.update`) so tests
can drive it without a browser or a kernel; the widgets only ask for it
(:meth:`CalibrationPanel.request`).

A slider move has to feel live, so the panel builds its figure once and, on
every change, moves the existing artists (the Gantt bars, the x range, the
title) and refreshes one ``ipywidgets.Image`` with a PNG of that same figure
at a fixed size: no new figure, no layout pass and no tight bounding box per
move, and nothing the browser needs beyond plain JupyterLab. The figure's
static parts (engine names, legend, variant titles) are painted once; a move
repaints only what moves over them. Changes that arrive while a simulation
runs are coalesced, so only the latest values are simulated.
"""

from __future__ import annotations

import html
import io
import numbers
import threading
import time
from typing import Any, Callable, Iterable

import numpy as np
import pandas as pd
import PIL.Image
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import PolyCollection
from matplotlib.colors import to_rgba_array
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from . import decode, plots
from .config import load_topology
from .errors import KbworkError, ValidationError
from .oplog import STAGE_NAMES, engine_tracks

_PASS, _FAIL = "#1a7f37", "#cf222e"
#: One RGBA row per stage kind, in STAGE_NAMES order: the colours of kbwork.plots.gantt.
_STAGE_RGBA = to_rgba_array([plots.STAGE_COLORS[k] for k in STAGE_NAMES])


def _fmt(ratio: float | None) -> str:
    return "undefined" if ratio is None else f"{ratio:.3f}"


def _whole_cycles(v: Any) -> int:
    """FIXED as the int of cycles the panel simulates and shows: a whole number >= 0, else a ValidationError.

    ``40``, ``np.int64(40)``, ``40.0`` and ``Fraction(80, 2)`` are 40; ``40.7``, ``-0.5``, NaN and infinities
    are refused rather than rounded, so the panel never shows one FIXED and simulates another.
    """
    def refuse(why: str) -> ValidationError:
        return ValidationError(f"CalibrationPanel.update: FIXED (fixed=, the topology's fixed_cycles) is a whole "
                               f"number of cycles >= 0; {why}. E.g. fixed=40.")

    if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Real):
        raise refuse(f"got {v!r} ({type(v).__name__})")
    if isinstance(v, numbers.Integral):
        n = int(v)
    else:
        try:
            whole = float(v).is_integer() if not isinstance(v, numbers.Rational) else v.denominator == 1
        except (OverflowError, ValueError):
            whole = False
        if not whole:
            raise refuse(f"got {v!r}, which is not a whole number")
        n = int(v)
    if n < 0:
        raise refuse(f"got {v!r}")
    return n


def _exact(x: float) -> str:
    """``x`` as short as it prints (``0.0625``, ``0``) when that is exactly ``x``, else in full: the panel
    shows the value it simulated, not a rounded one."""
    short = f"{float(x):g}"
    return short if float(short) == float(x) else repr(float(x))


class GanttRows:
    """A Gantt chart on one Axes whose bars are replaced in place.

    One PolyCollection per engine track lives as long as the Axes;
    :meth:`show` swaps their vertices and colours and sets the x range, so a
    redraw creates no artists. Bars look like :func:`kbwork.plots.gantt`'s.
    """

    HEIGHT = 0.4  # half the bar height, in track units

    def __init__(self, ax: Any, tracks: tuple[str, ...]):
        self.ax = ax
        self.tracks = tracks
        self.collections = [ax.add_collection(PolyCollection(np.empty((0, 4, 2)))) for _ in tracks]
        ax.set_yticks(range(len(tracks)))
        ax.set_yticklabels(tracks)
        ax.set_ylim(len(tracks) - 0.5, -0.5)
        ax.grid(axis="x", alpha=0.3)

    def show(self, op_log: pd.DataFrame, window: tuple[int, int]) -> None:
        """Draw the stages of ``op_log`` that overlap ``window`` (cycles) and set the x range to it."""
        lo, hi = window
        df = op_log[(op_log["end"] > lo) & (op_log["start"] < hi)]
        start = df["start"].to_numpy(np.float64)
        end = df["end"].to_numpy(np.float64)
        row = pd.Categorical(df["engine"], categories=self.tracks).codes
        face = _STAGE_RGBA[pd.Categorical(df["stage"], categories=STAGE_NAMES).codes]
        verts = np.empty((len(df), 4, 2))
        verts[:, 0, 0] = verts[:, 1, 0] = start
        verts[:, 2, 0] = verts[:, 3, 0] = end
        verts[:, 0, 1] = verts[:, 3, 1] = row - self.HEIGHT
        verts[:, 1, 1] = verts[:, 2, 1] = row + self.HEIGHT
        # thin white seams keep back-to-back stages apart while they are few enough to see
        width = 0.25 if len(df) <= 3000 else 0.0
        for r, coll in enumerate(self.collections):
            m = row == r
            coll.set_verts(verts[m])
            coll.set_facecolor(face[m])
            coll.set_edgecolor("white")
            coll.set_linewidth(width)
        self.ax.set_xlim(lo, hi)


def error_box_html(action: str, error: str, showing: str) -> str:
    """A panel's boxed error line: ``could not <action> this setting: <error>``, then the setting it still
    shows (``showing``), both escaped."""
    return (f"<div style='font-family:monospace;line-height:1.35;color:{_FAIL};border:1px solid {_FAIL};"
            f"padding:4px 8px'><b>could not {action} this setting</b>: {html.escape(error)}<br>"
            f"still showing the last one that could: {html.escape(showing)}</div>")


def sync_controls(panel: Any, names: Iterable[str], label: Callable[[str, Any], str] | None = None) -> None:
    """Move a panel's named controls to its values without asking for another run: what both panels
    (:class:`CalibrationPanel`, :class:`kbwork.model_panel.StepPanel`) do after an :meth:`update`.

    ``panel._widgets`` holds the controls by name (none before the panel is shown) and ``panel.values`` the
    values; ``panel._quiet`` is True while the controls move, so the panel's change handler, which reads it,
    does not run again for a change it made itself. A dropdown that lacks the value gains it among its
    options (labelled ``label(name, value)`` where its options are ``(label, value)`` pairs; kept in order);
    a slider whose maximum is below the value has its maximum raised to it.

    Raises:
        KeyError: a name the panel has no value for (a programming error).
    """
    label = label or (lambda _name, value: str(value))
    panel._quiet = True
    try:
        for name in names:
            ctl = panel._widgets.get(name)
            if ctl is None:
                continue
            value = panel.values[name]
            if hasattr(ctl, "options"):
                options = list(ctl.options)
                if any(isinstance(o, tuple) for o in options):  # (label, value) pairs
                    pairs = [o if isinstance(o, tuple) else (str(o), o) for o in options]
                    if value not in [v for _, v in pairs]:
                        ctl.options = sorted([*pairs, (label(name, value), value)],
                                             key=lambda o: (str(type(o[1])), o[1]))
                elif value not in options:
                    ctl.options = sorted({*options, value}, key=lambda o: (str(type(o)), o))
            elif hasattr(ctl, "max") and value > ctl.max:
                ctl.max = value
            ctl.value = value
    finally:
        panel._quiet = False


class CalibrationPanel:
    """Sliders for FIXED and R, controls for tile, kv length and group, over any decode variants.

    Every change re-simulates the variants in timing mode and shows each
    variant's dispatch per tile and end-to-end cycles, the headline ratio and
    gate opt3/opt2 when both are present, the gate report of
    :attr:`kbwork.decode.Comparison.gates`, and a Gantt of the first tiles with
    one row group per variant. At FIXED = R = 0 the ratio is undefined and the
    gate fails (DESIGN.md §7); a setting that cannot be simulated is reported
    in the panel, which keeps showing the last one that could.

    Args:
        fixed, r: the dispatch calibration (default: the default topology's).
        tile, kv_len, group: the decode problem; ``kv_len`` is rounded down
            to a multiple of ``tile``.
        variants: two or more of :data:`kbwork.decode.VARIANTS`.
        gantt_tiles: how many tiles the Gantt shows.
        draw: build and update the figure (``False``: numbers only).

    Attributes:
        values: the control values last simulated.
        state: the last result as a dict (see :meth:`update`).
        comparison: the last :class:`kbwork.decode.Comparison`.
        error: the message of the last setting that could not be simulated
            (``None`` once one could).
        figure: the panel's matplotlib Figure, the same object for the panel's life.
        timings: seconds the last update spent in ``simulate``, ``draw`` and ``png``.

    Raises:
        ValidationError: unknown or repeated variants, fewer than two, or bad
            initial values (and the errors of :func:`kbwork.decode.compare`).
    """

    KV_LENS = (512, 1024, 2048, 4096, 8192, 16384, 32768)
    TILES = (32, 64, 128, 256)
    DPI = 80
    WIDTH_IN = 12.0
    ROW_GROUP_IN = 1.75  # height of one variant's Gantt
    FRAME_IN = 1.0       # title, µs axis and cycle axis

    def __init__(self, *, fixed: int | None = None, r: float | None = None, tile: int = 128, kv_len: int = 4096,
                 group: int = 8, variants: tuple[str, ...] | list[str] = decode.DEFAULT_VARIANTS,
                 gantt_tiles: int = 2, draw: bool = True):
        variants = decode._check_variants(variants, "CalibrationPanel")
        if len(variants) < 2:
            raise ValidationError(f"CalibrationPanel compares two or more variants, got {variants!r}; "
                                  f"e.g. variants=('opt2', 'opt3', 'a1').")
        if isinstance(gantt_tiles, bool) or not isinstance(gantt_tiles, numbers.Integral) or gantt_tiles < 1:
            raise ValidationError(f"CalibrationPanel: gantt_tiles must be a positive int, got {gantt_tiles!r}.")
        topo = load_topology()
        self.variants = variants
        self.values: dict[str, Any] = dict(fixed=topo.fixed_cycles if fixed is None else fixed,
                                           r=topo.r_cycles_per_byte if r is None else r,
                                           tile=tile, kv_len=kv_len, group=group)
        self.gantt_tiles = int(gantt_tiles)
        self.draw = draw
        self.state: dict[str, Any] = {}
        self.comparison: decode.Comparison | None = None
        self.error: str | None = None
        self.figure: Figure | None = None
        self.timings: dict[str, float] = {}
        self._rows: dict[str, GanttRows] = {}
        self._moving: list[Any] = []            # artists repainted on every move (see _build_figure)
        self._title: Any = None
        self._background: Any = None            # the static pixels, after the first paint
        self._widgets: dict[str, Any] = {}
        self._box = None
        self._lock = threading.RLock()          # one update at a time, whichever thread asks
        self._queue = threading.Condition()     # guards _wanted, _dirty, _worker
        self._wanted = dict(self.values)        # what the controls ask for
        self._dirty = False
        self._worker: threading.Thread | None = None
        self._quiet = False                     # True while update() moves the controls itself
        self._update({})

    def __repr__(self) -> str:
        s = self.state
        head = ""
        if s.get("gate") is not None:
            head = f": ratio {_fmt(s['ratio'])}, gate {'PASS' if s['gate'] else 'FAIL'}"
        return (f"CalibrationPanel({', '.join(self.variants)}; {self.setting_text()}{head})")

    # --- the logic -----------------------------------------------------------------------------
    def _checked(self, changes: dict[str, Any]) -> dict[str, Any]:
        """The current values with ``changes`` applied, checked; kv_len rounded down to a multiple of tile."""
        unknown = [k for k in changes if k not in self.values]
        if unknown:
            raise ValidationError(f"CalibrationPanel.update: unknown control(s) {unknown}; "
                                  f"controls are {list(self.values)}.")
        values = {**self.values, **changes}
        for name in ("tile", "kv_len", "group"):  # checked here: the kv_len rounding below divides by tile
            v = values[name]
            if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v <= 0:
                raise ValidationError(f"CalibrationPanel.update: {name} must be a positive int, got {v!r}.")
        values["fixed"] = _whole_cycles(values["fixed"])
        v = values["r"]
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Real):
            raise ValidationError(f"CalibrationPanel.update: r must be a number, got {v!r}.")
        if values["kv_len"] % values["tile"]:
            values["kv_len"] = max(values["tile"], values["kv_len"] // values["tile"] * values["tile"])
        return values

    def update(self, **changes: Any) -> dict[str, Any]:
        """Apply new control values (``fixed``, ``r``, ``tile``, ``kv_len``, ``group``), re-simulate, redraw.

        The panel's controls move to the values given.

        Returns:
            The new :attr:`state`: the values, ``variants``, per variant
            ``dispatch`` and ``cycles`` (dicts, also flat as ``dispatch_opt2``,
            ``cycles_opt2``, ...), ``ratio``, ``closed_form_ratio`` and ``gate``
            (opt3/opt2; the ratios ``None`` when undefined, the gate ``None``
            without both), ``ratio_note`` and ``gates`` (the gate report rows).

        Raises:
            ValidationError / ConfigError / TcmOverflowError: an unknown
                control, a nonsensical value (FIXED is a whole number of cycles
                >= 0: ``40.7``, ``-0.5`` and NaN are refused, never rounded), or
                a setting that cannot be simulated. The panel then shows the
                message and keeps the last setting that could be simulated
                (:attr:`error`).
        """
        with self._lock:
            state = self._update(changes)
            with self._queue:
                self._wanted.update({k: self.values[k] for k in changes})
            self._sync_controls(changes)
            return state

    def _update(self, changes: dict[str, Any]) -> dict[str, Any]:
        """:meth:`update` without moving the controls (the controls asked for it)."""
        with self._lock:
            try:
                values = self._checked(changes)
                t0 = time.perf_counter()
                cmp = decode.compare(kv_len=int(values["kv_len"]), tile=int(values["tile"]),
                                     group=int(values["group"]), mode="timing", variants=self.variants,
                                     fixed_cycles=values["fixed"], r_cycles_per_byte=float(values["r"]))
                simulated = time.perf_counter() - t0
            except KbworkError as exc:
                self.error = f"{type(exc).__name__}: {exc}"
                self._show_message()
                raise
            self.values = values
            self.comparison = cmp
            self.error = None
            self.state = {**{k: values[k] for k in ("fixed", "r", "tile", "kv_len", "group")},
                          "variants": cmp.variants, "dispatch": dict(cmp.dispatch), "cycles": dict(cmp.cycles),
                          **{f"dispatch_{v}": cmp.dispatch[v] for v in cmp.variants},
                          **{f"cycles_{v}": cmp.cycles[v] for v in cmp.variants},
                          "ratio": cmp.ratio, "closed_form_ratio": cmp.closed_form_ratio, "gate": cmp.gate,
                          "ratio_note": cmp.ratio_note, "gates": cmp.gates.to_dict(orient="records")}
            self.timings = {"simulate": simulated}
            self._render()
            return self.state

    def request(self, **changes: Any) -> None:
        """Ask for new control values without waiting; what the widgets call.

        The simulation runs on a worker thread, so the kernel keeps reading
        the browser's messages: changes that arrive meanwhile are merged and
        only the latest values are simulated next. A setting that cannot be
        simulated shows its message in the panel; nothing is raised here.
        :meth:`wait` waits for the panel to catch up.

        Raises:
            ValidationError: a control name that does not exist (a programming error).
        """
        unknown = [k for k in changes if k not in self.values]
        if unknown:
            raise ValidationError(f"CalibrationPanel.request: unknown control(s) {unknown}; "
                                  f"controls are {list(self.values)}.")
        with self._queue:
            self._wanted.update(changes)
            self._dirty = True
            if self._worker is None:
                self._worker = threading.Thread(target=self._drain, name="kbwork-calibration-panel", daemon=True)
                self._worker.start()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until every requested change has been simulated (or ``timeout`` s); True when idle."""
        with self._queue:
            return self._queue.wait_for(lambda: self._worker is None, timeout)

    def _drain(self) -> None:
        """The worker: simulate the latest wanted values until no change is pending."""
        self._show_status(True)
        while True:
            with self._queue:
                if not self._dirty:
                    self._show_status(False)  # under the lock: a new worker cannot have said "busy" yet
                    self._worker = None
                    self._queue.notify_all()
                    return
                self._dirty = False
                wanted = dict(self._wanted)
            self._apply(wanted)

    def _apply(self, values: dict[str, Any]) -> None:
        """:meth:`update` for the widgets: every error ends up as a message in the panel, never raised."""
        try:
            self._update(values)
        except KbworkError:
            pass  # update() has put the message in the panel
        except Exception as exc:  # noqa: BLE001 - a bug; a widget callback has nowhere to raise to
            self.error = f"unexpected {type(exc).__name__} (a bug in kbwork, please report it): {exc}"
            self._show_message()

    # --- what the panel says -------------------------------------------------------------------
    def ratio_text(self) -> str:
        """The one-line headline: the ratio and gate opt3/opt2.

        At FIXED = R = 0 every dispatch costs 0 and the ratio has no value
        (DESIGN.md §7): the text says so and the gate fails. Without both
        opt2 and opt3 the text says there is no headline ratio.
        """
        s = self.state
        if s["gate"] is None:
            return f"no headline ratio: {s['ratio_note']}"
        verdict = "PASS" if s["gate"] else "FAIL"
        if s["ratio"] is None or s["closed_form_ratio"] is None:
            return f"dispatch ratio undefined (every dispatch costs 0); gate opt3 > 2 x opt2: {verdict}"
        return (f"dispatch ratio opt3/opt2 = {s['ratio']:.3f} (closed form {s['closed_form_ratio']:.3f}); "
                f"gate opt3 > 2 x opt2: {verdict}")

    def setting_text(self) -> str:
        """The control values last simulated, in words."""
        v = self.values
        return (f"FIXED {v['fixed']} cycles, R {_exact(v['r'])} cycles/byte, tile {v['tile']}, "
                f"kv length {v['kv_len']}, group {v['group']}")

    def summary_html(self) -> str:
        """The headline, the setting, a row per variant and (beyond opt2 and opt3) the gate report."""
        s = self.state
        color = _FAIL if s["gate"] is False else _PASS if s["gate"] else "inherit"
        fastest = min(s["cycles"].values())
        lines = [f"{'variant':<8}{'commands/tile':>15}{'dispatch/tile':>15}{'end to end':>12}{'vs fastest':>12}"]
        for v in s["variants"]:
            c = s["cycles"][v]
            lines.append(f"{v:<8}{len(self.comparison.runs[v].command_bytes_per_tile):>15}{s['dispatch'][v]:>15}"
                         f"{c:>12}{'fastest' if c == fastest else f'+{(c / fastest - 1) * 100:.1f}%':>12}")
        if s["gate"] is None or len(s["gates"]) > 1:
            lines.append("")
            lines += [f"{g['rule']:<16} ratio {_fmt(g['ratio']):>9}  "
                      f"<b style='color:{_PASS if g['pass'] else _FAIL}'>{'PASS' if g['pass'] else 'FAIL'}</b>"
                      for g in s["gates"]]
        return (f"<div style='font-family:monospace;line-height:1.35'>"
                f"<b style='color:{color}'>{html.escape(self.ratio_text())}</b><br>"
                f"{html.escape(self.setting_text())}; dispatch and end to end in cycles:"
                f"<pre style='margin:2px 0'>{chr(10).join(lines)}</pre></div>")

    def message_html(self) -> str:
        """The last error as a boxed message (empty when the last setting could be simulated)."""
        return "" if self.error is None else error_box_html("simulate", self.error, self.setting_text())

    # --- drawing -------------------------------------------------------------------------------
    def _build_figure(self) -> None:
        """The figure, once: one Axes per variant on a shared cycle axis, a µs axis on top, the legend.

        What changes from move to move (the bars, the cycle and µs axes with
        their grid, the frame drawn over the bars, the title with the setting)
        is listed in ``_moving``; everything else is painted once into a
        background that each move starts from.
        """
        cmp = self.comparison
        n = len(self.variants)
        fig = Figure(figsize=(self.WIDTH_IN, self.FRAME_IN + self.ROW_GROUP_IN * n), dpi=self.DPI,
                     layout="constrained")
        FigureCanvasAgg(fig)
        axes = fig.subplots(n, 1, sharex=True, squeeze=False)[:, 0]
        per_us = cmp.runs[self.variants[0]].topology.clock_ghz * 1e3
        top = axes[0].secondary_xaxis("top", functions=(lambda c: c / per_us, lambda u: u * per_us))
        top.set_xlabel("µs")
        # in the order a full draw paints them, so a repaint gives the same pixels
        self._moving = [top]
        for ax, v in zip(axes, self.variants):
            run = cmp.runs[v]
            self._rows[v] = GanttRows(ax, engine_tracks(run.op_log["engine"]))
            # commands per tile do not depend on the calibration or the sizes: a static title
            ax.set_title(f"{v}: {len(run.command_bytes_per_tile)} commands per tile", loc="left", fontsize=10)
            self._moving += [*self._rows[v].collections, ax.xaxis, *ax.spines.values()]
        axes[-1].set_xlabel("cycles")
        fig.legend(handles=[Patch(color=plots.STAGE_COLORS[k], label=k) for k in STAGE_NAMES],
                   loc="outside right upper", fontsize=8, frameon=False)
        self._title = fig.suptitle("", x=0.01, ha="left", fontsize=10)
        self._moving.append(self._title)
        self.figure = fig

    def _render(self) -> None:
        """Move the figure's artists to the new comparison and refresh the widgets (numbers first)."""
        if self.draw:
            if self.figure is None:
                self._build_figure()
            self._update_artists()
        if self._widgets:
            self._widgets["summary"].value = self.summary_html()
            if self.draw:
                self._widgets["figure"].value = self._picture()
        self._show_message()

    def _update_artists(self) -> None:
        cmp = self.comparison
        tiles = min(self.gantt_tiles, next(iter(cmp.runs.values())).n_tiles)
        hi = max(plots.tile_window(cmp.runs[v].op_log, range(tiles))[1] for v in self.variants)
        for v in self.variants:
            self._rows[v].show(cmp.runs[v].op_log, (0, hi))
        self._title.set_text(f"{self.setting_text()}: first {tiles} tiles")

    def _picture(self) -> bytes:
        """Paint the figure and return it as a PNG; records ``draw`` and ``png`` in :attr:`timings`."""
        t0 = time.perf_counter()
        self._paint()
        t1 = time.perf_counter()
        buf = io.BytesIO()
        rgb = np.asarray(self.figure.canvas.buffer_rgba())[..., :3]
        # fast compression: each PNG lives for one move
        PIL.Image.fromarray(rgb).save(buf, "PNG", compress_level=1)
        self.timings.update(draw=t1 - t0, png=time.perf_counter() - t1)
        return buf.getvalue()

    def _paint(self) -> None:
        """Paint the figure into its canvas: the static background, then only what moves.

        The first paint lays the figure out once, with real labels, and keeps
        that layout; it then paints everything but the moving artists and
        keeps the pixels. Every paint restores those pixels and draws the
        moving artists over them. A plain ``figure.savefig`` still draws
        everything: the artists are only marked animated while the
        background is painted.
        """
        canvas = self.figure.canvas
        if self._background is None:
            canvas.draw()
            self.figure.set_layout_engine("none")
            for a in self._moving:
                a.set_animated(True)
            canvas.draw()
            for a in self._moving:
                a.set_animated(False)
            self._background = canvas.copy_from_bbox(self.figure.bbox)
        canvas.restore_region(self._background)
        renderer = canvas.get_renderer()
        for a in self._moving:
            a.draw(renderer)

    # --- the widgets ---------------------------------------------------------------------------
    def _show_message(self) -> None:
        if self._widgets:
            self._widgets["message"].value = self.message_html()

    def _show_status(self, busy: bool) -> None:
        if self._widgets:
            self._widgets["status"].value = "<i style='color:#666'>simulating…</i>" if busy else ""

    def _sync_controls(self, names: Any) -> None:
        """Move the named controls to :attr:`values` without asking for another simulation."""
        sync_controls(self, names)

    def _on_change(self, name: str, change: dict[str, Any]) -> None:
        if not self._quiet:
            self.request(**{name: change["new"]})

    def widget(self):
        """Build (once) and return the ipywidgets box; needs ``ipywidgets`` (the ``lab`` extra).

        Controls ask for a simulation with :meth:`request` when they are let
        go (``continuous_update=False``), so a drag is one simulation.
        """
        if self._box is not None:
            return self._box
        import ipywidgets as W

        v = self.values
        style = {"description_width": "90px"}
        lay = W.Layout(width="420px")
        w = {
            "fixed": W.IntSlider(value=int(v["fixed"]), min=0, max=max(200, int(v["fixed"])), step=1,
                                 description="FIXED", continuous_update=False, style=style, layout=lay),
            "r": W.FloatSlider(value=float(v["r"]), min=0.0, max=max(1.0, float(v["r"])), step=0.0125,
                               readout_format=".4f", description="R", continuous_update=False, style=style,
                               layout=lay),
            "tile": W.Dropdown(options=sorted({*self.TILES, int(v["tile"])}), value=int(v["tile"]),
                               description="tile", style=style),
            "kv_len": W.Dropdown(options=sorted({*self.KV_LENS, int(v["kv_len"])}), value=int(v["kv_len"]),
                                 description="kv length", style=style),
            "group": W.IntSlider(value=int(v["group"]), min=1, max=max(32, int(v["group"])), description="group",
                                 continuous_update=False, style=style, layout=lay),
        }
        for name, ctl in w.items():
            ctl.add_class(f"kbwork-{name.replace('_', '-')}")
            ctl.observe(lambda ch, name=name: self._on_change(name, ch), names="value")
        parts = {"summary": W.HTML(), "message": W.HTML(), "status": W.HTML()}
        if self.draw:
            parts["figure"] = W.Image(format="png", layout=W.Layout(max_width="100%", height="auto"))
        for name, part in parts.items():
            part.add_class(f"kbwork-{name}")
        self._widgets = dict(w, **parts)
        self._box = W.VBox([W.HBox([W.VBox([w["fixed"], w["r"], w["group"]]),
                                    W.VBox([w["tile"], w["kv_len"], parts["status"]])]),
                            parts["message"], parts["summary"], *([parts["figure"]] if self.draw else [])])
        self._box.add_class("kbwork-panel")
        with self._lock:
            self._render()
        return self._box

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.widget())
