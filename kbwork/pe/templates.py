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
from .stages import StageTable
from .tiling import StagingRing, generate_plan_from_ops, named_handles

_AFTER = -1  # the stage the plan's roots follow (the command's PLAN)


@dataclass(frozen=True, slots=True)
class PlanTemplate:
    """One command's plan with relative dependencies.

    ``rows``: ``(kind, phase, op_kind, tile, k_tile, tensor, nbytes, dur, preds)``
    where ``tensor`` indexes ``tensors`` and each pred is a local stage index
    (>= 0), ``-1`` (the PLAN stage) or ``-2 - ext`` (the consumer the staging
    ring holds for relative buffer ``ext`` before the plan starts).
    ``tensors``: literal names, or tuples of ``paths`` indices joined by ``|``.
    ``paths``: ``(op index, operand name or None for out)`` whose names rows use.
    ``externals``: ``(pred code, slot, relative buffer)`` of every ring marker the rows use.
    ``ring``: per slot the plan takes buffers from, ``(slot, buffers taken,
    ((relative buffer, local stage that last consumes it), ...))``.
    """

    rows: tuple[tuple, ...]
    tensors: tuple[object, ...]
    paths: tuple[tuple[int, str | None], ...]
    externals: tuple[tuple[int, str, int], ...]
    ring: tuple[tuple[str, int, tuple[tuple[int, int], ...]], ...]

    def __repr__(self) -> str:
        taken = {slot: n for slot, n, _ in self.ring}
        return f"PlanTemplate({len(self.rows)} stages, staging buffers taken {taken})"


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


#: Topology fields no plan reads: dispatch calibration, queue depth and hazard policy act in the
#: scheduler's loop and the timeline, names are labels. Every other field (a new one included)
#: keys the cache.
_NOT_PLANNED = frozenset({"name", "source", "clock_ghz", "fixed_cycles", "r_cycles_per_byte",
                          "max_composite_logical_bytes", "cmd_queue_depth", "hazard_policy",
                          "plan_base_cycles", "plan_cycles_per_op"})
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
    names = _names(cmd, paths)
    if names is None:
        return None
    where = {name: i for i, name in enumerate(names)}
    table = StageTable(with_effects=False)
    ring = _RecordingRing(topo)
    generate_plan_from_ops(cmd, topo, table, ring, lat, after=(_AFTER,))

    tensors: list[object] = []
    tensor_index: dict[str, int] = {}
    used: dict[int, int] = {}  # index in paths -> index in the template's paths
    codes: set[int] = set()
    rows = []
    for kind, phase, _cmd, op_kind, tile, k_tile, tensor, nbytes, dur, preds, _eff in table.rows:
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
        rows.append((kind, phase, op_kind, tile, k_tile, ti, nbytes, dur, preds))
    n = ring.n_buffers
    externals = tuple((code, ring.SLOTS[(-2 - code) // n], (-2 - code) % n) for code in sorted(codes, reverse=True))
    ring_use = tuple((slot, ring._count[slot], tuple((r, local) for r, local in enumerate(ring.local_binds[slot])
                                                    if local >= 0))
                     for slot in ring.SLOTS if ring._count[slot])
    used_paths = tuple(paths[i] for i, _ in sorted(used.items(), key=lambda ik: ik[1]))
    return PlanTemplate(tuple(rows), tuple(tensors), used_paths, externals, ring_use)


def _names(cmd: CompositeCmd, paths: tuple[tuple[int, str | None], ...]) -> list[str] | None:
    ops = cmd.ops
    names = [(ops[oi].out if port is None else ops[oi].operands[port]).name for oi, port in paths]
    if len(set(names)) != len(names) or any(not n or "|" in n for n in names):
        return None
    return names


def stamp(tpl: PlanTemplate, cmd: CompositeCmd, table: StageTable, ring: StagingRing, plan_seq: int) -> None:
    """Append ``cmd``'s stages to ``table`` from ``tpl`` and advance ``ring`` as generating them would."""
    cid = cmd.completion.cmd
    base = len(table.rows)
    ops = cmd.ops
    names = [(ops[oi].out if port is None else ops[oi].operands[port]).name for oi, port in tpl.paths]
    tensors = [t if t.__class__ is str else "|".join([names[i] for i in t]) for t in tpl.tensors]
    # what each pred code stands for: the PLAN stage, then the ring's consumers before this plan
    n = ring.n_buffers
    count, consumer = ring._count, ring._consumer
    ext: dict[int, int | None] = {_AFTER: plan_seq}
    for code, slot, r in tpl.externals:
        ext[code] = consumer[slot][(count[slot] + r) % n]
    rows = table.rows
    for kind, phase, op_kind, tile, k_tile, ti, nbytes, dur, preds in tpl.rows:
        if len(preds) == 1:
            x = preds[0]
            pr: tuple[int, ...] = (base + x,) if x >= 0 else (() if ext[x] is None else (ext[x],))
        else:
            pr = tuple([p for p in [base + x if x >= 0 else ext[x] for x in preds] if p is not None])
        rows.append((kind, phase, cid, op_kind, tile, k_tile, tensors[ti], nbytes, dur, pr, None))
    table.touched()
    for slot, taken, binds in tpl.ring:
        n0 = count[slot]
        count[slot] = n0 + taken
        consumers = consumer[slot]
        for r, local in binds:
            consumers[(n0 + r) % n] = base + local
