"""GQA decode attention: run opt2/opt3 and compare them (DESIGN.md §7, §10).

>>> from kbwork import decode
>>> cmp = decode.compare(kv_len=4096)        # data mode: numbers and timing
>>> cmp.ratio, cmp.closed_form_ratio, cmp.gate
>>> cmp.summary                               # one row per variant

``run`` simulates one variant and exposes the final state (``.m``, ``.l``,
``.O``), the op_log and the inputs; ``compare`` runs both on the same inputs
and reports per-tile dispatch, the ratio and its closed form, the gate,
end-to-end cycles and the numerical agreement against a float64 reference.
"""

from __future__ import annotations

import functools
import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from . import analysis, atomic
from . import sweep as _engine
from .config import Topology, load_topology, sweepable_keys
from .device.steady import check_steady_state
from .errors import ConfigError, ValidationError
from .kernels.gqa_decode import DEFAULT_VARIANTS, VARIANTS, gqa_decode
# the inputs and the float64 reference live with the kernel; they are this module's public names too
from .kernels.gqa_reference import (OUT_DTYPES, REFERENCE_BLOCK, _max_abs, _rounded, baseline,  # noqa: F401
                                    check_dtypes, check_fp8_range, make_inputs, reference)
from .memory import DTYPES, Arena, canonical_dtype
from .sim import MODES, Run, Simulator
from .sweep import SweepFile, check_switches

DEFAULTS = dict(kv_len=4096, group=8, head_dim=128, tile=128, dtype="bf16", mode="data", seed=0)

#: The most KV tiles one run simulates: a timing-mode run holds about 15 KB per tile (commands,
#: stages, op_log), so 2**18 tiles (32M tokens at tile 128) is already several GB.
MAX_TILES = 1 << 18
#: The most bytes data mode may spend on q, k and v as float32 (kv_len 4M at head_dim 128). A run keeps
#: them and its simulated HBM holds them again in the storage dtype (half as much in bf16); the float64
#: reference works in blocks. A data-mode compare of two bf16 variants peaks at about 2.4x the float32
#: K and V (measured at 256k tokens). Timing mode keeps no numbers.
MAX_DATA_BYTES = 1 << 32


# --- argument checks (before anything is allocated or simulated) -------------------------------
def _check_variant(variant: Any, where: str = "decode.run") -> None:
    if not isinstance(variant, str) or variant not in VARIANTS:
        raise ValidationError(f"{where}: decode variant {variant!r} is unknown; use one of {', '.join(VARIANTS)}.")


def _check_mode(mode: Any, where: str = "decode.run") -> None:
    if not isinstance(mode, str) or mode not in MODES:
        raise ValidationError(f"{where}: mode {mode!r} is unknown; use 'data' (numbers) or 'timing' (schedule only).")


def _check_seed(seed: Any, where: str = "decode.run") -> None:
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, numbers.Integral) or seed < 0:
        raise ValidationError(f"{where}: seed must be a non-negative int, got {seed!r} "
                              f"({type(seed).__name__}); e.g. seed=0.")


def _check_sizes(*, where: str = "decode.run", **sizes: Any) -> None:
    for name, val in sizes.items():
        if isinstance(val, (bool, np.bool_)) or not isinstance(val, numbers.Integral) or val <= 0:
            raise ValidationError(f"{where}: {name} must be a positive int, got {val!r} ({type(val).__name__}).")
    kv_len, tile = sizes["kv_len"], sizes["tile"]
    if kv_len % tile:
        raise ValidationError(f"{where}: kv_len {kv_len} is not a multiple of tile {tile}; "
                              f"pick a kv_len that is (ragged last tiles are not supported).")
    if kv_len // tile > MAX_TILES:
        raise ValidationError(f"{where}: kv_len {kv_len} / tile {tile} is {kv_len // tile} tiles; one run "
                              f"simulates at most {MAX_TILES} (about 15 KB of memory per tile). Use a larger "
                              f"tile or a shorter kv_len.")


def _input_bytes(kv_len: int, group: int, head_dim: int) -> int:
    return 4 * head_dim * (group + 2 * kv_len)


def _check_data_bytes(kv_len: int, group: int, head_dim: int, where: str = "decode.run") -> None:
    need = _input_bytes(kv_len, group, head_dim)
    if need > MAX_DATA_BYTES:
        raise ValidationError(f"{where}: data mode at kv_len={kv_len}, group={group}, head_dim={head_dim} needs "
                              f"{_fmt_bytes(need)} for q, k and v as float32, over the {_fmt_bytes(MAX_DATA_BYTES)} "
                              f"limit; use mode='timing' (no numbers) or smaller sizes.")


def _fmt_bytes(n: int) -> str:
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def _real_array(name: str, x: Any) -> np.ndarray:
    """``x`` as a numpy array of real numbers, or a ValidationError naming ``name``."""
    try:
        arr = np.asarray(x)
    except (TypeError, ValueError) as exc:  # ragged nested lists
        raise ValidationError(f"decode.run: {name} is not an array of numbers: {exc}") from None
    if arr.dtype.kind not in "iuf" and arr.dtype not in DTYPES.values():  # bf16 is kind 'V'
        raise ValidationError(f"decode.run: {name} must hold real numbers (int or float), got dtype {arr.dtype}.")
    return arr


# --- one variant -------------------------------------------------------------------------------
@dataclass
class DecodeRun:
    """One simulated decode variant.

    Attributes:
        variant, params: what was run.
        run: the underlying :class:`Run` (op_log, cycles, program).
        q, k, v: the (dtype-rounded) inputs as float32, data mode only.
        m, l, O: the final state as float32 (O normalised), data mode only.
    """

    variant: str
    run: Run
    params: dict[str, Any]
    q: np.ndarray | None = None
    k: np.ndarray | None = None
    v: np.ndarray | None = None
    m: np.ndarray | None = None
    l: np.ndarray | None = None
    O: np.ndarray | None = None
    _reference: np.ndarray | None = field(default=None, repr=False)

    def __repr__(self) -> str:
        p = self.params
        return (f"DecodeRun({self.variant}, kv_len={p['kv_len']}, tile={p['tile']}, {p['dtype']}, {p['mode']}: "
                f"{self.n_tiles} tiles, {len(self.run.commands)} commands, {self.run.n_stages} stages, "
                f"{self.cycles} cycles)")

    @property
    def op_log(self) -> pd.DataFrame:
        """Every executed stage, one row each (DESIGN.md §6): ``seq, cmd, iter, label, stage, engine,
        op_kind, phase, tile, k_tile, tensor, bytes, ready, start, end``, cycles as ints.

        Built on first access and kept; the same run gives the same frame every time. ``analysis``
        and ``plots`` take it.
        """
        return self.run.op_log

    @property
    def cycles(self) -> int:
        """End-to-end cycles: the end of the run's last stage (``topology.cycles_to_us`` gives µs)."""
        return self.run.cycles

    @property
    def topology(self) -> Topology:
        """The :class:`~kbwork.Topology` the run was simulated on, every override applied."""
        return self.run.topology

    @property
    def n_tiles(self) -> int:
        """KV tiles in the run: ``kv_len // tile``."""
        return self.params["kv_len"] // self.params["tile"]

    @property
    def dispatch_per_tile(self) -> pd.Series:
        """Simulated PE_CPU dispatch cycles per tile: the DISPATCH stages of the commands with each ``iter``.

        Equal to ``analysis.dispatch_per_tile(self.op_log)`` (a test checks it),
        but does not need the op_log built.
        """
        return analysis.dispatch_per_tile_from_run(self.run)

    @property
    def closed_form_per_tile(self) -> pd.Series:
        """Closed-form per-tile dispatch from the emitted commands' logical bytes."""
        return analysis.closed_form_per_tile_from_program(self.run.program, self.topology)

    @property
    def command_bytes_per_tile(self) -> list[int]:
        """Logical bytes of the commands of one (the first) tile."""
        prog = self.run.program
        iters = np.asarray(prog.iters)
        first = np.flatnonzero(iters == iters[iters >= 0].min())
        return [int(prog.logical_bytes[i]) for i in first]

    @property
    def reference(self) -> np.ndarray:
        """The float64 reference output for this run's inputs (data mode)."""
        if self.q is None:
            raise ValidationError("a timing-mode run keeps no inputs; run with mode='data' for numerics.")
        if self._reference is None:
            self._reference = reference(self.q, self.k, self.v)
        return self._reference

    @property
    def error(self) -> float:
        """max |O − reference|."""
        return _max_abs(self.O, self.reference)

    def to_csv(self, path: str | Path | None = None) -> str:
        """The op_log as canonical CSV (columns in order, no index, ``\\n`` line ends): byte-identical for
        the same run.

        Args:
            path: also write it there, atomically (an existing file is replaced whole or kept as it was).

        Returns:
            The CSV text.

        Raises:
            FileError: ``path`` cannot be written (an OSError too).
        """
        return self.run.to_csv(path)

    def to_perfetto(self, path: str | Path | None = None) -> dict:
        """The op_log as a Chrome-trace / Perfetto JSON: one track per engine unit, µs at the topology's
        clock, the critical path drawn as flow events (open it in https://ui.perfetto.dev).

        Args:
            path: also write it there as JSON, atomically.

        Returns:
            The trace as a dict.

        Raises:
            FileError: ``path`` cannot be written (an OSError too).
        """
        return self.run.to_perfetto(path)

    def to_npz(self, path: str | Path) -> Path:
        """Write the inputs (q, k, v), the final state (m, l, O) and the run parameters to an NPZ.

        The file is written atomically to exactly ``path`` (``np.savez`` given a
        name would append ``.npz`` to one without it; here nothing is appended).

        Returns:
            The path written.

        Raises:
            ValidationError: a timing-mode run (it has no numbers).
            OSError: the file cannot be written; an existing file is left intact.
        """
        if self.q is None:
            raise ValidationError("a timing-mode run has no numbers to save; run with mode='data'.")
        meta = {k: np.asarray(v) for k, v in self.params.items() if k != "topology"}
        arrays = dict(q=self.q, k=self.k, v=self.v, m=self.m, l=self.l, O=self.O,
                      scale=np.float64(1.0 / math.sqrt(self.q.shape[1])), variant=np.asarray(self.variant), **meta)
        return atomic.write_with(path, lambda f: np.savez(f, **arrays))


def run(variant: str, *, kv_len: int = 4096, group: int = 8, head_dim: int = 128, tile: int = 128,
        dtype: str = "bf16", mode: str = "data", topology: Topology | str | None = None, seed: int = 0,
        q: np.ndarray | None = None, k: np.ndarray | None = None, v: np.ndarray | None = None,
        steady_state: bool = True, out_dtype: str = "fp32", kv_dtype: str | None = None,
        **overrides: Any) -> DecodeRun:
    """Simulate one decode variant (DESIGN.md §7).

    >>> from kbwork import decode
    >>> r = decode.run("opt2", kv_len=4096)               # data mode: the numbers too
    >>> r.cycles, r.dispatch_per_tile.iloc[0], r.error     # end to end, per tile, max |O - float64 ref|
    >>> t = decode.run("a1", kv_len=1 << 20, mode="timing", fixed_cycles=0)   # a schedule only, 1M tokens

    Args:
        variant: a name in :data:`VARIANTS`: ``"opt2"`` (2 commands per tile: the softmax merge fused as a
            recipe prologue of P·V), ``"opt3"`` (10: the merge as eight MATH commands, then P·V) or
            ``"a1"`` (3: the merge recipe as a MATH-only command, then P·V; ADR-0065's rejected A1).
        kv_len, group, head_dim, tile: N, G, d and T. ``kv_len`` must be a multiple of ``tile``.
        dtype: storage dtype of q, k, v (``"bf16"``, ``"fp16"``, ``"fp32"``).
        out_dtype: the dtype of the output O in HBM (``"fp32"``, or ``"bf16"``: O rounded once, at the store).
        kv_dtype: the dtype of K and V (default: ``dtype``); ``"fp8"`` is e4m3fn, 1 byte per element. fp8
            K and V are the seed's ``dtype`` values rounded to fp8; given k or v must be finite and within
            ±448, checked as given, before any rounding (DESIGN.md §17).
        mode: ``"data"`` (numbers) or ``"timing"`` (schedule only).
        topology: a Topology, a topology name or path; ``None`` for the default.
        seed: seeds the standard-normal inputs when q, k, v are not given.
        q, k, v: explicit float arrays (rounded to ``dtype``); they set group, head_dim and kv_len.
        steady_state: timing mode inserts the tile loop's remaining periods once
            its schedule is proven periodic (DESIGN.md §12; identical results);
            ``False`` forces the full simulation. Data mode always runs in full.
            ``run.steady_state`` says which path ran. ``True`` or ``False`` only.
        **overrides: flat topology keys (``fixed_cycles=0``, ``hazard_policy="rw_aware"``, ...).

    Returns:
        A :class:`DecodeRun`.

    Raises:
        ValidationError: an unknown variant, mode or dtype; fp8 K or V values outside ±448 or NaN (naming
            the tensor and the value); a seed that is not a
            non-negative int; bad shapes or kv length; more than :data:`MAX_TILES`
            tiles, or data-mode inputs beyond :data:`MAX_DATA_BYTES`.
        ConfigError: a bad topology (wrong type, missing file, bad keys or values).
        TcmOverflowError: the run's tiles do not fit in the TCM.
    """
    _check_variant(variant)
    _check_mode(mode)
    _check_seed(seed)
    dtype, out_dtype, kv_dtype = check_dtypes(dtype, out_dtype, kv_dtype)
    topo = load_topology(topology, **overrides)
    given = [x is not None for x in (q, k, v)]
    if any(given) and not all(given):
        raise ValidationError("decode.run: pass all of q, k and v, or none of them (then seed= draws them).")
    if all(given):
        q, k, v = (_real_array(name, x) for name, x in (("q", q), ("k", k), ("v", v)))
        if q.ndim != 2 or k.ndim != 2 or k.shape != v.shape or k.shape[1] != q.shape[1]:
            raise ValidationError(f"decode.run: q must be (G, d) and k, v (N, d); got q {q.shape}, k {k.shape}, "
                                  f"v {v.shape}.")
        if kv_dtype == "fp8":  # on the values as given, before any rounding
            check_fp8_range("k", k)
            check_fp8_range("v", v)
        q, k, v = _rounded(q, dtype, "q"), _rounded(k, kv_dtype, "k"), _rounded(v, kv_dtype, "v")
        group, head_dim = q.shape
        kv_len = k.shape[0]
    _check_sizes(kv_len=kv_len, group=group, head_dim=head_dim, tile=tile)
    check_steady_state(steady_state, "decode.run")
    if mode == "data" and q is None:
        _check_data_bytes(kv_len, group, head_dim)
    params = dict(kv_len=int(kv_len), group=int(group), head_dim=int(head_dim), tile=int(tile), dtype=dtype,
                  kv_dtype=kv_dtype, out_dtype=out_dtype, p_dtype=topo.p_dtype, mode=mode, seed=int(seed), fixed_cycles=topo.fixed_cycles, r_cycles_per_byte=topo.r_cycles_per_byte,
                  hazard_policy=topo.hazard_policy, topology=topo.name)
    sim = Simulator(topo, mode=mode)
    data = mode == "data"
    if data:
        try:
            if q is None:
                q, k, v = make_inputs(kv_len, group, head_dim, dtype, seed)
                if kv_dtype != dtype:  # the seed's values, rounded to the KV dtype
                    k, v = _rounded(k, kv_dtype, "k"), _rounded(v, kv_dtype, "v")
            isz, kv_isz = DTYPES[dtype].itemsize, DTYPES[kv_dtype].itemsize
            sim.reserve(q.size * isz + (k.size + v.size) * kv_isz + group * head_dim * 4 + 4 * Arena.ALIGN)
            qh, kh, vh = (sim.hbm("q", q, dtype=dtype), sim.hbm("K", k, dtype=kv_dtype),
                          sim.hbm("V", v, dtype=kv_dtype))
        except MemoryError:
            # under MAX_DATA_BYTES but more than this machine has free: still say what was asked
            need = _input_bytes(kv_len, group, head_dim)
            raise ValidationError(f"decode.run: not enough memory for data-mode inputs of kv_len={kv_len}, "
                                  f"group={group}, head_dim={head_dim} ({_fmt_bytes(need)} as float32, as much "
                                  f"again in the simulated HBM); use mode='timing' or smaller sizes.") from None
    else:
        qh = sim.hbm("q", shape=(group, head_dim), dtype=dtype)
        kh = sim.hbm("K", shape=(kv_len, head_dim), dtype=kv_dtype)
        vh = sim.hbm("V", shape=(kv_len, head_dim), dtype=kv_dtype)
    out = sim.hbm("out", shape=(group, head_dim), dtype=out_dtype)
    r = sim.run(gqa_decode, qh, kh, vh, out, variant=variant, tile=tile, steady_state=steady_state)
    res = DecodeRun(variant, r, params)
    if data:
        res.q, res.k, res.v = q, k, v
        res.m, res.l = (r.read(n).astype(np.float32) for n in ("m", "l"))
        res.O = r.read(out).astype(np.float32)
    return res


def what_if(params_or_run: Any, engine: str | Sequence[str] | None = None, speedup: Any = 2.0) -> pd.DataFrame:
    """Causal profiling of a decode: :func:`kbwork.analysis.what_if`, from a run or from its parameters.

    >>> from kbwork import decode
    >>> decode.what_if(dict(variant="opt3", kv_len=4096, hazard_policy="rw_aware"), engine="PE_GEMM", speedup=2)

    Args:
        params_or_run: a dict of :func:`run` parameters including ``variant`` (run here in timing mode,
            whatever ``mode`` it gives: a what-if re-simulates the schedule only), or a
            :class:`DecodeRun` or :class:`~kbwork.Run` (passed on as it is).
        engine, speedup: as :func:`kbwork.analysis.what_if`.

    Returns:
        :func:`kbwork.analysis.what_if`'s table: one row per engine.

    Raises:
        ValidationError: a bad ``engine`` or ``speedup`` (checked before anything is simulated), a dict
            without ``variant``, a bad parameter of :func:`run`, or an input that is neither.
    """
    if not isinstance(params_or_run, Mapping):
        return analysis.what_if(params_or_run, engine, speedup)
    analysis.check_what_if(engine, speedup)
    params = dict(params_or_run)
    variant = params.pop("variant", None)
    if variant is None:
        raise ValidationError(f"decode.what_if: a dict of decode.run parameters needs 'variant' (one of "
                              f"{', '.join(VARIANTS)}).")
    params["mode"] = "timing"
    return analysis.what_if(run(variant, **params), engine, speedup)


# --- the comparison ----------------------------------------------------------------------------
@dataclass
class Comparison:
    """Two or more decode variants on the same inputs and topology (see :func:`compare`).

    Per variant (in the order asked for): the run, its per-tile dispatch
    (simulated and closed form), its end-to-end cycles and, in data mode, its
    error against the float64 reference. The headline ratio and gate are
    opt3 against opt2 when both are present (DESIGN.md §7, §10); :attr:`gates`
    reports every variant against opt2 and against opt3. ``max |a - b|`` of
    m, l, O covers every pair (:attr:`max_abs_diffs`).

    Per-variant values read as attributes too: ``cmp.a1`` (the run),
    ``cmp.dispatch_a1``, ``cmp.closed_form_a1``, ``cmp.cycles_a1``, ``cmp.err_a1``.
    """

    runs: dict[str, DecodeRun]
    dispatch: dict[str, int]
    closed_form: dict[str, int]
    cycles: dict[str, int]
    max_abs_diffs: dict[str, dict[str, float]] | None = None
    errors: dict[str, float] | None = None
    err_baseline: float | None = None

    _PER_VARIANT = {"dispatch_": "dispatch", "closed_form_": "closed_form", "cycles_": "cycles", "err_": "errors"}

    def __getattr__(self, name: str) -> Any:
        # only reached for names the dataclass does not define: cmp.opt2, cmp.dispatch_opt3, cmp.err_a1, ...
        runs = self.__dict__.get("runs", {})
        if name in runs:
            return runs[name]
        for prefix, field_name in self._PER_VARIANT.items():
            if name.startswith(prefix) and name[len(prefix):] in runs:
                values = self.__dict__.get(field_name)
                return None if values is None else values[name[len(prefix):]]
        raise AttributeError(f"Comparison has no attribute {name!r}; its variants are {', '.join(runs)}.")

    def __repr__(self) -> str:
        per = ", ".join(f"{v} {self.dispatch[v]}" for v in self.variants)
        head = (f"opt3/opt2 ratio {_fmt_ratio(self.ratio)}, gate {'PASS' if self.gate else 'FAIL'}; "
                if self.gate is not None else "")
        cyc = ", ".join(f"{v} {self.cycles[v]}" for v in self.variants)
        return f"Comparison(dispatch/tile {per}: {head}cycles {cyc})"

    @property
    def variants(self) -> tuple[str, ...]:
        """The variants compared, in the order asked for (the order of every per-variant field)."""
        return tuple(self.runs)

    @property
    def params(self) -> dict[str, Any]:
        """What was run, the same for every variant (:attr:`DecodeRun.params`): ``kv_len``, ``group``,
        ``head_dim``, ``tile``, ``dtype``, ``kv_dtype``, ``out_dtype``, ``p_dtype``, ``mode``, ``seed``,
        ``fixed_cycles``, ``r_cycles_per_byte``, ``hazard_policy`` and the topology's name."""
        return next(iter(self.runs.values())).params

    @property
    def has_gate(self) -> bool:
        """Whether both opt2 and opt3 were run (the headline ratio and gate are theirs)."""
        return "opt2" in self.runs and "opt3" in self.runs

    @property
    def ratio(self) -> float | None:
        """Simulated per-tile dispatch ratio opt3 / opt2, or ``None`` when it has no value: opt2's
        dispatch is 0 (FIXED = R = 0), or opt2 or opt3 was not run (see :attr:`ratio_note`)."""
        return self.ratio_of("opt3", "opt2")

    @property
    def closed_form_ratio(self) -> float | None:
        """The closed-form ratio opt3 / opt2, or ``None`` like :attr:`ratio`."""
        return self.ratio_of("opt3", "opt2", closed_form=True)

    def ratio_of(self, a: str, b: str, closed_form: bool = False) -> float | None:
        """Per-tile dispatch of ``a`` over ``b``; ``None`` when either is missing or ``b``'s is 0."""
        d = self.closed_form if closed_form else self.dispatch
        if a not in d or b not in d or d[b] == 0:
            return None
        return d[a] / d[b]

    @property
    def ratio_note(self) -> str | None:
        """Why :attr:`ratio` is ``None`` (DESIGN.md §7), or ``None`` when the ratio is defined."""
        if not self.has_gate:
            return f"the headline ratio and gate compare opt3 with opt2; this comparison ran {', '.join(self.variants)}"
        if self.ratio is not None and self.closed_form_ratio is not None:
            return None
        p = self.params
        return (f"opt2 dispatches 0 cycles per tile (every dispatch costs 0 at FIXED={p['fixed_cycles']}, "
                f"R={p['r_cycles_per_byte']}), so opt3/opt2 has no value; the gate opt3 > 2 x opt2 "
                f"({self.dispatch['opt3']} > {2 * self.dispatch['opt2']}) fails")

    @property
    def gate(self) -> bool | None:
        """``opt3 > 2 × opt2`` on the simulated per-tile dispatch (``None`` unless both were run)."""
        return analysis.gate(self.dispatch["opt3"], self.dispatch["opt2"]) if self.has_gate else None

    @property
    def closed_form_gate(self) -> bool | None:
        """:attr:`gate` on the closed-form per-tile dispatch (``FIXED + ceil(R x bytes)`` per command, no
        simulation): ``opt3 > 2 x opt2``; ``None`` unless both were run. It agrees with :attr:`gate`, since
        the simulated dispatch matches its closed form exactly."""
        return analysis.gate(self.closed_form["opt3"], self.closed_form["opt2"]) if self.has_gate else None

    @property
    def gates(self) -> pd.DataFrame:
        """The gate report: every variant against opt2 (``v > 2 x opt2``) and opt3 against every other
        variant (``opt3 > 2 x v``), where those are present; one row each with both ratios and verdicts."""
        pairs = [(v, "opt2") for v in self.variants if v != "opt2" and "opt2" in self.runs]
        pairs += [("opt3", v) for v in self.variants if v not in ("opt2", "opt3") and "opt3" in self.runs]
        rows = [{"rule": f"{a} > {analysis.GATE_FACTOR:g} x {b}", "ratio": self.ratio_of(a, b),
                 "closed_form_ratio": self.ratio_of(a, b, closed_form=True),
                 "pass": analysis.gate(self.dispatch[a], self.dispatch[b]),
                 "closed_form_pass": analysis.gate(self.closed_form[a], self.closed_form[b])} for a, b in pairs]
        return pd.DataFrame(rows, columns=["rule", "ratio", "closed_form_ratio", "pass", "closed_form_pass"])

    @property
    def speedup(self) -> float | None:
        """End-to-end cycles opt3 / opt2 (> 1 means opt2 is faster); ``None`` unless both were run."""
        return self.cycles["opt3"] / self.cycles["opt2"] if self.has_gate else None

    @property
    def max_abs_diff(self) -> dict[str, float] | None:
        """max |opt2 − opt3| of m, l and O (data mode, both run), else ``None``."""
        return None if self.max_abs_diffs is None else self.max_abs_diffs.get("opt2-opt3")

    @property
    def error_bound(self) -> float | None:
        """2 × the plain attention's error in storage precision, + 1e-6 (FlashAttention's test bound)."""
        return None if self.err_baseline is None else 2.0 * self.err_baseline + 1e-6

    @property
    def numerics_ok(self) -> bool | None:
        """Every variant within the error bound of the reference (None in timing mode)."""
        if self.error_bound is None:
            return None
        return bool(all(e <= self.error_bound for e in self.errors.values()))

    @property
    def summary(self) -> pd.DataFrame:
        """One row per variant: commands and dispatch per tile, closed form, cycles, error."""
        us = next(iter(self.runs.values())).topology.cycles_to_us
        rows = [{"variant": v, "commands_per_tile": len(r.command_bytes_per_tile),
                 "dispatch_per_tile": self.dispatch[v], "closed_form_per_tile": self.closed_form[v],
                 "cycles": self.cycles[v], "us": round(us(self.cycles[v]), 3), "stages": r.run.n_stages,
                 "max_abs_err_vs_ref": None if self.errors is None else self.errors[v]}
                for v, r in self.runs.items()]
        return pd.DataFrame(rows).set_index("variant")

    def to_dict(self) -> dict[str, Any]:
        """Every field as plain JSON-serialisable values, every per-variant value keyed by variant.

        ``ratio`` and ``closed_form_ratio`` (opt3 / opt2) are ``None`` (JSON
        ``null``) when they have no value, and ``ratio_note`` then says why;
        otherwise the note is ``None``.
        """
        topo = next(iter(self.runs.values())).topology
        gate = ({"rule": "opt3 > 2 x opt2", "pass": self.gate, "closed_form_pass": self.closed_form_gate}
                if self.has_gate else None)
        return {
            "params": dict(self.params),
            "variants": list(self.variants),
            "dispatch_per_tile": dict(self.dispatch),
            "closed_form_per_tile": dict(self.closed_form),
            "commands_per_tile": {v: len(r.command_bytes_per_tile) for v, r in self.runs.items()},
            "ratio": self.ratio,
            "closed_form_ratio": self.closed_form_ratio,
            "ratio_note": self.ratio_note,
            "gate": gate,
            "gates": self.gates.to_dict(orient="records"),
            "cycles": dict(self.cycles),
            "us": {v: topo.cycles_to_us(c) for v, c in self.cycles.items()},
            "speedup_opt3_over_opt2": self.speedup,
            "max_abs_diff_opt2_opt3": self.max_abs_diff,
            "max_abs_diff": self.max_abs_diffs,
            "max_abs_err_vs_ref": (None if self.errors is None else
                                   {**self.errors, "baseline": self.err_baseline, "bound": self.error_bound,
                                    "pass": self.numerics_ok}),
        }


def _fmt_ratio(x: float | None) -> str:
    return "undefined" if x is None else f"{x:.2f}"


def _uniform(series: pd.Series, what: str) -> int:
    vals = np.unique(series.to_numpy())
    if len(vals) != 1:  # every tile emits the same commands; anything else is a bug worth seeing
        raise AssertionError(f"{what} differs across tiles: {series.to_dict()}")
    return int(vals[0])


def _check_variants(variants: Any, where: str) -> tuple[str, ...]:
    if isinstance(variants, str) or not isinstance(variants, (list, tuple)):
        raise ValidationError(f"{where}: variants must be a non-empty list or tuple of names such as "
                              f"{DEFAULT_VARIANTS!r} (known: {', '.join(VARIANTS)}), got {variants!r}.")
    for v in variants:
        _check_variant(v, where=where)
    if len(set(variants)) != len(variants):
        raise ValidationError(f"{where}: variants {tuple(variants)!r} name a variant twice.")
    return tuple(variants)


def tcm_bytes_that_fit(variants: Sequence[str], *, tile: int, group: int, head_dim: int,
                       topology: Topology | str | None = None, dtype: str = "bf16",
                       **overrides: Any) -> tuple[int, int | None]:
    """The topology's ``tcm_bytes`` and the smallest TCM, doubling from it, in which one tile of every variant
    fits: a TCM holds what one tile needs, whatever the tile count, so a one-tile timing run of each (a few
    milliseconds) decides. The second is None when not even :data:`kbwork.config.MAX_TCM_BYTES` holds it.

    Raises:
        KbworkError: the sizes, the topology or an override are refused (as :func:`run` refuses them).
    """
    from .config import MAX_TCM_BYTES
    from .errors import TcmOverflowError

    topo = load_topology(topology, **overrides)
    size = topo.tcm_bytes * 2
    while size <= MAX_TCM_BYTES:
        try:
            for v in variants:
                run(v, kv_len=tile, group=group, head_dim=head_dim, tile=tile, dtype=dtype, mode="timing",
                    topology=topo, steady_state=False, tcm_bytes=size)
        except TcmOverflowError:
            size *= 2
            continue
        return topo.tcm_bytes, size
    return topo.tcm_bytes, None


def compare(*, kv_len: int = 4096, group: int = 8, head_dim: int = 128, tile: int = 128, dtype: str = "bf16",
            mode: str = "data", topology: Topology | str | None = None, seed: int = 0,
            variants: tuple[str, ...] = DEFAULT_VARIANTS, out_dtype: str = "fp32", kv_dtype: str | None = None,
            **overrides: Any) -> Comparison:
    """Run two or more variants (default opt2 and opt3) on the same inputs and topology and compare them.

    ``out_dtype`` and ``kv_dtype`` are :func:`run`'s (DESIGN.md §17), the same for every variant.

    Returns:
        A :class:`Comparison` with the per-tile dispatch of every variant, the
        ratio opt3/opt2 and its closed form, the gate, end-to-end cycles, and
        (data mode) max |a − b| of m, l, O for every pair and each variant's
        error against the float64 reference. At FIXED = R = 0 every dispatch
        costs 0: the ratios are ``None`` with a ``ratio_note`` and the gate
        fails (DESIGN.md §7).

    Raises:
        ValidationError: fewer than two variants, an unknown or repeated one;
            and the errors of :func:`run`, before any variant is simulated.
    """
    variants = _check_variants(variants, "decode.compare")
    if len(variants) < 2:
        raise ValidationError(f"decode.compare needs two or more variants, got {variants!r}; "
                              f"use decode.run for one.")
    kw = dict(kv_len=kv_len, group=group, head_dim=head_dim, tile=tile, dtype=dtype, mode=mode,
              topology=topology, seed=seed, out_dtype=out_dtype, kv_dtype=kv_dtype, **overrides)
    runs: dict[str, DecodeRun] = {}
    for v in variants:
        runs[v] = run(v, **kw)
        if mode == "data" and "q" not in kw:  # every variant on the first one's inputs
            first = runs[v]
            kw.update(q=first.q, k=first.k, v=first.v)
    dispatch = {v: _uniform(r.dispatch_per_tile, f"{v} dispatch") for v, r in runs.items()}
    closed = {v: _uniform(r.closed_form_per_tile, f"{v} closed form") for v, r in runs.items()}
    cmp = Comparison(runs, dispatch, closed, {v: r.cycles for v, r in runs.items()})
    if mode == "data":
        names = list(runs)
        cmp.max_abs_diffs = {f"{a}-{b}": {n: _max_abs(getattr(runs[a], n), getattr(runs[b], n))
                                          for n in ("m", "l", "O")}
                             for i, a in enumerate(names) for b in names[i + 1:]}
        first = runs[names[0]]
        ref = first.reference
        for r in runs.values():
            r._reference = ref
        cmp.errors = {v: r.error for v, r in runs.items()}
        cmp.err_baseline = _max_abs(baseline(first.q, first.k, first.v, first.params["dtype"]), ref)
    return cmp


# --- sweeps: the front end of kbwork.sweep's engine ----------------------------------------------
_SIZE_AXES = ("kv_len", "tile", "group", "head_dim")
_DTYPE_AXES = ("dtype", "kv_dtype", "out_dtype")
#: The columns of a sweep row after the axes (then :data:`kbwork.analysis.PATH_COLUMNS` with ``attribution``).
SWEEP_METRICS = ("variant", "cycles", "us", "dispatch_per_tile", "dispatch_total", "commands", "stages", "n_tiles")
_INT_METRICS = ("cycles", "dispatch_per_tile", "dispatch_total", "commands", "stages", "n_tiles")
#: The version of what a sweep row means. It is recorded in every sweep file's ``.meta.json`` and a file
#: of another version is not resumed; raise it whenever a change to kbwork changes the rows a sweep
#: produces for the same settings (a cost model, a column's meaning).
SWEEP_SCHEMA = 1
#: The file a sweep keeps: the engine's (:class:`kbwork.sweep.SweepFile`), under the name it had here.
_SweepLog = SweepFile


def sweep_axes() -> tuple[str, ...]:
    """What :func:`sweep` can sweep: the sizes of a run, its dtypes (``dtype``, ``kv_dtype``, ``out_dtype``), and
    every topology key the key table lets a sweep vary (:func:`kbwork.config.sweepable_keys`, ``p_dtype``
    among them)."""
    return (*_SIZE_AXES, *_DTYPE_AXES, *sweepable_keys())


#: :func:`sweep_axes` when kbwork was imported.
SWEEP_AXES = sweep_axes()


def _check_axis_value(name: str, val: Any, base: Topology) -> None:
    """Raise a typed error naming axis ``name`` if ``val`` cannot be one of its values."""
    if name in _SIZE_AXES:
        if isinstance(val, (bool, np.bool_)) or not isinstance(val, numbers.Integral) or val <= 0:
            raise ValidationError(f"sweep: axis {name!r} takes positive ints, got {val!r} ({type(val).__name__}).")
    elif name in _DTYPE_AXES:
        try:
            check_dtypes(**{"dtype": "bf16", name: val}, where="sweep")
        except ValidationError as exc:
            raise ValidationError(f"sweep: axis {name!r}: {exc}") from None
    else:
        try:
            base.replace(**{name: val})
        except ConfigError as exc:
            raise ConfigError(f"sweep: axis {name!r}: {exc}") from None


def sweep(*, variants: tuple[str, ...] = DEFAULT_VARIANTS, progress: bool = True, mode: str = "timing",
          topology: Topology | str | None = None, client: Any = None, workers: int | None = None,
          out: str | Path | None = None, resume: bool = False, attribution: bool = False,
          **axes: Any) -> pd.DataFrame:
    """Simulate every variant at every point of the cartesian product of ``axes``.

    Each axis is a list (a scalar is a one-point axis), e.g.
    ``sweep(kv_len=[1024, 4096], fixed_cycles=[0, 40])``; the axes are
    :data:`SWEEP_AXES`. Timing mode by default.
    Points run on this machine's cores in processes (``workers=1``: here, in
    order; small sweeps always run here), or on a Dask cluster when ``client``
    is a ``distributed.Client`` or a scheduler address (:mod:`kbwork.parallel`);
    the DataFrame is the same, rows in the same order, either way. ``progress``
    shows a ``tqdm`` bar (a widget in Jupyter). A point that fails on another
    process raises here the same error class with the same message.

    ``out`` (a ``.csv`` path) receives the rows as points finish, each with its
    ``point`` index, so a long sweep can be stopped and continued with
    ``resume=True``: the rows already in the file are not run again. Beside it,
    ``<out>.meta.json`` records everything that decides the rows (the axes and
    their values, the variants, the topology's content, the mode, the columns
    and :data:`SWEEP_SCHEMA`), written before the first row; a resume under
    anything else is refused with a message saying what differs. The one
    exception: more variants than the file records extend it (its rows stay,
    the new variants' rows are added). Every row read back is checked (types,
    ranges, point index, the point's axis values); a damaged file is refused,
    naming the line. A row that is not one the sweep wrote (the record keeps a
    digest of every line) or that disagrees with itself (``us`` is not
    ``cycles`` at the clock, the dispatch columns do not fit in the run, the
    critical-path columns do not add up) is not taken back: it runs again, with
    a warning naming the line and why. At every moment the file holds every finished row and no
    torn one: rows are appended whole, and a rewrite (dropping a torn last
    line, putting the finished sweep in point order) goes to a file beside it
    that then replaces it.

    ``attribution=True`` adds where each run's time went: its critical-path
    cycles by engine (``path_PE_CPU``, ..., every DMA channel summed into
    ``path_PE_DMA``) and by cause (``path_engine``, ``path_dependency``,
    ``path_hazard``, ...), :data:`kbwork.analysis.PATH_COLUMNS`; each of the
    two groups adds up to ``cycles`` (:func:`kbwork.analysis.path_cycles`).

    Returns:
        One row per (point, variant): the axis values, ``variant``, ``cycles``,
        ``us``, ``dispatch_per_tile``, ``dispatch_total`` (all DISPATCH cycles),
        ``commands``, ``stages`` and ``n_tiles`` (then the ``path_`` columns
        when asked for).

    Raises:
        ValidationError: an unknown axis, an axis without values, a value of
            the wrong type for its axis (the error names the axis), an unknown
            variant or mode, a bad ``client``, a bad ``out`` (or one that exists
            without ``resume=True``, that another sweep wrote, or that is
            damaged); checked before the first point is simulated.
        ConfigError: a bad topology, or a topology value out of range.
        Any error of :func:`run` at a point, with its class and message.
    """
    _engine.check_axis_names(axes, sweep_axes())  # read now: the key table may have grown since import
    variants = _check_variants(variants, "sweep")
    check_switches(resume, progress)
    _engine.check_resume_has_out(resume, out)
    if attribution not in (True, False):
        raise ValidationError(f"sweep: attribution must be True or False, got {attribution!r}.")
    if not variants:
        raise ValidationError(f"sweep: variants is empty; give one or more of {', '.join(VARIANTS)}.")
    _check_mode(mode, where="sweep")
    names = list(axes)
    values = _engine.axis_values(axes, names)
    base = load_topology(topology)
    _engine.check_axes(names, values, lambda name, val: _check_axis_value(name, val, base))
    points = _engine.points(names, values)
    for point in points:  # e.g. a kv_len that is not a multiple of some tile: fail now, not half-way
        sizes = {n: point.get(n, DEFAULTS[n]) for n in _SIZE_AXES}
        _check_sizes(where="sweep", **sizes)
        if mode == "data":
            _check_data_bytes(sizes["kv_len"], sizes["group"], sizes["head_dim"], where="sweep")
    return _engine.run(_sweep_front(variants, mode, base, attribution), names, values, points, out=out,
                       resume=resume, progress=progress, workers=workers, client=client)


def _sweep_front(variants: tuple[str, ...], mode: str, base: Topology, attribution: bool) -> _engine.Front:
    """What a decode sweep gives the engine: its point function, one row per variant, and its columns."""
    from . import __version__

    metrics = SWEEP_METRICS + (analysis.PATH_COLUMNS if attribution else ())
    return _engine.Front(
        label="sweep", what="kbwork.decode.sweep", schema=SWEEP_SCHEMA, point=_sweep_point,
        task=lambda point, missing: (point, tuple(missing), mode, base, attribution),
        keys=variants, key_columns=("variant",), metrics=metrics,
        read_row=functools.partial(_read_row, topology=base, metrics=metrics),
        check_row=functools.partial(_check_row, topology=base),
        record={"kbwork": __version__, "mode": mode, "variants": list(variants), "topology": base.to_dict()},
        keys_field="variants", compared=("mode", "variants", "columns"), setups=("topology",),
        differs={"variants": _variants_differ, "columns": _columns_differ})


def _sweep_point(task: tuple) -> list[dict]:
    """The given variants at one sweep point: the rows :func:`sweep` returns for it (runs in a worker)."""
    point, variants, mode, topology, attribution = task
    rows = []
    for variant in variants:
        r = run(variant, mode=mode, topology=topology, **point)
        row = {**point, "variant": variant, "cycles": r.cycles, "us": r.topology.cycles_to_us(r.cycles),
               "dispatch_per_tile": int(r.dispatch_per_tile.iloc[0]),
               "dispatch_total": int(r.run.dispatch_cycles().sum()),
               "commands": len(r.run.commands), "stages": r.run.n_stages, "n_tiles": r.n_tiles}
        if attribution:
            row.update(analysis.path_cycles(r.run))
        rows.append(row)
    return rows


def _read_row(fields: dict[str, str], point: dict, bad: Any, *, topology: Topology,
              metrics: tuple[str, ...]) -> dict[str, Any]:
    """A row's metrics read back from a sweep file, typed; ``bad(column, want)`` for a value its column cannot
    hold (``n_tiles`` is the point's, a count is a whole number, ``us`` a finite number of microseconds)."""
    def whole(column: str, least: int = 0) -> int:
        text = fields[column]
        if not (text.isascii() and text.isdigit()) or int(text) < least:
            raise bad(column, f"a whole number >= {least}")
        return int(text)

    row: dict[str, Any] = {c: whole(c, 0 if c.startswith("dispatch") else 1) for c in _INT_METRICS}
    try:
        us = float(fields["us"])
    except ValueError:
        raise bad("us", "a number of microseconds") from None
    if not (math.isfinite(us) and us > 0):
        raise bad("us", f"cycles {row['cycles']} in microseconds ({topology.cycles_to_us(row['cycles'])!r})")
    row["us"] = us
    sizes = {n: point.get(n, DEFAULTS[n]) for n in ("kv_len", "tile")}
    if row["n_tiles"] != sizes["kv_len"] // sizes["tile"]:
        raise bad("n_tiles", f"point {fields['point']}'s kv_len / tile = {sizes['kv_len'] // sizes['tile']}")
    for column in metrics:
        if column.startswith("path_"):
            row[column] = whole(column)
    return {c: row[c] for c in metrics[1:]}


def _check_row(row: dict[str, Any], point: dict, *, topology: Topology) -> str | None:
    """Why a decode sweep row disagrees with itself, or None: ``us`` is ``cycles`` at the clock; the commands'
    DISPATCH stages (every tile's, at least) fit in ``dispatch_total``, which fits in the run; every command
    has stages; each group of critical-path columns adds up to ``cycles``."""
    cycles = row["cycles"]
    if not math.isclose(row["us"], topology.cycles_to_us(cycles), rel_tol=1e-9):
        return f"us {row['us']!r} is not cycles {cycles} in microseconds ({topology.cycles_to_us(cycles)!r})"
    if not row["dispatch_per_tile"] * row["n_tiles"] <= row["dispatch_total"] <= cycles:
        return (f"dispatch_per_tile {row['dispatch_per_tile']} x n_tiles {row['n_tiles']} <= dispatch_total "
                f"{row['dispatch_total']} <= cycles {cycles} does not hold")
    if row["commands"] > row["stages"]:
        return f"commands {row['commands']} outnumber stages {row['stages']}"
    paths = [c for c in row if c.startswith("path_")]
    for group in ([c for c in paths if c.startswith("path_PE_")], [c for c in paths if not c.startswith("path_PE_")]):
        if group and sum(row[c] for c in group) != cycles:
            return f"{group[0]}, ... add up to {sum(row[c] for c in group)}, not cycles {cycles}"
    return None


def _variants_differ(recorded: Any, now: list[str]) -> str | None:
    """A recorded variant list that this sweep's contains is no difference (the file is extended)."""
    if isinstance(recorded, list) and set(recorded) <= set(now):
        return None
    missing = [v for v in recorded if v not in now] if isinstance(recorded, list) else []
    return (f"variants {', '.join(map(str, recorded)) if isinstance(recorded, list) else recorded} there, "
            f"{', '.join(now)} here" + (f" (without {', '.join(missing)}: a resume keeps every recorded variant and "
                                        f"may add more)" if missing else ""))


def _columns_differ(recorded: Any, now: list[str]) -> str | None:
    if recorded == now:
        return None

    def paths(columns: Any) -> bool:
        return isinstance(columns, list) and any(str(c).startswith("path_") for c in columns)

    was, is_now = paths(recorded), paths(now)
    return (f"attribution={was} there, {is_now} here (the critical-path columns)" if was != is_now else
            f"columns {recorded} there, {now} here")
