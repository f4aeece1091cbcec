"""A run's energy: counts from the op_log times a per-event energy (DESIGN §18).

:func:`energy` is one row per (PE, kind), ``pe, kind, count, unit, pj``, with the kinds of
:data:`KINDS`:

============  ==============  ==========================================================================
kind          unit            count
============  ==============  ==========================================================================
``hbm``       bytes           bytes of every DMA stage (``pj`` = 8 × bytes × ``hbm_pj_per_bit``)
``tcm``       bytes           bytes of every DMA stage (each moves its bytes to or from TCM) + of every FETCH
``mac``       MACs            a GEMM's real MACs: m·n·k of its logical shapes (Σ of its tiles' tm·tn·tk)
``math``      element-costs   per MATH stage ``n × cost`` + the reduction term ``ceil(log2(row_len))``
``dispatch``  cycles          PE_CPU busy cycles (the DISPATCH stages' durations)
``idle``      PE-cycles       every PE of the device (``pes``) for the run's cycles (``pj`` = count × mW / GHz)
============  ==============  ==========================================================================

The energy keys are topology keys (``hbm_pj_per_bit`` ...): they price the counts and never change a cycle.
Counts are exact integers and do not depend on how the timeline was computed, so the steady path and the
full path give identical counts. The byte counts and the dispatch cycles are read off the run's stage
arrays (the op_log's ``bytes`` and DISPATCH durations, without building the op_log); the MACs and MATH
element-costs, which the op_log does not carry, are read off each command's ops as the planner sizes their
stages (a GEMM's m·n·k; a MATH stage's element count, :mod:`kbwork.pe.tiling`), once per distinct command (a
loop's body once, times its iterations). A device PE replicated from another (``run.reductions.replicated_from``) has that PE's counts.
Counts are computed once per run and kept beside it; :func:`energy` with other prices (``hbm_pj_per_bit=0.55``)
re-prices them without re-counting.

>>> from kbwork import analysis, decode
>>> r = decode.run("opt2", kv_len=4096, mode="timing")
>>> analysis.energy(r).groupby("kind")["pj"].sum()
>>> analysis.energy(r, hbm_pj_per_bit=0.55)["pj"].sum()   # a PE in the bank
"""

from __future__ import annotations

import difflib
import weakref
from typing import Any

import numpy as np
import pandas as pd

from .. import keys as _keys
from ..config import Topology
from ..errors import ConfigError
from ..pe.commands import DmaCmd, Scope
from ..pe.ops import OPS
from ..pe.program import Plain
from ..pe.stages import StageKind
from ..pe.templates import signature_key
from ..pe.tiling import _n_elements, _row_len
from .inputs import _resolve_run_only

#: The kinds of :func:`energy`'s rows, in order.
KINDS = ("hbm", "tcm", "mac", "math", "dispatch", "idle")
#: The unit of each kind's ``count``.
UNITS = {"hbm": "bytes", "tcm": "bytes", "mac": "MACs", "math": "element-costs", "dispatch": "cycles",
         "idle": "PE-cycles"}
#: The topology key that prices each kind.
PRICE_KEYS = {"hbm": "hbm_pj_per_bit", "tcm": "tcm_pj_per_byte", "mac": "mac_pj", "math": "math_pj_per_element",
              "dispatch": "dispatch_pj_per_cycle", "idle": "pe_idle_mw"}
#: The energy keys (topology keys), in table order.
ENERGY_KEYS = tuple(PRICE_KEYS.values())
COLUMNS = ["pe", "kind", "count", "unit", "pj"]
_KIND_DTYPE = pd.CategoricalDtype(list(KINDS))
_UNIT_NAMES = np.array([UNITS[k] for k in KINDS], dtype=object)
#: The kinds a PE's work gives (every kind but ``idle``, which the device's powered time gives).
WORK_KINDS = KINDS[:-1]

_DMA_READ, _FETCH, _DMA_WRITE = int(StageKind.DMA_READ), int(StageKind.FETCH), int(StageKind.DMA_WRITE)
# a run's counts, kept as long as the run lives (re-pricing never re-counts)
_COUNTS: "weakref.WeakKeyDictionary[Any, tuple[np.ndarray, np.ndarray]]" = weakref.WeakKeyDictionary()


def _math_count(kind: str, n_elements: int, row_len: int, cost_exp: int, cost_other: int) -> int:
    """One MATH stage's element-costs: ``n × cost`` + ``ceil(log2(row_len))`` for a row reduction (the terms of
    its timing, DESIGN §1)."""
    info = OPS[kind]
    count = n_elements * (cost_exp if info.exp_cost else cost_other)
    if info.reduction and row_len > 1:
        count += (row_len - 1).bit_length()  # ceil(log2(row_len)), as the timing's reduction term
    return count


def _chain(ops: Any, target: Any, ce: int, co: int) -> int:
    """Element-costs of ops run once, in order, each on its largest operand or output (an accumulator op on the
    nearest preceding output, ``target`` before the first), as the planner sizes them."""
    total = 0
    for op in ops:
        info = OPS[op.kind]
        total += _math_count(op.kind, _n_elements(op, target if info.accumulator else None), _row_len(op), ce, co)
        if op.out is not None:
            target = op.out
    return total


def _command_counts(cmd: Any, topo: Topology, memo: dict) -> tuple[int, int]:
    """``(MACs, MATH element-costs)`` of one command (0, 0 for a DMA command), as the planner lays out its
    stages (:mod:`kbwork.pe.tiling`): a GEMM's tiles cover m·n·k exactly (ragged edges, not padded); an op on
    the accumulator runs on every tile (``tm·tn``, Σ = m·n), after every k-tile when its scope is ``k_tile``;
    the ops before the GEMM and after it with scope ``kernel`` run once. Commands of one signature count alike."""
    if isinstance(cmd, DmaCmd):
        return 0, 0
    key = signature_key(cmd)
    got = memo.get(key) if key is not None else None
    if got is not None:
        return got
    ce, co = topo.math_cost_exp, topo.math_cost_other
    ops = cmd.ops
    g = next((i for i, op in enumerate(ops) if op.kind == "gemm"), None)
    if g is None:
        got = (0, _chain(ops, None, ce, co))
    else:
        gemm = ops[g]
        m, k, n = gemm.extra["m"], gemm.extra["k"], gemm.extra["n"]
        k_tiles = -(-k // topo.tile_k)
        elements = _chain(ops[:g], None, ce, co)
        after = ops[g + 1:]
        for op in after:
            if op.scope is not Scope.KERNEL:  # on the accumulator, per output tile (and per k-tile)
                per = m * n * (k_tiles if op.scope is Scope.K_TILE else 1)
                elements += _math_count(op.kind, per, 1, ce, co)
        elements += _chain([op for op in after if op.scope is Scope.KERNEL], gemm.out, ce, co)
        got = (m * n * k, elements)
    if key is not None:
        memo[key] = got
    return got


def _ops_counts(run: Any, topo: Topology) -> tuple[int, int]:
    """``(MACs, MATH element-costs)`` of every command one PE's run executed."""
    memo: dict = {}
    macs = elements = 0
    sources = getattr(run, "_source", None)
    if sources is None:  # a run not made by a simulator's launch list: its commands, one by one
        for cmd in run.commands:
            m, e = _command_counts(cmd, topo, memo)
            macs, elements = macs + m, elements + e
        return macs, elements
    for prog in sources:
        for seg in prog.trace.segments:
            if isinstance(seg, Plain):
                for cmd in seg.commands:
                    m, e = _command_counts(cmd, topo, memo)
                    macs, elements = macs + m, elements + e
            else:  # a tl.range loop: its body traced once, every iteration of the same shapes (DESIGN §13)
                for body in seg.body:
                    m, e = _command_counts(body, topo, memo)
                    macs, elements = macs + m * seg.iterations, elements + e * seg.iterations
    return macs, elements


def _pe_counts(run: Any, topo: Topology) -> dict[str, int]:
    """One PE's counts of every work kind."""
    table = run.program.table
    kind = np.asarray(table.kind, dtype=np.int8)
    nbytes = np.asarray(table.nbytes, dtype=np.int64)
    dma = int(nbytes[(kind == _DMA_READ) | (kind == _DMA_WRITE)].sum())
    fetch = int(nbytes[kind == _FETCH].sum())
    macs, elements = _ops_counts(run, topo)
    return {"hbm": dma, "tcm": dma + fetch, "mac": macs, "math": elements,
            "dispatch": int(np.asarray(run.dispatch_cycles(), dtype=np.int64).sum())}


def _count_arrays(run: Any) -> tuple[np.ndarray, np.ndarray]:
    """``(pe, count)`` of every (PE, kind) row, kinds in :data:`KINDS` order per PE; kept beside the run."""
    got = _COUNTS.get(run)
    if got is None:
        topo = run.topology
        per_pe: dict[int, dict[str, int]] = {}
        subs = getattr(run, "runs", None)
        if subs is None:
            per_pe[max(run.pe_index, 0)] = _pe_counts(run, topo)
        else:
            copied = dict(getattr(run.reductions, "replicated_from", {}) or {})
            for p, r in subs.items():
                if p not in copied:
                    per_pe[p] = _pe_counts(r, topo)
            for p, src in copied.items():
                if p in subs:
                    per_pe[p] = per_pe[src] if src in per_pe else _pe_counts(subs[p], topo)
        pes = max(int(topo.pes), max(per_pe) + 1)
        count = np.zeros((pes, len(KINDS)), dtype=np.int64)
        for p, c in per_pe.items():
            count[p, :-1] = [c[k] for k in WORK_KINDS]
        count[:, -1] = int(run.cycles)
        got = _COUNTS[run] = (np.repeat(np.arange(pes, dtype=np.int64), len(KINDS)), count.ravel())
    return got


def _frame(pe: np.ndarray, count: np.ndarray, pj: np.ndarray | None = None) -> pd.DataFrame:
    n = len(pe) // len(KINDS)
    codes = np.tile(np.arange(len(KINDS), dtype=np.int8), n)
    data = {"pe": pe.copy(), "kind": pd.Categorical.from_codes(codes, dtype=_KIND_DTYPE, validate=False),
            "count": count.copy(), "unit": _UNIT_NAMES[codes]}
    if pj is not None:
        data["pj"] = pj
    return pd.DataFrame(data)


def counts(run_or_decode_run: Any) -> pd.DataFrame:
    """The run's energy counts: one row per (PE, kind), ``pe, kind, count, unit`` (:data:`KINDS`; ``count``
    an int64), every PE of the device's topology (``pes``) included: one that ran nothing has only ``idle``.

    Computed once per run; every call returns a new frame of the same counts.

    Raises:
        ValidationError: not a Run or a DecodeRun.
    """
    return _frame(*_count_arrays(_resolve_run_only(run_or_decode_run)))


def total_pj(run_or_decode_run: Any, *, idle: bool = True, **overrides: Any) -> float:
    """The run's energy in pJ (its :func:`energy` rows' ``pj`` summed; without ``idle`` when ``idle=False``),
    without building a frame.

    Raises:
        As :func:`energy`.
    """
    run = _resolve_run_only(run_or_decode_run)
    per_unit = prices(run.topology, **overrides)
    _, count = _count_arrays(run)
    price = np.array([per_unit[k] for k in KINDS])
    if not idle:
        price[-1] = 0.0
    return float((count.reshape(-1, len(KINDS)).sum(axis=0) * price).sum())


def prices(topology: Topology, **overrides: Any) -> dict[str, float]:
    """The pJ of one unit of each kind's count under ``topology``'s energy keys, ``overrides`` (energy keys)
    applied: ``hbm`` 8 × ``hbm_pj_per_bit``, ``idle`` ``pe_idle_mw / clock_ghz`` (mW × ns = pJ), the others
    their key.

    Raises:
        ConfigError: a key that is not an energy key (with a "did you mean"), or a value the key refuses
            (negative, NaN, not a number), naming the key.
    """
    values = {k: getattr(topology, k) for k in ENERGY_KEYS}
    for k, v in overrides.items():
        if k not in ENERGY_KEYS:
            close = difflib.get_close_matches(str(k), ENERGY_KEYS, n=2)
            hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
            raise ConfigError(f"analysis.energy: {k!r} is not an energy key.{hint} Energy keys: "
                              f"{', '.join(ENERGY_KEYS)}.")
        values[k] = _keys.TOPOLOGY.check(k, v)
    out = {kind: float(values[key]) for kind, key in PRICE_KEYS.items()}
    out["hbm"] *= 8
    out["idle"] /= topology.clock_ghz
    return out


def energy(run_or_decode_run: Any, **overrides: Any) -> pd.DataFrame:
    """The run's energy: one row per (PE, kind), ``pe, kind, count, unit, pj`` (module docstring); its
    ``pj`` sum is the run's energy.

    Args:
        run_or_decode_run: a Run (a device run too) or a DecodeRun.
        **overrides: energy keys priced instead of the run's topology's (``hbm_pj_per_bit=0.55``): the same
            counts, other prices, nothing re-simulated.

    Raises:
        ValidationError: not a Run or a DecodeRun.
        ConfigError: an override that is not an energy key, or a value it refuses, naming the key.
    """
    run = _resolve_run_only(run_or_decode_run)
    per_unit = prices(run.topology, **overrides)
    pe, count = _count_arrays(run)
    price = np.tile(np.array([per_unit[k] for k in KINDS]), len(pe) // len(KINDS))
    return _frame(pe, count, count * price)


def energy_by_kind(run_or_decode_run: Any, *, idle: bool = True, **overrides: Any) -> pd.Series:
    """The run's pJ by kind (every PE summed), indexed by :data:`KINDS` (without ``idle`` when ``idle=False``).

    Raises:
        As :func:`energy`.
    """
    run = _resolve_run_only(run_or_decode_run)
    per_unit = prices(run.topology, **overrides)
    _, count = _count_arrays(run)
    pj = count.reshape(-1, len(KINDS)).sum(axis=0) * np.array([per_unit[k] for k in KINDS])
    s = pd.Series(pj, index=pd.Index(list(KINDS), name="kind"), name="pj")
    return s if idle else s.drop("idle")


def joules_text(pj: float) -> str:
    """``pj`` picojoules in the largest unit below it (``"12.3 µJ"``, ``"4.1 mJ"``)."""
    for scale, unit in ((1e12, "J"), (1e9, "mJ"), (1e6, "µJ"), (1e3, "nJ")):
        if pj >= scale:
            return f"{pj / scale:.4g} {unit}"
    return f"{pj:.4g} pJ"
