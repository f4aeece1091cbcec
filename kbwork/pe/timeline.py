"""The deterministic event loop that runs a :class:`Program` (DESIGN.md §5).

Events are stage ends in a heap keyed by ``(time, seq)``. At each instant the
loop first retires every stage that ends then (in seq order: data effects,
successors, command completion, hazard checks), then lets each free engine
start the ready stage with the lowest seq (oldest first). Nothing depends on
dict or set iteration order.

Dynamic rules handled here rather than by static edges:

* PE_CPU dispatches in program order and stalls while ``cmd_queue_depth``
  commands are in flight (a command is in flight from the start of its
  DISPATCH until its last stage ends) or while a ``tl.wait`` is pending.
* PE_SCHEDULER plans in dispatch order. At the end of a PLAN the command is
  checked against every earlier command not yet complete. Under
  ``strict_fifo`` a conflicting command is held until every earlier command
  has completed, and no later command is planned meanwhile. Under
  ``rw_aware`` it waits only for the commands it conflicts with and later
  commands go ahead.
* A command's plan stages are released (its PLAN's successors notified) when
  its PLAN has ended and its hazard check has cleared.
"""

from __future__ import annotations

from heapq import heappop, heappush
from typing import Callable

from ..errors import SimulationError
from .scheduler import Program, conflicts
from .stages import StageKind

_DISPATCH, _PLAN = int(StageKind.DISPATCH), int(StageKind.PLAN)


def successors(prog: Program) -> list[list[int]]:
    """Successor lists of every stage (edges into DISPATCH/PLAN are gated dynamically, so left out)."""
    t = prog.table
    succ: list[list[int]] = [[] for _ in range(len(t))]
    kind = t.kind
    for s, preds in enumerate(t.preds):
        if kind[s] > _PLAN:
            for p in preds:
                succ[p].append(s)
    return succ


def simulate(prog: Program, apply: Callable[[object], None] | None = None,
             edges: list[list[int]] | None = None) -> tuple[list[int], list[int]]:
    """Run the program's timeline.

    Args:
        prog: the static program from ``scheduler.schedule``.
        apply: data mode: called with each stage's effect when it ends, in
            (end, seq) order. ``None`` for timing mode.
        edges: if given (one empty list per stage), receives the *dynamic*
            dependencies the run resolved — queue-slot and ``tl.wait`` waits,
            hazard holds, the scheduler blocked behind a held command — as the
            seq of the stage whose end released each stage. With the static
            ``preds`` they form the resolved stage graph (used by the benchmark
            to replay the timeline in an independent simulator).

    Returns:
        ``(start, end)``: integer cycles of every stage, indexed by seq.

    Raises:
        SimulationError: the program deadlocks (e.g. a ``tl.wait`` on a later command).
    """
    table = prog.table
    n = len(table)
    ncmd = len(prog.commands)
    dur, engine, kind, cmd_of = table.dur, table.engine, table.kind, table.cmd
    effects = table.effects
    succ = successors(prog)
    remaining = [len(p) for p in table.preds]
    start = [-1] * n
    end = [-1] * n
    events: list[tuple[int, int]] = []
    ready: list[list[int]] = [[], [], [], [], []]
    ready_dma, ready_gemm, ready_math = ready[2], ready[3], ready[4]
    busy = [False] * 5

    topo = prog.topo
    depth = topo.cmd_queue_depth
    strict = topo.hazard_policy == "strict_fifo"
    dispatch_seq, plan_seq = prog.dispatch_seq, prog.plan_seq
    reads, writes, waits = prog.reads, prog.writes, prog.waits
    cmd_left = [e - f for f, e in zip(prog.plan_first, prog.plan_end)]
    completed = [False] * ncmd
    first_incomplete = 0
    active: list[int] = []          # dispatched, not completed, ascending
    dispatched_end = 0              # commands whose DISPATCH has ended
    next_dispatch = 0
    next_plan = 0
    in_flight = 0
    held_strict = -1                # strict_fifo: the one held command, or -1
    held_count: dict[int, int] = {}  # rw_aware: held command -> conflicts left
    waiters: dict[int, list[int]] = {}  # rw_aware: command -> held commands waiting on it

    last_completion = (-1, -1)      # (time, stage) of the latest command completion
    last_release = (-1, -1)         # (time, stage) of the latest strict-FIFO release
    final_stage = [-1] * ncmd       # the stage that completed each command

    def release(c: int, by: int = -1) -> None:
        for u in succ[plan_seq[c]]:
            if edges is not None and by >= 0:
                edges[u].append(by)
            remaining[u] -= 1
            if remaining[u] == 0:
                heappush(ready[engine[u]], u)

    t = 0
    while True:
        # -- retire everything that ends at t ------------------------------------------
        while events and events[0][0] == t:
            s = heappop(events)[1]
            k = kind[s]
            e = engine[s]
            busy[e] = False
            if k > _PLAN:
                if apply is not None and effects[s] is not None:
                    apply(effects[s])
                for u in succ[s]:
                    left = remaining[u] - 1
                    remaining[u] = left
                    if not left:
                        heappush(ready[engine[u]], u)
                c = cmd_of[s]
                cmd_left[c] -= 1
                if cmd_left[c] == 0:
                    completed[c] = True
                    in_flight -= 1
                    active.remove(c)
                    final_stage[c] = s
                    last_completion = (t, s)
                    while first_incomplete < ncmd and completed[first_incomplete]:
                        first_incomplete += 1
                    if strict:
                        if held_strict >= 0 and first_incomplete >= held_strict:
                            h = held_strict
                            held_strict = -1
                            last_release = (t, s)
                            release(h, s)
                    else:
                        for h in waiters.pop(c, ()):
                            held_count[h] -= 1
                            if held_count[h] == 0:
                                del held_count[h]
                                release(h, s)
            elif k == _DISPATCH:
                dispatched_end += 1
            else:  # PLAN: hazard check against every earlier incomplete command
                c = cmd_of[s]
                rd, wr = reads[c], writes[c]
                hit = [o for o in active if o < c and conflicts(rd, wr, reads[o], writes[o])]
                if not hit:
                    release(c)
                elif strict:
                    held_strict = c
                else:
                    held_count[c] = len(hit)
                    for o in hit:
                        waiters.setdefault(o, []).append(c)
        # -- start what can start at t --------------------------------------------------
        if not busy[0] and next_dispatch < ncmd and in_flight < depth:
            c = next_dispatch
            wc = waits[c]
            if not wc or all(completed[w] for w in wc):
                s = dispatch_seq[c]
                if edges is not None:
                    edges[s].extend(final_stage[w] for w in waits[c])
                    if last_completion[0] == t:
                        edges[s].append(last_completion[1])
                start[s] = t
                end[s] = te = t + dur[s]
                heappush(events, (te, s))
                busy[0] = True
                in_flight += 1
                active.append(c)
                next_dispatch += 1
        if not busy[1] and next_plan < dispatched_end and held_strict < 0:
            s = plan_seq[next_plan]
            if edges is not None and last_release[0] == t:
                edges[s].append(last_release[1])
            start[s] = t
            end[s] = te = t + dur[s]
            heappush(events, (te, s))
            busy[1] = True
            next_plan += 1
        # the three data engines, unrolled (this runs once per instant)
        if ready_dma and not busy[2]:
            s = heappop(ready_dma)
            start[s] = t
            end[s] = te = t + dur[s]
            heappush(events, (te, s))
            busy[2] = True
        if ready_gemm and not busy[3]:
            s = heappop(ready_gemm)
            start[s] = t
            end[s] = te = t + dur[s]
            heappush(events, (te, s))
            busy[3] = True
        if ready_math and not busy[4]:
            s = heappop(ready_math)
            start[s] = t
            end[s] = te = t + dur[s]
            heappush(events, (te, s))
            busy[4] = True
        if not events:
            break
        t = events[0][0]

    if next_dispatch < ncmd or first_incomplete < ncmd:
        stuck = next_dispatch if next_dispatch < ncmd else first_incomplete
        why = ""
        if next_dispatch < ncmd and waits[stuck]:
            why = f" (it waits on command(s) {list(waits[stuck])}; a tl.wait must name an earlier command)"
        raise SimulationError(f"the timeline stopped at cycle {t} with command #{stuck} "
                              f"{prog.labels[stuck]!r} unfinished{why}: the program deadlocks.")
    return start, end
