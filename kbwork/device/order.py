"""Launch dependencies (DESIGN.md §16): a plan's ``after`` edges checked, and the order they make.

A launch is named ``(pe, index)``: PE ``pe``'s launch number ``index`` in its list. Two relations order
launches: each PE's program order (launch i before launch i + 1 of the same PE) and the ``after`` edges (every
launch a launch names in ``after`` before it). *Happens before* is the transitive closure of both
(:class:`Order`); isolation with order (:func:`kbwork.device.device.check_isolation`) allows two PEs to share
bytes exactly when one of their launches happens before the other.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from ..errors import ValidationError

#: Per PE, per launch, the launches it waits for: ``(pe, index)`` pairs, ascending.
Deps = dict[int, list[tuple[tuple[int, int], ...]]]


def resolve_after(plan: Mapping[int, Sequence[Any]]) -> Deps:
    """Each launch's ``after`` as ``(pe, index)`` pairs of ``plan`` (PE -> its launches, objects with an ``after``
    tuple of launch objects).

    Returns:
        PE -> per launch, the launches it waits for, ascending and without repeats.

    Raises:
        ValidationError: naming PE and launch index: a launch object placed twice (on one PE or two), a launch in
            ``after`` that is not in the plan, or a cycle through ``after`` edges and the PEs' program order.
    """
    where: dict[int, tuple[int, int]] = {}
    for pe in sorted(plan):
        for i, launch in enumerate(plan[pe]):
            was = where.get(id(launch))
            if was is not None:
                raise ValidationError(
                    f"run_device: PE {pe}, launch {i} is the same Launch object as PE {was[0]}, launch {was[1]}; a "
                    f"Launch runs once: make one Launch per placement (an after edge names one launch).")
            where[id(launch)] = (pe, i)
    deps: Deps = {}
    for pe in sorted(plan):
        rows = deps[pe] = []
        for i, launch in enumerate(plan[pe]):
            got = set()
            for d in launch.after:
                w = where.get(id(d))
                if w is None:
                    raise ValidationError(
                        f"run_device: PE {pe}, launch {i} is after {d!r}, which is not a launch of this plan; "
                        f"place that launch on a PE of the same run_device call, or drop it from after.")
                if w == (pe, i):
                    raise ValidationError(f"run_device: PE {pe}, launch {i} is after itself; drop it from after.")
                got.add(w)
            rows.append(tuple(sorted(got)))
    _check_acyclic(deps)
    return deps


def _check_acyclic(deps: Deps) -> None:
    """Refuse a cycle through ``after`` edges and program order (Kahn's algorithm over every launch)."""
    succ: dict[tuple[int, int], list[tuple[int, int]]] = {}
    indeg: dict[tuple[int, int], int] = {}
    for pe, rows in deps.items():
        for i, ds in enumerate(rows):
            node = (pe, i)
            indeg[node] = indeg.get(node, 0) + len(ds) + (1 if i else 0)
            if i:
                succ.setdefault((pe, i - 1), []).append(node)
            for d in ds:
                succ.setdefault(d, []).append(node)
    ready = sorted(n for n, k in indeg.items() if k == 0)
    seen = 0
    while ready:
        n = ready.pop()
        seen += 1
        for m in succ.get(n, ()):
            indeg[m] -= 1
            if indeg[m] == 0:
                ready.append(m)
    if seen < len(indeg):
        stuck = min(n for n, k in indeg.items() if k > 0)
        cycle = _a_cycle(deps, stuck)
        path = " -> ".join(f"PE {p} launch {i}" for p, i in cycle)
        raise ValidationError(
            f"run_device: PE {stuck[0]}, launch {stuck[1]} waits on itself through after edges and program order "
            f"({path}); a launch can only wait for launches that can end before it starts.")


def _a_cycle(deps: Deps, node: tuple[int, int]) -> list[tuple[int, int]]:
    """A cycle of waits reachable backwards from ``node`` (which lies on or behind one), first node repeated."""
    def preds(n: tuple[int, int]) -> list[tuple[int, int]]:
        p, i = n
        return ([(p, i - 1)] if i else []) + list(deps[p][i])
    path: list[tuple[int, int]] = []
    on: dict[tuple[int, int], int] = {}
    stack = [(node, iter(preds(node)))]
    on[node] = 0
    path.append(node)
    visited = {node}
    while stack:
        n, it = stack[-1]
        for m in it:
            if m in on:
                cyc = path[on[m]:] + [m]
                return cyc[::-1]
            if m not in visited:
                visited.add(m)
                on[m] = len(path)
                path.append(m)
                stack.append((m, iter(preds(m))))
                break
        else:
            stack.pop()
            del on[path.pop()]
    return [node, node]


class Order:
    """Happens before, over the launches of a plan: the transitive closure of program order and ``after``.

    Built only when some launch has an ``after`` edge across PEs (without one, no launch of one PE happens before
    one of another); each launch's ancestors are a bit set.
    """

    def __init__(self, deps: Deps):
        self.index: dict[tuple[int, int], int] = {}
        order: list[tuple[int, int]] = []
        # a topological order: Kahn's algorithm (the plan is acyclic: resolve_after checked it)
        indeg, succ = {}, {}
        for pe, rows in deps.items():
            for i, ds in enumerate(rows):
                indeg[(pe, i)] = len(ds) + (1 if i else 0)
                if i:
                    succ.setdefault((pe, i - 1), []).append((pe, i))
                for d in ds:
                    succ.setdefault(d, []).append((pe, i))
        ready = sorted((n for n, k in indeg.items() if k == 0), reverse=True)
        while ready:
            n = ready.pop()
            order.append(n)
            for m in succ.get(n, ()):
                indeg[m] -= 1
                if indeg[m] == 0:
                    ready.append(m)
        for k, n in enumerate(order):
            self.index[n] = k
        self.anc: dict[tuple[int, int], int] = {}
        for n in order:
            pe, i = n
            a = 0
            for d in ([(pe, i - 1)] if i else []) + list(deps[pe][i]):
                a |= self.anc[d] | (1 << self.index[d])
            self.anc[n] = a

    def before(self, a: tuple[int, int], b: tuple[int, int]) -> bool:
        """Whether launch ``a`` happens before launch ``b``."""
        return bool(self.anc[b] >> self.index[a] & 1)

    def ordered(self, a: tuple[int, int], b: tuple[int, int]) -> bool:
        """Whether one of the two launches happens before the other."""
        return self.before(a, b) or self.before(b, a)


def crosses(deps: Deps) -> bool:
    """Whether some launch waits for a launch of another PE."""
    return any(d[0] != pe for pe, rows in deps.items() for ds in rows for d in ds)


def local(deps: Deps, group: Sequence[int]) -> list[list[tuple[tuple[int, int], ...]]]:
    """``deps`` of the PEs of ``group`` with each PE named by its place in the group (the event loop's numbering);
    every dependency of a group's launch is in the group."""
    at = {pe: k for k, pe in enumerate(group)}
    return [[tuple((at[q], j) for q, j in ds) for ds in deps.get(pe, [])] for pe in group]
