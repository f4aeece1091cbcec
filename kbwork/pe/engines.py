"""Engine models: how long each stage takes, and (data mode) what it does.

Latency models read only the topology and a stage's extents (DESIGN.md §1).
:class:`DataExecutor` applies a stage's effect to the numpy-backed memories
when the stage ends; the timeline calls it in (end, seq) order so a
scheduling bug shows up as a wrong number.
"""

from __future__ import annotations

import math

import numpy as np

from ..config import Topology
from ..memory import DTYPES, Handle, Memory
from .ops import OPS, apply_math


class Latency:
    """Cycle costs of every stage kind for one topology (DESIGN.md §1)."""

    def __init__(self, topo: Topology):
        self.topo = topo
        t = topo
        self._dma_base, self._dma_bw = t.dma_base_cycles, t.dma_bytes_per_cycle
        self._fetch_bw = t.fetch_bytes_per_cycle
        self._gemm_base, self._mr, self._mc = t.gemm_base_cycles, t.mac_rows, t.mac_cols
        self._math_base, self._math_bw = t.math_base_cycles, t.math_elements_per_cycle
        self._cost_exp, self._cost_other = t.math_cost_exp, t.math_cost_other
        self._math_cache: dict[tuple[str, int, int], int] = {}

    def __repr__(self) -> str:
        return f"Latency({self.topo.name})"

    def plan(self, n_ops: int) -> int:
        """PLAN: ``plan_base + plan_per_op x len(cmd.ops)``."""
        return self.topo.plan_base_cycles + self.topo.plan_cycles_per_op * n_ops

    def dma(self, nbytes: int) -> int:
        """One DMA transfer: ``200 + ceil(bytes / 64)``."""
        return self._dma_base + -(-nbytes // self._dma_bw)

    def fetch(self, nbytes: int) -> int:
        """FETCH of a- and b-tiles from TCM: ``ceil(bytes / 128)``."""
        return -(-nbytes // self._fetch_bw)

    def gemm(self, tm: int, tn: int, tk: int) -> int:
        """One GEMM tile on the MAC array: ``16 + ceil(tm/32) x ceil(tn/32) x tk``."""
        return self._gemm_base + (-(-tm // self._mr)) * (-(-tn // self._mc)) * tk

    def math(self, kind: str, n_elements: int, row_len: int = 1) -> int:
        """One MATH op: ``8 + ceil(n / 64) x cost(kind)`` (+ ``ceil(log2(row_len))`` for reductions)."""
        key = (kind, n_elements, row_len)
        cycles = self._math_cache.get(key)
        if cycles is None:
            cycles = self._math_cache[key] = self._math(kind, n_elements, row_len)
        return cycles

    def _math(self, kind: str, n_elements: int, row_len: int) -> int:
        info = OPS[kind]
        cost = self._cost_exp if info.exp_cost else self._cost_other
        cycles = self._math_base + (-(-n_elements // self._math_bw)) * cost
        if info.reduction and row_len > 1:
            cycles += math.ceil(math.log2(row_len))
        return cycles


# --- data mode --------------------------------------------------------------------------
# Effect tuples (built by tiling, applied here); the first item names the action:
#   ("copy_block", src, r0, r1, c0, c1, dst)   DMA: block of src -> whole dst (same dtype)
#   ("fetch", key, a_src, b_src, trans_b)      FETCH: a/b blocks -> GEMM registers
#       a_src/b_src = (handle, r0, r1, c0, c1)
#   ("gemm", key, acc_key, first)              acc (+)= a @ b
#   ("acc", kind, acc_key, other_block, extra) accumulator epilogue
#   ("store_acc", acc_key, out, r0, r1, c0, c1) write the accumulator (rounded) into out
#   ("math", kind, operands, extra, out)       MATH op on memory; operands name -> Handle
#   ("math_acc", kind, target, operands, extra) accumulator op on a whole tensor in memory
#   ("multi", effect, effect, ...)             several effects, in order


class DataExecutor:
    """Applies stage effects to the memories in float32, rounding on every write."""

    def __init__(self, memory: Memory):
        self.mem = memory
        self.regs: dict[object, tuple[np.ndarray, np.ndarray]] = {}
        self.acc: dict[object, np.ndarray] = {}

    def __repr__(self) -> str:
        return f"DataExecutor({len(self.acc)} live accumulators)"

    @staticmethod
    def quiet() -> np.errstate:
        """numpy's floating-point warnings off, for the span of a run (see ``ops.apply_math``)."""
        return np.errstate(invalid="ignore", over="ignore", divide="ignore")

    def _block(self, h: Handle, r0: int, r1: int, c0: int, c1: int) -> np.ndarray:
        v = self.mem.arena(h).view(h)
        return v[r0:r1, c0:c1] if v.ndim == 2 else v[c0:c1]

    def _f32(self, h: Handle) -> np.ndarray:
        return self.mem.arena(h).read_f32(h)  # read-only: every op below returns a new array

    def apply(self, effect: tuple) -> None:
        op = effect[0]
        if op == "multi":
            for e in effect[1:]:
                self.apply(e)
        elif op == "copy_block":
            _, src, r0, r1, c0, c1, dst = effect
            self.mem.arena(dst).view(dst)[...] = self._block(src, r0, r1, c0, c1).reshape(dst.shape)
        elif op == "fetch":
            _, key, a_src, b_src, trans_b = effect
            a = self._block(*a_src).astype(np.float32)
            b = self._block(*b_src).astype(np.float32)
            self.regs[key] = (a, b.T if trans_b else b)
        elif op == "gemm":
            _, key, acc_key, first = effect
            a, b = self.regs.pop(key)
            prod = a @ b
            self.acc[acc_key] = prod if first else self.acc[acc_key] + prod
        elif op == "acc":
            _, kind, acc_key, other, extra = effect
            args = {"other": np.asarray(self._block(*other), dtype=np.float32)} if other is not None else {}
            self.acc[acc_key] = apply_math(kind, args, extra, self.acc[acc_key])
        elif op == "store_acc":
            _, acc_key, out, r0, r1, c0, c1 = effect
            block = self._block(out, r0, r1, c0, c1)
            block[...] = self.acc.pop(acc_key).astype(DTYPES[out.dtype])
        elif op == "math":
            _, kind, operands, extra, out = effect
            args = {name: self._f32(h) for name, h in operands.items()}
            self.mem.arena(out).write(out, apply_math(kind, args, extra))
        elif op == "math_acc":
            _, kind, target, operands, extra = effect
            args = {name: self._f32(h) for name, h in operands.items()}
            self.mem.arena(target).write(target, apply_math(kind, args, extra, self._f32(target)))
        else:  # pragma: no cover - a tiling bug, not user input
            raise AssertionError(f"unknown effect {op!r}")
