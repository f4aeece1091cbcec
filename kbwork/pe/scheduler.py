"""PE_SCHEDULER: every command becomes DISPATCH + PLAN + its plan's stages.

``schedule(commands, topo)`` builds the static part of a program: the stage
table (seq = creation order: for each command in program order its DISPATCH,
its PLAN, then its plan stages), the per-command bookkeeping the timeline
needs, and each command's hazard footprint (byte ranges read and written).
The dynamic part (queue depth, hazard holds, engine arbitration) happens in
``timeline.py``. This module is recipe-free: it sees flat op lists only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from ..config import Topology
from .commands import Command, DmaCmd, dispatch_cycles
from .engines import Latency
from .stages import Phase, StageKind, StageTable
from .templates import PLAN_CACHE, SEEN_ONCE, UNSEEN, PlanTemplate, record, signature_key, stamp
from .tiling import StagingRing, generate_plan_from_ops

#: A byte range in one memory: (space is TCM, first byte, one past the last); ``Handle.span``.
Range = tuple[bool, int, int]


def footprint(cmd: Command) -> tuple[tuple[Range, ...], tuple[Range, ...]]:
    """The byte ranges ``cmd`` reads and writes, for hazard tracking (DESIGN.md §5).

    Reads are every operand handle; writes are every ``out`` plus the
    ``rw_handles``. Recipe scratch is the ``out`` of the recipe's ops, so it
    counts as written: commands sharing scratch are ordered, and bytes a
    scratch scope released are not overwritten while a command using them is
    in flight. (The scheduler's staging buffers never appear in ops; the
    staging ring orders them.)
    """
    if isinstance(cmd, DmaCmd):
        return (cmd.src.span,), (cmd.dst.span,)
    ops = cmd.ops
    try:
        reads = dict.fromkeys([s for op in ops for s in op.read_spans])
    except TypeError:  # an op whose operands are not handles: let the handles say what is wrong
        reads = dict.fromkeys([h.span for op in ops for h in op.operands.values()])
    writes = dict.fromkeys([op.out.span for op in ops if op.out is not None]
                           + [h.span for h in cmd.rw_handles] + [h.span for h in cmd.scratch])
    return tuple(reads), tuple(writes)


def _overlap(xs: tuple[Range, ...], ys: tuple[Range, ...]) -> bool:
    for s1, lo1, hi1 in xs:
        for s2, lo2, hi2 in ys:
            if s1 == s2 and lo1 < hi2 and lo2 < hi1:
                return True
    return False


def conflicts(reads_a: tuple[Range, ...], writes_a: tuple[Range, ...],
              reads_b: tuple[Range, ...], writes_b: tuple[Range, ...]) -> bool:
    """True when a's reads or writes overlap b's writes, or a's writes overlap b's reads."""
    return _overlap(reads_a, writes_b) or _overlap(writes_a, writes_b) or _overlap(writes_a, reads_b)


@dataclass
class Program:
    """The static schedule of a program (built by :func:`schedule`).

    Per command ``i``: ``dispatch_seq[i]``, ``plan_seq[i]``, its plan stages
    ``plan_first[i] .. plan_end[i] - 1``, ``reads[i]``/``writes[i]`` (hazard
    footprint) and ``waits[i]`` (commands whose completion ``tl.wait`` put
    before its dispatch).
    """

    topo: Topology
    table: StageTable
    commands: tuple[Command, ...]
    dispatch_seq: list[int] = field(default_factory=list)
    plan_seq: list[int] = field(default_factory=list)
    plan_first: list[int] = field(default_factory=list)
    plan_end: list[int] = field(default_factory=list)
    reads: list[tuple[Range, ...]] = field(default_factory=list)
    writes: list[tuple[Range, ...]] = field(default_factory=list)
    waits: list[tuple[int, ...]] = field(default_factory=list)
    labels: list[str] = field(default_factory=list)
    iters: list[int] = field(default_factory=list)
    logical_bytes: list[int] = field(default_factory=list)

    def __repr__(self) -> str:
        return f"Program({len(self.commands)} commands, {len(self.table)} stages, {self.topo.name})"

    def edge_reach(self) -> int:
        """How many commands ahead a static edge reaches: the largest ``cmd(s) - cmd(p)`` over every plan
        stage ``s`` and its dependency ``p`` (staging-ring edges reach back to earlier commands)."""
        cmd, preds, kind = self.table.cmd, self.table.preds, self.table.kind
        plan = int(StageKind.PLAN)
        reach = 0
        for s, ps in enumerate(preds):
            if kind[s] > plan and ps:
                reach = max(reach, cmd[s] - min(cmd[q] for q in ps))
        return reach


def schedule(commands: Sequence[Command], topo: Topology, *, waits: Sequence[tuple[int, int]] = (),
             with_effects: bool = False, staging_base: int = 0, templates: bool = True) -> Program:
    """Lower a program's commands to the full stage table.

    Args:
        commands: in program order; ``commands[i].completion.cmd`` must be ``i``.
        topo: the topology.
        waits: ``(before_cmd, wait_for_cmd)`` pairs from ``tl.wait``.
        with_effects: record data-mode effects on the stages.
        staging_base: TCM address of the scheduler's staging buffers.
        templates: without effects, plan each composite signature once and
            stamp repeats from its template (the plan cache, ``pe.templates``);
            the stage table is the same either way. ``False`` plans every
            command afresh.

    Returns:
        The :class:`Program`.
    """
    table = StageTable(with_effects)
    ring = StagingRing(topo, staging_base)
    lat = Latency(topo)
    prog = Program(topo, table, tuple(commands))
    wait_map: dict[int, list[int]] = {}
    for before, target in waits:
        wait_map.setdefault(before, []).append(target)
    fixed, r, cap = topo.fixed_cycles, topo.r_fraction, topo.max_composite_logical_bytes
    dkind, pkind = int(StageKind.DISPATCH), int(StageKind.PLAN)
    dphase, pphase = int(Phase.DISPATCH), int(Phase.PLAN)
    dcache: dict[int, int] = {}     # logical bytes -> dispatch cycles, for this program
    pcache: dict[int, int] = {}     # ops -> plan cycles
    rows = table.rows               # DISPATCH and PLAN rows are appended here directly (the hot loop)
    dispatch_seq = prog.dispatch_seq
    fps: list[tuple[tuple[Range, ...], tuple[Range, ...]]] = []
    # signature key -> PlanTemplate, SEEN_ONCE, or None if not templatable; kept across runs
    plans = PLAN_CACHE.plans_for(topo) if (templates and not with_effects) else None
    prev_d: tuple[int, ...] = ()
    prev_p: tuple[int, ...] = ()
    for i, cmd in enumerate(commands):
        if cmd.completion.cmd != i:
            raise ValueError(f"command {cmd!r} is at position {i} but carries id {cmd.completion.cmd}")
        ops = cmd.ops
        is_dma = cmd.__class__ is DmaCmd
        kind = "dma" if is_dma else "composite"
        lb = cmd.logical_bytes
        dc = dcache.get(lb)
        if dc is None:
            dc = dcache[lb] = dispatch_cycles(lb, fixed, r, cap)
        n_op = 1 if is_dma else len(ops)  # a DmaCmd plans as one op
        pc = pcache.get(n_op)
        if pc is None:
            pc = pcache[n_op] = lat.plan(n_op)
        d = len(rows)
        rows.append((dkind, dphase, i, kind, -1, -1, "", lb, dc, prev_d, None))
        rows.append((pkind, pphase, i, kind, -1, -1, "", 0, pc, (d,) + prev_p, None))
        p = d + 1
        prev_d, prev_p = (d,), (p,)
        dispatch_seq.append(d)
        fps.append(footprint(cmd))
        key = signature_key(cmd) if plans is not None and not is_dma else None
        if key is None:
            generate_plan_from_ops(cmd, topo, table, ring, lat, after=(p,))
            continue
        tpl = plans.get(key)
        if tpl.__class__ is PlanTemplate:
            stamp(tpl, cmd, table, ring, p)
            continue
        generate_plan_from_ops(cmd, topo, table, ring, lat, after=(p,))
        # record on the second sighting: a one-off command (the final store) never pays for it
        if tpl is UNSEEN:
            plans.put(key, SEEN_ONCE)
        elif tpl is SEEN_ONCE:
            plans.put(key, record(cmd, topo, lat))
    table.touched()
    # every command's stages are DISPATCH, PLAN, then its plan: the rest follows from dispatch_seq
    prog.plan_seq = [d + 1 for d in dispatch_seq]
    prog.plan_first = [d + 2 for d in dispatch_seq]
    prog.plan_end = dispatch_seq[1:] + [len(table)]
    prog.reads = [f[0] for f in fps]
    prog.writes = [f[1] for f in fps]
    prog.waits = [tuple(sorted(wait_map[i])) if i in wait_map else () for i in range(len(commands))]
    prog.labels = [c.label for c in commands]
    prog.iters = [c.iter for c in commands]
    prog.logical_bytes = [c.logical_bytes for c in commands]
    table.seal()  # the program is complete: columns from here on, and the row tuples go
    return prog
