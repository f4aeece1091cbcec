"""GQA decode attention for one KV head, and the registry of its variants (DESIGN.md §7, §13).

Q is (G, d), K and V are (N, d) in HBM, processed in tiles of T rows. Every
variant shares the program order of DESIGN.md §7, so the comparison is fair:

``tl.load(q)``; ``tl.full`` m, l, O; ``qk(0)``; for each tile j: ``qk(j+1)``
if there is a next tile, then the variant's merge of tile j; then
``div_bcast(O, l)`` and ``tl.store(O, out)``.

The loop over tiles is a ``tl.range`` (traced once; DESIGN.md §13): its body
is ``qk(j + 1)`` and the merge of tile ``j``, the last tile's merge is peeled
after it, and the score tiles live in a two-slot ``tl.ring`` (``S[j]`` is
slot ``j mod 2``). The program therefore knows its loop — where it starts,
how many commands an iteration has, its period — and nothing about it is
declared by hand.

A variant is one function that emits the merge of tile j — the online-softmax
update of (m, l, O) with the scores ``S[j]`` and the product with ``V_j`` —,
an optional ``setup`` that allocates its kernel-scope scratch before the
loop, and its entry in :data:`VARIANTS`:

* ``opt2`` (2 commands per tile): one composite, the ``softmax_merge`` recipe
  as the prologue of ``gemm(P, V_j) + add O``.
* ``opt3`` (10 commands per tile): the recipe's eight micro-ops, each its own
  MATH composite, then ``pv``.
* ``a1`` (3 commands per tile; ADR-0065's rejected alternative A1): the recipe
  alone as a MATH-only composite, then ``pv`` reading P from its completion's
  ``primary_out``.

To add a variant, write its merge function and register it
(``VARIANTS["mine"] = Variant("mine", merge)``); ``decode.run``,
``compare``, ``sweep``, the CLI and the calibration panel pick it up. A merge
runs once per trace, with symbolic ``Sj`` and ``Vj``: Python code in it runs
once, not once per tile.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

from ..errors import ValidationError
from ..memory import Handle, Ring
from ..triton_emu.tl_context import TLContext
from ..triton_emu.tl_recipes import softmax_merge_recipe


@dataclass
class DecodeState:
    """What a merge works on: the running state, the score ring ``S`` (``S[j]`` is tile j's), and any
    variant-owned scratch (``setup`` fills ``scratch``)."""

    m: Handle
    l: Handle
    O: Handle
    S: Ring
    scratch: dict[str, Handle] = field(default_factory=dict)
    #: the dtype P is written in: the topology's ``p_dtype`` (DESIGN.md §17), read once, in :func:`gqa_decode`
    p_dtype: str = "fp32"


@dataclass(frozen=True)
class Variant:
    """A decode variant: ``merge(tl, state, Sj, Vj)`` emits the merge of one tile.

    ``setup(tl, state)``, if given, allocates kernel-scope scratch once, before
    the loop (a ``tl.range`` body allocates no TCM).
    """

    name: str
    merge: Callable[[TLContext, DecodeState, Handle, Handle], None]
    doc: str = ""
    setup: Callable[[TLContext, DecodeState], None] | None = None

    def __repr__(self) -> str:
        return f"Variant({self.name}: {self.doc or self.merge.__name__})"


def _merge_opt2(tl: TLContext, st: DecodeState, Sj: Handle, Vj: Handle) -> None:
    tl.composite(prologue=[{"op": softmax_merge_recipe(st.p_dtype), "s": Sj, "m": st.m, "l": st.l, "O": st.O}],
                 op="gemm", b=Vj, out=st.O, epilogue=[{"op": "add", "other": st.O}], label="pv_merge")


def _setup_opt3(tl: TLContext, st: DecodeState) -> None:
    G, T = st.S[0].shape
    for n in ("m_loc", "m_new", "corr", "l_loc"):
        st.scratch[n] = tl.alloc((G, 1), "fp32", name=n)
    st.scratch["P"] = tl.alloc((G, T), st.p_dtype, name="P")


def _merge_opt3(tl: TLContext, st: DecodeState, Sj: Handle, Vj: Handle) -> None:
    # The eight micro-ops of softmax_merge, each its own command (DESIGN.md §3).
    m, l, O = st.m, st.l, st.O
    m_loc, m_new, corr, l_loc, P = (st.scratch[n] for n in ("m_loc", "m_new", "corr", "l_loc", "P"))
    tl.composite(op="math", math_op="rmax", a=Sj, out=m_loc, label="rmax")
    tl.composite(op="math", math_op="max_elem", a=m, b=m_loc, out=m_new, label="max_elem")
    tl.composite(op="math", math_op="exp_diff", a=m, b=m_new, out=corr, label="exp_diff corr")
    tl.composite(op="math", math_op="exp_diff", a=Sj, b=m_new, out=P, label="exp_diff P")
    tl.composite(op="math", math_op="rsum", a=P, out=l_loc, label="rsum")
    tl.composite(op="math", math_op="fma", a=l, b=corr, c=l_loc, out=l, label="fma l")
    tl.composite(op="math", math_op="mul_bcast", a=O, b=corr, out=O, label="mul_bcast O")
    tl.composite(op="math", math_op="copy", a=m_new, out=m, label="copy m")
    tl.composite(op="gemm", a=P, b=Vj, out=O, epilogue=[{"op": "add", "other": O}], label="pv")


def _merge_a1(tl: TLContext, st: DecodeState, Sj: Handle, Vj: Handle) -> None:
    merged = tl.composite(op="math", prologue=[{"op": softmax_merge_recipe(st.p_dtype), "s": Sj, "m": st.m, "l": st.l, "O": st.O}],
                          label="merge")
    tl.composite(op="gemm", a=merged.primary_out, b=Vj, out=st.O, epilogue=[{"op": "add", "other": st.O}],
                 label="pv")


#: Every decode variant by name (DESIGN.md §7, §10, §13): the one registry. Registering a variant here
#: makes ``decode.run`` and everything above it see it (``decode.VARIANTS`` is this object).
VARIANTS: dict[str, Variant] = {v.name: v for v in (
    Variant("opt2", _merge_opt2, "the softmax merge fused as a recipe prologue of pv"),
    Variant("opt3", _merge_opt3, "the merge as eight MATH composites, then pv", setup=_setup_opt3),
    Variant("a1", _merge_a1, "the merge recipe as a MATH-only composite, then pv (ADR-0065 A1)"),
)}
#: What compare, sweep, the CLI and the panel run unless told otherwise.
DEFAULT_VARIANTS = ("opt2", "opt3")


def commands_per_tile(variant: str) -> int:
    """How many commands one tile of ``variant`` emits: the body of its tile loop, as traced (two tiles of a
    tiny decode in timing mode; nothing is declared by hand).

    Raises:
        ValidationError: an unknown variant.
    """
    from ..sim import Launch, Simulator
    from ..triton_emu.binding import signature

    sim = Simulator(mode="timing")
    G, d, T = 1, 16, 16
    handles = (sim.hbm("q", shape=(G, d), dtype="bf16"), sim.hbm("K", shape=(3 * T, d), dtype="bf16"),
               sim.hbm("V", shape=(3 * T, d), dtype="bf16"), sim.hbm("out", shape=(G, d), dtype="fp32"))
    launch = Launch(gqa_decode, *handles, variant=variant, tile=T)
    traced, _, _ = sim._trace(launch, signature(gqa_decode, launch.args, launch.kwargs)[1], None, 0)
    return traced.trace.loops[0].cmds_per_iter


def gqa_decode(tl: TLContext, q: Handle, k: Handle, v: Handle, out: Handle, *, variant: str, tile: int) -> None:
    """Emit the decode kernel. ``out`` (G, d) in HBM receives softmax(scale·QKᵀ)·V, rounded to its dtype.

    K and V may be in any dtype the PE holds (fp8 among them, DESIGN.md §17); S, m, l and O are fp32, P is in
    the topology's ``p_dtype``.

    Raises:
        ValidationError: an unknown variant, mismatched shapes, or a kv length
            that is not a multiple of ``tile``.
    """
    st = decode_state(tl, q, k, v, variant=variant, tile=tile)
    O, l = st.O, st.l
    G, d = O.shape
    # O is rounded once, at the store (DESIGN.md §17): the normalisation writes it in out's dtype
    res = O if out.dtype == O.dtype else tl.alloc((G, d), out.dtype, name="O_out")
    tl.composite(op="math", math_op="div_bcast", a=O, b=l, out=res, label="div_bcast O")
    tl.store(res, out, label="dma_store O")


def decode_state(tl: TLContext, q: Handle, k: Handle, v: Handle, *, variant: str, tile: int) -> DecodeState:
    """Emit §7's decode up to (not including) the final ``div_bcast``: the loads, the fills and every tile's
    Q·Kᵀ and merge, in §7's program order. Returns the :class:`DecodeState` whose ``m``, ``l`` and ``O`` (TCM,
    fp32) hold the state after the last tile (``O`` unnormalised). :func:`gqa_decode` and
    :func:`kbwork.kernels.split.gqa_decode_partial` share it.

    Raises:
        ValidationError: an unknown variant, mismatched shapes, or a kv length that is not a multiple of
            ``tile``.
    """
    spec = VARIANTS.get(variant) if isinstance(variant, str) else None
    if spec is None:
        raise ValidationError(f"decode variant {variant!r} is unknown; use one of {', '.join(VARIANTS)}.")
    G, d = q.shape
    N = k.shape[0]
    if k.shape != (N, d) or v.shape != (N, d):
        raise ValidationError(f"decode: K {k.shape} and V {v.shape} must both be (kv_len, head_dim={d}).")
    if not isinstance(tile, int) or tile <= 0 or N % tile:
        raise ValidationError(f"decode: kv_len {N} is not a multiple of tile {tile}; pick a kv_len that is "
                              f"(ragged last tiles are not supported).")
    n_tiles = N // tile
    scale = 1.0 / math.sqrt(d)

    Q = tl.load(q, name="Q", label="dma_load Q")
    m = tl.full((G, 1), -math.inf, "fp32", name="m", label="fill m")
    l = tl.full((G, 1), 0.0, "fp32", name="l", label="fill l")
    O = tl.full((G, d), 0.0, "fp32", name="O", label="fill O")
    # the one place the decode kernel reads the topology: the dtype P is written in (DESIGN.md §17)
    st = DecodeState(m, l, O, tl.ring(2, (G, tile), "fp32", name="S"), p_dtype=tl.topo.p_dtype)
    if spec.setup is not None:  # kernel-scope scratch, allocated once
        spec.setup(tl, st)

    def qk(j) -> None:
        with tl.iteration(j):
            tl.composite(op="gemm", a=Q, b=k[j * tile:(j + 1) * tile], trans_b=True, out=st.S[j],
                         epilogue=[{"op": "scale", "factor": scale}], label="qk")

    def merge(j) -> None:
        with tl.iteration(j):
            spec.merge(tl, st, st.S[j], v[j * tile:(j + 1) * tile])

    qk(0)
    for j in tl.range(n_tiles - 1):  # the body is traced once; j is symbolic
        qk(j + 1)
        merge(j)
    merge(n_tiles - 1)               # the last tile, peeled: it has no next tile
    return st
