"""Turn one command's flat op list into the stages of its pipeline plan.

``generate_plan_from_ops`` scans the ops for the GEMM (at most one, index g)
and places every op by position and scope (DESIGN.md §3):

=============  ===========  ==============  =====================================
position       scope        phase           placement
=============  ===========  ==============  =====================================
before g       KERNEL       prologue        once, before the tile loop
g              KERNEL       tile            drives the loop from extra m, k, n
after g        K_TILE       k_epilogue      after every k-tile GEMM
after g        OUTPUT_TILE  tile_epilogue   after the last k-tile of each tile
after g        KERNEL       post            once, after the last tile
=============  ===========  ==============  =====================================

A composite with no GEMM runs its ops in order, single-shot (phase
``single``). Prologue stages fold into the first tile and post-loop stages
into the last, so the tile feeder and completion counting are the same for
every composite: a command completes when all its stages have ended.

Operands that are not ``pinned`` stream through scheduler-owned staging
buffers (``tile_buffers`` per streamed operand slot) with one DMA_READ each;
the n-th read into a slot waits for the consumer of read n - tile_buffers.
"""

from __future__ import annotations

from typing import NamedTuple

from ..config import Topology
from ..errors import ValidationError
from ..memory import Handle, Space, itemsize
from .commands import Command, CompositeCmd, DmaCmd, OpSpec, Scope
from .engines import AccOp, CopyBlock, Effects, Fetch, GemmTile, Latency, MathAcc, MathOp, StoreAcc
from .ops import OPS
from .stages import Engine, Phase, StageKind, StageTable

_DMA_READ, _FETCH, _GEMM, _MATH, _DMA_WRITE = (int(StageKind.DMA_READ), int(StageKind.FETCH),
                                               int(StageKind.GEMM), int(StageKind.MATH),
                                               int(StageKind.DMA_WRITE))
_E_DMA, _E_GEMM, _E_MATH = int(Engine.PE_DMA), int(Engine.PE_GEMM), int(Engine.PE_MATH)
_PROLOGUE, _TILE, _KEPI, _TEPI, _POST, _SINGLE = (int(Phase.PROLOGUE), int(Phase.TILE), int(Phase.K_EPILOGUE),
                                                   int(Phase.TILE_EPILOGUE), int(Phase.POST),
                                                   int(Phase.SINGLE))
#: Staging buffers are sized for the widest element the PE handles.
_MAX_ITEMSIZE = 4


class StagingRing:
    """The scheduler's staging buffers in TCM: ``tile_buffers`` per slot ("a", "b").

    ``acquire`` hands out buffers round-robin and returns the seq of the stage
    that last consumed that buffer (the new DMA_READ must wait for it).
    """

    SLOTS = ("a", "b")

    def __init__(self, topo: Topology, base_addr: int = 0):
        self.n_buffers = topo.tile_buffers
        self.buf_bytes = self._buffer_bytes(topo)
        self.base_addr = base_addr
        self.addrs: dict[str, list[int]] = {}
        addr = base_addr
        for slot in self.SLOTS:
            self.addrs[slot] = [addr + i * self.buf_bytes[slot] for i in range(self.n_buffers)]
            addr += self.n_buffers * self.buf_bytes[slot]
        self.total_bytes = addr - base_addr
        self._count = {slot: 0 for slot in self.SLOTS}
        self._consumer: dict[str, list[int | None]] = {s: [None] * self.n_buffers for s in self.SLOTS}

    def __repr__(self) -> str:
        return f"StagingRing({self.n_buffers} x {self.buf_bytes}, {self.total_bytes} B at {self.base_addr:#x})"

    @staticmethod
    def _buffer_bytes(topo: Topology) -> dict[str, int]:
        return {"a": topo.tile_m * topo.tile_k * _MAX_ITEMSIZE, "b": topo.tile_k * topo.tile_n * _MAX_ITEMSIZE}

    @classmethod
    def bytes_for(cls, topo: Topology) -> int:
        """The TCM bytes the ring of ``topo`` occupies (``total_bytes``, without building one)."""
        return topo.tile_buffers * sum(cls._buffer_bytes(topo).values())

    def acquire(self, slot: str) -> tuple[int, int | None]:
        """Take the next buffer of ``slot``; return ``(buffer index, seq to wait for or None)``."""
        n = self._count[slot]
        self._count[slot] = n + 1
        buf = n % self.n_buffers
        return buf, self._consumer[slot][buf]

    def bind(self, slot: str, buf: int, consumer_seq: int) -> None:
        """Record the stage that consumes the data in ``buf``."""
        self._consumer[slot][buf] = consumer_seq

    def handle(self, slot: str, buf: int, shape: tuple[int, ...], dtype: str) -> Handle:
        return Handle(f"<staging {slot}{buf}>", Space.TCM, self.addrs[slot][buf], shape, dtype, True)


class PipelinePlan(NamedTuple):
    """The stages of one command: ``table`` rows ``first_seq .. end_seq - 1``.

    ``prologue_stages`` / ``epilogue_stages`` are the single-shot stages before
    and after the tile loop (post-loop), ``tile_last`` the last stage of each
    output tile (what completion counting waits for).
    """

    cmd: int
    table: StageTable
    first_seq: int
    end_seq: int
    n_tiles: int
    prologue_stages: tuple[int, ...] = ()
    epilogue_stages: tuple[int, ...] = ()
    tile_last: tuple[int, ...] = ()

    @property
    def n_stages(self) -> int:
        return self.end_seq - self.first_seq

    def __repr__(self) -> str:
        return (f"PipelinePlan(cmd {self.cmd}: {self.n_stages} stages, {self.n_tiles} tiles, "
                f"{len(self.prologue_stages)} prologue, {len(self.epilogue_stages)} post)")


def _n_elements(op: OpSpec, target: Handle | None) -> int:
    n = max((h.size for h in op.handles()), default=1)
    return max(n, target.size) if target is not None else n


def _row_len(op: OpSpec) -> int:
    a = op.operands.get("a")
    return a.shape[-1] if a is not None else 1


def generate_plan_from_ops(cmd: Command, topo: Topology, table: StageTable | None = None,
                           ring: StagingRing | None = None, latency: Latency | None = None,
                           after: tuple[int, ...] = ()) -> PipelinePlan:
    """Append the stages of ``cmd``'s pipeline plan to ``table`` and describe them.

    Args:
        cmd: a CompositeCmd or DmaCmd.
        topo: the topology (tile sizes, buffers, latencies).
        table: the program's stage table (a fresh one when ``None``).
        ring: the program's staging ring (a fresh one when ``None``).
        latency: cached latency model for ``topo``.
        after: stages every root stage of the plan must also wait for.

    Returns:
        A :class:`PipelinePlan` over the appended rows.

    Raises:
        ValidationError: more than one GEMM, or an op the PE cannot place.
    """
    table = StageTable() if table is None else table
    ring = StagingRing(topo) if ring is None else ring
    lat = Latency(topo) if latency is None else latency
    first = len(table)
    cid = cmd.completion.cmd
    fx = table.with_effects

    if isinstance(cmd, DmaCmd):
        src, dst = cmd.src, cmd.dst
        kind = _DMA_READ if dst.space == Space.TCM else _DMA_WRITE
        hbm = src if src.space == Space.HBM else dst
        eff = CopyBlock(src, 0, src.shape[0], 0, src.shape[-1], dst) if fx else None
        s = table.add(kind, _E_DMA, _SINGLE, cid, "dma", 0, -1, hbm.name, src.nbytes, lat.dma(src.nbytes), after, eff,
                      hbm.channel)
        return PipelinePlan(cid, table, first, len(table), 1, tile_last=(s,))

    ops = cmd.ops
    gemm_idx = [i for i, op in enumerate(ops) if op.kind == "gemm"]
    if len(gemm_idx) > 1:
        raise ValidationError(f"command #{cid} {cmd.label!r} has {len(gemm_idx)} GEMM ops at positions "
                              f"{gemm_idx}; a composite holds at most one (ADR-0065 D6.1). Split it.")
    if not gemm_idx:
        s_list = _plan_math_only(cmd, table, ring, lat, after)
        return PipelinePlan(cid, table, first, len(table), 1, tile_last=(s_list[-1],))
    return _plan_gemm(cmd, gemm_idx[0], topo, table, ring, lat, after, first)


def named_handles(cmd: CompositeCmd) -> tuple[tuple[int, str | None], ...]:
    """The handles whose names the plan's stages carry (op_log ``tensor``), as ``(op index, operand or None for out)``.

    A GEMM plan names its a, b (streamed reads, FETCH) and out (write-back);
    a MATH-only plan names the head op's operands (streamed reads).
    """
    for g, op in enumerate(cmd.ops):
        if op.kind == "gemm":
            return ((g, "a"), (g, "b"), (g, None))
    return tuple((0, port) for port in cmd.ops[0].operands) if cmd.ops else ()


def _math_stage(table: StageTable, lat: Latency, op: OpSpec, phase: int, cid: int, tile: int,
                preds: tuple[int, ...], target: Handle | None, operands: dict | None = None) -> int:
    info = OPS[op.kind]
    if info.accumulator and target is None:
        raise ValidationError(f"command #{cid}: {op.kind!r} updates the preceding op's output in place, but no "
                              f"op before it has an out; give it one.")
    eff = None
    if table.with_effects:
        ops = dict(op.operands) if operands is None else operands
        if info.accumulator:
            eff = MathAcc(op.kind, target, ops, dict(op.extra))
        else:
            eff = MathOp(op.kind, ops, dict(op.extra), op.out)
    dur = lat.math(op.kind, _n_elements(op, target if info.accumulator else None), _row_len(op))
    return table.add(_MATH, _E_MATH, phase, cid, op.kind, tile, -1, "", 0, dur, preds, eff)


def _plan_math_only(cmd: CompositeCmd, table: StageTable, ring: StagingRing, lat: Latency,
                    after: tuple[int, ...]) -> list[int]:
    cid = cmd.completion.cmd
    out: list[int] = []
    prev: tuple[int, ...] = after
    target: Handle | None = None
    for i, op in enumerate(cmd.ops):
        operands = None
        staged: list[tuple[int, int]] = []
        if i == 0:  # the head op may stream operands from HBM
            streamed = [(n, h) for n, h in op.operands.items() if not h.pinned]
            if streamed:
                if len(streamed) > ring.n_buffers:
                    raise ValidationError(
                        f"command #{cid}: MATH op {op.kind!r} streams {len(streamed)} operands from HBM "
                        f"({', '.join(f'{n}={h.name}' for n, h in streamed)}), but a streamed operand needs its own "
                        f"staging buffer and there are {ring.n_buffers} (tile_buffers). tl.load the others first.")
                operands = dict(op.operands)
                reads = []
                for name, h in streamed:
                    if h.nbytes > ring.buf_bytes["b"]:
                        raise ValidationError(
                            f"command #{cid}: MATH operand {name}={h.name} is {h.nbytes} B in HBM; a streamed "
                            f"operand must fit one staging buffer ({ring.buf_bytes['b']} B). tl.load it first "
                            f"or split it into row slices.")
                    buf, wait = ring.acquire("b")
                    stage_h = ring.handle("b", buf, h.shape, h.dtype)
                    operands[name] = stage_h
                    eff = CopyBlock(h, 0, h.shape[0], 0, h.shape[-1], stage_h) if table.with_effects else None
                    preds = prev if wait is None else prev + (wait,)
                    reads.append(table.add(_DMA_READ, _E_DMA, _SINGLE, cid, op.kind, 0, -1, h.name, h.nbytes,
                                           lat.dma(h.nbytes), preds, eff, h.channel))
                    staged.append(("b", buf))
                prev = tuple(reads)
        s = _math_stage(table, lat, op, _SINGLE, cid, 0, prev, target, operands)
        for slot, buf in staged:
            ring.bind(slot, buf, s)
        out.append(s)
        prev = (s,)
        if op.out is not None:
            target = op.out
    return out


def _plan_gemm(cmd: CompositeCmd, g: int, topo: Topology, table: StageTable, ring: StagingRing,
               lat: Latency, after: tuple[int, ...], first: int) -> PipelinePlan:
    cid = cmd.completion.cmd
    fx = table.with_effects
    ops = cmd.ops
    gemm = ops[g]
    a, b, out = gemm.operands["a"], gemm.operands["b"], gemm.out
    M, K, N = gemm.extra["m"], gemm.extra["k"], gemm.extra["n"]
    trans_b = bool(gemm.extra.get("trans_b", False))
    tm_, tn_, tk_ = topo.tile_m, topo.tile_n, topo.tile_k
    a_isz, b_isz = itemsize(a.dtype), itemsize(b.dtype)

    # --- prologue: single-shot MATH before the loop, chained ------------------------
    prologue: list[int] = []
    prev = after
    target: Handle | None = None
    for op in ops[:g]:
        if op.scope is not Scope.KERNEL:
            raise ValidationError(f"command #{cid}: op {op.kind!r} before the GEMM has scope "
                                  f"{op.scope.value!r}; ops before the GEMM run once (scope 'kernel').")
        s = _math_stage(table, lat, op, _PROLOGUE, cid, 0, prev, target)
        prologue.append(s)
        prev = (s,)
        if op.out is not None:
            target = op.out
    loop_after = prev

    k_epi: list[OpSpec] = []
    t_epi: list[OpSpec] = []
    post: list[OpSpec] = []
    for op in ops[g + 1:]:
        if op.scope is Scope.KERNEL:
            post.append(op)
            continue
        if not OPS[op.kind].accumulator:
            raise ValidationError(f"command #{cid}: {op.kind!r} with scope {op.scope.value!r} would run on the "
                                  f"accumulator tile, but only accumulator ops (scale, add) can; give it "
                                  f"scope 'kernel' to run once after the loop.")
        (k_epi if op.scope is Scope.K_TILE else t_epi).append(op)

    n_mt, n_nt, n_kt = -(-M // tm_), -(-N // tn_), -(-K // tk_)
    out_hbm = not out.pinned
    out_isz = itemsize(out.dtype)
    fetch_tensor = f"{a.name}|{b.name}"
    tile_last: list[int] = []
    t = 0
    for mi in range(n_mt):
        r0 = mi * tm_
        r1 = min(M, r0 + tm_)
        tm = r1 - r0
        for ni in range(n_nt):
            c0 = ni * tn_
            c1 = min(N, c0 + tn_)
            tn = c1 - c0
            acc_key = (cid, t)
            chain: tuple[int, ...] = ()
            for kk in range(n_kt):
                k0 = kk * tk_
                k1 = min(K, k0 + tk_)
                tk = k1 - k0
                a_blk = (a, r0, r1, k0, k1)
                b_blk = (b, c0, c1, k0, k1) if trans_b else (b, k0, k1, c0, c1)
                reads: list[int] = []
                staged: list[tuple[str, int]] = []
                a_bytes, b_bytes = tm * tk * a_isz, tk * tn * b_isz
                for slot, blk, nbytes, h in (("a", a_blk, a_bytes, a), ("b", b_blk, b_bytes, b)):
                    if h.pinned:
                        continue
                    buf, wait = ring.acquire(slot)
                    eff = None
                    if fx:
                        rows, cols = blk[2] - blk[1], blk[4] - blk[3]
                        sh = ring.handle(slot, buf, (rows, cols), h.dtype)
                        eff = CopyBlock(*blk, sh)
                        blk = (sh, 0, rows, 0, cols)
                        if slot == "a":
                            a_blk = blk
                        else:
                            b_blk = blk
                    preds = loop_after if wait is None else loop_after + (wait,)
                    reads.append(table.add(_DMA_READ, _E_DMA, _TILE, cid, "gemm", t, kk, h.name, nbytes,
                                           lat.dma(nbytes), preds, eff, h.channel))
                    staged.append((slot, buf))
                fb = a_bytes + b_bytes
                eff = Fetch((cid, t, kk), a_blk, b_blk, trans_b) if fx else None
                f = table.add(_FETCH, _E_GEMM, _TILE, cid, "gemm", t, kk, fetch_tensor, fb, lat.fetch(fb),
                              tuple(reads) if reads else loop_after, eff)
                for slot, buf in staged:
                    ring.bind(slot, buf, f)
                eff = GemmTile((cid, t, kk), acc_key, kk == 0) if fx else None
                s = table.add(_GEMM, _E_GEMM, _TILE, cid, "gemm", t, kk, "", 0, lat.gemm(tm, tn, tk), (f,) + chain,
                              eff)
                for op in k_epi:
                    s = _acc_stage(table, lat, op, _KEPI, cid, t, kk, s, acc_key, r0, r1, c0, c1, tm * tn)
                chain = (s,)
            for op in t_epi:
                s = _acc_stage(table, lat, op, _TEPI, cid, t, -1, s, acc_key, r0, r1, c0, c1, tm * tn)
            if out_hbm:
                nbytes = tm * tn * out_isz
                eff = StoreAcc(acc_key, out, r0, r1, c0, c1) if fx else None
                s = table.add(_DMA_WRITE, _E_DMA, _TILE, cid, "gemm", t, -1, out.name, nbytes, lat.dma(nbytes), (s,),
                              eff, out.channel)
            elif fx:
                _attach(table, s, StoreAcc(acc_key, out, r0, r1, c0, c1))
            tile_last.append(s)
            t += 1

    post_stages: list[int] = []
    prev = tuple(tile_last)
    target = out
    for op in post:
        s = _math_stage(table, lat, op, _POST, cid, t - 1, prev, target)
        post_stages.append(s)
        prev = (s,)
        if op.out is not None:
            target = op.out
    return PipelinePlan(cid, table, first, len(table), t, tuple(prologue), tuple(post_stages), tuple(tile_last))


def _acc_stage(table: StageTable, lat: Latency, op: OpSpec, phase: int, cid: int, t: int, kk: int, prev: int,
               acc_key: tuple, r0: int, r1: int, c0: int, c1: int, n_elements: int) -> int:
    eff = None
    if table.with_effects:
        other = op.operands.get("other")
        other_blk = (other, r0, r1, c0, c1) if other is not None else None
        eff = AccOp(op.kind, acc_key, other_blk, dict(op.extra))
    return table.add(_MATH, _E_MATH, phase, cid, op.kind, t, kk, "", 0, lat.math(op.kind, n_elements), (prev,), eff)


def _attach(table: StageTable, seq: int, effect: object) -> None:
    """Add a second effect to a stage (the accumulator write-back into a TCM out)."""
    cur = table.effects[seq]
    table.set_effect(seq, effect if cur is None else Effects((cur, effect)))
