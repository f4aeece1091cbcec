"""Shared HBM bandwidth (DESIGN.md §14): the flows of one channel, in exact integer arithmetic.

A DMA stage moving b bytes of a tensor on channel c has an access phase of
``dma_base_cycles``, then a data phase during which it is a *flow* on c.
While k flows are active on c, each advances ``min(dma_bytes_per_cycle,
channel_bytes_per_cycle / k)`` bytes per cycle. A flow joins at the integer
cycle its data phase starts and leaves at the integer cycle its stage ends,
the first at which the bytes it has advanced reach b; in its last, partial
cycle it still counts in k, and bandwidth it leaves unused is not handed to
others. Rates change only at joins and leaves, so between them every flow's
end is ``now + ceil(remaining / rate)``.

Exactness without fractions: bytes are counted in units of ``1 / scale``
with ``scale`` a multiple of ``k · denominator(channel rate)`` for every k
the channel can see, so every rate is a whole number of units per cycle.

A channel is *contended* only if some k it can see slows a flow:
``channel / k < dma rate`` for some ``2 <= k <= kmax``, where ``kmax`` is the
number of DMA units whose transfers touch it (:func:`contended`). Elsewhere a
transfer always moves at ``min(dma rate, channel rate)`` and its duration is
known when it starts (``Latency.dma``): the event loop tracks flows only on
contended channels, so the flow rule costs nothing where no channel is shared.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Sequence

import numpy as np

from ..pe.stages import Engine


def contended(channel_rate: Fraction | None, dma_rate: int, kmax: int) -> bool:
    """Whether ``kmax`` DMA units sharing a channel of ``channel_rate`` bytes per cycle (None: unconstrained) can
    ever slow one another."""
    if channel_rate is None or kmax < 2:
        return False
    return channel_rate / kmax < dma_rate


class FlowChannel:
    """The active flows of one contended channel.

    ``flows`` maps ``(pe, seq)`` to the bytes the flow has left (in units of ``1 / scale``); ``last`` is the
    cycle they were last advanced to; ``history`` records ``(cycle, flows active)`` at every change, what the
    analysis draws.
    """

    __slots__ = ("channel", "scale", "rates", "flows", "last", "history", "peak")

    def __init__(self, channel: int, channel_rate: Fraction, dma_rate: int, kmax: int):
        self.channel = channel
        self.scale = channel_rate.denominator * math.lcm(*range(1, kmax + 1))
        s = self.scale
        # rates[k]: units per cycle of each of k flows; exact, since scale is a multiple of k * denominator
        self.rates = [0] + [min(dma_rate * s, channel_rate.numerator * s // (channel_rate.denominator * k))
                            for k in range(1, kmax + 1)]
        self.flows: dict[tuple[int, int], int] = {}
        self.last = 0
        self.history: list[tuple[int, int]] = []
        self.peak = 0

    def __repr__(self) -> str:
        return f"FlowChannel({self.channel}: {len(self.flows)} flows at cycle {self.last})"

    def _advance(self, t: int) -> None:
        if self.flows and t > self.last:
            moved = self.rates[len(self.flows)] * (t - self.last)
            flows = self.flows
            for key in flows:
                flows[key] -= moved
        self.last = t

    def _ends(self, t: int) -> list[tuple[int, int, int]]:
        rate = self.rates[len(self.flows)] if self.flows else 0
        k = len(self.flows)
        self.history.append((t, k))
        if k > self.peak:
            self.peak = k
        # a flow whose bytes are all advanced (left <= 0: its end is t) keeps that end: which transfers end at t
        # depends only on the rates before t, never on a join or leave at t
        return [(p, s, t + -(-left // rate) if left > 0 else t) for (p, s), left in self.flows.items()]

    def join(self, t: int, pe: int, seq: int, nbytes: int) -> list[tuple[int, int, int]]:
        """Flow ``(pe, seq)`` of ``nbytes`` joins at cycle ``t``; return every flow's ``(pe, seq, end)`` from now."""
        self._advance(t)
        self.flows[(pe, seq)] = nbytes * self.scale
        return self._ends(t)

    def leave(self, t: int, pe: int, seq: int) -> list[tuple[int, int, int]]:
        """Flow ``(pe, seq)`` ends at cycle ``t``; return the others' ``(pe, seq, end)`` from now."""
        self._advance(t)
        del self.flows[(pe, seq)]
        return self._ends(t)


def flows_meet(results: Sequence[tuple], channels: Sequence[int], dma_base: int) -> bool:
    """Whether two transfers of ``results`` (PEs' records, ``(timeline, schedule, state)`` each, simulated
    apart) are flows on one of ``channels`` in a common cycle. A DMA stage that moves bytes is a flow from its
    start + ``dma_base`` (its data phase) to its end, the end not included (module docstring).

    Why it decides exactness: while a channel carries one flow, that flow moves at ``min(dma rate, channel
    rate)``, as a transfer on a channel of its own does. PEs that meet only on channels therefore run in one
    loop as they run apart up to the first cycle two flows share; if their records apart have no such cycle,
    neither has the loop, and the records apart are the loop's."""
    chans = np.asarray(sorted(channels), dtype=np.int64)
    if not len(chans):
        return False
    joins, ends, where = [], [], []
    for tl, sched, _ in results:
        t = sched.table
        engine, nbytes, chan = (np.asarray(c, dtype=np.int64) for c in (t.engine, t.nbytes, t.chan))
        sel = np.flatnonzero((engine == int(Engine.PE_DMA)) & (nbytes > 0) & np.isin(chan, chans))
        joins.append(np.asarray(tl.start, dtype=np.int64)[sel] + dma_base)
        ends.append(np.asarray(tl.end, dtype=np.int64)[sel])
        where.append(chan[sel])
    join, end, chan = np.concatenate(joins), np.concatenate(ends), np.concatenate(where)
    order = np.lexsort((join, chan))  # by channel, then by the cycle the flow joins
    join, end, chan = join[order], end[order], chan[order]
    cut = np.flatnonzero(np.diff(chan)) + 1
    for lo, hi in zip(np.concatenate(([0], cut)), np.concatenate((cut, [len(chan)]))):
        # on one channel, a flow meets an earlier one when it joins before the latest end so far
        if hi - lo > 1 and np.any(join[lo + 1:hi] < np.maximum.accumulate(end[lo:hi - 1])):
            return True
    return False
