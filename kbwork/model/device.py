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
from collections.abc import Mapping
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
    """Bytes of K and V one task or chunk reads (its rows: the padded context of a whole task, ``kv_dtype``:
    2 bytes per element in bf16, 1 in fp8)."""
    return 2 * task.keys * head_dim * DTYPE_BYTES[kv_dtype]


#: Bytes per element of a partial state (m, l and O are fp32; DESIGN.md §16).
STATE_BYTES = 4


def partial_bytes(tasks: Sequence[Task], group: int, head_dim: int) -> int:
    """What a host merge of ``tasks``' split (sequence, KV head) pairs moves (DESIGN.md §16): Σ over split
    (s, h) of chunks · (2·G + G·d) · 4 (every partial m, l and O read, fp32) + G·d · 2 (O written in bf16);
    0 when nothing is split."""
    chunks: dict[tuple[int, int], int] = {}
    for t in tasks:
        if t.split:
            chunks[(t.sequence, t.kv_head)] = chunks.get((t.sequence, t.kv_head), 0) + 1
    per_part = (2 * group + group * head_dim) * STATE_BYTES
    return sum(n * per_part + group * head_dim * 2 for n in chunks.values())


class AttentionPlan(Mapping):
    """The ``run_device`` plan of one layer's attention (what :func:`attention_plan` returns): a mapping PE ->
    its launches in order, as ``Simulator.run_device`` takes it, with the simulator that owns its tensors.

    Attributes:
        sim: the :class:`~kbwork.Simulator` its tensors live in (``mode`` as asked).
        tensors: every HBM tensor by name (``q{s}.{h}``, ``K{s}.{h}``, ... for a whole task; ``q{s}.{h}.{c}``,
            ``K{s}.{h}.{c}``, ``V{s}.{h}.{c}``, ``m{s}.{h}.{c}``, ``l{s}.{h}.{c}``, ``O{s}.{h}.{c}`` for chunk c;
            ``out{s}.{h}`` where a (s, h)'s output is written, by its task or its merge).
        merges: the merge launches, ``(sequence, kv_head) -> (pe, Launch)`` (empty under ``merge="host"``).
        merge: ``"device"`` or ``"host"``.
    """

    def __init__(self, sim: Any, launches: dict[int, list], tensors: dict[str, Any], merges: dict, merge: str):
        self.sim, self._launches, self.tensors, self.merges, self.merge = sim, launches, tensors, merges, merge

    def __getitem__(self, pe: int) -> list:
        return self._launches[pe]

    def __iter__(self):
        return iter(self._launches)

    def __len__(self) -> int:
        return len(self._launches)

    def run(self, *, steady_state: bool = True, reductions: bool = True) -> Any:
        """Simulate the plan: ``sim.run_device(plan, ...)``; returns the device ``Run``."""
        return self.sim.run_device(self, steady_state=steady_state, reductions=reductions)

    def __repr__(self) -> str:
        n = sum(len(v) for v in self._launches.values())
        return f"AttentionPlan({n} launches on {len(self)} PEs, {len(self.merges)} merges, merge={self.merge!r})"


def attention_plan(tasks: Sequence[Task], device: Device, variant: str = "opt2", tile: int = 128, *, group: int,
                   head_dim: int, kv_dtype: str = "bf16", merge: str = "device", mode: str = "timing",
                   seed: int | None = None) -> AttentionPlan:
    """The ``run_device`` plan one layer's attention runs (DESIGN.md §15, §16): an :class:`AttentionPlan`.

    A whole task runs ``gqa_decode(variant, tile)`` on its PE over q (group, head_dim) bf16, K and V
    (padded_context, head_dim) in ``kv_dtype`` and out (group, head_dim) fp32. A chunk of a split (s, h)
    runs ``gqa_decode_partial`` over its rows into m, l (group, 1) and O (group, head_dim) fp32. Every tensor
    of a task or chunk lives on its PE's home channel; each PE runs its tasks and chunks in order, back to
    back. ``merge="device"``: each split (s, h) has one ``gqa_merge`` launch on the PE of its last chunk,
    ``after`` its other chunks, placed after all of that PE's tasks and chunks (merges in (s, h) order),
    writing ``out{s}.{h}`` on that PE's channel; ``merge="host"``: no merge launch (the partials are the
    run's output).

    ``mode="data"`` fills q, K and V with standard normal values from ``seed`` (every chunk of a (s, h) gets
    the same q; a chunk's K and V are its rows of the (s, h)'s); ``"timing"`` places shapes only.

    Raises:
        ValidationError: a bad ``merge`` or ``mode``, or a task the decode kernel refuses (raised when the plan
            is run).
    """
    from ..kernels.gqa_decode import gqa_decode
    from ..kernels.split import gqa_decode_partial, gqa_merge
    from ..sim import Launch, Simulator
    from .checks import _check_choice

    merge = _check_choice("merge", merge, ("device", "host"), "model.attention_plan")
    mode = _check_choice("mode", mode, ("timing", "data"), "model.attention_plan")
    sim = Simulator(device.topology, mode=mode)
    rng = np.random.default_rng(seed) if mode == "data" else None
    values: dict[tuple[int, int], tuple] = {}

    def data(t: Task):
        if rng is None:
            return None, None, None
        key = (t.sequence, t.kv_head)
        if key not in values:
            n = t.padded_context
            values[key] = (rng.standard_normal((group, head_dim)), rng.standard_normal((n, head_dim)),
                           rng.standard_normal((n, head_dim)))
        q, k, v = values[key]
        a, b = t.rows
        return q, k[a:b], v[a:b]

    def place(name: str, arr, shape, dtype: str, ch: int):
        h = (sim.hbm(name, arr, dtype=dtype, channel=ch) if arr is not None else
             sim.hbm(name, shape=shape, dtype=dtype, channel=ch))
        tensors[name] = h
        return h

    plan: dict[int, list] = {}
    tensors: dict[str, Any] = {}
    chunks: dict[tuple[int, int], list[tuple[int, Any, tuple]]] = {}
    for t in tasks:
        ch = device.home_channel(t.pe)
        name = f"{t.sequence}.{t.kv_head}" + (f".{t.chunk}" if t.split else "")
        qa, ka, va = data(t)
        q = place(f"q{name}", qa, (group, head_dim), "bf16", ch)
        k = place(f"K{name}", ka, (t.keys, head_dim), kv_dtype, ch)
        v = place(f"V{name}", va, (t.keys, head_dim), kv_dtype, ch)
        if not t.split:
            o = place(f"out{name}", None, (group, head_dim), "fp32", ch)
            plan.setdefault(t.pe, []).append(Launch(gqa_decode, q, k, v, o, variant=variant, tile=tile))
            continue
        state = (place(f"m{name}", None, (group, 1), "fp32", ch), place(f"l{name}", None, (group, 1), "fp32", ch),
                 place(f"O{name}", None, (group, head_dim), "fp32", ch))
        launch = Launch(gqa_decode_partial, q, k, v, *state, variant=variant, tile=tile)
        plan.setdefault(t.pe, []).append(launch)
        chunks.setdefault((t.sequence, t.kv_head), []).append((t.pe, launch, state))
    merges: dict[tuple[int, int], tuple[int, Any]] = {}
    if merge == "device":
        for (s, h), parts in sorted(chunks.items()):
            pe = parts[-1][0]
            out = place(f"out{s}.{h}", None, (group, head_dim), "fp32", device.home_channel(pe))
            launch = Launch(gqa_merge, [p[2] for p in parts], out, after=tuple(p[1] for p in parts[:-1]))
            plan[pe].append(launch)
            merges[(s, h)] = (pe, launch)
    return AttentionPlan(sim, dict(sorted(plan.items())), tensors, merges, merge)


def attention_run(tasks: Sequence[Task], device: Device, variant: str, tile: int, *, group: int, head_dim: int,
                  steady_state: bool = True, reductions: bool = True, kv_dtype: str = "bf16",
                  merge: str = "device") -> Any:
    """One layer's attention on ``device``: the device ``Run`` of ``tasks`` (DESIGN.md §15; chunks of the
    split mapping and their merges as :func:`attention_plan` places them, §16).

    Task t runs ``gqa_decode(variant, tile)`` on PE ``t.pe`` over q (group, head_dim) bf16, K and V
    (t.padded_context, head_dim) in ``kv_dtype`` (bf16, or fp8: DESIGN.md §17) and out (group, head_dim) fp32,
    all on that PE's home channel; each PE
    runs its tasks in order, back to back. Tensors are named ``q{s}.{h}``, ``K{s}.{h}``, ... for sequence s
    and KV head h.

    Raises:
        ValidationError: a task the decode kernel refuses (e.g. a context that is not a multiple of the tile).
    """
    plan = attention_plan(tasks, device, variant, tile, group=group, head_dim=head_dim, kv_dtype=kv_dtype,
                          merge=merge)
    return plan.run(steady_state=steady_state, reductions=reductions)


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
