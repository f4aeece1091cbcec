"""The physical lower bound on a decode step's time: what must move, over the bandwidth that moves it (DESIGN.md §15).

A step reads every weight once (the host's GEMMs, from host HBM) and every
sequence's K and V once per layer (from wherever attention runs), and it does
the GEMMs' FLOPs on the host. At peak bandwidth and peak FLOP/s, with no
efficiency, no launch and no hand-off, that is

* ``host_s = max(weight bytes / host bandwidth, GEMM FLOPs / host peak)``: the host's part;
* ``device_s = KV bytes / device bandwidth``, the device's bandwidth being
  ``hbm_channels · channel_bytes_per_cycle · clock`` (0 when the channels are unconstrained);
* the GPU alone (``placement="host"``): ``max((weight + KV bytes) / host bandwidth, GEMM FLOPs / host peak)``;
* attention on the AHBM device, ``schedule="serial"``: ``host_s + device_s`` (the serial schedule
  overlaps nothing: the host waits for every layer's attention, the device for every layer's GEMMs);
* attention on the AHBM device under any schedule (ping-pong at its very best): ``max(host_s, device_s)``.

with weight bytes = ``layers ·`` (QKV + O + FFN up + FFN down) ``+`` LM head, KV bytes =
``layers · Σ`` over sequences ``2 · kv_heads · context · head_dim · bytes`` (contexts as given, unpadded),
bytes per element by dtype (2 in bf16, 1 in fp8: the model's ``weight_dtype`` and ``kv_dtype``, DESIGN.md §17;
the host peak is the FP8 one with fp8 weights) and GEMM FLOPs = ``Σ 2 · batch · in · out`` over every GEMM of the step. Each is a true lower bound on
:func:`kbwork.model.step`'s ``seconds`` for that placement and schedule: the roofline's efficiencies are at
most 1 and its bytes include the weights, a layer's attention is no shorter than its busiest channel's KV
bytes over the channel's bandwidth (padded keys only add), and ping-pong's host reads the weights once per
half. Tokens per second are bounded by ``batch`` over the bound.

The least energy (DESIGN §18) prices the same bytes and FLOPs and nothing else (no idle or busy power, no
TCM, no PE compute): every weight byte and the GEMM FLOPs on the host (``8 · gpu_hbm_pj_per_bit`` per byte,
``flop_pj`` per FLOP); the KV bytes on the host (``placement="host"``) or at the device's
``hbm_pj_per_bit`` (``"ahbm"``, either schedule), where q and O also cross the link once per layer
(``2 · batch · heads · head_dim · 2`` bytes at ``8 · link_pj_per_bit``). It is a lower bound on
``Step.joules``: the step reads at least these bytes (padding, a second half's weights and activations only
add) and every other row is non-negative. Tokens per joule are bounded by ``batch`` over it.

>>> from kbwork import model
>>> b = model.physical_bound("llama-3-8b", [32768] * 16)
>>> b.tokens_per_s("host"), b.tokens_per_s("ahbm_serial"), b.tokens_per_s("ahbm")
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import pandas as pd

from ..errors import ValidationError
from .device import DEVICE_KEYS, DEVICE_V1, load_device
from .files import BYTES_PER_ELEMENT, HOST_KEYS, load_host, load_model, with_dtypes
from .host import LAYER_GEMMS, LM_HEAD, layer_shapes, weight_bytes

#: What a bound is of: the GPU alone, the AHBM device under the serial schedule, the AHBM device under any
#: schedule (the overlap of host and device at its best).
BOUND_KINDS = ("host", "ahbm_serial", "ahbm")


@dataclass(frozen=True)
class PhysicalBound:
    """The physical lower bound on one decode step (see the module's docstring for every formula).

    Attributes:
        model: the model's name; ``batch``: the sequences of the step.
        weight_bytes: every weight once (all layers and the LM head), in the weights' dtype.
        kv_bytes: every sequence's K and V in every layer, in the KV dtype, contexts as given.
        gemm_flops: ``Σ 2 · batch · in · out`` over the step's GEMMs.
        host_bytes_per_s, host_flops_per_s: the host's peak HBM bandwidth and FLOP/s (bf16, or FP8 with fp8
            weights).
        device_bytes_per_s: ``hbm_channels · channel_bytes_per_cycle · clock`` (``inf`` when unconstrained).
        handoff_bytes: q to the device and O back over every layer (``2 · layers · batch · heads · head_dim ·
            2``), what ``placement="ahbm"`` hands off.
        gpu_hbm_pj_per_bit, flop_pj, link_pj_per_bit: the host's energy keys; ``device_hbm_pj_per_bit`` the
            device's ``hbm_pj_per_bit``.
    """

    model: str
    batch: int
    weight_bytes: int
    kv_bytes: int
    gemm_flops: float
    host_bytes_per_s: float
    host_flops_per_s: float
    device_bytes_per_s: float
    handoff_bytes: int = 0
    gpu_hbm_pj_per_bit: float = 0.0
    flop_pj: float = 0.0
    link_pj_per_bit: float = 0.0
    device_hbm_pj_per_bit: float = 0.0

    @property
    def host_s(self) -> float:
        """The host's GEMMs at peak: ``max(weight bytes / host bandwidth, GEMM FLOPs / host peak)``."""
        return max(self.weight_bytes / self.host_bytes_per_s, self.gemm_flops / self.host_flops_per_s)

    @property
    def device_s(self) -> float:
        """Every layer's KV cache over the device's channels at their bandwidth (0 when unconstrained)."""
        return 0.0 if math.isinf(self.device_bytes_per_s) else self.kv_bytes / self.device_bytes_per_s

    def seconds(self, kind: str) -> float:
        """The least step time of ``kind`` (one of :data:`BOUND_KINDS`).

        Raises:
            ValidationError: an unknown kind.
        """
        if kind == "host":
            return max((self.weight_bytes + self.kv_bytes) / self.host_bytes_per_s,
                       self.gemm_flops / self.host_flops_per_s)
        if kind == "ahbm_serial":
            return self.host_s + self.device_s
        if kind == "ahbm":
            return max(self.host_s, self.device_s)
        raise ValidationError(f"PhysicalBound: bound kind {kind!r} is unknown; use one of "
                              f"{', '.join(map(repr, BOUND_KINDS))}.")

    def tokens_per_s(self, kind: str) -> float:
        """The most tokens per second of ``kind``: ``batch / seconds(kind)``."""
        return self.batch / self.seconds(kind)

    def joules(self, kind: str) -> float:
        """The least energy of a step of ``kind`` (one of :data:`BOUND_KINDS`), J: every byte at its pJ/bit and
        every GEMM FLOP at its pJ (module docstring).

        Raises:
            ValidationError: an unknown kind.
        """
        self.seconds(kind)  # names an unknown kind
        host = (self.weight_bytes * 8 * self.gpu_hbm_pj_per_bit + self.gemm_flops * self.flop_pj) * 1e-12
        if kind == "host":
            return host + self.kv_bytes * 8 * self.gpu_hbm_pj_per_bit * 1e-12
        return host + (self.kv_bytes * self.device_hbm_pj_per_bit + self.handoff_bytes * self.link_pj_per_bit) \
            * 8 * 1e-12

    def tokens_per_j(self, kind: str) -> float:
        """The most tokens per joule of ``kind``: ``batch / joules(kind)`` (``inf`` when it is 0)."""
        j = self.joules(kind)
        return self.batch / j if j > 0 else math.inf

    def to_dict(self) -> dict[str, Any]:
        """The inputs, and the least seconds, most tokens/s, least joules and most tokens/J of every kind."""
        out: dict[str, Any] = {k: getattr(self, k) for k in self.__dataclass_fields__}
        for kind in BOUND_KINDS:
            out[f"{kind}_s"] = self.seconds(kind)
            out[f"{kind}_tokens_per_s"] = self.tokens_per_s(kind)
            out[f"{kind}_joules"] = self.joules(kind)
            out[f"{kind}_tokens_per_j"] = self.tokens_per_j(kind)
        return out

    def __repr__(self) -> str:
        return (f"PhysicalBound({self.model}, batch {self.batch}: "
                + ", ".join(f"{k} {self.tokens_per_s(k):.1f}" for k in BOUND_KINDS) + " tokens/s)")


def physical_bound(model: Any, contexts: Sequence[int], *, host: Any = "h200", device: Any = DEVICE_V1,
                   weight_dtype: str | None = None, kv_dtype: str | None = None, **overrides: Any) -> PhysicalBound:
    """The physical lower bound on a decode step of ``model`` over ``contexts`` (module docstring).

    Takes what :func:`kbwork.model.step` takes (a model name, path or Model; a host name, mapping or
    Host; a device name, Topology or Device with device or topology ``overrides``), so
    ``physical_bound(s.model, s.contexts, host=s.host, device=s.device)`` is step ``s``'s bound;
    ``weight_dtype`` and ``kv_dtype`` (``"bf16"`` | ``"fp8"``, ``None``: the model's) as ``model.step`` takes
    them.

    Raises:
        ValidationError: empty contexts or one that is not a positive int.
        ConfigError: a bad model, host, device or key.
    """
    m = with_dtypes(load_model(model), weight_dtype, kv_dtype)
    h = load_host(host)
    d = load_device(device, **overrides)
    ctx = _contexts(contexts)
    per_layer, lm = weight_bytes(m)
    shapes = layer_shapes(m)
    b = len(ctx)
    flops = 2 * b * (m.layers * sum(shapes[n][0] * shapes[n][1] for n in LAYER_GEMMS)
                     + shapes[LM_HEAD][0] * shapes[LM_HEAD][1])
    return PhysicalBound(m.name, b, m.layers * per_layer + lm, m.layers * sum(m.kv_bytes(c) for c in ctx),
                         float(flops), h.hbm_bytes_per_s, h.peak_flops_of(m.weight_dtype),
                         d.hbm_channels * d.channel_bytes_per_cycle * d.clock_hz,
                         2 * m.layers * b * m.heads * m.head_dim * BYTES_PER_ELEMENT, h.gpu_hbm_pj_per_bit,
                         h.flop_pj, h.link_pj_per_bit, d.topology.hbm_pj_per_bit)


def _contexts(contexts: Any) -> tuple[int, ...]:
    if isinstance(contexts, (str, bytes)) or not isinstance(contexts, (list, tuple, range, np.ndarray)) \
            or len(contexts) == 0:
        raise ValidationError(f"model.physical_bound: contexts must be a non-empty list of KV lengths, one per "
                              f"sequence (e.g. [32768] * 16), got {contexts!r}.")
    out = []
    for i, c in enumerate(contexts):
        if isinstance(c, (bool, np.bool_)) or not isinstance(c, numbers.Integral) or c <= 0:
            raise ValidationError(f"model.physical_bound: contexts[{i}] is {c!r}; every context is a positive "
                                  f"int (the KV length, the new token included).")
        out.append(int(c))
    return tuple(out)


def bound_kind_of(placement: str, schedule: str) -> str:
    """The bound a case is held to: ``"host"`` for the GPU alone, ``"ahbm_serial"`` for the serial schedule
    on the device, ``"ahbm"`` for any other schedule on it."""
    if placement == "host":
        return "host"
    return "ahbm_serial" if schedule == "serial" else "ahbm"


def with_bounds(sweep: pd.DataFrame, *, host: Any = None, device: Any = None) -> pd.DataFrame:
    """A :func:`kbwork.model.sweep` (or :func:`kbwork.model.compare` with ``model``, ``batch`` and
    ``context`` columns) with each row's physical bound: ``physical_bound`` (its kind, :func:`bound_kind_of`),
    ``bound_tokens_per_s`` and ``of_bound`` (``tokens_per_s / bound_tokens_per_s``, at most 1). The sweep's
    own ``bound`` and ``bound_kind`` (what takes the largest share of the step) stay as they are.

    Every sequence of a row has the row's ``context`` (as in a sweep). ``host`` and ``device`` default to
    the ones the sweep records in its ``attrs`` (:func:`kbwork.model.sweep` does), else to ``"h200"`` and
    ``"ahbm-device-v1"``. Host and device keys that are columns of ``sweep`` (a swept ``hbm_tb_s`` or
    ``channel_bytes_per_cycle``) are applied per row.

    Returns:
        A copy of ``sweep`` with the three columns added.

    Raises:
        ValidationError: ``sweep`` lacks a column it needs, or records an invalid host or device.
        ConfigError: a bad host or device.
    """
    from .sweeps import setup_of

    need = {"model", "batch", "context", "placement", "schedule", "tokens_per_s"}
    if not isinstance(sweep, pd.DataFrame) or not need <= set(sweep.columns):
        raise ValidationError(f"with_bounds: expected a model.sweep() DataFrame with columns "
                              f"{', '.join(sorted(need))}.")
    host_cols = [c for c in HOST_KEYS[1:] if c in sweep.columns]
    dev_cols = [c for c in ("clock_ghz", *DEVICE_KEYS) if c in sweep.columns]
    dtype_cols = [c for c in ("weight_dtype", "kv_dtype") if c in sweep.columns]
    base_host, base_device = setup_of(sweep, host, device, "with_bounds")
    cache: dict[tuple, PhysicalBound] = {}
    kinds, tps = [], []
    for r in sweep.to_dict(orient="records"):
        key = (r["model"], r["batch"], r["context"], *(r[c] for c in host_cols), *(r[c] for c in dev_cols),
               *(r[c] for c in dtype_cols))
        if key not in cache:
            h = base_host.replace(**{c: r[c] for c in host_cols}) if host_cols else base_host
            cache[key] = physical_bound(r["model"], [int(r["context"])] * int(r["batch"]), host=h,
                                        device=base_device, **{c: r[c] for c in dev_cols},
                                        **{c: r[c] for c in dtype_cols})
        kind = bound_kind_of(r["placement"], r["schedule"])
        kinds.append(kind)
        tps.append(cache[key].tokens_per_s(kind))
    out = sweep.copy()
    out["physical_bound"] = kinds
    out["bound_tokens_per_s"] = tps
    out["of_bound"] = out["tokens_per_s"] / out["bound_tokens_per_s"]
    return out
