"""The argument checks every function of :mod:`kbwork.model` shares: each refuses bad input with a
:class:`~kbwork.errors.ValidationError` that names the argument and the fix (DESIGN.md §15).

They live below :mod:`.tasks`, :mod:`.host` and :mod:`.steps` so that every one of those can use them
(:mod:`.steps` imports :mod:`.tasks`, which could not import :mod:`.steps` back).
"""

from __future__ import annotations

import numbers
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from ..errors import ValidationError

#: The most sequences one step (or one sweep point) takes. Every sequence is a few Python records
#: (its context, its padding, its tasks): 2**20 take about 2 s and 50 MB for the host placement
#: (measured: llama-3-8b at context 128), and far beyond any batch an H200's memory holds the KV cache of.
MAX_BATCH = 1 << 20
#: The most decode tasks (sequences x KV heads) one layer's attention simulates on the device. A task's
#: tiles cost little (the steady state), but each task is a kernel launch of its own, traced and laid out:
#: 2**15 tasks take about a minute, 2**16 about two minutes and 3.8 GB (measured: llama-3-8b at batch
#: 4096 and 8192, context 128). The bound refuses what would take much longer and more memory (a batch
#: typed with a digit too many).
MAX_DEVICE_TASKS = 1 << 16


def _check_choice(what: str, value: Any, choices: Sequence[str], where: str) -> str:
    if not isinstance(value, str) or value not in choices:
        raise ValidationError(f"{where}: {what} {value!r} is unknown; use one of {', '.join(map(repr, choices))}.")
    return value


def _check_variant(variant: Any, where: str) -> str:
    from ..kernels.gqa_decode import VARIANTS

    return _check_choice("decode variant", variant, tuple(VARIANTS), where)


def _check_tile(tile: Any, where: str) -> int:
    if isinstance(tile, (bool, np.bool_)) or not isinstance(tile, numbers.Integral) or tile <= 0:
        raise ValidationError(f"{where}: tile must be a positive int (the decode tile and the padding unit), "
                              f"got {tile!r} ({type(tile).__name__}); e.g. tile=128.")
    return int(tile)


def check_count(what: str, value: Any, where: str, example: str, *, least: int = 1) -> int:
    """``value`` as an int of at least ``least`` (1: positive, 0: non-negative), or a ValidationError naming
    ``what`` with ``example`` (e.g. ``"pes=96"``) as the fix.

    Raises:
        ValidationError: a bool, a non-integer or a value below ``least``.
    """
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral) or value < least:
        need = "a positive int" if least == 1 else "a non-negative int" if least == 0 else f"an int >= {least}"
        raise ValidationError(f"{where}: {what} must be {need}, got {value!r} ({type(value).__name__}); "
                              f"e.g. {example}.")
    return int(value)


def check_batch(batch: int, where: str, flag: str = "the batch") -> None:
    """Refuse a batch of more than :data:`MAX_BATCH` sequences (``flag`` names it: ``"--batch"``, an axis).

    Raises:
        ValidationError: ``batch`` above the limit.
    """
    if batch > MAX_BATCH:
        raise ValidationError(f"{where}: {flag} is {batch} sequences; a step takes at most {MAX_BATCH} "
                              f"(kbwork.model.checks.MAX_BATCH). Use a smaller batch.")


def check_device_tasks(batch: int, kv_heads: int, where: str) -> None:
    """Refuse a layer's attention of more than :data:`MAX_DEVICE_TASKS` decode tasks on the device.

    Raises:
        ValidationError: ``batch · kv_heads`` above the limit, with the largest batch that fits.
    """
    if batch * kv_heads > MAX_DEVICE_TASKS:
        raise ValidationError(f"{where}: batch {batch} x {kv_heads} KV heads is {batch * kv_heads} decode tasks per "
                              f"layer on the device; a step simulates at most {MAX_DEVICE_TASKS} "
                              f"(kbwork.model.checks.MAX_DEVICE_TASKS), i.e. a batch of at most "
                              f"{MAX_DEVICE_TASKS // kv_heads} for this model. Use a smaller batch, or "
                              f"placement='host' (the GPU alone, nothing simulated).")


def check_contexts(contexts: Any, tile: int | None, where: str = "model.step", *,
                   allow_empty: bool = False) -> tuple[int, ...]:
    """``contexts`` as a tuple of ints, or a ValidationError naming the bad entry and the fix.

    ``tile`` is the decode tile the contexts are padded to: a context of more than
    :data:`kbwork.decode.MAX_TILES` tiles is refused. ``tile=None`` is for contexts that are not
    simulated (the host's attention, a padding count): no tile limit. ``allow_empty`` lets an empty list
    through (no sequences).

    Raises:
        ValidationError: not a one-dimensional list, tuple, range or array; empty (unless
            ``allow_empty``); more than :data:`MAX_BATCH` entries; an entry that is not a positive int or
            is beyond the tile limit.
    """
    from ..decode import MAX_TILES

    if isinstance(contexts, np.ndarray) and contexts.ndim != 1:
        raise ValidationError(f"{where}: contexts must be one-dimensional (one KV length per sequence), got an "
                              f"array of shape {contexts.shape}.")
    if isinstance(contexts, (str, bytes)) or not isinstance(contexts, (list, tuple, range, np.ndarray)):
        raise ValidationError(f"{where}: contexts must be a list of KV lengths, one per sequence of the batch "
                              f"(e.g. [8192] * 16 for a batch of 16 at 8k), got {contexts!r} "
                              f"({type(contexts).__name__}).")
    if len(contexts) == 0 and not allow_empty:
        raise ValidationError(f"{where}: contexts is empty; give one KV length per sequence (e.g. [8192]).")
    check_batch(len(contexts), where, "the batch (len(contexts))")
    out = []
    for i, c in enumerate(contexts):
        # a plain int first: the abstract-class test is a Python-level call, and a step checks its
        # contexts (up to MAX_BATCH of them) in every piece it hands them to
        if c.__class__ is not int and (isinstance(c, (bool, np.bool_)) or not isinstance(c, numbers.Integral)):
            raise ValidationError(f"{where}: contexts[{i}] is {c!r} ({type(c).__name__}); every context is a "
                                  f"positive int (the KV length, the new token included).")
        if c <= 0:
            raise ValidationError(f"{where}: contexts[{i}] is {c}; every context is a positive int (the KV length, "
                                  f"the new token included).")
        if tile is not None and -(-int(c) // tile) > MAX_TILES:
            raise ValidationError(f"{where}: contexts[{i}] = {c} is {-(-int(c) // tile)} tiles of {tile}; a decode "
                                  f"task simulates at most {MAX_TILES}. Use a larger tile or a shorter context.")
        out.append(int(c))
    return tuple(out)


#: Keywords that look like a step's or a comparison's own arguments but are not: what each function takes
#: instead. Without this they would reach the topology overrides and read as a misspelt topology key.
_TIMING_ONLY = ("a model step is timing-only (DESIGN.md §15): it takes no mode=; drop mode={value!r}. "
                "For the numbers of one decode task, kbwork.decode.run takes mode='data'.")
_VARIANTS_LIST = "it takes variants=, a list or tuple (e.g. variants={variants}), not variant=."
_PLACEMENTS_LIST = "it takes placements=, a list or tuple (e.g. placements={placements}), not placement=."
_SETS_ITS_DEVICE = ("it sets pes and hbm_channels itself (pes=k, hbm_channels=1 for each k): give the k in "
                    "pes_per_channel= instead.")
MISNAMED = {
    "model.step": {
        "mode": _TIMING_ONLY,
        "variants": "one step runs one decode variant: pass variant= (e.g. variant='opt2'); model.compare "
                    "takes variants=, a list.",
        "placements": "one step has one placement: pass placement= ('ahbm' or 'host'); model.compare takes "
                      "placements=, a list.",
        "schedules": "one step has one schedule: pass schedule= ('serial' or 'ping_pong'); model.sweep takes "
                     "schedules=, a list.",
    },
    "model.compare": {
        "mode": _TIMING_ONLY,
        "variant": _VARIANTS_LIST,
        "placement": _PLACEMENTS_LIST,
        "schedules": "it runs one schedule: pass schedule= ('serial' or 'ping_pong'); model.sweep "
                     "takes schedules=, a list.",
    },
    "sweep": {
        "mode": _TIMING_ONLY,
        "variant": _VARIANTS_LIST,
        "placement": _PLACEMENTS_LIST,
        "schedule": "it takes schedules=, a list or tuple (e.g. schedules={schedules}), not schedule=.",
        "contexts": "it takes a context= axis (every sequence of a point at that KV length, e.g. "
                    "context=[1024, 8192]), not contexts=.",
    },
    "per_head_contention": {
        "mode": "it simulates in timing mode only (cycles, no numbers): it takes no mode=; drop mode={value!r}. "
                "For the numbers of one decode task, kbwork.decode.run takes mode='data'.",
        "variant": _VARIANTS_LIST,
        "pes": _SETS_ITS_DEVICE,
        "hbm_channels": _SETS_ITS_DEVICE,
    },
}


def refuse_misnamed(keywords: Mapping[str, Any] | Iterable[str], where: str) -> None:
    """Refuse a keyword of :data:`MISNAMED` given to ``where`` (a step's ``mode=``, a comparison's
    ``variant=``), saying what it takes instead; any other keyword is left to the caller.

    Raises:
        ValidationError: such a keyword.
    """
    hints = MISNAMED.get(where, {})
    for key in keywords:
        if key in hints:
            value = keywords[key] if isinstance(keywords, Mapping) else "..."
            # the example repeats the value given when it is one name ('opt3' -> ('opt3',))
            one = (value,) if isinstance(value, str) else None
            raise ValidationError(f"{where}: " + hints[key].format(
                value=value, variants=one or ("opt2", "opt3"), placements=one or ("ahbm", "host"),
                schedules=one or ("serial", "ping_pong")))
