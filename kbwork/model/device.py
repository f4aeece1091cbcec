"""The AHBM device a step's attention runs on, and one layer's attention on it (DESIGN.md §14, §15).

Until the many-PE device lands in the simulator core (``sim.run_device``,
``data/topology/ahbm-device-v1.toml``), a device here is a PE topology
(``kbwork.load_topology()``) plus the three device keys of §14, and one
layer's attention is computed by :func:`_attention` for the one case that is
exact without simulating shared channels: every PE on its own channel, with
one DMA unit. :func:`_attention` is the single place a real device run
replaces.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any, Sequence

from ..config import Topology, load_topology
from ..errors import ConfigError, ValidationError
from .files import BYTES_PER_ELEMENT
from .tasks import Task

#: The default device's name (DESIGN.md §14).
DEVICE_V1 = "ahbm-device-v1"
#: The device keys of DESIGN.md §14 that a Topology does not carry yet.
DEVICE_KEYS = ("pes", "hbm_channels", "channel_bytes_per_cycle")
#: STAND-IN until data/topology/ahbm-device-v1.toml lands: its device keys (DESIGN.md §14: 96 PEs of
#: ahbm-pe-v1, one DMA unit each, 96 channels of 40 bytes per cycle, one PE per channel). Every other
#: key is ahbm-pe-v1's. Delete this dict when the file exists.
DEVICE_V1_KEYS: dict[str, Any] = {"pes": 96, "hbm_channels": 96, "channel_bytes_per_cycle": 40}
#: A topology without device keys is one PE on one unconstrained channel (DESIGN.md §14's defaults).
DEVICE_DEFAULTS: dict[str, Any] = {"pes": 1, "hbm_channels": 1, "channel_bytes_per_cycle": math.inf}


@dataclass(frozen=True)
class Device:
    """Many PEs of one topology beside HBM channels.

    Attributes:
        pe: the topology of every PE.
        pes: PEs on the device.
        hbm_channels: HBM channels; PE p's home channel is ``p // (pes / hbm_channels)``.
        channel_bytes_per_cycle: each channel's bandwidth (``inf``: unconstrained).
        name: the device's name.
    """

    pe: Topology
    pes: int
    hbm_channels: int
    channel_bytes_per_cycle: float
    name: str = DEVICE_V1

    def __post_init__(self) -> None:
        for key in ("pes", "hbm_channels"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v <= 0:
                raise ConfigError(f"device key {key!r} must be a positive integer, got {v!r}.")
            object.__setattr__(self, key, int(v))
        c = self.channel_bytes_per_cycle
        if isinstance(c, bool) or not isinstance(c, numbers.Real) or math.isnan(c) or c <= 0:
            raise ConfigError(f"device key 'channel_bytes_per_cycle' must be a positive number of bytes per cycle "
                              f"(or inf, unconstrained), got {c!r}.")
        if self.pes % self.hbm_channels:
            raise ConfigError(f"device key 'pes' ({self.pes}) must be a multiple of 'hbm_channels' "
                              f"({self.hbm_channels}) (DESIGN.md §14).")

    @property
    def pes_per_channel(self) -> int:
        """PEs sharing one channel."""
        return self.pes // self.hbm_channels

    def home_channel(self, pe: int) -> int:
        """PE ``pe``'s home channel."""
        return pe // self.pes_per_channel

    @property
    def clock_hz(self) -> float:
        """The PE clock, cycles per second."""
        return self.pe.clock_ghz * 1e9

    def to_dict(self) -> dict[str, Any]:
        """The device keys and the PE topology's, flat."""
        return {"device": self.name, "pes": self.pes, "hbm_channels": self.hbm_channels,
                "channel_bytes_per_cycle": self.channel_bytes_per_cycle, **self.pe.to_dict()}

    def __repr__(self) -> str:
        return (f"Device({self.name!r}: {self.pes} PEs of {self.pe.name}, {self.hbm_channels} channels x "
                f"{self.channel_bytes_per_cycle:g} B/cycle)")


def load_device(device: str | Topology | Device | Any = DEVICE_V1, **overrides: Any) -> Device:
    """The device of a step: a name (``"ahbm-device-v1"``), a topology name or path, a :class:`Topology`
    or a :class:`Device`, with ``overrides`` (device keys and topology keys) applied.

    A topology without device keys is one PE on one unconstrained channel (DESIGN.md §14's defaults),
    unless ``overrides`` give ``pes``, ``hbm_channels``, ``channel_bytes_per_cycle``.

    Raises:
        ConfigError: an unknown topology or key, a bad value, ``pes`` not a multiple of ``hbm_channels``.
    """
    dev_over = {k: overrides.pop(k) for k in DEVICE_KEYS if k in overrides}
    if isinstance(device, Device):
        pe = device.pe.replace(**overrides) if overrides else device.pe
        keys = {"pes": device.pes, "hbm_channels": device.hbm_channels,
                "channel_bytes_per_cycle": device.channel_bytes_per_cycle}
        name = device.name
    else:
        stand_in = device == DEVICE_V1 and _is_stand_in()
        pe = load_topology(None if stand_in else device, **overrides)
        base = DEVICE_V1_KEYS if stand_in else DEVICE_DEFAULTS
        keys = {k: getattr(pe, k, base[k]) for k in DEVICE_KEYS}
        name = DEVICE_V1 if stand_in else pe.name
    keys.update(dev_over)
    return Device(pe, name=name, **keys)


def _is_stand_in() -> bool:
    """True while no ``ahbm-device-v1`` topology file exists (then :data:`DEVICE_V1_KEYS` stands in)."""
    from ..config import TOPOLOGY_DIR

    return not (TOPOLOGY_DIR / f"{DEVICE_V1}.toml").is_file()


def task_topology(device: Device) -> Topology:
    """The topology one task runs on alone on its channel: the PE's, with the DMA rate capped at the
    channel's (a transfer alone on its channel takes ``dma_base_cycles + ceil(b / min(dma_rate,
    channel_rate))``, DESIGN.md §14).

    Raises:
        ValidationError: a setting this stand-in cannot time exactly (several PEs or several DMA units
            sharing a channel; a fractional channel rate below the DMA rate).
    """
    pe = device.pe
    if device.pes > device.hbm_channels:
        raise ValidationError(f"shared channels are not modelled yet: {device.pes} PEs on {device.hbm_channels} "
                              f"channels put {device.pes_per_channel} PEs on each; use hbm_channels={device.pes} "
                              f"(one PE per channel) until the device simulation lands.")
    ch = device.channel_bytes_per_cycle
    if math.isinf(ch) or ch >= pe.dma_channels * pe.dma_bytes_per_cycle:
        return pe  # the channel never binds: every transfer runs at its DMA unit's rate
    if pe.dma_channels > 1:
        need = pe.dma_channels * pe.dma_bytes_per_cycle
        raise ValidationError(f"shared channels are not modelled yet: {pe.dma_channels} DMA units of "
                              f"{pe.dma_bytes_per_cycle} B/cycle share a channel of {ch:g} B/cycle; use "
                              f"dma_channels=1 or channel_bytes_per_cycle >= {need}.")
    if ch != int(ch):
        raise ValidationError(f"channel_bytes_per_cycle={ch:g} is below dma_bytes_per_cycle="
                              f"{pe.dma_bytes_per_cycle} and not a whole number; until the device simulation "
                              f"lands a task is timed on a PE whose DMA rate is the channel's, which must be an "
                              f"integer (e.g. {math.floor(ch)} or {math.ceil(ch)}).")
    return pe.replace(dma_bytes_per_cycle=min(pe.dma_bytes_per_cycle, int(ch)))


def task_kv_bytes(task: Task, head_dim: int) -> int:
    """Bytes of K and V one task reads (its padded context)."""
    return 2 * task.padded_context * head_dim * BYTES_PER_ELEMENT


def _attention(tasks: Sequence[Task], device: Device, variant: str, tile: int, *, group: int, head_dim: int,
               runs: dict | None = None) -> tuple[int, tuple[int, ...]]:
    """One layer's attention on ``device``: ``(cycles_per_layer, per_pe_cycles)``.

    Each PE runs its tasks (``task.pe``) back to back; a task is
    ``decode.run(variant, kv_len=padded_context, group=, head_dim=, tile=, mode="timing",
    topology=task_topology(device)).cycles``; a PE's time is the sum over its tasks and the layer's
    attention is the longest PE. Exact when every PE has its own channel and one DMA unit (the only
    case it accepts). The one function a real device run (``sim.run_device``) replaces.

    Args:
        tasks: the layer's tasks (:func:`kbwork.model.tasks.assign_tasks`).
        device: the device.
        variant: a decode variant.
        tile: the decode tile.
        group, head_dim: every task's G and d.
        runs: a memo ``{(variant, padded_context, group, head_dim, tile): DecodeRun}`` shared by the calls
            of one step (each distinct padded context simulated once); a fresh one per call if ``None``.

    Raises:
        ValidationError: shared channels (more PEs than channels, or several DMA units on a channel).
    """
    from .. import decode

    topo = task_topology(device)
    runs = {} if runs is None else runs
    per_pe = [0] * device.pes
    for t in tasks:
        key = (variant, t.padded_context, group, head_dim, tile)
        if key not in runs:
            runs[key] = decode.run(variant, kv_len=t.padded_context, group=group, head_dim=head_dim, tile=tile,
                                   mode="timing", topology=topo)
        per_pe[t.pe] += runs[key].cycles
    return max(per_pe, default=0), tuple(per_pe)
