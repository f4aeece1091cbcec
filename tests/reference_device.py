"""A slow, obvious, cycle-stepped reference for the device timing rules (DESIGN §5, §14 and §16's launch
dependencies).

It takes a *resolved* stage graph (every dependency explicit, as in
``kbwork.bench.references.resolved_graph``, but for a device: resources of
several PEs and DMA stages that move bytes on HBM channels) and steps it one
cycle at a time, t = 0, 1, 2, ..., with bytes as exact ``Fraction``s. It is
written from the DESIGN text alone and imports nothing from kbwork, so the
real (event-driven) simulator can be checked against it stage for stage.

Input
-----
:class:`Stage` — one stage, indexed by its position (its seq) in
``DeviceGraph.stages``:

* ``resource``: a hashable key naming the engine, e.g. ``(pe, "PE_DMA")``;
* ``deps``: seqs that must have *ended* before this stage is ready;
* ``dur``: cycles, for a non-DMA stage (``nbytes`` is then ``None``);
* ``nbytes`` and ``channel``: for a DMA stage (``dur`` is then ``None``), the
  bytes it moves and the HBM channel (any hashable key) they move on.

:class:`DeviceGraph` — ``stages``, ``capacity`` (resource -> number of units;
every resource used must be listed), ``dma_base_cycles``,
``dma_bytes_per_cycle``, ``channel_bytes_per_cycle`` (``math.inf`` means
unconstrained), ``release`` (seq -> earliest start cycle, default 0),
``after`` (seq -> a list of stage groups: each group the stages of one launch
the stage's launch is ``after``) and ``sync_cycles`` (the signal latency).
Rates may be ints, Fractions, Decimals, decimal strings or floats; a float
is taken as written (``40.5`` is 81/2, ``0.1`` is 1/10).

Output
------
:class:`DeviceResult` — ``start`` and ``end`` per seq; ``data_start``
(seq -> cycle its data phase started, DMA stages only); ``moved`` (channel ->
{cycle t: bytes moved on the channel during [t, t+1)}); ``flows`` (channel ->
{cycle t: flows active during [t, t+1)}); ``flow_bytes`` (seq -> bytes the
flow moved in all; a flow's last partial cycle moves only what it still
needed). Cycles in which a channel moves nothing are absent from ``moved`` and
``flows``.

Rules, per cycle t
------------------
1. A running DMA stage whose access phase (``dma_base_cycles``) is over at t
   starts its data phase: with bytes, it joins its channel as a flow.
2. Retire (in seq order) every running stage whose end is t: a non-DMA stage
   at start + dur; a 0-byte DMA at its data-phase start; a flow once the
   bytes it advanced *before* t reach its nbytes.
3. Every ready stage (all deps ended at or before t, release <= t, for each of
   its ``after`` groups every stage of the group ended and the latest of their
   ends + ``sync_cycles`` <= t, not started) waits for its resource; each resource starts its waiting stages lowest seq
   first, one per free unit.
   Steps 1-3 repeat at t until nothing changes (a 0-cycle stage starts and
   ends at t, and what depends on it may start at t too).
4. During [t, t+1), with k flows on channel c, each advances
   ``min(dma_bytes_per_cycle, channel_bytes_per_cycle / k)`` bytes (capped by
   what it still needs; the rest is not handed to the other flows).
"""

from __future__ import annotations

import math
import random
from collections.abc import Hashable
from dataclasses import dataclass, field
from decimal import Decimal
from fractions import Fraction


@dataclass(frozen=True)
class Stage:
    """One stage: a non-DMA stage has ``dur``; a DMA stage has ``nbytes`` and ``channel``."""

    resource: Hashable
    deps: tuple[int, ...] = ()
    dur: int | None = None
    nbytes: int | None = None
    channel: Hashable | None = None

    @property
    def is_dma(self) -> bool:
        return self.nbytes is not None


@dataclass
class DeviceGraph:
    """A resolved device stage graph and the timing parameters of the flow rule."""

    stages: list[Stage]
    capacity: dict[Hashable, int]
    dma_base_cycles: int
    dma_bytes_per_cycle: object
    channel_bytes_per_cycle: object = math.inf
    release: dict[int, int] = field(default_factory=dict)
    after: dict[int, list[tuple[int, ...]]] = field(default_factory=dict)
    sync_cycles: int = 0


@dataclass
class DeviceResult:
    """Per-stage times and per-channel, per-cycle bytes (see the module docstring)."""

    start: list[int]
    end: list[int]
    data_start: dict[int, int]
    moved: dict[Hashable, dict[int, Fraction]]
    flows: dict[Hashable, dict[int, int]]
    flow_bytes: dict[int, Fraction]


def exact(x) -> Fraction | None:
    """A rate as an exact Fraction; ``None`` for infinity. Floats are read as written (their repr)."""
    if isinstance(x, float):
        if math.isinf(x):
            return None
        return Fraction(repr(x))
    if isinstance(x, (int, Fraction, Decimal, str)):
        return Fraction(x)
    raise TypeError(f"not a rate: {x!r}")


def _check(g: DeviceGraph) -> None:
    n = len(g.stages)
    for s, st in enumerate(g.stages):
        if st.resource not in g.capacity or g.capacity[st.resource] < 1:
            raise ValueError(f"stage {s}: resource {st.resource!r} has no units in capacity")
        if any(not 0 <= d < n or d == s for d in st.deps):
            raise ValueError(f"stage {s}: bad deps {st.deps}")
        if st.is_dma:
            if st.dur is not None or st.channel is None or st.nbytes < 0:
                raise ValueError(f"stage {s}: a DMA stage has nbytes >= 0 and a channel, and no dur")
        elif st.dur is None or st.dur < 0:
            raise ValueError(f"stage {s}: a non-DMA stage has dur >= 0")
    if g.dma_base_cycles < 0 or exact(g.dma_bytes_per_cycle) <= 0:
        raise ValueError("dma_base_cycles >= 0 and dma_bytes_per_cycle > 0")
    bw = exact(g.channel_bytes_per_cycle)
    if bw is not None and bw <= 0:
        raise ValueError("channel_bytes_per_cycle > 0")


def simulate(g: DeviceGraph) -> DeviceResult:
    """Step ``g`` cycle by cycle; return every stage's (start, end) and the channels' bytes."""
    _check(g)
    stages = g.stages
    n = len(stages)
    base = g.dma_base_cycles
    rate = exact(g.dma_bytes_per_cycle)
    bw = exact(g.channel_bytes_per_cycle)  # None: unconstrained
    release = [g.release.get(s, 0) for s in range(n)]

    start: list[int | None] = [None] * n
    end: list[int | None] = [None] * n
    in_use = {res: 0 for res in g.capacity}  # busy units per resource
    running: set[int] = set()  # started, not ended
    advanced: dict[int, Fraction] = {}  # active flows: seq -> bytes advanced so far
    data_start: dict[int, int] = {}
    moved: dict[Hashable, dict[int, Fraction]] = {}
    flows: dict[Hashable, dict[int, int]] = {}
    flow_bytes: dict[int, Fraction] = {}

    def ends_now(s: int, t: int) -> bool:
        st = stages[s]
        if not st.is_dma:
            return start[s] + st.dur == t
        if st.nbytes == 0:
            return start[s] + base == t
        return s in advanced and advanced[s] >= st.nbytes

    def launch_done(group: tuple[int, ...], t: int) -> bool:
        """Every stage of a launch it is after has ended, sync_cycles ago."""
        return all(end[d] is not None for d in group) and max(end[d] for d in group) + g.sync_cycles <= t

    def ready(s: int, t: int) -> bool:
        return (start[s] is None and release[s] <= t and all(end[d] is not None for d in stages[s].deps)
                and all(launch_done(grp, t) for grp in g.after.get(s, ())))

    t = 0
    while any(e is None for e in end):
        changed = True
        while changed:
            changed = False
            # 1. data phases starting at t; a flow joined now has advanced nothing, so cannot end now
            for s in sorted(running):
                if stages[s].is_dma and s not in data_start and start[s] + base == t:
                    data_start[s] = t
                    if stages[s].nbytes > 0:
                        advanced[s] = Fraction(0)
                    changed = True
            # 2. retire what ends at t (a 0-byte transfer: at its data-phase start)
            for s in sorted(running):
                if ends_now(s, t):
                    end[s] = t
                    running.discard(s)
                    in_use[stages[s].resource] -= 1
                    if s in advanced:
                        flow_bytes[s] = advanced.pop(s)
                    changed = True
            # 3. start ready stages, lowest seq first, one per free unit
            for s in range(n):
                res = stages[s].resource
                if ready(s, t) and in_use[res] < g.capacity[res]:
                    start[s] = t
                    in_use[res] += 1
                    running.add(s)
                    changed = True

        if not running and all(e is not None for e in end):
            break  # done (the stuck check below would misread this)
        waiting = any(start[s] is None and (release[s] > t or (s in g.after and all(
            end[d] is not None for grp in g.after[s] for d in grp))) for s in range(n))
        if not running and not waiting:
            raise ValueError(f"stuck at cycle {t}: no stage runs and none can become ready (a dependency cycle?)")

        # 4. flows advance during [t, t+1)
        k: dict[Hashable, int] = {}
        for s in advanced:
            c = stages[s].channel
            k[c] = k.get(c, 0) + 1
        for s in sorted(advanced):
            c = stages[s].channel
            r = rate if bw is None else min(rate, bw / k[c])
            step = min(r, stages[s].nbytes - advanced[s])
            advanced[s] += step
            moved.setdefault(c, {})
            moved[c][t] = moved[c].get(t, Fraction(0)) + step
            flows.setdefault(c, {})[t] = k[c]
        t += 1

    return DeviceResult(start, end, data_start, moved, flows, flow_bytes)


def random_device_graph(seed: int, *, cross_pe_deps: bool = False) -> DeviceGraph:
    """A random small resolved device graph from ``random.Random(seed)``.

    1-4 PEs, 1-4 channels; each PE has a PE_DMA and 1-3 of PE_CPU, PE_GEMM,
    PE_MATH, each with 1-2 units; 5-40 stages, each on a random resource of a
    random PE, with 0-3 deps on earlier stages (of the same PE unless
    ``cross_pe_deps``); durations 0-50 and DMA bytes 0-5000 (both 0 more often
    than uniform, to exercise 0-cycle stages and 0-byte transfers) on random
    channels; a few stages get a release; base 0-30, DMA rate 8/16/64, channel
    bandwidth 10/32/40.5/64/inf.
    """
    rng = random.Random(seed)
    n_pe = rng.randint(1, 4)
    n_ch = rng.randint(1, 4)
    resources: dict[int, list[tuple[int, str]]] = {}
    capacity: dict[Hashable, int] = {}
    for pe in range(n_pe):
        names = ["PE_DMA"] + rng.sample(["PE_CPU", "PE_GEMM", "PE_MATH"], rng.randint(1, 3))
        resources[pe] = [(pe, name) for name in names]
        for res in resources[pe]:
            capacity[res] = rng.randint(1, 2)

    n = rng.randint(5, 40)
    pe_of: list[int] = []
    stages: list[Stage] = []
    release: dict[int, int] = {}
    for s in range(n):
        pe = rng.randrange(n_pe)
        pe_of.append(pe)
        earlier = [d for d in range(s) if cross_pe_deps or pe_of[d] == pe]
        deps = tuple(sorted(rng.sample(earlier, rng.randint(0, min(3, len(earlier))))))
        res = rng.choice(resources[pe])
        if res[1] == "PE_DMA":
            nbytes = 0 if rng.random() < 0.1 else rng.randint(1, 5000)
            stages.append(Stage(res, deps, nbytes=nbytes, channel=rng.randrange(n_ch)))
        else:
            dur = 0 if rng.random() < 0.15 else rng.randint(1, 50)
            stages.append(Stage(res, deps, dur=dur))
        if rng.random() < 0.1:
            release[s] = rng.randint(0, 200)

    return DeviceGraph(stages, capacity,
                       dma_base_cycles=rng.randint(0, 30),
                       dma_bytes_per_cycle=rng.choice([8, 16, 64]),
                       channel_bytes_per_cycle=rng.choice([10, 32, 40.5, 64, math.inf]),
                       release=release)
