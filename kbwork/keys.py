"""Every key's facts, declared once: the topology keys (DESIGN.md §1, §4, §14), the host keys and the model keys
(§15), one :class:`Key` row each (DESIGN.md §19, "One key table").

A row says a key's type, default, unit, range, whether 0 or ``inf`` is allowed, whether it keys the plan cache,
whether a sweep may vary it, and a one-line doc. Everything else reads the rows: the fields of
:class:`~kbwork.config.Topology`, :class:`~kbwork.model.Host` and :class:`~kbwork.model.Model`
(:func:`key_fields`), their validation (:meth:`KeyTable.check`), the plan cache's key
(:attr:`KeyTable.planned`), the axes of both sweeps (:func:`sweepable_keys`, :func:`sweepable_host_keys`), the
command line's ranges and the key tables of ``docs/machine.md`` and ``docs/model.md`` (:mod:`kbwork.keydocs`;
a test holds the docs equal to the rows). A new key is one row (and, for a topology key, its value in the shipped
TOML files).

Key names are unique across the topology and host tables, so a sweep axis names one key. ``name`` is not a key
but the identity of a topology, host or model: every class has it, no ``--set`` sets it and no sweep varies it.

Regenerate the docs' tables after editing a row (:mod:`kbwork.keydocs`)::

    python -m kbwork.keydocs          # rewrites the tables in docs/machine.md and docs/model.md
    python -m kbwork.keydocs --check  # exit status 1 when they are stale
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Callable, Iterable

from .errors import ConfigError

#: Upper bound of integer topology keys, far above anything a real PE model needs: it turns a typo such as
#: ``fixed_cycles=10**19`` into a ConfigError at load time instead of an int64 overflow deep in a run. 2**32
#: keeps every cycle sum of the largest run decode allows inside int64 (the op_log's dtype).
MAX_INT = 1 << 32
#: A 1 GiB TCM is 1024 times the default; data mode backs the TCM with host memory.
MAX_TCM_BYTES = 1 << 30
#: A device has at most this many PEs (and channels).
MAX_PES = 1 << 14


@dataclass(frozen=True)
class Key:
    """One key and every fact about it.

    Attributes:
        name: the key, flat and unique across the topology and host tables.
        kind: ``int``, ``float`` or ``str``.
        default: the value when a topology file omits the key; ``None`` for host and model keys, which every
            file gives.
        unit: what one unit of the value is (``"cycles"``, ``"TB/s"``; ``""`` for none).
        doc: one line saying what the key is.
        low: the least value other than 0 (inclusive; 0 means any positive value).
        high: the largest value (inclusive); far above any real machine, so a typo is an error at load time.
        zero: whether 0 is allowed (a free dispatch, an instant hand-off).
        inf: whether ``inf`` is allowed (a float key: unconstrained).
        planned: whether a plan template can depend on it, so it keys the plan cache (topology keys).
        sweep: whether a sweep may vary it.
        choices: the values a ``str`` key may take (empty: any non-empty string).
        bound_text: why ``high`` is the bound, said when a value is above it (``"a fraction of peak"``).
    """

    name: str
    kind: type
    default: Any
    unit: str
    doc: str
    low: float = 0
    high: float = MAX_INT
    zero: bool = False
    inf: bool = False
    planned: bool = False
    sweep: bool = True
    choices: tuple[str, ...] = ()
    bound_text: str = ""

    def range_text(self) -> str:
        """The values allowed, in words (``"0 to 2**32"``, ``"1e-06 to 1e+12, or inf"``, ``"strict_fifo or
        rw_aware"``)."""
        if self.kind is str:
            return " or ".join(f"`{c}`" for c in self.choices) if self.choices else "a non-empty string"
        high = _bound(self.high)
        if self.kind is int:
            low = 0 if self.zero else max(1, math.ceil(self.low))
            text = f"{low} to {high}"
        elif self.low > 0:
            text = f"{'0, or ' if self.zero else ''}{_g(self.low)} to {high}"
        else:
            text = f"{'0' if self.zero else 'above 0'} to {high}"
        return text + (", or inf" if self.inf else "")


def _plainly_fine(key: Key, v: Any) -> bool:
    """Whether ``v`` is already what key ``key`` holds and in its range (a plain int, float or str)."""
    t = type(v)
    if t is int:
        return key.kind is int and (key.low <= v <= key.high and v >= 1 or v == 0 and key.zero)
    if t is float:
        return key.kind is float and (0 < v <= key.high and v >= key.low or v == 0 and key.zero
                                      or v == math.inf and key.inf)
    if t is str:
        return key.kind is str and v != "" and (not key.choices or v in key.choices)
    return False


def _g(x: float) -> str:
    return f"{x:g}"


def _bound(x: float) -> str:
    """A bound as it reads best: a power of two as ``2**n`` (from 2**10), else as ``:g`` would print it."""
    if float(x).is_integer() and x >= 1024 and int(x) & (int(x) - 1) == 0:
        return f"2**{int(x).bit_length() - 1}"
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e5 else _g(x)


def _num(v: float) -> str:
    return f"{v:.3e}" if abs(v) >= 1e15 else repr(v)


def _short(text: str) -> str:
    return text if len(text) <= 60 else text[:57] + "..."


def describe(v: Any) -> str:
    """``v`` and, where it is not what it looks like, its type (``'40'`` is a string in TOML)."""
    if isinstance(v, str):
        return f"the string {_short(repr(v))} (write numbers without quotes)"
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return _num(v)
    return f"{_short(repr(v))} (a {type(v).__name__})"


class KeyTable:
    """The rows of one kind of key (``what``: ``"topology"``, ``"host"`` or ``"model"``), in order.

    Attributes:
        what: the kind, as messages name it ("topology key 'pes' ...").
        rows: the :class:`Key` rows.
        by_name: ``name -> Key``.
        names: every key's name, in order.
        planned: the keys that key the plan cache, in order.
        sweepable: the keys a sweep may vary, in order.
    """

    def __init__(self, what: str, rows: Iterable[Key]):
        self.what = what
        self.rows = tuple(rows)
        self.by_name = {r.name: r for r in self.rows}
        if len(self.by_name) != len(self.rows) or "name" in self.by_name:
            raise ValueError(f"{what} key table: a key appears twice, or 'name' (an identity, not a key) is a row.")
        self.names = tuple(self.by_name)
        self.planned = tuple(r.name for r in self.rows if r.planned)
        self.sweepable = tuple(r.name for r in self.rows if r.sweep)

    def __repr__(self) -> str:
        return f"KeyTable({self.what!r}, {len(self.rows)} keys)"

    def __contains__(self, name: object) -> bool:
        return name in self.by_name

    def with_row(self, row: Key) -> "KeyTable":
        """This table with ``row`` added at its end."""
        return KeyTable(self.what, (*self.rows, row))

    def check(self, name: str, v: Any) -> Any:
        """``v`` as key ``name`` holds it (an int for an int key, numpy scalars and ``2.0`` included; a float
        for a float key; the text for a str key).

        Raises:
            ConfigError: ``v`` of the wrong type, negative, 0 or ``inf`` where the row does not allow it, or
                outside the row's range; the message names the key and the range, not where it came from
                (the caller prefixes that).
        """
        key = self.by_name[name]
        if _plainly_fine(key, v):  # the common case, without building a message
            return v
        label = f"{self.what} key {name!r}"
        if key.kind is str:
            allowed = f"; use one of {', '.join(key.choices)}" if key.choices else ""
            if not isinstance(v, str):
                raise ConfigError(f"{label} must be a string, got {describe(v)}{allowed}.")
            if not v:
                raise ConfigError(f"{label} must be a non-empty string{allowed}.")
            if key.choices and v not in key.choices:
                raise ConfigError(f"{label} is {v!r}; use one of {', '.join(key.choices)}.")
            return v
        given = v
        if key.kind is int:
            v = self._int(key, label, v)
        else:
            v = self._float(key, label, v)
            if math.isinf(v):
                return v
        # a topology message shows the value as written (0, not 0.0); a host's as it holds it
        shown = _num(given if self.what == "topology" and isinstance(given, (int, float)) else v)
        if v < 0:
            raise ConfigError(f"{label} is {shown}; it cannot be negative." if self.what == "topology" else
                              f"{label} is {shown}; it must be {self._sign_word(key)}.")
        if v == 0:
            if key.zero:
                return v
            suffix = " (a zero bandwidth, size or clock makes no machine)" if self.what == "topology" else ""
            raise ConfigError(f"{label} is {shown}; it must be {self._sign_word(key)}{suffix}.")
        if v > key.high and key.bound_text:
            raise ConfigError(f"{label} is {shown}; it is {key.bound_text}, at most {_g(key.high)}.")
        if key.kind is int and v > key.high:
            raise ConfigError(f"{label} is {shown}; the largest value kbwork accepts is {int(key.high)}"
                              f"{'' if _bound(key.high) == str(int(key.high)) else f' ({_bound(key.high)})'}"
                              f"{self._unit(key)}.")
        if v > key.high or v < key.low:
            raise ConfigError(f"{label} is {shown}; it must lie between {_g(key.low)} and {_g(key.high)}"
                              f"{self._unit(key)}.")
        return v

    def _unit(self, key: Key) -> str:
        return f" ({key.unit})" if key.unit and self.what != "topology" else ""

    def _sign_word(self, key: Key) -> str:
        if key.zero:
            return "non-negative"
        return "a positive integer" if key.kind is int and self.what == "model" else "positive"

    def _int(self, key: Key, label: str, v: Any) -> int:
        if isinstance(v, numbers.Integral) and not isinstance(v, bool):
            return int(v)
        if isinstance(v, float) and v.is_integer():
            return int(v)
        if self.what == "topology":
            need = f"an integer number of {key.unit}" if key.unit else "an integer"
        else:
            need = "a non-negative integer" if key.zero else "a positive integer"
        raise ConfigError(f"{label} must be {need}, got {describe(v)}.")

    def _float(self, key: Key, label: str, v: Any) -> float:
        if isinstance(v, bool) or not isinstance(v, numbers.Real) or math.isnan(v) or \
                (math.isinf(v) and (not key.inf or v < 0)):
            allowed = "a positive number or inf (unconstrained)" if key.inf else "a finite number"
            raise ConfigError(f"{label} must be {allowed}, got {describe(v)}.")
        if isinstance(v, Fraction) and Fraction(repr(float(v))) != v:
            # taken as written means as a decimal (DESIGN.md §4): a fraction with no short decimal would be
            # rounded to a float's, silently moving ceil()s by a cycle
            raise ConfigError(f"{label} is Fraction({v.numerator}, {v.denominator}), which has no exact decimal "
                              f"of at most 17 digits; kbwork takes {key.name} as the decimal written (DESIGN.md "
                              f"§4). Give it as a decimal (e.g. {float(v):.6g}).")
        return float(v)

    def markdown(self, defaults: bool = True) -> str:
        """The key table as Markdown: ``| key | default | unit | meaning |`` (``| key | unit | meaning |``
        without ``defaults``), the meaning being the doc, the range and whether the key keys the plan cache
        (topology keys) and may be swept."""
        head = ["key", "default", "unit", "meaning"] if defaults else ["key", "unit", "meaning"]
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for r in self.rows:
            facts = [r.range_text()]
            if self.what == "topology":
                facts.append("keys the plan cache" if r.planned else "not in the plan cache")
            facts.append("sweepable" if r.sweep else "not swept")
            cells = [f"`{r.name}`"]
            if defaults:
                cells.append(f"`{r.default}`" if isinstance(r.default, str) else str(r.default))
            cells += [r.unit or "—", f"{r.doc} — {'; '.join(facts)}"]
            lines.append("| " + " | ".join(cells) + " |")
        return "\n".join(lines)


def key_fields(table: Callable[[], KeyTable]) -> Callable[[type], type]:
    """A class decorator: ``cls`` as a frozen dataclass whose fields are its own ``name`` (first), a field per
    row of ``table()`` (its kind, and its default where the row has one), in the table's order, and its own
    ``source`` (last). A subclass gets a field for every row its bases lack (how a test adds a key).

    Raises:
        ValueError: a row without a default before one with (a dataclass needs defaults last).
    """
    def wrap(cls: type) -> type:
        own = dict(cls.__dict__.get("__annotations__", {}))
        have = {f.name for base in cls.__mro__[1:] if dataclasses.is_dataclass(base) for f in dataclasses.fields(base)}
        rows = [r for r in table().rows if r.name not in have]
        notes: dict[str, Any] = {}
        if "name" in own:
            notes["name"] = own.pop("name")
        notes.update({r.name: r.kind.__name__ for r in rows})
        notes.update(own)  # source, and anything else the class declares
        cls.__annotations__ = notes
        for r in rows:
            if r.default is not None:
                setattr(cls, r.name, r.default)
        return dataclass(frozen=True)(cls)

    return wrap


# --- the tables --------------------------------------------------------------------------------------------
_CYC = "cycles"
TOPOLOGY = KeyTable("topology", (
    Key("clock_ghz", float, 1.25, "GHz", "the PE clock; converts cycles to µs (40 cycles = 32 ns)", low=1e-3,
        high=1e3),
    Key("fixed_cycles", int, 40, "cycles per segment", "FIXED: the fixed part of every dispatch", zero=True),
    Key("r_cycles_per_byte", float, 0.0625, "cycles per logical byte",
        "R: the size-dependent part of a dispatch, read as the exact decimal written", zero=True, high=1e6),
    Key("max_composite_logical_bytes", int, 1024, "bytes",
        "the segment size: a bigger command pays FIXED once per segment"),
    Key("cmd_queue_depth", int, 8, "commands", "commands in flight before PE_CPU stalls (in flight: from its "
        "DISPATCH's start until its last stage ends)"),
    Key("plan_base_cycles", int, 8, _CYC, "the fixed part of a PLAN", zero=True),
    Key("plan_cycles_per_op", int, 2, "cycles per op", "the per-op part of a PLAN", zero=True),
    Key("hazard_policy", str, "strict_fifo", "", "how the scheduler orders commands that touch the same "
        "bytes ([timeline.md](timeline.md#hazards))", choices=("strict_fifo", "rw_aware")),
    Key("p_dtype", str, "fp32", "", "the dtype decode writes P in (the `a` of P·V): `bf16` rounds P when it is "
        "written, as FlashAttention does, and P·V's FETCH reads 2 bytes per element of P; S, m, l and O stay fp32 "
        "([machine.md](machine.md#precision))", choices=("fp32", "bf16")),
    Key("dma_base_cycles", int, 200, _CYC, "the fixed latency of one DMA transfer (its access phase)", zero=True,
        planned=True),
    Key("dma_bytes_per_cycle", int, 64, "bytes per cycle", "DMA bandwidth of one DMA unit", planned=True),
    Key("dma_channels", int, 1, "channels", "DMA units of a PE: transfers in flight at once", planned=True),
    Key("fetch_bytes_per_cycle", int, 128, "bytes per cycle", "FETCH bandwidth from TCM into the MAC array",
        planned=True),
    Key("gemm_base_cycles", int, 16, _CYC, "the fixed part of one GEMM tile", zero=True, planned=True),
    Key("mac_rows", int, 32, "rows", "MAC array height (tm is covered in steps of it)", planned=True),
    Key("mac_cols", int, 32, "columns", "MAC array width (tn is covered in steps of it)", planned=True),
    Key("tile_m", int, 32, "rows", "output tile height", planned=True),
    Key("tile_n", int, 128, "columns", "output tile width", planned=True),
    Key("tile_k", int, 128, "elements", "k-tile depth", planned=True),
    Key("tile_buffers", int, 2, "buffers per operand slot", "staging buffers of the scheduler's ring",
        planned=True),
    Key("math_base_cycles", int, 8, _CYC, "the fixed part of a MATH stage", zero=True, planned=True),
    Key("math_elements_per_cycle", int, 64, "elements per cycle", "MATH vector width", planned=True),
    Key("math_cost_exp", int, 4, "cycles per vector step", "cost factor of exp-class ops (`exp_diff`, "
        "`rms_inv`)", planned=True),
    Key("math_cost_other", int, 1, "cycles per vector step", "cost factor of every other MATH op", planned=True),
    Key("tcm_bytes", int, 1 << 20, "bytes", "TCM capacity of each PE (1 MiB)", high=MAX_TCM_BYTES, planned=True),
    Key("pes", int, 1, "PEs", "PEs on the device, numbered 0..pes−1, each the PE above with its own units, ring "
        "and TCM ([device.md](device.md))", high=MAX_PES),
    Key("hbm_channels", int, 1, "channels", "HBM channels; `pes` must be a multiple of it; PE p's home channel "
        "is `p // (pes / hbm_channels)`", high=MAX_PES),
    Key("channel_bytes_per_cycle", float, math.inf, "bytes per cycle", "each HBM channel's bandwidth, shared by "
        "every transfer on it (the flow rule, [device.md](device.md)); `inf`: unconstrained, every transfer at "
        "its DMA unit's rate", low=1e-6, high=1e12, inf=True, planned=True),
    Key("sync_cycles", int, 0, _CYC, "device-wide signal latency: a launch `after` another starts at least this "
        "long after that one's end ([device.md](device.md#launch-dependencies))", zero=True),
    Key("hbm_gib", float, math.inf, "GiB", "the device's HBM capacity (1 GiB = 2**30 bytes), what a model "
        "step's KV cache must fit in; `inf`: unbounded", low=1e-3, high=1e6, inf=True),
    # energy (DESIGN.md §18): prices of the counts the op_log gives; they never change a cycle, and 0 (a free
    # resource) is allowed
    Key("hbm_pj_per_bit", float, 3.29, "pJ per bit", "energy of a bit a DMA stage moves between HBM and the "
        "PE (base die 3.29, bank group 1.56, bank 0.55)", zero=True, high=1e6),
    Key("tcm_pj_per_byte", float, 1.28, "pJ per byte", "energy of a byte written to or read from TCM (every "
        "DMA stage's bytes and every FETCH's)", zero=True, high=1e6),
    Key("mac_pj", float, 0.32, "pJ per MAC", "energy of one multiply-accumulate of a GEMM's logical m·n·k",
        zero=True, high=1e6),
    Key("math_pj_per_element", float, 0.32, "pJ per element-cost", "energy of one MATH element per unit of "
        "its cost factor", zero=True, high=1e6),
    Key("dispatch_pj_per_cycle", float, 8.0, "pJ per cycle", "energy of a PE_CPU cycle spent dispatching",
        zero=True, high=1e9),
    Key("pe_idle_mw", float, 50.0, "mW", "power every PE draws while the device is powered (leakage, clocks)",
        zero=True, high=1e9),
))

HOST = KeyTable("host", (
    Key("peak_tflops_bf16", float, None, "TFLOP/s", "dense bf16 peak of the GPU", low=1e-3, high=1e5),
    Key("peak_tflops_fp8", float, None, "TFLOP/s", "dense FP8 peak of the GPU: the GEMMs of a step with "
        "`weight_dtype=\"fp8\"` (W8A8) run at it", low=1e-3, high=1e5),
    Key("hbm_tb_s", float, None, "TB/s", "the GPU's HBM peak bandwidth", low=1e-3, high=1e3),
    Key("eta_flops", float, None, "fraction", "the fraction of the FLOP/s peak a GEMM sustains", low=1e-3, high=1,
        bound_text="a fraction of peak"),
    Key("eta_bw", float, None, "fraction", "the fraction of the HBM peak a GEMM streams its weights at",
        low=1e-3, high=1, bound_text="a fraction of peak"),
    Key("launch_us", float, None, "µs", "one kernel launch, added to every GEMM and to the host's attention",
        zero=True, high=1e4),
    Key("handoff_us", float, None, "µs", "host ↔ device latency, once each way per layer (`placement=\"ahbm\"`)",
        zero=True, high=1e4),
    Key("gpu_hbm_gib", float, None, "GiB", "the GPU's memory as CUDA reports it (1 GiB = 2**30 bytes): holds "
        "the weights, and the KV cache under `placement=\"host\"`", low=1e-3, high=1e6),
    Key("attention_bandwidth", str, None, "", "the GPU's measured decode-attention table, a CSV in "
        "`data/measured/` (or a path): eta_attn of `placement=\"host\"`", sweep=False),
    # energy (DESIGN.md §18); named apart from the topology's hbm_pj_per_bit, so sweeping the PE's level never
    # moves the GPU's
    Key("gpu_hbm_pj_per_bit", float, None, "pJ per bit", "energy of a bit the GPU moves to or from its HBM",
        zero=True, high=1e6),
    Key("flop_pj", float, None, "pJ per FLOP", "energy of one bf16 FLOP on the GPU", zero=True, high=1e6),
    Key("idle_w", float, None, "W", "what the GPU draws when powered and idle, for the whole step", zero=True,
        high=1e6),
    Key("busy_w", float, None, "W", "what the GPU draws beyond idle, HBM and FLOP energy while a kernel runs",
        zero=True, high=1e6),
    Key("link_pj_per_bit", float, None, "pJ per bit", "energy of a bit handed between host and device", zero=True,
        high=1e6),
))

MODEL = KeyTable("model", (
    Key("layers", int, None, "", "transformer blocks (`num_hidden_layers`)", high=10_000),
    Key("hidden", int, None, "", "residual width (`hidden_size`)", high=10**6),
    Key("heads", int, None, "", "query heads (`num_attention_heads`)", high=10**6),
    Key("kv_heads", int, None, "", "KV heads (`num_key_value_heads`); `heads` must be a multiple", high=10**6),
    Key("head_dim", int, None, "", "width of a head (`hidden_size / num_attention_heads`)", high=10**6),
    Key("ffn", int, None, "", "SwiGLU intermediate width (`intermediate_size`)", high=10**6),
    Key("vocab", int, None, "", "LM head output width (`vocab_size`)", high=10**6),
    Key("weight_dtype", str, "bf16", "", "the weights' dtype: `fp8` is W8A8 (weights and the GEMMs' activations "
        "1 byte per element, the GEMMs at the host's `peak_tflops_fp8`); optional in a file",
        choices=("bf16", "fp8")),
    Key("kv_dtype", str, "bf16", "", "the KV cache's dtype: `fp8` (e4m3fn) is 1 byte per element on both "
        "placements; optional in a file", choices=("bf16", "fp8")),
))


def sweepable_keys() -> tuple[str, ...]:
    """The topology keys a sweep may vary (both sweeps' topology axes), in table order."""
    return TOPOLOGY.sweepable


def sweepable_host_keys() -> tuple[str, ...]:
    """The host keys a sweep may vary (``model.sweep``'s host axes), in table order."""
    return HOST.sweepable


def check_unique() -> None:
    """Raise ValueError when a key is in both the topology and the host table (a sweep axis names one key)."""
    both = set(TOPOLOGY.names) & set(HOST.names)
    if both:
        raise ValueError(f"keys {sorted(both)} are both topology and host keys; a key name must be unique.")


check_unique()
