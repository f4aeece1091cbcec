"""The channel load of a run, replayed from its records by the flow rule (DESIGN.md §14): what the analysis'
channel views and the Perfetto counter tracks read.

A DMA stage moving b > 0 bytes is a flow on its channel from ``start + dma_base_cycles`` to ``end``; while k
flows are active each advances ``min(dma rate, channel rate / k)`` bytes a cycle, and in its last cycle only
what it still needs. The rates change only where a flow joins or leaves, so a channel's load is a short
list of *pieces*, each a run of cycles with the same k. Counts are exact: bytes are kept in whole units of
``1 / scale``, ``scale`` a multiple of the channel rate's denominator and of every k seen, so every rate is
a whole number of units. Every flow is checked against the rule first: its bytes must be reached exactly at
its ``end`` given the other flows on its channel, else :class:`FlowMismatch`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import ValidationError


class FlowMismatch(ValidationError):
    """A run's DMA rows do not follow the flow rule of its topology (see the module docstring)."""


@dataclass(frozen=True)
class ChannelLoad:
    """One channel's load over a run: pieces ``[points[i], points[i+1])`` with ``flows[i]`` active flows.

    Bytes are in units of ``1 / scale`` (int64 arrays, or Python ints in object arrays where int64 could
    overflow). In every cycle of piece i but its last the channel moves ``full[i]`` units; in its last
    cycle ``last[i]`` (flows that end there move only what they still need). ``before[i]`` is what the
    channel moved before ``points[i]``; ``before[-1]`` is ``nbytes · scale``.
    """

    channel: int
    scale: int
    points: np.ndarray
    flows: np.ndarray
    full: np.ndarray
    last: np.ndarray
    before: np.ndarray
    nbytes: int

    def moved_before(self, t: np.ndarray) -> np.ndarray:
        """Units the channel moved before each integer cycle of ``t``."""
        t = np.asarray(t, dtype=np.int64)
        p = self.points
        if len(p) < 2:
            return np.zeros(len(t), dtype=self.before.dtype)
        i = np.clip(np.searchsorted(p, t, side="right") - 1, 0, len(p) - 2)
        # inside piece i the cycles before t are all full ones (a piece's last cycle ends at points[i + 1]);
        # t at or before the first join clips to before[0] = 0, t from the last end on is everything
        inside = self.before[i] + self.full[i] * (np.clip(t, p[i], p[i + 1] - 1) - p[i])
        return np.where(t >= p[-1], self.before[-1], inside)

    def steps(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The load as steps ``[t0, t1)`` of constant units per cycle: ``(t0, t1, flows, units)``, from the
        first join to the last end (idle stretches included, at 0), equal neighbours merged."""
        p = self.points
        if len(p) < 2:
            return tuple(np.zeros(0, np.int64) for _ in range(4))  # type: ignore[return-value]
        length = np.diff(p)
        split = (self.last != self.full) & (length > 1)  # a piece's last cycle differs: a step of its own
        t0 = np.concatenate([p[:-1], p[1:][split] - 1])
        k = np.concatenate([self.flows, self.flows[split]])
        units = np.concatenate([np.where(length > 1, self.full, self.last), self.last[split]])
        order = np.argsort(t0, kind="stable")  # every t0 differs: a split step starts inside its own piece
        t0, k, units = t0[order], k[order], units[order]
        keep = np.ones(len(t0), bool)
        keep[1:] = (k[1:] != k[:-1]) | (units[1:] != units[:-1])
        t0, k, units = t0[keep], k[keep], units[keep]
        return t0, np.append(t0[1:], p[-1]), k, units


def _units_dtype(bound: int) -> Any:
    return np.int64 if bound < 2 ** 62 else object


def channel_load(c: int, join: np.ndarray, end: np.ndarray, nbytes: np.ndarray, seq: np.ndarray, topo,
                  where: str) -> ChannelLoad:
    if not len(join):  # only 0-byte transfers: nothing ever flowed
        z = np.zeros(0, np.int64)
        return ChannelLoad(c, 1, z, z, z, z, np.zeros(1, np.int64), 0)
    bad = end <= join
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise FlowMismatch(f"analysis.{where}: DMA stage seq {seq[i]} moves {nbytes[i]} bytes on channel {c} but "
                           f"ends at {end[i]}, no later than its data phase starts ({join[i]}). "
                           + MISMATCH_FIX)
    points = np.unique(np.concatenate([join, end]))
    k = (np.searchsorted(np.sort(join), points[:-1], side="right")
         - np.searchsorted(np.sort(end), points[:-1], side="right"))
    dma, ch = int(topo.dma_bytes_per_cycle), topo.channel_fraction
    seen = sorted(set(k[k > 0].tolist()))
    scale = 1 if ch is None else ch.denominator * math.lcm(*seen)
    # every rate a whole number of units: scale is a multiple of k · the rate's denominator for every k seen
    rate_of = {kk: dma * scale if ch is None else min(dma * scale, ch.numerator * scale // (ch.denominator * kk))
               for kk in seen}
    top = int(points[-1]) + 1
    dtype = _units_dtype(top * max(dma, 1 if ch is None else math.ceil(ch)) * scale * (max(seen) + 1)
                         + int(nbytes.sum()) * scale)
    rate = np.array([rate_of.get(int(x), 0) for x in k], dtype=dtype)
    length = np.diff(points).astype(dtype)
    R = np.concatenate([np.zeros(1, dtype), np.cumsum(rate * length)])  # one flow's advance before each point
    ji, ei = np.searchsorted(points, join), np.searchsorted(points, end)
    need = nbytes.astype(dtype) * scale
    adv = R[ei] - R[ji]
    ok = (adv >= need) & (adv - rate[ei - 1] < need)
    if not ok.all():
        i = int(np.flatnonzero(~ok)[0])
        raise FlowMismatch(f"analysis.{where}: DMA stage seq {seq[i]} ({nbytes[i]} bytes on channel {c}, data phase "
                           f"{join[i]}..{end[i]}) does not end where the flow rule puts it, given the other transfers "
                           f"on the channel. " + MISMATCH_FIX)
    short = np.zeros(len(points), dtype)
    np.add.at(short, ei, adv - need)  # what the flows ending at each point did not need of their last cycle
    full = k.astype(dtype) * rate
    before = np.concatenate([np.zeros(1, dtype), np.cumsum(full * length - short[1:])])
    return ChannelLoad(c, scale, points, k.astype(np.int64), full, full - short[1:], before, int(nbytes.sum()))


MISMATCH_FIX = ("Pass the whole run as simulated: one PE's run of a device (run.pe(p)) does not hold the other PEs' "
                 "transfers; read the device run and select rows by pe.")


def loads_from(seq: np.ndarray, nbytes: np.ndarray, start: np.ndarray, end: np.ndarray, channel: np.ndarray,
               topo, where: str) -> dict[int, ChannelLoad]:
    """Every channel the DMA stages ``(seq, nbytes, start, end, channel)`` (int64 arrays; channel -1: none)
    name, ascending -> its :class:`ChannelLoad`.

    Raises:
        FlowMismatch: the stages do not follow the flow rule of ``topo``.
    """
    base = topo.dma_base_cycles
    zero = (nbytes == 0) & (end != start + base)
    if zero.any():
        i = int(np.flatnonzero(zero)[0])
        raise FlowMismatch(f"analysis.{where}: DMA stage seq {seq[i]} moves 0 bytes but takes "
                           f"{end[i] - start[i]} cycles, not dma_base_cycles ({base}). " + MISMATCH_FIX)
    out = {}
    for c in sorted(set(channel.tolist()) - {-1}):
        m = (channel == c) & (nbytes > 0)
        out[c] = channel_load(c, start[m] + base, end[m], nbytes[m], seq[m], topo, where)
    return out


def counters_from(loads: dict[int, ChannelLoad]) -> dict[str, list[tuple[int, float]]]:
    """``"HBM channel c"`` -> ``(cycle, bytes per cycle from then on)`` for every channel of ``loads``: what
    ``oplog.to_perfetto(counters=)`` draws as counter tracks."""
    out: dict[str, list[tuple[int, float]]] = {}
    for c, load in loads.items():
        t0, t1, _, units = load.steps()
        if not len(t0):
            continue
        v = [int(u) / load.scale for u in units]
        pts = ([(0, 0.0)] if t0[0] > 0 else []) + list(zip(t0.tolist(), v))
        out[f"HBM channel {c}"] = pts + [(int(t1[-1]), 0.0)]
    return out
