"""Caches that outlive one run of a kernel (tl_context): lowered MATH heads and recipe expansions.

A cache hit must give exactly what a fresh lowering would: the same ops on equal handles, and
recipe scratch at the addresses a fresh allocation would pick. A changed TCM state must miss.
"""

from __future__ import annotations

import math

import pytest

import kbwork
from kbwork import decode
from kbwork.memory import Memory
from kbwork.triton_emu import TLContext
from kbwork.triton_emu import tl_context


def _tl():
    topo = kbwork.load_topology()
    return TLContext(topo, Memory(topo.tcm_bytes, backed=False))


def _merge(tl, extra_first: bool = False):
    """A pv_merge-like composite on fresh state; optionally allocate something first."""
    if extra_first:
        tl.alloc((8, 64), "fp32", name="pad")
    V = tl.mem.hbm.alloc("V", (256, 128), "bf16")
    S = tl.alloc((8, 128), "fp32", name="S")
    m = tl.full((8, 1), -math.inf, "fp32", name="m")
    l = tl.full((8, 1), 0.0, "fp32", name="l")
    O = tl.full((8, 128), 0.0, "fp32", name="O")
    tl.composite(prologue=[{"op": "softmax_merge", "s": S, "m": m, "l": l, "O": O}],
                 op="gemm", b=V[0:128], out=O, epilogue=[{"op": "add", "other": O}], label="pv_merge")
    return tl.commands[-1]


def test_a_second_run_reuses_math_heads_on_equal_handles():
    a, b = _tl(), _tl()
    fa, fb = _merge(a).ops, _merge(b).ops
    fill_a, fill_b = a.commands[0].ops, b.commands[0].ops
    assert fill_a is fill_b                      # the same validated tuple, shared across runs
    assert fa == fb                              # and the merge lowers to equal ops


def test_math_heads_on_different_handles_are_not_shared():
    a, b = _tl(), _tl()
    _merge(a)
    _merge(b, extra_first=True)                  # every buffer moves
    assert a.commands[0].ops is not b.commands[0].ops
    assert a.commands[0].ops[0].out != b.commands[0].ops[0].out


def test_recipe_expansion_replays_scratch_at_the_same_addresses():
    a = _tl()
    ca = _merge(a)
    b = _tl()
    cb = _merge(b)
    assert cb.scratch == ca.scratch and cb.ops == ca.ops and cb.rw_handles == ca.rw_handles
    # the replayed scratch is really allocated: in the TCM's live list, named, and what comes next
    # is placed after it, exactly as after a fresh expansion
    for h in cb.scratch:
        assert h in b.mem.tcm.live and b.names[h.name] == h
    assert b.mem.tcm.top == a.mem.tcm.top
    assert b.alloc((8, 8), name="after") == a.alloc((8, 8), name="after")


def test_recipe_expansion_misses_when_the_tcm_differs():
    a = _tl()
    ca = _merge(a)
    b = _tl()
    cb = _merge(b, extra_first=True)
    pad = b.names["pad"]
    assert cb.scratch != ca.scratch
    assert all(not h.overlaps(pad) for h in cb.scratch)
    assert [h.name for h in cb.scratch] == [h.name for h in ca.scratch]


def test_adopt_refuses_handles_that_are_not_next():
    tcm = Memory(1 << 16, backed=False).tcm
    h = tcm.alloc("x", (16,), "fp32")
    fresh = Memory(1 << 16, backed=False).tcm
    fresh.alloc("y", (4,), "fp32")
    assert not fresh.adopt([h])                  # its address is taken
    empty = Memory(1 << 16, backed=False).tcm
    assert empty.adopt([h]) and empty.top == h.end and empty.live == [h]
    small = Memory(32, backed=False).tcm
    assert not small.adopt([h]) and small.top == 0


@pytest.mark.parametrize("variant", ["opt2", "opt3"])
def test_repeated_runs_match_a_run_with_cold_caches(variant):
    warm = [decode.run(variant, kv_len=512, mode="data").to_csv() for _ in range(2)]
    tl_context._MATH_HEADS.clear()
    tl_context._EXPANSIONS.clear()
    cold = decode.run(variant, kv_len=512, mode="data")
    assert warm[0] == warm[1] == cold.to_csv()
    again = decode.run(variant, kv_len=512, mode="data")
    assert (again.O == cold.O).all() and (again.m == cold.m).all() and (again.l == cold.l).all()


def test_cross_run_caches_are_bounded():
    tl_context._MATH_HEADS.clear()
    for i in range(tl_context._MAX_ENTRIES + 10):
        tl_context._remember(tl_context._MATH_HEADS, (i,), ())
    assert len(tl_context._MATH_HEADS) <= tl_context._MAX_ENTRIES


def test_a_repeated_gemm_call_with_a_differently_shaped_b_is_validated_again():
    tl = _tl()
    V = tl.mem.hbm.alloc("V", (256, 128), "bf16")
    Q = tl.alloc((8, 128), "bf16", name="Q")
    S = tl.alloc((8, 128), "fp32", name="S")
    for j in range(3):  # same call, new slice: the op tuple is reused, not rebuilt
        tl.composite(op="gemm", a=Q, b=V[j * 64:j * 64 + 128], trans_b=True, out=S,
                     epilogue=[{"op": "scale", "factor": 0.5}])
    ops = [c.ops for c in tl.commands]
    assert ops[1][1] is ops[0][1] and ops[1][0].signature is ops[0][0].signature
    assert ops[2][0].operands["b"].name == "V[128:256]" and ops[2][0].read_spans[1] == V[128:256].span
    with pytest.raises(kbwork.ValidationError, match="shape mismatch"):
        tl.composite(op="gemm", a=Q, b=V[0:64], trans_b=True, out=S, epilogue=[{"op": "scale", "factor": 0.5}])


def test_a_second_recipe_call_sharing_scratch_is_replayed_too():
    # decode alternates S0/S1 as the merge's s: the second expansion reuses the first's scratch
    def kernel(tl):
        V = tl.mem.hbm.alloc("V", (256, 128), "bf16")
        S = [tl.alloc((8, 128), "fp32", name=f"S{i}") for i in range(2)]
        m = tl.full((8, 1), -math.inf, "fp32", name="m")
        l = tl.full((8, 1), 0.0, "fp32", name="l")
        O = tl.full((8, 128), 0.0, "fp32", name="O")
        for j in range(2):
            tl.composite(prologue=[{"op": "softmax_merge", "s": S[j], "m": m, "l": l, "O": O}],
                         op="gemm", b=V[j * 128:(j + 1) * 128], out=O, epilogue=[{"op": "add", "other": O}])
        return tl
    a, b = kernel(_tl()), kernel(_tl())
    ca, cb = a.commands[-2:], b.commands[-2:]
    assert ca[0].scratch == ca[1].scratch == cb[0].scratch == cb[1].scratch
    assert all(x.ops[i] is y.ops[i] for x, y in zip(ca, cb) for i in range(8))  # shared, not re-expanded
    assert b.mem.tcm.top == a.mem.tcm.top and len(b._recipe_scratch) == 1
