"""One KV-head task when several PEs share one HBM channel: does the per-head verdict (opt2 vs opt3) survive?

A decode task alone on its channel (DESIGN.md §7) and the same task beside
``k - 1`` others on one channel (DESIGN.md §14's flow rule shares the channel's
bandwidth) can rank the variants differently: contention makes the channel
the bottleneck, and a variant's advantage from overlapping its engines shrinks
when every variant waits for the same bytes. :func:`per_head_contention` puts
``k`` identical tasks of one model's decode shape on ``k`` PEs of one channel,
one task per PE, exactly as a step's attention would place them
(:func:`kbwork.model.device.attention_run`), for every ``k`` and variant.

>>> from kbwork import model
>>> df = model.per_head_contention("llama-3-8b", 32768, pes_per_channel=(1, 2, 3, 4))
>>> df.pivot(index="pes_per_channel", columns="variant", values="cycles")
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Sequence

import numpy as np
import pandas as pd

from ..errors import ValidationError
from .device import DEVICE_V1, attention_run, channel_bound_cycles, load_device
from .files import load_model
from .checks import _check_tile, _check_variant, check_contexts, refuse_misnamed
from .tasks import assign_tasks

COLUMNS = ["pes_per_channel", "variant", "cycles", "channel_bound_cycles", "channel_busy"]


def per_head_contention(model: Any = "llama-3-8b", context: int = 32768, *,
                        pes_per_channel: Sequence[int] = (1, 2, 3, 4), variants: Sequence[str] = ("opt2", "opt3"),
                        tile: int = 128, device: Any = DEVICE_V1, **overrides: Any) -> pd.DataFrame:
    """One KV-head decode task of ``model`` at ``context`` with ``k`` PEs on one channel, for each ``k``.

    For each ``k`` in ``pes_per_channel`` the device is ``device`` with ``pes=k, hbm_channels=1`` (and
    ``overrides``: topology keys such as ``hazard_policy`` or ``channel_bytes_per_cycle``); PE ``p`` runs
    one task (group ``heads / kv_heads``, the model's ``head_dim``, ``context`` padded to ``tile``) with its
    q, K, V and out on the shared channel. The tasks are identical, so the run's cycles are each task's.

    Returns:
        One row per (k, variant): ``pes_per_channel``, ``variant``, ``cycles`` (the device run's),
        ``channel_bound_cycles`` (the channel's KV bytes / ``channel_bytes_per_cycle``: no run is
        shorter; 0 when unconstrained) and ``channel_busy`` (that bound over ``cycles``: the fraction of
        the run the channel would be busy with K and V, at most 1).

    Raises:
        ValidationError: a ``k`` that is not a positive int, an empty or repeated list, a bad variant; a
            keyword the function sets itself or does not take (``pes=``, ``hbm_channels=``: give the k in
            ``pes_per_channel``; ``variant=``: it takes ``variants=``; ``mode=``: timing only).
        ConfigError: a bad model, device or key.
    """
    refuse_misnamed(overrides, "per_head_contention")
    ks = list(pes_per_channel) if isinstance(pes_per_channel, (list, tuple, range, np.ndarray)) else None
    # the type test before set(): an entry such as a nested array is unhashable
    if not ks or any(isinstance(k, (bool, np.bool_)) or not isinstance(k, numbers.Integral) or k <= 0
                     for k in ks) or len(set(ks)) != len(ks):
        raise ValidationError(f"per_head_contention: pes_per_channel must be distinct positive ints, e.g. "
                              f"(1, 2, 3, 4), got {pes_per_channel!r}.")
    if isinstance(variants, str) or not isinstance(variants, (list, tuple)) or not variants:
        raise ValidationError(f"per_head_contention: variants must be a non-empty list or tuple such as "
                              f"('opt2', 'opt3'), got {variants!r}.")
    for v in variants:
        _check_variant(v, "per_head_contention")
    tile = _check_tile(tile, "per_head_contention")
    (context,) = check_contexts([context], tile, "per_head_contention")
    m = load_model(model)
    rows = []
    for k in ks:
        k = int(k)
        dev = load_device(device, **{**overrides, "pes": k, "hbm_channels": 1})
        seqs = math.ceil(k / m.kv_heads)
        tasks = assign_tasks([context] * seqs, kv_heads=m.kv_heads, pes=k, tile=tile)[:k]
        bound = channel_bound_cycles(tasks, dev, m.head_dim, m.kv_dtype)
        for v in variants:
            cycles = attention_run(tasks, dev, v, tile, group=m.group, head_dim=m.head_dim, kv_dtype=m.kv_dtype).cycles
            rows.append((k, v, int(cycles), bound, bound / cycles))
    return pd.DataFrame(rows, columns=COLUMNS)
