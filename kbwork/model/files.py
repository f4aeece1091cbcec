"""Model and host files: ``data/models/*.toml`` and ``data/hosts/*.toml`` (DESIGN.md §15).

:func:`load_model` and :func:`load_host` read a file by name or path and
return a frozen, validated :class:`Model` or :class:`Host`. Every mistake is
a :class:`~kbwork.errors.ConfigError` that names the key and the file: an
unknown key (with a "did you mean"), a missing one, a value of the wrong type
or out of range, a model whose heads are not a multiple of its KV heads.
Nothing is cached: an edited file is what the next call reads.
"""

from __future__ import annotations

import dataclasses
import difflib
import numbers
import os
from collections.abc import Mapping
from dataclasses import field
from pathlib import Path
from typing import Any

from .. import keys as _keys
from ..config import DATA_DIR, exists_quietly, read_toml_file
from ..errors import ConfigError, ValidationError

MODELS_DIR = DATA_DIR / "models"
HOSTS_DIR = DATA_DIR / "hosts"
DEFAULT_HOST = "h200"
#: Weights and KV cache are bf16 unless a model says otherwise: 2 bytes per element (DESIGN.md §15).
BYTES_PER_ELEMENT = 2
#: Bytes per element of a model's ``weight_dtype`` and ``kv_dtype`` (DESIGN.md §17).
DTYPE_BYTES = {"bf16": 2, "fp8": 1}


def _short(text: str) -> str:
    return text if len(text) <= 60 else text[:57] + "..."


def _describe(v: Any) -> str:
    if isinstance(v, str):
        return f"the string {_short(repr(v))} (write numbers without quotes)"
    return f"{_short(repr(v))} (a {type(v).__name__})"


def _check_keys(given: Mapping[str, Any], known: tuple[str, ...], what: str, where: str) -> None:
    for key in given:
        if key not in known:
            close = difflib.get_close_matches(str(key), list(known), n=3)
            close.sort(key=list(known).index)  # in the table's order: peak_tflops_bf16 before peak_tflops_fp8
            hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
            raise ConfigError(f"{where}: unknown {what} key {key!r}.{hint} Known keys: {', '.join(known)}.")


def _builtin(directory: Path) -> dict[str, Path]:
    return {p.stem: p.resolve() for p in sorted(directory.glob("*.toml"))} if directory.is_dir() else {}


def _resolve(name_or_path: str | os.PathLike[str], directory: Path, what: str) -> Path:
    """The file a name (``data/<what>s/<name>.toml``) or a path stands for."""
    if isinstance(name_or_path, str):
        if not name_or_path:
            raise ConfigError(f"{what} name is empty; use one of {', '.join(_builtin(directory)) or 'none'} "
                              f"or a path to a .toml file.")
        if "\0" in name_or_path:
            raise ConfigError(f"{what} {_short(repr(name_or_path))} contains a NUL character; no file has that name.")
        known = _builtin(directory)
        if name_or_path in known:
            return known[name_or_path]
    try:
        path = Path(name_or_path)
    except TypeError:
        raise ConfigError(f"{what} path {name_or_path!r} must be text, not bytes.") from None
    if path.suffix != ".toml" and not exists_quietly(path):
        return directory / f"{path}.toml"
    return path


def read_toml(path: Path, what: str, directory: Path, name: Any = None) -> dict[str, Any]:
    """Read one flat TOML file (``what`` is ``"model"`` or ``"host"``; ``name`` as the caller gave it), every
    failure a ConfigError naming it."""
    doc = read_toml_file(path, what, str(path if name is None else name), lambda: _builtin(directory), f"{what}s")
    for key, value in doc.items():
        if isinstance(value, dict):
            raise ConfigError(f"{path}: [{key}] is a section; a {what} file has flat keys only.")
    return doc


@dataclasses.dataclass(frozen=True)
class _Kind:
    """What tells a model file from a host file: all :func:`_load_file` needs to read either."""

    what: str  # "model" or "host", as messages say it
    directory: Path  # where the shipped files are
    keys: tuple[str, ...]  # "name" and the key table's keys, in order
    table: _keys.KeyTable
    make: type  # Model or Host
    accepts: str  # what the public loader takes, for the message refusing anything else
    #: a sentence added to the "missing" message when that key is among the missing ones
    hints: Mapping[str, str] = dataclasses.field(default_factory=dict)


def _load_file(kind: _Kind, name_or_path: Any) -> Any:
    """The ``kind.make`` (a Model or Host) that a name (``<kind.directory>/<name>.toml``) or a path stands for.

    A file that is not a shipped one keeps its path (``path``, shown beside its name), and such a file that takes
    a shipped name must hold that one's values.

    Raises:
        ConfigError: ``name_or_path`` neither text nor a path; no such name or file; the file unreadable, not
            TOML or not flat; a key unknown (with a "did you mean"), missing (every key of ``kind.table``
            without a default, and ``name``), or refused by its row or by the class; a shipped name with other
            values. The message names the key and the file.
    """
    if not isinstance(name_or_path, (str, os.PathLike)):
        raise ConfigError(f"{kind.what} must be {kind.accepts}, got {_describe(name_or_path)}.")
    path = _resolve(name_or_path, kind.directory, kind.what)
    doc = read_toml(path, kind.what, kind.directory, name_or_path)
    where = str(path)
    _check_keys(doc, kind.keys, kind.what, where)
    missing = [k for k in kind.keys if k not in doc and (k == "name" or kind.table.by_name[k].default is None)]
    if missing:
        fix = "".join(kind.hints[k] for k in missing if k in kind.hints)
        raise ConfigError(f"{where}: {kind.what} key{'s' if len(missing) > 1 else ''} "
                          f"{', '.join(map(repr, missing))} missing; a {kind.what} file gives every one of "
                          f"{', '.join(kind.keys)}.{fix}")
    elsewhere = _elsewhere(path, kind.directory)
    obj = kind.make(**doc, source=os.path.abspath(path), path=elsewhere)
    if elsewhere is not None and obj.name in _builtin(kind.directory):
        _not_a_shipped_name(obj, kind, where)
    return obj


def _not_a_shipped_name(obj: Any, kind: _Kind, where: str) -> None:
    """Refuse a file elsewhere that takes a shipped model's or host's name with other values (it would report
    as that one)."""
    shipped = _load_file(kind, obj.name)
    differ = [k for k, v in obj.to_dict().items() if shipped.to_dict()[k] != v]
    if differ:
        raise ConfigError(f"{where}: this {kind.what} file names itself {obj.name!r}, the shipped {kind.what} "
                          f"({kind.directory / (obj.name + '.toml')}), but its {', '.join(differ)} differ from it "
                          f"({', '.join(f'{k} {getattr(obj, k)!r}, not {getattr(shipped, k)!r}' for k in differ)}); "
                          f"give it a name of its own (e.g. name = \"{obj.name}-mine\").")


def _elsewhere(path: Path, directory: Path) -> str | None:
    """``path`` as given when it is not one of ``directory``'s shipped files, else None."""
    try:
        shipped = path.resolve() in set(_builtin(directory).values())
    except OSError:
        shipped = False
    return None if shipped else str(path)


# --- models ------------------------------------------------------------------------------------
#: ``name`` and every model key (:data:`kbwork.keys.MODEL`), in order.
MODEL_KEYS = ("name", *_keys.MODEL.names)


def _check_rows(obj: Any, table: _keys.KeyTable, where: str) -> None:
    """Check every key of ``obj`` (a Model or Host being built) against its row, storing the value as the row
    holds it; then its name."""
    if not isinstance(obj.name, str) or not obj.name:
        raise ConfigError(f"{where}: {table.what} key 'name' must be a non-empty string, got {_describe(obj.name)}.")
    for row in table.rows:
        try:
            v = table.check(row.name, getattr(obj, row.name))
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None
        object.__setattr__(obj, row.name, v)


def _label(name: str, path: str | None) -> str:
    return name if path is None else f"{name} (from {path})"


@_keys.key_fields(lambda: _keys.MODEL)
class Model:
    """The shape of a decoder-only transformer, as one decode step needs it (DESIGN.md §15).

    Attributes:
        name: the model's name.
        layers: transformer blocks.
        hidden: the residual width.
        heads, kv_heads: query heads and KV heads (GQA: ``heads`` a multiple of ``kv_heads``).
        head_dim: the width of one head.
        ffn: the SwiGLU intermediate width (gate and up each hidden -> ffn).
        vocab: the LM head's output width.
        weight_dtype, kv_dtype: ``"bf16"`` (default) or ``"fp8"``: the weights' (W8A8) and the KV cache's
            dtype (DESIGN.md §17).
        source: the file it came from (not part of equality).
        path: the file it came from when that is not a shipped model's (``None`` for a shipped model or one
            built in Python); reports give it beside the name (:attr:`label`). Not part of equality.

    The model keys and their ranges are the rows of :data:`kbwork.keys.MODEL`.
    """

    name: str
    source: str = field(default="<given>", compare=False)
    path: str | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        _check_rows(self, _keys.MODEL, self.source)
        if self.heads % self.kv_heads:
            raise ConfigError(f"{self.source}: model key 'heads' ({self.heads}) is not a multiple of 'kv_heads' "
                              f"({self.kv_heads}); every KV head serves the same number of query heads (GQA).")

    @property
    def label(self) -> str:
        """The name, and the file beside it when the model came from a path that is not a shipped model's
        (``"my-8b (from /tmp/my-8b.toml)"``)."""
        return _label(self.name, self.path)

    @property
    def group(self) -> int:
        """Query heads per KV head: the G of one decode task."""
        return self.heads // self.kv_heads

    def kv_bytes(self, context: int) -> int:
        """Bytes of K and V of one sequence of ``context`` keys in one layer (all KV heads, in ``kv_dtype``).

        Raises:
            ValidationError: ``context`` not a positive int.
        """
        if (context.__class__ is not int and (isinstance(context, bool) or not isinstance(context, numbers.Integral))) \
                or context <= 0:  # a plain int tested first: the abstract-class test is a Python-level call
            raise ValidationError(f"Model.kv_bytes: context must be a positive int (a KV length), got {context!r} "
                                  f"({type(context).__name__}).")
        return 2 * self.kv_heads * int(context) * self.head_dim * DTYPE_BYTES[self.kv_dtype]

    @property
    def weight_bytes_per_element(self) -> int:
        """Bytes per weight (and per GEMM activation element): 2 in bf16, 1 in fp8 (W8A8)."""
        return DTYPE_BYTES[self.weight_dtype]

    @property
    def kv_bytes_per_element(self) -> int:
        """Bytes per element of the KV cache: 2 in bf16, 1 in fp8."""
        return DTYPE_BYTES[self.kv_dtype]

    def replace(self, **changes: Any) -> "Model":
        """A copy with ``changes`` applied (validated like a file).

        Raises:
            ConfigError: an unknown key or a bad value.
        """
        _check_keys(changes, MODEL_KEYS, "model", f"{self.name} (replace)")
        return dataclasses.replace(self, **changes, source=f"{self.source} (replaced {', '.join(changes)})")

    def to_dict(self) -> dict[str, Any]:
        """The model keys as a plain dict."""
        return {k: getattr(self, k) for k in ("name", *_keys.MODEL.names)}

    def __repr__(self) -> str:
        return (f"Model({self.label!r}: {self.layers} layers, hidden {self.hidden}, {self.heads} heads / "
                f"{self.kv_heads} KV heads x {self.head_dim}, FFN {self.ffn}, vocab {self.vocab}"
                + "".join(f", {what} {d}" for what, d in (("weights", self.weight_dtype), ("KV", self.kv_dtype))
                          if d != "bf16") + ")")


_MODEL = _Kind("model", MODELS_DIR, MODEL_KEYS, _keys.MODEL, Model,
               "a name (e.g. 'llama-3-8b'), a path to a .toml file or a Model")


def load_model(name_or_path: str | os.PathLike[str] | Model = "llama-3-8b") -> Model:
    """Load a model by name (``data/models/<name>.toml``) or path; a :class:`Model` is returned as is.

    A model from a path that is not a shipped model's keeps it (:attr:`Model.path`, shown beside its name), and
    such a file that takes a shipped model's name must hold that model's values.

    Raises:
        ConfigError: no such model or file ("no such file: PATH" for a path); the file unreadable or not TOML;
            a key unknown (with a "did you mean"), missing, of the wrong type or outside its range
            (:data:`kbwork.keys.MODEL`); ``heads`` not a multiple of ``kv_heads``; a shipped name with other
            values. The message names the key and the file.
    """
    return name_or_path if isinstance(name_or_path, Model) else _load_file(_MODEL, name_or_path)


def with_dtypes(m: Model, weight_dtype: str | None, kv_dtype: str | None) -> Model:
    """``m`` with its ``weight_dtype`` and ``kv_dtype`` replaced by those given (``None``: keep the model's).

    Raises:
        ConfigError: a dtype other than ``"bf16"`` and ``"fp8"``, naming the key.
    """
    changes = {k: v for k, v in (("weight_dtype", weight_dtype), ("kv_dtype", kv_dtype))
               if v is not None and v != getattr(m, k)}
    return m.replace(**changes) if changes else m


# --- hosts -------------------------------------------------------------------------------------
#: ``name`` and every host key (:data:`kbwork.keys.HOST`), in order.
HOST_KEYS = ("name", *_keys.HOST.names)
MEASURED_DIR = DATA_DIR / "measured"


def attention_table_path(value: str) -> Path:
    """The file a host's ``attention_bandwidth`` names: a bare file name is one in ``data/measured/``, anything
    else a path."""
    p = Path(value)
    return MEASURED_DIR / p if p.parent == Path(".") else p


@_keys.key_fields(lambda: _keys.HOST)
class Host:
    """The GPU beside the device: its GEMM roofline, its memory and the hand-off to the device (DESIGN.md §15).

    Attributes:
        name: the host's name.
        peak_tflops_bf16: dense bf16 peak, TFLOP/s.
        peak_tflops_fp8: dense FP8 peak, TFLOP/s (the GEMMs of W8A8 weights, DESIGN.md §17).
        hbm_tb_s: HBM peak bandwidth, TB/s.
        eta_flops, eta_bw: the fractions of those peaks a GEMM sustains.
        launch_us: the cost of one kernel launch, added to every GEMM (and host attention).
        handoff_us: host <-> device latency, once each way per layer (placement ``"ahbm"``).
        gpu_hbm_gib: the GPU's memory, GiB (what the weights, and under ``placement="host"`` the KV cache, must
            fit in).
        attention_bandwidth: the host's measured decode-attention table (a CSV in ``data/measured/`` or a
            path), which ``placement="host"`` reads eta_attn from.
        source: where the values came from (not part of equality).
        path: the file it came from when that is not a shipped host's (shown beside its name, :attr:`label`).

    The host keys and their ranges are the rows of :data:`kbwork.keys.HOST`.
    """

    name: str
    source: str = field(default="<given>", compare=False)
    path: str | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        _check_rows(self, _keys.HOST, self.source)
        table = attention_table_path(self.attention_bandwidth)
        if table.suffix != ".csv" or not exists_quietly(table):
            known = ", ".join(sorted(p.name for p in MEASURED_DIR.glob("*.csv")))
            raise ConfigError(f"{self.source}: host key 'attention_bandwidth' is {self.attention_bandwidth!r}: no "
                              f"such table ({table}). Give the host's own measured decode-attention table, a .csv "
                              f"in data/measured/ (there: {known}) or a path.")

    @property
    def label(self) -> str:
        """The name, and the file beside it when the host came from a path that is not a shipped host's."""
        return _label(self.name, self.path)

    @property
    def peak_flops(self) -> float:
        """Peak bf16 FLOP/s."""
        return self.peak_tflops_bf16 * 1e12

    @property
    def peak_flops_fp8(self) -> float:
        """Peak FP8 FLOP/s."""
        return self.peak_tflops_fp8 * 1e12

    def peak_flops_of(self, weight_dtype: str) -> float:
        """Peak FLOP/s of a GEMM whose weights are ``weight_dtype`` (``"bf16"`` or ``"fp8"``, W8A8)."""
        return self.peak_flops_fp8 if weight_dtype == "fp8" else self.peak_flops

    @property
    def hbm_bytes_per_s(self) -> float:
        """Peak HBM bytes per second."""
        return self.hbm_tb_s * 1e12

    @property
    def hbm_bytes(self) -> float:
        """The host's HBM capacity, bytes (``gpu_hbm_gib`` x 2**30)."""
        return self.gpu_hbm_gib * 2 ** 30

    @property
    def launch_s(self) -> float:
        """One kernel launch, seconds."""
        return self.launch_us * 1e-6

    @property
    def handoff_s(self) -> float:
        """One hand-off, seconds."""
        return self.handoff_us * 1e-6

    def replace(self, **changes: Any) -> "Host":
        """A copy with ``changes`` applied (validated like a file).

        Raises:
            ConfigError: an unknown key (with a "did you mean") or a bad value.
        """
        _check_keys(changes, HOST_KEYS, "host", f"host {self.name!r} (override)")
        return dataclasses.replace(self, **changes, source=f"{self.source} with {', '.join(changes)} overridden")

    def to_dict(self) -> dict[str, Any]:
        """The host keys as a plain dict."""
        return {k: getattr(self, k) for k in ("name", *_keys.HOST.names)}

    def __repr__(self) -> str:
        return (f"Host({self.label!r}: {self.peak_tflops_bf16:g} TFLOP/s bf16 x {self.eta_flops:g}, "
                f"{self.hbm_tb_s:g} TB/s x {self.eta_bw:g}, launch {self.launch_us:g} us, "
                f"handoff {self.handoff_us:g} us, HBM {self.gpu_hbm_gib:g} GiB)")


_HOST = _Kind("host", HOSTS_DIR, HOST_KEYS, _keys.HOST, Host,
              "a name (e.g. 'h200'), a path to a .toml file, a mapping of host keys or a Host",
              {"attention_bandwidth": " attention_bandwidth names the host's own measured decode-attention table "
               "(a CSV in data/measured/, e.g. attention_bandwidth = \"h200_decode_attention_bandwidth.csv\" for an "
               "H200); kbwork never lends one host's table to another."})


def load_host(name_or_mapping: str | os.PathLike[str] | Mapping[str, Any] | Host | None = None) -> Host:
    """Load a host: a name (``data/hosts/<name>.toml``), a path, a :class:`Host`, or a mapping of host keys
    applied over ``h200``'s (``{"handoff_us": 5}``); ``None`` is ``h200``.

    A mapping that names another host (``{"name": "h100", ...}``) must give its own ``attention_bandwidth``: a
    GPU's measured decode attention is its own, never the H200's by default. A host from a path that is not a
    shipped host's keeps it (:attr:`Host.path`, shown beside its name), and such a file that takes a shipped
    host's name must hold that host's values.

    Raises:
        ConfigError: no such host or file ("no such file: PATH" for a path); the file unreadable or not TOML;
            a key unknown (with a "did you mean"), missing from a file, not a finite number or outside its
            range (:data:`kbwork.keys.HOST`: zero is allowed for ``launch_us`` and ``handoff_us`` only, the
            two efficiencies are at most 1); an ``attention_bandwidth`` that names no table, or missing from a
            mapping that renames the host; a shipped name with other values. The message names the key and the
            file.
    """
    if isinstance(name_or_mapping, Host):
        return name_or_mapping
    if name_or_mapping is None:
        name_or_mapping = DEFAULT_HOST
    if isinstance(name_or_mapping, Mapping):
        base = load_host(DEFAULT_HOST)
        over = dict(name_or_mapping)
        if over.get("name", base.name) != base.name and "attention_bandwidth" not in over:
            raise ConfigError(f"host {over['name']!r} (a mapping over {base.name}'s keys) gives no "
                              f"attention_bandwidth: its measured decode-attention table is its own, not the "
                              f"{base.name}'s. Add \"attention_bandwidth\": \"<table>.csv\" (a CSV in "
                              f"data/measured/, or a path), or leave out \"name\" for a variant of {base.name}.")
        return base.replace(**over) if over else base
    return _load_file(_HOST, name_or_mapping)
