"""What a run's stages waited for: stage-cycles by stage kind, engine unit and cause (DESIGN §11)."""

from __future__ import annotations

import numbers

import numpy as np
import pandas as pd

from ..errors import ValidationError
from . import per_pe as _per_pe
from .inputs import _resolve_run_only


#: The columns of :func:`waits`, in order, after ``stage, engine, stages``.
WAIT_COLUMNS = ("dependency", "hazard", "queue", "wait", "scheduler", "engine_busy", "total")


def waits(run, *, per_pe: bool | None = None) -> pd.DataFrame:
    """Stage-cycles spent waiting, by stage kind and engine unit, split by what was waited for.

    Of a device run: per PE (``per_pe`` None with several PEs, or True; a
    ``pe`` column first) or, with ``per_pe=False``, summed over the PEs.

    Each stage waits from the cycle its engine could first have taken it, in
    the order the PE issues work, until it starts:

    * a plan stage (DMA_READ, FETCH, GEMM, MATH, DMA_WRITE) from its
      command's PLAN end: ``hazard`` = the hold of its command (release − PLAN
      end, from ``run.holds()``; 0 if not held), ``dependency`` = ready −
      release (its data, tile and staging-ring edges), ``engine_busy`` =
      start − ready (ready, but its engine — every DMA channel — was busy);
    * a DISPATCH from the end of the previous DISPATCH (cycle 0 for the
      first): the CPU idles until its ``ready``, charged to ``wait`` (a
      ``tl.wait``) or ``queue`` (a full command queue), whichever set
      ``ready`` (a tie: ``wait``);
    * a PLAN from the later of its DISPATCH's end and the previous PLAN's
      end: charged to ``scheduler`` (blocked behind a held command, strict
      FIFO).

    DISPATCH and PLAN never wait for their engine in this sense: it is busy
    only with the previous command, which they follow in order. Every stage's
    columns add up to its wait, ``total``.

    Returns:
        One row per (stage kind, engine unit) present, stage kinds in
        pipeline order and units in track order: ``stage``, ``engine``,
        ``stages``, then :data:`WAIT_COLUMNS` as integer cycles summed over
        those stages.

    Raises:
        ValidationError: not a run, or a bad ``per_pe``.
    """
    run = _resolve_run_only(run)
    how = _per_pe.form(len(run.pes), per_pe, "waits")
    if how != _per_pe.ONE:
        return _per_pe.waits(run, how, lambda r: waits(r, per_pe=False))
    if run.pe(run.pes[0]) is not run:  # a device run in which one PE ran: that PE's
        return waits(run.pe(run.pes[0]), per_pe=False)
    prog, tl = run.program, run.timeline
    log = run.op_log
    kind = log["stage"].cat.codes.to_numpy(np.int64)
    cmd = log["cmd"].to_numpy(np.int64)
    ready, start, end = (log[c].to_numpy(np.int64) for c in ("ready", "start", "end"))
    d = np.asarray(prog.dispatch_seq, np.int64)
    p = d + 1
    plan_end = end[p]
    released = plan_end.copy()
    holds = run.holds()
    released[holds["cmd"].to_numpy(np.int64)] = holds["release"].to_numpy(np.int64)
    n = len(log)
    cols = {c: np.zeros(n, np.int64) for c in WAIT_COLUMNS}
    work = kind >= 2
    c = cmd[work]
    cols["hazard"][work] = released[c] - plan_end[c]
    cols["dependency"][work] = ready[work] - released[c]
    cols["engine_busy"][work] = start[work] - ready[work]
    cols["total"][work] = start[work] - plan_end[c]
    # DISPATCH: idle from the previous DISPATCH's end to ready, for a wait or a queue slot
    prev_end = np.concatenate(([0], end[d[:-1]]))
    idle = np.maximum(ready[d] - prev_end, 0)
    by_wait = tl.front.d_wait == ready[d]
    cols["wait"][d] = np.where(by_wait, idle, 0)
    cols["queue"][d] = np.where(by_wait, 0, idle)
    cols["engine_busy"][d] = start[d] - np.maximum(ready[d], prev_end)
    cols["total"][d] = start[d] - prev_end
    # PLAN: idle from max(its DISPATCH's end, the previous PLAN's end) to ready, behind a hold
    since = np.maximum(end[d], np.concatenate(([0], end[p[:-1]])))
    cols["scheduler"][p] = np.maximum(ready[p] - since, 0)
    cols["engine_busy"][p] = start[p] - np.maximum(ready[p], since)
    cols["total"][p] = start[p] - since
    frame = pd.DataFrame({"stage": log["stage"], "engine": log["engine"], "stages": 1, **cols})
    out = frame.groupby(["stage", "engine"], observed=True, sort=True).sum().reset_index()
    out["stage"] = out["stage"].astype(str)
    out["engine"] = out["engine"].astype(str)
    return out


#: The causes of :func:`waits` other than ``engine_busy``, in the order :func:`explain` lists them.
_WAIT_CAUSES = ("dependency", "hazard", "queue", "wait", "scheduler", "engine_busy")


def top_waits(run, n: int = 5) -> pd.DataFrame:
    """The ``n`` largest entries of :func:`waits`, one (stage kind, engine unit, cause) each.

    Returns:
        Columns ``stage``, ``engine``, ``cause`` (a :data:`WAIT_COLUMNS` name
        other than ``total``), ``cycles`` (stage-cycles waited: stages wait at
        the same time, so these can add up to more than the run) and
        ``stages`` (how many stages of that kind and unit there are), largest
        first; ties keep stage-kind, unit and cause order. Zero entries are
        left out.

    Raises:
        ValidationError: ``n`` is not a positive int.
    """
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n <= 0:
        raise ValidationError(f"top_waits: n={n!r}; pass a positive number of rows.")
    w = waits(run, per_pe=False)  # a device's summed over its PEs
    long = w.melt(id_vars=["stage", "engine", "stages"], value_vars=list(_WAIT_CAUSES), var_name="cause",
                  value_name="cycles")
    # melt lists cause by cause; order by (stage row, cause) so that ties read in pipeline order
    long["_row"] = np.tile(np.arange(len(w)), len(_WAIT_CAUSES))
    long["_cause"] = np.repeat(np.arange(len(_WAIT_CAUSES)), len(w))
    long = long[long["cycles"] > 0].sort_values(["cycles", "_row", "_cause"], ascending=[False, True, True],
                                                kind="stable")
    out = long.head(int(n))[["stage", "engine", "cause", "cycles", "stages"]].reset_index(drop=True)
    out["cycles"] = out["cycles"].astype(np.int64)
    return out
