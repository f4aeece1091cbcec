"""What fits: a step's weights and KV cache against the memory they are placed in (DESIGN.md §15, "Capacity:
what fits").

>>> from kbwork import model
>>> model.capacity.parameters(model.load_model("llama-3-70b"))       # 70,552,387,584
>>> model.step("llama-3-70b", [32768] * 16, placement="host")         # CapacityError: 291 GiB on a 139 GiB H200
>>> s = model.step("llama-3-70b", [32768] * 16, check_capacity=False)
>>> s.fits, s.memory                                                  # False; where, what, bytes, capacity_bytes

``placement="host"``: the weights and the KV cache on the host; ``placement="ahbm"``: the weights on the
host, the KV cache on the device (its padded contexts: the padded keys are laid out there too).
Activations, the CUDA context and fragmentation are not counted.
"""

from __future__ import annotations

import math
from typing import Sequence

import pandas as pd

from ..errors import CapacityError
from .files import Host, Model

#: One GiB, the unit of ``gpu_hbm_gib`` and ``hbm_gib``.
GIB = 2 ** 30
#: The columns of :attr:`Step.memory <kbwork.model.Step.memory>`.
MEMORY_COLUMNS = ["where", "what", "bytes", "capacity_bytes"]


def parameters(m: Model) -> int:
    """The parameters of ``m``: per layer the QKV, O and SwiGLU FFN weights, and the embedding and LM head
    (norms ignored, as in the timing). 8,029,995,008 for ``llama-3-8b``, 70,552,387,584 for ``llama-3-70b``."""
    per_layer = (m.hidden * (m.heads + 2 * m.kv_heads) * m.head_dim + m.heads * m.head_dim * m.hidden
                 + 3 * m.hidden * m.ffn)
    return m.layers * per_layer + 2 * m.vocab * m.hidden


def weight_bytes(m: Model) -> int:
    """The bytes of ``m``'s weights: :func:`parameters` x bytes per element (2 in bf16, 1 in fp8)."""
    return parameters(m) * m.weight_bytes_per_element


def kv_bytes(m: Model, contexts: Sequence[int]) -> int:
    """The bytes of the KV cache of a batch: ``2 · layers · kv_heads · head_dim · bytes · Σ contexts`` (K and V
    of every layer, bytes 2 in bf16 and 1 in fp8)."""
    return 2 * m.layers * m.kv_heads * m.head_dim * m.kv_bytes_per_element * sum(int(c) for c in contexts)


def memory_frame(m: Model, host: Host, device_hbm_gib: float, placement: str, contexts: Sequence[int],
                 padded_contexts: Sequence[int]) -> pd.DataFrame:
    """What a step places where: one row per (where, what) with its ``bytes`` and the ``capacity_bytes`` of
    that memory (``inf`` for an unbounded device).

    ``placement="host"`` puts the weights and the KV cache (``contexts`` as given) on the host;
    ``"ahbm"`` the weights on the host and the KV cache (``padded_contexts``) on the device.
    """
    host_cap = float(host.hbm_bytes)
    rows = [("host", "weights", weight_bytes(m), host_cap)]
    if placement == "host":
        rows.append(("host", "kv", kv_bytes(m, contexts), host_cap))
    else:
        rows.append(("device", "kv", kv_bytes(m, padded_contexts), float(device_hbm_gib) * GIB))
    return pd.DataFrame(rows, columns=MEMORY_COLUMNS)


def overfull(memory: pd.DataFrame) -> list[str]:
    """The ``where``\\ s of ``memory`` whose bytes exceed their capacity, in row order (empty: it fits)."""
    out = []
    for where, g in memory.groupby("where", sort=False):
        if g["bytes"].sum() > g["capacity_bytes"].iloc[0]:
            out.append(str(where))
    return out


def gib(n: float) -> str:
    """``n`` bytes in GiB, as text (``"131.4 GiB"``; ``"unbounded"`` for inf)."""
    return "unbounded" if math.isinf(n) else f"{n / GIB:,.1f} GiB"


def capacity_message(memory: pd.DataFrame | dict[str, pd.DataFrame], *, model: Model, batch: int, placement: str,
                     where: str, cli: bool = False) -> str:
    """Why a step does not fit, naming where, the GiB of weights and of KV, the capacity, the KV tokens there is
    room for, and the ways out (in ``kbwork step``'s options when ``cli``, else in ``model.step``'s).

    ``memory`` is a step's :func:`memory_frame`, or ``{placement: memory_frame}`` for several placements of
    one batch (``placement`` is then ignored), each of which is named.
    """
    per_token = kv_bytes(model, [1])
    memories = memory if isinstance(memory, dict) else {placement: memory}
    said, full = [], []
    for p, mem in memories.items():
        parts = []
        for w in overfull(mem):
            g = mem[mem["where"] == w]
            held = " + ".join(f"{gib(r.bytes)} of {'weights' if r.what == 'weights' else 'KV cache'}"
                              for r in g.itertuples())
            total = f" = {gib(g['bytes'].sum())}" if len(g) > 1 else ""
            cap = g["capacity_bytes"].iloc[0]
            key = "gpu_hbm_gib" if w == "host" else "hbm_gib"
            room = max(0, int((cap - g.loc[g["what"] != "kv", "bytes"].sum()) // per_token))
            parts.append(f"on the {w}, {held}{total} exceed its {gib(cap)} ({key}), which has room for "
                         f"{room:,} tokens of KV cache{' beside the weights' if len(g) > 1 else ''}")
            full.append(w)
        if parts:
            flag = f"--placement {p}" if cli else f"placement={p!r}"
            said.append((f"with {flag}: " if len(memories) > 1 else "") + "; ".join(parts))
    ways = ["a smaller batch or context"]
    fitting = [p for p, mem in memories.items() if not overfull(mem)]
    if fitting:
        ways += [f"--placement {p} alone (it fits)" if cli else f"placement={p!r} alone (it fits)" for p in fitting]
    elif "host" in memories and "ahbm" not in memories:
        ways.append("--placement ahbm (the KV cache on the device)" if cli else
                    "placement='ahbm' (the KV cache on the device)")
    more = [("--host FILE with a larger gpu_hbm_gib" if cli else "host={'gpu_hbm_gib': N}") if w == "host" else
            ("--set hbm_gib=N" if cli else "hbm_gib=N") for w in dict.fromkeys(full)]
    ways.append(f"more HBM ({', '.join(more)})")
    fp8 = [(what, flag) for what, flag, d in (("weights", "weight", model.weight_dtype), ("KV", "kv", model.kv_dtype))
           if d != "fp8"]
    if fp8:  # 1-byte FP8 halves them (DESIGN.md §17)
        ways.append(" or ".join(f"--{flag}-dtype fp8" if cli else f"{flag}_dtype='fp8'" for _, flag in fp8)
                    + f" (1-byte FP8 {' and '.join(w for w, _ in fp8)}: half the bytes)")
    ways.append("--no-capacity-check to time it anyway" if cli else "check_capacity=False to time it anyway")
    return (f"{where}: {model.name} at batch {batch} does not fit: {'; and '.join(said)}. Ways out: "
            f"{', '.join(ways)}.")


def check_capacity(memory: pd.DataFrame, **kw: object) -> None:
    """Raise a :class:`~kbwork.errors.CapacityError` (:func:`capacity_message`) unless ``memory`` fits.

    Raises:
        CapacityError: some ``where`` holds more bytes than its capacity.
    """
    if overfull(memory):
        raise CapacityError(capacity_message(memory, **kw))  # type: ignore[arg-type]
