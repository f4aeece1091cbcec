"""``kbwork step``: one decode step of a model, tokens per second per variant and placement (DESIGN.md §15).

:func:`add_parser` adds the subcommand to the ``kbwork`` command's subparsers
and :func:`cmd_step` runs it; ``kbwork.cli.main`` is the entry point (with its
error handling, the same for every subcommand). As everywhere on the command line,
every mistake, a malformed argument too, ends with one ``kbwork: error: ...`` line
and exit status 2, never a traceback.

A step whose weights or KV cache do not fit where they are placed (DESIGN.md §15, "Capacity: what
fits") is refused in one ``kbwork: error:`` line before anything is simulated, unless
``--no-capacity-check``: then it is timed, and ``fits: false`` is in its table and its JSON (never a
warning on stderr). A step that simulates shows a progress bar of its phases on stderr (each device run, the
host), as the other commands do; ``--quiet`` (and ``--json``) turn it off.

As on ``kbwork run``, ``--set key=value`` (repeatable) sets one topology key of the device
(DESIGN.md §15: a step takes topology overrides), e.g. ``--set tcm_bytes=2097152``.

    kbwork step --model llama-3-8b --batch 16 --context 32768
    kbwork step --model llama-3-70b --batch 16 --context 32768 --no-capacity-check   # 160 GiB of KV: fits nowhere
    kbwork step --model llama-3-8b --context 1024,4096,32768 --variants opt2,a1 --schedule ping_pong --json
    kbwork step --model llama-3-70b --context 5120 --placement host --weight-dtype fp8   # W8A8 on the H200
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
from typing import Any

from ..argtypes import nonnegative_float, positive_int, topology_setting
from ..cliargs import one_or_more_variants
from ..cliargs import tcm_hint as shared_tcm_hint
from ..config import apply_settings
from ..errors import ConfigError, KbworkError, ValidationError

PLACEMENT_CHOICES = ("ahbm", "host", "both")


#: The flags of ``kbwork step`` that set a topology key themselves (``--set`` may not set it a second time).
_KEY_FLAGS = {"hazard_policy": ("--hazard-policy", "hazard_policy")}


def topology_overrides(a: argparse.Namespace) -> dict[str, Any]:
    """The topology keys the options set (``--hazard-policy`` and every ``--set``), each checked against
    ``--device`` now, so an error names the flag that set it.

    Returns:
        ``key -> value``, for :func:`kbwork.model.load_device`.

    Raises:
        ValidationError: a key set twice.
        ConfigError: a bad device, an unknown topology key or a bad value (naming ``--set key=value``).
    """
    from .device import load_device
    from .files import HOST_KEYS

    def refuse(key: str, text: str) -> None:
        if key in HOST_KEYS[1:]:  # "name" is a topology key too
            raise ConfigError(f"--set {key}={text}: {key} is a host key, and --set sets topology keys of the "
                              f"device; use --handoff-us for the hand-off, or --host FILE with that {key}.")

    flags = {key: (flag, getattr(a, attr)) for key, (flag, attr) in _KEY_FLAGS.items()
             if getattr(a, attr, None) is not None}
    return apply_settings(load_device(a.device), getattr(a, "settings", None) or [], flags, refuse)


def tcm_hint(a: argparse.Namespace) -> str:
    """What ``kbwork step`` can type for a TCM large enough, to follow a TCM overflow's message
    (:func:`kbwork.cliargs.tcm_hint`, in the options ``kbwork step`` has: ``--tile``, ``--device``)."""
    from .device import load_device
    from .files import load_model

    def sizes() -> dict[str, Any]:
        m = load_model(a.model)
        return dict(tile=a.tile, group=m.group, head_dim=m.head_dim,
                    topology=load_device(a.device, **topology_overrides(a)).pe)

    return shared_tcm_hint(a.variants, sizes, file_flag="--device", also=", a smaller --tile",
                           smaller="a smaller --tile")


def context_list(text: str) -> tuple[int, ...]:
    """An argparse type: one KV length (every sequence) or a comma list of them (one per sequence)."""
    parts = [p.strip() for p in text.split(",")]
    out = []
    for p in parts:
        try:
            value = int(p)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a positive KV length or a comma list of them "
                                             f"(e.g. 32768 or 1024,4096), got {text!r}") from None
        if value < 1:
            raise argparse.ArgumentTypeError(f"expected positive KV lengths, got {value} in {text!r}")
        out.append(value)
    return tuple(out)


context_list.__name__ = "contexts"


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``step`` to ``subparsers`` (what ``ArgumentParser.add_subparsers()`` returned)."""
    from .schedule import SCHEDULES
    from .steps import DEFAULT_VARIANTS

    s = subparsers.add_parser("step", help="one decode step of a model: tokens/s per variant and placement, and "
                                           "what bounds it")
    s.add_argument("--model", default="llama-3-8b", help="model name (data/models/) or .toml path "
                                                         "(default llama-3-8b)")
    s.add_argument("--batch", type=positive_int, default=None,
                   help="sequences in the batch (default 1, or the length of a --context list)")
    s.add_argument("--context", type=context_list, default=(8192,),
                   help="KV length of every sequence, or a comma list, one per sequence (default 8192)")
    s.add_argument("--variants", type=one_or_more_variants, default=DEFAULT_VARIANTS,
                   help=f"decode variants on the device, comma-separated (default {','.join(DEFAULT_VARIANTS)})")
    s.add_argument("--placement", default="both", choices=PLACEMENT_CHOICES,
                   help="attention on the AHBM device, on the host alone, or both (default both)")
    s.add_argument("--schedule", default="serial", choices=SCHEDULES,
                   help="serial, or ping_pong (two halves overlapping host and device) for the device placement "
                        "(default serial)")
    s.add_argument("--tile", type=positive_int, default=128, help="decode tile and padding unit (default 128)")
    s.add_argument("--mapping", default="sequence", choices=("sequence", "split"),
                   help="sequence: each (sequence, KV head) on one PE; split: a layer's KV tiles balanced over "
                        "every PE, chunks merged (default sequence)")
    s.add_argument("--merge", default="device", choices=("device", "host"),
                   help="where split chunks are merged: a merge launch on the device, or a merge phase on the "
                        "host (default device)")
    s.add_argument("--weight-dtype", default=None, choices=("bf16", "fp8"),
                   help="the weights' dtype over the model's: fp8 is W8A8, GEMMs at the host's peak_tflops_fp8")
    s.add_argument("--kv-dtype", default=None, choices=("bf16", "fp8"),
                   help="the KV cache's dtype over the model's: fp8 (e4m3fn) is 1 byte per element")
    s.add_argument("--handoff-us", type=nonnegative_float, default=None,
                   help="host <-> device hand-off latency, us (default: the host's, 2.0 for h200)")
    s.add_argument("--host", default="h200", help="host name (data/hosts/) or .toml path (default h200)")
    s.add_argument("--device", default="ahbm-device-v1", help="device or topology name, or .toml path "
                                                              "(default ahbm-device-v1)")
    s.add_argument("--hazard-policy", default=None, choices=["strict_fifo", "rw_aware"],
                   help="PE hazard policy (default: the device's, strict_fifo)")
    s.add_argument("--set", action="append", default=[], type=topology_setting, metavar="KEY=VALUE",
                   dest="settings", help="set one topology key of the device, e.g. --set tcm_bytes=2097152 or "
                                         "--set channel_bytes_per_cycle=80 (repeatable; any key of the "
                                         "topology file)")
    s.add_argument("--json", action="store_true", help="print every case as JSON (seconds, tokens_per_s, "
                                                       "breakdown, bound, fits, memory; docs/model.md lists "
                                                       "every key)")
    s.add_argument("--no-capacity-check", action="store_true",
                   help="time a step whose weights or KV cache do not fit where they are placed (its output "
                        "says fits: false) instead of refusing it")
    s.add_argument("-q", "--quiet", action="store_true", help="no progress bar on stderr")
    # tcm_hint: what kbwork.cli.main may add to a TCM overflow's message, in this command's own options
    s.set_defaults(fn=cmd_step, tcm_hint=tcm_hint)
    return s


def _contexts(a: argparse.Namespace) -> list[int]:
    from .checks import MAX_BATCH

    ctx = list(a.context)
    if a.batch is not None and a.batch > MAX_BATCH:  # before a list of that many contexts is made
        raise ValidationError(f"--batch {a.batch}: a step takes at most {MAX_BATCH} sequences; use a smaller "
                              f"--batch.")
    if len(ctx) == 1:
        return ctx * (a.batch or 1)
    if a.batch is not None and a.batch != len(ctx):
        raise ValidationError(f"--batch {a.batch} does not match the {len(ctx)} lengths of --context; omit --batch "
                              f"or give --batch {len(ctx)} (or give one --context for every sequence).")
    return ctx


def cmd_step(a: argparse.Namespace) -> int:
    """Run ``kbwork step`` for parsed arguments ``a``; returns the exit status (0).

    Raises:
        ValidationError: a ``--batch`` that does not match a ``--context`` list, or beyond what a step
            takes (:data:`~kbwork.model.checks.MAX_BATCH` sequences, and on the device
            :data:`~kbwork.model.checks.MAX_DEVICE_TASKS` decode tasks per layer); a key set twice.
        ConfigError: a bad model, host, device or ``--set``.
        TcmOverflowError: a tile whose working set does not fit in the device's TCM (:func:`tcm_hint` says
            what to type).
    """
    from ..errors import CapacityError
    from .capacity import capacity_message, overfull
    from .checks import MAX_DEVICE_TASKS, check_contexts
    from .device import load_device
    from .files import load_host, load_model, with_dtypes
    from .steps import cases, step, step_memory

    contexts = _contexts(a)
    m = with_dtypes(load_model(a.model), a.weight_dtype, a.kv_dtype)
    host = load_host(a.host)
    if a.handoff_us is not None:
        host = host.replace(handoff_us=a.handoff_us)
    device = load_device(a.device, **topology_overrides(a))
    placements = ("ahbm", "host") if a.placement == "both" else (a.placement,)
    todo = cases(a.variants, placements, "kbwork step")
    tasks = len(contexts) * m.kv_heads
    if "ahbm" in placements and tasks > MAX_DEVICE_TASKS:
        raise ValidationError(f"a batch of {len(contexts)} x {m.kv_heads} KV heads of {m.name} is {tasks} decode "
                              f"tasks per layer on the device; kbwork step simulates at most {MAX_DEVICE_TASKS} "
                              f"(a batch of at most {MAX_DEVICE_TASKS // m.kv_heads} for this model). Use a smaller "
                              f"--batch, or --placement host (the GPU alone, nothing simulated).")
    check_contexts(contexts, a.tile, "model.step")  # what step() would say, before the capacity check
    memory = {p: step_memory(m, host, device, p, contexts, a.tile) for p in placements}
    if any(overfull(x) for x in memory.values()) and not a.no_capacity_check:  # before any progress
        raise CapacityError(capacity_message(memory, model=m, batch=len(contexts), placement="",
                                             where="kbwork step", cli=True))
    phases = [name for v, p in todo for name in _phase_names(v, p, a.schedule, len(contexts))]
    bar_of = getattr(a, "progress_bar", None)  # kbwork.cli's bar (it ranks above this module)
    bar = bar_of(a, phases) if bar_of is not None else contextlib.nullcontext()
    with bar:
        progress = getattr(bar, "phase", None)
        steps = [step(m, contexts, variant=v, device=device, host=host, placement=p, schedule=a.schedule,
                      tile=a.tile, check_capacity=not a.no_capacity_check, progress=progress, mapping=a.mapping,
                      merge=a.merge) for v, p in todo]
        for s in steps:  # the report prints notes, so a ping-pong step's serial comparison runs anyway: run it
            s.serial_seconds  # here, where the bar counts it (the first read makes the whole batch's device run)
    if a.json:
        print(json.dumps({"model": m.to_dict(), "batch": len(contexts), "contexts": contexts, "tile": a.tile,
                          "cases": [s.to_dict() for s in steps]}, indent=2))
    else:
        print(format_steps(steps))
    return 0


def _phase_names(variant: str, placement: str, schedule: str, batch: int) -> list[str]:
    """The phases :func:`kbwork.model.step` reports for one case: each device run of a layer's attention (under
    ping-pong one per half and the whole batch's, for the serial step it is compared with), then the host."""
    if placement == "host":
        return ["host: GEMMs and attention", "host: the schedule"]
    runs = 3 if schedule == "ping_pong" and batch > 1 else 1
    return [f"{variant} on the device"] * runs + ["host: the schedule"]


def figure(x: float, decimals: int = 1) -> str:
    """``x`` with at least ``decimals`` decimals and at least three significant digits, so no nonzero figure
    prints as zero (``0.00074`` stays ``0.000740``, ``387.25`` is ``387.2``)."""
    if x == 0 or not math.isfinite(x):
        return f"{x:.{decimals}f}"
    return f"{x:.{max(decimals, 2 - math.floor(math.log10(abs(x))))}f}"


def format_steps(steps: list[Any]) -> str:
    """The report ``kbwork step`` prints: the setting, one row per case, and what bounds each."""
    first = steps[0]
    ctx = first.contexts
    ctx_text = (f"context {ctx[0]}" if len(set(ctx)) == 1 else
                f"contexts {min(ctx)}-{max(ctx)} (mean {sum(ctx) / len(ctx):.0f})")
    dtypes = "".join(f"; {w} {d}" for w, d in (("weights", first.weight_dtype), ("KV", first.kv_dtype)) if d != "bf16")
    lines = [f"{first.model.label} decode step: batch {first.batch}, {ctx_text}; tile {first.tile} "
             f"({first.padding.total} padded keys){dtypes}",
             f"host: {first.host!r}"]
    if any(s.placement == "ahbm" for s in steps):
        lines.append(f"device: {first.device!r}")
        if first.mapping != "sequence":
            lines.append(f"mapping: {first.mapping} (merge on the {first.merge}; DESIGN.md §16)")
    lines += ["",
              f"{'placement':10}{'variant':9}{'schedule':11}{'ms/step':>10}{'tokens/s':>11}{'attention us/layer':>20}"
              f"{'J/step':>9}{'tokens/J':>10}{'W':>8}{'fits':>6}"]
    for s in steps:
        variant = s.variant if s.placement == "ahbm" else "-"
        attn = (s.attention_cycles / s.device.clock_hz if s.placement == "ahbm" else s.host_attention.seconds) * 1e6
        lines.append(f"{s.placement:10}{variant:9}{s.schedule:11}{figure(s.seconds * 1e3, 3):>10}"
                     f"{figure(s.tokens_per_s):>11}{figure(attn, 2):>20}"
                     f"{figure(s.joules, 3):>9}{figure(s.tokens_per_j, 2):>10}{figure(s.watts):>8}"
                     f"{str(s.fits).lower():>6}")
    lines.append("")
    if len(steps) > 1:
        best = max(steps, key=lambda s: s.tokens_per_s)
        label = f"{best.placement} {best.variant}" if best.placement == "ahbm" else "host alone"
        lines.append(f"fastest: {label} ({figure(best.tokens_per_s)} tokens/s)")
    for s in steps:
        label = f"{s.placement} {s.variant} {s.schedule}" if s.placement == "ahbm" else "host alone"
        lines.append(f"bound, {label}: {s.bound}")
    for s in steps:
        label = f"{s.placement} {s.variant} {s.schedule}" if s.placement == "ahbm" else "host alone"
        by = s.energy.groupby(["resource", "kind"])["joules"].sum()
        (where, kind), top = by.idxmax(), by.max()
        lines.append(f"energy, {label}: {figure(s.joules, 3)} J a step, {figure(s.joules / s.batch * 1e3, 2)} mJ "
                     f"a token, {figure(s.watts)} W; largest: {where} {kind} {100 * top / s.joules:.0f}%")
    for s in steps:
        if s.attention_cycles_per_half:
            us = {k: c / s.device.clock_hz * 1e6 for k, c in s.attention_cycles_per_half.items()}
            lines.append(f"attention us/layer, ahbm {s.variant} ping_pong: the sum of half A's "
                         f"{figure(us['A'], 2)} and half B's {figure(us['B'], 2)}")
    for s in steps:
        if not s.fits:
            label = f"{s.placement} {s.variant} {s.schedule}" if s.placement == "ahbm" else "host alone"
            lines.append(f"fits: false, {label}: " + "; ".join(
                f"{r.where} {r.what} {r.bytes / 2 ** 30:.1f} GiB" for r in s.memory.itertuples()) +
                f" (capacity: host {s.host.gpu_hbm_gib:g} GiB, device {s.device.topology.hbm_gib:g} GiB)")
    for note in dict.fromkeys(n for s in steps for n in s.notes):
        lines.append(f"note: {note}")
    return "\n".join(lines)
