"""The host side of a decode step: one GEMM's roofline, a layer's GEMMs, and the GPU-only attention.

Every formula is DESIGN.md §15's:

* a GEMM of ``B`` rows from ``n_in`` to ``n_out`` takes
  ``max(2·B·n_in·n_out / (peak_flops·eta_flops),
  (n_in·n_out + B·(n_in + n_out))·bytes / (hbm_bytes_per_s·eta_bw)) + launch_s``,
  and it is bound by the side that is larger ("host flops" or "host bandwidth"; a tie is bandwidth);
  bytes is 2 per element in bf16; with the model's ``weight_dtype="fp8"`` (W8A8, DESIGN.md §17) it is 1
  and the peak is the host's ``peak_tflops_fp8``;
* per layer: QKV (hidden -> (heads + 2·kv_heads)·head_dim), O (heads·head_dim -> hidden),
  FFN up (hidden -> 2·ffn, gate and up fused), FFN down (ffn -> hidden); once per step the LM head
  (hidden -> vocab);
* attention on the host (``placement="host"``), per layer:
  ``KV bytes / (hbm_bytes_per_s · eta_attn) + launch_s`` (KV bytes in the model's ``kv_dtype``: fp8 streams
  half the bytes at the same measured fraction of peak, an assumption), with eta_attn interpolated in log2(context)
  between the measured points of the host's ``attention_bandwidth`` table (the H200's:
  ``data/measured/h200_decode_attention_bandwidth.csv``).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import pandas as pd

from ..errors import ValidationError
from .checks import check_contexts
from .files import BYTES_PER_ELEMENT, DTYPE_BYTES, Host, Model, attention_table_path, load_host, load_model

HOST_FLOPS = "host flops"
HOST_BANDWIDTH = "host bandwidth"

#: The phases of one layer on the host, in order, and their GEMM shapes (see :func:`layer_gemms`).
LAYER_GEMMS = ("QKV", "O", "FFN up", "FFN down")
LM_HEAD = "LM head"


@dataclass(frozen=True, slots=True)
class Gemm:
    """One GEMM on the host, timed by the roofline.

    Attributes:
        name: the phase it is (``"QKV"``, ``"O"``, ``"FFN up"``, ``"FFN down"``, ``"LM head"``).
        rows, n_in, n_out: the activation rows (the batch, or a half of it) and the weight's shape.
        flops_s: ``2·rows·n_in·n_out / (peak_flops·eta_flops)``.
        bytes_s: ``(n_in·n_out + rows·(n_in + n_out))·2 / (hbm_bytes_per_s·eta_bw)``.
        launch_s: the launch added on top.
        seconds: ``max(flops_s, bytes_s) + launch_s``.
        bound: ``"host flops"`` when ``flops_s > bytes_s``, else ``"host bandwidth"``.
        dtype: ``"bf16"``, or ``"fp8"`` (W8A8: 1 byte per weight and activation element, the FP8 peak).
    """

    name: str
    rows: int
    n_in: int
    n_out: int
    flops_s: float
    bytes_s: float
    launch_s: float
    seconds: float
    bound: str
    dtype: str = "bf16"


def gemm(host: Host | str | Any, rows: int, n_in: int, n_out: int, name: str = "gemm", dtype: str = "bf16") -> Gemm:
    """The roofline of one GEMM of ``rows`` rows, ``n_in -> n_out``, on ``host``: bf16, or W8A8 FP8 with
    ``dtype="fp8"`` (weights and activations 1 byte per element, at the host's ``peak_tflops_fp8``).

    ``host`` is what :func:`~kbwork.model.load_host` takes: a Host, a host name (``"h200"``) or path, or a
    mapping of host keys over ``h200``'s.

    Returns:
        A :class:`Gemm`.

    Raises:
        ValidationError: a size that is not a positive int, or a dtype other than bf16 and fp8.
        ConfigError: a bad host (an unknown name, a bad key or value, not a host at all).
    """
    host = load_host(host)
    if dtype not in DTYPE_BYTES:
        raise ValidationError(f"host GEMM {name!r}: dtype {dtype!r} is not one of {', '.join(DTYPE_BYTES)}.")
    for what, v in (("rows", rows), ("n_in", n_in), ("n_out", n_out)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v <= 0:
            raise ValidationError(f"host GEMM {name!r}: {what} must be a positive int, got {v!r}.")
    rows, n_in, n_out = int(rows), int(n_in), int(n_out)
    flops_s = 2 * rows * n_in * n_out / (host.peak_flops_of(dtype) * host.eta_flops)
    bytes_s = (n_in * n_out + rows * (n_in + n_out)) * DTYPE_BYTES[dtype] / (host.hbm_bytes_per_s * host.eta_bw)
    bound = HOST_FLOPS if flops_s > bytes_s else HOST_BANDWIDTH
    return Gemm(name, rows, n_in, n_out, flops_s, bytes_s, host.launch_s, max(flops_s, bytes_s) + host.launch_s,
                bound, dtype)


def layer_shapes(model: Model) -> dict[str, tuple[int, int]]:
    """``phase -> (n_in, n_out)`` of one layer's GEMMs and the LM head."""
    return {
        "QKV": (model.hidden, (model.heads + 2 * model.kv_heads) * model.head_dim),
        "O": (model.heads * model.head_dim, model.hidden),
        "FFN up": (model.hidden, 2 * model.ffn),
        "FFN down": (model.ffn, model.hidden),
        LM_HEAD: (model.hidden, model.vocab),
    }


def layer_gemms(model: Model | str | Any, host: Host | str | Any, rows: int) -> dict[str, Gemm]:
    """One layer's four GEMMs (QKV, O, FFN up, FFN down) at ``rows`` rows, in that order.

    ``model`` and ``host`` are what :func:`~kbwork.model.load_model` and :func:`~kbwork.model.load_host`
    take (a Model or Host, a name, a path; a host may be a mapping of host keys).

    Returns:
        ``phase -> Gemm``.

    Raises:
        ValidationError: ``rows`` not a positive int.
        ConfigError: a bad model or host.
    """
    model, host = load_model(model), load_host(host)
    shapes = layer_shapes(model)
    return {name: gemm(host, rows, *shapes[name], name=name, dtype=model.weight_dtype) for name in LAYER_GEMMS}


def lm_head(model: Model | str | Any, host: Host | str | Any, rows: int) -> Gemm:
    """The LM head (hidden -> vocab) at ``rows`` rows: once per step (``model`` and ``host`` as in
    :func:`layer_gemms`).

    Returns:
        A :class:`Gemm`.

    Raises:
        ValidationError: ``rows`` not a positive int.
        ConfigError: a bad model or host.
    """
    model, host = load_model(model), load_host(host)
    return gemm(host, rows, *layer_shapes(model)[LM_HEAD], name=LM_HEAD, dtype=model.weight_dtype)


def weight_bytes(model: Model) -> tuple[int, int]:
    """Bytes of one layer's weights and of the LM head's (in the model's ``weight_dtype``): what each step
    streams from host HBM."""
    shapes = layer_shapes(model)
    per_layer = sum(shapes[n][0] * shapes[n][1] for n in LAYER_GEMMS) * model.weight_bytes_per_element
    return per_layer, shapes[LM_HEAD][0] * shapes[LM_HEAD][1] * model.weight_bytes_per_element


# --- attention on the host ---------------------------------------------------------------------
#: The column of a measured decode-attention table that gives each point's fraction of the peak it was measured
#: at, the peak in GB/s in its name (the H200's table: ``fraction_of_4800_gb_per_s``).
_FRACTION_COLUMN = re.compile(r"fraction_of_(\d+(?:\.\d+)?)_gb_per_s")


def measured_attention(table: str | None = None) -> pd.DataFrame:
    """A host's measured decode-attention points (``table``: its ``attention_bandwidth``, a CSV in
    ``data/measured/`` or a path; None: the default host's, the H200's): ``context, batch, kv_heads, group,
    head_dim, seconds, kv_bytes, gb_per_s, eta``, with eta = gb_per_s / the peak the table was measured at (its
    ``fraction_of_<peak>_gb_per_s`` column: 4800 for the H200). A host with another ``hbm_tb_s`` keeps the
    table's fraction of peak, not its absolute bandwidth.

    Raises:
        ValidationError: the table is missing, has no ``fraction_of_<peak>_gb_per_s`` column, or disagrees with
            itself (its kv_bytes, gb_per_s or fraction column not what its other columns say).
    """
    name = load_host(None).attention_bandwidth if table is None else table
    path = attention_table_path(name)
    try:
        t = pd.read_csv(path)
    except (OSError, ValueError) as exc:
        raise ValidationError(f"measured decode-attention table {name!r} ({path}) cannot be read: {exc}") from None
    fractions = [c for c in t.columns if _FRACTION_COLUMN.fullmatch(str(c))]
    if len(fractions) != 1:
        raise ValidationError(f"{name}: a measured decode-attention table has one column fraction_of_<peak>_gb_per_s "
                              f"(gb_per_s over the peak it was measured at, e.g. fraction_of_4800_gb_per_s); it has "
                              f"{', '.join(map(str, t.columns))}.")
    peak_gb_s = float(_FRACTION_COLUMN.fullmatch(fractions[0]).group(1))
    t = t.sort_values("context", kind="stable").reset_index(drop=True)
    kv = 2 * t["batch"] * t["kv_heads"] * t["context"] * t["head_dim"] * BYTES_PER_ELEMENT
    if not (kv == t["kv_bytes"]).all():
        raise ValidationError(f"{name}: kv_bytes is not 2 x batch x kv_heads x context x head_dim x 2.")
    if not np.allclose(t["kv_bytes"] / t["seconds"] / 1e9, t["gb_per_s"], rtol=1e-3):
        raise ValidationError(f"{name}: gb_per_s is not kv_bytes / seconds.")
    t["eta"] = t["gb_per_s"] / peak_gb_s
    if not np.allclose(t["eta"], t[fractions[0]], atol=1e-4):
        raise ValidationError(f"{name}: {fractions[0]} is not gb_per_s / {peak_gb_s:g}.")
    return t


def eta_attention(context: float, table: pd.DataFrame | None = None) -> float:
    """eta_attn at ``context``: linear in log2(context) between the measured points, clamped outside them."""
    t = measured_attention() if table is None else table
    return float(np.interp(math.log2(context), np.log2(t["context"].to_numpy(float)), t["eta"].to_numpy(float)))


@dataclass(frozen=True, slots=True)
class HostAttention:
    """One layer's attention on the host (``placement="host"``).

    Attributes:
        kv_bytes: K and V of every sequence, unpadded (Σ 2·kv_heads·context·head_dim·2).
        mean_context: the arithmetic mean of the contexts, where eta is taken.
        eta: eta_attn at ``mean_context``.
        launch_s: the kernel's launch.
        seconds: ``kv_bytes / (hbm_bytes_per_s · eta) + launch_s``.
    """

    kv_bytes: int
    mean_context: float
    eta: float
    launch_s: float
    seconds: float


def host_attention(model: Model | str | Any, host: Host | str | Any, contexts: Sequence[int]) -> HostAttention:
    """One layer's decode attention over ``contexts`` (as given, unpadded) on ``host`` (``model`` and ``host``
    as in :func:`layer_gemms`).

    Returns:
        A :class:`HostAttention`.

    Raises:
        ValidationError: ``contexts`` not a non-empty list of positive ints (one KV length per sequence).
        ConfigError: a bad model or host.
    """
    model, host = load_model(model), load_host(host)
    contexts = check_contexts(contexts, None, "model.host_attention")
    kv = sum(model.kv_bytes(c) for c in contexts)
    mean = sum(contexts) / len(contexts)
    eta = eta_attention(mean, measured_attention(host.attention_bandwidth))
    return HostAttention(kv, mean, eta, host.launch_s, kv / (host.hbm_bytes_per_s * eta) + host.launch_s)
