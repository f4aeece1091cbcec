"""The HBM channels of a run (DESIGN.md §14, "Seeing it"): what each DMA stage lost to sharing, and how
loaded each channel was, cycle by cycle.

Everything here is read off the op_log, ``run.stage_channels`` and the topology, never the simulator's
internals. :func:`contention` needs only each DMA row: its duration alone on its channel is
``dma_base_cycles + ceil(bytes / min(dma_bytes_per_cycle, channel_bytes_per_cycle))``. The channel load
is reconstructed by the flow rule: a DMA stage moving b > 0 bytes is a flow on its channel from
``start + dma_base_cycles`` to ``end``; while k flows are active each advances ``min(dma rate, channel
rate / k)`` bytes a cycle, and in its last cycle only what it still needs. The rates change only where a
flow joins or leaves, so a channel's load is a short list of *pieces*, each a run of cycles with the
same k. Counts are exact: bytes are kept in whole units of ``1 / scale``, ``scale`` a multiple of the
channel rate's denominator and of every k seen, so every rate is a whole number of units.

Before anything is reported, every flow is checked against the rule: its bytes must be reached exactly
at its ``end`` given the other flows on its channel. A mismatch (an edited op_log, or one PE's run of a
device, ``run.pe(p)``, which does not hold the other PEs' transfers) is a :class:`FlowMismatch`.
"""

from __future__ import annotations

import numbers
from fractions import Fraction
from typing import Any, Sequence

import numpy as np
import pandas as pd

from ..device.replay import MISMATCH_FIX, ChannelLoad, FlowMismatch, counters_from, loads_from  # noqa: F401
from ..errors import ValidationError

#: The stage kinds that move bytes on an HBM channel.
DMA_STAGES = ("DMA_READ", "DMA_WRITE")
CONTENTION_COLUMNS = ("seq", "pe", "cmd", "channel", "bytes", "alone", "actual", "lost")
CHANNEL_COLUMNS = ("channel", "bytes", "busy_cycles", "busy_fraction", "peak_flows")
OVER_TIME_COLUMNS = ("channel", "bin", "t0", "t1", "bytes", "bytes_per_cycle", "utilisation")
STEP_COLUMNS = ("channel", "t0", "t1", "flows", "bytes_per_cycle")


def run_of(x: Any, where: str):
    """The :class:`~kbwork.Run` (or device run) ``x`` is, or holds as ``.run`` (a ``decode.DecodeRun``).

    Raises:
        ValidationError: ``x`` is neither.
    """
    from ..sim import Run

    if isinstance(x, Run):
        return x
    inner = getattr(x, "run", None)
    if isinstance(inner, Run):
        return inner
    raise ValidationError(f"analysis.{where} takes a Run (sim.run, sim.run_device) or a decode.DecodeRun, "
                          f"not {type(x).__name__}.")


def _dma_rows(run, where: str, pes: Sequence[int] | None = None) -> dict[str, np.ndarray]:
    """The DMA stages of ``run``, in op_log order: seq, pe, cmd, channel, bytes, start, end (int64 arrays).
    ``pes``: of those PEs of a device run only, read from their own op_logs (the device's is not built)."""
    from ..sim import DeviceRun

    if pes is not None and isinstance(run, DeviceRun):
        parts = [_dma_rows(run.pe(p), where) for p in sorted(pes)]  # the op_log is PE by PE
        keys = ("seq", "pe", "cmd", "bytes", "start", "end", "channel")
        return {k: np.concatenate([d[k] for d in parts]) if parts else np.zeros(0, np.int64) for k in keys}
    log = run.op_log
    chan = np.asarray(run.stage_channels, dtype=np.int64)
    if len(chan) != len(log):
        raise ValidationError(f"analysis.{where}: run.stage_channels has {len(chan)} entries for {len(log)} "
                              f"op_log rows; pass a run whose op_log is as simulated.")
    keep = log["stage"].isin(DMA_STAGES).to_numpy()
    out = {c: log[c].to_numpy(np.int64)[keep] for c in ("seq", "pe", "cmd", "bytes", "start", "end")}
    out["channel"] = chan[keep]
    return out


def _ceil_div(a: np.ndarray, num: int, den: int) -> np.ndarray:
    """``ceil(a · den / num)`` elementwise for non-negative int64 ``a``, exact (Python ints where int64 would
    overflow)."""
    if len(a) and int(a.max()) * den >= 2 ** 62:
        return np.array([-(-int(x) * den // num) for x in a], dtype=np.int64)
    return -(-a * den // num)


def alone_cycles(nbytes: np.ndarray, topo) -> np.ndarray:
    """Each transfer's cycles alone on its channel: ``dma_base_cycles + ceil(bytes / min(dma rate, channel
    rate))``, exact (the channel rate as written, ``topology.channel_fraction``)."""
    nbytes = np.asarray(nbytes, dtype=np.int64)
    rate = Fraction(topo.dma_bytes_per_cycle)
    ch = topo.channel_fraction
    if ch is not None and ch < rate:
        rate = ch
    return topo.dma_base_cycles + _ceil_div(nbytes, rate.numerator, rate.denominator)


def contention(run: Any) -> pd.DataFrame:
    """The cycles each DMA stage lost to sharing its channel (DESIGN.md §14).

    Args:
        run: a Run, a device run, or anything whose ``.run`` is one (``decode.run(...)``).

    Returns:
        One row per DMA stage (DMA_READ, DMA_WRITE), in op_log order, columns :data:`CONTENTION_COLUMNS`,
        all int64: ``seq``, ``pe``, ``cmd``, ``channel`` (its HBM channel, -1 for none), ``bytes``,
        ``alone`` (its cycles alone on the channel), ``actual`` (``end - start``) and ``lost`` (``actual -
        alone``, 0 when it never shared). One PE's run of a device (``run.pe(p)``) gives the same rows as
        the device's for that PE: each row is read by itself.

    Raises:
        ValidationError: not a run, or a stage faster than it can be alone (an op_log that is not the
            simulated one, or a re-simulation with PE_DMA scaled).
    """
    run = run_of(run, "contention")
    return _contention_of(_dma_rows(run, "contention"), run.topology)


def _contention_of(d: dict[str, np.ndarray], topo) -> pd.DataFrame:
    """:func:`contention`'s table of the DMA rows ``d`` (:func:`_dma_rows`)."""
    alone = alone_cycles(d["bytes"], topo)
    actual = d["end"] - d["start"]
    lost = actual - alone
    if (lost < 0).any():
        i = int(np.flatnonzero(lost < 0)[0])
        raise ValidationError(f"analysis.contention: DMA stage seq {d['seq'][i]} (PE {d['pe'][i]}, {d['bytes'][i]} "
                              f"bytes) took {actual[i]} cycles, fewer than the {alone[i]} it takes alone on its "
                              f"channel; pass a run as simulated (not an edited op_log, nor one re-simulated with "
                              f"PE_DMA scaled).")
    return pd.DataFrame({"seq": d["seq"], "pe": d["pe"], "cmd": d["cmd"], "channel": d["channel"],
                         "bytes": d["bytes"], "alone": alone, "actual": actual, "lost": lost})


def pe_channels(run: Any, p: int) -> set[int]:
    """The HBM channels PE ``p``'s transfers use (from its ``stage_channels``; no op_log is built)."""
    return set(np.unique(run.pe(p).stage_channels).tolist()) - {-1}


def channel_loads(run: Any, where: str = "channel_loads", only: Sequence[int] | None = None
                  ) -> dict[int, ChannelLoad]:
    """Every channel a DMA stage of ``run`` names, ascending -> its :class:`ChannelLoad`; ``only``: those of
    these channels only, from the DMA rows of the PEs whose transfers use them (a channel's load depends on
    its own flows alone).

    Raises:
        ValidationError: not a run. FlowMismatch: the DMA rows do not follow the flow rule.
    """
    run = run_of(run, where)
    if only is None:
        d = _dma_rows(run, where)
    else:
        only = set(only)
        d = _dma_rows(run, where, [p for p in run.pes if pe_channels(run, p) & only])
        keep = np.isin(d["channel"], sorted(only))
        d = {k: v[keep] for k, v in d.items()}
    return loads_from(d["seq"], d["bytes"], d["start"], d["end"], d["channel"], run.topology, where)


def channels(run: Any) -> pd.DataFrame:
    """Each HBM channel's traffic over the run (DESIGN.md §14).

    Returns:
        One row per channel a DMA stage names, ascending; columns :data:`CHANNEL_COLUMNS`: ``channel``,
        ``bytes`` (moved on it: the sum of its DMA stages' bytes), ``busy_cycles`` (cycles in which at least
        one flow moved bytes on it), ``busy_fraction`` (of ``run.cycles``; 0 for a 0-cycle run) and
        ``peak_flows`` (the most flows active at once).

    Raises:
        ValidationError: not a run. FlowMismatch: the DMA rows do not follow the flow rule.
    """
    run = run_of(run, "channels")
    return channel_table(channel_loads(run, "channels"), run.cycles)


def channel_table(loads: dict[int, ChannelLoad], cycles: int) -> pd.DataFrame:
    """:func:`channels`' table of the channels ``loads`` holds (of a run of ``cycles``)."""
    busy = np.array([int(np.diff(x.points)[x.flows > 0].sum()) if len(x.points) > 1 else 0
                     for x in loads.values()], dtype=np.int64)
    return pd.DataFrame({"channel": np.array(list(loads), dtype=np.int64),
                         "bytes": np.array([x.nbytes for x in loads.values()], dtype=np.int64),
                         "busy_cycles": busy,
                         "busy_fraction": busy / cycles if cycles else np.zeros(len(busy)),
                         "peak_flows": np.array([int(x.flows.max()) if len(x.flows) else 0 for x in loads.values()],
                                                dtype=np.int64)})


def _edges(bins: Any, cycles: int) -> np.ndarray:
    """Integer bin edges: ``bins`` equal-as-can-be bins over ``[0, cycles)`` (at most one per cycle), or the
    increasing whole-cycle edges given."""
    if isinstance(bins, numbers.Integral) and not isinstance(bins, bool):
        if not 0 < bins <= 10_000_000:
            raise ValidationError(f"channels_over_time: bins={bins}; pass a positive number of bins (at most "
                                  f"10,000,000) or the bin edges in cycles.")
        span = max(int(cycles), 1)
        n = min(int(bins), span)
        return np.arange(n + 1, dtype=np.int64) * span // n
    try:
        edges = np.asarray(bins, dtype=np.float64)
    except (TypeError, ValueError):
        edges = np.zeros(0)
    # 2**62: far beyond any run, and every edge and difference of edges still fits the int64 columns
    if edges.ndim != 1 or len(edges) < 2 or (np.diff(edges) <= 0).any() or (edges != np.round(edges)).any() \
            or edges[0] < 0 or edges[-1] > 2.0 ** 62:
        raise ValidationError(f"channels_over_time: bins={bins!r}; pass a positive number of bins or at least two "
                              f"strictly increasing whole-cycle edges from 0 up to at most 2**62 (e.g. range(0, run.cycles + 1, 100)).")
    return edges.astype(np.int64)


def _as_bytes(units: np.ndarray, scale: int, total: int, exact: bool) -> np.ndarray:
    """Cumulative units as bytes: Fractions (``exact``), or float64 on a grid of 2^-q bytes, q as fine as
    float64 allows below ``total``. Every value and every partial sum of differences of them is then a
    multiple of 2^-q below 2^(53-q), exactly representable: the bins of a channel add up, in any order,
    exactly to its bytes."""
    if exact:
        return np.array([Fraction(int(u), scale) for u in units], dtype=object)
    q = max(0, 52 - max(int(total), 1).bit_length())
    if units.dtype != object and len(units) and int(units.max()) < 2 ** (62 - q):
        grid = ((units << q) + scale // 2) // scale
    else:
        grid = np.array([((int(u) << q) + scale // 2) // scale for u in units], dtype=np.int64)
    return grid.astype(np.int64) / float(1 << q)


def channels_over_time(run: Any, bins: int | Sequence[int] = 100, *, exact: bool = False) -> pd.DataFrame:
    """Bytes each HBM channel moved in each time bin, for plots (a tidy frame).

    Args:
        run: a Run, a device run, or anything whose ``.run`` is one.
        bins: a number of bins over ``[0, run.cycles)`` with whole-cycle edges (at most one bin per cycle),
            or the strictly increasing whole-cycle edges.
        exact: give ``bytes`` and ``bytes_per_cycle`` as exact ``Fraction`` s (object columns).

    Returns:
        One row per (channel, bin), channels ascending as :func:`channels` lists them; columns
        :data:`OVER_TIME_COLUMNS`: ``channel``, ``bin`` (0, 1, ...), ``t0``, ``t1`` (the bin's cycles
        ``[t0, t1)``), ``bytes`` (moved on the channel in the bin), ``bytes_per_cycle`` (over the bin) and
        ``utilisation`` (that over the channel's bandwidth; NaN for an unconstrained channel). As floats,
        ``bytes`` is within 2^-19 bytes of the exact amount for a channel moving under 8 GiB, on a grid
        chosen so that a channel's bins add up exactly to its bytes (when the bins cover the run).

    Raises:
        ValidationError: not a run, bad ``bins`` or ``exact``. FlowMismatch: the DMA rows do not follow the
            flow rule.
    """
    if not isinstance(exact, bool):
        raise ValidationError(f"channels_over_time: exact must be True or False, got {exact!r}.")
    run = run_of(run, "channels_over_time")
    edges = _edges(bins, run.cycles)
    loads = channel_loads(run, "channels_over_time")
    width = np.diff(edges)
    bw = run.topology.channel_fraction
    frames = []
    for c, load in loads.items():
        cum = _as_bytes(load.moved_before(edges), load.scale, load.nbytes, exact)
        moved = cum[1:] - cum[:-1]
        per = np.array([x / int(w) for x, w in zip(moved, width)], dtype=object) if exact else moved / width
        util = (np.full(len(width), np.nan) if bw is None else
                np.array([float(x / bw) for x in per]) if exact else per / float(bw))
        frames.append(pd.DataFrame({"channel": np.full(len(width), c, np.int64),
                                    "bin": np.arange(len(width), dtype=np.int64), "t0": edges[:-1], "t1": edges[1:],
                                    "bytes": moved, "bytes_per_cycle": per, "utilisation": util}))
    if not frames:
        return pd.DataFrame({c: np.zeros(0, np.int64 if c in ("channel", "bin", "t0", "t1") else np.float64)
                             for c in OVER_TIME_COLUMNS})
    return pd.concat(frames, ignore_index=True)


def channel_steps(run: Any, *, exact: bool = False) -> pd.DataFrame:
    """Each channel's load as a step function, exact to the cycle (what the Gantt's channel strips and the
    Perfetto counters draw).

    Returns:
        Columns :data:`STEP_COLUMNS`: ``channel``, ``t0``, ``t1`` (cycles ``[t0, t1)``), ``flows`` (active
        flows) and ``bytes_per_cycle`` (moved on the channel in each of those cycles; a ``Fraction`` with
        ``exact``), from each channel's first join to its last end, idle stretches included at 0.

    Raises:
        ValidationError: not a run. FlowMismatch: the DMA rows do not follow the flow rule.
    """
    if not isinstance(exact, bool):
        raise ValidationError(f"channel_steps: exact must be True or False, got {exact!r}.")
    return steps_table(channel_loads(run, "channel_steps"), exact)


def steps_table(loads: dict[int, ChannelLoad], exact: bool = False) -> pd.DataFrame:
    """:func:`channel_steps`' table of the channels ``loads`` holds."""
    rows = []
    for c, load in loads.items():
        t0, t1, k, units = load.steps()
        per = [Fraction(int(u), load.scale) for u in units]
        rows.append(pd.DataFrame({"channel": np.full(len(t0), c, np.int64), "t0": t0, "t1": t1, "flows": k,
                                  "bytes_per_cycle": np.array(per, dtype=object) if exact else
                                  np.array([float(x) for x in per], dtype=np.float64)}))
    if not rows:
        return pd.DataFrame({c: np.zeros(0, np.float64 if c == "bytes_per_cycle" else np.int64)
                             for c in STEP_COLUMNS})
    return pd.concat(rows, ignore_index=True)


def perfetto_counters(run: Any) -> dict[str, list[tuple[int, float]]]:
    """``"HBM channel c"`` -> ``(cycle, bytes per cycle from then on)`` for every channel of ``run``, what
    ``oplog.to_perfetto(counters=)`` draws as counter tracks; ``{}`` for one PE's run of a device whose
    channels other PEs shared (its op_log does not hold their transfers: export the device run)."""
    try:
        return counters_from(channel_loads(run, "perfetto_counters"))
    except FlowMismatch:
        return {}


# --- for explain ---------------------------------------------------------------------------------------------
#: :func:`explain` names contention when the critical path's DMA rows lost at least this fraction of the run.
CONTENDED = 0.05


def path_contention(run: Any, path: pd.DataFrame | None = None) -> dict[str, Any]:
    """What the critical path's DMA rows lost to sharing their channels.

    Returns:
        ``cycles`` (lost, summed over the path's DMA rows), ``fraction`` (of ``run.cycles``) and
        ``channels`` (channel -> cycles lost there, the channels that lost any, ascending).
    """
    from ..sim import DeviceRun

    run = run_of(run, "path_contention")
    path = run.critical_path() if path is None else path
    # each row is read by itself, so the path's PEs' own rows are the device's for them: the device's op_log
    # (every PE's, 500,000 rows for 96 decode tasks) is not built for a path on one PE
    pes = np.unique(path["pe"].to_numpy()).tolist() if isinstance(run, DeviceRun) and "pe" in path else None
    con = _contention_of(_dma_rows(run, "contention", pes), run.topology)
    on = con[con["seq"].isin(path["seq"].to_numpy()) & (con["lost"] > 0)]
    per = on.groupby("channel", sort=True)["lost"].sum()
    total = int(per.sum())
    return {"cycles": total, "fraction": total / run.cycles if run.cycles else 0.0,
            "channels": {int(c): int(v) for c, v in per.items()}}


def contention_words(lost: dict[str, Any]) -> str:
    """The clause :func:`explain` adds for :func:`path_contention` ``lost``: ``channel 0 is contended: DMA stages
    on the critical path lost 102 cycles (25%) to sharing it``."""
    chans = list(lost["channels"])
    named = (f"channel {chans[0]} is" if len(chans) == 1 else
             f"channels {', '.join(map(str, chans[:-1]))} and {chans[-1]} are")
    return (f"{named} contended: DMA stages on the critical path lost {lost['cycles']} cycles "
            f"({100 * lost['fraction']:.0f}%) to sharing {'it' if len(chans) == 1 else 'them'}")
