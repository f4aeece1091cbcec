"""A decode step's energy (DESIGN §18): ``Step.energy`` rows, ``Step.joules``, tokens per joule and watts.

Every row is counts × a per-event energy (host keys of :class:`~kbwork.model.Host`, energy keys of the
device's topology):

* **host GEMMs**, per GEMM as timed (per half under ping-pong; a layer's four GEMMs × ``layers``, the LM
  head once): ``hbm`` ``(in·out + B·(in+out)) · 2 bytes · 8 · gpu_hbm_pj_per_bit`` and ``flop``
  ``2·B·in·out · flop_pj``;
* **host attention** (``placement="host"``): ``hbm``, every layer's KV bytes · 8 · ``gpu_hbm_pj_per_bit``;
* **host busy**: ``busy_w`` × the host's busy seconds (Σ of its tasks' durations in the step's timeline,
  launches included); **host idle**: ``idle_w`` × the step's seconds (the GPU is powered while the device
  works);
* **device attention** (``placement="ahbm"``): ``layers`` × Σ over the layer's attention runs of
  :func:`kbwork.analysis.energy` by kind, without ``idle``; **device idle**: ``pe_idle_mw · pes`` × the
  step's seconds;
* **host merge** (``placement="ahbm"``, split-KV with ``merge="host"``, DESIGN.md §16; 0 J otherwise): every
  layer's partial bytes (``Step.merge_bytes``) · 8 · ``gpu_hbm_pj_per_bit``; its busy time is in the
  timeline, so in host busy;
* **hand-off** (``placement="ahbm"``): per layer and half, q to the device and O back, each
  ``B · heads · head_dim · 2`` bytes, × 8 × ``link_pj_per_bit`` (the new token's K and V are not counted, as
  in the timing).

:func:`step_energy` reads a step and prices it; the device's counts are the attention runs' own, counted once
per run (a replicated PE's are its source's), so pricing a step again under other keys
(:meth:`Step.with_energy`) re-simulates nothing.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from ..analysis.energy import ENERGY_KEYS, WORK_KINDS, energy_by_kind, prices
from ..errors import ConfigError
from .files import BYTES_PER_ELEMENT, DTYPE_BYTES
from .host import LAYER_GEMMS, LM_HEAD

ENERGY_COLUMNS = ["part", "resource", "kind", "joules"]
#: The host keys that price a step's energy.
HOST_ENERGY_KEYS = ("gpu_hbm_pj_per_bit", "flop_pj", "idle_w", "busy_w", "link_pj_per_bit")
#: Every key :meth:`Step.with_energy` takes: the device's energy keys and the host's.
STEP_ENERGY_KEYS = (*ENERGY_KEYS, *HOST_ENERGY_KEYS)
#: What each (resource, kind) of a step's energy is called in a stacked bar (notebook 07), in stacking order.
GROUPS = {("device", "hbm"): "HBM", ("device", "tcm"): "TCM", ("device", "mac"): "MAC", ("device", "math"): "MATH",
          ("device", "dispatch"): "dispatch", ("device", "idle"): "device idle", ("host", "hbm"): "host HBM",
          ("host", "flop"): "host FLOPs", ("host", "busy"): "host busy", ("host", "idle"): "host idle",
          ("link", "link"): "link"}
_PJ = 1e-12


def split_keys(keys: dict[str, Any], where: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """``keys`` split into (device energy keys, host energy keys).

    Raises:
        ConfigError: a key that is neither (naming it and the keys there are).
    """
    device = {k: v for k, v in keys.items() if k in ENERGY_KEYS}
    host = {k: v for k, v in keys.items() if k in HOST_ENERGY_KEYS}
    other = [k for k in keys if k not in device and k not in host]
    if other:
        what = "is not an energy key" if len(other) == 1 else "are not energy keys"
        raise ConfigError(f"{where}: {', '.join(map(repr, other))} {what}: a step's energy re-prices with "
                          f"{', '.join(STEP_ENERGY_KEYS)} (other keys change the timing: run model.step again).")
    return device, host


def step_energy(step: Any, **device_keys: Any) -> pd.DataFrame:
    """Step ``step``'s energy, one row per (part, resource, kind): ``part, resource, kind, joules`` (module
    docstring), its host's keys and its device's energy keys, ``device_keys`` (energy keys of the topology)
    applied over them. Rows of 0 J are kept, so every step of one placement has the same rows.

    Raises:
        ConfigError: a key that is not a device energy key, or a value it refuses.
    """
    h, m = step.host, step.model
    layers = m.layers
    rows: list[tuple[str, str, str, float]] = []
    gpu_bit, flop = h.gpu_hbm_pj_per_bit * 8 * _PJ, h.flop_pj * _PJ
    halves = step._halves
    for name in (*LAYER_GEMMS, LM_HEAD):
        gs = [x.lm_head if name == LM_HEAD else x.gemms[name] for x in halves]
        times = 1 if name == LM_HEAD else layers
        moved = sum((g.n_in * g.n_out + g.rows * (g.n_in + g.n_out)) * DTYPE_BYTES[g.dtype] for g in gs)  # W8A8: 1 B
        flops = sum(2 * g.rows * g.n_in * g.n_out for g in gs)
        rows.append((name, "host", "hbm", times * moved * gpu_bit))
        rows.append((name, "host", "flop", times * flops * flop))
    if step.placement == "host":
        rows.append(("attention", "host", "hbm", layers * step.host_attention.kv_bytes * gpu_bit))
    tl = step.timeline
    on_host = tl["resource"] == "host"
    busy_s = float((tl.loc[on_host, "end"] - tl.loc[on_host, "start"]).sum()) * 1e-6  # the timeline is in µs
    rows.append(("host busy", "host", "busy", h.busy_w * busy_s))
    rows.append(("host idle", "host", "idle", h.idle_w * step.seconds))
    if step.placement != "host":
        per_kind = dict.fromkeys(WORK_KINDS, 0.0)
        for r in step.attention_runs:
            by = energy_by_kind(r.run, idle=False, **device_keys)
            for k in WORK_KINDS:
                per_kind[k] += float(by[k])
        for k in WORK_KINDS:
            rows.append(("attention", "device", k, layers * per_kind[k] * _PJ))
        topo = step.device.topology
        idle_mw = prices(topo, **device_keys)["idle"] * topo.clock_ghz  # pe_idle_mw, overrides applied
        rows.append(("device idle", "device", "idle", idle_mw * 1e-3 * step.device.pes * step.seconds))
        # the host's merge of split-KV partials (DESIGN.md §16, merge="host"; 0 J otherwise): its HBM traffic
        rows.append(("merge", "host", "hbm", layers * getattr(step, "merge_bytes", 0) * gpu_bit))
        q_and_o = sum(2 * x.rows * m.heads * m.head_dim * BYTES_PER_ELEMENT for x in halves)
        rows.append(("handoff", "link", "link", layers * q_and_o * 8 * h.link_pj_per_bit * _PJ))
    elif device_keys:
        prices(step.device.topology, **device_keys)  # validated all the same
    return pd.DataFrame(rows, columns=ENERGY_COLUMNS)


def grouped(energy: pd.DataFrame) -> pd.Series:
    """A step's energy rows summed into the groups of a stacked bar (:data:`GROUPS`: HBM, TCM, MAC, MATH,
    dispatch, device idle, host HBM, host FLOPs, host busy, host idle, link), joules, in that order (every
    group, 0 where the step has none)."""
    s = energy.groupby(["resource", "kind"])["joules"].sum()
    return pd.Series([float(s.get(key, 0.0)) for key in GROUPS], index=pd.Index(list(GROUPS.values()), name="group"),
                     name="joules")
