"""Reference implementations the benchmark measures kbwork against.

* :func:`resolved_graph` — a run's stage graph with every dependency kbwork
  resolved, static and dynamic (queue slots, ``tl.wait``, hazard holds), as
  explicit edges.
* :func:`simpy_replay` — that graph in SimPy: one process per stage, engines
  as ``simpy.PriorityResource`` served oldest (lowest seq) first. A second,
  independent implementation of the timeline rules: its starts and ends must
  equal kbwork's.
* :func:`heap_floor` — a bare ``heapq`` loop over the same graph that pushes
  and pops each stage once with its precomputed duration: the least any
  event-driven Python simulator can do.
* :func:`numpy_attention` — one vectorised numpy computation of the same
  attention: the floor for data mode's numerics.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from heapq import heappop, heappush

import numpy as np

from ..pe.scheduler import Schedule as Program
from ..pe.stages import engine_table
from ..device import simulate


@dataclass
class ResolvedGraph:
    """Stages (engine, duration) and their complete dependency lists, each engine's capacity
    (its number of units, from the topology's engine table), plus kbwork's times."""

    engine: list[int]
    dur: list[int]
    deps: list[list[int]]
    start: list[int]
    end: list[int]
    capacity: list[int]

    def __len__(self) -> int:
        return len(self.dur)

    def __repr__(self) -> str:
        return f"ResolvedGraph({len(self)} stages, {sum(len(d) for d in self.deps)} edges)"


def resolved_graph(prog: Program) -> ResolvedGraph:
    """Simulate ``prog`` (timing) recording dynamic edges; return the full graph and kbwork's times."""
    n = len(prog.table)
    dyn: list[list[int]] = [[] for _ in range(n)]
    tl = simulate(prog, None, dyn)
    deps = [sorted(set(p).union(d)) for p, d in zip(prog.table.preds, dyn)]
    return ResolvedGraph(list(prog.table.engine), list(prog.table.dur), deps, tl.start.tolist(), tl.end.tolist(),
                         [spec.capacity for spec in engine_table(prog.topo)])


def simpy_replay(g: ResolvedGraph) -> tuple[list[int], list[int]]:
    """Run the resolved graph in SimPy; return (start, end) per stage.

    Engine arbitration matches kbwork's rule — at each instant, after every
    stage ending then has been retired, each free unit of an engine starts the
    ready stage with the lowest seq — by ordering same-instant events:
    readiness first (SimPy's own priorities), then requests in seq order, then
    releases. An engine is one ``PriorityResource`` with the graph's capacity
    for it; SimPy does not say which of its units a stage got.
    """
    import simpy

    env = simpy.Environment()
    n = len(g)
    release_prio = n + 10
    engines = [simpy.PriorityResource(env, capacity=cap) for cap in g.capacity]
    done = [env.event() for _ in range(n)]
    start = [-1] * n
    end = [-1] * n

    def later(priority: int) -> simpy.Event:
        ev = env.event()
        ev._ok = True
        ev._value = None
        env.schedule(ev, priority=priority)
        return ev

    def stage(s: int):
        deps = g.deps[s]
        if deps:
            yield env.all_of([done[d] for d in deps])
        yield later(3 + s)  # request in seq order, after every readiness at this instant
        res = engines[g.engine[s]]
        with res.request(priority=s) as req:
            yield req
            start[s] = int(env.now)
            yield env.timeout(g.dur[s])
            end[s] = int(env.now)
            done[s].succeed()
            yield later(release_prio)  # free the engine only after this instant's requests are queued

    for s in range(n):
        env.process(stage(s))
    env.run()
    return start, end


def heap_floor(g: ResolvedGraph) -> int:
    """Push and pop each stage once, in a bare heapq event loop over the graph; return the last end."""
    n = len(g)
    dur = g.dur
    succ: list[list[int]] = [[] for _ in range(n)]
    remaining = [0] * n
    for s, deps in enumerate(g.deps):
        remaining[s] = len(deps)
        for d in deps:
            succ[d].append(s)
    events: list[tuple[int, int]] = []
    for s in range(n):
        if remaining[s] == 0:
            heappush(events, (dur[s], s))
    t = 0
    while events:
        t, s = heappop(events)
        for u in succ[s]:
            remaining[u] -= 1
            if remaining[u] == 0:
                heappush(events, (t + dur[u], u))
    return t


def numpy_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """softmax(scale·QKᵀ)·V in one vectorised float32 pass."""
    s = (q @ k.T) * np.float32(1.0 / math.sqrt(q.shape[1]))
    p = np.exp(s - s.max(axis=1, keepdims=True))
    return (p / p.sum(axis=1, keepdims=True)) @ v
