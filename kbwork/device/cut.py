"""A device run in two phases at a cut (DESIGN.md §14, §16): each PE's launches that wait for nothing, apart;
then the launches that wait, together. An exact reduction, as the groups and replicas of :mod:`.device` are.

Why: an ``after`` edge, or a transfer on another PE's channel, puts PEs in one group, simulated in one event
loop. In a split-KV layer (§16) that is every PE with a chunk, and only because of the merges at the end: the
tasks and chunks before them never meet. In one loop, the device steady state must find every PE of the group
at an iteration boundary at once, which PEs running different loops out of phase rarely are, and the whole
group is simulated stage by stage.

**The cut.** Per PE, its first ``n`` launches (the *first phase*), ``n`` at most the index of its first launch
with an ``after`` dependency, such that:

* every first-phase launch X of PE p that moves bytes on a channel a second-phase launch S of another PE moves
  bytes on happens before S (:class:`~kbwork.device.order.Order`): S's first DISPATCH waits for X's end (through
  program order and ``after`` edges), so no transfer of S shares a cycle of that channel with one of X;
* a second-phase launch that is after a first-phase launch is after the last of its PE's first phase, whose
  end is that PE's first phase's last cycle.

The cut starts at every PE's first launch with a dependency and moves earlier until both hold.

**The phases.** The first phases are a device run of their own (:func:`~kbwork.device.device.simulate_device`:
groups by their own contended channels, replicas, the steady state per PE). Then the second phases are one:
grouped by their own channels and ``after`` edges, each PE starting its first second-phase launch when its first
phase ended (as a launch waits for the previous one), a dependency on a first-phase launch a constant gate
(its end + ``sync_cycles``). Nothing a second-phase loop computes depends on what the first-phase loops did
but these cycles: a PE is idle between launches, and no transfer of the first phase is in flight on a channel a
second-phase transfer uses. A PE's records are its two phases' joined (:mod:`.join`).
"""

from __future__ import annotations

from typing import Any, Sequence

from ..pe.scheduler import Program
from .order import Deps, Order


def cut_points(programs: dict[int, Sequence[Program]], launch_uses: dict[int, list[Any]], deps: Deps
               ) -> dict[int, int]:
    """PE -> how many of its first launches form its first phase (module docstring), for a plan with ``after``
    edges (``deps``: every PE's, ``order.resolve_after``); ``launch_uses``: each launch's
    :class:`~kbwork.device.device.Uses`."""
    n = {}
    for pe in sorted(programs):
        rows = deps.get(pe, [])
        n[pe] = next((i for i, ds in enumerate(rows) if ds), len(programs[pe]))
    order = Order(deps)
    changed = True
    while changed:
        changed = False
        # a second-phase launch after a first-phase one: after the last of that PE's first phase
        for pe in sorted(programs):
            for i in range(n[pe], len(programs[pe])):
                for q, j in deps[pe][i]:
                    if j < n[q] - 1:
                        n[q], changed = j + 1, True
        later: dict[int, list[tuple[int, int]]] = {}  # channel -> the second-phase launches moving bytes on it
        for q in sorted(programs):
            for j in range(n[q], len(programs[q])):
                for c in sorted(launch_uses[q][j].channels):
                    later.setdefault(c, []).append((q, j))
        for p in sorted(programs):
            for i in range(n[p]):
                if any(q != p and not order.before((p, i), (q, j))
                       for c in sorted(launch_uses[p][i].channels) for q, j in later.get(c, ())):
                    n[p], changed = i, True  # X might share a cycle with S: it and what follows go to phase two
                    break
    return n


def worth_cutting(programs: dict[int, Sequence[Program]], n: dict[int, int]) -> bool:
    """Whether the cut ``n`` leaves something in both phases."""
    return any(n[p] for p in programs) and any(n[p] < len(programs[p]) for p in programs)


def second_phase(programs: dict[int, Sequence[Program]], n: dict[int, int], first: dict[int, tuple],
                 deps: Deps, sync: int) -> tuple[dict[int, list[Program]], Deps, dict[int, int],
                                                dict[int, list[int]], dict[int, int]]:
    """What the second phase runs: PE -> its launches after the cut; their dependencies among themselves
    (launches renumbered from the cut); PE -> the cycle its first phase ended (``begin``); PE -> per launch the
    gate its first-phase dependencies set (their end + ``sync``, or -1); PE -> its first-phase commands."""
    rest = {p: list(programs[p][n[p]:]) for p in sorted(programs) if n[p] < len(programs[p])}
    ends = {p: first[p][0].cycles for p in first}
    local: Deps = {}
    begins: dict[int, int] = {}
    gates: dict[int, list[int]] = {}
    offsets: dict[int, int] = {}
    for p, launches in rest.items():
        begins[p] = ends[p] if n[p] else 0
        offsets[p] = sum(prog.n_commands for prog in programs[p][:n[p]])
        rows, gate = [], []
        for i in range(n[p], len(programs[p])):
            inner, g = [], -1
            for q, j in deps[p][i]:
                if j >= n[q]:
                    inner.append((q, j - n[q]))
                else:  # (the cut made it the last of q's first phase)
                    g = max(g, ends[q] + sync)
            rows.append(tuple(inner))
            gate.append(g)
        local[p] = rows
        gates[p] = gate
    return rest, local, begins, gates, offsets
