"""Plots of a model's decode step (DESIGN.md §15): tokens/s against context or batch with the physical bound,
what ping-pong gains over serial, and one KV-head task when PEs share a channel.

Every function takes DataFrames (:func:`kbwork.model.sweep` rows, :func:`kbwork.model.per_head_contention`
rows) and returns the Axes or Figure it drew on, like the rest of :mod:`kbwork.plots`. A case's colour is
its variant's (``kbwork.plots.VARIANT_COLORS``) and so is its marker (:data:`VARIANT_MARKERS`), the GPU alone
is black; the serial schedule is a solid line, ping-pong a dashed one. A point whose weights and KV cache do
not fit where they are placed (a sweep row's ``fits`` is False; DESIGN.md §15) is drawn hollow, and the
legend says so. The physical bound of :mod:`kbwork.model.bounds` is a thick pale line behind
the cases, one per bound a case is held to (the GPU alone; the device under the serial schedule; the
device under any schedule), so how far each point sits below it reads off the log axis. Artists the tests
look for carry a ``gid``: ``case:<label>`` and ``bound:<kind>`` (``bound:host+ahbm_serial`` when two bounds
coincide and are drawn as one).
"""

from __future__ import annotations

import textwrap
from typing import Any, Iterable

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, NullFormatter, NullLocator

from ..errors import ValidationError
from ..model.bounds import BOUND_KINDS, bound_kind_of, physical_bound
from ..model.device import DEVICE_V1, load_device
from ..model.files import load_host, load_model
from ..model.sweeps import setup_of
from .checks import _check_ax
from .style import VALUE_WORDS, VARIANT_COLORS, _variant_colors

#: The GPU alone's colour.
HOST_COLOR = "#000000"
#: Each bound's colour and line style (drawn thick and pale, behind the cases).
BOUND_STYLE = {"host": ("#555555", (0, (1, 1.5))), "ahbm_serial": ("#AA3377", "-"), "ahbm": ("#AA3377", (0, (4, 2)))}
#: Each bound's marker where it is drawn point by point (against the batch: a batch is a whole number).
BOUND_MARKERS = {"host": "D", "ahbm_serial": "o", "ahbm": "s"}
#: Each bound's name and formula, for legends (W: every weight once; KV: every layer's K and V; bw: peak).
BOUND_NAMES = {"host": "H200 alone", "ahbm_serial": "AHBM serial", "ahbm": "AHBM overlapped"}
BOUND_FORMULAS = {"host": "(weights + KV) / host bw", "ahbm_serial": "weights / host bw + KV / device bw",
                  "ahbm": "max(weights / host bw, KV / device bw)"}
#: The x axes the tokens/s plots know, in words.
X_WORDS = {"context": "context (tokens, log scale)", "batch": "batch (sequences, log scale)"}
#: Each variant's marker, so lines that fall on each other stay told apart (any other variant: a circle).
VARIANT_MARKERS = {"opt2": "o", "opt3": "^", "a1": "v"}
#: The legend's words for a hollow point.
HOLLOW_LABEL = "hollow: does not fit (weights + KV cache over the HBM they are placed in)"
_NEED = ("model", "batch", "context", "variant", "placement", "schedule", "tokens_per_s")
#: The host and device keys the physical bound depends on (``pes`` too: it is checked against
#: ``hbm_channels``); as columns of a sweep, one value each is applied over the sweep's host and device.
_BOUND_HOST_KEYS = ("peak_tflops_bf16", "hbm_tb_s")
_BOUND_DEVICE_KEYS = ("clock_ghz", "pes", "hbm_channels", "channel_bytes_per_cycle")


def case_label(variant: str, placement: str, schedule: str) -> str:
    """A case in words: ``"opt2 on AHBM, serial"``, ``"opt2 on AHBM, ping-pong"``, ``"H200 alone"``."""
    if placement == "host":
        return "H200 alone"
    return f"{variant} on AHBM, {schedule.replace('_', '-')}"


def setup_text(host: Any = "h200", device: Any = DEVICE_V1) -> str:
    """The device and host in a few words, for a title: ``"AHBM 96 PEs on 96 channels x 40 B/cycle
    (4.8 TB/s) · host h200 (4.8 TB/s, 989 TFLOP/s)"``."""
    h, d = load_host(host), load_device(device)
    bw = d.hbm_channels * d.channel_bytes_per_cycle * d.clock_hz / 1e12
    return (f"AHBM {d.pes} PEs on {d.hbm_channels} channels x {d.channel_bytes_per_cycle:g} B/cycle "
            f"({bw:.3g} TB/s) · host {h.name} ({h.hbm_tb_s:g} TB/s, {h.peak_tflops_bf16:g} TFLOP/s)")


def context_label(c: float) -> str:
    """``1024`` -> ``"1k"``, ``131072`` -> ``"128k"``, ``1536`` -> ``"1.5k"``, ``500`` -> ``"500"``."""
    if c >= 1024:
        k = c / 1024
        return f"{k:g}k" if k == round(k, 1) else f"{k:.1f}k"
    return f"{c:g}"


def _check_sweep(sweep: Any, where: str) -> pd.DataFrame:
    if not isinstance(sweep, pd.DataFrame) or sweep.empty or not set(_NEED) <= set(sweep.columns):
        raise ValidationError(f"{where}: expected a non-empty model.sweep() DataFrame with columns "
                              f"{', '.join(_NEED)}.")
    return sweep


def _one(sweep: pd.DataFrame, col: str, where: str, fix: str) -> Any:
    vals = list(dict.fromkeys(sweep[col]))
    if len(vals) != 1:
        raise ValidationError(f"{where}: the rows hold {len(vals)} values of {col!r} ({vals}); {fix}")
    return vals[0]


def _setup(sweep: pd.DataFrame, host: Any, device: Any, where: str, skip: tuple[str, ...] = ()) -> tuple[Any, Any]:
    """The host and device whose bound is drawn: those given, else those the sweep records in its ``attrs``,
    else ``h200`` and ``ahbm-device-v1`` (a frame built by hand, read from a CSV, or a concat of sweeps on
    different setups records none), with the swept bound keys applied (one value each; a column in ``skip``
    is left to each panel)."""
    h, d = setup_of(sweep, host, device, where)
    fix = "the bound differs between them; select one first."
    host_keys = {k: _one(sweep, k, where, fix) for k in _BOUND_HOST_KEYS if k in sweep.columns and k not in skip}
    dev_keys = {k: _one(sweep, k, where, fix) for k in _BOUND_DEVICE_KEYS if k in sweep.columns and k not in skip}
    return (h.replace(**host_keys) if host_keys else h), load_device(d, **dev_keys)


def _log2_x(ax: plt.Axes, x: str, values: Iterable[float]) -> None:
    vals = sorted(set(float(v) for v in values))
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(vals))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _p: context_label(v) if x == "context" else f"{v:g}"))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlabel(X_WORDS[x])


def _log_y(ax: plt.Axes) -> None:
    """A log y axis with plain numbers at 1, 2 and 5 of every decade (``40``, ``200``, ``1,000``)."""
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _p: f"{v:,.0f}" if v >= 1 else f"{v:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())


def _case_style(variant: str, placement: str, schedule: str, colors: dict[str, str]) -> dict[str, Any]:
    if placement == "host":
        return dict(color=HOST_COLOR, marker="D", linestyle="-", linewidth=1.6, markersize=5)
    dashed = schedule != "serial"
    # opt3's triangles a size up, so they show around a1's where the two lines lie on each other
    return dict(color=colors.get(variant), marker="s" if dashed else VARIANT_MARKERS.get(variant, "o"),
                linestyle="--" if dashed else "-", linewidth=1.4,
                markersize=6 if dashed else 7.5 if variant == "opt3" else 5)


def _fits(frame: pd.DataFrame) -> pd.Series:
    """Each row's ``fits`` (True where the frame has no such column: rows from before capacity was counted)."""
    return frame["fits"].astype(bool) if "fits" in frame.columns else pd.Series(True, index=frame.index)


def plot_fitting(ax: plt.Axes, xs: np.ndarray, ys: np.ndarray, fits: np.ndarray, **style: Any) -> Any:
    """One line through every point, its markers filled where ``fits`` and hollow (white inside) where not.

    Returns:
        The line (the legend's handle).
    """
    fits = np.asarray(fits, bool)
    line, = ax.plot(xs, ys, markevery=[i for i in range(len(xs)) if fits[i]], **style)
    if not fits.all():
        keep = {k: v for k, v in style.items() if k in ("color", "marker", "markersize", "zorder")}
        ax.plot(np.asarray(xs)[~fits], np.asarray(ys)[~fits], linestyle="none", markerfacecolor="white",
                gid=f"{style.get('gid', '')}:hollow", **keep)
    return line


def add_hollow_entry(ax_or_handles: Any, any_hollow: bool) -> list[Any]:
    """The legend handles of ``ax_or_handles`` (an Axes or a list), with one for :data:`HOLLOW_LABEL` when
    ``any_hollow``."""
    from matplotlib.lines import Line2D

    handles = (list(ax_or_handles.get_legend_handles_labels()[0]) if hasattr(ax_or_handles, "get_legend_handles_labels")
               else list(ax_or_handles))
    if any_hollow:
        handles.append(Line2D([], [], color="#444444", marker="o", markerfacecolor="white", linestyle="none",
                              label=HOLLOW_LABEL))
    return handles


def _bound_curves(model: str, x: str, xs: np.ndarray, other: int, kinds: list[str], host: Any,
                  device: Any) -> dict[str, np.ndarray]:
    """The most tokens/s of each bound kind at every x (``other`` is the batch, or the context)."""
    out = {k: np.empty(len(xs)) for k in kinds}
    m, h, d = load_model(model), load_host(host), load_device(device)   # read the files once
    for i, v in enumerate(xs):
        batch, context = (other, int(v)) if x == "context" else (int(v), other)
        b = physical_bound(m, [context] * batch, host=h, device=d)
        for k in kinds:
            out[k][i] = b.tokens_per_s(k)
    return out


def tokens_per_s(sweep: pd.DataFrame, x: str = "context", *, ax: plt.Axes | None = None, host: Any = None,
                 device: Any = None, bounds: bool = True, legend: bool = True,
                 title: str | None = None) -> plt.Axes:
    """Tokens per second of every case against ``x`` (``"context"`` or ``"batch"``), with the physical bounds.

    ``sweep`` is :func:`kbwork.model.sweep` rows (or the same columns) of one model at one value of the
    other axis: one line per case (variant, placement, schedule), the GPU alone in black, ping-pong
    dashed. ``bounds=True`` draws, behind them, the most tokens/s each case's placement and schedule
    allow physically (:func:`kbwork.model.physical_bound` at the sweep's host and device; every sequence at
    the row's context). ``device`` and ``host`` default to the ones the sweep records in its ``attrs``
    (:func:`kbwork.model.sweep` does; a frame that records none is drawn at ``ahbm-device-v1`` and
    ``h200``), with a swept bound key
    (``hbm_tb_s``, ``peak_tflops_bf16``, ``clock_ghz``, ``pes``, ``hbm_channels``,
    ``channel_bytes_per_cycle``: one value in the rows) applied over them; given, they are used instead:

    * H200 alone: ``batch / max((weight + KV bytes) / host bandwidth, GEMM FLOPs / host peak)``;
    * AHBM, serial: ``batch / (max(weight bytes / host bandwidth, GEMM FLOPs / host peak)
      + KV bytes / device bandwidth)``;
    * AHBM, any schedule (drawn when a ping-pong case is): ``batch / max(that host term, KV bytes /
      device bandwidth)``;

    with device bandwidth ``hbm_channels · channel_bytes_per_cycle · clock``, weight bytes every weight
    once and KV bytes every sequence's K and V in every layer. Two bounds that coincide (the H200 alone
    and the AHBM serial one, when both sides stream at the same bandwidth) are one line with both names.

    Returns:
        The Axes: x on a log2 scale with a tick at every swept value (contexts as ``1k`` ... ``128k``),
        tokens/s on a log scale.

    Raises:
        ValidationError: a bad ``x``, a frame without the sweep's columns, rows of several models, of
            several values of the other axis or of a swept bound key (select one first).
        ConfigError: a bad host or device.
    """
    where = "plots.tokens_per_s"
    _check_ax(ax, where)
    if x not in X_WORDS:
        raise ValidationError(f"{where}: x={x!r}; use 'context' or 'batch'.")
    sweep = _check_sweep(sweep, where)
    other_col = "batch" if x == "context" else "context"
    model = _one(sweep, "model", where, "select one, e.g. sweep[sweep.model == 'llama-3-8b'].")
    other = int(_one(sweep, other_col, where, f"select one, e.g. sweep[sweep.{other_col} == "
                                              f"{int(sweep[other_col].iloc[0])}]."))
    if bounds:
        host, device = _setup(sweep, host, device, where)
    if ax is None:
        _, ax = plt.subplots(figsize=(7.5, 4.6), layout="constrained")
    keys = list(dict.fromkeys(zip(sweep["placement"], sweep["variant"], sweep["schedule"])))
    order = {v: i for i, v in enumerate(VARIANT_COLORS)}          # opt2, opt3, a1, then any other
    keys.sort(key=lambda k: (k[0] == "host", k[2] != "serial", order.get(k[1], len(order)), k[1]))
    colors = _variant_colors(sorted({v for p, v, _ in keys if p != "host"}))
    every_x = sorted(set(sweep[x]))
    for placement, variant, schedule in keys:
        g = sweep[(sweep.placement == placement) & (sweep.variant == variant) & (sweep.schedule == schedule)]
        # on every swept x, NaN where this case did not run: the line breaks there instead of skipping it
        y = g.groupby(x)["tokens_per_s"].first().reindex(every_x)
        fit = _fits(g).groupby(g[x]).first().reindex(every_x).fillna(True).to_numpy(bool)
        label = case_label(variant, placement, schedule)
        plot_fitting(ax, np.asarray(every_x, float), y.to_numpy(float), fit, label=label, gid=f"case:{label}",
                     zorder=3, **_case_style(variant, placement, schedule, colors))
    if bounds:
        kinds = [k for k in BOUND_KINDS if k in {bound_kind_of(p, s) for p, _, s in keys}]
        lo, hi = float(sweep[x].min()), float(sweep[x].max())
        # contexts: a smooth curve; batches: a point at every whole batch, nothing drawn between them
        xs = (np.unique(np.geomspace(lo, hi, 48).round().astype(int)) if x == "context"
              else np.arange(int(lo), int(hi) + 1))
        curves = _bound_curves(model, x, xs, other, kinds, host, device)
        drawn: list[list[str]] = []
        for k in kinds:
            same = next((d for d in drawn if np.allclose(curves[d[0]], curves[k], rtol=1e-9)), None)
            if same is not None:
                same.append(k)
            else:
                drawn.append([k])
        for group in drawn:
            color, style = BOUND_STYLE[group[0]]
            label = ("bound, " + " = ".join(BOUND_NAMES[k] for k in group) + ": "
                     + " = ".join(BOUND_FORMULAS[k] for k in group))
            line = (dict(linestyle=style, linewidth=3.2) if x == "context" else
                    dict(linestyle="none", marker=BOUND_MARKERS[group[0]], markersize=3.5))
            ax.plot(xs, curves[group[0]], color=color, alpha=0.45, zorder=2, label=label,
                    gid="bound:" + "+".join(group), **line)
    _log2_x(ax, x, sweep[x])
    _log_y(ax)
    ax.set_ylabel("tokens/s (log scale)")
    ax.grid(True, which="major", alpha=0.3)
    ax.grid(True, which="minor", axis="y", alpha=0.12)
    fixed = f"batch {other}" if x == "context" else f"context {context_label(other)}"
    ax.set_title(title if title is not None else f"{model}, {fixed}: tokens/s against {x}", loc="left",
                 fontsize=10)
    ax.hollow = not _fits(sweep).all()
    if legend:
        ax.legend(handles=add_hollow_entry(ax, ax.hollow), fontsize=7.5, loc="best")
    return ax


def tokens_per_s_grid(sweep: pd.DataFrame, x: str = "context", *, facet: str = "model", host: Any = None,
                      device: Any = None, bounds: bool = True, title: str | None = None) -> plt.Figure:
    """:func:`tokens_per_s` once per value of ``facet`` (default: one panel per model), side by side, with one
    legend below them and a title naming the device and the host (:func:`setup_text`); ``host`` and
    ``device`` as in :func:`tokens_per_s` (by default the sweep's own).

    Returns:
        The Figure.

    Raises:
        ValidationError: as :func:`tokens_per_s`, or ``facet`` not a column.
        ConfigError: a bad host or device.
    """
    where = "plots.tokens_per_s_grid"
    sweep = _check_sweep(sweep, where)
    if facet not in sweep.columns:
        raise ValidationError(f"plots.tokens_per_s_grid: no column {facet!r} to facet by.")
    if bounds or title is None:
        # the facet's own values (a swept channel_bytes_per_cycle, say) are applied panel by panel
        host, device = _setup(sweep, host, device, where, skip=(facet,))
    values = list(dict.fromkeys(sweep[facet]))
    fig, axes = plt.subplots(1, len(values), figsize=(6.2 * len(values), 4.9), layout="constrained",
                             squeeze=False)
    handles: dict[str, Any] = {}
    for ax, v in zip(axes[0], values):
        part = sweep[sweep[facet] == v]
        fixed = (f"batch {int(_one(part, 'batch', where, ''))}" if x == "context" else
                 f"context {context_label(_one(part, 'context', where, ''))}") \
            if part[("batch" if x == "context" else "context")].nunique() == 1 else ""
        # the panel's title names what differs between panels; the figure's title says what is drawn
        tokens_per_s(part, x, ax=ax, host=host, device=device, bounds=bounds, legend=False,
                     title=f"{_words(v)}, {fixed}" if fixed else str(_words(v)))
        for h, lab in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(lab, h)
    for h in add_hollow_entry([], any(getattr(a, "hollow", False) for a in axes[0])):
        handles.setdefault(h.get_label(), h)
    width_in = fig.get_figwidth()
    # as many legend columns and title characters as the width holds: the bound labels are long, and one
    # panel alone is narrow (a legend of three columns or a one-line title ran off both edges)
    fig.legend(list(handles.values()), list(handles), loc="outside lower center",
               ncols=max(1, min(3, len(handles), int(width_in // 4.4))), fontsize=8, frameon=False)
    text = title if title is not None else f"Decode tokens/s against {x}: {setup_text(host, device)}"
    fig.suptitle(textwrap.fill(text, width=int(width_in * 12.5)), x=0.01, ha="left", fontsize=10.5)
    return fig


def ping_pong_gain(sweep: pd.DataFrame, x: str = "batch", *, ax: plt.Axes | None = None,
                   title: str | None = None) -> plt.Axes:
    """Ping-pong's tokens/s over the serial schedule's, per model and variant, against ``x``.

    ``sweep`` holds AHBM rows under both schedules at one value of the other axis (host rows are ignored);
    above the dotted line at 1 ping-pong is faster (it overlaps one half's attention with the other's
    GEMMs but reads the weights once per half).

    Returns:
        The Axes (x on a log2 scale, the ratio linear).

    Raises:
        ValidationError: a bad ``x``, no (model, variant, x) with both schedules, or several values of the
            other axis.
    """
    where = "plots.ping_pong_gain"
    _check_ax(ax, where)
    if x not in X_WORDS:
        raise ValidationError(f"{where}: x={x!r}; use 'context' or 'batch'.")
    sweep = _check_sweep(sweep, where)
    dev = sweep[sweep.placement == "ahbm"]
    other_col = "batch" if x == "context" else "context"
    other = _one(dev, other_col, where, "select one first.") if not dev.empty else None
    wide = dev.pivot_table(index=["model", "variant", x], columns="schedule", values="tokens_per_s",
                           aggfunc="first")
    if not {"serial", "ping_pong"} <= set(wide.columns) or wide[["serial", "ping_pong"]].dropna().empty:
        raise ValidationError(f"{where}: no point has both schedules; sweep with "
                              f"schedules=('serial', 'ping_pong').")
    gain = (wide["ping_pong"] / wide["serial"]).dropna()
    # a ratio is hollow when either of its steps does not fit
    fit = dev.assign(_fit=_fits(dev)).groupby(["model", "variant", x])["_fit"].all()
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 4), layout="constrained")
    models = [m for m in dict.fromkeys(dev["model"]) if m in set(gain.index.get_level_values("model"))]
    colors = _variant_colors(sorted(set(gain.index.get_level_values("variant"))))
    styles, markers = ["-", "--", ":", "-."], ["o", "s", "^", "D"]
    for i, m in enumerate(models):
        for v in dict.fromkeys(gain.xs(m, level="model").index.get_level_values("variant")):
            g = gain.xs((m, v), level=("model", "variant")).sort_index()
            f = fit.xs((m, v), level=("model", "variant")).reindex(g.index).to_numpy(bool)
            plot_fitting(ax, g.index.to_numpy(float), g.to_numpy(), f, marker=markers[i % len(markers)],
                         linestyle=styles[i % len(styles)],
                         color=colors.get(v), label=f"{m}, {v}", gid=f"gain:{m}:{v}")
    ax.axhline(1.0, color="black", linestyle=":", linewidth=1)
    _log2_x(ax, x, gain.index.get_level_values(x))
    ax.set_ylabel("tokens/s, ping-pong / serial  (> 1: ping-pong faster)")
    ax.grid(True, alpha=0.3)
    fixed = f"batch {int(other)}" if x == "context" else f"context {context_label(other)}"
    ax.set_title(title if title is not None else f"What ping-pong gains over serial on AHBM, {fixed}",
                 loc="left", fontsize=10)
    ax.hollow = not fit.all()
    ax.legend(handles=add_hollow_entry(ax, ax.hollow), fontsize=8)
    return ax


def variant_ratio(sweep: pd.DataFrame, x: str = "context", *, baseline: str = "opt2", schedule: str = "serial",
                  ax: plt.Axes | None = None, title: str | None = None) -> plt.Axes:
    """Every other variant's tokens/s over ``baseline``'s on the AHBM device, per model, against ``x``.

    The variants differ by a few percent, which a log tokens/s axis hides; this plot shows it. Only rows
    of ``schedule`` on the device count, and only the x values where both variants ran.

    Returns:
        The Axes (x on a log2 scale, the ratio linear, a dotted tie at 1).

    Raises:
        ValidationError: a bad ``x``, ``baseline`` not in the rows, no other variant, several values of
            the other axis.
    """
    where = "plots.variant_ratio"
    _check_ax(ax, where)
    if x not in X_WORDS:
        raise ValidationError(f"{where}: x={x!r}; use 'context' or 'batch'.")
    sweep = _check_sweep(sweep, where)
    dev = sweep[(sweep.placement == "ahbm") & (sweep.schedule == schedule)]
    other_col = "batch" if x == "context" else "context"
    if baseline not in set(dev["variant"]) or dev["variant"].nunique() < 2:
        raise ValidationError(f"{where}: need {baseline!r} and another variant on the device under {schedule!r}, "
                              f"got {sorted(set(dev['variant']))}.")
    other = _one(dev, other_col, where, "select one first.")
    wide = dev.pivot_table(index=["model", x], columns="variant", values="tokens_per_s", aggfunc="first")
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 4), layout="constrained")
    variants = [v for v in wide.columns if v != baseline]
    colors = _variant_colors(sorted(wide.columns))
    fit = dev.assign(_fit=_fits(dev)).groupby(["model", x, "variant"])["_fit"].all().unstack("variant")
    styles, markers = ["-", "--", ":", "-."], ["o", "s", "^", "D"]
    xs_all = []
    any_hollow = False
    for i, m in enumerate(dict.fromkeys(dev["model"])):
        w = wide.xs(m, level="model")
        for v in variants:
            r = (w[v] / w[baseline]).dropna().sort_index()
            xs_all += list(r.index)
            fm = fit.xs(m, level="model")
            f = (fm[v] & fm[baseline]).reindex(r.index).fillna(True).to_numpy(bool)
            any_hollow = any_hollow or not f.all()
            # the marker is the variant's, the line style the model's: two ratios that coincide stay apart
            plot_fitting(ax, r.index.to_numpy(float), r.to_numpy(), f, marker=VARIANT_MARKERS.get(v, markers[i]),
                         linestyle=styles[i % len(styles)], markersize=7 - 2 * variants.index(v) % 4,
                         color=colors[v], label=f"{m}: {v} / {baseline}", gid=f"variant:{m}:{v}")
    ax.axhline(1.0, color="black", linestyle=":", linewidth=1)
    _log2_x(ax, x, xs_all)
    lo, hi = ax.get_ylim()
    ax.set_ylim(min(lo, 0.99), max(hi, 1.005) + 0.05 * (hi - lo))
    ax.set_ylabel(f"tokens/s over {baseline}'s  (< 1: {baseline} faster)")
    ax.grid(True, alpha=0.3)
    fixed = f"batch {int(other)}" if x == "context" else f"context {context_label(other)}"
    ax.set_title(title if title is not None else f"The decode variants on AHBM, {schedule.replace('_', '-')}, "
                                                 f"{fixed}", loc="left", fontsize=10)
    ax.hollow = any_hollow
    ax.legend(handles=add_hollow_entry(ax, any_hollow), fontsize=8)
    return ax


def _crossings(ks: np.ndarray, ratio: np.ndarray) -> list[float]:
    """The k where ``ratio - 1`` changes sign, linearly interpolated between neighbours."""
    out = []
    d = ratio - 1.0
    for i in range(len(ks) - 1):
        if d[i] == 0:
            out.append(float(ks[i]))
        elif d[i] * d[i + 1] < 0:
            out.append(float(ks[i] + (ks[i + 1] - ks[i]) * d[i] / (d[i] - d[i + 1])))
    if len(d) and d[-1] == 0:
        out.append(float(ks[-1]))
    return out


def contention(frame: pd.DataFrame, *, by: str | None = "hazard_policy", baseline: str = "opt2",
               other: str = "opt3", title: str | None = None) -> plt.Figure:
    """The per-head verdict when PEs share a channel: ``other`` / ``baseline`` cycles against PEs per channel.

    ``frame`` is :func:`kbwork.model.per_head_contention` rows, optionally with a ``by`` column (e.g. the
    hazard policy of each call) drawn as one line each. Left: the cycle ratio, with the tie at 1; where a
    line crosses it the verdict flips, and the crossing is marked; where none does, the panel says which
    variant stays faster over the whole range. Right: one task's cycles for both variants beside the
    channel bound (the channel's KV bytes over its bandwidth).

    Returns:
        The Figure; :attr:`crossings` on it is a dict ``group -> [k, ...]`` where the ratio crosses 1.

    Raises:
        ValidationError: columns missing, or ``baseline`` / ``other`` not in the frame.
    """
    where = "plots.contention"
    need = {"pes_per_channel", "variant", "cycles", "channel_bound_cycles"}
    if not isinstance(frame, pd.DataFrame) or frame.empty or not need <= set(frame.columns):
        raise ValidationError(f"{where}: expected a non-empty model.per_head_contention() DataFrame with columns "
                              f"{', '.join(sorted(need))}.")
    for v in (baseline, other):
        if v not in set(frame["variant"]):
            raise ValidationError(f"{where}: variant {v!r} is not in the frame ({sorted(set(frame.variant))}).")
    if by is not None and by not in frame.columns:
        raise ValidationError(f"{where}: no column {by!r}; pass by=None for one line.")
    groups = list(dict.fromkeys(frame[by])) if by else [None]
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 4.6), layout="constrained")
    styles = ["-", "--", ":", "-."]
    group_markers = ["o", "x", "+", "1"]
    colors = _variant_colors([baseline, other])
    ratio_colors = ["#332288", "#44AA99", "#882255", "#999933"]
    found: dict[Any, list[float]] = {}
    ks_all = sorted(set(frame["pes_per_channel"]))
    for i, g in enumerate(groups):
        part = frame if g is None else frame[frame[by] == g]
        wide = part.pivot_table(index="pes_per_channel", columns="variant", values="cycles", aggfunc="first")
        ratio = (wide[other] / wide[baseline]).dropna().sort_index()
        ks, r = ratio.index.to_numpy(float), ratio.to_numpy(float)
        name = "" if g is None else _words(g)
        found[g] = _crossings(ks, r)
        if found[g]:
            verdict = "flips at k = " + ", ".join(f"{c:.2f}" for c in found[g])
        else:
            verdict = f"{other if r[0] < 1 else baseline} faster at every k, no crossing"
        ax.plot(ks, r, marker="o", linestyle=styles[i % len(styles)], color=ratio_colors[i % len(ratio_colors)],
                label=(f"{name}: " if name else "") + verdict, gid=f"ratio:{g}")
        for k, y in zip(ks, r):
            ax.annotate(f"{y:.3f}", (k, y), textcoords="offset points", xytext=(0, 6), ha="center", fontsize=7)
        for c in found[g]:
            ax.axvline(c, color="#CC3311", linewidth=1, linestyle="--")
            ax.annotate(f"verdict flips at k = {c:.2f}", (c, 1), textcoords="offset points", xytext=(4, -12),
                        fontsize=8, color="#CC3311")
        for v in (baseline, other):
            c = wide[v].dropna().sort_index()
            # a marker per group as well as a line style: two groups' lines may lie on each other exactly
            ax2.plot(c.index.to_numpy(float), c.to_numpy(float), marker=group_markers[i % len(group_markers)],
                     markersize=7 if i == 0 else 9, linestyle=styles[i % len(styles)],
                     color=colors[v], label=f"{v}" + (f", {name}" if name else ""))
    ax.axhline(1.0, color="black", linestyle=":", linewidth=1)
    ax.set_ylabel(f"cycles, {other} / {baseline}  (< 1: {other} faster)")
    lo, hi = ax.get_ylim()
    ax.set_ylim(min(lo, 0.98), max(hi, 1.02) + 0.04 * (hi - lo))
    bound = frame.groupby("pes_per_channel")["channel_bound_cycles"].first().sort_index()
    ax2.plot(bound.index.to_numpy(float), bound.to_numpy(float), color="#555555", linewidth=3.2, alpha=0.45,
             label="channel bound: k tasks' KV bytes / channel bandwidth", gid="bound:channel")
    ax2.set_ylabel("cycles of one task (all k at once)")
    ax2.yaxis.set_major_formatter(FuncFormatter(lambda v, _p: f"{v / 1e6:g}M"))
    for a in (ax, ax2):
        a.set_xticks(ks_all)
        a.set_xlabel("PEs sharing one HBM channel (k)")
        a.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="lower right", title=f"{other} / {baseline}", title_fontsize=8)
    ax2.legend(fontsize=8, loc="upper left")
    ax.set_title(f"per-head verdict, k = {ks_all[0]}..{ks_all[-1]}", loc="left", fontsize=10)
    ax2.set_title("one task's cycles and the channel bound", loc="left", fontsize=10)
    if title is not None:
        fig.suptitle(title, x=0.01, ha="left", fontsize=10.5)
    fig.crossings = found
    return fig


def _words(v: Any) -> str:
    return VALUE_WORDS.get(v, str(v)) if isinstance(v, str) else str(v)


__all__ = ["tokens_per_s", "tokens_per_s_grid", "ping_pong_gain", "variant_ratio", "contention", "case_label",
           "setup_text", "context_label", "HOST_COLOR", "BOUND_STYLE", "BOUND_NAMES", "BOUND_FORMULAS",
           "VARIANT_MARKERS", "HOLLOW_LABEL", "plot_fitting"]
