"""Where one run's time went, in numbers and in one sentence saying what bounds it (DESIGN §11), and the
same over several runs side by side."""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np
import pandas as pd

from ..errors import ValidationError
from ..sim import DeviceRun
from .busy import utilization
from .channels import CONTENDED, contention_words, path_contention
from .critical import attribution
from .energy import energy_by_kind, joules_text
from .inputs import _resolve_run_only, _run_of
from .stalls import top_waits


#: A unit busy at least this fraction of the run is called saturated by :func:`explain`: the run cannot
#: be much shorter than that unit's work, whatever else changes.
SATURATED = 0.85


class Explanation:
    """Where one run's time went: what :func:`explain` returns.

    Attributes:
        name: what the run is called in reports (a variant name, say).
        cycles: end-to-end cycles; ``us`` the same in microseconds.
        hazard_policy: the run's hazard policy.
        utilization: :func:`utilization` of its op_log.
        attribution: :func:`attribution` of the run.
        top_waits: :func:`top_waits` of the run.
        holds: how many commands a hazard held (rows of ``run.holds()``).
        bound: the numbers the sentence is made of (see :func:`explain`).
        sentence: one sentence saying what bounds the run.
        pe, pes: the PE the critical path runs on, and how many PEs ran (1 but for a device run, whose
            utilisation, holds and waits here are that PE's).
        energy: the run's energy by kind, pJ (:func:`~kbwork.analysis.energy_by_kind`: every PE of the
            device, idle included); ``energy_pj`` its sum, ``energy_largest`` the largest kind.
    """

    def __init__(self, name: str, cycles: int, us: float, hazard_policy: str, utilization: pd.DataFrame,
                 attribution: pd.DataFrame, top_waits: pd.DataFrame, holds: int, bound: dict[str, Any],
                 sentence: str, pe: int = 0, pes: int = 1, energy: pd.Series | None = None):
        self.name, self.cycles, self.us, self.hazard_policy = name, cycles, us, hazard_policy
        self.utilization, self.attribution, self.top_waits = utilization, attribution, top_waits
        self.holds, self.bound, self.sentence = holds, bound, sentence
        self.pe, self.pes = pe, pes
        self.energy = energy
        self.energy_pj = None if energy is None else float(energy.sum())
        self.energy_largest = None if energy is None or not self.energy_pj else str(energy.idxmax())

    def __repr__(self) -> str:
        return f"Explanation({self.name}: {self.cycles} cycles; {self.sentence})"

    def by(self, what: str) -> pd.Series:
        """The critical-path cycles by ``"engine"`` or by ``"cause"``, indexed by name (zeros included)."""
        if what not in ("engine", "cause"):
            raise ValidationError(f"Explanation.by({what!r}): use 'engine' or 'cause'.")
        a = self.attribution[self.attribution["by"] == what]
        return pd.Series(a["cycles"].to_numpy(), index=pd.Index(a["name"].tolist(), name=what), name="cycles")

    def to_dict(self) -> dict[str, Any]:
        """Every field as plain JSON-serialisable values (integers for cycles, floats for fractions)."""
        util = self.utilization
        device = {"pes": int(self.pes), "pe": int(self.pe)} if self.pes > 1 else {}
        return {
            **device,
            "name": self.name, "cycles": int(self.cycles), "us": float(self.us),
            "hazard_policy": self.hazard_policy, "holds": int(self.holds),
            "utilization": {e: {"stages": int(s), "busy_cycles": int(b), "busy_fraction": float(f)}
                            for e, s, b, f in zip(util["engine"], util["stages"], util["busy_cycles"],
                                                  util["busy_fraction"])},
            "critical_path": {what: {k: int(v) for k, v in self.by(what).items()} for what in ("engine", "cause")},
            "top_waits": [{"stage": r.stage, "engine": r.engine, "cause": r.cause, "cycles": int(r.cycles),
                           "stages": int(r.stages)} for r in self.top_waits.itertuples()],
            "bound": {k: (float(v) if isinstance(v, (float, np.floating)) else
                          int(v) if isinstance(v, (numbers.Integral,)) and not isinstance(v, bool) else v)
                      for k, v in self.bound.items()},
            "sentence": self.sentence,
            **({} if self.energy is None else
               {"energy": {"pj": self.energy_pj, "largest": self.energy_largest,
                           "by_kind_pj": {k: float(v) for k, v in self.energy.items()}}}),
        }

    @property
    def short(self) -> str:
        """The bound in a few words (``kbwork compare`` prints it): e.g. ``latency-bound (critical path 67%
        PE_GEMM, 31% PE_DMA; 29% after hazard holds)`` or ``throughput-bound on PE_GEMM (busy 92%)``."""
        b = self.bound
        shared = (f"; channel{'s' if len(b['contended_channels']) > 1 else ''} "
                  f"{', '.join(map(str, b['contended_channels']))} contended, "
                  f"{100 * b['contention_fraction']:.0f}% lost" if b.get("contended_channels") else "")
        if b["kind"] == "throughput":
            return f"throughput-bound on {b['engine']} (busy {100 * b['busy_fraction']:.0f}%{shared})"
        second = (f", {100 * b['second_fraction']:.0f}% {b['second_engine']}"
                  if b["second_engine"] is not None and b["second_fraction"] > 0 else "")
        cause = (f"; {100 * b['cause_fraction']:.0f}% after {_CAUSE_SHORT[b['cause']]}"
                 if b["cause"] is not None else "")
        return (f"latency-bound (critical path {100 * b['engine_fraction']:.0f}% {b['engine']}{second}{cause}"
                f"{shared})")

    def report(self) -> str:
        """The text ``kbwork explain`` prints for this run: cycles, utilisation, critical path, waits, bound."""
        c = self.cycles
        device = (f"; a device of {self.pes} PEs: the critical path, and the units below, are PE {self.pe}'s"
                  if self.pes > 1 else "")
        lines = [f"{self.name}: {c} cycles = {self.us:.3f} us ({self.hazard_policy}, {self.holds} commands held "
                 f"by hazards{device})"]
        lines.append(f"  {'engine unit':14}{'busy':>10}{'busy %':>8}{'on critical path':>18}{'path %':>8}")
        on_path = self.by("engine")
        for e, busy, frac in zip(self.utilization["engine"], self.utilization["busy_cycles"],
                                 self.utilization["busy_fraction"]):
            p = int(on_path.get(e, 0))
            lines.append(f"  {e:14}{busy:>10}{100 * frac:>7.1f}%{p:>18}{_pct(p, c):>8}")
        causes = self.by("cause")
        lines.append("  critical path by cause: " + ", ".join(f"{k} {v} ({_pct(v, c).strip()})"
                                                              for k, v in causes.items() if v))
        if len(self.top_waits):
            lines.append("  top waits (stage-cycles, summed over stages that wait at the same time):")
            for r in self.top_waits.itertuples():
                lines.append(f"    {r.stage:9} on {r.engine:12} waiting for {r.cause:12}{r.cycles:>10} "
                             f"({r.stages} stages)")
        lines.append(f"  bound: {self.sentence}")
        if self.energy is not None:
            lines.append(f"  energy: {self.energy_words}")
        return "\n".join(lines)

    @property
    def energy_words(self) -> str:
        """The run's energy and its largest kind in words (``"12.3 µJ; largest: hbm 83%"``), ``""`` without
        energy."""
        if self.energy is None:
            return ""
        if not self.energy_pj:
            return "0 pJ (every energy key is 0)"
        share = float(self.energy[self.energy_largest]) / self.energy_pj
        return (f"{joules_text(self.energy_pj)} (every PE of the device, idle included); largest: "
                f"{self.energy_largest} {100 * share:.0f}%")


def _pct(part: float, whole: float) -> str:
    return f"{100 * part / whole:5.1f}%" if whole else "    -"


def explain(run_or_decode_run: Any, name: str | None = None, *, top: int = 5,
            saturated: float = SATURATED, contended: float = CONTENDED) -> Explanation:
    """Where a run's time went, and one sentence saying what bounds it (DESIGN §11).

    The sentence is derived from the numbers, never chosen by hand:

    * the **lead engine** is the unit with the most critical-path cycles
      (the first in track order on a tie);
    * if that unit is busy at least ``saturated`` of the run, the run is
      **throughput-bound** on it: it cannot be much shorter than that unit's
      work, and the sentence says so with its busy share and its share of the
      critical path;
    * otherwise the run is **latency-bound**: its critical path is a chain
      (the lead engine's share and the runner-up's) through units that are
      idle part of the time, and the sentence names the link cause, other
      than plain ``dependency``, that carries most of the path (``hazard``,
      ``engine``, ``queue``, ...), with its share, if it carries any;
    * if the DMA stages on the critical path lost at least ``contended`` of
      the run's cycles to sharing their HBM channels (:func:`contention`),
      it names those channels and the cycles lost; below that it says nothing
      of them.

    A device run is explained on the PE its critical path runs on (the one
    that finishes last): the utilisation, holds and waits are that PE's.

    Args:
        run_or_decode_run: a :class:`~kbwork.Run` or a ``decode.DecodeRun``.
        name: what to call the run (default: the decode variant, or ``"run"``).
        top: how many :func:`top_waits` rows to keep.
        saturated: the busy fraction from which a unit counts as saturated.
        contended: the fraction of the run lost to channel sharing on the
            critical path from which the sentence names contention.

    Returns:
        An :class:`Explanation`; its ``bound`` dict holds ``kind``
        (``"throughput"`` or ``"latency"``), ``engine``, ``engine_cycles`` and
        ``engine_fraction`` (on the critical path), ``busy_fraction`` (of the
        run), ``second_engine`` and ``second_fraction``, ``cause`` and
        ``cause_fraction`` (``None`` and 0.0 when only dependencies link the
        path), ``contention_cycles`` and ``contention_fraction`` (what the
        path's DMA stages lost to sharing) and ``contended_channels`` (the
        channels the sentence names, ascending; empty below ``contended``).

    Raises:
        ValidationError: not a run, or a bad ``name``, ``top``, ``saturated`` or ``contended``.
    """
    run = _run_of(run_or_decode_run)
    if run is None:
        raise ValidationError(f"explain takes a Run or a decode.DecodeRun, not {type(run_or_decode_run).__name__}.")
    if name is not None and not isinstance(name, str):
        raise ValidationError(f"explain: name={name!r} must be text (what the report calls the run), or None for "
                              f"the variant's name.")
    if isinstance(saturated, bool) or not isinstance(saturated, numbers.Real) or not 0 < saturated <= 1:
        raise ValidationError(f"explain: saturated={saturated!r}; pass a busy fraction in (0, 1].")
    if isinstance(contended, bool) or not isinstance(contended, numbers.Real) or not 0 < contended <= 1:
        raise ValidationError(f"explain: contended={contended!r}; pass a fraction of the run in (0, 1].")
    if name is None:
        name = getattr(run_or_decode_run, "variant", None) or "run"
    cycles = run.cycles
    on = run.pe(run.last_pe()) if isinstance(run, DeviceRun) else run  # the PE the critical path runs on
    util = utilization(on.op_log)
    att = attribution(run)
    n_holds = len(on.timeline.held)
    lost = path_contention(run)
    eng = att[att["by"] == "engine"].reset_index(drop=True)
    order = np.lexsort((np.arange(len(eng)), -eng["cycles"].to_numpy()))  # most cycles first, then track order
    lead, second = eng.iloc[order[0]], eng.iloc[order[1]] if len(eng) > 1 else None
    busy = float(util.loc[util["engine"] == lead["name"], "busy_fraction"].iloc[0])
    causes = att[(att["by"] == "cause") & (att["name"] != "dependency")].reset_index(drop=True)
    corder = np.lexsort((np.arange(len(causes)), -causes["cycles"].to_numpy()))
    top_cause = causes.iloc[corder[0]] if len(causes) and causes["cycles"].max() > 0 else None
    bound = {
        "kind": "throughput" if busy >= saturated else "latency",
        "engine": str(lead["name"]), "engine_cycles": int(lead["cycles"]), "engine_fraction": float(lead["fraction"]),
        "busy_fraction": busy,
        "second_engine": None if second is None else str(second["name"]),
        "second_fraction": 0.0 if second is None else float(second["fraction"]),
        "cause": None if top_cause is None else str(top_cause["name"]),
        "cause_fraction": 0.0 if top_cause is None else float(top_cause["fraction"]),
        "contention_cycles": lost["cycles"], "contention_fraction": float(lost["fraction"]),
        "contended_channels": list(lost["channels"]) if lost["fraction"] >= contended else [],
    }
    sentence = _sentence(name, cycles, bound, n_holds)
    if bound["contended_channels"]:
        sentence = f"{sentence[:-1]}; {contention_words(lost)}."
    return Explanation(name, cycles, run.topology.cycles_to_us(cycles), run.topology.hazard_policy, util, att,
                       top_waits(on, top), n_holds, bound, sentence, on.pes[0], len(run.pes), energy_by_kind(run))


#: What each link cause means, as the sentence of :func:`explain` words it.
_CAUSE_WORDS = {
    "engine": "stages that waited for a busy engine",
    "hazard": "stages released by hazard holds",
    "queue": "dispatches that waited for a queue slot",
    "wait": "dispatches that waited on tl.wait",
    "scheduler": "plans blocked behind a held command",
    "order": "stages that followed program order",
    "launch": "launches that followed the one before on their PE",
    "after": "launches that waited for a launch they are after",
}


#: The same, in two or three words (``Explanation.short``).
_CAUSE_SHORT = {"engine": "busy-engine waits", "hazard": "hazard holds", "queue": "queue waits",
                "wait": "tl.wait", "scheduler": "scheduler blocks", "order": "program order",
                "launch": "launch order", "after": "launch dependencies"}


def _sentence(name: str, cycles: int, b: dict[str, Any], holds: int) -> str:
    """The one sentence of :func:`explain`, from the numbers in ``b``."""
    pct = lambda f: f"{100 * f:.0f}%"  # noqa: E731
    e, ef, busy = b["engine"], b["engine_fraction"], b["busy_fraction"]
    if b["kind"] == "throughput":
        text = (f"{name} is throughput-bound on {e}: it is busy {pct(busy)} of the {cycles} cycles and carries "
                f"{pct(ef)} of the critical path")
    else:
        text = f"{name} is latency-bound: its critical path is {pct(ef)} {e}"
        if b["second_engine"] is not None and b["second_fraction"] > 0:
            text += f" and {pct(b['second_fraction'])} {b['second_engine']} work"
        else:
            text += " work"
        text += f", and {e} is busy {pct(busy)} of the {cycles} cycles"
    if b["cause"] is not None:
        text += f"; {_CAUSE_WORDS[b['cause']]} carry {pct(b['cause_fraction'])} of the path"
        if b["cause"] == "hazard":
            text += f" ({holds} commands held)"
    return text + "."


def explain_all(runs: Any, *, top: int = 5, saturated: float = SATURATED) -> dict[str, Explanation]:
    """:func:`explain` for every run of a ``decode.Comparison`` or a mapping name -> run.

    Returns:
        name -> :class:`Explanation`, in the order given.

    Raises:
        ValidationError: neither a Comparison nor a mapping of runs.
    """
    items = getattr(runs, "runs", runs)
    if not hasattr(items, "items"):
        raise ValidationError(f"explain_all takes a decode.Comparison or a dict name -> run, "
                              f"not {type(runs).__name__}.")
    return {str(k): explain(r, str(k), top=top, saturated=saturated) for k, r in items.items()}


def attribution_table(explanations: Any) -> pd.DataFrame:
    """The critical-path attribution of several runs in one long table (what ``plots.attribution`` draws).

    Args:
        explanations: name -> :class:`Explanation`, or name -> run (explained here),
            or a ``decode.Comparison``.

    Returns:
        Columns ``variant`` (the name), ``by``, ``name``, ``cycles``, ``fraction``:
        :func:`attribution` of each run, in the order given.
    """
    items = getattr(explanations, "runs", explanations)
    if not hasattr(items, "items"):
        raise ValidationError(f"attribution_table takes a dict name -> Explanation (or run) or a "
                              f"decode.Comparison, not {type(explanations).__name__}.")
    frames = []
    for k, x in items.items():
        att = x.attribution if isinstance(x, Explanation) else attribution(_resolve_run_only(x))
        frames.append(att.assign(variant=str(k))[["variant", "by", "name", "cycles", "fraction"]])
    if not frames:
        raise ValidationError("attribution_table: no runs given.")
    return pd.concat(frames, ignore_index=True)


def attribution_wide(explanations: Any, by: str = "engine", drop_zero: bool = True) -> pd.DataFrame:
    """The critical-path attribution of several runs side by side, one row per run.

    Args:
        explanations: name -> :class:`Explanation` (or run), or a ``decode.Comparison``.
        by: ``"engine"`` or ``"cause"``.
        drop_zero: leave out the names that are 0 in every run.

    Returns:
        Indexed by run name: ``cycles`` (end to end), then one column per
        engine unit or cause, in :func:`attribution` order; each row's
        columns after ``cycles`` add up to it.

    Raises:
        ValidationError: a bad ``by`` or ``explanations``.
    """
    if by not in ("engine", "cause"):
        raise ValidationError(f"attribution_wide: by={by!r}; use 'engine' or 'cause'.")
    t = attribution_table(explanations)
    t = t[t["by"] == by]
    names = list(dict.fromkeys(t["name"]))
    runs = list(dict.fromkeys(t["variant"]))
    wide = t.pivot(index="variant", columns="name", values="cycles").loc[runs, names].astype(np.int64)
    if drop_zero:
        wide = wide.loc[:, (wide != 0).any()]
    wide.insert(0, "cycles", wide.sum(axis=1))
    wide.index.name, wide.columns.name = "run", by
    return wide


def utilization_wide(explanations: Any) -> pd.DataFrame:
    """Busy fraction of every engine unit, one row per run (indexed by name), units in track order.

    ``explanations`` is name -> :class:`Explanation` (or run), or a ``decode.Comparison``.
    """
    items = getattr(explanations, "runs", explanations)
    if not hasattr(items, "items"):
        raise ValidationError(f"utilization_wide takes a dict name -> Explanation (or run) or a "
                              f"decode.Comparison, not {type(explanations).__name__}.")
    rows = {}
    for k, x in items.items():
        util = x.utilization if isinstance(x, Explanation) else utilization(_resolve_run_only(x).op_log)
        rows[str(k)] = util.set_index("engine")["busy_fraction"]
    out = pd.DataFrame(rows).T
    out.index.name, out.columns.name = "run", "engine"
    return out
