"""How a step's layers follow each other on the host and the device: ``serial`` and ``ping_pong``.

Both are a **greedy list schedule** over task records (:class:`Job`): a job
needs one resource (``"host"`` or ``"device"``) for its duration and may start
once every predecessor has ended plus the latency on that edge (the hand-off,
which occupies neither resource). Each resource runs one job at a time and,
whenever it is free, starts the ready job with the smallest ``key``. That is
deterministic and can be followed by hand (DESIGN.md §15).

* ``serial``: one chain per layer, QKV -> (handoff) -> attention -> (handoff) -> O+FFN, then the next
  layer's QKV; the LM head last. Its end is the closed form
  ``layers · (t(QKV) + 2·handoff + t_attn + t(O) + t(FFN up) + t(FFN down)) + t(LM head)``.
* ``ping_pong`` (AttAcc's overlap): the same chain for each half of the batch, A (the first ⌈B/2⌉
  sequences) and B (the rest), keys ``(layer, half, phase)`` with phase QKV < attention < O+FFN < LM
  head, so the host works on one half while the device runs the other's attention.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import pandas as pd

from ..errors import SimulationError, ValidationError

QKV, ATTENTION, MERGE, O_FFN, LM_HEAD = "QKV", "attention", "merge", "O+FFN", "LM head"
#: The phase order of a job's key (``merge``: the host's merge of split-KV partials, DESIGN.md §16).
PHASES = (QKV, ATTENTION, MERGE, O_FFN, LM_HEAD)
HALVES = ("A", "B")
SCHEDULES = ("serial", "ping_pong")
TIMELINE_COLUMNS = ["task", "half", "layer", "phase", "resource", "start", "end"]


@dataclass(frozen=True, slots=True)
class Job:
    """One task of a schedule.

    Attributes:
        name: unique, e.g. ``"QKV A3"``.
        resource: ``"host"`` or ``"device"``.
        duration: seconds.
        preds: ``(name, latency)`` pairs: the job may start ``latency`` seconds after that job ends.
        key: the priority among ready jobs of one resource (smallest first): ``(layer, half, phase)``.
        half, layer, phase: for the timeline.
    """

    name: str
    resource: str
    duration: float
    preds: tuple[tuple[str, float], ...]
    key: tuple
    half: str = ""
    layer: int = -1
    phase: str = ""


@dataclass(frozen=True, slots=True)
class HalfCosts:
    """The durations (seconds) of one half's jobs in every layer."""

    qkv: float
    attention: float
    o_ffn: float
    lm_head: float
    attention_resource: str = "device"
    handoff: float = 0.0
    #: the host's merge of split-KV partials after attention (0: no merge job; DESIGN.md §16)
    merge: float = 0.0


def chain_jobs(layers: int, halves: Sequence[HalfCosts]) -> list[Job]:
    """Every job of a step: per half h and layer l, QKV(h, l) -> attention(h, l) -> O+FFN(h, l) ->
    QKV(h, l + 1), the two arrows around attention carrying that half's ``handoff``; after the last layer
    each half's LM head. With a host merge (``merge > 0``) a merge job on the host sits between attention
    and O+FFN (the hand-off on its way in). Keys ``(layer, half index, phase index)``; the LM head has the
    last layer's."""
    jobs: list[Job] = []
    for hi, c in enumerate(halves):
        h = HALVES[hi]
        prev: tuple[tuple[str, float], ...] = ()
        for layer in range(layers):
            names = [f"{p} {h}{layer}" for p in (QKV, ATTENTION, O_FFN)]
            jobs.append(Job(names[0], "host", c.qkv, prev, (layer, hi, 0), h, layer, QKV))
            jobs.append(Job(names[1], c.attention_resource, c.attention, ((names[0], c.handoff),), (layer, hi, 1),
                            h, layer, ATTENTION))
            into_o = ((names[1], c.handoff),)
            if c.merge > 0:  # the partials come back to the host, which merges them before O+FFN
                jobs.append(Job(f"{MERGE} {h}{layer}", "host", c.merge, into_o, (layer, hi, 2), h, layer, MERGE))
                into_o = ((f"{MERGE} {h}{layer}", 0.0),)
            jobs.append(Job(names[2], "host", c.o_ffn, into_o, (layer, hi, 3), h, layer, O_FFN))
            prev = ((names[2], 0.0),)
        jobs.append(Job(f"{LM_HEAD} {h}", "host", c.lm_head, prev, (layers - 1, hi, 4), h, layers - 1, LM_HEAD))
    return jobs


@dataclass(order=True)
class _Released:
    key: tuple
    ready: float = field(compare=False)
    index: int = field(compare=False)


def list_schedule(jobs: Sequence[Job]) -> pd.DataFrame:
    """Run ``jobs`` by the greedy list rule; one row per job in start order: ``task, half, layer, phase,
    resource, start, end`` (seconds).

    At each instant, jobs that end then are done first; then each resource (in name order) that is free
    starts, among the jobs whose predecessors have all ended plus their latency, the one with the
    smallest key; repeated until nothing more can start at that instant.

    Returns:
        The timeline as a DataFrame (empty for no jobs).

    Raises:
        ValidationError: ``jobs`` not a list or tuple of :class:`Job`, or a job whose name or resource is
            not a string, whose duration or a latency is not a finite number >= 0, whose preds are not
            ``(name, latency)`` pairs, or whose key is not a tuple comparable with the others'.
        SimulationError: duplicate or unknown job names, or jobs that can never start (a cycle).
    """
    _check_jobs(jobs)
    index = {j.name: i for i, j in enumerate(jobs)}
    if len(index) != len(jobs):
        raise SimulationError("list_schedule: two jobs share a name.")
    succ: list[list[tuple[int, float]]] = [[] for _ in jobs]
    waiting = [len(j.preds) for j in jobs]
    for i, j in enumerate(jobs):
        for name, latency in j.preds:
            if name not in index:
                raise SimulationError(f"list_schedule: job {j.name!r} waits for unknown job {name!r}.")
            succ[index[name]].append((i, latency))
    ready_at = [0.0] * len(jobs)
    end = [0.0] * len(jobs)
    start = [0.0] * len(jobs)
    resources = sorted({j.resource for j in jobs})
    released: dict[str, list[_Released]] = {r: [] for r in resources}  # preds all started; ready_at known
    free_at = {r: 0.0 for r in resources}
    for i, j in enumerate(jobs):
        if not waiting[i]:
            released[j.resource].append(_Released(j.key, 0.0, i))
    order: list[int] = []
    t = 0.0
    while len(order) < len(jobs):
        started = True
        while started:
            started = False
            for r in resources:
                if free_at[r] > t:
                    continue
                cands = [x for x in released[r] if x.ready <= t]
                if not cands:
                    continue
                pick = _first(cands, jobs)
                released[r].remove(pick)
                i = pick.index
                start[i], end[i] = t, t + jobs[i].duration
                free_at[r] = end[i]
                order.append(i)
                started = True
                for k, latency in succ[i]:
                    ready_at[k] = max(ready_at[k], end[i] + latency)
                    waiting[k] -= 1
                    if not waiting[k]:
                        released[jobs[k].resource].append(_Released(jobs[k].key, ready_at[k], k))
        future = [f for f in free_at.values() if f > t] + [x.ready for xs in released.values() for x in xs
                                                           if x.ready > t]
        if len(order) < len(jobs):
            if not future:
                stuck = sorted(jobs[i].name for i in range(len(jobs)) if waiting[i])
                raise SimulationError(f"list_schedule: jobs {stuck[:5]} can never start (their predecessors form "
                                      f"a cycle).")
            t = min(future)
    rows = [(jobs[i].name, jobs[i].half, jobs[i].layer, jobs[i].phase, jobs[i].resource, start[i], end[i])
            for i in order]
    return pd.DataFrame(rows, columns=TIMELINE_COLUMNS)


def _first(cands: list[_Released], jobs: Sequence[Job]) -> _Released:
    """The candidate of the smallest key; keys that cannot be compared are a ValidationError naming two."""
    try:
        return min(cands)
    except TypeError:
        for a in cands:
            for b in cands:
                try:
                    _ = a < b
                except TypeError:
                    raise ValidationError(
                        f"list_schedule: the keys of jobs {jobs[a.index].name!r} ({a.key!r}) and "
                        f"{jobs[b.index].name!r} ({b.key!r}) cannot be compared; give every job a key of the "
                        f"same shape, e.g. (layer, half, phase) ints.") from None
        raise


def _is_time(v: Any) -> bool:
    return not isinstance(v, (bool, np.bool_)) and isinstance(v, numbers.Real) and math.isfinite(v) and v >= 0


def _check_jobs(jobs: Any) -> None:
    """Refuse what :func:`list_schedule` cannot run, naming the job and the field."""
    if isinstance(jobs, (str, bytes)) or not isinstance(jobs, (list, tuple)):
        raise ValidationError(f"list_schedule: jobs must be a list or tuple of kbwork.model.Job records (e.g. "
                              f"chain_jobs(...)), got {jobs!r} ({type(jobs).__name__}).")
    for i, j in enumerate(jobs):
        if not isinstance(j, Job):
            raise ValidationError(f"list_schedule: jobs[{i}] is {j!r} ({type(j).__name__}); every job is a "
                                  f"kbwork.model.Job(name, resource, duration, preds, key).")
        where = f"list_schedule: job {i} ({j.name!r})"
        if not isinstance(j.name, str) or not j.name:
            raise ValidationError(f"{where}: name must be a non-empty string.")
        if not isinstance(j.resource, str) or not j.resource:
            raise ValidationError(f"{where}: resource must be a non-empty string (e.g. 'host' or 'device'), got "
                                  f"{j.resource!r}.")
        if not _is_time(j.duration):
            raise ValidationError(f"{where}: duration must be a finite number of seconds >= 0, got {j.duration!r}.")
        if not isinstance(j.preds, (list, tuple)):
            raise ValidationError(f"{where}: preds must be a tuple of (name, latency) pairs, got {j.preds!r}.")
        for p in j.preds:
            if not (isinstance(p, (list, tuple)) and len(p) == 2 and isinstance(p[0], str) and _is_time(p[1])):
                raise ValidationError(f"{where}: preds must be (name, latency) pairs with a job's name and a "
                                      f"finite latency >= 0 in seconds, got {p!r}.")
        if not isinstance(j.key, tuple):
            raise ValidationError(f"{where}: key must be a tuple (e.g. (layer, half, phase)), got {j.key!r}.")


def serial_seconds(layers: int, c: HalfCosts) -> float:
    """The closed form of a serial step: ``layers · (qkv + 2·handoff + attention + merge + o_ffn) + lm_head``."""
    return layers * (c.qkv + 2 * c.handoff + c.attention + c.merge + c.o_ffn) + c.lm_head


__all__ = ["Job", "HalfCosts", "chain_jobs", "list_schedule", "serial_seconds", "PHASES", "SCHEDULES",
           "TIMELINE_COLUMNS"]
