"""GQA decode attention for one KV head: opt3 (10 commands per tile) and opt2 (2).

Q is (G, d), K and V are (N, d) in HBM, processed in tiles of T rows. Both
variants are software pipelined (``qk(j+1)`` is issued before the merge of
tile j) and share the program order of DESIGN.md §7, so the comparison is
fair:

``tl.load(q)``; ``tl.full`` m, l, O; ``qk(0)``; for each tile j: ``qk(j+1)``
if there is a next tile, then the merge of tile j (opt2: one ``pv_merge``
composite; opt3: eight MATH micro-ops, then ``pv``); then ``div_bcast(O, l)``
and ``tl.store(O, out)``.
"""

from __future__ import annotations

import math

from ..errors import ValidationError
from ..memory import Handle
from ..triton_emu.tl_context import TLContext

VARIANTS = ("opt2", "opt3")

def gqa_decode(tl: TLContext, q: Handle, k: Handle, v: Handle, out: Handle, *, variant: str, tile: int) -> None:
    """Emit the decode kernel. ``out`` (G, d) fp32 in HBM receives softmax(scale·QKᵀ)·V.

    Raises:
        ValidationError: an unknown variant, mismatched shapes, or a kv length
            that is not a multiple of ``tile``.
    """
    if variant not in VARIANTS:
        raise ValidationError(f"decode variant {variant!r} is unknown; use one of {', '.join(VARIANTS)}.")
    G, d = q.shape
    N = k.shape[0]
    if k.shape != (N, d) or v.shape != (N, d):
        raise ValidationError(f"decode: K {k.shape} and V {v.shape} must both be (kv_len, head_dim={d}).")
    if tile <= 0 or N % tile:
        raise ValidationError(f"decode: kv_len {N} is not a multiple of tile {tile}; pick a kv_len that is "
                              f"(ragged last tiles are not supported).")
    n_tiles = N // tile
    scale = 1.0 / math.sqrt(d)

    Q = tl.load(q, name="Q", label="dma_load Q")
    m = tl.full((G, 1), -math.inf, "fp32", name="m", label="fill m")
    l = tl.full((G, 1), 0.0, "fp32", name="l", label="fill l")
    O = tl.full((G, d), 0.0, "fp32", name="O", label="fill O")
    S = (tl.alloc((G, tile), "fp32", name="S0"), tl.alloc((G, tile), "fp32", name="S1"))
    if variant == "opt3":  # the merge intermediates, kernel-scope, allocated once
        m_loc, m_new, corr, l_loc = (tl.alloc((G, 1), "fp32", name=n) for n in ("m_loc", "m_new", "corr", "l_loc"))
        P = tl.alloc((G, tile), "fp32", name="P")

    def qk(j: int) -> None:
        with tl.iteration(j):
            tl.composite(op="gemm", a=Q, b=k[j * tile:(j + 1) * tile], trans_b=True, out=S[j % 2],
                         epilogue=[{"op": "scale", "factor": scale}], label="qk")

    qk(0)
    for j in range(n_tiles):
        if j + 1 < n_tiles:
            qk(j + 1)
        Vj = v[j * tile:(j + 1) * tile]
        with tl.iteration(j):
            if variant == "opt2":
                tl.composite(prologue=[{"op": "softmax_merge", "s": S[j % 2], "m": m, "l": l, "O": O}],
                             op="gemm", b=Vj, out=O, epilogue=[{"op": "add", "other": O}], label="pv_merge")
            else:
                Sj = S[j % 2]
                # The eight micro-ops of softmax_merge, each its own command (DESIGN.md §3).
                tl.composite(op="math", math_op="rmax", a=Sj, out=m_loc, label="rmax")
                tl.composite(op="math", math_op="max_elem", a=m, b=m_loc, out=m_new, label="max_elem")
                tl.composite(op="math", math_op="exp_diff", a=m, b=m_new, out=corr, label="exp_diff corr")
                tl.composite(op="math", math_op="exp_diff", a=Sj, b=m_new, out=P, label="exp_diff P")
                tl.composite(op="math", math_op="rsum", a=P, out=l_loc, label="rsum")
                tl.composite(op="math", math_op="fma", a=l, b=corr, c=l_loc, out=l, label="fma l")
                tl.composite(op="math", math_op="mul_bcast", a=O, b=corr, out=O, label="mul_bcast O")
                tl.composite(op="math", math_op="copy", a=m_new, out=m, label="copy m")
                tl.composite(op="gemm", a=P, b=Vj, out=O, epilogue=[{"op": "add", "other": O}],
                             label="pv")
    tl.composite(op="math", math_op="div_bcast", a=O, b=l, out=O, label="div_bcast O")
    tl.store(O, out, label="dma_store O")
