"""Topology: every number of the simulated PE, loaded from a TOML file.

``load_topology()`` reads ``data/topology/ahbm-pe-v1.toml`` (or another file),
flattens its sections into one frozen :class:`Topology`, applies keyword
overrides and validates everything, raising :class:`ConfigError` naming the
key at fault.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import numbers
import os
import stat
import tomllib
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from .errors import ConfigError, ValidationError

#: The repository's ``data/`` folder (the package is installed editable).
DATA_DIR = Path(__file__).resolve().parent.parent / "data"
TOPOLOGY_DIR = DATA_DIR / "topology"
DEFAULT_TOPOLOGY = "ahbm-pe-v1"
#: The shipped topologies by name (file paths only; the files are read on every load).
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
    # the device (DESIGN.md §14)
    pes: int = 1
    hbm_channels: int = 1
    channel_bytes_per_cycle: float = math.inf
    hbm_gib: float = math.inf  # the device's HBM, GiB (2**30 bytes): what fits (DESIGN.md §15); inf: unbounded
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
    def channel_fraction(self) -> Fraction | None:
        """A channel's bandwidth as the exact decimal it was written as (bytes per cycle), or None when it is
        unconstrained (``inf``)."""
        v = self.channel_bytes_per_cycle
        return None if math.isinf(v) else exact_fraction(v)

    def home_channel(self, pe: int) -> int:
        """PE ``pe``'s home channel: ``pe // (pes / hbm_channels)`` (DESIGN.md §14).

        Raises:
            ValidationError: ``pe`` is not a PE of this topology (an int in ``0 .. pes - 1``).
        """
        if not isinstance(pe, numbers.Integral) or isinstance(pe, bool) or not 0 <= pe < self.pes:
            raise ValidationError(f"home_channel: PE {pe!r} is not a PE of {self.name} (it has {self.pes}: "
                                  f"0 .. {self.pes - 1}).")
        return int(pe) // (self.pes // self.hbm_channels)

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


def setting_value(key: str, text: str) -> Any:
    """The value of ``--set key=text`` in the type of the topology key: an int for an int key (``2e6`` too), a
    float for a float key, else the text (an unknown key is left to :func:`load_topology`, which suggests the
    key meant).

    Raises:
        ConfigError: text that is not a number where the key takes one, naming ``--set key=text``.
    """
    kind = _FIELDS[key].type if key in _FIELDS else "str"
    if kind == "int":
        try:
            return int(text)
        except ValueError:
            pass
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if value.is_integer():  # 2e6
            return int(value)
        raise ConfigError(f"--set {key}={text}: {key} takes a whole number, got {text!r}.")
    if kind == "float":
        try:
            return float(text)
        except ValueError:
            raise ConfigError(f"--set {key}={text}: {key} takes a number, got {text!r}.") from None
    return text


def apply_settings(topo: Any, settings: Iterable[tuple[str, str]],
                   flags: Mapping[str, tuple[str, Any]] | None = None,
                   refuse: Callable[[str, str], None] | None = None) -> dict[str, Any]:
    """The topology keys a command line sets: ``flags`` (key -> (the flag, its value), e.g. ``--fixed 80``)
    and then every ``--set key=text`` of ``settings`` in order, each checked against ``topo`` as it comes,
    so an error names what set it. ``topo`` is a :class:`Topology` (or anything with its ``replace``, as
    ``kbwork.model.Device``). ``refuse(key, text)``, if given, may refuse a key first (a command's own
    reason).

    Returns:
        ``key -> value``.

    Raises:
        ValidationError: a key set twice (by a flag and ``--set``, or by two ``--set``).
        ConfigError: an unknown key or a bad value, naming ``--set key=text``.
    """
    overrides: dict[str, Any] = {}
    given: dict[str, str] = {}
    for key, (flag, value) in (flags or {}).items():
        overrides[key], given[key] = value, f"{flag} {value}"
    for key, text in settings:
        if key in given:
            raise ValidationError(f"--set {key}={text}: {key} is already set by {given[key]}; give it once.")
        if refuse is not None:
            refuse(key, text)
        overrides[key], given[key] = setting_value(key, text), f"--set {key}={text}"
        try:
            topo = topo.replace(**{key: overrides[key]})
        except ConfigError as exc:
            raise ConfigError(f"--set {key}={text}: {exc}") from None
    return overrides


def _check_keys(d: dict[str, Any], where: str) -> None:
    for key in d:
        if key not in _FIELDS:
            close = difflib.get_close_matches(key, list(_FIELDS), n=3)
            hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
            raise ConfigError(
                f"unknown topology key {key!r} in {where}.{hint} "
                f"Known keys: {', '.join(sorted(_FIELDS))}.")


#: Upper bounds, far above anything a real PE model needs: they turn a typo such as
#: ``fixed_cycles=10**19`` into a ConfigError at load time instead of an int64 overflow deep in a
#: run. 2**32 keeps every cycle sum of the largest run decode allows inside int64 (the op_log's
#: dtype); a 1 GiB TCM is 1024 times the default, and data mode backs the TCM with host memory.
MAX_INT = 1 << 32
MAX_TCM_BYTES = 1 << 30
#: ``(low, high)`` for the float keys; ``low`` is exclusive where zero makes no machine.
FLOAT_RANGES = {"clock_ghz": (1e-3, 1e3), "r_cycles_per_byte": (0.0, 1e6), "channel_bytes_per_cycle": (1e-6, 1e12),
                "hbm_gib": (1e-6, 1e9)}
#: A device has at most this many PEs (and channels).
MAX_PES = 1 << 14
#: Float keys that may be ``inf`` (unconstrained).
_MAY_BE_INF = {"channel_bytes_per_cycle", "hbm_gib"}


def _int_bound(key: str) -> int:
    return MAX_TCM_BYTES if key == "tcm_bytes" else MAX_INT


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
                                  f"got {_describe(v)}.")
        _check_sign(key, v)
        if v > _int_bound(key):
            raise ConfigError(f"topology key {key!r} is {_num(v)}; the largest value kbwork accepts is "
                              f"{_int_bound(key)} (2**{_int_bound(key).bit_length() - 1}).")
    for key in _FLOAT_KEYS:
        v = getattr(t, key)
        if isinstance(v, bool) or not isinstance(v, numbers.Real) or math.isnan(v) or \
                (math.isinf(v) and (key not in _MAY_BE_INF or v < 0)):
            allowed = "a positive number or inf (unconstrained)" if key in _MAY_BE_INF else "a finite number"
            raise ConfigError(f"topology key {key!r} must be {allowed}, got {_describe(v)}.")
        if isinstance(v, Fraction) and exact_fraction(float(v)) != v:
            # taken as written means as a decimal (DESIGN.md §4): a fraction with no short decimal would be
            # rounded to a float's, silently moving ceil()s by a cycle
            raise ConfigError(f"topology key {key!r} is Fraction({v.numerator}, {v.denominator}), which has no exact "
                              f"decimal of at most 17 digits; kbwork takes {key} as the decimal written "
                              f"(DESIGN.md §4). Give it as a decimal (e.g. {float(v):.6g}).")
        object.__setattr__(t, key, float(v))
        v = float(v)
        if math.isinf(v):
            continue
        _check_sign(key, v)
        low, high = FLOAT_RANGES.get(key, (0.0, float(MAX_INT)))
        if v > high or 0 < v < low:
            raise ConfigError(f"topology key {key!r} is {_num(v)}; it must lie between {low:g} and {high:g}.")
    if not isinstance(t.hazard_policy, str):
        raise ConfigError(f"topology key 'hazard_policy' must be a string, got {_describe(t.hazard_policy)}; "
                          f"use one of {', '.join(HAZARD_POLICIES)}.")
    if t.hazard_policy not in HAZARD_POLICIES:
        raise ConfigError(f"topology key 'hazard_policy' is {t.hazard_policy!r}; "
                          f"use one of {', '.join(HAZARD_POLICIES)}.")
    for key in ("pes", "hbm_channels"):
        if getattr(t, key) > MAX_PES:
            raise ConfigError(f"topology key {key!r} is {getattr(t, key)}; a device has at most {MAX_PES}.")
    if t.pes % t.hbm_channels:
        raise ConfigError(f"topology keys 'pes' ({t.pes}) and 'hbm_channels' ({t.hbm_channels}): pes must be a "
                          f"multiple of hbm_channels (each channel is home to pes / hbm_channels PEs).")
    if not isinstance(t.name, str) or not t.name:
        raise ConfigError(f"topology key 'name' must be a non-empty string, got {_describe(t.name)}.")


def _describe(v: Any) -> str:
    """``v`` and, where it is not what it looks like, its type (``'40'`` is a string in TOML)."""
    if isinstance(v, str):
        return f"the string {_short(repr(v))} (write numbers without quotes)"
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return _num(v)
    return f"{_short(repr(v))} (a {type(v).__name__})"


def _num(v: float) -> str:
    return f"{v:.3e}" if abs(v) >= 1e15 else repr(v)


def _short(text: str) -> str:
    return text if len(text) <= 60 else text[:57] + "..."


def did_you_mean(asked: Any, known: Any) -> str:
    """`` (did you mean 'x'?)`` naming the built-in name closest to a misspelt one (``llama3-8b`` ->
    ``llama-3-8b``), or ``""`` when none is close or ``asked`` is a path (a file the user meant to point at)."""
    text = str(asked)
    if "/" in text or "\\" in text or text.endswith(".toml"):
        return ""
    by_lower = {str(k).lower(): k for k in known}  # LLAMA-3-8B means llama-3-8b as much as llama3-8b does
    close = difflib.get_close_matches(text.lower(), list(by_lower), n=1, cutoff=0.6)
    return f" (did you mean {by_lower[close[0]]!r}?)" if close else ""


def _check_sign(key: str, v: float) -> None:
    if v < 0:
        raise ConfigError(f"topology key {key!r} is {_num(v)}; it cannot be negative.")
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


def load_topology(name_or_path: str | os.PathLike[str] | Topology | None = None, **overrides: Any) -> Topology:
    """Load a topology and apply flat keyword overrides.

    The file is read and parsed on every call (a few hundred microseconds):
    nothing is cached, so an edited file is always what you get.

    Args:
        name_or_path: ``None`` for the default ``ahbm-pe-v1``, a name of a file in
            ``data/topology/`` (without ``.toml``), a path to a TOML file, or a
            :class:`Topology` (returned as is, or with the overrides applied).
        **overrides: flat keys such as ``fixed_cycles=80, r_cycles_per_byte=0.1``.

    Returns:
        A frozen, validated :class:`Topology`.

    Raises:
        ConfigError: ``name_or_path`` is of the wrong type; the file is
            missing, a directory, unreadable, not UTF-8 or not valid TOML; a key is
            unknown; or a value is nonsensical (negative cycles, zero bandwidth,
            a string where a number belongs, beyond the bounds in :data:`MAX_INT`).
    """
    if isinstance(name_or_path, Topology):
        return name_or_path.replace(**overrides) if overrides else name_or_path
    if name_or_path is not None and not isinstance(name_or_path, (str, os.PathLike)):
        raise ConfigError(f"topology must be a name (e.g. {DEFAULT_TOPOLOGY!r}), a path to a .toml file or a "
                          f"Topology, got {_short(repr(name_or_path))} (a {type(name_or_path).__name__}).")
    name = DEFAULT_TOPOLOGY if name_or_path is None else name_or_path
    path = _BUILTIN_PATHS.get(name) if isinstance(name, str) else None
    if path is None:
        try:
            path = Path(name)
        except TypeError:  # a PathLike whose __fspath__ gives bytes
            raise ConfigError(f"topology path {name!r} must be text, not bytes.") from None
        if str(name) == "":
            raise ConfigError(f"topology name is empty; use {DEFAULT_TOPOLOGY!r} or a path to a .toml file.")
        if "\0" in str(name):
            raise ConfigError(f"topology {_short(repr(str(name)))} contains a NUL character; no file can have "
                              f"that name.")
        if path.suffix != ".toml" and not exists_quietly(path):
            path = TOPOLOGY_DIR / f"{name}.toml"
    base = _load_file(path, str(name))
    if not overrides:
        return base
    return base.replace(**overrides)


def exists_quietly(path: Path) -> bool:
    """Whether ``path`` exists; False for a name no file system could hold (too long, say) instead of raising."""
    try:
        return path.exists()
    except OSError:
        return False


def read_toml_file(path: Path, what: str, name: str, known: Callable[[], Iterable[str]],
                   known_as: str) -> dict[str, Any]:
    """Read and parse one TOML file (a topology, model or host file): its document.

    ``what`` names the kind of file in messages, ``name`` is what the caller asked for, ``known()`` the
    built-in names and ``known_as`` their plural ("topologies"), for a file that is not found (asked only
    then: listing them may read a directory).

    Raises:
        ConfigError: naming the file, for every way reading or parsing it can fail.
    """
    try:
        st = os.stat(path)
    except FileNotFoundError:
        names = list(known())
        raise ConfigError(f"{what} {_short(repr(name))} not found (looked for {_short(str(path))}). "
                          f"Known {known_as}: {', '.join(names) or 'none'}{did_you_mean(name, names)}; or pass a "
                          f"path to a .toml file.") from None
    except OSError as exc:
        raise ConfigError(f"{_short(str(path))}: cannot read the {what} file: {exc.strerror or exc}.") from None
    if stat.S_ISDIR(st.st_mode):
        raise ConfigError(f"{what} {name!r} is a directory ({path}); pass a .toml file inside it.")
    if not stat.S_ISREG(st.st_mode):  # a pipe or a device would block or read nothing
        raise ConfigError(f"{what} {name!r} ({path}) is not a regular file; pass a .toml file.")
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the {what} file: {exc.strerror or exc}.") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not a UTF-8 text file (byte {exc.start} is {raw[exc.start]:#04x}); "
                          f"TOML files must be UTF-8.") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None


def _load_file(path: Path, name: str) -> Topology:
    """Read, parse and validate one topology file.

    Raises:
        ConfigError: naming the file, for every way reading it can fail.
    """
    doc = read_toml_file(path, "topology", name, lambda: sorted(_BUILTIN_PATHS), "topologies")
    flat = _flatten(doc, str(path))
    _check_keys(flat, where=str(path))
    # a file that names no machine is that file's: its keys over the defaults, not ahbm-pe-v1 itself
    flat.setdefault("name", path.stem)
    try:
        return Topology(**flat, source=os.path.abspath(path))
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
