"""The AHBM device a step's attention runs on, and one layer's attention on it as one device run (DESIGN.md §14,
§15).

A device is a topology with the device keys of §14 (``pes``, ``hbm_channels``, ``channel_bytes_per_cycle``);
:class:`Device` holds one and says what the step needs of it. One layer's attention is
:func:`attention_run`: every task a :class:`~kbwork.Launch` of the decode kernel on its PE, each PE running
its tasks back to back, all of a task's tensors (q, K, V, out) on its PE's home channel, simulated by
``Simulator.run_device`` — shared channels, the flow rule, the steady state and the exact reductions
included.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ..config import Topology, load_topology
from ..errors import ConfigError, ValidationError
from .files import DTYPE_BYTES
from .tasks import Task

#: The default device's name (DESIGN.md §14).
DEVICE_V1 = "ahbm-device-v1"
#: The device keys of DESIGN.md §14.
DEVICE_KEYS = ("pes", "hbm_channels", "channel_bytes_per_cycle")


@dataclass(frozen=True)
class Device:
    """Many PEs of one topology beside HBM channels: a topology with device keys.

    Attributes:
        topology: the device's topology (its ``pes``, ``hbm_channels``, ``channel_bytes_per_cycle``).
    """

    topology: Topology

    def __post_init__(self) -> None:
        if not isinstance(self.topology, Topology):
            got = self.topology
            hint = f" To load one by name, use model.load_device({got!r})." if isinstance(got, str) and got else ""
            raise ConfigError(f"Device: topology must be a kbwork Topology (e.g. kbwork.load_topology("
                              f"{DEVICE_V1!r})), got {got!r} (a {type(got).__name__}).{hint}")

    pes = property(lambda self: self.topology.pes)
    hbm_channels = property(lambda self: self.topology.hbm_channels)
    channel_bytes_per_cycle = property(lambda self: self.topology.channel_bytes_per_cycle)
    name = property(lambda self: self.topology.name)

    @property
    def pe(self) -> Topology:
        """One PE of the device alone on its channel: the topology with ``pes=1, hbm_channels=1`` (what a
        one-task step's attention equals a plain ``decode.run`` on)."""
        return self.topology.replace(pes=1, hbm_channels=1)

    @property
    def pes_per_channel(self) -> int:
        """PEs sharing one channel."""
        return self.pes // self.hbm_channels

    def home_channel(self, pe: int) -> int:
        """PE ``pe``'s home channel.

        Raises:
            ValidationError: ``pe`` not an int in ``[0, pes)``.
        """
        if isinstance(pe, (bool, np.bool_)) or not isinstance(pe, numbers.Integral) or not 0 <= pe < self.pes:
            raise ValidationError(f"Device.home_channel: pe must be an int from 0 to {self.pes - 1} (the device's "
                                  f"PEs), got {pe!r}.")
        return self.topology.home_channel(pe)

    @property
    def clock_hz(self) -> float:
        """The PE clock, cycles per second."""
        return self.topology.clock_ghz * 1e9

    def replace(self, **keys: Any) -> "Device":
        """This device with topology or device keys replaced (checked as ``load_topology`` checks them).

        Raises:
            ConfigError: an unknown key or a bad value.
        """
        return Device(self.topology.replace(**keys)) if keys else self

    def to_dict(self) -> dict[str, Any]:
        """The device's name and every topology key, flat."""
        return {"device": self.name, **self.topology.to_dict()}

    def __repr__(self) -> str:
        return (f"Device({self.name!r}: {self.pes} PEs, {self.hbm_channels} channels x "
                f"{self.channel_bytes_per_cycle:g} B/cycle)")


def load_device(device: str | Topology | Device | Any = DEVICE_V1, **overrides: Any) -> Device:
    """The device of a step: a topology name (``"ahbm-device-v1"``) or path, a :class:`Topology` or a
    :class:`Device`, with ``overrides`` (device keys and topology keys) applied.

    Raises:
        ConfigError: an unknown topology or key, a bad value, ``pes`` not a multiple of ``hbm_channels``.
    """
    if isinstance(device, Device):
        return device.replace(**overrides)
    return Device(load_topology(device, **overrides))


def task_kv_bytes(task: Task, head_dim: int, kv_dtype: str = "bf16") -> int:
    """Bytes of K and V one task reads (its padded context, ``kv_dtype``: 2 bytes per element in bf16, 1 in
    fp8)."""
    return 2 * task.padded_context * head_dim * DTYPE_BYTES[kv_dtype]


def attention_run(tasks: Sequence[Task], device: Device, variant: str, tile: int, *, group: int, head_dim: int,
                  steady_state: bool = True, reductions: bool = True, kv_dtype: str = "bf16") -> Any:
    """One layer's attention on ``device``: the device ``Run`` of ``tasks`` (DESIGN.md §15).

    Task t runs ``gqa_decode(variant, tile)`` on PE ``t.pe`` over q (group, head_dim) bf16, K and V
    (t.padded_context, head_dim) in ``kv_dtype`` (bf16, or fp8: DESIGN.md §17) and out (group, head_dim) fp32,
    all on that PE's home channel; each PE
    runs its tasks in order, back to back. Tensors are named ``q{s}.{h}``, ``K{s}.{h}``, ... for sequence s
    and KV head h.

    Raises:
        ValidationError: a task the decode kernel refuses (e.g. a context that is not a multiple of the tile).
    """
    from ..kernels.gqa_decode import gqa_decode
    from ..sim import Launch, Simulator

    sim = Simulator(device.topology, mode="timing")
    plan: dict[int, list] = {}
    for t in tasks:
        ch = device.home_channel(t.pe)
        name = f"{t.sequence}.{t.kv_head}"
        q = sim.hbm(f"q{name}", shape=(group, head_dim), dtype="bf16", channel=ch)
        k = sim.hbm(f"K{name}", shape=(t.padded_context, head_dim), dtype=kv_dtype, channel=ch)
        v = sim.hbm(f"V{name}", shape=(t.padded_context, head_dim), dtype=kv_dtype, channel=ch)
        o = sim.hbm(f"out{name}", shape=(group, head_dim), dtype="fp32", channel=ch)
        plan.setdefault(t.pe, []).append(Launch(gqa_decode, q, k, v, o, variant=variant, tile=tile))
    return sim.run_device(dict(sorted(plan.items())), steady_state=steady_state, reductions=reductions)


def per_pe_cycles(run: Any, pes: int) -> tuple[int, ...]:
    """Each PE's last cycle in a device ``run`` (0 for a PE that ran nothing)."""
    ran = set(run.pes)
    return tuple(run.pe(p).cycles if p in ran else 0 for p in range(pes))


def channel_bound_cycles(tasks: Sequence[Task], device: Device, head_dim: int, kv_dtype: str = "bf16") -> float:
    """The busiest channel's KV bytes / ``channel_bytes_per_cycle``: no attention run can be shorter (0 when the
    channels are unconstrained)."""
    if math.isinf(device.channel_bytes_per_cycle):
        return 0.0
    per_channel: dict[int, int] = {}
    for t in tasks:
        c = device.home_channel(t.pe)
        per_channel[c] = per_channel.get(c, 0) + task_kv_bytes(t, head_dim, kv_dtype)
    return max(per_channel.values(), default=0) / device.channel_bytes_per_cycle
