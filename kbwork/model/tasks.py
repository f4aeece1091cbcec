"""One layer's attention as decode tasks on the device's PEs (DESIGN.md §15).

Each (sequence s, KV head h) is one decode task of §7 (group = heads / kv_heads).
Tasks are numbered in (s, h) order; task i runs on PE ``i mod pes``, and each PE
runs its tasks in that order, back to back. A context is rounded up to a
multiple of the tile: the padded keys are read and computed as they would be
on hardware, and the step reports them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import pandas as pd

from .checks import _check_tile, check_contexts, check_count


@dataclass(frozen=True, slots=True)
class Task:
    """One decode task: KV head ``kv_head`` of sequence ``sequence`` on PE ``pe``.

    ``index`` numbers the tasks of one device run in (sequence, KV head) order;
    ``context`` is the sequence's KV length as given, ``padded_context`` the
    length simulated (a multiple of the tile).
    """

    index: int
    sequence: int
    kv_head: int
    pe: int
    context: int
    padded_context: int


def padded(context: int, tile: int) -> int:
    """``context`` rounded up to a multiple of ``tile``."""
    return -(-int(context) // int(tile)) * int(tile)


def assign_tasks(contexts: Sequence[int], *, kv_heads: int, pes: int, tile: int,
                 first_sequence: int = 0) -> tuple[Task, ...]:
    """The tasks of one device run: every (sequence, KV head) of ``contexts``, round-robin over ``pes``.

    ``first_sequence`` is the batch index of ``contexts[0]`` (the second half of a
    ping-pong batch starts there); the mapping itself always starts at PE 0.

    Returns:
        One :class:`Task` per (sequence, KV head), in that order (none for an empty ``contexts``).

    Raises:
        ValidationError: a ``tile``, ``kv_heads`` or ``pes`` that is not a positive int, a
            ``first_sequence`` that is not a non-negative int, or bad ``contexts`` (not a list of positive
            ints, or a context beyond the tile limit).
    """
    where = "model.assign_tasks"
    tile = _check_tile(tile, where)
    kv_heads = check_count("kv_heads", kv_heads, where, "kv_heads=8 (the model's KV heads)")
    pes = check_count("pes", pes, where, "pes=96 (the device's PEs)")
    first_sequence = check_count("first_sequence", first_sequence, where, "first_sequence=0", least=0)
    contexts = check_contexts(contexts, tile, where, allow_empty=True)
    tasks = []
    for s, context in enumerate(contexts):
        p = padded(context, tile)
        for h in range(kv_heads):
            i = s * kv_heads + h
            tasks.append(Task(i, first_sequence + s, h, i % pes, int(context), p))
    return tuple(tasks)


@dataclass(frozen=True)
class Padding:
    """The keys a step pads: each context rounded up to a multiple of ``tile``.

    Counts are keys per sequence (each is padded the same in every KV head and every layer).
    """

    tile: int
    contexts: tuple[int, ...]
    padded: tuple[int, ...]

    @classmethod
    def of(cls, contexts: Sequence[int], tile: int) -> "Padding":
        """The padding of ``contexts`` at ``tile``.

        Raises:
            ValidationError: a ``tile`` that is not a positive int, or ``contexts`` not a non-empty list of
                positive ints.
        """
        tile = _check_tile(tile, "model.Padding.of")
        contexts = check_contexts(contexts, None, "model.Padding.of")
        return cls(int(tile), tuple(int(c) for c in contexts), tuple(padded(c, tile) for c in contexts))

    @property
    def per_sequence(self) -> tuple[int, ...]:
        """Padded keys of each sequence."""
        return tuple(p - c for c, p in zip(self.contexts, self.padded))

    @property
    def total(self) -> int:
        """Padded keys over the batch."""
        return sum(self.per_sequence)

    @property
    def fraction(self) -> float:
        """Padded keys as a fraction of the real ones."""
        return self.total / sum(self.contexts)

    def to_frame(self) -> pd.DataFrame:
        """One row per sequence: ``sequence, context, padded_context, padding``."""
        return pd.DataFrame({"sequence": range(len(self.contexts)), "context": self.contexts,
                             "padded_context": self.padded, "padding": self.per_sequence})

    def __repr__(self) -> str:
        return (f"Padding(tile {self.tile}: {self.total} keys over {len(self.contexts)} sequences, "
                f"{100 * self.fraction:.2f}% of {sum(self.contexts)})")
