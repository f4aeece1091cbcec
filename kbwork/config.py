"""Topology: every number of the simulated PE, loaded from a TOML file.

``load_topology()`` reads ``data/topology/ahbm-pe-v1.toml`` (or another file),
flattens its sections into one frozen :class:`Topology`, applies keyword
overrides and validates everything, raising :class:`ConfigError` naming the
key at fault.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import numbers
import os
import stat
import tomllib
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

from .errors import ConfigError

#: The repository's ``data/`` folder (the package is installed editable).
DATA_DIR = Path(__file__).resolve().parent.parent / "data"
TOPOLOGY_DIR = DATA_DIR / "topology"
DEFAULT_TOPOLOGY = "ahbm-pe-v1"
#: The shipped topologies by name, resolved once (a run looks its topology up every time).
_BUILTIN_PATHS: dict[str, Path] = ({p.stem: p.resolve() for p in sorted(TOPOLOGY_DIR.glob("*.toml"))}
                                   if TOPOLOGY_DIR.is_dir() else {})

HAZARD_POLICIES = ("strict_fifo", "rw_aware")


@dataclass(frozen=True)
class Topology:
    """The simulated machine. All times in cycles; see DESIGN.md §1 and §4."""

    name: str = DEFAULT_TOPOLOGY
    clock_ghz: float = 1.25
    # dispatch (PE_CPU)
    fixed_cycles: int = 40
    r_cycles_per_byte: float = 0.0625
    max_composite_logical_bytes: int = 1024
    cmd_queue_depth: int = 8
    # PE_SCHEDULER
    plan_base_cycles: int = 8
    plan_cycles_per_op: int = 2
    hazard_policy: str = "strict_fifo"
    # PE_DMA
    dma_base_cycles: int = 200
    dma_bytes_per_cycle: int = 64
    dma_channels: int = 1
    # PE_GEMM
    fetch_bytes_per_cycle: int = 128
    gemm_base_cycles: int = 16
    mac_rows: int = 32
    mac_cols: int = 32
    tile_m: int = 32
    tile_n: int = 128
    tile_k: int = 128
    tile_buffers: int = 2
    # PE_MATH
    math_base_cycles: int = 8
    math_elements_per_cycle: int = 64
    math_cost_exp: int = 4
    math_cost_other: int = 1
    # memory
    tcm_bytes: int = 1 << 20
    source: str = field(default="<defaults>", compare=False)

    def __post_init__(self) -> None:
        _validate(self)

    def replace(self, **overrides: Any) -> "Topology":
        """Return a copy with ``overrides`` applied (flat keys).

        Raises:
            ConfigError: an unknown key or a nonsensical value.
        """
        _check_keys(overrides, where="override")
        return dataclasses.replace(self, **overrides)

    @property
    def r_fraction(self) -> Fraction:
        """R as the exact decimal it was written as (``0.1`` is 1/10, not
        0.1000000000000000055...), so ``ceil(R x bytes)`` has no float
        surprises."""
        return exact_fraction(self.r_cycles_per_byte)

    def cycles_to_us(self, cycles: float) -> float:
        """Convert cycles to microseconds at this topology's clock."""
        return cycles / (self.clock_ghz * 1e3)

    def to_dict(self) -> dict[str, Any]:
        """Every setting as a flat dict (what ``replace`` accepts)."""
        d = dataclasses.asdict(self)
        d.pop("source")
        return d

    def __repr__(self) -> str:
        return (f"Topology({self.name!r}, FIXED={self.fixed_cycles}, R={self.r_cycles_per_byte}, "
                f"clock={self.clock_ghz} GHz, tiles={self.tile_m}x{self.tile_n}x{self.tile_k}, "
                f"TCM={self.tcm_bytes} B, hazards={self.hazard_policy})")


_FIELDS = {f.name: f for f in dataclasses.fields(Topology) if f.name != "source"}
_INT_KEYS = {n for n, f in _FIELDS.items() if f.type == "int"}
_FLOAT_KEYS = {n for n, f in _FIELDS.items() if f.type == "float"}
# Keys whose value may be zero (a free dispatch, say); every other number must be > 0.
_MAY_BE_ZERO = {"fixed_cycles", "r_cycles_per_byte", "plan_base_cycles", "plan_cycles_per_op",
                "dma_base_cycles", "gemm_base_cycles", "math_base_cycles"}


def exact_fraction(x: float | int | Fraction) -> Fraction:
    """``x`` as the exact decimal it prints as (``0.1`` is 1/10); ``float()`` so numpy scalars print plainly."""
    return Fraction(repr(float(x))) if isinstance(x, float) else Fraction(x)


def _check_keys(d: dict[str, Any], where: str) -> None:
    for key in d:
        if key not in _FIELDS:
            close = difflib.get_close_matches(key, list(_FIELDS), n=3)
            hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
            raise ConfigError(
                f"unknown topology key {key!r} in {where}.{hint} "
                f"Known keys: {', '.join(sorted(_FIELDS))}.")


def _validate(t: Topology) -> None:
    for key in _INT_KEYS:
        v = getattr(t, key)
        if isinstance(v, numbers.Integral) and not isinstance(v, (bool, int)):
            object.__setattr__(t, key, int(v))  # numpy integers from a sweep
            v = int(v)
        if isinstance(v, bool) or not isinstance(v, int):
            if isinstance(v, float) and v.is_integer():
                object.__setattr__(t, key, int(v))
                v = int(v)
            else:
                raise ConfigError(f"topology key {key!r} must be an integer number of cycles/bytes, "
                                  f"got {v!r}.")
        _check_sign(key, v)
    for key in _FLOAT_KEYS:
        v = getattr(t, key)
        if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v):
            raise ConfigError(f"topology key {key!r} must be a finite number, got {v!r}.")
        object.__setattr__(t, key, float(v))
        v = float(v)
        _check_sign(key, v)
    if t.hazard_policy not in HAZARD_POLICIES:
        raise ConfigError(f"topology key 'hazard_policy' is {t.hazard_policy!r}; "
                          f"use one of {', '.join(HAZARD_POLICIES)}.")
    if not isinstance(t.name, str) or not t.name:
        raise ConfigError("topology key 'name' must be a non-empty string.")


def _check_sign(key: str, v: float) -> None:
    if v < 0:
        raise ConfigError(f"topology key {key!r} is {v}; it cannot be negative.")
    if v == 0 and key not in _MAY_BE_ZERO:
        raise ConfigError(f"topology key {key!r} is 0; it must be positive "
                          f"(a zero bandwidth, size or clock makes no machine).")


def _flatten(doc: dict[str, Any], path: str) -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in doc.items():
        items = value.items() if isinstance(value, dict) else [(key, value)]
        for k, v in items:
            if isinstance(v, dict):
                raise ConfigError(f"{path}: section [{key}.{k}] is nested too deep; "
                                  f"use one level of [section] with flat keys.")
            if k in flat:
                raise ConfigError(f"{path}: key {k!r} appears twice; keys must be unique across sections.")
            flat[k] = v
    return flat


def load_topology(name_or_path: str | Path | None = None, **overrides: Any) -> Topology:
    """Load a topology and apply flat keyword overrides.

    Args:
        name_or_path: ``None`` for the default ``ahbm-pe-v1``, a name of a file in
            ``data/topology/`` (without ``.toml``), or a path to a TOML file.
        **overrides: flat keys such as ``fixed_cycles=80, r_cycles_per_byte=0.1``.

    Returns:
        A frozen, validated :class:`Topology`.

    Raises:
        ConfigError: the file is missing or malformed, a key is unknown, or a
            value is nonsensical (negative cycles, zero bandwidth, ...).
    """
    if isinstance(name_or_path, Topology):
        return name_or_path.replace(**overrides) if overrides else name_or_path
    name = DEFAULT_TOPOLOGY if name_or_path is None else name_or_path
    path = _BUILTIN_PATHS.get(name) if isinstance(name, str) else None
    if path is None:
        path = Path(name)
        if path.suffix != ".toml" and not path.exists():
            path = TOPOLOGY_DIR / f"{name}.toml"
        path = path.resolve()
    try:
        st = os.stat(path)
        mtime = st.st_mtime_ns if stat.S_ISREG(st.st_mode) else None
    except OSError:
        mtime = None
    if mtime is None:
        known = sorted(p.stem for p in TOPOLOGY_DIR.glob("*.toml")) if TOPOLOGY_DIR.is_dir() else []
        raise ConfigError(f"topology {str(name)!r} not found (looked for {path}). "
                          f"Known topologies: {', '.join(known) or 'none'}; or pass a path to a .toml file.")
    base = _load_file(str(path), mtime)
    if not overrides:
        return base
    return base.replace(**overrides)


@functools.lru_cache(maxsize=32)
def _load_file(path: str, mtime_ns: int) -> Topology:
    """Parse and validate a topology file (cached until the file changes)."""
    try:
        doc = tomllib.loads(Path(path).read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    flat = _flatten(doc, path)
    _check_keys(flat, where=path)
    return Topology(**flat, source=path)
