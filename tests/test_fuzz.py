"""Property-based fuzz test: random small kernels against a float64 reference and the op_log rules.

``programs()`` (a hypothesis strategy) draws a small program: a random topology
(tiles of 8-32 against dimensions of 1-40, 1-3 staging buffers, a queue of 1-4
or 8 commands, dispatch and stage latencies down to 0), HBM tensors of bf16,
fp16 and fp32, and a list of steps over them:

* ``tl.load`` of whole tensors and row slices, ``tl.store`` into whole tensors
  and row slices, ``tl.full`` (``-0.0``, ``±inf``, subnormals, values near a
  dtype's range, given as int, float or numpy scalar), ``tl.alloc``;
* GEMM composites with ragged shapes, ``trans_b``, each operand pinned (TCM)
  or streamed (HBM, bare or through ``tl.ref``), out in TCM or HBM, a KERNEL
  prologue, ``scale`` at ``k_tile``, ``add``/``scale`` at ``output_tile`` and
  post-loop ``kernel`` MATH ops, interleaved in any order;
* MATH-only composites over every op of ``kbwork.pe.ops.OPS`` (the head may
  stream its operands from HBM), with ``scale``/``add`` accumulating after a
  head, broadcasting operands, 1-D tensors;
* ``softmax_merge`` composites, with a head GEMM (opt2's ``#2``) or alone
  (a1's merge, whose ``primary_out`` a later ``pv`` GEMM reads), on state
  made by ``tl.full(-inf / 0 / 0)`` and carried from merge to merge;
* both the legacy API and the flat ``ops=[OpSpec, ...]`` form, extra
  ``rw_handles``, ``label=``, ``tl.iteration``, ``tl.wait`` on earlier commands
  (by the returned ``Completion`` or a hand-built one), and
  ``tl.scratch_scope()`` (nested twice at most) around any of it, so the
  recipe runs inside and outside scopes and later allocations reuse released
  bytes while commands that used them may still be in flight.

Only valid programs are generated (DESIGN §2-§3: TCM prologue/epilogue and
recipe operands, one GEMM, live handles, streamed MATH operands that fit a
staging buffer); invalid ones are other tests' business. Left out on purpose:
intra-command aliasing whose meaning depends on tile order (a GEMM ``out``
overlapping its ``a``/``b``, an ``add`` operand overlapping ``out`` without
being it), reads of memory nothing initialised, and values whose bound the
reference cannot vouch for (NaN, a possible overflow, an infinity whose sign
rounding could flip) — see :class:`Bad`.

Every program is run in data mode under ``strict_fifo`` and ``rw_aware`` and
in timing mode under both. Checked: every live tensor against the float64
reference within its propagated bound (infinities and provably exact values
bit for bit); the two policies bit-identical; each timing-mode CSV
byte-identical to the data-mode CSV of its policy; and the op_log rules of
DESIGN §4-§6 recomputed here, not by the library's functions — see
:func:`check_op_log`.

Budget: ``KBWORK_FUZZ_EXAMPLES`` programs (default 500, each under both
policies), derandomized and without an example database, so CI is
reproducible; the default keeps this file around half a minute on a 2-core
machine. Run thousands locally with
``KBWORK_FUZZ_EXAMPLES=5000 pytest tests/test_fuzz.py``, and another stream of
programs with ``KBWORK_FUZZ_SEED=<int>``; ``--hypothesis-show-statistics``
lists the features the programs exercised and the steps the reference dropped.
A failure prints the shrunk program as pseudo-code.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
from collections import Counter
from dataclasses import dataclass, field

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, seed, settings
from hypothesis import strategies as st

import kbwork
from kbwork import Completion, OpSpec, Scope
from test_core_timeline import COLUMNS, ENGINE_OF, design_dispatch_cycles, design_logical_bytes

N_EXAMPLES = int(os.environ.get("KBWORK_FUZZ_EXAMPLES", "500"))
#: set to explore other programs than CI's fixed ones (a different, still reproducible, stream)
SEED = os.environ.get("KBWORK_FUZZ_SEED")
POLICIES = ("strict_fifo", "rw_aware")
FUZZ = settings(max_examples=N_EXAMPLES, derandomize=SEED is None, database=None, deadline=None,
                suppress_health_check=list(HealthCheck), print_blob=False)

# --- reference numerics ---------------------------------------------------------------------------
# The reference is the program's meaning: its steps in program order, evaluated in float64. Beside
# each element's value it carries a bound ``err`` on how far the simulator's element may be from it,
# and ``exact`` when the simulator's element must equal it bit for bit (sign of zero included).
# The bound follows what the simulator does differently, op by op (DESIGN §2: float32 arithmetic,
# rounding to the destination dtype on every write):
#
# * rounding to a dtype: |fl(x) - x| <= u*|x| + eta, u = eps/2 (bf16 2^-8, fp16 2^-11, fp32 2^-24)
#   and eta half the smallest subnormal, both from ml_dtypes.finfo; an exactly known value that is
#   representable is stored exactly, and one that is not is off by exactly |fl(x) - x|;
# * an operand's own error: every op is monotone or multilinear in each operand on the box
#   [x - err, x + err], so the result's range over the box is attained at its corners; the
#   propagated error is the largest distance from the value to a corner (2^n evaluations);
# * float32 arithmetic on top: one rounding (u32*|r| + eta32) per multiply, add or divide, two for
#   fma (a*b, then + c), none for copy/max; exp_diff rounds a - b (widening the exp argument by
#   u32*|a - b|) and exp itself is allowed 4 ulp (numpy's float32 exp measured < 2 ulp) plus
#   float32's smallest normal for results that underflow;
# * sums (rsum, each GEMM k-tile): gamma_n * sum|x| with gamma_n = n*u32 / (1 - n*u32), the
#   classic bound for any summation order (pairwise, blocked BLAS, with or without FMA); the GEMM
#   accumulator adds u32*|acc| per k-tile and runs the k_tile/output_tile epilogues in float32;
# * infinities are exact or the step is dropped (an infinity whose sign an error could flip,
#   inf - inf, 0 * inf), and so are possible overflows (a value within 2x of its dtype's max).
# The comparison allows 2^-20 of the bound on top, for the float64 evaluation of the reference and
# of the bound itself.
F64 = np.float64
DT = {"bf16": np.dtype(ml_dtypes.bfloat16), "fp16": np.dtype(np.float16), "fp32": np.dtype(np.float32)}
ITEMSIZE = {n: d.itemsize for n, d in DT.items()}
_FI = {n: ml_dtypes.finfo(d) for n, d in DT.items()}
U = {n: float(fi.eps) / 2 for n, fi in _FI.items()}
ETA = {n: float(fi.smallest_subnormal) / 2 for n, fi in _FI.items()}
MAXV = {n: float(fi.max) for n, fi in _FI.items()}
U32, ETA32, F32_MAX, F32_TINY = U["fp32"], ETA["fp32"], MAXV["fp32"], float(_FI["fp32"].tiny)
EXP_ULPS = 4
SLACK = 1 + 2.0 ** -20


class Bad(Exception):
    """A step the bound cannot vouch for (NaN, a possible overflow, an infinity whose sign the
    operands' errors leave open): the generator drops it, so a checked program never holds one."""


def gamma(n: int) -> float:
    return n * U32 / (1 - n * U32)


@dataclass(frozen=True)
class Val:
    """Reference values (float64), their error bounds and exactness, element by element."""

    val: np.ndarray
    err: np.ndarray
    exact: np.ndarray

    @staticmethod
    def known(x) -> "Val":
        x = np.asarray(x, dtype=F64)
        return Val(x, np.zeros(x.shape), np.ones(x.shape, dtype=bool))

    def rows(self, r0: int, r1: int) -> "Val":
        return Val(self.val[r0:r1], self.err[r0:r1], self.exact[r0:r1])

    def bcast(self, shape) -> "Val":
        return Val(*(np.broadcast_to(x, shape) for x in (self.val, self.err, self.exact)))


def scalar_val(x: float) -> Val:
    """A shipped scalar as the PE sees it: np.float32(x), off by exactly |fl32(x) - x|."""
    f = float(np.float32(x))
    return Val(np.array(x, dtype=F64), np.array(0.0 if math.isinf(x) else abs(f - x)), np.array(f == x))


def store(v: Val, dtype: str, shape) -> Val:
    """Write ``v`` (the float32 result of an op) into a ``dtype`` tensor of ``shape``."""
    v = v.bcast(shape)
    val, err = v.val, v.err
    fin = np.isfinite(val)
    if np.isnan(val).any():
        raise Bad("NaN")
    if (fin & (np.abs(val) + err > MAXV[dtype] / 2)).any():
        raise Bad(f"{dtype} may overflow")
    assert (err[~fin] == 0).all(), "infinities are exact by construction"
    known = err == 0  # the simulator holds exactly val (a float32) before the write
    assert (val[known & fin] == val[known & fin].astype(np.float32)).all()
    with np.errstate(all="ignore"):
        r = val.astype(np.float32).astype(DT[dtype]).astype(F64)
        new_err = np.where(known, np.where(fin, np.abs(r - val), 0.0),
                           err + U[dtype] * (np.abs(val) + err) + ETA[dtype])
    return Val(np.array(val), new_err, v.exact & known & (r == val))


_FNS = {"copy": lambda a: a, "max_elem": np.maximum, "fma": lambda a, b, c: a * b + c, "mul_bcast": np.multiply,
        "div_bcast": np.divide, "scale": np.multiply, "add": np.add}


def _corners(fn, vs, es):
    with np.errstate(all="ignore"):
        return np.stack([fn(*[v + s * e for v, e, s in zip(vs, es, signs)])
                         for signs in itertools.product((-1.0, 1.0), repeat=len(vs))])


def pointwise(kind: str, args: list[Val]) -> Val:
    """An elementwise MATH op (or accumulator op, ``args[0]`` the accumulator) in float32, before the write."""
    shape = np.broadcast_shapes(*(a.val.shape for a in args))
    vs = [np.broadcast_to(a.val, shape) for a in args]
    es = [np.broadcast_to(a.err, shape) for a in args]
    exact_in = np.logical_and.reduce([np.broadcast_to(a.exact, shape) for a in args])
    known_in = np.logical_and.reduce([e == 0 for e in es])
    if kind == "exp_diff":
        return _exp_diff(vs, es, known_in)
    if kind == "div_bcast" and (np.abs(vs[1]) <= es[1]).any():
        raise Bad("a divisor's box holds 0")
    fn = _FNS[kind]
    with np.errstate(all="ignore"):
        V = fn(*vs)
    C = _corners(fn, vs, es)
    if np.isnan(V).any() or np.isnan(C).any():
        raise Bad("NaN")
    lo, hi = C.min(axis=0), C.max(axis=0)
    inf = np.isinf(V)
    if (inf & ~((lo == V) & (hi == V))).any():
        raise Bad("an infinity the errors could change")
    if (~inf & ~(np.isfinite(lo) & np.isfinite(hi))).any():
        raise Bad("may overflow")
    M = np.where(inf, 0.0, np.maximum(np.abs(lo), np.abs(hi)))
    if (M > F32_MAX / 4).any():
        raise Bad("float32 may overflow")
    with np.errstate(all="ignore"):
        prop = np.where(inf, 0.0, np.maximum(hi - V, V - lo))
    if kind in ("copy", "max_elem"):
        rnd = 0.0
    elif kind == "add":
        rnd = U32 * M
    elif kind == "fma":
        Mp = np.abs(_corners(np.multiply, vs[:2], es[:2])).max(axis=0)
        r1 = U32 * Mp + ETA32
        rnd = r1 + U32 * (M + r1)
    else:  # scale, mul_bcast, div_bcast: one rounded product or quotient
        rnd = U32 * M + ETA32
    err = np.where(inf, 0.0, prop + rnd)
    if kind == "copy":
        exact = exact_in
    elif kind == "max_elem":
        # the sign of max(-0.0, +0.0) is the implementation's choice
        a, b = vs
        exact = exact_in & ~((a == 0) & (b == 0) & (np.signbit(a) != np.signbit(b)))
    else:
        exact = exact_in & inf
    return Val(np.array(V), err, exact)


def _exp_diff(vs, es, known_in) -> Val:
    a, b = vs
    ea, eb = es
    with np.errstate(all="ignore"):
        D = a - b
        dlo, dhi = (a - ea) - (b + eb), (a + ea) - (b - eb)
    if np.isnan(D).any() or np.isnan(dlo).any() or np.isnan(dhi).any():
        raise Bad("inf - inf")
    inf = np.isinf(D)
    if (inf & ~((dlo == D) & (dhi == D))).any():
        raise Bad("an infinite exponent the errors could change")
    with np.errstate(all="ignore"):
        w = np.where(inf, 0.0, U32 * np.maximum(np.abs(dlo), np.abs(dhi)))
        V, lo, hi = np.exp(D), np.exp(dlo - w), np.exp(dhi + w)
    if (~inf & (hi > F32_MAX / 4)).any():
        raise Bad("exp may overflow")
    with np.errstate(all="ignore"):
        err = np.where(inf, 0.0, np.maximum(hi - V, V - lo) + 2 * EXP_ULPS * U32 * hi + F32_TINY)
    exact = inf | (known_in & (D == 0))  # exp(0) = 1 and exp(-inf) = +0 exactly; exp(+inf) = inf
    return Val(V, np.where(exact, 0.0, err), exact)


def reduce_rows(kind: str, a: Val) -> Val:
    """rmax / rsum of each row into a (rows, 1) column, in float32, before the write."""
    v, e = a.val, a.err
    with np.errstate(all="ignore"):
        if kind == "rmax":
            V, lo, hi = (x.max(axis=-1, keepdims=True) for x in (v, v - e, v + e))
        else:
            V, lo, hi = (x.sum(axis=-1, keepdims=True) for x in (v, v - e, v + e))
    if np.isnan(V).any() or np.isnan(lo).any() or np.isnan(hi).any():
        raise Bad("NaN")
    inf = np.isinf(V)
    if (inf & ~((lo == V) & (hi == V))).any() or (~inf & ~(np.isfinite(lo) & np.isfinite(hi))).any():
        raise Bad("an infinity the errors could change")
    if (np.where(inf, 0.0, np.maximum(np.abs(lo), np.abs(hi))) > F32_MAX / 4).any():
        raise Bad("float32 may overflow")
    with np.errstate(all="ignore"):
        prop = np.where(inf, 0.0, np.maximum(hi - V, V - lo))
    if kind == "rmax":
        return Val(V, prop, a.exact.all(axis=-1, keepdims=True) & (V != 0))
    with np.errstate(all="ignore"):
        S = np.where(np.isfinite(v), np.abs(v) + e, 0.0).sum(axis=-1, keepdims=True)
    return Val(V, np.where(inf, 0.0, prop + gamma(v.shape[-1]) * S), inf)


def gemm_acc(A: Val, B: Val, tile_k: int, k_factors: list[float]) -> Val:
    """The float32 accumulator of ``A @ B`` over k-tiles, each followed by the k_tile scales."""
    if not (np.isfinite(A.val).all() and np.isfinite(B.val).all()):
        raise Bad("an infinite GEMM operand")
    K = A.val.shape[1]
    acc = None
    for k0 in range(0, K, tile_k):
        a, b = A.val[:, k0:k0 + tile_k], B.val[k0:k0 + tile_k]
        ea, eb = A.err[:, k0:k0 + tile_k], B.err[k0:k0 + tile_k]
        tk = a.shape[1]
        P = a @ b
        err = np.abs(a) @ eb + ea @ np.abs(b) + ea @ eb + gamma(tk) * ((np.abs(a) + ea) @ (np.abs(b) + eb)) \
            + tk * ETA32
        if acc is None:
            acc = Val(P, err, np.zeros(P.shape, dtype=bool))
        else:
            s = acc.val + P
            acc = Val(s, acc.err + err + U32 * (np.abs(s) + acc.err + err), acc.exact)
        if (np.abs(acc.val) + acc.err > F32_MAX / 4).any():
            raise Bad("float32 may overflow")
        for f in k_factors:
            acc = pointwise("scale", [acc, scalar_val(f)])
    return acc


# --- programs -------------------------------------------------------------------------------------
DTYPE_NAMES = ("fp32", "bf16", "fp16")
#: fill values: zeros of both signs, infinities, subnormals, values near a dtype's range
FILL_VALUES = (0.0, 1.0, -0.0, -math.inf, math.inf, -2.5, 0.5, 3.0, 0.1, 1e-3, -7.0, 100.0, 6e-8, 1e-40,
               3e4, 1e38)
FACTORS = (0.5, 2.0, -1.0, 0.25, 1.5, 0.1, 3.0, -0.0, 0.0, 1e-3)
MATH_HEADS = ("fill", "copy", "rmax", "rsum", "max_elem", "exp_diff", "fma", "mul_bcast", "div_bcast")
RECIPE = "softmax_merge"
#: DESIGN §3: the MATH ops softmax_merge expands into, in order
RECIPE_KINDS = ("rmax", "max_elem", "exp_diff", "exp_diff", "rsum", "fma", "mul_bcast", "copy")
#: what a step does, weighted by repetition (loads, fulls and allocs also come with the composites)
STEP_KINDS = ("full", "load", "store", "math", "gemm", "merge_gemm", "merge_only", "pv", "scope", "wait", "math",
              "gemm", "scope", "merge_gemm", "merge_only")


@dataclass(frozen=True)
class Scalar:
    """A scalar as the kernel passes it: ``form`` is float, int, np32 or np64."""

    number: float
    form: str = "float"

    def host(self):
        return {"float": float, "int": int, "np32": np.float32, "np64": np.float64}[self.form](self.number)

    def __repr__(self) -> str:
        return repr(self.number) if self.form == "float" else f"{self.form}({self.number!r})"


@dataclass
class Tensor:
    """A tensor of the program: a whole allocation (``base == id``) or a row slice of one."""

    id: str
    space: str
    shape: tuple
    dtype: str
    base: str
    r0: int | None = None
    r1: int | None = None
    scope: int = 0  # the scratch scope it was allocated in (0: none)


@dataclass(frozen=True)
class HbmDecl:
    """A host tensor placed with ``sim.hbm``: random data of kind ``fill``, or zeros (an output)."""

    id: str
    shape: tuple
    dtype: str
    fill: str
    seed: int

    def data(self) -> np.ndarray | None:
        rng = np.random.default_rng(self.seed)
        if self.fill == "zeros":
            return None
        if self.fill == "ints":
            x = rng.integers(-3, 4, self.shape)
        elif self.fill == "tiny":
            x = rng.standard_normal(self.shape) * 1e-6
        elif self.fill == "uniform":
            x = rng.uniform(-1, 1, self.shape)
        else:
            x = rng.standard_normal(self.shape)
        return x.astype(np.float32)

    def stored(self) -> np.ndarray:
        x = self.data()
        return np.zeros(self.shape) if x is None else x.astype(DT[self.dtype]).astype(F64)


@dataclass
class Op:
    """One op of a composite; ``args`` maps ports to tensor ids. A ``softmax_merge`` op's ``out`` is P."""

    kind: str
    scope: str = "kernel"
    args: dict = field(default_factory=dict)
    scalars: dict = field(default_factory=dict)
    out: str | None = None
    trans_b: bool = False
    auto_a: bool = False  # a GEMM after the recipe: ``a`` is left out and bound to P

    def __repr__(self) -> str:
        args = [f"{p}={x}" for p, x in self.args.items() if not (self.auto_a and p == "a")]
        args += [f"{k}={v!r}" for k, v in self.scalars.items()] + (["trans_b"] if self.trans_b else [])
        out = f" -> {self.out}" if self.out else ""
        return f"{self.kind}({', '.join(args)}){out}{'' if self.scope == 'kernel' else ' @' + self.scope}"


@dataclass
class Load:
    dst: str
    src: str
    ref: bool = False
    it: int = -1
    cmd: int = -1
    label: str | None = None

    def __repr__(self) -> str:
        return f"{self.dst} = tl.load({'tl.ref(' + self.src + ')' if self.ref else self.src})"


@dataclass
class Store:
    src: str
    dst: str
    it: int = -1
    cmd: int = -1
    label: str | None = None

    def __repr__(self) -> str:
        return f"tl.store({self.src}, {self.dst})"


@dataclass
class Full:
    dst: str
    shape: tuple
    dtype: str
    value: Scalar
    it: int = -1
    cmd: int = -1
    label: str | None = None

    def __repr__(self) -> str:
        return f"{self.dst} = tl.full({self.shape}, {self.value!r}, {self.dtype})"


@dataclass
class Alloc:
    dst: str
    shape: tuple
    dtype: str

    def __repr__(self) -> str:
        return f"{self.dst} = tl.alloc({self.shape}, {self.dtype})"


@dataclass
class ScopeOpen:
    sid: int

    def __repr__(self) -> str:
        return f"with tl.scratch_scope():  # scope {self.sid}"


@dataclass
class ScopeClose:
    sid: int

    def __repr__(self) -> str:
        return f"# end of scope {self.sid}"


@dataclass
class Wait:
    target: int
    hand_built: bool = False

    def __repr__(self) -> str:
        return f"tl.wait({f'Completion({self.target})' if self.hand_built else f'<cmd {self.target}>'})"


@dataclass
class Composite:
    what: str          # gemm | math | merge_gemm | merge_only | pv
    ops: list
    form: str = "legacy"
    rw: list = field(default_factory=list)
    ref: bool = False  # HBM head operands through tl.ref
    it: int = -1
    cmd: int = -1
    label: str | None = None

    def __repr__(self) -> str:
        rw = f", rw_handles={self.rw}" if self.rw else ""
        return f"tl.composite[{self.what}, {self.form}{', tl.ref' if self.ref else ''}]({self.ops}{rw})"


COMMANDS = (Load, Store, Full, Composite)


@dataclass
class Program:
    """A generated program: topology overrides, host tensors, steps, and what to compare at the end."""

    topo: dict
    tensors: dict
    hbm: list
    steps: list
    n_cmds: int
    final: list   # tensor ids whose contents the run must match
    dead: list    # TCM tensor ids whose scratch scope closed (Run.read must refuse them)
    features: frozenset

    def __repr__(self) -> str:
        lines = [f"Program({self.n_cmds} commands, topology {self.topo})"]
        for d in self.hbm:
            lines.append(f"  sim.hbm {d.id} {d.shape} {d.dtype} {d.fill} (seed {d.seed})")
        depth = 1
        for s in self.steps:
            if isinstance(s, ScopeClose):
                depth -= 1
            pre = (f"[cmd {s.cmd}{', iter ' + str(s.it) if s.it >= 0 else ''}"
                   f"{', label=' + repr(s.label) if s.label is not None else ''}] " if isinstance(s, COMMANDS) else "")
            lines.append("  " * depth + pre + repr(s))
            if isinstance(s, ScopeOpen):
                depth += 1
        return "\n".join(lines)

    def _repr_pretty_(self, p, cycle) -> None:  # hypothesis prints falsifying examples with this
        p.text(repr(self))


class Ref:
    """The reference memory: per allocation (base tensor id) a :class:`Val`; ``apply`` runs one step."""

    def __init__(self, tensors: dict, tile_k: int):
        self.t = tensors
        self.tile_k = tile_k
        self.mem: dict[str, Val] = {}

    def copy(self) -> "Ref":
        r = Ref(self.t, self.tile_k)
        r.mem = dict(self.mem)  # writes replace a Val, never mutate one
        return r

    def read(self, tid: str) -> Val:
        t = self.t[tid]
        v = self.mem[t.base]
        return v if t.r0 is None else v.rows(t.r0, t.r1)

    def write(self, tid: str, v: Val) -> None:
        t = self.t[tid]
        if t.r0 is None:
            self.mem[t.base] = v
            return
        parts = []
        for old, new in zip((self.mem[t.base].val, self.mem[t.base].err, self.mem[t.base].exact),
                            (v.val, v.err, v.exact)):
            old = old.copy()
            old[t.r0:t.r1] = new
            parts.append(old)
        self.mem[t.base] = Val(*parts)

    def declare(self, d: HbmDecl) -> None:
        self.mem[d.id] = Val.known(d.stored())

    def apply(self, step) -> None:
        if isinstance(step, (Load, Store)):
            self.write(step.dst, self.read(step.src))
        elif isinstance(step, Full):
            self.write(step.dst, store(scalar_val(step.value.number), step.dtype, step.shape))
        elif isinstance(step, Alloc):  # contents unknown until written: never read before
            self.mem[step.dst] = Val(np.full(step.shape, np.nan), np.full(step.shape, np.inf),
                                     np.zeros(step.shape, dtype=bool))
        elif isinstance(step, Composite):
            self._composite(step.ops)

    def _composite(self, ops: list[Op]) -> None:
        g = next((i for i, o in enumerate(ops) if o.kind == "gemm"), None)
        target = None
        for op in ops if g is None else ops[:g]:
            target = self._single(op, target)
        if g is None:
            return
        gemm = ops[g]
        A, B = self.read(gemm.args["a"]), self.read(gemm.args["b"])
        if gemm.trans_b:
            B = Val(B.val.T, B.err.T, B.exact.T)
        rest = ops[g + 1:]
        acc = gemm_acc(A, B, self.tile_k, [o.scalars["factor"].number for o in rest if o.scope == "k_tile"])
        for o in rest:
            if o.scope == "output_tile":
                other = self.read(o.args["other"]) if o.kind == "add" else scalar_val(o.scalars["factor"].number)
                acc = pointwise(o.kind, [acc, other])
        out = self.t[gemm.out]
        self.write(out.id, store(acc, out.dtype, out.shape))
        target = out.id
        for o in rest:
            if o.scope == "kernel":
                target = self._single(o, target)

    def _single(self, op: Op, target: str | None) -> str | None:
        """A single-shot op (prologue, post-loop, MATH-only); returns the new accumulator target."""
        if op.kind == RECIPE:
            self._softmax_merge(op)
            return op.args["m"]
        if op.kind in ("scale", "add"):
            t = self.t[target]
            other = self.read(op.args["other"]) if op.kind == "add" else scalar_val(op.scalars["factor"].number)
            self.write(t.id, store(pointwise(op.kind, [self.read(t.id), other]), t.dtype, t.shape))
            return target
        out = self.t[op.out]
        if op.kind == "fill":
            r = scalar_val(op.scalars["value"].number)
        elif op.kind in ("rmax", "rsum"):
            r = reduce_rows(op.kind, self.read(op.args["a"]))
        else:
            r = pointwise(op.kind, [self.read(x) for x in op.args.values()])
        self.write(out.id, store(r, out.dtype, out.shape))
        return out.id

    def _softmax_merge(self, op: Op) -> None:
        """DESIGN §3's engine sequence; scratch takes the dtypes of m, l and s."""
        s_id, m_id, l_id, O_id = (op.args[k] for k in ("s", "m", "l", "O"))
        s, m, l, O = (self.read(x) for x in (s_id, m_id, l_id, O_id))
        md, ld, sd, Od = (self.t[x].dtype for x in (m_id, l_id, s_id, O_id))
        col = m.val.shape
        m_loc = store(reduce_rows("rmax", s), md, col)
        m_new = store(pointwise("max_elem", [m, m_loc]), md, col)
        corr = store(pointwise("exp_diff", [m, m_new]), md, col)
        P = store(pointwise("exp_diff", [s, m_new]), sd, s.val.shape)
        l_loc = store(reduce_rows("rsum", P), ld, col)
        self.write(l_id, store(pointwise("fma", [l, corr, l_loc]), ld, col))
        self.write(O_id, store(pointwise("mul_bcast", [O, corr]), Od, O.val.shape))
        self.write(m_id, store(pointwise("copy", [m_new]), md, col))
        self.write(op.out, P)


# --- the generator ----------------------------------------------------------------------------------
class Gen:
    """Draws one valid program step by step, keeping the reference alongside to stay in its domain."""

    MAX_SCOPE_DEPTH = 2

    def __init__(self, draw):
        self.draw = draw
        self.topo = dict(
            tile_m=draw(st.integers(8, 32)), tile_n=draw(st.integers(8, 32)), tile_k=draw(st.integers(8, 32)),
            tile_buffers=draw(st.integers(1, 3)), cmd_queue_depth=draw(st.sampled_from((1, 2, 3, 4, 8))),
            fixed_cycles=draw(st.sampled_from((40, 0, 1, 97))),
            r_cycles_per_byte=draw(st.sampled_from((0.0625, 0.0, 0.1, 1.0))),
            max_composite_logical_bytes=draw(st.sampled_from((1024, 48, 100))),
            plan_base_cycles=draw(st.sampled_from((8, 0))), plan_cycles_per_op=draw(st.sampled_from((2, 0, 5))),
            dma_base_cycles=draw(st.sampled_from((200, 0, 7))), dma_bytes_per_cycle=draw(st.sampled_from((64, 1, 512))),
            gemm_base_cycles=draw(st.sampled_from((16, 0))), math_base_cycles=draw(st.sampled_from((8, 0))),
            fetch_bytes_per_cycle=draw(st.sampled_from((128, 3))))
        self.sizes = [draw(st.integers(1, 40)) for _ in range(3)]
        self.t: dict[str, Tensor] = {}
        self.hbm: list[HbmDecl] = []
        self.steps: list = []
        self.ref = Ref(self.t, self.topo["tile_k"])
        self.open: list[int] = []
        self.n_scopes = 0
        self.n_cmds = 0
        self.init: set[str] = set()
        self.pending: set[str] = set()   # bases the composite being drawn writes in full
        self.p_valid: set[str] = set()   # recipe primary outputs still holding their merge's P
        self.p_state: dict[str, tuple] = {}
        self.states: list[tuple[str, str, str]] = []
        self.features: set[str] = set()
        self.ids = itertools.count()
        self.closed_a_scope = False

    # -- bookkeeping --------------------------------------------------------------------------------
    def new_id(self, prefix: str) -> str:
        return f"{prefix}{next(self.ids)}"

    def alive(self, tid: str) -> bool:
        b = self.t[self.t[tid].base]
        if b.space == "hbm":
            return True
        if b.id.startswith("P") and b.id not in self.p_valid:
            return False
        return b.scope == 0 or b.scope in self.open

    def is_init(self, tid: str) -> bool:
        base = self.t[tid].base
        return base in self.init or base in self.pending

    def has_inf(self, tid: str) -> bool:
        v = self.ref.mem.get(self.t[tid].base)
        return v is not None and bool(np.isinf(v.val).any())

    def size(self) -> int:
        return self.draw(st.sampled_from(self.sizes))

    def shape(self) -> tuple:
        kind = self.draw(st.sampled_from(("2d", "2d", "col", "1d")))
        return {"2d": lambda: (self.size(), self.size()), "col": lambda: (self.size(), 1),
                "1d": lambda: (self.size(),)}[kind]()

    def it(self) -> int:
        return self.draw(st.sampled_from((-1, -1, -1, 0, 1, 2)))

    def commit(self, step) -> None:
        if isinstance(step, COMMANDS):
            step.cmd = self.n_cmds
            self.n_cmds += 1
            step.label = self.draw(st.sampled_from((None, None, None, "qk", "pv, merge")))
            if step.label is not None:
                self.features.add("label=")
        if isinstance(step, (Load, Full, Alloc)) and self.closed_a_scope:
            self.features.add("alloc after a scope closed")
        self.steps.append(step)

    def tensor(self, prefix: str, space: str, shape: tuple, dtype: str) -> str:
        tid = self.new_id(prefix)
        self.t[tid] = Tensor(tid, space, shape, dtype, tid, scope=self.open[-1] if space == "tcm" and self.open else 0)
        return tid

    def slice_of(self, base: str, rows: int) -> str:
        b = self.t[base]
        r0 = self.draw(st.integers(0, b.shape[0] - rows))
        tid = f"{base}[{r0}:{r0 + rows}]"
        self.t.setdefault(tid, Tensor(tid, b.space, (rows,) + b.shape[1:], b.dtype, base, r0, r0 + rows, b.scope))
        self.features.add(f"{b.space} row slice")
        return tid

    # -- tensors ------------------------------------------------------------------------------------
    def declare(self, shape: tuple, dtype: str, output: bool = False) -> str:
        tid = self.tensor("Y" if output else "X", "hbm", shape, dtype)
        fill = "zeros" if output else self.draw(st.sampled_from(("normal", "uniform", "ints", "tiny")))
        d = HbmDecl(tid, shape, dtype, fill, self.draw(st.integers(0, 2 ** 32 - 1)))
        self.hbm.append(d)
        self.ref.declare(d)
        self.init.add(tid)
        return tid

    def emit_full(self, shape: tuple, dtype: str, value: float | None = None) -> str:
        if value is None:
            value = self.fill_value(dtype)
        tid = self.tensor("t", "tcm", shape, dtype)
        step = Full(tid, shape, dtype, self.scalar(value), self.it())
        self.ref.apply(step)
        self.init.add(tid)
        self.commit(step)
        self.features.add("tl.full " + ("-0.0" if value == 0 and math.copysign(1, value) < 0 else
                                        "inf" if math.isinf(value) else "finite"))
        return tid

    def emit_load(self, src: str) -> str:
        s = self.t[src]
        tid = self.tensor("t", "tcm", s.shape, s.dtype)
        step = Load(tid, src, self.draw(st.booleans()), self.it())
        self.ref.apply(step)
        self.init.add(tid)
        self.commit(step)
        self.features.add("tl.load")
        return tid

    def emit_alloc(self, shape: tuple, dtype: str) -> str:
        tid = self.tensor("t", "tcm", shape, dtype)
        step = Alloc(tid, shape, dtype)
        self.ref.apply(step)
        self.commit(step)
        return tid

    def bases(self):
        return [t for t in self.t.values() if t.base == t.id and self.alive(t.id)]

    def src(self, shape: tuple, spaces=("tcm", "hbm"), finite: bool = False, avoid=(), hbm_bytes: int | None = None,
            new_ok: bool = True) -> str | None:
        """An initialised, live tensor (or row slice) of ``shape`` to read, or a new one."""
        avoid_bases = {self.t[x].base for x in avoid}
        cands = []
        for b in self.bases():
            if b.space not in spaces or b.id in avoid_bases or not self.is_init(b.id):
                continue
            if finite and self.has_inf(b.id):
                continue
            if b.space == "hbm" and hbm_bytes is not None and math.prod(shape) * ITEMSIZE[b.dtype] > hbm_bytes:
                continue
            if b.shape == shape:
                cands.append((b.id, None))
            elif len(b.shape) == len(shape) and b.shape[1:] == shape[1:] and b.shape[0] > shape[0]:
                cands.append((b.id, shape[0]))
        if not cands and not new_ok:
            return None
        i = self.draw(st.integers(0, len(cands) - (0 if new_ok else 1)))
        if i < len(cands):
            base, rows = cands[i]
            return base if rows is None else self.slice_of(base, rows)
        space = self.draw(st.sampled_from(spaces))
        dtype = self.draw(st.sampled_from(DTYPE_NAMES))
        if space == "hbm" and hbm_bytes is not None and math.prod(shape) * ITEMSIZE[dtype] > hbm_bytes:
            if "tcm" not in spaces:
                return None
            space = "tcm"
        if space == "hbm":
            return self.declare(shape, dtype)
        if self.draw(st.booleans()):
            extra = self.draw(st.sampled_from((0, 0, 3)))
            x = self.declare((shape[0] + extra,) + shape[1:], dtype)
            return self.emit_load(x if not extra else self.slice_of(x, shape[0]))
        return self.emit_full(shape, dtype, self.draw(st.sampled_from((1.0, -0.5, 2.0, 0.0))))

    def dst(self, shape: tuple, spaces=("tcm",), avoid=()) -> str:
        """A live tensor (or row slice of an initialised one) of ``shape`` to write, or a new one."""
        avoid_bases = {self.t[x].base for x in avoid}
        cands = []
        for b in self.bases():
            if b.space not in spaces or b.id in avoid_bases or b.id.startswith("P"):
                continue
            if b.shape == shape:
                cands.append((b.id, None))
            elif (self.is_init(b.id) and len(b.shape) == len(shape) and b.shape[1:] == shape[1:]
                  and b.shape[0] > shape[0]):
                cands.append((b.id, shape[0]))
        i = self.draw(st.integers(0, len(cands)))
        if i < len(cands):
            base, rows = cands[i]
            tid = base if rows is None else self.slice_of(base, rows)
        else:
            space = self.draw(st.sampled_from(spaces))
            dtype = self.draw(st.sampled_from(DTYPE_NAMES))
            tid = self.declare(shape, dtype, output=True) if space == "hbm" else self.emit_alloc(shape, dtype)
        if self.t[tid].r0 is None:
            self.pending.add(tid)
        return tid

    def fill_value(self, dtype: str) -> float:
        """A fill value ``dtype`` holds with room to spare (the reference drops what may overflow)."""
        return self.draw(st.sampled_from([v for v in FILL_VALUES if math.isinf(v) or abs(v) <= MAXV[dtype] / 4]))

    def scalar(self, value: float) -> Scalar:
        """``value`` as a kernel may pass it: a float, or an int or numpy scalar of the very same value."""
        forms = ["float", "np64"]
        if float(np.float32(value)) == value:
            forms.append("np32")
        if math.isfinite(value) and value == int(value) and not (value == 0 and math.copysign(1, value) < 0):
            forms.append("int")  # -0.0 as an int would lose its sign
        return Scalar(value, self.draw(st.sampled_from(forms)))

    def factor(self) -> Scalar:
        return self.scalar(self.draw(st.sampled_from(FACTORS)))

    # -- ops ----------------------------------------------------------------------------------------
    def math_op(self, target: str | None, head: bool = False, prefer: str | None = None) -> Op:
        """One MATH op; ``target`` is what an accumulator op would update (None: no accumulator)."""
        kinds = MATH_HEADS + (("scale", "add") if target is not None and self.t[target].space == "tcm" else ())
        kind = self.draw(st.sampled_from(kinds))
        budget = [self.topo["tile_buffers"] if head else 0]
        limit = self.topo["tile_k"] * self.topo["tile_n"] * 4

        def read(shape, finite=True):
            x = self.src(shape, ("tcm", "hbm") if budget[0] else ("tcm",), finite=finite, hbm_bytes=limit)
            if self.t[x].space == "hbm":
                budget[0] -= 1
                self.features.add("MATH head streams from HBM")
            return x

        if kind == "scale":
            return Op("scale", scalars={"factor": self.factor()})
        if kind == "add":
            return Op("add", args={"other": self.src(self.t[target].shape, ("tcm",), finite=True)})
        if kind == "fill":
            shape = self.shape()
            out = self.dst(shape)
            return Op("fill", scalars={"value": self.scalar(self.fill_value(self.t[out].dtype))}, out=out)
        use_prefer = prefer is not None and self.draw(st.booleans())
        if kind in ("rmax", "rsum"):
            shape = (self.t[prefer].shape if use_prefer and len(self.t[prefer].shape) == 2
                     else (self.size(), self.size()))
            a = prefer if use_prefer and self.t[prefer].shape == shape else read(shape, finite=False)
            return Op(kind, args={"a": a}, out=self.dst((shape[0], 1)))
        shape = self.t[prefer].shape if use_prefer else self.shape()
        first = prefer if use_prefer else None
        col = (shape[0], 1) if len(shape) == 2 else shape

        def operand(i, allow_col=True, finite=True):
            if i == 0 and first is not None:
                return first
            return read(col if allow_col and self.draw(st.booleans()) else shape, finite)

        if kind == "copy":
            return Op("copy", args={"a": operand(0, finite=False)}, out=self.dst(shape))
        if kind in ("max_elem", "exp_diff"):
            return Op(kind, args={"a": operand(0, allow_col=False, finite=False), "b": operand(1, finite=False)},
                      out=self.dst(shape))
        if kind == "fma":
            return Op("fma", args={"a": operand(0), "b": operand(1), "c": operand(2)}, out=self.dst(shape))
        return Op(kind, args={"a": operand(0, allow_col=False), "b": operand(1)}, out=self.dst(shape))

    # -- steps --------------------------------------------------------------------------------------
    def try_composite(self, c: Composite, features: set[str]) -> bool:
        """Commit ``c`` if the reference can vouch for it; drop it otherwise (the pending writes too)."""
        trial = self.ref.copy()
        try:
            trial.apply(c)
        except Bad as exc:
            event(f"dropped a {c.what} composite: {exc}")
            self.pending.clear()
            return False
        self.ref = trial
        self.init |= self.pending
        self.pending.clear()
        for op in c.ops:
            if op.kind == RECIPE:
                self.p_valid = {op.out}  # a later expansion may reuse kernel-scope scratch: older P's are stale
                self.init.add(op.out)
                self.p_state[op.out] = (op.args["m"], op.args["l"], op.args["O"])
        self.commit(c)
        self.features |= features | {c.what, c.form}
        if c.rw:
            self.features.add("extra rw_handles")
        if c.it >= 0:
            self.features.add("tl.iteration")
        if self.open:
            self.features.add(f"{c.what} inside a scratch scope")
        return True

    def extras(self, c: Composite) -> Composite:
        c.form = self.draw(st.sampled_from(("legacy", "flat")))
        c.ref = self.draw(st.booleans())
        c.it = self.it()
        if self.draw(st.integers(0, 5)) == 0:
            live = [b.id for b in self.bases()]
            c.rw = [self.draw(st.sampled_from(live))]
        return c

    def gemm(self) -> None:
        M, K, N = self.size(), self.size(), self.size()
        tb = self.draw(st.booleans())
        a = self.src((M, K), finite=True)
        b = self.src((N, K) if tb else (K, N), finite=True)
        before = set(self.pending)
        out = self.dst((M, N), (self.draw(st.sampled_from(("tcm", "hbm"))),), avoid=(a, b))
        out_init = self.t[out].base in self.init or self.t[out].base in before
        feats = {f"gemm a in {self.t[a].space}", f"gemm b in {self.t[b].space}", f"gemm out in {self.t[out].space}"}
        if tb:
            feats.add("trans_b")
        pro, target = [], None
        for _ in range(self.draw(st.integers(0, 2))):
            op = self.math_op(target)
            pro.append(op)
            target = op.out or target
            feats.add("prologue")
        k_epi = [Op("scale", "k_tile", scalars={"factor": self.factor()}) for _ in range(self.draw(st.integers(0, 2)))]
        t_epi = []
        for _ in range(self.draw(st.integers(0, 2))):
            if self.draw(st.booleans()):
                t_epi.append(Op("scale", "output_tile", scalars={"factor": self.factor()}))
            elif self.t[out].space == "tcm" and out_init and self.draw(st.booleans()):
                t_epi.append(Op("add", "output_tile", args={"other": out}))
                feats.add("add other = out")
            else:
                t_epi.append(Op("add", "output_tile", args={"other": self.src((M, N), ("tcm",), True, avoid=(out,))}))
        post, target = [], out
        for _ in range(self.draw(st.integers(0, 2))):
            op = self.math_op(target, prefer=out if self.t[out].space == "tcm" else None)
            op.scope = "kernel"
            post.append(op)
            target = op.out or target
        for label, ops in (("k_tile epilogue", k_epi), ("output_tile epilogue", t_epi), ("post-loop op", post)):
            if ops:
                feats.add(label)
        epi = self.interleave([k_epi, t_epi, post])
        gemm = Op("gemm", args={"a": a, "b": b}, out=out, trans_b=tb)
        self.try_composite(self.extras(Composite("gemm", pro + [gemm] + epi)), feats)

    def interleave(self, buckets: list[list[Op]]) -> list[Op]:
        """The ops of every bucket in one list, each bucket's order kept, the buckets mixed at random."""
        labels = [i for i, b in enumerate(buckets) for _ in b]
        order = self.draw(st.permutations(labels)) if labels else []
        its = [iter(b) for b in buckets]
        return [next(its[i]) for i in order]

    def math(self) -> None:
        ops = [self.math_op(None, head=True)]
        target = ops[0].out
        feats = {f"math {ops[0].kind}"}
        for _ in range(self.draw(st.integers(0, 3))):
            op = self.math_op(target)
            ops.append(op)
            target = op.out or target
            feats.add(f"math {op.kind}" + (" (accumulator)" if op.out is None else ""))
        self.try_composite(self.extras(Composite("math", ops)), feats)

    def state(self, G: int) -> tuple[str, str, str] | None:
        """Merge state (m, l, O) for G rows: a live one, or new from tl.full(-inf / 0 / 0)."""
        live = [s for s in self.states if self.t[s[0]].shape[0] == G and all(self.alive(x) for x in s)]
        i = self.draw(st.integers(0, len(live)))
        if i < len(live):
            return live[i]
        dtype = lambda: self.draw(st.sampled_from(("fp32", "fp32", "bf16", "fp16")))  # noqa: E731
        s = (self.emit_full((G, 1), dtype(), -math.inf), self.emit_full((G, 1), dtype(), 0.0),
             self.emit_full((G, self.size()), dtype(), 0.0))
        self.states.append(s)
        return s

    def merge(self, with_gemm: bool) -> None:
        G, T = self.size(), self.size()
        m, l, O = self.state(G)
        s = self.src((G, T), ("tcm",), finite=True, avoid=(m, l, O))
        P = self.tensor("P", "tcm", (G, T), self.t[s].dtype)
        # the expansion may overwrite an older P (kernel-scope scratch is reused): nothing after it reads one
        valid, self.p_valid = self.p_valid, set()
        recipe = Op(RECIPE, args={"s": s, "m": m, "l": l, "O": O}, out=P)
        if with_gemm:
            D = self.t[O].shape[1]
            tb = self.draw(st.booleans())
            V = self.src((D, T) if tb else (T, D), finite=True, avoid=(O,))
            ops = [recipe, Op("gemm", args={"a": P, "b": V}, out=O, trans_b=tb, auto_a=True),
                   Op("add", "output_tile", args={"other": O})]
            if self.draw(st.integers(0, 3)) == 0:
                ops.insert(2, Op("scale", "k_tile", scalars={"factor": self.factor()}))
            kept = self.try_composite(self.extras(Composite("merge_gemm", ops)),
                                     {f"merge V in {self.t[V].space}", "add other = out"})
        else:
            ops = [recipe]
            if self.draw(st.integers(0, 3)) == 0:
                ops.append(self.math_op(m))  # an accumulator op after the recipe updates m, its last out
            kept = self.try_composite(self.extras(Composite("merge_only", ops)), set())
        if not kept:
            self.p_valid = valid

    def pv(self) -> None:
        ps = [p for p in sorted(self.p_valid) if self.alive(p) and all(self.alive(x) for x in self.p_state[p])]
        if not ps:
            return self.merge(with_gemm=False)
        P = self.draw(st.sampled_from(ps))
        O = self.p_state[P][2]
        G, T = self.t[P].shape
        D = self.t[O].shape[1]
        tb = self.draw(st.booleans())
        V = self.src((D, T) if tb else (T, D), finite=True, avoid=(O,))
        ops = [Op("gemm", args={"a": P, "b": V}, out=O, trans_b=tb), Op("add", "output_tile", args={"other": O})]
        self.try_composite(self.extras(Composite("pv", ops)), {"gemm reads a recipe's primary_out", "add other = out"})

    def load(self) -> None:
        x = self.src(self.shape(), ("hbm",))
        if self.draw(st.booleans()) and self.t[x].shape[0] > 1:
            x = self.slice_of(self.t[x].base, self.draw(st.integers(1, self.t[x].shape[0] - 1)))
        self.emit_load(x)

    def store_(self) -> None:
        tcm = [b.id for b in self.bases() if b.space == "tcm" and self.is_init(b.id)]
        x = self.draw(st.sampled_from(tcm)) if tcm and self.draw(st.booleans()) else self.src(self.shape(), ("tcm",))
        s = self.t[x]
        cands = [b.id for b in self.bases() if b.space == "hbm" and b.dtype == s.dtype and len(b.shape) == len(s.shape)
                 and b.shape[1:] == s.shape[1:] and b.shape[0] >= s.shape[0]]
        i = self.draw(st.integers(0, len(cands)))
        if i < len(cands):
            y = cands[i] if self.t[cands[i]].shape == s.shape else self.slice_of(cands[i], s.shape[0])
        else:
            extra = self.draw(st.sampled_from((0, 0, 2)))
            y = self.declare((s.shape[0] + extra,) + s.shape[1:], s.dtype, output=True)
            if extra:
                y = self.slice_of(y, s.shape[0])
        step = Store(x, y, self.it())
        self.ref.apply(step)
        self.commit(step)
        self.features.add("tl.store")

    def step(self) -> None:
        kind = self.draw(st.sampled_from(STEP_KINDS))
        if kind == "full":
            self.emit_full(self.shape(), self.draw(st.sampled_from(DTYPE_NAMES)))
        elif kind == "load":
            self.load()
        elif kind == "store":
            self.store_()
        elif kind == "math":
            self.math()
        elif kind == "gemm":
            self.gemm()
        elif kind == "merge_gemm":
            self.merge(True)
        elif kind == "merge_only":
            self.merge(False)
        elif kind == "pv":
            self.pv()
        elif kind == "scope" and len(self.open) < self.MAX_SCOPE_DEPTH:
            self.n_scopes += 1
            self.open.append(self.n_scopes)
            self.steps.append(ScopeOpen(self.n_scopes))
            for _ in range(self.draw(st.integers(1, 3))):
                self.step()
            self.close_scope()
            if self.draw(st.booleans()):
                # fresh TCM over the bytes the scope released, maybe under a command still using them
                big = max(self.sizes)
                shape = self.draw(st.sampled_from(((big, big), self.shape())))
                if self.draw(st.booleans()):
                    self.emit_full(shape, "fp32")
                else:
                    self.emit_load(self.declare(shape, "fp32"))
        elif kind == "wait" and self.n_cmds:
            self.steps.append(Wait(self.draw(st.integers(0, self.n_cmds - 1)), self.draw(st.booleans())))
            self.features.add("tl.wait")

    def close_scope(self) -> None:
        sid = self.open.pop()
        self.steps.append(ScopeClose(sid))
        self.closed_a_scope = True
        self.features.add("scratch scope")

    def program(self) -> Program:
        while self.open:
            self.close_scope()
        if not self.n_cmds:
            self.emit_full((1,), "fp32", 0.0)
        final, dead = [], []
        for b in self.t.values():
            if b.base != b.id:
                continue
            if b.space == "tcm" and b.scope and b.scope not in self.open and (b.id in self.init or b.id[0] != "P"):
                dead.append(b.id)
            elif b.id in self.init and self.alive(b.id):
                final.append(b.id)
        return Program(self.topo, self.t, self.hbm, self.steps, self.n_cmds, final, dead, frozenset(self.features))


@st.composite
def programs(draw) -> Program:
    g = Gen(draw)
    for _ in range(draw(st.integers(1, 12))):
        g.step()
    return g.program()


def reference(prog: Program) -> Ref:
    """The program's meaning, from scratch: every step in program order."""
    ref = Ref(prog.tensors, prog.topo["tile_k"])
    for d in prog.hbm:
        ref.declare(d)
    for s in prog.steps:
        ref.apply(s)
    return ref


# --- running a program ------------------------------------------------------------------------------
@dataclass
class Built:
    """What the kernel made in one run: handles by tensor id, and per command the handles it names."""

    handles: dict = field(default_factory=dict)
    completions: list = field(default_factory=list)
    reads: list = field(default_factory=list)    # per command: handles it reads
    writes: list = field(default_factory=list)   # per command: handles it writes
    waits: list = field(default_factory=list)    # (before command, waited command)
    labels: list = field(default_factory=list)   # per command: its op_log label (DESIGN §2 default if none given)


def execute(prog: Program, mode: str, policy: str):
    sim = kbwork.Simulator(mode=mode, hazard_policy=policy, **prog.topo)
    hbm = {}
    for d in prog.hbm:
        data = d.data()
        hbm[d.id] = (sim.hbm(d.id, shape=d.shape, dtype=d.dtype) if data is None
                     else sim.hbm(d.id, data, dtype=d.dtype))
    built = Built(handles=dict(hbm))
    run = sim.run(lambda tl: _emit(tl, prog, built))
    return run, built


def _emit(tl, prog: Program, built: Built) -> None:
    h = built.handles
    scopes = []

    def H(tid: str, ref: bool = False):
        t = prog.tensors[tid]
        x = h[t.base]
        if ref and x.space == "hbm":
            x = tl.ref(x)
        return x if t.r0 is None else x[t.r0:t.r1]

    for s in prog.steps:
        if isinstance(s, ScopeOpen):
            scopes.append(tl.scratch_scope())
            scopes[-1].__enter__()
            continue
        if isinstance(s, ScopeClose):
            scopes.pop().__exit__(None, None, None)
            continue
        if isinstance(s, Wait):
            c = built.completions[s.target]
            tl.wait(Completion(s.target) if s.hand_built or c is None else c)
            built.waits.append((len(built.completions), s.target))
            continue
        if isinstance(s, Alloc):
            h[s.dst] = tl.alloc(s.shape, s.dtype, name=s.dst)
            continue
        with tl.iteration(s.it) if s.it >= 0 else contextlib.nullcontext():
            comp, reads, writes = None, [], []
            label = {} if s.label is None else {"label": s.label}
            if isinstance(s, Load):
                h[s.dst] = tl.load(H(s.src, s.ref), name=s.dst, **label)
                reads, writes, default = [H(s.src)], [h[s.dst]], f"dma_load {H(s.src).name}"
            elif isinstance(s, Store):
                comp = tl.store(H(s.src), H(s.dst), **label)
                reads, writes, default = [H(s.src)], [H(s.dst)], f"dma_store {H(s.src).name}"
            elif isinstance(s, Full):
                h[s.dst] = tl.full(s.shape, s.value.host(), s.dtype, name=s.dst, **label)
                writes, default = [h[s.dst]], f"fill {s.dst}"
            else:
                comp, reads, writes = _composite(tl, prog, s, H, h, label)
                default = "+".join(k for o in s.ops for k in (RECIPE_KINDS if o.kind == RECIPE else (o.kind,)))
        built.labels.append(default if s.label is None else s.label)
        assert s.cmd == len(built.completions) == len(tl.commands) - 1
        built.completions.append(comp)
        built.reads.append(reads)
        built.writes.append(writes)
    assert not scopes


def _composite(tl, prog: Program, c: Composite, H, h, label: dict):
    """Emit ``c`` in its form; returns its completion and the handles it reads and writes (DESIGN §5)."""
    ops = c.ops
    g = next((i for i, o in enumerate(ops) if o.kind == "gemm"), None)
    reads, writes = [], [H(x) for x in c.rw]

    def args(o: Op, ref: bool = False) -> dict:
        named = {p: H(x, ref) for p, x in o.args.items() if not (o.auto_a and p == "a")}
        reads.extend(named.values())
        if o.kind == RECIPE:
            writes.extend(named[p] for p in ("m", "l", "O"))
        if o.out is not None and o.kind != RECIPE:
            writes.append(H(o.out))
        return named

    def entry(o: Op, default_scope: str) -> dict:
        d = {"op": o.kind, **args(o), **{k: v.host() for k, v in o.scalars.items()}}
        if o.out is not None and o.kind != RECIPE:
            d["out"] = H(o.out)
        if o.scope != default_scope:
            d["scope"] = o.scope
        return d

    if c.form == "flat":
        specs = []
        for i, o in enumerate(ops):
            named = args(o, ref=c.ref and i == (g if g is not None else 0))
            extra = {k: v.host() for k, v in o.scalars.items()}
            if o.kind == "gemm":
                a, b = prog.tensors[o.args["a"]], prog.tensors[o.args["b"]]
                extra = {"m": a.shape[0], "k": a.shape[1], "n": b.shape[0] if o.trans_b else b.shape[1],
                         "trans_b": o.trans_b}
            out = H(o.out) if o.out is not None and o.kind != RECIPE else None
            specs.append(OpSpec(o.kind, Scope(o.scope), named, extra, out))
        comp = tl.composite(ops=specs, rw_handles=[H(x) for x in c.rw] or None, **label)
    elif g is not None:
        gemm = ops[g]
        pro = [entry(o, "kernel") for o in ops[:g]]
        kw = dict(op="gemm", out=H(gemm.out), trans_b=gemm.trans_b, prologue=pro, **args(gemm, c.ref))
        kw["epilogue"] = [entry(o, "output_tile") for o in ops[g + 1:]]
        comp = tl.composite(**kw, rw_handles=[H(x) for x in c.rw], **label)
    elif ops[0].kind == RECIPE:
        comp = tl.composite(op="math", prologue=[entry(ops[0], "kernel")],
                            epilogue=[entry(o, "kernel") for o in ops[1:]], rw_handles=[H(x) for x in c.rw], **label)
    else:
        head = ops[0]
        comp = tl.composite(op="math", math_op=head.kind, out=H(head.out), **args(head, c.ref),
                            **{k: v.host() for k, v in head.scalars.items()},
                            epilogue=[entry(o, "kernel") for o in ops[1:]], rw_handles=[H(x) for x in c.rw], **label)
    for o in ops:
        if o.kind == RECIPE:
            h[o.out] = comp.primary_out
            cmd = tl.commands[-1]
            _check_recipe_lowering(cmd, o, prog, H)
            writes.extend(cmd.scratch)  # recipe scratch counts as written (DESIGN §3, §5)
    return comp, reads, writes


def _check_recipe_lowering(cmd, op: Op, prog: Program, H) -> None:
    """DESIGN §3: 8 MATH ops in the documented order, rw_handles (m, l, O), scratch shaped from the operands."""
    kinds = [o.kind for o in cmd.ops]
    assert kinds[:8] == list(RECIPE_KINDS), kinds
    m, l, O, s = (H(op.args[k]) for k in ("m", "l", "O", "s"))
    assert tuple(cmd.rw_handles[:3]) == (m, l, O)
    want = {"m_loc": (m.shape, m.dtype), "m_new": (m.shape, m.dtype), "corr": (m.shape, m.dtype),
            "l_loc": (l.shape, l.dtype), "P": (s.shape, s.dtype)}
    got = {x.name.rsplit(".", 1)[1]: (x.shape, x.dtype) for x in cmd.scratch}
    assert got == want, (got, want)
    assert cmd.completion.primary_out in cmd.scratch and cmd.completion.primary_out.pinned


# --- checks -------------------------------------------------------------------------------------------
def check_values(run, built: Built, prog: Program, ref: Ref) -> dict[str, np.ndarray]:
    """Every live tensor within its bound of the reference; handles of closed scopes refused."""
    got = {}
    for tid in prog.final:
        t = prog.tensors[tid]
        x = run.read(built.handles[tid])
        assert x.dtype == DT[t.dtype] and x.shape == t.shape, tid
        want = ref.mem[tid]
        g = x.astype(F64)
        inf = np.isinf(want.val)
        bad = np.nonzero(inf & (g != want.val))
        assert not bad[0].size, f"{tid}{bad}: infinities differ: got {g[bad][:4]}, want {want.val[bad][:4]}"
        ex = want.exact
        uint = f"u{ITEMSIZE[t.dtype]}"
        with np.errstate(all="ignore"):
            exp_bits = want.val.astype(np.float32).astype(DT[t.dtype]).view(uint)
        got_bits = x.view(uint)
        bad = np.nonzero(ex & (got_bits != exp_bits))
        assert not bad[0].size, f"{tid}{bad}: not bit-exact: got {g[bad][:4]}, want {want.val[bad][:4]}"
        fin = ~inf
        with np.errstate(all="ignore"):
            over = np.abs(g - want.val) - want.err * SLACK
        bad = np.nonzero(fin & ~(over <= 0))
        assert not bad[0].size, (f"{tid}{bad}: beyond the bound: got {g[bad][:4]}, want {want.val[bad][:4]} "
                                 f"+- {want.err[bad][:4]}")
        got[tid] = x
    for tid in prog.dead:
        with pytest.raises(kbwork.ValidationError, match="scratch_scope"):
            run.read(built.handles[tid])
    return got


def _span(hd) -> tuple:
    """A handle's byte range, from its fields: (space, first byte, one past the last)."""
    return (str(hd.space), hd.addr, hd.addr + math.prod(hd.shape) * ITEMSIZE[hd.dtype])


def _overlap(xs, ys) -> bool:
    return any(s1 == s2 and lo1 < hi2 and lo2 < hi1 for s1, lo1, hi1 in xs for s2, lo2, hi2 in ys)


def expected_stages(prog: Program, step, topo) -> Counter:
    """(stage, phase) -> count for one command, from the program's shapes and the tiles (DESIGN §1, §3, §5)."""
    c = Counter({("DISPATCH", "dispatch"): 1, ("PLAN", "plan"): 1})
    T = prog.tensors
    if isinstance(step, Load):
        c[("DMA_READ", "single")] += 1
        return c
    if isinstance(step, Store):
        c[("DMA_WRITE", "single")] += 1
        return c
    if isinstance(step, Full):
        c[("MATH", "single")] += 1
        return c
    n_ops = lambda ops: sum(8 if o.kind == RECIPE else 1 for o in ops)  # noqa: E731
    ops = step.ops
    g = next((i for i, o in enumerate(ops) if o.kind == "gemm"), None)
    if g is None:
        c[("MATH", "single")] += n_ops(ops)
        if ops[0].kind != RECIPE:
            c[("DMA_READ", "single")] += sum(T[x].space == "hbm" for x in ops[0].args.values())
        return c
    gemm = ops[g]
    a, b, out = T[gemm.args["a"]], T[gemm.args["b"]], T[gemm.out]
    M, K = a.shape
    N = b.shape[0] if gemm.trans_b else b.shape[1]
    tiles = -(-M // topo.tile_m) * -(-N // topo.tile_n)
    steps = tiles * -(-K // topo.tile_k)
    c[("MATH", "prologue")] += n_ops(ops[:g])
    c[("FETCH", "tile")] += steps
    c[("GEMM", "tile")] += steps
    c[("DMA_READ", "tile")] += steps * ((a.space == "hbm") + (b.space == "hbm"))
    c[("DMA_WRITE", "tile")] += tiles * (out.space == "hbm")
    rest = ops[g + 1:]
    c[("MATH", "k_epilogue")] += steps * sum(o.scope == "k_tile" for o in rest)
    c[("MATH", "tile_epilogue")] += tiles * sum(o.scope == "output_tile" for o in rest)
    c[("MATH", "post")] += sum(o.scope == "kernel" for o in rest)
    return +c


def check_op_log(run, prog: Program, built: Built) -> None:
    """DESIGN §4-§6 on one op_log, recomputed from the program and the handles the kernel passed.

    Schema and engines; every stage after its static dependencies; DISPATCH in
    program order at the §4 cost and PLAN in dispatch order at 8 + 2 x ops; DMA
    and FETCH latencies; at most ``cmd_queue_depth`` commands in flight;
    ``tl.wait``; ``iter`` and ``label``; each command's stages by kind and phase;
    hazard order on byte ranges taken from the handles (rw_handles, outs and
    recipe scratch written, operands read); strict-FIFO holds that block later
    PLANs; DISPATCH and PLAN starting exactly when ready; the data engines
    work-conserving and oldest-first; the within-command order and the shared
    staging ring (:func:`_check_plan_rules`).
    """
    log, P, topo = run.op_log, run.program, run.topology
    ncmd = prog.n_cmds
    assert list(log.columns) == COLUMNS and len(P.commands) == ncmd
    n = len(log)
    assert (log.seq.to_numpy() == np.arange(n)).all()
    cmd = log.cmd.to_numpy()
    stage = log.stage.astype(str).to_numpy()
    engine = log.engine.astype(str).to_numpy()
    phase = log.phase.astype(str).to_numpy()
    tile, ktile, nbytes = log.tile.to_numpy(), log.k_tile.to_numpy(), log.bytes.to_numpy()
    start, end = log.start.to_numpy(), log.end.to_numpy()
    assert (start >= 0).all() and (end >= start).all() and run.cycles == end.max()
    assert all(ENGINE_OF[s] == e for s, e in zip(stage, engine))

    # each engine runs one stage at a time
    for e in set(engine):
        idx = np.nonzero(engine == e)[0]
        order = idx[np.lexsort((end[idx], start[idx]))]
        assert (start[order][1:] >= end[order][:-1]).all(), f"{e} runs two stages at once"
    # static dependencies
    for s, preds in enumerate(P.table.preds):
        for p in preds:
            assert start[s] >= end[p], f"seq {s} starts at {start[s]}, before its dependency {p} ends ({end[p]})"
    # DISPATCH in program order at the DESIGN §4 cost; PLAN in dispatch order at 8 + 2 x len(ops)
    d = np.nonzero(stage == "DISPATCH")[0]
    p = np.nonzero(stage == "PLAN")[0]
    assert (cmd[d] == np.arange(ncmd)).all() and (cmd[p] == np.arange(ncmd)).all()
    assert (start[d][1:] >= end[d][:-1]).all() and (start[p][1:] >= end[p][:-1]).all()
    assert (start[p] >= end[d]).all()
    for c, command in enumerate(P.commands):
        lb = design_logical_bytes(command)
        assert nbytes[d[c]] == lb and end[d[c]] - start[d[c]] == design_dispatch_cycles(lb, topo), c
        n_ops = 1 if not command.ops else len(command.ops)
        assert end[p[c]] - start[p[c]] == topo.plan_base_cycles + topo.plan_cycles_per_op * n_ops, c
    work = np.nonzero((stage != "DISPATCH") & (stage != "PLAN"))[0]
    assert (start[work] >= end[p][cmd[work]]).all(), "a plan stage starts before its command's PLAN ends"
    assert set(cmd[work]) == set(range(ncmd))
    done = np.zeros(ncmd, dtype=np.int64)
    np.maximum.at(done, cmd, end)
    first = np.full(ncmd, np.iinfo(np.int64).max)
    np.minimum.at(first, cmd[work], start[work])
    d_start, plan_start, plan_end = start[d], start[p], end[p]
    # DMA and FETCH latencies (DESIGN §1)
    dma = np.isin(stage, ("DMA_READ", "DMA_WRITE"))
    assert (end[dma] - start[dma] == topo.dma_base_cycles + -(-nbytes[dma] // topo.dma_bytes_per_cycle)).all()
    fetch = stage == "FETCH"
    assert (end[fetch] - start[fetch] == -(-nbytes[fetch] // topo.fetch_bytes_per_cycle)).all()
    # at most cmd_queue_depth commands in flight, from DISPATCH start to completion
    for c in range(ncmd):
        assert (done[:c] > d_start[c]).sum() <= topo.cmd_queue_depth - 1, f"cmd {c} dispatched into a full queue"
    # tl.wait: the next DISPATCH waits for the waited command's completion
    waits: dict[int, list[int]] = {}
    for before, k in built.waits:
        waits.setdefault(before, []).append(k)
        if before < ncmd:
            assert d_start[before] >= done[k], f"cmd {before} dispatched before the waited cmd {k} completed"
    assert [tuple(sorted(set(waits.get(c, ())))) for c in range(ncmd)] == [tuple(sorted(set(w))) for w in P.waits]
    # iteration labels and the stages each command plans
    commands = [s for s in prog.steps if isinstance(s, COMMANDS)]
    iters = log.iter.to_numpy()
    assert (iters == np.array([s.it for s in commands])[cmd]).all()
    got = Counter(zip(cmd.tolist(), stage.tolist(), phase.tolist()))
    for c, s in enumerate(commands):
        want = expected_stages(prog, s, topo)
        mine = Counter({(st_, ph): k for (cc, st_, ph), k in got.items() if cc == c})
        assert mine == want, f"cmd {c} {s!r}: stages {dict(mine)}, expected {dict(want)}"
    _check_plan_rules(prog, commands, cmd, stage, phase, tile, ktile, start, end, topo)
    assert (log.label.astype(str).to_numpy() == np.array(built.labels, dtype=object)[cmd]).all()
    # hazards on byte ranges computed here from the handles each command names, and when each command's
    # plan stages were released: at its PLAN end, or when its hold ended (DESIGN §5)
    fp = [([_span(x) for x in r], [_span(x) for x in w]) for r, w in zip(built.reads, built.writes)]
    strict = topo.hazard_policy == "strict_fifo"
    held = np.zeros(ncmd, dtype=bool)
    release = plan_end.copy()
    for c in range(ncmd):
        rc, wc = fp[c]
        hit = [o for o in range(c) if _overlap(rc, fp[o][1]) or _overlap(wc, fp[o][1]) or _overlap(wc, fp[o][0])]
        for o in hit:
            assert first[c] >= done[o], f"cmd {c} started work at {first[c]} before the conflicting cmd {o} " \
                                        f"completed ({done[o]})"
        held[c] = any(done[o] > plan_end[c] for o in hit)
        if held[c]:  # strict FIFO: until every earlier command completed; rw_aware: the conflicting ones
            release[c] = done[:c].max() if strict else max(done[o] for o in hit)
        if strict and held[c]:
            assert first[c] >= release[c], f"strict FIFO: held cmd {c} started before every earlier one completed"
            assert (plan_start[c + 1:] >= release[c]).all(), f"strict FIFO: a PLAN overtook the held cmd {c}"
    # PE_CPU dispatches as soon as the previous DISPATCH ended, a queue slot is free (the depth-th latest
    # completion so far) and its tl.wait completions are in (DESIGN §6 "ready")
    depth, d_end = topo.cmd_queue_depth, end[d]
    for c in range(ncmd):
        t = max([d_end[c - 1] if c else 0] + [done[k] for k in waits.get(c, ())])
        if c >= depth:
            t = max(t, np.sort(done[:c])[-depth])
        assert d_start[c] == t, f"cmd {c}: DISPATCH starts at {d_start[c]}, ready at {t}"
    # PE_SCHEDULER plans as soon as the DISPATCH and the previous PLAN ended, and under strict FIFO the
    # previous command's hold (the scheduler takes nothing while one is held)
    for c in range(ncmd):
        t = max(d_end[c], plan_end[c - 1] if c else 0)
        if strict and c and held[c - 1]:
            t = max(t, release[c - 1])
        assert plan_start[c] == t, f"cmd {c}: PLAN starts at {plan_start[c]}, ready at {t}"
    # a plan stage is ready when released and its dependencies ended; each data engine, whenever free,
    # starts the ready stage with the lowest seq
    ready = np.full(n, -1, dtype=np.int64)
    for s in work:
        ready[s] = max([release[cmd[s]]] + [end[x] for x in P.table.preds[s]])
    assert (start[work] >= ready[work]).all(), "a stage started before it was ready"
    for e in ("PE_DMA", "PE_GEMM", "PE_MATH"):
        idx = work[engine[work] == e]
        idx = idx[np.argsort(start[idx], kind="stable")]
        st_, en_ = start[idx], end[idx]
        busy_from = st_.copy()  # start of the back-to-back run of stages each one closes
        for i in range(1, len(idx)):
            if en_[i - 1] == st_[i]:
                busy_from[i] = busy_from[i - 1]
        for i, s in enumerate(idx):
            if st_[i] > ready[s]:
                assert busy_from[i] <= ready[s], f"{e} idled while seq {s} was ready (at {ready[s]}, started {st_[i]})"
                # a stage made ready by a 0-cycle PLAN may lose its own instant to one the engine took first
                lo = np.searchsorted(st_, ready[s], "right")
                assert (idx[lo:i] < s).all(), f"{e} started a younger stage while seq {s} was ready"


def _check_plan_rules(prog, commands, cmd, stage, phase, tile, ktile, start, end, topo) -> None:
    """DESIGN §5's within-command order and the shared staging ring, read off the op_log alone."""
    rows: dict[int, list[int]] = {}
    for s in range(len(cmd)):
        if stage[s] not in ("DISPATCH", "PLAN"):
            rows.setdefault(int(cmd[s]), []).append(s)
    ring: dict[str, list[tuple[int, int]]] = {"a": [], "b": []}  # per slot: (read, consumer) in plan order
    for c, step in enumerate(commands):
        idx = rows[c]

        def chained(xs):
            assert all(start[y] >= end[x] for x, y in zip(xs, xs[1:])), f"cmd {c}: {phase[xs]} not chained"

        pro = [s for s in idx if phase[s] == "prologue"]
        post = [s for s in idx if phase[s] == "post"]
        single = [s for s in idx if phase[s] == "single"]
        loop = [s for s in idx if phase[s] in ("tile", "k_epilogue", "tile_epilogue")]
        chained(pro)
        chained(post)
        if pro:
            assert all(start[s] >= max(end[pro]) for s in loop), f"cmd {c}: a tile starts before the prologue ends"
        if post:
            assert min(start[post]) >= max(end[loop]), f"cmd {c}: post-loop before the last tile"
        maths = [s for s in single if stage[s] == "MATH"]
        reads = [s for s in single if stage[s] == "DMA_READ"]
        if maths:
            chained(maths)
            assert all(start[maths[0]] >= end[r] for r in reads), f"cmd {c}: MATH before its operands arrived"
            if isinstance(step, Composite):
                ring["b"].extend((r, maths[0]) for r in reads)
        if not loop:
            continue
        gemm = next(o for o in step.ops if o.kind == "gemm")
        streamed = [slot for slot, x in (("a", gemm.args["a"]), ("b", gemm.args["b"]))
                    if prog.tensors[x].space == "hbm"]
        by_step: dict[tuple, list[int]] = {}
        by_tile: dict[int, list[int]] = {}
        for s in loop:
            by_tile.setdefault(int(tile[s]), []).append(s)
            if ktile[s] >= 0:
                by_step.setdefault((int(tile[s]), int(ktile[s])), []).append(s)
        for (t, k), xs in sorted(by_step.items()):
            rd = [s for s in xs if stage[s] == "DMA_READ"]
            f = [s for s in xs if stage[s] == "FETCH"]
            gm = [s for s in xs if stage[s] == "GEMM"]
            kepi = [s for s in xs if stage[s] == "MATH"]
            assert len(f) == len(gm) == 1 and len(rd) == len(streamed), f"cmd {c} tile {t} k {k}"
            assert all(start[f[0]] >= end[r] for r in rd), f"cmd {c}: FETCH before its DMA_READ"
            assert start[gm[0]] >= end[f[0]], f"cmd {c}: GEMM before its FETCH"
            chained(gm + kepi)
            if k > 0:
                assert start[gm[0]] >= max(end[by_step[(t, k - 1)]]), f"cmd {c}: k-tile {k} before k-tile {k - 1}"
            for slot, r in zip(streamed, rd):
                ring[slot].append((r, f[0]))
        for t, xs in by_tile.items():
            body = [s for s in xs if ktile[s] >= 0]
            tepi = [s for s in xs if phase[s] == "tile_epilogue"]
            if tepi:
                chained(tepi)
                assert min(start[tepi]) >= max(end[body]), f"cmd {c}: tile epilogue before the tile's last k-tile"
            w = [s for s in xs if stage[s] == "DMA_WRITE"]
            if w:
                assert start[w[0]] >= max(end[[s for s in xs if s != w[0]]]), f"cmd {c}: write-back too early"
    nb = topo.tile_buffers
    for slot, pairs in ring.items():
        pairs.sort()
        for i in range(nb, len(pairs)):
            assert start[pairs[i][0]] >= end[pairs[i - nb][1]], f"staging {slot}: a read overwrote a buffer in use"


# --- the tests ------------------------------------------------------------------------------------------
def check_program(prog: Program) -> None:
    ref = reference(prog)
    values = {}
    for policy in POLICIES:
        run, built = execute(prog, "data", policy)
        check_op_log(run, prog, built)
        values[policy] = check_values(run, built, prog, ref)
        timing, _ = execute(prog, "timing", policy)
        assert timing.to_csv() == run.to_csv(), f"{policy}: timing-mode op_log differs from data mode"
    for tid, x in values["strict_fifo"].items():
        assert x.tobytes() == values["rw_aware"][tid].tobytes(), f"{tid} differs between hazard policies"


@FUZZ
@given(programs())
@(seed(int(SEED)) if SEED is not None else (lambda f: f))
def test_fuzz_random_programs(prog):
    for f in sorted(prog.features):
        event(f)
    check_program(prog)


#: what the generator must reach within the CI budget, or it has silently narrowed
FEATURES = {
    "tl.load", "tl.store", "tl.full -0.0", "tl.full inf", "hbm row slice", "tcm row slice", "gemm", "math",
    "merge_gemm", "merge_only", "pv", "legacy", "flat", "trans_b", "gemm a in hbm", "gemm b in hbm",
    "gemm out in hbm", "gemm a in tcm", "gemm b in tcm", "gemm out in tcm", "prologue", "k_tile epilogue",
    "output_tile epilogue", "post-loop op", "add other = out", "MATH head streams from HBM", "scratch scope",
    "alloc after a scope closed", "merge_gemm inside a scratch scope", "merge_only inside a scratch scope",
    "tl.wait", "tl.iteration", "label=", "extra rw_handles", "gemm reads a recipe's primary_out", "merge V in hbm",
    *(f"math {k}" for k in MATH_HEADS), "math scale (accumulator)", "math add (accumulator)",
}


def test_generator_reaches_every_feature():
    seen: set[str] = set()
    n_cmds = []

    @settings(max_examples=300, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(programs())
    def collect(prog):
        seen.update(prog.features)
        n_cmds.append(prog.n_cmds)
        reference(prog)  # what the generator kept, the reference accepts

    collect()
    assert FEATURES <= seen, sorted(FEATURES - seen)
    assert np.median(n_cmds) >= 5 and max(n_cmds) <= 60
