"""The Gantt of a device run: a few PEs, each with its units, and under them the load of the HBM channels
they use (DESIGN.md §14, "Seeing it")."""

from __future__ import annotations

import math
import textwrap
from typing import Any, Mapping, Sequence

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from ..errors import ValidationError
from ..oplog import STAGE_NAMES
from .checks import _check_clock, _check_dpi, _check_flag, _check_hatch, _check_int, _check_window, _is_int
from .gantts import _Drawn, _gantt_handles, _hold_rows, _tensor_base, gantt
from .style import _MOVERS, TENSOR_HATCH, cycle_axis

#: How many PEs :func:`device_gantt` shows when it is not told which.
DEFAULT_PES = 4
#: The colour of a channel's bandwidth line.
CHANNEL_COLOR = "#332288"


def default_pes(run: Any, n: int = DEFAULT_PES) -> list[int]:
    """The PEs worth showing first: the one the critical path runs on, then those sharing a channel with it,
    then the lowest others, ``n`` at most, ascending.

    Raises:
        ValidationError: ``run`` is not a run, or ``n`` is not a positive int.
    """
    from ..analysis.channels import pe_channels, run_of

    run = run_of(run, "default_pes")
    _check_int(n, "n", "default_pes", "how many PEs to show, e.g. 4")
    pes = list(run.pes)
    last = run.last_pe() if hasattr(run, "last_pe") else pes[0]
    uses = {p: pe_channels(run, p) for p in pes}
    mine = uses[last]
    sharing = {p for p in pes if uses[p] & mine}
    ranked = sorted(pes, key=lambda p: (p != last, p not in sharing, p))
    return sorted(ranked[:n])


def _check_pes(run: Any, pes: Any) -> list[int]:
    if pes is None:
        return default_pes(run)
    if isinstance(pes, (int, np.integer)) and not isinstance(pes, bool):
        pes = [pes]
    if not isinstance(pes, Sequence) or isinstance(pes, str) or not pes:
        raise ValidationError(f"device_gantt: pes={pes!r}; pass a non-empty list of PEs (of {run.pes}), or None "
                              f"for a few.")
    # True == 1 and 0 == False to Python: a bool would pass for a PE number
    kind = [p for p in pes if not _is_int(p)]
    if kind:
        raise ValidationError(f"device_gantt: pes={list(pes)!r}; each PE must be an int (not a bool) of {run.pes}, "
                              f"e.g. pes=[0, 1].")
    bad = [p for p in pes if p not in run.pes]
    if bad:
        raise ValidationError(f"device_gantt: PE {bad[0]!r} ran nothing in this run; it ran PEs {run.pes}.")
    twice = [p for p in dict.fromkeys(pes) if list(pes).count(p) > 1]
    if twice:
        raise ValidationError(f"device_gantt: pes={list(pes)!r} lists PE {twice[0]!r} more than once; list each PE "
                              f"once.")
    return sorted(int(p) for p in pes)


def _title(run: Any, shown: list[int], chans: list[int], path_pe: int,
           window: tuple[int, int] | None = None) -> str:
    t = run.topology
    bw = "unconstrained" if math.isinf(t.channel_bytes_per_cycle) else f"{t.channel_bytes_per_cycle:g} B/cycle each"
    which = "all that ran" if len(shown) == len(run.pes) else f"{len(shown)} of the {len(run.pes)} that ran"
    used = (f"; their transfers on HBM channel{'s' if len(chans) > 1 else ''} {', '.join(map(str, chans))} of "
            f"{t.hbm_channels} ({bw})" if chans else "")
    span = (f"Device run of {run.cycles:,} cycles, cycles {window[0]:,} to {window[1]:,} shown" if window is not None
            else f"Device run, {run.cycles:,} cycles")
    return (f"{span}: PE{'s' if len(shown) > 1 else ''} {', '.join(map(str, shown))} "
            f"({which}){used}; critical path on PE {path_pe}")


#: Outlines of the critical path a PE panel draws at full width; beyond, they are drawn thinner, so that a
#: whole run's path reads as a line along the bars rather than a black band over them.
PATH_OUTLINES_FULL = 40


def _thin_path(ax: plt.Axes) -> float:
    """Thin the critical path's outlines and links on ``ax`` when it draws many (see
    :data:`PATH_OUTLINES_FULL`); the outline width used."""
    width = 1.4
    for coll in ax.collections:
        if coll.get_gid() == "critical-path" and len(coll.get_paths()) > PATH_OUTLINES_FULL:
            width = 0.6
            coll.set_linewidth(width)
        elif coll.get_gid() == "critical-path-links" and len(coll.get_segments()) > PATH_OUTLINES_FULL:
            coll.set_linewidth(0.7)
    return width


def merged_holds(op_log: pd.DataFrame, holds: pd.DataFrame, tracks: Sequence[str]) -> pd.DataFrame:
    """``holds`` (``Run.holds()`` of one PE) with the holds that overlap or touch on one Gantt row merged into
    one: each row of the result is one bar, ``cmd`` the first held command of it, ``plan_end`` the earliest
    and ``release`` the latest of the holds it covers, ``holds`` how many."""
    if holds.empty:
        return holds.assign(holds=pd.Series(dtype=int))
    rows = _hold_rows(op_log, holds, tuple(tracks))
    h = holds.assign(_row=rows).sort_values(["_row", "plan_end", "release"], kind="stable")
    out = []
    for _, g in h.groupby("_row", sort=True):
        cur = None
        for cmd, a, b in zip(g["cmd"].to_numpy(), g["plan_end"].to_numpy(), g["release"].to_numpy()):
            if cur is not None and a <= cur[2]:
                cur[2], cur[3] = max(cur[2], b), cur[3] + 1
            else:
                if cur is not None:
                    out.append(cur)
                cur = [cmd, a, b, 1]
        out.append(cur)
    return pd.DataFrame(out, columns=["cmd", "plan_end", "release", "holds"])


def merged_path(path: pd.DataFrame) -> pd.DataFrame:
    """The critical path with each run of consecutive stages on one unit, each starting where the last ended,
    merged into one outline (``engine, start, end, cause``: the first stage's cause, which is the cause of the
    link drawn into it; ``stages`` how many it covers)."""
    if path.empty:
        return path.assign(stages=pd.Series(dtype=int))
    eng = path["engine"].astype(str).to_numpy()
    start, end = path["start"].to_numpy(), path["end"].to_numpy()
    new = np.ones(len(path), bool)
    new[1:] = (eng[1:] != eng[:-1]) | (start[1:] != end[:-1])
    group = np.cumsum(new) - 1
    first = np.flatnonzero(new)
    last = np.append(first[1:] - 1, len(path) - 1)
    return pd.DataFrame({"engine": eng[first], "start": start[first], "end": end[last],
                         "cause": path["cause"].astype(str).to_numpy()[first],
                         "stages": np.bincount(group)})


#: Flow counts the channel strips tell apart: 1, 2, 3 and "4 or more", light to dark.
FLOW_SHADES = {1: "#B8B0E0", 2: "#7A6FC0", 3: "#4B3C9A", 4: "#22155E"}


def _shade(k: int) -> int:
    return min(int(k), max(FLOW_SHADES))


def _draw_channel(ax: plt.Axes, steps: Any, c: int, run: Any, summary: Mapping[str, Any]) -> set[int]:
    """One channel's strip: bytes per cycle in use over time, shaded by how many flows share it, its
    bandwidth dashed. Returns the shades drawn (for the legend)."""
    values = steps["bytes_per_cycle"].to_numpy(np.float64)
    shades = {_shade(k) for k in steps["flows"].to_numpy() if k > 0}
    if len(values):
        edges = np.append(steps["t0"].to_numpy(np.float64), float(steps["t1"].iloc[-1]))
        group = np.array([_shade(k) for k in steps["flows"].to_numpy()])
        for g in sorted(shades):  # one step artist per shade, zero outside its steps
            art = ax.stairs(np.where(group == g, values, 0.0), edges, fill=True, color=FLOW_SHADES[g], linewidth=0)
            art.set_gid(f"channel-load:{c}:{g}")
    bw = run.topology.channel_bytes_per_cycle
    top = bw if math.isfinite(bw) else (float(values.max()) if len(values) else 1.0)
    if math.isfinite(bw):
        ax.axhline(bw, color=CHANNEL_COLOR, linestyle="--", linewidth=0.9)
    ax.set_ylim(0, (top or 1.0) * 1.5)  # room above the bandwidth line for the summary
    ax.set_ylabel(f"ch {c}\nB/cycle", rotation=0, ha="right", va="center", fontsize=9)
    peak = int(summary["peak_flows"])
    ax.text(0.005, 0.96, f"HBM channel {c}: {int(summary['bytes']):,} bytes, busy {100 * summary['busy_fraction']:.0f}% "
                         f"of the run, at most {peak} flow{'' if peak == 1 else 's'} at once",
            transform=ax.transAxes, ha="left", va="top", fontsize=8, color="#222222")
    ax.grid(axis="x", alpha=0.3)
    return shades


def _legend_of(run: Any, rows: Any, hatch: Mapping[str, str] | None, n_holds: int, path: Any) -> _Drawn:
    """What the PE panels show, for one legend: stage kinds, hatched tensors, holds, the path and its links."""
    stages = set(rows["stage"].astype(str).unique())
    movers = rows[rows["stage"].astype(str).isin(_MOVERS)]
    bases = {_tensor_base(str(t)) for t in movers["tensor"].astype(str).unique()}
    causes: tuple[str, ...] = ()
    if path is not None and len(path):
        unit = path["engine"].astype(str).to_numpy()
        moved = np.flatnonzero(unit[1:] != unit[:-1]) + 1  # the links drawn: where the path changes unit
        causes = tuple(dict.fromkeys(path["cause"].astype(str).to_numpy()[moved]))
    return _Drawn(tuple(k for k in STAGE_NAMES if k in stages),
                  tuple((n, pat) for n, pat in (hatch or {}).items() if n in bases), n_holds,
                  0 if path is None else len(path), causes)


def device_gantt(run: Any, pes: Sequence[int] | int | None = None, *, channels: bool = True,
                 window: tuple[int, int] | None = None, holds: bool = True, critical_path: bool = True,
                 hatch: Mapping[str, str] | None = TENSOR_HATCH, clock_ghz: float | None = None,
                 title: str | None = None, dpi: float | None = None) -> plt.Figure:
    """A Gantt of a few PEs of a device run, one panel per PE (its units as rows), and under them one strip
    per HBM channel those PEs' transfers use, drawing the bytes per cycle in use (the exact step function of
    ``analysis.channel_steps``), the channel's bandwidth dashed.

    Args:
        run: a device run (``sim.run_device``), a one-PE run, or anything whose ``.run`` is one.
        pes: the PEs to show (default: up to :data:`DEFAULT_PES`: the PE the critical path runs on, those
            sharing a channel with it, then the lowest others; see :func:`default_pes`).
        channels: draw the channel strips.
        window: ``(start, end)`` cycles to show (the default title then names it).
        holds, critical_path: draw each PE's hazard holds (those that overlap on a row merged into one bar:
            :func:`merged_holds`), and the device's critical path on its PE (back-to-back stages on one unit
            one outline: :func:`merged_path`). Every PE's panel has the same background.
        hatch: as :func:`kbwork.plots.gantt`.
        clock_ghz: the µs axis on top (default: the run's clock).
        title: the figure's title (default: what is shown: cycles, PEs, channels, the critical path's PE).
        dpi: the resolution the figure will be saved at (for the Gantt's density check).

    Returns:
        The Figure. Its Axes, top to bottom: one per PE (gid ``pe:<p>``), then one per channel (gid
        ``channel:<c>``), all sharing the cycle axis.

    Raises:
        ValidationError: not a run, ``pes`` not distinct ints (not bools) of PEs that ran, a bad window,
            ``channels``, ``holds`` or ``critical_path`` not a bool, ``hatch`` not None or a mapping str ->
            matplotlib hatch pattern, or ``clock_ghz`` or ``dpi`` not None or a positive finite real.
            FlowMismatch: ``channels`` on one PE's run of a device whose channels other PEs shared (draw the
            device run).
    """
    from ..analysis.channels import channel_loads, channel_table, pe_channels, run_of, steps_table

    where = "device_gantt"
    run = run_of(run, where)
    shown = _check_pes(run, pes)
    for name, flag in (("channels", channels), ("holds", holds), ("critical_path", critical_path)):
        _check_flag(flag, name, where)
    _check_window(window, where)
    _check_hatch(hatch, where)
    _check_clock(clock_ghz, where)
    _check_dpi(dpi, where)
    path_pe = run.last_pe() if hasattr(run, "last_pe") else run.pes[0]
    # the path ends on path_pe; across an ``after`` link (DESIGN.md §16) it runs on other PEs too: each panel
    # outlines its own PE's stretch of it
    full_path = run.critical_path() if critical_path else None
    path_pes = set(full_path["pe"].tolist()) if full_path is not None else set()
    # the shown PEs' own op_logs, and the loads of the channels they use: a device's whole op_log (every PE's
    # stages) is not built for a few PEs
    logs = {p: run.pe(p).op_log for p in shown}
    tracks = run.units
    chans: list[int] = []
    if channels:
        used = set().union(*(pe_channels(run, p) for p in shown))
        loads = channel_loads(run, where, only=sorted(used))
        steps = steps_table(loads)
        summary = channel_table(loads, run.cycles).set_index("channel")
        chans = sorted(c for c in used if c in summary.index)
    heights = [0.32 * len(tracks) + 0.25] * len(shown) + [0.85] * len(chans)
    fig, axes = plt.subplots(len(heights), 1, sharex=True, layout="constrained",
                             figsize=(13, 1.0 + sum(heights)), gridspec_kw={"height_ratios": heights})
    axes = np.atleast_1d(axes)
    clock = run.topology.clock_ghz if clock_ghz is None else clock_ghz
    path_width = 1.4
    for i, (ax, p) in enumerate(zip(axes, shown)):
        rows = logs[p]
        # on a whole run a hold per command and an outline per critical-path stage cover every bar: holds that
        # overlap on a row are one bar, back-to-back path stages on one unit one outline
        gantt(rows, ax=ax, window=window, clock_ghz=clock if i == 0 else None, legend=False, hatch=hatch,
              holds=merged_holds(rows, run.pe(p).holds(), tracks) if holds else None,
              critical_path=merged_path(full_path[full_path["pe"] == p].reset_index(drop=True))
              if p in path_pes else None, dpi=dpi)
        ax.set_gid(f"pe:{p}")
        path_width = min(path_width, _thin_path(ax))
        ax.set_ylabel(f"PE {p}" + (" (critical path)" if p in path_pes else ""),
                      fontweight="bold", fontsize=9)
    shades: set[int] = set()
    for ax, c in zip(axes[len(shown):], chans):
        shades |= _draw_channel(ax, steps[steps["channel"] == c], c, run, summary.loc[c].to_dict())
        ax.set_gid(f"channel:{c}")
    for ax in axes[:-1]:
        ax.set_xlabel("")
    axes[-1].set_xlabel("cycles")
    cycle_axis(axes[-1].xaxis)
    axes[0].set_xlim(*(window if window is not None else (0, run.cycles * 1.01 or 1)))
    handles = _gantt_handles([_legend_of(run, pd.concat([logs[p] for p in shown], ignore_index=True), hatch,
                                         int(sum(len(run.pe(p).holds()) for p in shown)) if holds else 0,
                                         full_path if path_pes & set(shown) else None)])
    for g in sorted(shades):
        words = f"{g} flow{'s' if g > 1 else ''}" + (" or more" if g == max(FLOW_SHADES) else "")
        handles.append(Patch(color=FLOW_SHADES[g], label=f"channel in use,\n{words}"))
    if chans and math.isfinite(run.topology.channel_bytes_per_cycle):
        handles.append(Line2D([], [], color=CHANNEL_COLOR, linestyle="--", linewidth=0.9, label="channel bandwidth"))
    for h in handles:  # the legend says what the merged marks are
        if isinstance(h, Line2D) and h.get_label().startswith("hazard hold"):
            h.set_label("hazard holds:\nPLAN end → release,\noverlapping ones merged")
        elif isinstance(h, Patch) and h.get_label() == "critical path":
            h.set_label("critical path\n(back-to-back stages\non one unit merged)")
            h.set_linewidth(path_width)
    if handles:
        fig.legend(handles=handles, loc="outside right upper", fontsize=8, frameon=False)
    # wrapped: the window's span makes the default title longer than the panels are wide
    fig.suptitle(title or textwrap.fill(_title(run, shown, chans, path_pe, window), width=150), x=0.01, ha="left",
                 fontsize=10)
    return fig
