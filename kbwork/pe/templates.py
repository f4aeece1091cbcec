"""Plan templates: the stages of a command recorded once and stamped for every repeat.

A loop emits the same commands tile after tile; only addresses and names
change (``K[0:128]``, ``K[128:256]``, ...). The stages the scheduler plans
for a composite depend on nothing else than its ops' signatures
(:attr:`OpSpec.signature`: kinds, scopes, spaces, shapes, dtypes, pinning,
GEMM sizes), on where the staging ring stands, and on the names of the
handles it streams. So a command is planned by
:func:`~kbwork.pe.tiling.generate_plan_from_ops` as usual until its
signature is seen a second time; then it is also recorded as a
:class:`PlanTemplate`: every row with its dependencies made relative
(to the plan's first stage, to the PLAN stage it follows, or to "the stage
that last consumed the staging buffer this read takes") and its tensor name
made a reference to the operand it came from. Later commands with the same
signature are stamped from it: a few tuple operations per stage instead of
the plan generator's per-tile arithmetic.

Templates live in :data:`PLAN_CACHE`, the simulator's one cache (see
:class:`PlanCache` for its key, bounds and clearing). They carry no data-mode
effects, so only timing mode uses them; a test checks that templated and
freshly generated schedules give byte-identical op_logs.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, fields
from typing import Optional

from ..config import Topology
from . import ops
from .commands import CompositeCmd
from .engines import Latency
from .engines import StagingRef
from .stages import Engine, Phase, RawStageTable, StageKind, StageTable
from .tiling import StagingRing, generate_plan_from_ops, named_handles

_AFTER = -1  # the stage the plan's roots follow (the command's PLAN)


@dataclass(frozen=True, slots=True)
class PlanTemplate:
    """One command's plan with relative dependencies, as columns to extend a stage table with.

    ``kind, engine, phase, op_kind, tile, k_tile, nbytes, dur``: the stages' columns, as the planner made
    them. ``preds``: per stage the local stage indices it depends on (>= 0), ``-1`` (the PLAN stage) or
    ``-2 - ext`` (the consumer the staging ring holds for relative buffer ``ext`` before the plan starts).
    ``tensor``: per stage an index into ``tensors``, each a literal name or a tuple of ``paths`` indices
    joined by ``|``. ``paths``: ``(op index, operand name or None for out)`` whose names the stages use.
    ``chan``: per stage the ``paths`` index of the HBM handle a DMA stage moves (its channel is that
    handle's), -1 for every other stage.
    ``externals``: ``(pred code, slot, relative buffer)`` of every ring marker the rows use.
    ``ring``: per slot the plan takes buffers from, ``(slot, buffers taken, ((relative buffer, local stage
    that last consumes it), ...))``.
    """

    kind: tuple[int, ...]
    engine: tuple[int, ...]
    phase: tuple[int, ...]
    op_kind: tuple[str, ...]
    tile: tuple[int, ...]
    k_tile: tuple[int, ...]
    nbytes: tuple[int, ...]
    dur: tuple[int, ...]
    preds: tuple[tuple[int, ...], ...]
    tensor: tuple[int, ...]
    tensors: tuple[object, ...]
    paths: tuple[tuple[int, str | None], ...]
    externals: tuple[tuple[int, str, int], ...]
    ring: tuple[tuple[str, int, tuple[tuple[int, int], ...]], ...]
    chan: tuple[int, ...] = ()

    def __len__(self) -> int:
        return len(self.kind)

    def __repr__(self) -> str:
        taken = {slot: n for slot, n, _ in self.ring}
        return f"PlanTemplate({len(self.kind)} stages, staging buffers taken {taken})"


class _RecordingRing(StagingRing):
    """A staging ring that reports buffers relative to where the plan starts.

    The k-th buffer a plan takes from a slot is relative buffer
    ``k % tile_buffers``; its previous consumer is a stage of the plan if the
    plan already bound that relative buffer, else whatever the real ring
    holds there (an external marker, resolved when stamping). ``acquire`` is
    the real ring's: counting from 0, the buffer it returns is the relative one.
    """

    def __init__(self, topo: Topology):
        super().__init__(topo)
        n = self.n_buffers
        self.ext_base = {slot: i * n for i, slot in enumerate(self.SLOTS)}
        self._consumer = {slot: [-2 - (self.ext_base[slot] + r) for r in range(n)] for slot in self.SLOTS}
        self.local_binds = {slot: [-1] * n for slot in self.SLOTS}

    def bind(self, slot: str, buf: int, consumer_seq: int) -> None:
        super().bind(slot, buf, consumer_seq)
        self.local_binds[slot][buf] = consumer_seq

    def handle(self, slot: str, buf: int, shape: tuple[int, ...], dtype: str) -> StagingRef:
        # an effect template names the buffer by its relative index: the real one depends on where the ring
        # stands when the template is stamped
        return StagingRef(slot, buf, shape, dtype)


def record_effects(cmd: CompositeCmd, topo: Topology, lat: Latency) -> tuple:
    """The data-mode effects of ``cmd``'s plan stages, as a template (one per plan stage, ``None`` where a stage
    has none): they name ``cmd``'s own handles (loop handles included), staging buffers as
    :class:`~kbwork.pe.engines.StagingRef` and accumulators by ``cmd``'s id; ``engines.BINDERS`` binds them
    to an instance. The stages are those of the command's :class:`PlanTemplate`, in the same order."""
    table = RawStageTable(with_effects=True)
    generate_plan_from_ops(cmd, topo, table, _RecordingRing(topo), lat, after=(_AFTER,))
    return tuple(table.effects)


#: Topology fields no plan reads: dispatch calibration, queue depth and hazard policy act in the
#: scheduler's loop and the timeline, names are labels. Every other field (a new one included)
#: keys the cache.
_NOT_PLANNED = frozenset({"name", "source", "clock_ghz", "fixed_cycles", "r_cycles_per_byte",
                          "max_composite_logical_bytes", "cmd_queue_depth", "hazard_policy",
                          "plan_base_cycles", "plan_cycles_per_op", "pes", "hbm_channels", "hbm_gib"})
_PLAN_FIELDS = tuple(f.name for f in fields(Topology) if f.name not in _NOT_PLANNED)

#: Marks a signature planned once so far: the scheduler records it on the next sighting.
SEEN_ONCE = object()
#: What :meth:`PlanTable.get` returns for a signature never planned.
UNSEEN = object()


def plan_key(topo: Topology) -> tuple:
    """The values of the topology fields a plan can depend on (tiles, buffers, latencies, TCM)."""
    return tuple([getattr(topo, f) for f in _PLAN_FIELDS])


class PlanCache:
    """The one cache of the simulator: plan templates, at the boundary where flat ops meet the scheduler.

    A template depends on nothing but its key, so it stays valid across runs
    and calibrations: the key is the command's op signatures
    (:attr:`OpSpec.signature`: kinds, scopes, spaces, shapes, dtypes,
    pinning, GEMM sizes), the topology fields plans read (:func:`plan_key`)
    and the op table's content (:func:`ops.table_key`), so editing either
    takes effect at once. Plans only ever see flat ops: no recipe knowledge
    enters the key. Bounded (``max_tables`` topology/op-table combinations,
    least recently used dropped first; ``max_plans`` signatures each, oldest
    dropped first), safe to share between threads, and emptied by
    :func:`kbwork.clear_caches`. Only timing mode uses it (data mode needs each
    stage's effect).
    """

    def __init__(self, max_tables: int = 16, max_plans: int = 4096):
        self.max_tables = max_tables
        self.max_plans = max_plans
        self._lock = threading.Lock()
        self._tables: dict[tuple, dict[tuple, object]] = {}  # insertion order is recency order

    def __repr__(self) -> str:
        with self._lock:
            n = sum(len(t) for t in self._tables.values())
            return f"PlanCache({len(self._tables)} topologies, {n} signatures)"

    def __len__(self) -> int:
        with self._lock:
            return sum(len(t) for t in self._tables.values())

    def plans_for(self, topo: Topology) -> "PlanTable":
        """The table of plans for ``topo``'s plan-relevant fields under the current op table."""
        key = (plan_key(topo), ops.table_key())
        with self._lock:
            plans = self._tables.pop(key, None)
            if plans is None:
                plans = {}
                while len(self._tables) >= self.max_tables:
                    del self._tables[next(iter(self._tables))]
            self._tables[key] = plans
        return PlanTable(self._lock, plans, self.max_plans)

    def clear(self) -> None:
        """Forget every plan."""
        with self._lock:
            self._tables.clear()


class PlanTable:
    """One topology's plans: signature key -> :class:`PlanTemplate`, ``SEEN_ONCE``, or None (not templatable)."""

    __slots__ = ("_lock", "_plans", "_max")

    def __init__(self, lock: threading.Lock, plans: dict[tuple, object], max_plans: int):
        self._lock, self._plans, self._max = lock, plans, max_plans

    def __repr__(self) -> str:
        return f"PlanTable({len(self._plans)} signatures)"

    def __len__(self) -> int:
        return len(self._plans)

    def get(self, key: tuple) -> object:
        """The entry for ``key``, or ``UNSEEN``."""
        with self._lock:
            return self._plans.get(key, UNSEEN)

    def put(self, key: tuple, value: object) -> None:
        with self._lock:
            plans = self._plans
            if key not in plans:
                while len(plans) >= self._max:
                    del plans[next(iter(plans))]
            plans[key] = value


PLAN_CACHE = PlanCache()


def signature_key(cmd: CompositeCmd) -> Optional[tuple]:
    """The plan cache's key of a composite: its ops' signatures, or None if one is unknown."""
    key = tuple([op.signature for op in cmd.ops])
    return None if None in key else key


def record(cmd: CompositeCmd, topo: Topology, lat: Latency) -> PlanTemplate | None:
    """Record ``cmd``'s plan as a template; None if it cannot be expressed as one.

    Call only for a command whose plan was already generated without error.
    Stage names must map back to the handles tiling names stages after
    (``tiling.named_handles``), so those must have distinct, non-empty names
    without ``|``; a command whose do not is planned afresh every time.
    """
    paths = named_handles(cmd)
    names = handle_names(cmd, paths)
    if len(set(names)) != len(names) or any(not n or "|" in n for n in names):
        return None
    where = {name: i for i, name in enumerate(names)}
    table = RawStageTable(with_effects=False)
    ring = _RecordingRing(topo)
    generate_plan_from_ops(cmd, topo, table, ring, lat, after=(_AFTER,))

    tensors: list[object] = []
    tensor_index: dict[str, int] = {}
    used: dict[int, int] = {}  # index in paths -> index in the template's paths
    codes: set[int] = set()
    tensor_of = []
    chan_of = []
    for kind, tensor, preds, chan in zip(table.kind, table.tensor, table.preds, table.chan):
        ti = tensor_index.get(tensor)
        if ti is None:
            if tensor:
                try:
                    spec: object = tuple(used.setdefault(where[part], len(used)) for part in tensor.split("|"))
                except KeyError:
                    return None  # a name that is not one of the named handles: plan such commands afresh
            else:
                spec = tensor
            ti = tensor_index[tensor] = len(tensors)
            tensors.append(spec)
        codes.update(x for x in preds if x < _AFTER)
        tensor_of.append(ti)
        if chan >= 0:  # a DMA stage: its channel is that of the one handle it names
            spec = tensors[ti]
            if spec.__class__ is str or len(spec) != 1:
                return None
            chan_of.append(spec[0])
        else:
            chan_of.append(-1)
    n = ring.n_buffers
    externals = tuple((code, ring.SLOTS[(-2 - code) // n], (-2 - code) % n) for code in sorted(codes, reverse=True))
    ring_use = tuple((slot, ring._count[slot], tuple((r, local) for r, local in enumerate(ring.local_binds[slot])
                                                    if local >= 0))
                     for slot in ring.SLOTS if ring._count[slot])
    used_paths = tuple(paths[i] for i, _ in sorted(used.items(), key=lambda ik: ik[1]))
    return PlanTemplate(tuple(table.kind), tuple(table.engine), tuple(table.phase), tuple(table.op_kind),
                        tuple(table.tile), tuple(table.k_tile), tuple(table.nbytes), tuple(table.dur),
                        tuple(table.preds), tuple(tensor_of), tuple(tensors), used_paths, externals, ring_use,
                        tuple(chan_of))


def path_handles(cmd: CompositeCmd, paths: tuple[tuple[int, str | None], ...]) -> list:
    """The handles ``paths`` point at in ``cmd`` (``(op index, operand or None for out)``)."""
    ops = cmd.ops
    return [(ops[oi].out if port is None else ops[oi].operands[port]) for oi, port in paths]


def handle_names(cmd: CompositeCmd, paths: tuple[tuple[int, str | None], ...]) -> list[str]:
    """The names of the handles ``paths`` point at in ``cmd``."""
    return [h.name for h in path_handles(cmd, paths)]





_D, _P = int(StageKind.DISPATCH), int(StageKind.PLAN)
_CPU, _SCHED = int(Engine.PE_CPU), int(Engine.PE_SCHEDULER)
_PD, _PP = int(Phase.DISPATCH), int(Phase.PLAN)


@dataclass(frozen=True, slots=True)
class CommandTemplate:
    """A whole command's stages — DISPATCH, PLAN, then its plan — as the columns a :class:`StageTable`
    is extended with (see ``StageTable`` for ``lpreds``, ``lsucc``, ``npred``).

    Made from a :class:`PlanTemplate` and the command's dispatch and plan cycles, which the plan cache
    does not key on (they depend on the calibration). ``ext_rows`` are ``(local stage, pred codes)`` of
    the stages that wait for a staging buffer's previous consumer (codes as in ``PlanTemplate.preds``).
    """

    plan: PlanTemplate
    kind: tuple[int, ...]
    engine: tuple[int, ...]
    phase: tuple[int, ...]
    op_kind: tuple[str, ...]
    tile: tuple[int, ...]
    k_tile: tuple[int, ...]
    nbytes: tuple[int, ...]
    dur: tuple[int, ...]
    lpreds: tuple[tuple[int, ...], ...]
    lsucc: tuple[tuple[int, ...], ...]
    npred: tuple[int, ...]
    tensor: tuple[int, ...]
    ext_rows: tuple[tuple[int, tuple[int, ...]], ...]
    chan: tuple[int, ...]

    def __len__(self) -> int:
        return len(self.kind)

    @staticmethod
    def of(tpl: PlanTemplate, logical_bytes: int, dispatch: int, plan: int, dur: tuple[int, ...] | None = None,
           op_kind: str = "composite") -> "CommandTemplate":
        """The command template of a plan template, with its DISPATCH and PLAN costs (and, if given, the plan
        stages' durations instead of the template's)."""
        lpreds: list[tuple[int, ...]] = [(), (0,)]
        ext_rows = []
        for x, ps in enumerate(tpl.preds):
            lpreds.append(tuple(1 if q == _AFTER else q + 2 for q in ps if q >= _AFTER))
            codes = tuple(q for q in ps if q < _AFTER)
            if codes:
                ext_rows.append((x + 2, codes))
        n = len(tpl.kind) + 2
        lsucc: list[list[int]] = [[] for _ in range(n)]
        for u in range(2, n):
            for q in lpreds[u]:
                lsucc[q].append(u)
        return CommandTemplate(
            tpl, (_D, _P) + tpl.kind, (_CPU, _SCHED) + tpl.engine, (_PD, _PP) + tpl.phase, (op_kind, op_kind) + tpl.op_kind,
            (-1, -1) + tpl.tile, (-1, -1) + tpl.k_tile, (logical_bytes, 0) + tpl.nbytes,
            (dispatch, plan) + (tpl.dur if dur is None else dur), tuple(lpreds), tuple(tuple(x) for x in lsucc),
            (0, 0) + tuple(len(p) for p in lpreds[2:]), (-1, -1) + tpl.tensor, tuple(ext_rows),
            (-1, -1) + (tpl.chan or (-1,) * len(tpl.kind)))


def stamp(ct: CommandTemplate, cid: int, names: list[str], chans: list[int], table: StageTable,
          ring: StagingRing, prev_d: tuple[int, ...], prev_p: tuple[int, ...]) -> list[tuple[int, int]]:
    """Append command ``cid``'s stages (DISPATCH, PLAN, plan) to ``table`` from ``ct`` and advance ``ring`` as
    generating them would.

    ``names`` and ``chans`` are the names and channels of the handles of ``ct.plan.paths`` in this command
    (``path_handles``), which its stages carry;
    ``prev_d``/``prev_p`` the previous command's DISPATCH/PLAN (program order, for the analysis).

    Returns:
        ``(stage, earlier stage)`` for every dependency on an earlier command's stage (the staging ring's
        previous consumers).
    """
    tpl = ct.plan
    base = table.begin()
    tensors = [t if t.__class__ is str else "|".join([names[i] for i in t]) for t in tpl.tensors] + [""]
    k = len(ct.kind)
    table.kind += ct.kind
    table.engine += ct.engine
    table.phase += ct.phase
    table.cmd += [cid] * k
    table.op_kind += ct.op_kind
    table.tile += ct.tile
    table.k_tile += ct.k_tile
    table._tensor += [tensors[i] for i in ct.tensor]
    table.nbytes += ct.nbytes
    table.dur += ct.dur
    table.effects += [None] * k
    table.chan += [chans[x] if x >= 0 else -1 for x in ct.chan]
    table.lpreds += ct.lpreds
    xpreds = table.xpreds
    xpreds += [()] * k
    xpreds[base] = prev_d
    xpreds[base + 1] = prev_p
    table.lsucc += ct.lsucc
    table.npred += ct.npred
    ext_edges: list[tuple[int, int]] = []
    n = ring.n_buffers
    count, consumer = ring._count, ring._consumer
    if ct.ext_rows:
        # what each pred code stands for: the consumer the ring holds for that buffer before this plan
        ext: dict[int, int | None] = {code: consumer[slot][(count[slot] + r) % n] for code, slot, r in tpl.externals}
        for row, codes in ct.ext_rows:
            xs = tuple(q for q in (ext[c] for c in codes) if q is not None)
            if xs:
                xpreds[base + row] = xs
                ext_edges += [(base + row, q) for q in xs]
    for slot, taken, binds in tpl.ring:
        n0 = count[slot]
        count[slot] = n0 + taken
        consumers = consumer[slot]
        for r, local in binds:
            consumers[(n0 + r) % n] = base + 2 + local
    return ext_edges
