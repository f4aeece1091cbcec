"""Random small device runs (DESIGN §14) and the bridge from a kbwork device run to the cycle-stepped reference.

``random_device_case(seed)`` draws a topology (2..4 PEs, channels dividing them, a channel rate that is
sometimes fractional, sometimes unconstrained, one or two DMA units) and, for every PE, one to three
launches drawn from a few kernel families over that PE's own tensors, each tensor on a random channel:
streaming ``tl.range`` loops of loads, MATH and stores; decode attention (``gqa_decode``); and straight-line
programs of loads, stores and waits. PEs may share one read-only tensor.

``random_replicated_case(seed)`` draws runs the replication reduction acts on: one random launch list (of
the same families), instantiated on every PE over tensors of the same shapes, named by one of several schemes
(``x0``/``x1``, ``p0_x``, ``x``/``x1``, ...; some bases are the kernels' own TCM names), each PE's tensors on
its home channel or on channels shifted alike.

``add_after(case, seed)`` gives a case's launches random ``after`` edges (DESIGN §16): chains, fans in and fans
out, across PEs and channels, never a cycle.

``resolved_device_graph(sim, plan)`` simulates the launches in one event loop (no reductions, no steady
state), records the dynamic edges of every PE and returns the reference's :class:`DeviceGraph` with
kbwork's start and end per stage in device seq order.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

import numpy as np

import kbwork
from kbwork import Launch
from kbwork.device.device import _channel_users, flow_channels
from kbwork.device.order import local, resolve_after
from kbwork.device.loop import device, new_pe, run
from kbwork.kernels import gqa_decode as gq
from kbwork.pe.stages import Engine, engine_table

from reference_device import DeviceGraph, Stage  # tests/ is on sys.path

RATES = [16, 40, 64, 100, 40.5, 24.25, 128, 200, math.inf]


def stream_kernel(tl, src, dst, *, tile: int, op: str, waits: bool = False):
    """``dst[j] = f(src[j])`` tile by tile in a ``tl.range`` loop, double-buffered through a ring; with
    ``waits``, a command before the loop, a ``tl.wait`` in the body on its own load, and stores after the loop
    waiting on the one before it and on the pre-loop command."""
    n = src.shape[0] // tile
    ring = tl.ring(2, (tile, src.shape[1]), "fp32", name="buf")
    pre = first = None
    if waits:
        pre = tl.alloc((tile, src.shape[1]), "fp32", name="pre")
        tl.composite(op="math", math_op="copy", a=src[0:tile], out=pre)
        first = tl.store(pre, dst[0:tile])
    for j in tl.range(n):
        with tl.iteration(j), tl.scratch_scope():
            if op == "direct":  # a MATH op reading HBM: its DMA_READ is part of the command
                c = tl.composite(op="math", math_op="copy", a=src[j * tile:(j + 1) * tile], out=ring[j])
            else:
                x = tl.load(src[j * tile:(j + 1) * tile])
                c = tl.composite(op="math", math_op="copy", a=x, out=ring[j])
            if waits:
                tl.wait(c)
            tl.store(ring[j], dst[j * tile:(j + 1) * tile])
    if waits:
        done = tl.store(pre, dst[0:tile])
        tl.wait(done)
        tl.wait(first)
        tl.store(ring[0], dst[tile:2 * tile] if n > 1 else dst[0:tile])


def straight_kernel(tl, tensors, out, *, steps):
    """Loads of ``tensors`` (by index), copies into a scratch tile, stores into ``out``, and ``tl.wait``s."""
    loaded = []
    acc = tl.alloc(out.shape, "fp32", name="acc")
    for kind, x in steps:
        if kind == "load":
            loaded.append(tl.load(tensors[x % len(tensors)], name=f"l{len(loaded)}"))
        elif kind == "math" and loaded:
            src = loaded[x % len(loaded)]
            rows = min(src.shape[0], acc.shape[0])
            tl.composite(op="math", math_op="copy", a=src[:rows], out=acc[:rows])
        elif kind == "store":
            tl.store(acc, out)
        elif kind == "wait" and tl.commands:
            tl.wait(kbwork.Completion(x % len(tl.commands)))
    tl.store(acc, out)


@dataclass
class Case:
    seed: int
    overrides: dict
    plan: dict = field(default_factory=dict)   # pe -> [Launch]
    sim: object = None
    notes: list = field(default_factory=list)

    def __repr__(self) -> str:
        return f"Case(seed={self.seed}, {self.overrides}, {'; '.join(self.notes)})"


def random_device_case(seed: int, *, mode: str = "timing", max_pes: int = 4, long: bool = False, home: bool = False,
                       **extra) -> Case:
    """A seeded random device run (module docstring); ``long``: loops long enough for the steady state to
    engage (too long for the cycle-stepped reference); ``home``: every tensor of a PE on its home channel (as a
    model step lays them out), not on a random one; ``extra``: topology keys over the drawn ones."""
    rng = random.Random(seed)
    pes = rng.randint(2, max_pes)
    chans = rng.choice([d for d in range(1, pes + 1) if pes % d == 0])
    ov = dict(pes=pes, hbm_channels=chans, channel_bytes_per_cycle=rng.choice(RATES),
              dma_channels=rng.choice([1, 1, 2]), dma_base_cycles=rng.choice([0, 5, 50, 200]),
              hazard_policy=rng.choice(["strict_fifo", "rw_aware"]), cmd_queue_depth=rng.choice([2, 8]))
    ov.update(extra)
    case = Case(seed, ov)
    sim = case.sim = kbwork.Simulator(mode=mode, **ov)
    nprng = np.random.default_rng(seed)
    shared = None
    if rng.random() < 0.4:
        shared = sim.hbm("shared", nprng.standard_normal((64, 64)).astype(np.float32), dtype="bf16",
                         channel=rng.randrange(chans))
    for pe in range(pes):
        if rng.random() < 0.15 and pe:
            continue  # a PE with nothing to run
        launches = []
        for i in range(rng.randint(1, 3)):
            ch = (lambda: pe * chans // pes) if home else (lambda: rng.randrange(chans))  # noqa: E731
            name = f"p{pe}l{i}"
            family = rng.choice(["stream", "stream", "decode", "straight"])
            if family == "stream":
                tile = rng.choice([8, 16, 32])
                n = rng.randint(20, 60) if long else rng.randint(1, 12)
                cols = rng.choice([32, 64])
                src = sim.hbm(f"{name}_src", nprng.standard_normal((n * tile, cols)).astype(np.float32),
                              dtype=rng.choice(["bf16", "fp32"]), channel=ch())
                dst = sim.hbm(f"{name}_dst", shape=(n * tile, cols), dtype="fp32", channel=ch())
                launches.append(Launch(stream_kernel, src, dst, tile=tile, op=rng.choice(["direct", "copy"]),
                                       waits=rng.random() < 0.4))
                case.notes.append(f"PE {pe}: stream {n}x{tile}")
            elif family == "decode":
                kv = rng.choice([2048, 4096]) if long else rng.choice([128, 256, 512])
                d = rng.choice([64, 128])
                g = rng.choice([1, 4, 8])
                q = sim.hbm(f"{name}_q", nprng.standard_normal((g, d)).astype(np.float32), dtype="bf16", channel=ch())
                k = sim.hbm(f"{name}_K", nprng.standard_normal((kv, d)).astype(np.float32), dtype="bf16",
                            channel=ch())
                v = sim.hbm(f"{name}_V", nprng.standard_normal((kv, d)).astype(np.float32), dtype="bf16",
                            channel=ch())
                o = sim.hbm(f"{name}_O", shape=(g, d), dtype="fp32", channel=ch())
                variant = rng.choice(sorted(gq.VARIANTS))
                launches.append(Launch(gq.gqa_decode, q, k, v, o, variant=variant, tile=128))
                case.notes.append(f"PE {pe}: {variant} kv {kv}")
            else:
                ts = [sim.hbm(f"{name}_t{x}", nprng.standard_normal((rng.choice([8, 32, 64]), 64))
                              .astype(np.float32), dtype="fp32", channel=ch()) for x in range(rng.randint(1, 3))]
                if shared is not None and rng.random() < 0.5:
                    ts.append(shared)
                out = sim.hbm(f"{name}_out", shape=(8, 64), dtype="fp32", channel=ch())
                steps = [(rng.choice(["load", "load", "math", "store", "wait"]), rng.randrange(100))
                         for _ in range(rng.randint(1, 10))]
                launches.append(Launch(straight_kernel, ts, out, steps=steps))
                case.notes.append(f"PE {pe}: straight {len(steps)}")
        case.plan[pe] = launches
    return case


def resolved_device_graph(sim, plan) -> tuple[DeviceGraph, list[int], list[int], list[int]]:
    """Simulate ``plan`` in one event loop (a flow on every finite channel), recording dynamic edges: the
    reference graph, kbwork's start and end per stage (device seq order), and each PE's first seq."""
    programs, _, _, _ = sim._programs({p: list(v) for p, v in sorted(plan.items())})
    topo = sim.topo
    order = sorted(programs)
    waits = local(resolve_after({p: list(v) for p, v in sorted(plan.items())}), order)
    channels = flow_channels(_channel_users(programs, topo), topo) if topo.channel_fraction is not None else {}
    states = [new_pe(programs[p][0], launches=programs[p][1:], after=waits[i]) for i, p in enumerate(order)]
    dev = device(states, channels, topo.sync_cycles)
    edges = {i: [] for i in range(len(states))}
    run(dev, edges=edges)
    caps = [spec.capacity for spec in engine_table(topo)]
    stages, start, end, offsets = [], [], [], []
    for i, (p, st) in enumerate(zip(order, states)):
        off = len(stages)
        offsets.append(off)
        t = st.table
        preds = t.preds
        for s in range(len(st.start)):
            deps = tuple(sorted({off + q for q in preds[s]} | {off + q for q in edges[i][s]}))
            e = t.engine[s]
            res = (p, int(e))
            if e == int(Engine.PE_DMA):
                stages.append(Stage(res, deps, nbytes=int(t.nbytes[s]), channel=int(t.chan[s])))
            else:
                stages.append(Stage(res, deps, dur=int(t.dur[s])))
        start += st.start
        end += st.end
    capacity = {(p, e): caps[e] for p in order for e in range(len(caps))}
    # each launch's stages, from the commands it lowered (a launch's first DISPATCH waits for whole launches)
    launch_stages, first_dispatch = [], []
    for i, st in enumerate(states):
        firsts = [0] + list(st.launch_first) + [st.n_lowered]
        d, e = st.ctab.dispatch_seq, st.ctab.plan_end
        launch_stages.append([tuple(offsets[i] + s for s in range(d[a], e[b - 1])) for a, b in zip(firsts, firsts[1:])])
        first_dispatch.append([offsets[i] + d[a] for a in firsts[:-1]])
    after = {}
    for i, rows in enumerate(waits):
        for j, ds in enumerate(rows):
            if ds:
                after[first_dispatch[i][j]] = [launch_stages[q][k] for q, k in ds]
    g = DeviceGraph(stages, capacity, topo.dma_base_cycles, topo.dma_bytes_per_cycle, topo.channel_bytes_per_cycle,
                    after=after, sync_cycles=topo.sync_cycles)
    return g, start, end, offsets


def add_after(case: Case, seed: int, *, p_edge: float = 0.5) -> Case:
    """Give ``case``'s launches random ``after`` edges: the launches are interleaved at random (each PE's in
    program order) and a launch may wait only for launches before it there, so no cycle forms. Shapes: a chain
    (the previous launch of the interleaving, often another PE's), a fan in (several launches of several PEs),
    and fans out (several launches waiting for one)."""
    rng = random.Random(seed * 7919 + 1)
    queues = {p: list(range(len(v))) for p, v in case.plan.items()}
    inter = []
    while any(queues.values()):
        p = rng.choice([p for p, q in queues.items() if q])
        inter.append((p, queues[p].pop(0)))
    hub = inter[0] if inter else None  # a fan out: many launches after the first one
    for k, (p, i) in enumerate(inter):
        before = inter[:k]
        if not before or rng.random() > p_edge:
            continue
        shape = rng.choice(["chain", "fan_in", "fan_out"])
        if shape == "chain":
            picks = [before[-1]]
        elif shape == "fan_in":
            picks = rng.sample(before, min(len(before), rng.randint(2, 4)))
        else:
            picks = [hub]
        case.plan[p][i].after = tuple(case.plan[q][j] for q, j in picks)
        case.notes.append(f"PE {p} launch {i} after {picks}")
    return case


#: How :func:`random_replicated_case` names PE p's copy of a tensor ``b`` (one scheme per case).
NAME_SCHEMES = (lambda b, p: f"{b}{p}", lambda b, p: f"p{p}_{b}", lambda b, p: f"{b}_{'abcdefgh'[p]}",
                lambda b, p: b if p == 0 else f"{b}{p}", lambda b, p: f"{b}.{p}",
                lambda b, p: f"{'ZYXWVUTS'[p]}{b}", lambda b, p: f"{b}{p}_tcm")
#: Tensor name bases; "buf", "acc", "pre", "l", "m", "O", "Q", "S" are also names the kernels give TCM buffers.
NAME_BASES = ("x", "y", "q", "K", "V", "O", "buf", "acc", "out", "src", "dst", "t", "l", "m", "S", "Q", "pre")


def random_replicated_case(seed: int) -> Case:
    """A seeded device run whose PEs run one launch list over equally shaped tensors (module docstring)."""
    rng = random.Random(seed)
    pes = rng.choice([2, 3, 4, 6, 8])
    chans = rng.choice([d for d in range(1, pes + 1) if pes % d == 0])
    ov = dict(pes=pes, hbm_channels=chans, channel_bytes_per_cycle=rng.choice(RATES),
              dma_channels=rng.choice([1, 1, 2]), dma_base_cycles=rng.choice([0, 5, 50]),
              hazard_policy=rng.choice(["strict_fifo", "rw_aware"]), cmd_queue_depth=rng.choice([2, 8]))
    case = Case(seed, ov)
    sim = case.sim = kbwork.Simulator(mode="timing", **ov)
    scheme = rng.choice(NAME_SCHEMES)
    bases = rng.sample(NAME_BASES, 6)
    template = []
    for _ in range(rng.randint(1, 2)):
        family = rng.choice(["stream", "decode", "straight"])
        if family == "stream":
            template.append((family, dict(tile=rng.choice([8, 16]), n=rng.randint(1, 8), cols=rng.choice([32, 64]),
                                          dtype=rng.choice(["bf16", "fp32"]), op=rng.choice(["direct", "copy"]),
                                          waits=rng.random() < 0.4)))
        elif family == "decode":
            template.append((family, dict(kv=rng.choice([128, 256, 512]), d=rng.choice([64, 128]),
                                          g=rng.choice([1, 4]), variant=rng.choice(sorted(gq.VARIANTS)))))
        else:
            template.append((family, dict(rows=[rng.choice([8, 32, 64]) for _ in range(rng.randint(1, 3))],
                                          steps=[(rng.choice(["load", "load", "math", "store", "wait"]),
                                                  rng.randrange(100)) for _ in range(rng.randint(1, 8))])))
    shifted = rng.random() < 0.5  # each PE's k-th tensor on (home + k) mod channels, else all on its home
    case.notes.append(f"{[f for f, _ in template]}, names like {scheme('x', 1)!r}, {'shifted' if shifted else 'home'}")
    for p in range(pes):
        home = sim.topo.home_channel(p)
        launches = []
        for i, (family, a) in enumerate(template):
            def t(j, shape, dtype="fp32", i=i):
                return sim.hbm(scheme(bases[j] + (f"_{i}" if i else ""), p), shape=shape, dtype=dtype,
                               channel=(home + j) % chans if shifted else home)
            if family == "stream":
                rows = a["n"] * a["tile"]
                launches.append(Launch(stream_kernel, t(0, (rows, a["cols"]), a["dtype"]), t(1, (rows, a["cols"])),
                                       tile=a["tile"], op=a["op"], waits=a["waits"]))
            elif family == "decode":
                launches.append(Launch(gq.gqa_decode, t(0, (a["g"], a["d"]), "bf16"), t(1, (a["kv"], a["d"]), "bf16"),
                                       t(2, (a["kv"], a["d"]), "bf16"), t(3, (a["g"], a["d"])),
                                       variant=a["variant"], tile=128))
            else:
                launches.append(Launch(straight_kernel, [t(j, (r, 64)) for j, r in enumerate(a["rows"])],
                                       t(5, (8, 64)), steps=a["steps"]))
        case.plan[p] = launches
    return case
