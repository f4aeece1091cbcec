"""One decode step of a model: :func:`step`, :class:`Step` and :func:`compare` (DESIGN.md §15).

>>> from kbwork import model
>>> s = model.step("llama-3-70b", [16384] * 16)                  # opt2 on the AHBM device, serial
>>> s.tokens_per_s, s.bound
>>> s.breakdown                                                  # per phase: us per layer and per step
>>> model.compare("llama-3-8b", [8192] * 16, schedule="ping_pong")   # variants x placements
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Callable, ContextManager, Sequence

import numpy as np
import pandas as pd

from ..errors import ValidationError
from .capacity import check_capacity as _check_capacity
from .capacity import memory_frame, overfull
from .checks import _check_choice, _check_tile, _check_variant, check_contexts, check_device_tasks, \
    refuse_misnamed
from .energy import split_keys, step_energy
from .device import DEVICE_V1, Device, attention_run, channel_bound_cycles, load_device, partial_bytes, \
    per_pe_cycles
from .files import Host, Model, load_host, load_model, with_dtypes
from .host import HOST_BANDWIDTH, HOST_FLOPS, LAYER_GEMMS, LM_HEAD, Gemm, HostAttention, host_attention, \
    layer_gemms, lm_head
from .schedule import HALVES, SCHEDULES, HalfCosts, chain_jobs, list_schedule, serial_seconds
from .tasks import MAPPINGS, MERGES, Padding, Task, assign_tasks, padded

PLACEMENTS = ("ahbm", "host")
AHBM = "ahbm"
HANDOFF = "handoff"
#: What can bound a step, in the order ties are broken.
BOUND_KINDS = (AHBM, HOST_BANDWIDTH, HOST_FLOPS, HANDOFF)
#: The ``variant`` of a host-placement row of :func:`compare`: no PE variant runs.
NO_VARIANT = "-"
#: The variants :func:`compare`, :func:`kbwork.model.sweep` and ``kbwork step`` run by default.
DEFAULT_VARIANTS = ("opt2", "opt3", "a1")
BREAKDOWN_COLUMNS = ["phase", "resource", "bound", "per_layer_us", "per_step_us"]
MERGE = "merge"


# --- records -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class AttentionRun:
    """One device run of a layer's attention (the whole batch, or one half under ping-pong).

    Attributes:
        half: ``""`` (the whole batch), ``"A"`` or ``"B"``.
        tasks: its tasks, mapped from PE 0.
        cycles: the layer's attention, PE cycles (the device run's end).
        per_pe_cycles: each PE's last cycle (0 for an idle PE).
        seconds: ``cycles`` at the PE clock.
        channel_bound_cycles: the busiest channel's KV bytes / ``channel_bytes_per_cycle`` (0 when the
            channel is unconstrained): no run can be shorter.
        run: the device ``Run`` (op_log with its ``pe`` column, critical path, steady state, reductions; what
            ``kbwork.analysis`` reads).
    """

    half: str
    tasks: tuple[Task, ...]
    cycles: int
    per_pe_cycles: tuple[int, ...]
    seconds: float
    channel_bound_cycles: float
    run: Any = None

    @property
    def busiest_pe(self) -> int:
        """The PE that sets ``cycles`` (the lowest-numbered one on a tie)."""
        return int(np.argmax(self.per_pe_cycles))

    def __repr__(self) -> str:
        half = f" half {self.half}" if self.half else ""
        return (f"AttentionRun({len(self.tasks)} tasks{half}: {self.cycles} cycles, busiest PE {self.busiest_pe}, "
                f"channel bound {self.channel_bound_cycles:.0f})")


@dataclass(frozen=True)
class _Half:
    """What one half (or the whole batch) costs: its GEMMs, its LM head and its attention."""

    name: str
    rows: int
    gemms: dict[str, Gemm]
    lm_head: Gemm
    attention_s: float
    attention: AttentionRun | None
    host_attention: HostAttention | None
    #: the host's merge of this half's split-KV partials per layer, seconds (0 unless merge="host" split
    #: something), and the bytes it moves
    merge_s: float = 0.0
    merge_bytes: int = 0


@dataclass(frozen=True)
class _SerialCompare:
    """What a ping-pong step needs to run the serial step of its batch (one device run of the whole batch's
    attention), kept so that the run happens only when :attr:`Step.serial_seconds` or :attr:`Step.notes` is
    first read."""

    model: Model
    host: Host
    device: Device
    contexts: tuple[int, ...]
    variant: str
    tile: int
    mapping: str
    merge: str
    #: the step's ``progress`` (the run is reported as a phase of its own); not pickled
    progress: Callable[[str], ContextManager[Any]] | None = field(default=None, compare=False)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "progress": None}  # a progress bar's phase is not data

    def whole(self) -> _Half:
        """The whole batch as one half (one device run of its attention, mapped from PE 0)."""
        return _half("", 0, self.contexts, self.model, self.host, self.device, self.variant, self.tile,
                     self.mapping, self.merge, self.progress, ", for the serial step to compare")


class Step:
    """One decode step of a model (what :func:`step` returns).

    Attributes:
        model, host, device: the :class:`Model`, :class:`Host` and :class:`Device`.
        contexts: one KV length per sequence; ``batch`` their count.
        variant, placement, schedule, tile: as run (the host placement is always serial).
        seconds: the step; ``tokens_per_s`` = batch / seconds.
        breakdown: per phase (QKV, handoff, attention, O, FFN up, FFN down, LM head; under ping-pong also
            ``overlap``, the time the overlap hides, negative) its resource, what binds it, the time per
            layer and per step in µs; ``per_step_us`` adds up to the step.
        shares: seconds per step of each thing that can bound it (host flops, host bandwidth, ahbm,
            handoff: the GEMMs by the side of their roofline that binds, the attention, the hand-offs);
            ``kbwork step --json``'s ``shares`` are the same seconds; ``shares_frame`` gives them in µs, in
            a column that says so.
        bound_kind: the largest share; ``bound`` says it in words, with the attention's own bound when it
            is ``"ahbm"``.
        padding: the keys padded to the tile (:class:`Padding`).
        tasks: the decode tasks of one layer (under ping-pong half A's, then half B's, each mapped from
            PE 0).
        attention_runs: one :class:`AttentionRun` per device run of a layer (one, or one per half).
        attention_cycles: PE cycles of one layer's attention (summed over the halves under ping-pong);
            ``None`` for the host placement.
        attention_cycles_per_half: under ping-pong (two halves), each half's attention of one layer, PE
            cycles: ``{"A": ..., "B": ...}`` (their sum is ``attention_cycles``); else ``None``.
        serial_seconds: under ping-pong (two halves), the same batch's step under the serial schedule,
            seconds (its attention one device run of the whole batch), what :attr:`notes` compares with;
            else ``None``. That device run happens when ``serial_seconds`` or ``notes`` is first read, not
            before (a sweep's rows and ``compare`` read neither).
        memory: what the step places where (DESIGN.md §15, "Capacity: what fits"): a DataFrame ``where``
            (host|device), ``what`` (weights|kv), ``bytes``, ``capacity_bytes`` (``inf``: unbounded).
        fits: whether every ``where``'s bytes fit in its capacity (``False`` only from
            ``check_capacity=False``: otherwise the step raised).
        host_attention: the host placement's :class:`HostAttention` per layer, else ``None``.
        attention: the device ``Run`` of one layer's attention (half A's under ping-pong; both are in
            ``attention_runs``), ``None`` for the host placement.
        timeline: the schedule, one row per task: ``task, half, layer, phase, resource, start, end`` (µs).
        notes: what the step did that was not asked for in so many words (under ping-pong the last one says
            whether it is slower than serial, so reading it runs the serial step's device run as
            ``serial_seconds`` does).
        mapping: ``"sequence"`` (DESIGN.md §15: one PE per (sequence, KV head)) or ``"split"`` (§16: each
            layer's tiles balanced over the PEs, a sequence's keys split into chunks where they span PEs).
        merge: where split chunks are merged: ``"device"`` (a ``gqa_merge`` launch per split (s, h), inside
            the attention run) or ``"host"`` (a merge phase on the host after attention, the ``merge`` row of
            :attr:`breakdown`); under ``mapping="sequence"`` nothing is split, and the merge costs 0.
        merge_bytes: the partial bytes one layer's host merge moves (0 unless ``merge="host"`` split
            something), bytes.
        weight_dtype, kv_dtype: the step's weights (``"fp8"``: W8A8) and KV cache dtypes, ``"bf16"`` or
            ``"fp8"`` (DESIGN.md §17); ``model`` carries them too.
        energy: the step's energy (DESIGN.md §18), one row per (part, resource, kind): ``part, resource, kind,
            joules`` (:func:`kbwork.model.energy.step_energy`); ``joules`` their sum, ``tokens_per_j`` =
            batch / joules, ``watts`` = joules / seconds. Computed on first use; :meth:`with_energy` prices the
            same step under other energy keys without simulating it again.
    """

    def __init__(self, *, model: Model, host: Host, device: Device, contexts: tuple[int, ...], variant: str,
                 placement: str, schedule: str, tile: int, halves: list[_Half], timeline: pd.DataFrame,
                 seconds: float, notes: tuple[str, ...], memory: pd.DataFrame, serial: _SerialCompare | None = None,
                 mapping: str = "sequence", merge: str = "device"):
        self.model, self.host, self.device, self.contexts = model, host, device, contexts
        self.batch = len(contexts)
        self.variant, self.placement, self.schedule, self.tile = variant, placement, schedule, tile
        self._halves = halves
        self.mapping, self.merge = mapping, merge
        self.merge_bytes = sum(h.merge_bytes for h in halves)
        self.timeline = timeline
        self.seconds = seconds
        self.tokens_per_s = self.batch / seconds
        self._notes = notes  # without the comparison with serial, which :attr:`notes` adds on first use
        self._serial = serial
        self.padding = Padding.of(contexts, tile)
        self.attention_runs = tuple(h.attention for h in halves if h.attention is not None)
        self.tasks = tuple(t for r in self.attention_runs for t in r.tasks)
        self.attention_cycles = sum(r.cycles for r in self.attention_runs) if self.attention_runs else None
        self.attention_cycles_per_half = ({r.half: r.cycles for r in self.attention_runs}
                                          if len(self.attention_runs) > 1 else None)
        self.memory = memory
        self.fits = not overfull(memory)
        self.attention = self.attention_runs[0].run if self.attention_runs else None
        self.host_attention = halves[0].host_attention
        self.breakdown = self._breakdown()
        self.shares = self._shares()
        self.bound_kind = max(BOUND_KINDS, key=lambda k: (self.shares[k], -BOUND_KINDS.index(k)))
        self._bound: str | None = None
        self.weight_dtype, self.kv_dtype = model.weight_dtype, model.kv_dtype
        self._energy: pd.DataFrame | None = None
        self._energy_keys: dict[str, Any] = {}  # the device's energy keys priced instead of its topology's

    # --- the serial step of the same batch (ping-pong only), on first use ----------------------------
    @cached_property
    def _compared(self) -> tuple[float | None, tuple[str, ...]]:
        """``serial_seconds`` and ``notes``: under ping-pong the whole batch's device run is made here, once."""
        if self._serial is None:
            return None, self._notes
        c = self._serial
        whole = c.whole()
        serial_s = serial_seconds(c.model.layers, _costs(whole, "device", c.host.handoff_s))
        if self.seconds <= serial_s:
            return serial_s, self._notes
        return serial_s, (*self._notes, _ping_pong_slower(c.model, c.device, self._halves, whole, self.seconds,
                                                           serial_s))

    @property
    def serial_seconds(self) -> float | None:
        """Under ping-pong (two halves), the same batch's step under the serial schedule, seconds; else
        ``None``. The first read runs the whole batch's attention on the device (once)."""
        return self._compared[0]

    @property
    def notes(self) -> tuple[str, ...]:
        """What the step did that was not asked for in so many words; under ping-pong, last, whether it is slower
        than serial and why (the first read runs what :attr:`serial_seconds` does)."""
        return self._compared[1]

    # --- energy (DESIGN.md §18; kbwork.model.energy) --------------------------------------------
    @property
    def energy(self) -> pd.DataFrame:
        """The step's energy rows ``part, resource, kind, joules`` (a copy; see the class docstring)."""
        if self._energy is None:
            self._energy = step_energy(self, **self._energy_keys)
        return self._energy.copy()

    @property
    def joules(self) -> float:
        """The step's energy, J: the sum of :attr:`energy`'s rows."""
        if self._energy is None:
            self._energy = step_energy(self, **self._energy_keys)
        return float(self._energy["joules"].sum())

    @property
    def tokens_per_j(self) -> float:
        """Tokens per joule: ``batch / joules`` (``inf`` when every energy key is 0)."""
        j = self.joules
        return self.batch / j if j > 0 else math.inf

    @property
    def watts(self) -> float:
        """The mean power drawn over the step, W: ``joules / seconds``."""
        return self.joules / self.seconds

    def with_energy(self, **keys: Any) -> "Step":
        """This step priced under other energy keys (``hbm_pj_per_bit=0.55``, ``busy_w=300``): the device's
        energy keys and the host's (:data:`kbwork.model.energy.STEP_ENERGY_KEYS`). Nothing is simulated again:
        the timing, the runs and their counts are this step's; ``host`` is the host with its keys replaced.

        Raises:
            ConfigError: a key that is not an energy key (other keys change the timing: run ``model.step``
                again), or a value it refuses, naming the key.
        """
        import copy

        device, host = split_keys(keys, "Step.with_energy")
        new = copy.copy(self)
        if host:
            new.host = self.host.replace(**host)
        new._energy_keys = {**self._energy_keys, **device}
        new._energy = None
        new._energy = step_energy(new, **new._energy_keys)  # validates the device keys now, not on first use
        return new

    # --- the accounting -----------------------------------------------------------------------
    def _breakdown(self) -> pd.DataFrame:
        layers, hs = self.model.layers, self._halves
        rows = []

        def add(phase: str, resource: str, bound: str, per_layer_s: float | None, per_step_s: float) -> None:
            rows.append((phase, resource, bound, None if per_layer_s is None else per_layer_s * 1e6,
                         per_step_s * 1e6))

        def gemm_row(name: str) -> None:
            gs = [h.gemms[name] for h in hs]
            s = sum(g.seconds for g in gs)
            add(name, "host", _one_bound(gs), s, layers * s)

        gemm_row("QKV")
        if self.placement == AHBM:
            s = len(hs) * 2 * self.host.handoff_s
            add(HANDOFF, "", HANDOFF, s, layers * s)
            s = sum(h.attention_s for h in hs)
            add("attention", "device", AHBM, s, layers * s)
            s = sum(h.merge_s for h in hs)
            add(MERGE, "host" if self.merge == "host" else "device", HOST_BANDWIDTH if self.merge == "host" else AHBM,
                s, layers * s)
        else:
            s = hs[0].attention_s
            add("attention", "host", HOST_BANDWIDTH, s, layers * s)
        for name in LAYER_GEMMS[1:]:
            gemm_row(name)
        lm = [h.lm_head for h in hs]
        add(LM_HEAD, "host", _one_bound(lm), None, sum(g.seconds for g in lm))
        df = pd.DataFrame(rows, columns=BREAKDOWN_COLUMNS)
        if len(hs) > 1:
            hidden = self.seconds * 1e6 - df["per_step_us"].sum()
            df.loc[len(df)] = ("overlap", "", "", None, hidden)
        return df

    def _shares(self) -> dict[str, float]:
        layers = self.model.layers
        shares = dict.fromkeys(BOUND_KINDS, 0.0)
        for h in self._halves:
            for g in h.gemms.values():
                shares[g.bound] += layers * g.seconds
            shares[h.lm_head.bound] += h.lm_head.seconds
            if self.placement == AHBM:
                shares[AHBM] += layers * h.attention_s
                shares[HANDOFF] += layers * 2 * self.host.handoff_s
                shares[HOST_BANDWIDTH] += layers * h.merge_s  # the host's merge streams the partials
            else:
                shares[HOST_BANDWIDTH] += layers * h.attention_s  # streaming the KV cache
        return shares

    @property
    def bound(self) -> str:
        """What bounds the step: the largest of :attr:`shares`; for ``"ahbm"`` with the bound of the longest
        attention run (``kbwork explain``'s, of that device run)."""
        if self._bound is None:
            self._bound = self.bound_kind
            if self.bound_kind == AHBM and self.attention_runs:
                from .. import analysis

                run = max(self.attention_runs, key=lambda r: r.cycles)
                pe = run.busiest_pe
                mine = sum(1 for t in run.tasks if t.pe == pe)
                self._bound = (f"ahbm: busiest PE {pe} ({mine} task{'s' if mine > 1 else ''}); "
                               f"{analysis.explain(run.run).short}")
        return self._bound

    @property
    def shares_frame(self) -> pd.DataFrame:
        """:attr:`shares` as a DataFrame: ``what, per_step_us, fraction`` (of the step)."""
        return pd.DataFrame([(k, v * 1e6, v / self.seconds) for k, v in self.shares.items()],
                            columns=["what", "per_step_us", "fraction"])

    def to_dict(self) -> dict[str, Any]:
        """The step as plain JSON-serialisable values (what ``kbwork step --json`` prints per case)."""
        def clean(v: Any) -> Any:
            if isinstance(v, (float, np.floating)):
                return None if not math.isfinite(v) else float(v)
            if isinstance(v, np.integer):
                return int(v)
            return v

        return {
            "model": self.model.name, "batch": self.batch, "contexts": list(self.contexts),
            "variant": self.variant if self.placement == AHBM else NO_VARIANT, "placement": self.placement,
            "schedule": self.schedule, "tile": self.tile, "seconds": self.seconds, "tokens_per_s": self.tokens_per_s,
            "breakdown": [{k: clean(v) for k, v in r.items()} for r in self.breakdown.to_dict(orient="records")],
            "bound": self.bound, "bound_kind": self.bound_kind,
            "shares": dict(self.shares),  # seconds, as Step.shares and "seconds" (docs/model.md)
            "attention_cycles": self.attention_cycles, "attention_cycles_per_half": self.attention_cycles_per_half,
            "serial_seconds": self.serial_seconds, "padding": self.padding.total,
            "joules": self.joules, "tokens_per_j": self.tokens_per_j, "watts": self.watts,
            "energy": [{k: clean(v) for k, v in r.items()} for r in self.energy.to_dict(orient="records")],
            "fits": self.fits,
            "memory": [{k: clean(v) for k, v in r.items()} for r in self.memory.to_dict(orient="records")],
            "host": self.host.to_dict(),
            "device": {k: clean(v) for k, v in self.device.to_dict().items()} if self.placement == AHBM else None,
            "notes": list(self.notes),
            "weight_dtype": self.weight_dtype, "kv_dtype": self.kv_dtype,
            "mapping": self.mapping, "merge": self.merge, "merge_bytes": self.merge_bytes,
        }

    def __repr__(self) -> str:
        ctx = (f"context {self.contexts[0]}" if len(set(self.contexts)) == 1 else
               f"contexts {min(self.contexts)}-{max(self.contexts)}")
        what = f"{self.variant} on ahbm" if self.placement == AHBM else "attention on the host"
        if self.placement == AHBM and self.mapping != "sequence":
            what += f", {self.mapping} (merge on the {self.merge})"
        return (f"Step({self.model.name}, batch {self.batch}, {ctx}, {what}, {self.schedule}: "
                f"{self.seconds * 1e3:.4g} ms, {self.tokens_per_s:.4g} tokens/s; bound: {self.bound_kind}"
                f"{'' if self.fits else '; does not fit'})")


def _one_bound(gemms: Sequence[Gemm]) -> str:
    bounds = {g.bound for g in gemms}
    return bounds.pop() if len(bounds) == 1 else "mixed"


# --- the step ----------------------------------------------------------------------------------
def step(model: str | Model, contexts: Sequence[int], *, variant: str = "opt2", device: Any = DEVICE_V1,
         host: Any = "h200", placement: str = "ahbm", schedule: str = "serial", tile: int = 128,
         check_capacity: bool = True, progress: Callable[[str], ContextManager[Any]] | None = None,
         weight_dtype: str | None = None, kv_dtype: str | None = None, mapping: str = "sequence",
         merge: str = "device", **overrides: Any) -> Step:
    """One decode step of ``model`` over a batch of ``contexts`` (DESIGN.md §15), timing mode.

    Args:
        model: a model name (``"llama-3-8b"``, ``"llama-3-70b"``), a path to a model TOML, or a Model.
        contexts: one KV length per sequence (the new token included); each is padded to ``tile`` on the
            device.
        variant: the decode variant every task runs (placement ``"ahbm"``).
        device: ``"ahbm-device-v1"``, a topology name or path, a Topology (with the device keys of DESIGN.md
            §14), or a Device.
        host: a host name or path, a mapping of host keys over ``h200``'s, or a Host.
        placement: ``"ahbm"`` (attention on the device) or ``"host"`` (the GPU alone).
        schedule: ``"serial"`` or ``"ping_pong"`` (placement ``"ahbm"``; the host placement is serial).
        tile: the decode tile, also the padding unit.
        check_capacity: refuse a step whose weights or KV cache do not fit where they are placed (DESIGN.md
            §15, "Capacity: what fits"), before anything is simulated; ``False`` times it anyway and
            returns it with ``fits=False``.
        progress: a callable taking a phase's name (a device run, the host) and returning a context manager
            held while that phase runs (``kbwork step``'s progress bar); ``None``: nothing.
        weight_dtype, kv_dtype: ``"bf16"`` or ``"fp8"`` over the model's own (``None``: the model's; DESIGN.md
            §17): fp8 weights are W8A8 GEMMs at the host's ``peak_tflops_fp8``, 1 byte per weight and
            activation element; fp8 KV is 1 byte per element on either placement (the device's tasks run
            with ``kv_dtype="fp8"``).
        mapping: ``"sequence"`` (each (sequence, KV head) one task on one PE, DESIGN.md §15) or ``"split"``
            (a layer's tiles balanced over the PEs, a (sequence, KV head) spanning PEs split into chunks,
            §16; placement ``"ahbm"``).
        merge: where split chunks are merged (``mapping="split"``): ``"device"`` (a ``gqa_merge`` launch on
            the PE of the last chunk, after the others) or ``"host"`` (a merge phase on the host after
            attention, ``partial bytes / (hbm_bytes_per_s · eta_bw) + launch_s``).
        **overrides: device keys (``pes``, ``hbm_channels``, ``channel_bytes_per_cycle``) and topology keys
            (``fixed_cycles``, ``hazard_policy``, ...).

    Returns:
        A :class:`Step`.

    Raises:
        ValidationError: bad contexts, variant, placement, schedule, mapping, merge or tile; a batch beyond
            :data:`~kbwork.model.checks.MAX_BATCH` sequences or, on the device, beyond
            :data:`~kbwork.model.checks.MAX_DEVICE_TASKS` decode tasks per layer; a keyword that is not
            ``step``'s (``mode=``: a step is timing-only; ``variants=``, ``placements=``: ``compare``'s).
        ConfigError: a bad model, host, device or key.
        CapacityError: (a ConfigError) the weights or the KV cache do not fit where they are placed, unless
            ``check_capacity=False``; the message names where, the GiB of weights and of KV, the capacity and
            the ways out.
    """
    where = "model.step"
    phase = progress if progress is not None else (lambda name: contextlib.nullcontext())
    refuse_misnamed(overrides, where)
    m = with_dtypes(load_model(model), weight_dtype, kv_dtype)
    h = load_host(host)
    variant = _check_variant(variant, where)
    placement = _check_choice("placement", placement, PLACEMENTS, where)
    schedule = _check_choice("schedule", schedule, SCHEDULES, where)
    mapping = _check_choice("mapping", mapping, MAPPINGS, where)
    merge = _check_choice("merge", merge, MERGES, where)
    tile = _check_tile(tile, where)
    ctx = check_contexts(contexts, tile, where)
    if placement == AHBM:
        check_device_tasks(len(ctx), m.kv_heads, where)
    dev = load_device(device, **overrides)
    memory = step_memory(m, h, dev, placement, ctx, tile)
    if not isinstance(check_capacity, (bool, np.bool_)):
        raise ValidationError(f"{where}: check_capacity must be True or False, got {check_capacity!r}.")
    if check_capacity:
        _check_capacity(memory, model=m, batch=len(ctx), placement=placement, where=where)
    notes: list[str] = []
    if merge != "device" and mapping == "sequence":
        notes.append(f"merge={merge!r} applies to mapping='split'; under mapping='sequence' no task is split, so "
                     "nothing is merged.")
    halves: list[_Half] = []
    serial: _SerialCompare | None = None
    if placement == "host":
        if schedule != "serial":
            notes.append(f"schedule={schedule!r} applies to placement='ahbm'; the host placement is serial.")
            schedule = "serial"
        if mapping != "sequence":
            notes.append(f"mapping={mapping!r} applies to placement='ahbm'; the host placement maps nothing to PEs.")
        with phase("host: GEMMs and attention"):
            ha = host_attention(m, h, ctx)
            halves.append(_Half("", len(ctx), layer_gemms(m, h, len(ctx)), lm_head(m, h, len(ctx)), ha.seconds,
                                None, ha))
            costs = [_costs(halves[0], "host", 0.0)]
    else:
        if schedule == "ping_pong" and len(ctx) == 1:
            notes.append("one sequence: half B is empty, so ping-pong is the serial schedule.")
        split = -(-len(ctx) // 2)
        parts = [(HALVES[0], 0, ctx[:split]), (HALVES[1], split, ctx[split:])] if schedule == "ping_pong" else \
            [("", 0, ctx)]
        halves = [_half(name, first, part, m, h, dev, variant, tile, mapping, merge, progress)
                  for name, first, part in parts if part]
        if len(halves) > 1:  # the serial step of the same batch, which ping-pong must beat: run when first read
            serial = _SerialCompare(m, h, dev, ctx, variant, tile, mapping, merge, progress)
        costs = [_costs(x, "device", h.handoff_s) for x in halves]
    with phase("host: the schedule"):
        timeline = list_schedule(chain_jobs(m.layers, costs))
        seconds = serial_seconds(m.layers, costs[0]) if len(costs) == 1 else float(timeline["end"].max())
        timeline[["start", "end"]] *= 1e6
    return Step(model=m, host=h, device=dev, contexts=ctx, variant=variant, placement=placement, schedule=schedule,
                tile=tile, halves=halves, timeline=timeline, seconds=seconds, notes=tuple(notes), memory=memory,
                serial=serial, mapping=mapping, merge=merge)


def _half(name: str, first: int, part: Sequence[int], m: Model, h: Host, dev: Device, variant: str, tile: int,
          mapping: str, merge: str, progress: Callable[[str], ContextManager[Any]] | None,
          why: str = "") -> _Half:
    """Half ``name`` (``""``: the whole batch) of a step on the device: the sequences ``part``, the first of them
    sequence ``first``; its attention one device run of its tasks mapped from PE 0 (reported to ``progress`` as
    a phase, its label ending in ``why``), its GEMMs of ``len(part)`` rows and, under ``merge="host"``, the
    host's merge of its split partials."""
    seqs = f"{len(part)} sequence{'s' if len(part) > 1 else ''}"
    label = (f"half {name}, {seqs}" if name else seqs) + why
    phase = progress if progress is not None else (lambda _: contextlib.nullcontext())
    with phase(f"{variant} on the device: one layer's attention ({label}, {len(part) * m.kv_heads} tasks)"):
        tasks = assign_tasks(part, kv_heads=m.kv_heads, pes=dev.pes, tile=tile, first_sequence=first,
                             mapping=mapping)
        drun = attention_run(tasks, dev, variant, tile, group=m.group, head_dim=m.head_dim, kv_dtype=m.kv_dtype,
                             merge=merge)
        run = AttentionRun(name, tasks, drun.cycles, per_pe_cycles(drun, dev.pes), drun.cycles / dev.clock_hz,
                           channel_bound_cycles(tasks, dev, m.head_dim, m.kv_dtype), drun)
    moved = partial_bytes(tasks, m.group, m.head_dim) if merge == "host" else 0
    merge_s = moved / (h.hbm_bytes_per_s * h.eta_bw) + h.launch_s if moved else 0.0
    return _Half(name, len(part), layer_gemms(m, h, len(part)), lm_head(m, h, len(part)), run.seconds, run, None,
                 merge_s, moved)


def step_memory(m: Model, h: Host, dev: Device, placement: str, contexts: Sequence[int], tile: int) -> pd.DataFrame:
    """What a step of ``contexts`` places where (:func:`kbwork.model.capacity.memory_frame`): on the device the
    contexts padded to ``tile``."""
    return memory_frame(m, h, dev.topology.hbm_gib, placement, contexts, [padded(c, tile) for c in contexts])


def _ping_pong_slower(m: Model, dev: Device, halves: list[_Half], whole: _Half, seconds: float,
                      serial_s: float) -> str:
    """Why ping-pong is slower than the serial schedule for this batch, in one sentence."""
    head = (f"ping-pong is slower than serial for this batch ({seconds * 1e3:.4g} ms against {serial_s * 1e3:.4g} ms "
            f"a step)")
    cycles = [x.attention.cycles for x in halves]
    tasks = len(whole.attention.tasks)
    if tasks <= dev.pes:
        return (f"{head}: each half is mapped from PE 0, and with {tasks} tasks on {dev.pes} PEs each half's "
                f"attention costs about a whole batch's ({' and '.join(f'{c:,}' for c in cycles)} cycles against "
                f"{whole.attention.cycles:,} for the whole batch at once), so the halves add up to about twice "
                f"the serial attention, and each half re-reads the weights.")
    host_pp = sum(x.gemms[g].seconds for x in halves for g in x.gemms) * m.layers
    host_serial = sum(g.seconds for g in whole.gemms.values()) * m.layers
    return (f"{head}: each half re-reads the weights (the host's GEMMs take {host_pp * 1e3:.4g} ms a step against "
            f"{host_serial * 1e3:.4g} ms serial), more than the overlap of attention ({whole.attention_s * 1e6:.4g} "
            f"µs a layer for the whole batch) hides.")


def _costs(half: _Half, resource: str, handoff: float) -> HalfCosts:
    g = half.gemms
    return HalfCosts(qkv=g["QKV"].seconds, attention=half.attention_s,
                     o_ffn=g["O"].seconds + g["FFN up"].seconds + g["FFN down"].seconds,
                     lm_head=half.lm_head.seconds, attention_resource=resource, handoff=handoff, merge=half.merge_s)


# --- variants x placements ---------------------------------------------------------------------
COMPARE_COLUMNS = ["variant", "placement", "schedule", "seconds", "tokens_per_s", "attention_us_per_layer",
                   "bound_kind", "bound", "fits", "joules", "tokens_per_j", "watts"]


def cases(variants: Sequence[str], placements: Sequence[str], where: str) -> list[tuple[str, str]]:
    """The (variant, placement) pairs a comparison runs: every variant on the device, the host once."""
    if isinstance(variants, str) or not isinstance(variants, (list, tuple)) or not variants:
        raise ValidationError(f"{where}: variants must be a non-empty list or tuple of decode variants such as "
                              f"('opt2', 'opt3', 'a1'), got {variants!r}.")
    if isinstance(placements, str) or not isinstance(placements, (list, tuple)) or not placements:
        raise ValidationError(f"{where}: placements must be a non-empty list or tuple of {PLACEMENTS}, got "
                              f"{placements!r}.")
    for v in variants:
        _check_variant(v, where)
    for p in placements:
        _check_choice("placement", p, PLACEMENTS, where)
    if len(set(variants)) != len(variants) or len(set(placements)) != len(placements):
        raise ValidationError(f"{where}: a variant or placement is named twice ({tuple(variants)}, "
                              f"{tuple(placements)}).")
    out: list[tuple[str, str]] = []
    for p in placements:
        out += [(v, p) for v in variants] if p == AHBM else [(variants[0], p)]
    return out


#: The columns :func:`compare` adds after ``schedule`` when it is given ``mappings`` or ``merges``.
MAPPING_COLUMNS = ["mapping", "merge"]


def compare_row(s: Step, mapping: bool = False) -> dict[str, Any]:
    """One row of :func:`compare` for step ``s`` (with its ``mapping`` and ``merge`` when ``mapping``)."""
    attn = (s.attention_cycles / s.device.clock_hz if s.placement == AHBM else s.host_attention.seconds) * 1e6
    how = {"mapping": s.mapping, "merge": s.merge} if mapping else {}
    return {"variant": s.variant if s.placement == AHBM else NO_VARIANT, "placement": s.placement,
            "schedule": s.schedule, **how, "seconds": s.seconds, "tokens_per_s": s.tokens_per_s,
            "attention_us_per_layer": attn, "bound_kind": s.bound_kind, "bound": s.bound, "fits": s.fits,
            "joules": s.joules, "tokens_per_j": s.tokens_per_j, "watts": s.watts}


def compare(model: str | Model, contexts: Sequence[int], *, variants: Sequence[str] = DEFAULT_VARIANTS,
            placements: Sequence[str] = PLACEMENTS, schedule: str = "serial", device: Any = DEVICE_V1,
            host: Any = "h200", tile: int = 128, weight_dtype: str | None = None, kv_dtype: str | None = None,
            mappings: Sequence[str] | None = None, merges: Sequence[str] | None = None,
            **overrides: Any) -> pd.DataFrame:
    """Every variant on the device and the host alone, on one batch: a DataFrame, one row per case.

    ``mappings`` (``"sequence"``, ``"split"``) and ``merges`` (``"device"``, ``"host"``), when given, are two
    more axes of the device's cases (DESIGN.md §16): every variant under every mapping, a split one under
    every merge (``"sequence"`` splits nothing: its row has the first merge); the rows then carry
    ``mapping`` and ``merge`` after ``schedule``. ``None`` (the default): the sequence mapping alone and no
    such columns.

    Columns: ``variant`` (``"-"`` for the host placement, where no PE variant runs), ``placement``,
    ``schedule``, ``seconds``, ``tokens_per_s``, ``attention_us_per_layer``, ``bound_kind``, ``bound``,
    ``fits`` (whether the case's weights and KV cache fit where they are placed: a case that does not is
    timed all the same, never refused), ``joules`` (the step's energy, J), ``tokens_per_j`` and ``watts``
    (DESIGN.md §18). ``weight_dtype`` and ``kv_dtype`` are :func:`step`'s, for every case.

    Raises:
        The errors of :func:`step`, and a ValidationError for an empty, repeated or unknown variant or
        placement, or a keyword that is not ``compare``'s (``variant=``, ``placement=``: it takes
        ``variants=`` and ``placements=``; ``mode=``: a step is timing-only); all before anything is
        simulated.
    """
    refuse_misnamed(overrides, "model.compare")
    todo = cases(variants, placements, "model.compare")
    ways = mapping_cases(mappings, merges, "model.compare")
    tile = _check_tile(tile, "model.compare")
    ctx = check_contexts(contexts, tile, "model.compare")
    if any(p == AHBM for _, p in todo):
        check_device_tasks(len(ctx), load_model(model).kv_heads, "model.compare")
    load_device(device, **dict(overrides))
    model = with_dtypes(load_model(model), weight_dtype, kv_dtype)
    show = mappings is not None or merges is not None
    rows = [compare_row(step(model, contexts, variant=v, device=device, host=host, placement=p, schedule=schedule,
                             tile=tile, check_capacity=False, mapping=mp, merge=mg, **overrides), show)
            for v, p in todo for mp, mg in (ways if p == AHBM else ways[:1])]
    columns = COMPARE_COLUMNS[:3] + MAPPING_COLUMNS + COMPARE_COLUMNS[3:] if show else COMPARE_COLUMNS
    return pd.DataFrame(rows, columns=columns)


def mapping_cases(mappings: Sequence[str] | None, merges: Sequence[str] | None, where: str) -> list[tuple[str, str]]:
    """The (mapping, merge) pairs a comparison runs on the device: every mapping, a split one under every merge
    (``None``: ``("sequence",)`` and ``("device",)``).

    Raises:
        ValidationError: an empty, repeated or unknown mapping or merge.
    """
    out = []
    lists = []
    for what, given, choices, default in (("mappings", mappings, MAPPINGS, "sequence"),
                                          ("merges", merges, MERGES, "device")):
        given = (default,) if given is None else given
        if isinstance(given, str) or not isinstance(given, (list, tuple)) or not given or len(set(given)) != len(given):
            raise ValidationError(f"{where}: {what} must be a non-empty list or tuple of distinct values of "
                                  f"{choices}, got {given!r}.")
        lists.append([_check_choice(what[:-1], g, choices, where) for g in given])
    for mp in lists[0]:
        out += [(mp, mg) for mg in lists[1]] if mp == "split" else [(mp, lists[1][0])]
    return out
