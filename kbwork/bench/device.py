"""The device suite: what a device run costs against one PE's run, each a ratio (DESIGN.md §14).

``kbwork bench --suite device`` measures, in one run, the two sides of every
ratio interleaved (in each round the slow side once and the fast side as
often as fits in that call, ``interleaved(..., batch=True)``),
so that a slowdown of the shared machine lands on both sides:

1. **device**: ``ahbm-device-v1``, :data:`DEVICE_PES` PEs each running one
   opt2 decode task at :data:`KV` tokens (per PE p: q (4, 128) bf16, K and V
   (KV, 128) bf16, O (4, 128) fp32, all on ``sim.topo.home_channel(p)``; one
   ``Launch(gqa_decode, ..., variant="opt2", tile=128)`` per PE), timing mode,
   set-up included (the ``Simulator``, ``sim.hbm``, the ``Launch`` es), against
   one PE's ``decode.run("opt2", kv_len=KV, mode="timing")`` (target <= 6x: a kernel is traced once per
   signature and bound to the other launches, DESIGN.md §19).
   The device side's time is also broken down (set-up, ``run.timings``' emit
   and simulate, the rest of ``run_device``) and profiled once by function.
2. **shared**: :data:`SHARED_PES` PEs on one channel of 64 bytes per cycle
   (``pes=4, hbm_channels=1, channel_bytes_per_cycle=64``), each an opt2 task
   at KV tokens, set-up included, against the same one-PE run (target <= 10x).
   Checked, not timed: the steady state was proven jointly (``"steady with the
   device"`` in every line of ``run.steady_state.loops``) and the op_log equals
   ``run_device(..., steady_state=False, reductions=False)``'s.
3. **before**: a one-PE timing run (opt2 and opt3 at :data:`AB_KV`, the full
   simulation ``steady_state=False`` and the steady state) on this checkout
   against the same on the code before the device work (commit
   :data:`AB_COMMIT`; target <= 1.1x). Each side runs in its own interpreter
   (``PYTHONPATH`` naming its checkout), the two alternating, :data:`AB_PASSES`
   passes; each interpreter reports, per variant, the best of at least
   :data:`AB_FULL_RUNS` full runs and :data:`AB_STEADY_RUNS` steady ones, and
   at least :data:`AB_MIN_SECONDS` of each (the garbage collector run before
   every run). The old code is the
   commit's tree, extracted with ``git archive`` into a temporary directory
   (or a checkout given as ``before=``); when the commit is not in this clone
   the row says so and is skipped.

4. **instructions** (``--instructions``, when ``valgrind`` is on the PATH): row 3's runs counted in
   machine instructions instead of seconds, under ``valgrind --tool=cachegrind --cache-sim=no`` with
   ``PYTHONHASHSEED=0``: per variant and path, each checkout's instructions per run (a process making
   :data:`INSN_RUNS` runs of it beyond a baseline process, after one warm-up run of every case in each,
   the difference divided by :data:`INSN_RUNS`), and their ratio. Nearly deterministic where the seconds
   are not (on this machine a one-PE row moved between 0.95x and 1.15x from one suite run to the next),
   it says what each side executes, not what that costs on this hour's processor (caches, clocks and
   neighbours are outside it): a proxy printed beside the rows, not a target.

Each side of rows 1 and 2 is a median over at least ``MIN_SECONDS`` of calls
(and 5 calls) in each of ``PASSES`` passes, and each side is its lowest pass
median; row 3's sides are their lowest pass figures. Every pass's figures and
ratio are kept in the JSON, with the load average through the run.

A benchmark, not a test: it prints and saves figures and asserts nothing
about speed. What it checks: the shared row's joint steady state and op_log,
and that each interpreter of row 3 imported kbwork from its own checkout.
"""

from __future__ import annotations

import contextlib
import gc
import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

from .loops import _fmt

#: Sizes: tokens per task, PEs of the device row, the shared row's device.
KV = 32768
DEVICE_PES = 96
DEVICE_TOPOLOGY = "ahbm-device-v1"
SHARED_PES = 4
SHARED = {"pes": 4, "hbm_channels": 1, "channel_bytes_per_cycle": 64}
GROUP, HEAD_DIM, TILE, VARIANT = 4, 128, 128, "opt2"

#: The code before the device work, and how row 3 measures against it.
AB_COMMIT = "99ec8f0"
AB_KV = 32768
AB_PASSES = 5
AB_FULL_RUNS, AB_STEADY_RUNS = 7, 15
#: Each figure of an interpreter is the best of at least that many runs and at least this many seconds of them.
AB_MIN_SECONDS = 1.0
AB_VARIANTS = ("opt2", "opt3")

TARGETS = {"device": 6.0, "shared": 10.0, "before": 1.1}
#: Device-side calls timed phase by phase for the breakdown (the median call's phases are reported).
BREAKDOWN_CALLS = 5
#: Functions the profile of the device side lists (the largest by cumulative time; the call tree from
#: run_device down to the kernel is about 15 deep since the two-phase and step()-shaped loop functions).
PROFILE_TOP = 20

ROOT = Path(__file__).resolve().parents[2]  # this checkout


def device_launches(n_tasks: int, kv_len: int, topology: str = DEVICE_TOPOLOGY,
                    **overrides: Any) -> tuple[Any, dict]:
    """A timing-mode ``Simulator`` of ``topology`` with ``overrides`` and one opt2 decode ``Launch`` on each PE
    ``0 .. n_tasks - 1``, every tensor of PE p on its home channel: the set-up of rows 1 and 2."""
    import kbwork
    from kbwork.kernels.gqa_decode import gqa_decode

    sim = kbwork.Simulator(topology, mode="timing", **overrides)
    launches = {}
    for p in range(n_tasks):
        ch = sim.topo.home_channel(p)
        q = sim.hbm(f"q{p}", shape=(GROUP, HEAD_DIM), dtype="bf16", channel=ch)
        K = sim.hbm(f"K{p}", shape=(kv_len, HEAD_DIM), dtype="bf16", channel=ch)
        V = sim.hbm(f"V{p}", shape=(kv_len, HEAD_DIM), dtype="bf16", channel=ch)
        O = sim.hbm(f"O{p}", shape=(GROUP, HEAD_DIM), dtype="fp32", channel=ch)
        launches[p] = [kbwork.Launch(gqa_decode, q, K, V, O, variant=VARIANT, tile=TILE)]
    return sim, launches


def device_run(n_tasks: int, kv_len: int, **overrides: Any) -> Any:
    """Set up and run the device case (what rows 1 and 2 time)."""
    sim, launches = device_launches(n_tasks, kv_len, **overrides)
    return sim.run_device(launches)


def one_pe_run(kv_len: int) -> Any:
    """The one-PE side of rows 1 and 2: ``decode.run("opt2", kv_len=kv_len, mode="timing")``."""
    from .. import decode

    return decode.run(VARIANT, kv_len=kv_len, mode="timing")


# --- rows 1 and 2 ------------------------------------------------------------------------------------
def _device_case(pes: int, kv_len: int):
    ref = one_pe_run(kv_len)
    run = device_run(pes, kv_len)
    row = {"measure": "device", "variant": VARIANT,
           "num_label": f"{DEVICE_TOPOLOGY}: {pes} PEs, one opt2 task of {kv_len} tokens each, timing, set-up "
                        f"included",
           "den_label": f"decode.run('opt2', kv_len={kv_len}, mode='timing') (one PE)",
           "kv_len": kv_len, "pes": pes, "unit": "s", "cycles": run.cycles, "cycles_ref": ref.cycles,
           "path": run.steady_state.path, "path_ref": ref.run.steady_state.path,
           "reductions": str(run.reductions), "stages": run.n_stages}
    del run, ref
    return row, (lambda: device_run(pes, kv_len), lambda: one_pe_run(kv_len))


def _shared_case(pes: int, kv_len: int, overrides: dict[str, Any]):
    ref = one_pe_run(kv_len)
    sim, launches = device_launches(pes, kv_len, **overrides)
    run = sim.run_device(launches)
    loops = list(run.steady_state.loops)
    plain = sim.run_device(launches, steady_state=False, reductions=False)
    row = {"measure": "shared", "variant": VARIANT,
           "num_label": f"{pes} PEs on one channel ({', '.join(f'{k}={v}' for k, v in overrides.items())}), one "
                        f"opt2 task of {kv_len} tokens each, timing, set-up included",
           "den_label": f"decode.run('opt2', kv_len={kv_len}, mode='timing') (one PE)",
           "kv_len": kv_len, "pes": pes, "overrides": dict(overrides), "unit": "s",
           "cycles": run.cycles, "cycles_ref": ref.cycles, "cycles_plain": plain.cycles,
           "path": run.steady_state.path, "reductions": str(run.reductions), "steady_loops": loops,
           "steady_jointly": bool(loops) and all("steady with the device" in line for line in loops),
           "op_log_equals_plain": bool(run.op_log.equals(plain.op_log)), "stages": len(plain.op_log)}
    del run, plain, ref, sim, launches
    return row, (lambda: device_run(pes, kv_len, **overrides), lambda: one_pe_run(kv_len))


def breakdown(pes: int, kv_len: int, calls: int | None = None) -> dict[str, float]:
    """Seconds of each phase of the median one of ``calls`` device-side calls (default
    :data:`BREAKDOWN_CALLS`, read at the call; the call whose ``total`` is the median, of an even number the upper
    middle one): ``setup`` (Simulator, hbm, Launch), ``run_device`` and, inside it, ``emit`` (tracing every launch
    and lowering it to a program), ``simulate`` (the reductions and the event loop) and ``rest`` (the rest of
    ``run_device``: checking the launches, building the run, and the young-generation collection over what the
    run made while the collector was paused, which starts as the pause ends).

    The phases are one call's, not medians taken phase by phase, so they add up: ``emit + simulate + rest ==
    run_device`` and ``setup + run_device == total`` (medians of each phase need not, and did not)."""
    calls = BREAKDOWN_CALLS if calls is None else calls
    taken: list[dict[str, float]] = []
    for _ in range(calls):
        gc.collect()
        t0 = time.perf_counter()
        sim, launches = device_launches(pes, kv_len)
        t1 = time.perf_counter()
        run = sim.run_device(launches)
        t2 = time.perf_counter()
        emit, simulate = run.timings["emit"], run.timings["simulate"]
        taken.append({"setup": t1 - t0, "run_device": t2 - t1, "emit": emit, "simulate": simulate,
                      "rest": t2 - t1 - emit - simulate, "total": t2 - t0})
        del sim, launches, run
    return sorted(taken, key=lambda phases: phases["total"])[calls // 2]


def profile_device(pes: int, kv_len: int, top: int = PROFILE_TOP) -> dict[str, Any]:
    """One device-side call under cProfile: its total (``device_run``'s cumulative time) and the kbwork functions
    with the largest cumulative time (``cumulative_s``, ``own_s``, ``calls``, ``share`` of the total), and the
    largest by own time."""
    import cProfile
    import pstats

    device_run(pes, kv_len)  # warm
    prof = cProfile.Profile()
    prof.enable()
    run = device_run(pes, kv_len)
    prof.disable()
    del run
    stats = pstats.Stats(prof, stream=io.StringIO())
    rows = []
    for (file, line, func), (_, calls, own, cum, _) in stats.stats.items():
        if "/kbwork/" not in file:
            continue
        where = file[file.rindex("/kbwork/") + 1:]
        rows.append({"function": f"{where}:{line}({func})", "calls": calls, "own_s": own, "cumulative_s": cum})
    total = max(r["cumulative_s"] for r in rows)  # device_run's, the outermost call
    for r in rows:
        r["share"] = r["cumulative_s"] / total if total else 0.0
    by_cum = sorted(rows, key=lambda r: -r["cumulative_s"])[:top]
    by_own = sorted(rows, key=lambda r: -r["own_s"])[:top]
    return {"total_s": total, "by_cumulative": by_cum, "by_own": by_own,
            "note": "under cProfile, which slows Python calls unevenly: read the shares, not the seconds"}


# --- row 3: against the code before the device work -------------------------------------------------------
#: Run in a fresh interpreter whose PYTHONPATH names one checkout: per variant and path, one untimed run, then
#: runs until there are at least k of them and ``min_s`` seconds of them; their best, median and count.
AB_SCRIPT = """
import gc, json, os, statistics, sys, time
root, kv, full_k, steady_k = os.path.realpath(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
min_s = float(sys.argv[6])
import kbwork
from kbwork import decode
if not os.path.realpath(kbwork.__file__).startswith(root + os.sep):
    raise SystemExit(f"kbwork was imported from {kbwork.__file__}, not from {root}")
def best(f, k):
    ts = []
    while len(ts) < k or sum(ts) < min_s:
        gc.collect()
        t = time.perf_counter(); f(); ts.append(time.perf_counter() - t)
    return min(ts), statistics.median(ts), len(ts)
out = {}
for v in sys.argv[5].split(","):
    decode.run(v, kv_len=kv, mode="timing", steady_state=False)
    out[v + " full"] = best(lambda: decode.run(v, kv_len=kv, mode="timing", steady_state=False), full_k)
    decode.run(v, kv_len=kv, mode="timing")
    out[v + " steady"] = best(lambda: decode.run(v, kv_len=kv, mode="timing"), steady_k)
print(json.dumps({"kbwork": kbwork.__file__, "seconds": {k: x[0] for k, x in out.items()},
                  "median": {k: x[1] for k, x in out.items()}, "runs": {k: x[2] for k, x in out.items()}}))
"""


def ab_once(checkout: Path, kv_len: int, full_runs: int, steady_runs: int,
            variants: tuple[str, ...] | None = None) -> dict[str, Any]:
    """One fresh interpreter on ``checkout`` (its PYTHONPATH, started in an empty directory so the current
    one shadows nothing): the best one-PE run of each variant (:data:`AB_VARIANTS`), full and steady, in
    seconds (``seconds``), over at least ``full_runs`` / ``steady_runs`` runs and :data:`AB_MIN_SECONDS` of
    them (their ``median`` and count, ``runs``, too)."""
    variants = AB_VARIANTS if variants is None else variants
    p = _child(checkout, [sys.executable, "-c", AB_SCRIPT, str(checkout), str(kv_len), str(full_runs),
                          str(steady_runs), ",".join(variants), repr(AB_MIN_SECONDS)], "the one-PE run")
    return json.loads(p.stdout.strip().splitlines()[-1])


def _child(checkout: Path, argv: list[str], what: str, **env: str) -> subprocess.CompletedProcess:
    """Run ``argv`` with ``checkout`` as its PYTHONPATH (and ``env``), in an empty directory so the current one
    shadows nothing; its output.

    Raises:
        RuntimeError: it failed, naming ``what``, the checkout, the status and its last line of output."""
    with tempfile.TemporaryDirectory(prefix="kbwork-child-") as cwd:
        p = subprocess.run(argv, env={**os.environ, "PYTHONPATH": str(checkout), **env}, cwd=cwd,
                           capture_output=True, text=True)
    if p.returncode:
        last = ((p.stderr or p.stdout).strip().splitlines() or ["(no output)"])[-1]
        raise RuntimeError(f"{what} on {checkout} failed (status {p.returncode}): {last}")
    return p


def old_checkout(stack: contextlib.ExitStack, before: Path | None) -> tuple[Path | None, str]:
    """The code before the device work: ``(checkout, where it came from)``, or ``(None, why there is none)``.
    ``before`` names a checkout (it must hold a kbwork package); None extracts commit :data:`AB_COMMIT`'s tree
    into a temporary directory that ``stack`` removes."""
    if before is not None:
        before = Path(before).resolve()
        if not (before / "kbwork" / "__init__.py").is_file():
            return None, f"{before} holds no kbwork package"
        return before, str(before)
    tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="kbwork-before-")))
    why = extract_commit(AB_COMMIT, tmp)
    if why is not None:
        return None, why
    return tmp, f"commit {AB_COMMIT}, extracted with git archive"


def extract_commit(commit: str, into: Path, repo: Path = ROOT) -> str | None:
    """Extract ``commit``'s tree into ``into`` with ``git archive``; ``None`` when done, else why it could not."""
    try:
        found = subprocess.run(["git", "-C", str(repo), "rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}"],
                               capture_output=True, text=True)
    except OSError as exc:
        return f"git is not available ({exc.strerror or exc})"
    if found.returncode:
        return f"commit {commit} is not in this clone ({repo})"
    tar = subprocess.run(["git", "-C", str(repo), "archive", "--format=tar", found.stdout.strip()],
                         capture_output=True)
    if tar.returncode:
        return f"git archive {commit} failed: {tar.stderr.decode(errors='replace').strip()}"
    with tarfile.open(fileobj=io.BytesIO(tar.stdout)) as t:
        t.extractall(into, filter="data")
    return None


def before_rows(before: Path | None = None, kv_len: int | None = None, passes: int | None = None,
                full_runs: int | None = None, steady_runs: int | None = None,
                show_progress: bool = True) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Row 3 (one row per variant and path) and what it ran on; no rows, and why, when the old code is missing."""
    from tqdm.auto import tqdm

    kv_len = AB_KV if kv_len is None else kv_len
    passes = AB_PASSES if passes is None else passes
    full_runs = AB_FULL_RUNS if full_runs is None else full_runs
    steady_runs = AB_STEADY_RUNS if steady_runs is None else steady_runs
    info: dict[str, Any] = {"commit": AB_COMMIT, "now": str(ROOT), "kv_len": kv_len, "passes": passes,
                            "full_runs": full_runs, "steady_runs": steady_runs}
    with contextlib.ExitStack() as stack:
        before, how = old_checkout(stack, before)
        if before is None:
            info["skipped"] = f"{how}: the row against the code before the device work is skipped"
            return [], info
        info["before"] = how
        sides = {"before": before, "now": ROOT}
        figures: dict[str, list[dict[str, float]]] = {"before": [], "now": []}
        medians: dict[str, list[dict[str, float]]] = {"before": [], "now": []}
        counts: dict[str, list[dict[str, int]]] = {"before": [], "now": []}
        loads = []
        for _ in tqdm(range(passes), desc="device: before vs now", disable=not show_progress):
            for side, checkout in sides.items():  # before, now, before, now, ...
                got = ab_once(checkout, kv_len, full_runs, steady_runs)
                figures[side].append(got["seconds"])
                medians[side].append(got["median"])
                counts[side].append(got["runs"])
                info[f"kbwork_{side}"] = got["kbwork"]
            loads.append(os.getloadavg()[0])
        info["load_after_each_pass"] = loads
    rows = []
    for key in figures["now"][0]:
        variant, path = key.split()
        num = [f[key] for f in figures["now"]]
        den = [f[key] for f in figures["before"]]
        full = path == "full"
        rows.append({"measure": "before", "variant": variant, "path": path,
                     "num_label": f"decode.run({variant!r}, kv_len={kv_len}, mode='timing'"
                                  f"{', steady_state=False' if full else ''}) on this checkout",
                     "den_label": f"the same on commit {AB_COMMIT} (before the device work)",
                     "kv_len": kv_len, "unit": "s",
                     "passes": {"num": num, "den": den, "ratio": [a / b for a, b in zip(num, den)],
                                "num_median": [f[key] for f in medians["now"]],
                                "den_median": [f[key] for f in medians["before"]],
                                "num_runs": [f[key] for f in counts["now"]],
                                "den_runs": [f[key] for f in counts["before"]]},
                     "num": min(num), "den": min(den)})
        rows[-1]["ratio"] = rows[-1]["num"] / rows[-1]["den"]
    return rows, info


# --- row 4: instructions under valgrind ---------------------------------------------------------------------
#: A fresh interpreter on one checkout: one run of every (variant, path) of row 3, then ``n`` more of the one
#: named (none for the baseline: what every count shares, the interpreter, the imports and the warm-up runs).
INSN_SCRIPT = """
import os, sys
root, kv, variants, case, n = os.path.realpath(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5])
import kbwork
from kbwork import decode
if not os.path.realpath(kbwork.__file__).startswith(root + os.sep):
    raise SystemExit(f"kbwork was imported from {kbwork.__file__}, not from {root}")
for v in variants.split(","):
    for path in ("full", "steady"):
        decode.run(v, kv_len=kv, mode="timing", steady_state=path == "steady")
if n:
    v, path = case.split()
    for _ in range(n):
        decode.run(v, kv_len=kv, mode="timing", steady_state=path == "steady")
"""
#: Row 4: the runs of a case beyond the baseline (the import of kbwork varies by about 10 M instructions from
#: one process to the next; a steady one-PE run is about 20 M, a full one about 100 M).
INSN_RUNS = 20


def valgrind_instructions(stderr: str) -> int:
    """The instruction count (``I refs``) in cachegrind's summary on ``stderr``.

    Raises:
        RuntimeError: the summary holds no count (valgrind failed or printed something else)."""
    import re

    found = re.search(r"I\s+refs:\s+([\d,]+)", stderr)
    if found is None:
        last = (stderr.strip().splitlines() or ["(no output)"])[-1]
        raise RuntimeError(f"valgrind printed no instruction count: {last}")
    return int(found.group(1).replace(",", ""))


def _instructions(checkout: Path, kv_len: int, case: str, n: int) -> int:
    p = _child(checkout, ["valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null",
                          sys.executable, "-c", INSN_SCRIPT, str(checkout), str(kv_len), ",".join(AB_VARIANTS),
                          case, str(n)], "the counted run", PYTHONHASHSEED="0")
    return valgrind_instructions(p.stderr)


def instruction_rows(before: Path | None = None, kv_len: int | None = None, runs: int | None = None,
                     show_progress: bool = True) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Row 4 (module docstring): per variant and path, instructions per one-PE run on this checkout and on the
    code before the device work, and their ratio; no rows, and why, without valgrind or the old code."""
    import shutil

    from tqdm.auto import tqdm

    kv_len = AB_KV if kv_len is None else kv_len
    runs = INSN_RUNS if runs is None else runs
    info: dict[str, Any] = {"commit": AB_COMMIT, "kv_len": kv_len, "runs": runs,
                            "how": f"valgrind --tool=cachegrind --cache-sim=no, PYTHONHASHSEED=0; per case (I(baseline "
                                   f"+ {runs} runs) - I(baseline)) / {runs}"}
    if shutil.which("valgrind") is None:
        info["skipped"] = "valgrind is not on the PATH: the instruction counts are skipped"
        return [], info
    with contextlib.ExitStack() as stack:
        before, how = old_checkout(stack, before)
        if before is None:
            info["skipped"] = f"{how}: the instruction counts are skipped"
            return [], info
        info["before"] = how
        cases = [f"{v} {path}" for v in AB_VARIANTS for path in ("full", "steady")]
        sides = {"now": ROOT, "before": before}
        per_run: dict[tuple[str, str], int] = {}
        with tqdm(total=len(sides) * (1 + len(cases)), desc="device: instructions",
                  disable=not show_progress) as bar:
            for side, checkout in sides.items():
                base = _instructions(checkout, kv_len, "none", 0)
                bar.update()
                for case in cases:
                    per_run[(side, case)] = (_instructions(checkout, kv_len, case, runs) - base) // runs
                    bar.update()
    rows = []
    for case in cases:
        v, path = case.split()
        num, den = per_run[("now", case)], per_run[("before", case)]
        rows.append({"measure": "instructions", "variant": v, "path": path, "kv_len": kv_len,
                     "unit": "instructions", "num": num, "den": den, "ratio": num / den})
    return rows, info


# --- the suite --------------------------------------------------------------------------------------
def run_suite(*, kv_len: int | None = None, device_pes: int | None = None, shared_pes: int | None = None,
              before: Path | None = None, ab_kv: int | None = None, ab_passes: int | None = None,
              min_seconds: float | None = None, passes: int | None = None,
              show_progress: bool = True, instructions: bool = False) -> dict[str, Any]:
    """Every row of the module docstring; ``result["rows"]`` holds one row per measure (and variant), and
    ``result["instructions"]`` row 4's (only with ``instructions=True``: it takes some minutes)."""
    from . import MIN_SECONDS, PASSES, WARMUP_RUNS
    from .loops import ratio_passes

    kv_len = KV if kv_len is None else kv_len
    device_pes = DEVICE_PES if device_pes is None else device_pes
    shared_pes = SHARED_PES if shared_pes is None else shared_pes
    min_seconds = MIN_SECONDS if min_seconds is None else min_seconds
    passes = PASSES if passes is None else passes
    shared = {**SHARED, "pes": shared_pes}
    load = [os.getloadavg()[0]]
    rows = ratio_passes([_device_case(device_pes, kv_len), _shared_case(shared_pes, kv_len, shared)], passes,
                        min_seconds, WARMUP_RUNS, "device", load, show_progress)
    rows[0]["breakdown"] = breakdown(device_pes, kv_len)
    rows[0]["profile"] = profile_device(device_pes, kv_len)
    ab, ab_info = before_rows(before, ab_kv, ab_passes, show_progress=show_progress)
    rows += ab
    load.append(os.getloadavg()[0])
    for row in rows:
        row["target"] = TARGETS[row["measure"]]
        row["met"] = bool(row["ratio"] <= row["target"])
    result = {"rows": rows, "before": ab_info, "passes": passes, "min_seconds": min_seconds,
              "warmup_runs": WARMUP_RUNS, "load_average_1min": load}
    if instructions:
        insn, insn_info = instruction_rows(before, ab_kv, show_progress=show_progress)
        result["instructions"] = {"rows": insn, **insn_info}
    return result


def checks_failed(result: dict[str, Any]) -> list[str]:
    """What the suite checks and found wrong (an empty list when all is well)."""
    bad = []
    for r in result["rows"]:
        if r["measure"] == "shared":
            if not r["steady_jointly"]:
                bad.append(("shared: the steady state was not proven jointly with the device on every PE: "
                            + "; ".join(r["steady_loops"])) if r["steady_loops"] else "shared: no loop went steady")
            if not r["op_log_equals_plain"]:
                bad.append("shared: the op_log differs from run_device(..., steady_state=False, reductions=False)'s")
    return bad


def _name(r: dict[str, Any]) -> str:
    if r["measure"] == "device":
        return f"{r['pes']} PEs x opt2 {r['kv_len']} (set-up incl.) vs one PE"
    if r["measure"] == "shared":
        return f"{r['pes']} PEs on 1 channel x opt2 {r['kv_len']} vs one PE"
    return f"one PE, {r['path']}, {r['kv_len']}: now vs {AB_COMMIT}"


def format_suite(result: dict[str, Any]) -> list[str]:
    """The table (measure, variant, both sides, now, per pass, target, met?), the breakdown and the checks."""
    head = (f"{'measure':<50}{'variant':<9}{'kbwork':>11}{'against':>11}{'now':>8}{'per pass':>12}{'target':>8}"
            f"  met?")
    lines = [head, "-" * len(head)]
    for r in result["rows"]:
        per = r["passes"]["ratio"]
        lines.append(f"{_name(r):<50}{r['variant']:<9}{_fmt(r['num']):>11}{_fmt(r['den']):>11}{r['ratio']:>7.2f}x"
                     f"{f'{min(per):.2f}-{max(per):.2f}':>12}{'<= ' + format(r['target'], 'g') + 'x':>8}  "
                     f"{'yes' if r['met'] else 'NO'}")
    over = [_name(r) for r in result["rows"] if any(x > r["target"] for x in r["passes"]["ratio"])]
    if over:
        lines.append("over the target in one pass or more: " + "; ".join(over))
    lines.append("now: each side's lowest pass figure, divided; per pass: the ratio within each pass")
    for r in result["rows"]:
        lines.append(f"{_name(r)}: per-pass ratios " + ", ".join(f"{x:.2f}" for x in r["passes"]["ratio"]))
        if r["measure"] == "device":
            b = r["breakdown"]
            lines.append(f"  device side, the median of {BREAKDOWN_CALLS} calls: set-up {_fmt(b['setup'])}, run_device "
                         f"{_fmt(b['run_device'])} (emit {_fmt(b['emit'])}, simulate {_fmt(b['simulate'])}, rest "
                         f"{_fmt(b['rest'])}); {r['reductions']}")
            prof = r["profile"]
            lines.append(f"  under cProfile ({_fmt(prof['total_s'])}), by cumulative time:")
            for f in prof["by_cumulative"][:10]:
                lines.append(f"    {f['share']:>5.0%} {f['cumulative_s'] * 1e3:>8.1f} ms {f['calls']:>6} calls  "
                             f"{f['function']}")
        if r["measure"] == "shared":
            lines.append(f"  steady state proven jointly on every PE: {'yes' if r['steady_jointly'] else 'NO'}; "
                         f"op_log equals the plain simulation's: {'yes' if r['op_log_equals_plain'] else 'NO'} "
                         f"({r['stages']} stages, {r['cycles']} cycles)")
    info = result["before"]
    if "skipped" in info:
        lines.append(f"before vs now: {info['skipped']}")
    else:
        lines.append(f"before vs now: {info['passes']} passes of one interpreter per side, alternating; before = "
                     f"{info['before']}")
    lines.append("load average (1 min) through the run: "
                 + ", ".join(f"{x:.2f}" for x in result["load_average_1min"]))
    insn = result.get("instructions")
    if insn is not None:
        if "skipped" in insn:
            lines.append(f"instructions: {insn['skipped']}")
        else:
            lines.append(f"instructions per one-PE run, now vs {AB_COMMIT} ({insn['how']}; a proxy, not the target):")
            for r in insn["rows"]:
                lines.append(f"  {r['variant']} {r['path']:<7} {r['num']:>14,} vs {r['den']:>14,}  {r['ratio']:.3f}x")
    return lines
