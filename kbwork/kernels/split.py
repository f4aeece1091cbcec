"""Split-KV decode: a partial decode over one chunk of the keys, and the merge of the chunks' states
(DESIGN.md §16).

:func:`gqa_decode_partial` is §7's decode kernel (every variant) without the
final ``div_bcast``: it stores its softmax state — ``m`` and ``l`` (G, 1)
fp32, the unnormalised ``O`` (G, d) fp32 — instead of ``O / l``.
:func:`gqa_merge` loads the first part's state as the running state, merges
every further part into it with the ``state_merge`` recipe (the second
stateful recipe, in a MATH-only composite), then divides ``O`` by ``l`` and
stores ``out``. Merging one part is the unsplit decode bit for bit (its
``div_bcast`` is the decode's); merging several is within §8's tolerance of
the float64 reference (the sums run in another order).
"""

from __future__ import annotations

from typing import Sequence

from ..errors import ValidationError
from ..memory import Handle
from ..triton_emu.tl_context import TLContext
from .gqa_decode import decode_state

#: The dtype of a partial state (m, l and O): what the decode keeps its state in.
STATE_DTYPE = "fp32"


def _check_state(where: str, G: int, d: int, m: Handle, l: Handle, O: Handle) -> None:
    """Refuse state tensors that are not m, l (G, 1) and O (G, d), all fp32."""
    for name, h, shape in (("m", m, (G, 1)), ("l", l, (G, 1)), ("O", O, (G, d))):
        if tuple(h.shape) != shape or h.dtype != STATE_DTYPE:
            raise ValidationError(f"{where}: the state's {name} must be {shape} {STATE_DTYPE}, got {tuple(h.shape)} "
                                  f"{h.dtype}; allocate it as sim.hbm(name, shape={shape}, dtype='fp32').")


def gqa_decode_partial(tl: TLContext, q: Handle, k: Handle, v: Handle, m_out: Handle, l_out: Handle,
                       o_out: Handle, *, variant: str = "opt2", tile: int = 128) -> None:
    """Emit the decode of one chunk of the keys, storing its state: ``m_out`` and ``l_out`` (G, 1) and the
    unnormalised ``o_out`` (G, d), all fp32 in HBM (in that order, after the last tile's merge).

    K and V may be in any dtype the PE holds (fp8 among them); P is in the topology's ``p_dtype``, as in
    :func:`~kbwork.kernels.gqa_decode.gqa_decode`, whose program it is up to the final ``div_bcast``.

    Raises:
        ValidationError: an unknown variant, mismatched shapes, a chunk length that is not a multiple of
            ``tile``, or state tensors that are not (G, 1), (G, 1), (G, d) fp32.
    """
    G, d = q.shape
    _check_state("gqa_decode_partial", G, d, m_out, l_out, o_out)
    st = decode_state(tl, q, k, v, variant=variant, tile=tile)
    tl.store(st.m, m_out, label="dma_store m")
    tl.store(st.l, l_out, label="dma_store l")
    tl.store(st.O, o_out, label="dma_store O")


def gqa_merge(tl: TLContext, parts: Sequence[tuple[Handle, Handle, Handle]], out: Handle) -> None:
    """Emit the merge of ``parts`` (one ``(m, l, O)`` triple of HBM state tensors per chunk, in split order,
    at least one) into ``out`` (G, d): the first part loaded as the running state, each further one merged by
    ``state_merge``, then ``O / l`` written in ``out``'s dtype and stored.

    Raises:
        ValidationError: ``parts`` empty or not a sequence of triples, or a state whose shapes differ from
            the first's or from ``out``'s (G, d), or whose dtype is not fp32.
    """
    where = "gqa_merge"
    if isinstance(parts, (str, bytes)) or not isinstance(parts, Sequence) or not parts:
        raise ValidationError(f"{where}: parts must be a non-empty list of (m, l, O) HBM handle triples, got "
                              f"{parts!r}.")
    for i, p in enumerate(parts):
        if not isinstance(p, (tuple, list)) or len(p) != 3:
            raise ValidationError(f"{where}: part {i} must be an (m, l, O) triple of HBM handles, got {p!r}.")
    G, d = tuple(out.shape)
    for i, (m_h, l_h, o_h) in enumerate(parts):
        _check_state(f"{where}: part {i}", G, d, m_h, l_h, o_h)
    m_h, l_h, o_h = parts[0]
    m = tl.load(m_h, name="m", label="dma_load m")
    l = tl.load(l_h, name="l", label="dma_load l")
    O = tl.load(o_h, name="O", label="dma_load O")
    for i, (mb_h, lb_h, ob_h) in enumerate(parts[1:], start=1):
        # each part's state lives only until it is merged: the TCM a merge needs does not grow with k
        with tl.scratch_scope(), tl.iteration(i):
            mb = tl.load(mb_h, name="m_b", label="dma_load m_b")
            lb = tl.load(lb_h, name="l_b", label="dma_load l_b")
            ob = tl.load(ob_h, name="O_b", label="dma_load O_b")
            tl.composite(op="math", prologue=[{"op": "state_merge", "m_b": mb, "l_b": lb, "O_b": ob, "m": m, "l": l,
                                               "O": O}], label="state_merge")
    res = O if out.dtype == O.dtype else tl.alloc((G, d), out.dtype, name="O_out")
    tl.composite(op="math", math_op="div_bcast", a=O, b=l, out=res, label="div_bcast O")
    tl.store(res, out, label="dma_store O")
