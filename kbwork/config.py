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
from dataclasses import field
from fractions import Fraction
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from . import keys as _keys
from .errors import ConfigError, ValidationError
from .keys import MAX_INT, MAX_PES, MAX_TCM_BYTES  # noqa: F401 (their home was here: cli and decode read them)

#: The repository's ``data/`` folder (the package is installed editable).
DATA_DIR = Path(__file__).resolve().parent.parent / "data"
TOPOLOGY_DIR = DATA_DIR / "topology"
DEFAULT_TOPOLOGY = "ahbm-pe-v1"
#: The shipped topologies by name (file paths only; the files are read on every load).
_BUILTIN_PATHS: dict[str, Path] = ({p.stem: p.resolve() for p in sorted(TOPOLOGY_DIR.glob("*.toml"))}
                                   if TOPOLOGY_DIR.is_dir() else {})

HAZARD_POLICIES = _keys.TOPOLOGY.by_name["hazard_policy"].choices


@_keys.key_fields(lambda: _keys.TOPOLOGY)
class Topology:
    """The simulated machine. All times in cycles; see DESIGN.md §1 and §4.

    Its fields are ``name``, then one per row of :data:`kbwork.keys.TOPOLOGY` (every topology key, with its
    default, in the table's order: ``clock_ghz``, ``fixed_cycles``, ... ``pes``, ``hbm_channels``,
    ``channel_bytes_per_cycle``, ``hbm_gib``), then ``source``; frozen.
    """

    name: str = DEFAULT_TOPOLOGY
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

    @property
    def alone_rate(self) -> Fraction:
        """The DMA rule's rate of a transfer alone on its channel (DESIGN.md §14): ``min(dma_bytes_per_cycle,
        channel_bytes_per_cycle)`` bytes per cycle, exact (the channel's as written). While k flows share a
        channel each advances ``min(dma_bytes_per_cycle, channel_bytes_per_cycle / k)``; alone, k = 1."""
        ch = self.channel_fraction
        dma = Fraction(self.dma_bytes_per_cycle)
        return dma if ch is None or ch >= dma else ch

    def dma_alone_cycles(self, nbytes: int) -> int:
        """A DMA transfer of ``nbytes`` alone on its channel: ``dma_base_cycles + ceil(nbytes / alone_rate)``."""
        rate = self.alone_rate
        return self.dma_base_cycles + -(-nbytes * rate.denominator // rate.numerator)

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


def sweepable_keys() -> tuple[str, ...]:
    """The topology keys a sweep may vary (the topology axes of ``decode.sweep`` and ``model.sweep``), in the key
    table's order (:data:`kbwork.keys.TOPOLOGY`)."""
    return _keys.TOPOLOGY.sweepable


def planned_keys() -> tuple[str, ...]:
    """The topology keys a plan template can depend on, so they key the plan cache (the rest act in the
    scheduler's loop and the timeline, or are capacities no plan reads)."""
    return _keys.TOPOLOGY.planned


def key_range(key: str) -> tuple[Any, Any]:
    """``(least value, largest value)`` of a numeric topology key, 0 where it may be 0 (ints for an int key):
    what the command line's flag for it takes.

    Raises:
        KeyError: no such topology key.
    """
    row = _keys.TOPOLOGY.by_name[key]
    low = 0 if row.zero else (max(1, math.ceil(row.low)) if row.kind is int else row.low)
    return (int(low), int(row.high)) if row.kind is int else (float(low), float(row.high))


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
    row = _keys.TOPOLOGY.by_name.get(key)
    kind = row.kind if row is not None else str
    if kind is int:
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
    if kind is float:
        try:
            return float(text)
        except ValueError:
            raise ConfigError(f"--set {key}={text}: {key} takes a number, got {text!r}.") from None
    return text


def apply_settings(topo: Any, settings: Iterable[tuple[str, str]],
                   flags: Mapping[str, tuple[str, Any]] | None = None,
                   refuse: Callable[[str, str], None] | None = None) -> dict[str, Any]:
    """The topology keys a command line sets: ``flags`` (key -> (the flag, its value), e.g. ``--fixed 80``)
    and every ``--set key=text`` of ``settings``. Each value is checked alone as it comes (its key known, its
    type and range), then all of them are applied to ``topo`` together and the whole is validated once, so
    the order of ``--set`` does not matter (``--set pes=8 --set hbm_channels=2`` on a 96-channel device works
    either way) and an error names what set each key at fault. ``topo`` is a :class:`Topology` (or anything
    with its ``replace``, as ``kbwork.model.Device``). ``refuse(key, text)``, if given, may refuse a key first
    (a command's own reason). ``name`` is not a setting: it names the topology.

    Returns:
        ``key -> value``.

    Raises:
        ValidationError: a key set twice (by a flag and ``--set``, or by two ``--set``).
        ConfigError: an unknown key, ``name``, a bad value (naming ``--set key=text``), or keys that do not
            go together (naming every one of them the command line set).
    """
    overrides: dict[str, Any] = {}
    given: dict[str, str] = {}
    for key, (flag, value) in (flags or {}).items():
        overrides[key], given[key] = value, f"{flag} {value}"
    for key, text in settings:
        where = f"--set {key}={text}"
        if key in given:
            raise ValidationError(f"{where}: {key} is already set by {given[key]}; give it once.")
        if refuse is not None:
            refuse(key, text)
        if key == "name":
            raise ConfigError(f"{where}: name is not a setting; it names the topology (its file). To describe "
                              f"another machine, copy the topology's TOML file, change what differs (its name "
                              f"too) and pass its path.")
        try:
            _check_keys({key: None}, where="--set")
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None
        overrides[key], given[key] = setting_value(key, text), where
        try:
            _keys.TOPOLOGY.check(key, overrides[key])
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None
    try:
        topo.replace(**overrides)
    except ConfigError as exc:
        at_fault = [given[k] for k in getattr(exc, "keys", ()) if k in given] or list(given.values())
        raise ConfigError(f"{', '.join(at_fault)}: {exc}") from None
    return overrides


def _check_keys(d: dict[str, Any], where: str) -> None:
    table = _keys.TOPOLOGY
    for key in d:
        if key not in table and key != "name":
            known = ["name", *table.names]
            close = difflib.get_close_matches(key, known, n=3)
            hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
            raise ConfigError(
                f"unknown topology key {key!r} in {where}.{hint} "
                f"Known keys: {', '.join(sorted(known))}.")


def _refuse(message: str, *keys: str) -> ConfigError:
    """A ConfigError about ``keys`` together, which says so in its ``keys`` (so a command line can name what
    set each)."""
    exc = ConfigError(message)
    exc.keys = keys  # type: ignore[attr-defined]
    return exc


def _validate(t: Topology) -> None:
    table = _keys.TOPOLOGY
    for row in table.rows:
        v = getattr(t, row.name)
        ok = table.check(row.name, v)
        if ok is not v:  # numpy integers from a sweep, 2.0 for an int key, an int for a float key
            object.__setattr__(t, row.name, ok)
    if t.pes % t.hbm_channels:
        raise _refuse(f"topology keys 'pes' ({t.pes}) and 'hbm_channels' ({t.hbm_channels}): pes must be a "
                      f"multiple of hbm_channels (each channel is home to pes / hbm_channels PEs).",
                      "pes", "hbm_channels")
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
    if _looks_like_path(text):
        return ""
    by_lower = {str(k).lower(): k for k in known}  # LLAMA-3-8B means llama-3-8b as much as llama3-8b does
    close = difflib.get_close_matches(text.lower(), list(by_lower), n=1, cutoff=0.6)
    return f" (did you mean {by_lower[close[0]]!r}?)" if close else ""


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

    The file is read on every call, so an edited file is always what you get;
    it is parsed and validated only when its bytes differ from every earlier
    read of that path (:func:`_load_file`'s cache is keyed by the path and the
    file's content, and holds frozen Topologies only).

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


def _looks_like_path(name: Any) -> bool:
    """Whether what the user asked for names a file (a separator or ``.toml`` in it) rather than a built-in."""
    text = str(name)
    return "/" in text or "\\" in text or text.endswith(".toml")


def exists_quietly(path: Path) -> bool:
    """Whether ``path`` exists; False for a name no file system could hold (too long, say) instead of raising."""
    try:
        return path.exists()
    except OSError:
        return False


def read_toml_file(path: Path, what: str, name: str, known: Callable[[], Iterable[str]],
                   known_as: str, *, parse: bool = True) -> Any:
    """Read and parse one TOML file (a topology, model or host file): its document (``parse=False``: its text,
    for :func:`parse_toml` to parse).

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
        if _looks_like_path(name):  # the user named a file: say so first
            raise ConfigError(f"no such file: {path} (the {what} {_short(repr(name))}). Known {known_as}: "
                              f"{', '.join(names) or 'none'}; or pass the path of a .toml file that exists.") from None
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
    if not parse:
        return text
    return parse_toml(text, path)


def parse_toml(text: str, path: Path) -> dict[str, Any]:
    """``text``, the content of the file ``path``, as a TOML document.

    Raises:
        ConfigError: naming the file, when the text is not valid TOML.
    """
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None


#: Topologies already made from a file, by (absolute path, content, class, key table): parsing and validating a
#: file is most of a short run's set-up, and a Topology is frozen, so one made from the same bytes at the same path
#: serves.
_LOADED: dict[tuple, Topology] = {}
_LOADED_MAX = 64


def _load_file(path: Path, name: str) -> Topology:
    """Read, parse and validate one topology file (parsed again only when its path or content is new).

    Raises:
        ConfigError: naming the file, for every way reading it can fail.
    """
    text = read_toml_file(path, "topology", name, lambda: sorted(_BUILTIN_PATHS), "topologies", parse=False)
    # (the class and the key table too: a Topology is made from the file by both, and a test may widen them)
    key = (os.path.abspath(path), text, Topology, _keys.TOPOLOGY)
    hit = _LOADED.get(key)
    if hit is not None:
        return hit
    topo = _make_topology(parse_toml(text, path), path)
    if len(_LOADED) >= _LOADED_MAX:  # the oldest goes first (dicts keep insertion order)
        del _LOADED[next(iter(_LOADED))]
    _LOADED[key] = topo
    return topo


def _make_topology(doc: dict[str, Any], path: Path) -> Topology:
    flat = _flatten(doc, str(path))
    _check_keys(flat, where=str(path))
    # a file that names no machine is that file's: its keys over the defaults, not ahbm-pe-v1 itself
    flat.setdefault("name", path.stem)
    try:
        return Topology(**flat, source=os.path.abspath(path))
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
