"""The model suite: what a model's decode step and a sweep of steps cost, each a ratio (DESIGN.md §15).

``kbwork bench --suite model`` measures, in one run, the two sides of every
ratio interleaved (in each round the slow side once and the fast side as
often as fits in that call, ``interleaved(..., batch=True)``):

1. **uniform**: ``model.step("llama-3-70b", [32768] * 64)`` (opt2, attention on
   the device, serial) against one head's timing ``decode.run("opt2",
   kv_len=32768, mode="timing")`` in the same process (target <= 250x).
2. **mixed**: the same model and batch with contexts drawn uniformly from
   1k-32k, seed 0 (``np.random.default_rng(0).integers(1024, 32768, size=64,
   endpoint=True)``), against the same ``decode.run`` (target <= 60x: a trace per signature, issue 34).
3. **sweep**: a 200-point ``model.sweep`` (Llama-3-8B; batch 1, 4, 16, 64 x 10
   contexts ``np.geomspace(1024, 32768, 10)`` rounded x ``handoff_us`` 0, 1,
   2, 4, 8; variant opt2, placement ``ahbm``, schedule serial) serially
   (``workers=1``) against the same on a 2-worker Dask ``LocalCluster``
   started before the clock (``client=``): the ratio is serial / Dask, the
   speed-up (target >= 1.6x). Serial and Dask alternate, one sweep each per
   pass, after a small untimed sweep on each; the frames must be equal. Without
   ``dask.distributed`` the row says so and is skipped.

Split-KV (DESIGN.md §16), in ``result["split"]`` beside the rows: ``wall``, ``model.step`` of row 2's batch
with ``mapping="split"`` (merges on the device) against the same with ``mapping="sequence"``, timed as the rows
are (target <= 1.5x); and the simulated targets (figures of the simulated machine, not timings):
Llama-3-8B at batch 1 and 32k on ``ahbm-device-v1``, tokens/s split / sequence (>= 3x); a layer's split
attention against the channel bound of all its KV bytes over all channels, at batch 1 and 16, 32k (>= 45 %
and >= 50 %).

Also, not a ratio: how long ``model.step`` takes for the interactive case
(Llama-3-8B and -70B at batch 16, every context 32k): the median of
interleaved calls in this process, and a first call in a fresh interpreter.

Rows 1 and 2 are medians over at least ``MIN_SECONDS`` of calls (and 5 calls)
in each of ``PASSES`` passes, each side its lowest pass median; the sweep's
sides are their lowest pass figures. Every pass is kept in the JSON, with the
load average through the run. A benchmark, not a test: it asserts nothing
about speed; it checks that the sweep's frames agree and that the Dask
workers imported this checkout's kbwork.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from .loops import _fmt

MODEL, BATCH, CONTEXT = "llama-3-70b", 64, 32768
MIXED_RANGE, MIXED_SEED = (1024, 32768), 0
VARIANT = "opt2"
#: The one-head reference of rows 1 and 2.
REF_KV = 32768

SWEEP_MODEL = "llama-3-8b"
SWEEP_BATCH = (1, 4, 16, 64)
SWEEP_CONTEXT = tuple(int(x) for x in np.rint(np.geomspace(1024, 32768, 10)))
SWEEP_HANDOFF_US = (0, 1, 2, 4, 8)
SWEEP_PLACEMENT, SWEEP_SCHEDULE = "ahbm", "serial"
DASK_WORKERS = 2

#: The interactive case: (model, batch, context) whose step is timed on its own.
INTERACTIVE = (("llama-3-8b", 16, 32768), ("llama-3-70b", 16, 32768))
#: Fresh interpreters per first-call figure (the figure is their median).
COLD_RUNS = 3

TARGETS = {"uniform": 250.0, "mixed": 60.0, "sweep": 1.6, "split": 1.5}
#: "max": the ratio must be at most the target; "min": at least (a speed-up).
TARGET_KIND = {"uniform": "max", "mixed": "max", "sweep": "min", "split": "max"}
#: Split-KV's simulated targets (DESIGN.md §16): (name, target, what).
SPLIT_TARGETS = (("tokens_per_s_ratio_8b_b1", 3.0, "Llama-3-8B batch 1 32k: tokens/s split / sequence"),
                 ("channel_fraction_b1", 0.45, "split attention / all-channel bound, 8B batch 1 32k"),
                 ("channel_fraction_b16", 0.50, "split attention / all-channel bound, 8B batch 16 32k"))

ROOT = Path(__file__).resolve().parents[2]  # this checkout


def mixed_contexts(batch: int | None = None, lo_hi: tuple[int, int] | None = None,
                   seed: int | None = None) -> list[int]:
    """Row 2's contexts: ``batch`` draws (:data:`BATCH`), uniform over ``lo_hi`` (:data:`MIXED_RANGE`, both
    ends included), seed :data:`MIXED_SEED`."""
    batch = BATCH if batch is None else batch
    lo, hi = MIXED_RANGE if lo_hi is None else lo_hi
    seed = MIXED_SEED if seed is None else seed
    return [int(c) for c in np.random.default_rng(seed).integers(lo, hi, size=batch, endpoint=True)]


def one_head() -> Any:
    from .. import decode

    return decode.run(VARIANT, kv_len=REF_KV, mode="timing")


#: The suite times steps that do not fit (70B at batch 64 and 32k is 640 GiB of KV, over the device's 139 GiB;
#: 16 sequences of 32k are 160 GiB): a speed benchmark of the simulator, not a claim of tokens/s, so every step
#: passes check_capacity=False (DESIGN.md §15) and each row records whether it fits.
SPEED_ONLY = dict(variant=VARIANT, check_capacity=False)


def _step_case(measure: str, model_name: str, contexts: list[int]):
    from .. import model

    s = model.step(model_name, contexts, **SPEED_ONLY)
    ref = one_head()
    what = (f"every context {contexts[0]}" if len(set(contexts)) == 1 else
            f"contexts {min(contexts)}-{max(contexts)} (seed {MIXED_SEED}, mean {statistics.mean(contexts):.0f})")
    row = {"measure": measure, "variant": VARIANT,
           "num_label": f"model.step({model_name!r}, batch {len(contexts)}, {what})",
           "den_label": f"decode.run({VARIANT!r}, kv_len={REF_KV}, mode='timing') (one head)",
           "model": model_name, "batch": len(contexts), "contexts": contexts, "unit": "s",
           "step_seconds": s.seconds, "tokens_per_s": s.tokens_per_s, "bound_kind": s.bound_kind, "fits": s.fits,
           "tasks": len(s.tasks), "padding": int(s.padding.total), "attention_cycles": s.attention_cycles,
           "reductions": [str(r.run.reductions) for r in s.attention_runs], "cycles_ref": ref.cycles}
    del s, ref
    return row, (lambda: model.step(model_name, contexts, **SPEED_ONLY), one_head)


def _split_case():
    from .. import model

    contexts = mixed_contexts()
    split = model.step(MODEL, contexts, mapping="split", **SPEED_ONLY)
    row = {"measure": "split", "variant": VARIANT, "model": MODEL, "batch": len(contexts), "contexts": contexts,
           "num_label": f"model.step({MODEL!r}, batch {len(contexts)}, mixed, mapping='split')",
           "den_label": f"model.step({MODEL!r}, batch {len(contexts)}, mixed, mapping='sequence')", "unit": "s",
           "tasks": len(split.tasks), "tokens_per_s": split.tokens_per_s, "step_seconds": split.seconds,
           "bound_kind": split.bound_kind, "reductions": [str(r.run.reductions) for r in split.attention_runs]}
    del split
    return row, (lambda: model.step(MODEL, contexts, mapping="split", **SPEED_ONLY),
                 lambda: model.step(MODEL, contexts, mapping="sequence", **SPEED_ONLY))


def all_channel_fraction(step: Any) -> float:
    """A step's attention against the channel bound of all its KV bytes over all the device's channels: that
    bound's cycles / the attention's (one device run; 1.0 would be every channel streaming all the time)."""
    run, dev, m = step.attention_runs[0], step.device, step.model
    from ..model.files import DTYPE_BYTES

    kv = sum(2 * t.keys * m.head_dim * DTYPE_BYTES[m.kv_dtype] for t in run.tasks)
    return kv / (dev.hbm_channels * dev.channel_bytes_per_cycle) / run.cycles


def split_targets() -> dict[str, Any]:
    """Split-KV's simulated targets (:data:`SPLIT_TARGETS`), each with its figure and whether it is met, and the
    figures behind them (tokens/s and fractions of both mappings, both merges)."""
    from .. import model

    out: dict[str, Any] = {"figures": []}
    steps = {}
    for batch in (1, 16):
        for mapping, merge in (("sequence", "device"), ("split", "device"), ("split", "host")):
            s = model.step("llama-3-8b", [32768] * batch, mapping=mapping, merge=merge, **SPEED_ONLY)
            steps[(batch, mapping, merge)] = s
            out["figures"].append({"model": "llama-3-8b", "batch": batch, "context": 32768, "mapping": mapping,
                                   "merge": merge, "tokens_per_s": s.tokens_per_s, "attention_cycles": s.attention_cycles,
                                   "all_channel_fraction": all_channel_fraction(s),
                                   "busiest_channel_fraction": s.attention_runs[0].channel_bound_cycles
                                   / s.attention_cycles})
    figures = {"tokens_per_s_ratio_8b_b1": steps[(1, "split", "device")].tokens_per_s
               / steps[(1, "sequence", "device")].tokens_per_s,
               "channel_fraction_b1": all_channel_fraction(steps[(1, "split", "device")]),
               "channel_fraction_b16": all_channel_fraction(steps[(16, "split", "device")])}
    out["targets"] = [{"name": n, "what": what, "target": t, "measured": figures[n], "met": figures[n] >= t}
                      for n, t, what in SPLIT_TARGETS]
    return out


# --- the sweep --------------------------------------------------------------------------------------
def sweep_axes() -> dict[str, Any]:
    """Row 3's sweep: its axes and its one case (variant, placement, schedule)."""
    return {"model": SWEEP_MODEL, "batch": list(SWEEP_BATCH), "context": list(SWEEP_CONTEXT),
            "handoff_us": list(SWEEP_HANDOFF_US), "variants": (VARIANT,), "placements": (SWEEP_PLACEMENT,),
            "schedules": (SWEEP_SCHEDULE,)}


def _kbwork_file() -> str:
    """Where a worker's kbwork comes from (run on every Dask worker)."""
    import kbwork

    return kbwork.__file__


class _with_pythonpath:
    """``os.environ["PYTHONPATH"]`` with this checkout first while the Dask workers start (they inherit it)."""

    def __enter__(self):
        self.old = os.environ.get("PYTHONPATH")
        os.environ["PYTHONPATH"] = str(ROOT) + (os.pathsep + self.old if self.old else "")

    def __exit__(self, *exc):
        if self.old is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = self.old


def sweep_row(passes: int, show_progress: bool = True) -> dict[str, Any]:
    """Row 3: the sweep serially and on a 2-worker Dask LocalCluster, alternating, ``passes`` of each; or a
    row saying why it was skipped (``skipped``)."""
    from tqdm.auto import tqdm

    from .. import model

    axes = sweep_axes()
    points = len(axes["batch"]) * len(axes["context"]) * len(axes["handoff_us"])
    row: dict[str, Any] = {
        "measure": "sweep", "variant": VARIANT, "placement": SWEEP_PLACEMENT, "schedule": SWEEP_SCHEDULE,
        "num_label": f"model.sweep, {points} points ({SWEEP_MODEL}; batch {list(SWEEP_BATCH)} x contexts "
                     f"{list(SWEEP_CONTEXT)} x handoff_us {list(SWEEP_HANDOFF_US)}), serially (workers=1)",
        "den_label": f"the same on a {DASK_WORKERS}-worker Dask LocalCluster (client=)",
        "points": points, "unit": "s", "axes": {k: v for k, v in axes.items() if k not in ("variants",)}}
    try:
        import distributed
    except ImportError:
        row["skipped"] = "dask.distributed is not installed (pip install -e '.[bench]'): the sweep row is skipped"
        return row
    warm = {**axes, "context": axes["context"][:1], "handoff_us": axes["handoff_us"][:1]}
    with _with_pythonpath():
        cluster = distributed.LocalCluster(n_workers=DASK_WORKERS, threads_per_worker=1, processes=True,
                                           host="127.0.0.1", dashboard_address=None)
    with cluster, distributed.Client(cluster) as client:
        client.wait_for_workers(DASK_WORKERS)
        row["worker_kbwork"] = sorted(set(client.run(_kbwork_file).values()))
        model.sweep(workers=1, progress=False, **warm)  # untimed: this process and the workers warm up
        model.sweep(client=client, progress=False, **warm)
        sides: dict[str, list[float]] = {"num": [], "den": []}
        equal = []
        frame_rows = None
        for _ in tqdm(range(passes), desc="model: sweep serially vs Dask", disable=not show_progress):
            t0 = time.perf_counter()
            serial = model.sweep(workers=1, progress=False, **axes)
            sides["num"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            on_dask = model.sweep(client=client, progress=False, **axes)
            sides["den"].append(time.perf_counter() - t0)
            equal.append(bool(serial.equals(on_dask)))
            frame_rows = len(serial)
            del serial, on_dask
    root = str(ROOT) + os.sep
    row.update({"passes": {**sides, "ratio": [a / b for a, b in zip(sides["num"], sides["den"])]},
                "num": min(sides["num"]), "den": min(sides["den"]), "frames_equal": all(equal),
                "frame_rows": frame_rows,
                "workers_import_this_checkout": all(os.path.realpath(f).startswith(root)
                                                    for f in row["worker_kbwork"])})
    row["ratio"] = row["num"] / row["den"]
    return row


# --- the interactive case ------------------------------------------------------------------------------
_COLD_SCRIPT = """
import json, sys, time
t0 = time.perf_counter()
from kbwork import model
t1 = time.perf_counter()
model.step(sys.argv[1], [int(sys.argv[3])] * int(sys.argv[2]), check_capacity=False)  # a speed benchmark
t2 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "first_step_s": t2 - t1}))
"""


def cold_step(model_name: str, batch: int, context: int) -> dict[str, float]:
    """One fresh interpreter (this checkout on its PYTHONPATH): ``from kbwork import model``, then a first step."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with tempfile.TemporaryDirectory(prefix="kbwork-cold-") as cwd:
        p = subprocess.run([sys.executable, "-c", _COLD_SCRIPT, model_name, str(batch), str(context)], env=env,
                           cwd=cwd, capture_output=True, text=True, check=True)
    return json.loads(p.stdout.strip().splitlines()[-1])


def interactive(min_seconds: float, cold_runs: int | None = None) -> list[dict[str, Any]]:
    """Each :data:`INTERACTIVE` step: its median warm wall time (the cases interleaved) and its first call in a
    fresh interpreter (median of ``cold_runs``, default :data:`COLD_RUNS` read at the call)."""
    from .. import model
    from . import WARMUP_RUNS
    from .loops import interleaved

    cold_runs = COLD_RUNS if cold_runs is None else cold_runs
    fns = {f"{m} batch {b} context {c}": (lambda m=m, b=b, c=c: model.step(m, [c] * b, **SPEED_ONLY))
           for m, b, c in INTERACTIVE}
    warm = interleaved(fns, min_seconds, warmup=WARMUP_RUNS, collect=True, batch=True)
    out = []
    for (m, b, c), name in zip(INTERACTIVE, fns):
        cold = [cold_step(m, b, c) for _ in range(cold_runs)]
        s = model.step(m, [c] * b, **SPEED_ONLY)
        out.append({"model": m, "batch": b, "context": c, "warm_s": warm[name], "fits": s.fits,
                    "first_step_fresh_s": statistics.median(x["first_step_s"] for x in cold),
                    "import_s": statistics.median(x["import_s"] for x in cold), "cold_runs": cold,
                    "tasks": len(s.tasks), "step_seconds": s.seconds, "tokens_per_s": s.tokens_per_s})
    return out


# --- the suite --------------------------------------------------------------------------------------
def run_suite(*, dask: bool = True, min_seconds: float | None = None, passes: int | None = None,
              show_progress: bool = True) -> dict[str, Any]:
    """Every row of the module docstring, and the interactive figures."""
    from . import MIN_SECONDS, PASSES, WARMUP_RUNS
    from .loops import ratio_passes

    min_seconds = MIN_SECONDS if min_seconds is None else min_seconds
    passes = PASSES if passes is None else passes
    load = [os.getloadavg()[0]]
    rows = ratio_passes([_step_case("uniform", MODEL, [CONTEXT] * BATCH),
                         _step_case("mixed", MODEL, mixed_contexts())], passes, min_seconds, WARMUP_RUNS, "model",
                        load, show_progress)
    # split-KV's wall-time row and its simulated targets (DESIGN.md §16), beside the rows above
    split_load: list[float] = []
    (wall,) = ratio_passes([_split_case()], passes, min_seconds, WARMUP_RUNS, "model split", split_load,
                           show_progress)
    wall.update(target=TARGETS["split"], target_kind=TARGET_KIND["split"], met=bool(wall["ratio"] <= TARGETS["split"]),
                load_average_1min=split_load)
    split = {"wall": wall, **split_targets()}
    inter = interactive(min_seconds)
    load.append(os.getloadavg()[0])
    if dask:
        rows.append(sweep_row(passes, show_progress))
    else:
        rows.append({"measure": "sweep", "variant": VARIANT, "skipped": "--no-dask: the sweep row is skipped"})
    load.append(os.getloadavg()[0])
    for row in rows:
        row["target"], row["target_kind"] = TARGETS[row["measure"]], TARGET_KIND[row["measure"]]
        if "ratio" in row:
            row["met"] = bool(row["ratio"] <= row["target"] if row["target_kind"] == "max"
                              else row["ratio"] >= row["target"])
    return {"rows": rows, "interactive": inter, "passes": passes, "min_seconds": min_seconds,
            "warmup_runs": WARMUP_RUNS, "load_average_1min": load, "split": split}


def checks_failed(result: dict[str, Any]) -> list[str]:
    """What the suite checks and found wrong (an empty list when all is well)."""
    bad = []
    for r in result["rows"]:
        if r["measure"] == "sweep" and "skipped" not in r:
            if not r["frames_equal"]:
                bad.append("sweep: the serial and Dask frames differ")
            if not r["workers_import_this_checkout"]:
                bad.append(f"sweep: the Dask workers imported kbwork from {r['worker_kbwork']}, not {ROOT}")
    return bad


def _name(r: dict[str, Any]) -> str:
    if r["measure"] == "uniform":
        return f"step {r['model']}, batch {r['batch']}, all {r['contexts'][0]} vs one head"
    if r["measure"] == "mixed":
        return (f"step {r['model']}, batch {r['batch']}, {min(r['contexts'])}-{max(r['contexts'])} (seed "
                f"{MIXED_SEED}) vs one head")
    if r["measure"] == "split":
        return f"step {r['model']}, batch {r['batch']}, mixed: split vs sequence mapping"
    return f"sweep of {r.get('points', '?')} points: serial vs {DASK_WORKERS}-worker Dask"


def format_suite(result: dict[str, Any]) -> list[str]:
    """The table, the interactive figures and the checks, as lines."""
    head = (f"{'measure':<60}{'measured':>11}{'against':>11}{'now':>9}{'per pass':>14}{'target':>11}  met?")
    lines = [head, "-" * len(head)]
    for r in result["rows"]:
        target = ("<= " if r["target_kind"] == "max" else ">= ") + format(r["target"], ",g") + "x"
        if "skipped" in r:
            lines.append(f"{_name(r):<60}{'':>11}{'':>11}{'':>9}{'':>14}{target:>11}  skipped")
            continue
        per = r["passes"]["ratio"]
        lines.append(f"{_name(r):<60}{_fmt(r['num']):>11}{_fmt(r['den']):>11}{r['ratio']:>8.1f}x"
                     f"{f'{min(per):.1f}-{max(per):.1f}':>14}{target:>11}  {'yes' if r['met'] else 'NO'}")
    lines.append("now: each side's lowest pass figure, divided (the sweep: serial / Dask); per pass: the ratio "
                 "within each pass")
    for r in result["rows"]:
        if "skipped" in r:
            lines.append(f"{_name(r)}: {r['skipped']}")
            continue
        lines.append(f"{_name(r)}: per-pass ratios " + ", ".join(f"{x:.2f}" for x in r["passes"]["ratio"]))
        if r["measure"] in ("uniform", "mixed", "split"):
            lines.append(f"  {r['tasks']} tasks; step {r['step_seconds'] * 1e3:.2f} ms simulated, "
                         f"{r['tokens_per_s']:.0f} tokens/s, bound {r['bound_kind']}; "
                         + "; ".join(r["reductions"]))
        else:
            lines.append(f"  frames equal: {'yes' if r['frames_equal'] else 'NO'} ({r['frame_rows']} rows); "
                         f"Dask workers import {', '.join(r['worker_kbwork'])}")
    for x in result["interactive"]:
        lines.append(f"interactive: model.step({x['model']!r}, batch {x['batch']}, context {x['context']}): "
                     f"{_fmt(x['warm_s'])} warm (median), {_fmt(x['first_step_fresh_s'])} as the first call in a "
                     f"fresh interpreter (after {_fmt(x['import_s'])} of import); {x['tasks']} tasks")
    wall = result.get("split", {}).get("wall")
    if wall is not None:
        lines.append(f"split-KV: {_name(wall)}: {_fmt(wall['num'])} against {_fmt(wall['den'])}, {wall['ratio']:.1f}x "
                     f"(target <= {wall['target']:g}x; {'met' if wall['met'] else 'NOT met'})")
    for t in result.get("split", {}).get("targets", []):
        lines.append(f"split-KV: {t['what']}: {t['measured']:.3g} (target >= {t['target']:g}; "
                     f"{'met' if t['met'] else 'NOT met'})")
    lines.append("load average (1 min) through the run: "
                 + ", ".join(f"{x:.2f}" for x in result["load_average_1min"]))
    return lines
