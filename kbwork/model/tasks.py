"""One layer's attention as decode tasks on the device's PEs (DESIGN.md §15, §16).

Two mappings:

* ``"sequence"`` (§15): each (sequence s, KV head h) is one decode task of §7 (group = heads / kv_heads).
  Tasks are numbered in (s, h) order; task i runs on PE ``i mod pes``, and each PE runs its tasks in that
  order, back to back.
* ``"split"`` (§16): a work unit is one tile of one (s, h); the W units are ordered by (s, h), then tile, and
  PE p gets the units ``[⌊p·W/P⌋, ⌊(p+1)·W/P⌋)``. A (s, h) whose units all fall on one PE is a whole task;
  one whose units span several PEs becomes one chunk per PE (a ``gqa_decode_partial`` over its rows).

A context is rounded up to a multiple of the tile: the padded keys are read and computed as they would be
on hardware, and the step reports them.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Sequence

import pandas as pd

from .checks import _check_choice, _check_tile, check_contexts, check_count

#: How a layer's (sequence, KV head) pairs are mapped to PEs (DESIGN.md §15, §16).
MAPPINGS = ("sequence", "split")
#: Where a split (sequence, KV head)'s partial states are merged (DESIGN.md §16).
MERGES = ("device", "host")


@dataclass(frozen=True, slots=True)
class Task:
    """One decode task: KV head ``kv_head`` of sequence ``sequence`` on PE ``pe``.

    ``index`` numbers the tasks of one device run in (sequence, KV head) order (then chunk);
    ``context`` is the sequence's KV length as given, ``padded_context`` the
    length simulated (a multiple of the tile). Under the split mapping (DESIGN.md §16) a (sequence, KV head)
    whose tiles span several PEs is one row per chunk: ``chunk`` is its index in split order (0, 1, ...;
    0 for a whole task too) and ``rows`` the keys ``(start, stop)`` it reads; a whole task reads
    ``(0, padded_context)``.
    """

    index: int
    sequence: int
    kv_head: int
    pe: int
    context: int
    padded_context: int
    chunk: int = 0
    rows: tuple[int, int] | None = None
    #: whether this row is a chunk of a (sequence, KV head) split over several PEs (a partial decode)
    split: bool = False

    def __post_init__(self) -> None:
        if self.rows is None:
            object.__setattr__(self, "rows", (0, self.padded_context))

    @property
    def keys(self) -> int:
        """Keys this task or chunk reads: ``rows[1] - rows[0]``."""
        return self.rows[1] - self.rows[0]


def padded(context: int, tile: int) -> int:
    """``context`` rounded up to a multiple of ``tile``."""
    return -(-int(context) // int(tile)) * int(tile)


def assign_tasks(contexts: Sequence[int], *, kv_heads: int, pes: int, tile: int,
                 first_sequence: int = 0, mapping: str = "sequence") -> tuple[Task, ...]:
    """The tasks of one device run: every (sequence, KV head) of ``contexts``, round-robin over ``pes``
    (``mapping="sequence"``), or its tiles balanced over ``pes`` (``mapping="split"``, DESIGN.md §16: whole
    tasks and chunks, one row per decode or partial launch, in unit order).

    ``first_sequence`` is the batch index of ``contexts[0]`` (the second half of a
    ping-pong batch starts there); the mapping itself always starts at PE 0.

    Returns:
        One :class:`Task` per (sequence, KV head), in that order (none for an empty ``contexts``).

    Raises:
        ValidationError: a ``tile``, ``kv_heads`` or ``pes`` that is not a positive int, a
            ``first_sequence`` that is not a non-negative int, bad ``contexts`` (not a list of positive
            ints, or a context beyond the tile limit), or an unknown ``mapping``.
    """
    where = "model.assign_tasks"
    tile = _check_tile(tile, where)
    kv_heads = check_count("kv_heads", kv_heads, where, "kv_heads=8 (the model's KV heads)")
    pes = check_count("pes", pes, where, "pes=96 (the device's PEs)")
    first_sequence = check_count("first_sequence", first_sequence, where, "first_sequence=0", least=0)
    contexts = check_contexts(contexts, tile, where, allow_empty=True)
    mapping = _check_choice("mapping", mapping, MAPPINGS, where)
    if mapping == "split":
        return _split(contexts, kv_heads, pes, tile, first_sequence)
    tasks = []
    for s, context in enumerate(contexts):
        p = padded(context, tile)
        for h in range(kv_heads):
            i = s * kv_heads + h
            tasks.append(Task(i, first_sequence + s, h, i % pes, int(context), p))
    return tuple(tasks)


def _split(contexts: Sequence[int], kv_heads: int, pes: int, tile: int, first_sequence: int) -> tuple[Task, ...]:
    """The split mapping (DESIGN.md §16): unit u (a tile of one (s, h), in (s, h) then tile order) on the PE p
    with ``⌊p·W/P⌋ <= u < ⌊(p+1)·W/P⌋``."""
    units = [padded(c, tile) // tile for c in contexts for _ in range(kv_heads)]
    W = sum(units)
    starts = [p * W // pes for p in range(pes + 1)]
    tasks: list[Task] = []
    u0 = 0
    for i, n in enumerate(units):
        s, h = divmod(i, kv_heads)
        context, u1 = int(contexts[s]), u0 + n
        p = bisect.bisect_right(starts, u0) - 1  # the PE of the first unit (empty PEs before it are skipped)
        pieces = []
        while p < pes and starts[p] < u1:
            lo, hi = max(u0, starts[p]), min(u1, starts[p + 1])
            if hi > lo:
                pieces.append((p, (lo - u0) * tile, (hi - u0) * tile))
            p += 1
        for c, (pe, a, b) in enumerate(pieces):
            tasks.append(Task(len(tasks), first_sequence + s, h, pe, context, n * tile, c, (a, b), len(pieces) > 1))
        u0 = u1
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
