"""``kbwork step``: one decode step of a model, tokens per second per variant and placement (DESIGN.md §15).

:func:`add_parser` adds the subcommand to the ``kbwork`` command's subparsers
and :func:`cmd_step` runs it; ``kbwork.cli.main`` is the entry point (with its
error handling, the same for every subcommand). As everywhere on the command line,
a malformed argument ends with argparse's usage line and exit status 2, and
every other mistake with one ``kbwork: error: ...`` line and exit status 2,
never a traceback.

    kbwork step --model llama-3-70b --batch 16 --context 32768
    kbwork step --model llama-3-8b --context 1024,4096,32768 --variants opt2,a1 --schedule ping_pong --json
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from ..argtypes import nonnegative_float, positive_int
from ..errors import ValidationError

PLACEMENT_CHOICES = ("ahbm", "host", "both")




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


def variant_list(text: str) -> tuple[str, ...]:
    """An argparse type: one or more registered decode variants, comma-separated, none twice."""
    from ..kernels.gqa_decode import VARIANTS

    names = tuple(x.strip() for x in text.split(",") if x.strip())
    unknown = [x for x in names if x not in VARIANTS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown variant(s) {', '.join(unknown)}; known: {', '.join(VARIANTS)}")
    if not names or len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"expected one or more different variants, comma-separated "
                                         f"(e.g. opt2,opt3,a1), got {text!r}")
    return names


variant_list.__name__ = "variants"


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
    s.add_argument("--variants", type=variant_list, default=DEFAULT_VARIANTS,
                   help=f"decode variants on the device, comma-separated (default {','.join(DEFAULT_VARIANTS)})")
    s.add_argument("--placement", default="both", choices=PLACEMENT_CHOICES,
                   help="attention on the AHBM device, on the host alone, or both (default both)")
    s.add_argument("--schedule", default="serial", choices=SCHEDULES,
                   help="serial, or ping_pong (two halves overlapping host and device) for the device placement "
                        "(default serial)")
    s.add_argument("--tile", type=positive_int, default=128, help="decode tile and padding unit (default 128)")
    s.add_argument("--handoff-us", type=nonnegative_float, default=None,
                   help="host <-> device hand-off latency, us (default: the host's, 2.0 for h200)")
    s.add_argument("--host", default="h200", help="host name (data/hosts/) or .toml path (default h200)")
    s.add_argument("--device", default="ahbm-device-v1", help="device or topology name, or .toml path "
                                                              "(default ahbm-device-v1)")
    s.add_argument("--hazard-policy", default=None, choices=["strict_fifo", "rw_aware"],
                   help="PE hazard policy (default: the device's, strict_fifo)")
    s.add_argument("--json", action="store_true", help="print every case as JSON (seconds, tokens_per_s, "
                                                       "breakdown, bound)")
    s.set_defaults(fn=cmd_step)
    return s


def _contexts(a: argparse.Namespace) -> list[int]:
    ctx = list(a.context)
    if len(ctx) == 1:
        return ctx * (a.batch or 1)
    if a.batch is not None and a.batch != len(ctx):
        raise ValidationError(f"--batch {a.batch} does not match the {len(ctx)} lengths of --context; omit --batch "
                              f"or give --batch {len(ctx)} (or give one --context for every sequence).")
    return ctx


def cmd_step(a: argparse.Namespace) -> int:
    """Run ``kbwork step`` for parsed arguments ``a``; returns the exit status (0)."""
    from .device import load_device
    from .files import load_host, load_model
    from .steps import cases, step

    contexts = _contexts(a)
    m = load_model(a.model)
    host = load_host(a.host)
    if a.handoff_us is not None:
        host = host.replace(handoff_us=a.handoff_us)
    overrides = {} if a.hazard_policy is None else {"hazard_policy": a.hazard_policy}
    device = load_device(a.device, **overrides)
    placements = ("ahbm", "host") if a.placement == "both" else (a.placement,)
    todo = cases(a.variants, placements, "kbwork step")
    steps = [step(m, contexts, variant=v, device=device, host=host, placement=p, schedule=a.schedule, tile=a.tile)
             for v, p in todo]
    if a.json:
        print(json.dumps({"model": m.to_dict(), "batch": len(contexts), "contexts": contexts, "tile": a.tile,
                          "cases": [s.to_dict() for s in steps]}, indent=2))
    else:
        print(format_steps(steps))
    return 0


def format_steps(steps: list[Any]) -> str:
    """The report ``kbwork step`` prints: the setting, one row per case, and what bounds each."""
    first = steps[0]
    ctx = first.contexts
    ctx_text = (f"context {ctx[0]}" if len(set(ctx)) == 1 else
                f"contexts {min(ctx)}-{max(ctx)} (mean {sum(ctx) / len(ctx):.0f})")
    lines = [f"{first.model.name} decode step: batch {first.batch}, {ctx_text}; tile {first.tile} "
             f"({first.padding.total} padded keys)",
             f"host: {first.host!r}"]
    if any(s.placement == "ahbm" for s in steps):
        lines.append(f"device: {first.device!r}")
    lines += ["",
              f"{'placement':10}{'variant':9}{'schedule':11}{'ms/step':>10}{'tokens/s':>11}{'attention us/layer':>20}"]
    for s in steps:
        variant = s.variant if s.placement == "ahbm" else "-"
        attn = (s.attention_cycles / s.device.clock_hz if s.placement == "ahbm" else s.host_attention.seconds) * 1e6
        lines.append(f"{s.placement:10}{variant:9}{s.schedule:11}{s.seconds * 1e3:>10.3f}{s.tokens_per_s:>11.1f}"
                     f"{attn:>20.2f}")
    lines.append("")
    if len(steps) > 1:
        best = max(steps, key=lambda s: s.tokens_per_s)
        label = f"{best.placement} {best.variant}" if best.placement == "ahbm" else "host alone"
        lines.append(f"fastest: {label} ({best.tokens_per_s:.1f} tokens/s)")
    for s in steps:
        label = f"{s.placement} {s.variant} {s.schedule}" if s.placement == "ahbm" else "host alone"
        lines.append(f"bound, {label}: {s.bound}")
    for note in dict.fromkeys(n for s in steps for n in s.notes):
        lines.append(f"note: {note}")
    return "\n".join(lines)
