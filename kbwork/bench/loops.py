"""The loops suite: the four targets of loops as data (``tl.range`` traced once), each a ratio.

``kbwork bench --suite loops`` measures, in one run and one process, the two
sides of every ratio interleaved call by call (one call of each side per
round), so that a slowdown of the shared machine lands on both sides:

1. **steady**: timing-mode ``decode.run(v, kv_len=N, mode="timing")`` (the
   exact steady state) at 16M tokens against 4k, for opt2, opt3 and a1
   (target <= 1.5x).
2. **full**: ``decode.run(v, kv_len=32768, mode="timing", steady_state=False)``
   against a bare heap loop over as many stages (``r.run.n_stages``):
   ``for i in range(n): heappush(h, (i % 7, i, 3))``, then ``heappop`` until
   empty (target <= 6x), for opt2 and opt3.
3. **data**: data-mode ``decode.run(v, q=q, k=k, v=v, mode="data")`` at 32k
   on inputs drawn beforehand (``decode.make_inputs``) against a pure-numpy
   flash-decode on the same arrays (:func:`numpy_flash_decode`, the cast of
   the bf16 q, K and V to float32 timed inside it; target <= 8x), for opt2
   and opt3. The floor's O is checked against ``decode.run``'s.
4. **rss**: data-mode ``decode.compare(kv_len=262144, mode="data")``, its peak
   RSS above ``import kbwork.decode``, against the float32 bytes of K and V
   (``2 * kv_len * head_dim * 4``; target <= 2.5x). Each measurement runs in
   a fresh interpreter (started by a forked shell, so that its ``ru_maxrss``
   is its own): ``ru_maxrss`` after the compare minus ``VmRSS`` right after
   the import, checked against the kernel's ``VmHWM``.

Method, as in the other suites: every timed side is warmed up, then a median
over at least ``MIN_SECONDS`` of calls; the timed measures run in ``PASSES``
passes and each side is its lowest pass median (every pass median, and each
pass's ratio, are kept in the JSON). The heap loop runs with the cyclic
garbage collector paused, as a run does; numpy's BLAS runs on one thread
(``threadpoolctl``, and ``OPENBLAS_NUM_THREADS=1`` etc. in the RSS
subprocesses).

A benchmark, not a test: it prints and saves figures and asserts nothing
about speed. What it checks: the steady runs took the steady path, the full
runs the full one, and the numpy floor reproduces ``decode.run``'s O.
"""

from __future__ import annotations

import contextlib
import gc
import json
import math
import os
import statistics
import subprocess
import sys
import time
from heapq import heappop, heappush
from typing import Any, Callable

import numpy as np

#: Sizes of the four measures (tokens; tile 128, group 8, head_dim 128, bf16).
STEADY_KV = (4096, 16 * 1024 * 1024)
FULL_KV = 32768
DATA_KV = 32768
RSS_KV = 262144
GROUP, HEAD_DIM, TILE, DTYPE = 8, 128, 128, "bf16"

STEADY_VARIANTS = ("opt2", "opt3", "a1")
VARIANTS = ("opt2", "opt3")

TARGETS = {"steady": 1.5, "full": 6.0, "data": 8.0, "rss": 2.5}
#: Fresh interpreters per RSS figure (the figure is their median; every one is kept).
RSS_RUNS = 3
#: How close the numpy floor's O must be to decode.run's (max abs difference).
FLOOR_TOLERANCE = 1e-6


def heap_loop(n: int) -> None:
    """The bare heap floor: ``n`` pushes of ``(i % 7, i, 3)``, then pops until the heap is empty."""
    h: list[tuple[int, int, int]] = []
    for i in range(n):
        heappush(h, (i % 7, i, 3))
    while h:
        heappop(h)


def numpy_flash_decode(q: np.ndarray, k: np.ndarray, v: np.ndarray, tile: int = TILE) -> np.ndarray:
    """The numpy floor for data mode: flash-decode over tiles of ``tile`` rows, in float32.

    Casts ``q``, ``k``, ``v`` (bf16 arrays) to float32, then per tile computes
    ``s = q @ K_tile.T * scale`` and the online-softmax update of m, l and O
    (``maximum``, two ``exp``, a row sum, ``O * c + p @ V_tile``); returns ``O / l``.
    """
    q, k, v = (np.asarray(x).astype(np.float32) for x in (q, k, v))
    g, d = q.shape
    scale = np.float32(1.0 / math.sqrt(d))
    m = np.full((g, 1), -np.inf, np.float32)
    l = np.zeros((g, 1), np.float32)
    O = np.zeros((g, d), np.float32)
    for r0 in range(0, k.shape[0], tile):
        s = q @ k[r0:r0 + tile].T * scale
        m_new = np.maximum(m, s.max(axis=1, keepdims=True))
        c = np.exp(m - m_new)
        p = np.exp(s - m_new)
        l = l * c + p.sum(axis=1, keepdims=True)
        O = O * c + p @ v[r0:r0 + tile]
        m = m_new
    return O / l


#: The slowest warm-up call, in seconds, from which :func:`interleaved` calls the faster sides several times a round.
BATCH_FROM_SECONDS = 0.01


def interleaved(fns: dict[str, Callable[[], Any]], min_seconds: float, repeats: int = 5,
                warmup: int = 2, max_rounds: int = 2000, collect: bool = False,
                batch: bool = False, max_calls_per_round: int = 200) -> dict[str, float]:
    """Median wall time of each of ``fns``, called in turn, round after round.

    Rounds continue until every function has had at least ``repeats`` calls and
    ``min_seconds`` of calls (or ``max_rounds`` rounds), after ``warmup``
    untimed rounds. A round calls each function once; with ``batch``, each is
    called about as many times as the slowest one's time over its own (from the
    last warm-up call; at most ``max_calls_per_round``), so that a side 150
    times faster than the other does not make the slow side run 150 times over
    (the model suite's steps against one head's run). Without it, every call
    follows the other side's, which is what the loops suite's floors are
    measured under (a floor called again and again runs on warm caches).

    A function's previous result is dropped before its clock starts; with
    ``collect``, the cyclic garbage collector also runs before each side's
    first call of a round (``gc.collect()``; with a large result alive it
    takes tens of ms), so that the collection a large result's garbage calls
    for is not paid inside the next call, which may be the other side's.
    """
    last: dict[str, Any] = {}
    est = dict.fromkeys(fns, 0.0)
    for _ in range(warmup):
        for name, fn in fns.items():
            last[name] = None
            t0 = time.perf_counter()
            last[name] = fn()
            est[name] = time.perf_counter() - t0
    slowest = max(est.values(), default=0.0)
    # Below BATCH_FROM_SECONDS a round is short anyway, and timer noise on tiny calls would decide the counts.
    per_round = {n: 1 if not batch or slowest < BATCH_FROM_SECONDS or est[n] <= 0 else
                 max(1, min(max_calls_per_round, int(slowest / est[n]))) for n in fns}
    times: dict[str, list[float]] = {name: [] for name in fns}
    total = dict.fromkeys(fns, 0.0)
    rounds = 0
    while rounds < max_rounds and any(len(times[n]) < repeats or total[n] < min_seconds for n in fns):
        for name, fn in fns.items():
            for k in range(per_round[name]):
                last[name] = None
                if collect and k == 0:  # the other side's garbage; a side's own repeats leave little
                    gc.collect()
                t0 = time.perf_counter()
                last[name] = fn()
                dt = time.perf_counter() - t0
                times[name].append(dt)
                total[name] += dt
        rounds += 1
    return {name: statistics.median(t) for name, t in times.items()}


def ratio_passes(cases: list, passes: int, min_seconds: float, warmup: int, suite: str, load: list[float],
                 show_progress: bool = True) -> list[dict[str, Any]]:
    """Time each ``(row, (num, den))`` of ``cases`` in ``passes`` passes, the two sides interleaved and batched
    (:func:`interleaved`); every pass's figures go to ``row["passes"]`` and each side is its lowest pass median
    (``row["num"]``, ``row["den"]``, ``row["ratio"]``). Appends the 1-minute load average after each pass to
    ``load``. Returns the rows, in the order of ``cases``."""
    from tqdm.auto import tqdm

    for row, _ in cases:
        row["passes"] = {"num": [], "den": [], "ratio": []}
    for p in range(passes):
        for row, (num, den) in tqdm(cases, desc=f"{suite} pass {p + 1}/{passes}", disable=not show_progress):
            t = interleaved({"num": num, "den": den}, min_seconds, warmup=warmup, collect=True, batch=True)
            row["passes"]["num"].append(t["num"])
            row["passes"]["den"].append(t["den"])
            row["passes"]["ratio"].append(t["num"] / t["den"])
        load.append(os.getloadavg()[0])
    rows = []
    for row, _ in cases:
        row["num"], row["den"] = min(row["passes"]["num"]), min(row["passes"]["den"])
        row["ratio"] = row["num"] / row["den"]
        rows.append(row)
    return rows


# --- the three timed measures: each returns the pair of callables and what it checked ---------
def _steady_case(variant: str, kv_lens: tuple[int, int]):
    from .. import decode

    small, large = kv_lens
    checks = {}
    for kv in kv_lens:
        r = decode.run(variant, kv_len=kv, mode="timing")
        ss = r.run.steady_state
        checks[kv] = {"path": ss.path, "period": ss.period, "reason": ss.reason, "cycles": r.cycles}
    row = {"measure": "steady", "variant": variant,
           "num_label": f"decode.run timing, steady state, {large} tokens",
           "den_label": f"the same at {small} tokens",
           "kv_len": large, "kv_len_ref": small, "unit": "s",
           "path": checks[large]["path"], "path_ref": checks[small]["path"],
           "period_tiles": checks[large]["period"], "cycles": checks[large]["cycles"],
           "cycles_ref": checks[small]["cycles"], "reason": checks[large]["reason"]}
    return row, (lambda: decode.run(variant, kv_len=large, mode="timing"),
                 lambda: decode.run(variant, kv_len=small, mode="timing"))


def _full_case(variant: str, kv_len: int):
    from .. import decode
    from ..sim import gc_paused

    r = decode.run(variant, kv_len=kv_len, mode="timing", steady_state=False)
    n = r.run.n_stages
    row = {"measure": "full", "variant": variant,
           "num_label": f"decode.run timing, steady_state=False, {kv_len} tokens",
           "den_label": f"bare heap loop over {n} stages",
           "kv_len": kv_len, "unit": "s", "stages": n, "path": r.run.steady_state.path, "cycles": r.cycles}
    del r

    def floor():
        with gc_paused():  # as in a run
            heap_loop(n)

    return row, (lambda: decode.run(variant, kv_len=kv_len, mode="timing", steady_state=False), floor)


def _data_case(variant: str, inputs: dict[str, Any]):
    from .. import decode

    q, k, v = inputs["f32"]
    qb, kb, vb = inputs["bf16"]
    r = decode.run(variant, q=q, k=k, v=v, mode="data")
    O = numpy_flash_decode(qb, kb, vb)
    diff = float(np.max(np.abs(O.astype(np.float64) - r.O.astype(np.float64))))
    row = {"measure": "data", "variant": variant,
           "num_label": f"decode.run data mode, {k.shape[0]} tokens, inputs drawn beforehand",
           "den_label": "numpy flash-decode on the same arrays (bf16 cast to float32 inside)",
           "kv_len": int(k.shape[0]), "unit": "s", "stages": r.run.n_stages,
           "floor_max_abs_diff_O": diff, "floor_bit_identical_O": bool(np.array_equal(O, r.O)),
           "floor_within_tolerance": diff <= FLOOR_TOLERANCE, "floor_tolerance": FLOOR_TOLERANCE}
    del r
    return row, (lambda: decode.run(variant, q=q, k=k, v=v, mode="data"), lambda: numpy_flash_decode(qb, kb, vb))


def data_inputs(kv_len: int) -> dict[str, Any]:
    """The data measure's inputs, drawn once: float32 (bf16 values) for kbwork, ``ml_dtypes.bfloat16`` for numpy."""
    import ml_dtypes

    from .. import decode

    f32 = decode.make_inputs(kv_len, GROUP, HEAD_DIM, DTYPE, 0)
    return {"f32": f32, "bf16": tuple(x.astype(ml_dtypes.bfloat16) for x in f32)}


# --- memory, in fresh interpreters ----------------------------------------------------------------
_RSS_SCRIPT = """
import json, resource, sys
def status(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
def maxrss():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
import kbwork.decode as decode
base = status("VmRSS")
at_import = {"peak_rss_at_import": maxrss(), "vmhwm_at_import": status("VmHWM")}
decode.compare(kv_len=int(sys.argv[1]), mode="data")
print(json.dumps({"rss_after_import": base, **at_import, "peak_rss": maxrss(), "vmhwm": status("VmHWM")}))
"""

#: The RSS subprocesses run numpy's BLAS on one thread, like the timed measures.
ONE_THREAD_ENV = {k: "1" for k in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")}
#: The interpreter is started by a forked shell, not by this process: a child exec'd straight from
#: this (large) process starts with its ``ru_maxrss`` at this process's peak, which Linux carries over
#: the exec. The shell's fork starts the count afresh.
_TRAMPOLINE = ["/bin/sh", "-c", '"$0" "$@"; exit $?']


def rss_once(kv_len: int) -> dict[str, int]:
    """One fresh interpreter: VmRSS after ``import kbwork.decode`` and ``ru_maxrss`` after a data-mode compare
    (and ``VmHWM`` at both points, which must agree with ``ru_maxrss``)."""
    from pathlib import Path

    root = str(Path(__file__).resolve().parents[2])  # this checkout's kbwork, whatever the cwd
    env = {**os.environ, **ONE_THREAD_ENV,
           "PYTHONPATH": root + (os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else "")}
    p = subprocess.run([*_TRAMPOLINE, sys.executable, "-c", _RSS_SCRIPT, str(kv_len)], env=env,
                       capture_output=True, text=True, check=True)
    return json.loads(p.stdout.strip().splitlines()[-1])


def rss_case(kv_len: int = RSS_KV, runs: int = RSS_RUNS) -> dict[str, Any]:
    """Peak RSS of a data-mode ``compare`` above the import, median of ``runs`` fresh interpreters."""
    t0 = time.perf_counter()
    each = [rss_once(kv_len) for _ in range(runs)]
    above = [e["peak_rss"] - e["rss_after_import"] for e in each]
    kv_bytes = 2 * kv_len * HEAD_DIM * 4
    med = statistics.median(above)
    return {"measure": "rss", "variant": "opt2+opt3",
            "num_label": f"decode.compare data mode, {kv_len} tokens: peak RSS above import kbwork.decode",
            "den_label": "float32 bytes of K and V", "kv_len": kv_len, "unit": "bytes",
            "num": med, "den": kv_bytes, "ratio": med / kv_bytes,
            "runs": each, "peak_above_import_bytes": above, "wall_s": time.perf_counter() - t0}


# --- the suite ----------------------------------------------------------------------------------
def run_suite(*, steady_kv: tuple[int, int] | None = None, full_kv: int | None = None,
              data_kv: int | None = None, rss_kv: int | None = None, rss_runs: int | None = None,
              min_seconds: float | None = None, passes: int | None = None,
              show_progress: bool = True) -> dict[str, Any]:
    """Every measure of the module docstring; ``result["rows"]`` holds one row per measure and variant.

    An argument left ``None`` takes the module's constant (``STEADY_KV``, ...) and, for ``min_seconds``
    and ``passes``, the package's ``MIN_SECONDS`` and ``PASSES``.
    """
    from tqdm.auto import tqdm

    from . import MIN_SECONDS, PASSES, WARMUP_RUNS
    from .steady import one_blas_thread

    steady_kv = STEADY_KV if steady_kv is None else steady_kv
    full_kv = FULL_KV if full_kv is None else full_kv
    data_kv = DATA_KV if data_kv is None else data_kv
    rss_kv = RSS_KV if rss_kv is None else rss_kv
    rss_runs = RSS_RUNS if rss_runs is None else rss_runs
    min_seconds = MIN_SECONDS if min_seconds is None else min_seconds
    passes = PASSES if passes is None else passes
    limit = one_blas_thread()
    with limit if limit is not None else contextlib.nullcontext():
        inputs = data_inputs(data_kv)
        cases = ([_steady_case(v, steady_kv) for v in STEADY_VARIANTS]
                 + [_full_case(v, full_kv) for v in VARIANTS]
                 + [_data_case(v, inputs) for v in VARIANTS])
        for row, _ in cases:
            row["passes"] = {"num": [], "den": [], "ratio": []}
        for p in range(passes):
            for row, (num, den) in tqdm(cases, desc=f"loops pass {p + 1}/{passes}", disable=not show_progress):
                t = interleaved({"num": num, "den": den}, min_seconds, warmup=WARMUP_RUNS)
                row["passes"]["num"].append(t["num"])
                row["passes"]["den"].append(t["den"])
                row["passes"]["ratio"].append(t["num"] / t["den"])
        rows = []
        for row, _ in cases:  # each side is its lowest pass median
            row["num"], row["den"] = min(row["passes"]["num"]), min(row["passes"]["den"])
            row["ratio"] = row["num"] / row["den"]
            rows.append(row)
        del cases, inputs
    rows.append(rss_case(rss_kv, rss_runs))
    for row in rows:
        row["target"] = TARGETS[row["measure"]]
        row["met"] = bool(row["ratio"] <= row["target"])
    return {"rows": rows, "blas_one_thread": limit is not None, "passes": passes, "min_seconds": min_seconds,
            "warmup_runs": WARMUP_RUNS}


def checks_failed(result: dict[str, Any]) -> list[str]:
    """What the suite checks and found wrong (an empty list when all is well): paths and the floor's O."""
    bad = []
    for r in result["rows"]:
        if r["measure"] == "steady" and (r["path"] != "steady" or r["path_ref"] != "steady"):
            bad.append(f"{r['variant']}: the steady measure ran the {r['path']} / {r['path_ref']} path "
                       f"({r['reason']})")
        if r["measure"] == "full" and r["path"] != "full":
            bad.append(f"{r['variant']}: the full measure ran the {r['path']} path")
        if r["measure"] == "rss":
            for e in r["runs"]:  # ru_maxrss is the interpreter's own peak: the kernel's VmHWM says the same
                slack = 1 << 20
                if (abs(e["peak_rss"] - e["vmhwm"]) > slack
                        or e["peak_rss_at_import"] > e["vmhwm_at_import"] + slack):
                    bad.append(f"rss: ru_maxrss {e['peak_rss']} is not the interpreter's own peak (VmHWM "
                               f"{e['vmhwm']}; at import {e['peak_rss_at_import']} against {e['vmhwm_at_import']})")
        if r["measure"] == "data" and not r["floor_within_tolerance"]:
            bad.append(f"{r['variant']}: the numpy floor's O differs from decode.run's by "
                       f"{r['floor_max_abs_diff_O']:.3g} (tolerance {r['floor_tolerance']:g})")
    return bad


def _fmt(x: float, unit: str = "s") -> str:
    """``x`` seconds as ms or s (``unit="bytes"``: bytes as MiB), for the suites' tables."""
    if unit == "bytes":
        return f"{x / 2**20:.0f} MiB"
    return f"{x * 1e3:.2f} ms" if x < 1 else f"{x:.2f} s"


_MEASURE_NAMES = {
    "steady": "timing steady, {kv_len} vs {kv_len_ref} tokens",
    "full": "timing full at {kv_len} vs heap loop ({stages} stages)",
    "data": "data at {kv_len} vs numpy flash-decode",
    "rss": "data compare at {kv_len}: peak RSS above import vs f32 K+V",
}


def format_suite(result: dict[str, Any]) -> list[str]:
    """The table (measure, variant, both sides, now, target, met?) and what was checked, as lines."""
    head = (f"{'measure':<60}{'variant':<10}{'kbwork':>11}{'against':>11}{'now':>8}{'per pass':>12}{'target':>8}"
            f"  met?")
    lines = [head, "-" * len(head)]
    for r in result["rows"]:
        name = _MEASURE_NAMES[r["measure"]].format(**r)
        per = r.get("passes", {}).get("ratio")
        per_pass = f"{min(per):.2f}-{max(per):.2f}" if per else ""
        lines.append(f"{name:<60}{r['variant']:<10}{_fmt(r['num'], r['unit']):>11}{_fmt(r['den'], r['unit']):>11}"
                     f"{r['ratio']:>7.2f}x{per_pass:>12}{'<= ' + format(r['target'], 'g') + 'x':>8}  "
                     f"{'yes' if r['met'] else 'NO'}")
    over = [f"{r['measure']} {r['variant']}" for r in result["rows"]
            if any(x > r["target"] for x in r.get("passes", {}).get("ratio", []))]
    if over:
        lines.append("over the target in one pass or more: " + ", ".join(over))
    lines.append("now: each side's lowest pass median, divided; per pass: the ratio within each pass")
    for r in result["rows"]:
        if r["measure"] == "steady":
            lines.append(f"steady {r['variant']}: paths {r['path']} / {r['path_ref']}, period {r['period_tiles']} "
                         f"tiles; per-pass ratios " + ", ".join(f"{x:.2f}" for x in r["passes"]["ratio"]))
        elif r["measure"] in ("full", "data"):
            lines.append(f"{r['measure']} {r['variant']}: per-pass ratios "
                         + ", ".join(f"{x:.2f}" for x in r["passes"]["ratio"]))
        if r["measure"] == "data":
            same = "bit for bit" if r["floor_bit_identical_O"] else f"max |diff| {r['floor_max_abs_diff_O']:.3g}"
            lines.append(f"data {r['variant']}: the numpy floor reproduces decode.run's O ({same}; tolerance "
                         f"{r['floor_tolerance']:g}): {'yes' if r['floor_within_tolerance'] else 'NO'}")
        if r["measure"] == "rss":
            lines.append(f"rss: peak above import {', '.join(_fmt(x, 'bytes') for x in r['peak_above_import_bytes'])}"
                         f" in {len(r['runs'])} fresh interpreters (median {r['num'] / 2**20:.0f} MiB); float32 K "
                         f"and V {r['den'] / 2**20:.0f} MiB")
    if result.get("blas_one_thread") is False:
        lines.append("(numpy's BLAS threads were not capped in this process: threadpoolctl is not installed)")
    return lines
