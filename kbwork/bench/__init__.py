"""The benchmark: how fast kbwork simulates, against what a researcher would otherwise use.

``python -m kbwork.bench`` (or ``kbwork bench``) runs GQA decode opt2 and
opt3 at kv lengths from 1k to 1M tokens (tile 128) in timing and data mode
and reports, per case: stages simulated, median wall time, stages per
second, op_log bytes per stage and time per tile. In the same run it replays
each timing-mode stage graph in SimPy (checking every start and end against
kbwork's), runs the bare heap floor on it, and times one vectorised numpy
attention for data mode. ``--suite steady`` measures the exact steady state (``bench/steady.py``);
``--suite loops`` measures the four targets of loops as data, each a ratio (``bench/loops.py``);
``--suite device`` a device run against one PE's and the one-PE run against the code before the device
work (``bench/device.py``); ``--suite model`` a model's decode step against one head's run and a sweep of
steps serially against Dask (``bench/model.py``);
``--suite gemm`` times the GEMM benches instead; ``--suite panel`` times a
slider move in the calibration panel, end to end in JupyterLab in headless Chromium
(:mod:`kbwork.bench.panel`).

Method (see ``benchmarks/README.md``): a case's cold first run is reported,
then it is warmed up; each figure is a median over at least ``MIN_SECONDS``
of runs; timing mode is measured in ``PASSES`` passes over the suite and each
figure, kbwork's and the references', is its lowest pass median.

This is a benchmark, not a test: it prints figures and asserts nothing about
speed. The only thing it checks is that SimPy and kbwork agree.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

from tqdm.auto import tqdm

from ..argtypes import positive_int

DEFAULT_KV = (1024, 4096, 32768, 131072, 1048576)
PANEL_KV = 32768
OUT_DIR = Path(__file__).resolve().parents[2] / "benchmarks" / "results"


def _median_time(fn: Callable[[], Any], repeats: int, min_seconds: float = 0.0,
                 max_repeats: int = 400) -> tuple[float, Any]:
    """Median wall time of ``fn()`` over at least ``repeats`` calls and ``min_seconds`` of calls.

    The previous call's result is dropped before the clock starts: freeing a
    large run is not part of simulating the next one.
    """
    times: list[float] = []
    last = None
    total = 0.0
    while len(times) < repeats or (total < min_seconds and len(times) < max_repeats):
        last = None
        t0 = time.perf_counter()
        last = fn()
        dt = time.perf_counter() - t0
        times.append(dt)
        total += dt
    return statistics.median(times), last


def _repeats(stages: int) -> int:
    return 7 if stages < 20_000 else 5 if stages < 100_000 else 3


#: Small cases run for at least this long (hundreds of runs at 1k tokens): on a shared machine a
#: median of a handful of millisecond runs moves by tens of percent between invocations.
MIN_SECONDS = 1.0
WARMUP_RUNS = 2


def decode_case(variant: str, kv_len: int, tile: int, mode: str, with_refs: bool) -> dict[str, Any]:
    """Time one decode case (and, in timing mode, its references)."""
    from .. import decode
    from .references import numpy_attention

    sim_times: list[float] = []

    def once():
        # the full simulation: this suite measures the simulator stage by stage (the steady state is
        # the steady suite's subject) and replays its whole stage graph in SimPy
        r = decode.run(variant, kv_len=kv_len, tile=tile, mode=mode, steady_state=False)
        _ = r.op_log
        sim_times.append(sum(r.run.timings.values()))
        return r

    # the first run of a case pays for what later runs reuse (plan templates, lowered ops);
    # report it, then warm up and time the steady state an interactive session sees
    t0 = time.perf_counter()
    probe = once()
    first = time.perf_counter() - t0
    stages = probe.run.n_stages
    del probe
    for _ in range(WARMUP_RUNS - 1):
        once()
    sim_times.clear()
    wall, r = _median_time(once, _repeats(stages) if mode == "timing" else 3,
                           MIN_SECONDS if mode == "timing" else 0.0)
    log = r.op_log
    row: dict[str, Any] = {
        "variant": variant, "kv_len": kv_len, "tile": tile, "mode": mode, "stages": stages,
        "commands": len(r.run.commands), "cycles": r.cycles, "wall_s": wall,
        # emit + schedule + simulate + op_log (median), without data mode's making of the inputs
        "sim_s": statistics.median(sim_times), "first_run_s": first,
        "op_log_bytes_per_stage": float(log.memory_usage(deep=True).sum()) / stages,
        **{f"{k}_s": v for k, v in r.run.timings.items()},  # the phases of the last run
    }
    if mode == "timing" and with_refs:
        refs = _time_references(r.run.program)
        row["simpy_match"] = refs.pop("simpy_match")
        row.update(refs)
    _ratios(row)
    if mode == "data":
        q, k, v = r.q, r.k, r.v
        t_np, _ = _median_time(lambda: numpy_attention(q, k, v), 5)
        row.update({"numpy_s": t_np, "time_vs_numpy": wall / t_np})
    return row


def compare_case(kv_len: int, budget_ms: float) -> dict[str, Any]:
    """Median wall time of ``decode.compare`` (both variants, timing mode)."""
    from .. import decode

    wall, _ = _median_time(lambda: decode.compare(kv_len=kv_len, mode="timing"), 7 if kv_len <= 32768 else 5)
    return {"kv_len": kv_len, "compare_ms": wall * 1e3, "budget_ms": budget_ms, "within_budget": wall * 1e3 <= budget_ms}


def gantt_case(kv_len: int = 131072, out: Path | None = None) -> dict[str, Any]:
    """Time drawing the Gantt of an opt3 run (one collection per engine) and saving it as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .. import decode, plots

    log = decode.run("opt3", kv_len=kv_len, mode="timing").op_log
    path = out or Path("/dev/null")

    def draw():
        import warnings

        with warnings.catch_warnings():  # the whole run on purpose: the time to draw every stage
            warnings.simplefilter("ignore", plots.DensityWarning)
            ax = plots.gantt(log, title=f"opt3, kv_len {kv_len}: {len(log)} stages")
        ax.figure.savefig(path, format="png", dpi=100)
        plt.close(ax.figure)

    wall, _ = _median_time(draw, 3)
    return {"kv_len": kv_len, "stages": len(log), "gantt_png_s": wall}


def _time_references(prog) -> dict[str, Any]:
    """Median times of kbwork's timeline alone, SimPy and the heap floor on ``prog``'s resolved graph.

    All three run under the same conditions (cyclic GC paused, as in a run),
    each with a warm-up call and the same time budget.
    """
    from ..device import simulate
    from ..sim import gc_paused
    from .references import heap_floor, resolved_graph, simpy_replay

    stages = len(prog.table)
    with gc_paused():
        g = resolved_graph(prog)
        simulate(prog)
        t_timeline, _ = _median_time(lambda: simulate(prog), 5, MIN_SECONDS)
        if stages <= 50_000:
            simpy_replay(g)
        t_simpy, (s, e) = _median_time(lambda: simpy_replay(g), 1 if stages > 50_000 else 3, MIN_SECONDS)
        heap_floor(g)
        t_floor, _ = _median_time(lambda: heap_floor(g), 5, MIN_SECONDS)
    return {"timeline_s": t_timeline, "simpy_s": t_simpy, "floor_s": t_floor,
            "simpy_match": bool(s == g.start and e == g.end)}


def _ratios(row: dict[str, Any]) -> None:
    stages, wall = row["stages"], row["wall_s"]
    row.update(stages_per_s=stages / wall, us_per_tile=wall / (row["kv_len"] // row["tile"]) * 1e6)
    if "simpy_s" in row:
        tl, simpy, floor = row["timeline_s"], row["simpy_s"], row["floor_s"]
        row.update(simpy_stages_per_s=stages / simpy,
                   speed_vs_simpy=simpy / wall, simulate_speed_vs_simpy=simpy / tl,
                   time_vs_floor=wall / floor, simulate_time_vs_floor=tl / floor)


def timing_pass(variant: str, kv_len: int, tile: int, with_refs: bool) -> dict[str, Any]:
    """One more (warm) measurement of a timing-mode case for a later pass over the suite."""
    from .. import decode

    def once():
        r = decode.run(variant, kv_len=kv_len, tile=tile, mode="timing", steady_state=False)
        _ = r.op_log
        return r

    r = once()
    stages = r.run.n_stages
    prog = r.run.program if with_refs else None
    del r
    out = {"wall_s": _median_time(once, _repeats(stages), MIN_SECONDS)[0]}
    if prog is not None:
        out.update(_time_references(prog))
    return out


#: Timing cases are measured in this many passes over the whole suite, and every time (kbwork's
#: and the references') is its lowest pass median: a slowdown of the (shared) machine lasting
#: seconds then spoils one pass, not the figure. Every pass median is kept (``passes``).
PASSES = 2


def run_decode_suite(kv_lens: list[int], modes: list[str], tile: int = 128, with_refs: bool = True,
                     data_max_kv: int = 1 << 20, show_progress: bool = True,
                     passes: int = PASSES) -> dict[str, Any]:
    cases = [(v, kv, m) for kv in kv_lens for m in modes for v in ("opt2", "opt3")
             if not (m == "data" and kv > data_max_kv)]
    rows = [decode_case(v, kv, tile, m, with_refs)
            for v, kv, m in tqdm(cases, desc="decode", disable=not show_progress)]
    timing = [r for r in rows if r["mode"] == "timing"]
    keys = ("wall_s", "timeline_s", "simpy_s", "floor_s")
    for r in timing:
        r["passes"] = {k: [r[k]] for k in keys if k in r}
    for p in range(1, passes):
        for r in tqdm(timing, desc=f"timing pass {p + 1}", disable=not show_progress):
            more = timing_pass(r["variant"], r["kv_len"], r["tile"], "simpy_s" in r)
            r["simpy_match"] = r.get("simpy_match", True) and more.pop("simpy_match", True)
            for k, v in more.items():
                r["passes"][k].append(v)
    for r in timing:  # every measured time, kbwork's and the references', is its lowest pass median
        r.update({k: min(v) for k, v in r["passes"].items()})
        _ratios(r)
    compares = [compare_case(kv, budget) for kv, budget in ((32768, 100.0), (131072, 400.0))]
    return {"rows": rows, "compare": compares, "gantt": gantt_case()}


def summarize(result: dict[str, Any]) -> list[str]:
    """Derived figures: data/timing ratio at 128k, time-per-tile spread, worst op_log bytes per stage."""
    rows = result["rows"]
    lines = []
    by = {(r["variant"], r["kv_len"], r["mode"]): r for r in rows}
    for v in ("opt2", "opt3"):
        t = [r["us_per_tile"] for r in rows if r["variant"] == v and r["mode"] == "timing"]
        if t:
            mid = statistics.median(t)
            lines.append(f"{v} timing: time per tile {min(t):.1f}-{max(t):.1f} us "
                         f"({(min(t) / mid - 1) * 100:+.0f}% / {(max(t) / mid - 1) * 100:+.0f}% around the median)")
        t_rows = sorted((r for r in rows if r["variant"] == v and r["mode"] == "timing"), key=lambda r: r["kv_len"])
        t_rows = list({(r["kv_len"], r["tile"]): r for r in t_rows}.values())  # one row per size
        if len(t_rows) >= 2:  # marginal cost of one more tile between consecutive sizes
            marg = [(b["wall_s"] - a["wall_s"]) / ((b["kv_len"] - a["kv_len"]) / a["tile"]) * 1e6
                    for a, b in zip(t_rows, t_rows[1:])]
            lines.append(f"{v} timing: marginal time per tile between consecutive sizes: "
                         + ", ".join(f"{m:.0f}" for m in marg) + " us")
        d, tm = by.get((v, 131072, "data")), by.get((v, 131072, "timing"))
        if d and tm:
            lines.append(f"{v} at 128k: data mode takes {d['sim_s'] / tm['sim_s']:.2f}x timing mode "
                         f"({d['wall_s'] / tm['wall_s']:.2f}x counting the making of the random inputs)")
    b = max(r["op_log_bytes_per_stage"] for r in rows)
    lines.append(f"op_log: at most {b:.0f} bytes per stage")
    for c in result["compare"]:
        lines.append(f"decode.compare at {c['kv_len']}: {c['compare_ms']:.0f} ms (budget {c['budget_ms']:.0f} ms)")
    g = result.get("gantt")
    if g:
        lines.append(f"Gantt of opt3 at {g['kv_len']} ({g['stages']} stages), drawn and saved as PNG: "
                     f"{g['gantt_png_s'] * 1e3:.0f} ms")
    return lines


def format_rows(rows: list[dict[str, Any]]) -> str:
    head = (f"{'variant':<7}{'kv_len':>9}{'mode':>7}{'stages':>9}{'wall ms':>10}{'stages/s':>11}{'us/tile':>9}"
            f"{'B/stage':>8}{'xSimPy':>8}{'sim xSimPy':>11}{'x floor':>8}{'sim x floor':>12}{'x numpy':>8}")
    out = [head, "-" * len(head)]
    for r in rows:
        def f(key, fmt):
            return format(r[key], fmt) if key in r else ""
        out.append(f"{r['variant']:<7}{r['kv_len']:>9}{r['mode']:>7}{r['stages']:>9}{r['wall_s'] * 1e3:>10.1f}"
                   f"{r['stages_per_s']:>11,.0f}{r['us_per_tile']:>9.1f}{r['op_log_bytes_per_stage']:>8.0f}"
                   f"{f('speed_vs_simpy', '.1f'):>8}{f('simulate_speed_vs_simpy', '.1f'):>11}"
                   f"{f('time_vs_floor', '.1f'):>8}{f('simulate_time_vs_floor', '.1f'):>12}{f('time_vs_numpy', '.0f'):>8}")
    return "\n".join(out)


def profile_case(variant: str = "opt3", kv_len: int = 32768, top: int = 25) -> str:
    """Phase timings and a cProfile summary (by own time) of one timing-mode decode run."""
    import cProfile
    import io
    import pstats

    from .. import decode

    for _ in range(3):  # warm: the validation cache and the allocator settle after the first run
        r = decode.run(variant, kv_len=kv_len, mode="timing", steady_state=False)
        _ = r.op_log
    phases = ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in r.run.timings.items())
    prof = cProfile.Profile()
    prof.enable()
    decode.run(variant, kv_len=kv_len, mode="timing", steady_state=False).op_log
    prof.disable()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).strip_dirs().sort_stats("tottime").print_stats(top)
    return (f"decode.run({variant!r}, kv_len={kv_len}, mode='timing'): {r.run.n_stages} stages, "
            f"{len(r.run.commands)} commands\nphases without the profiler: {phases}\n\n{buf.getvalue()}")


def int_list(text: str) -> list[int]:
    """An argparse type: comma-separated positive ints (``"1024,4096"``)."""
    parts = [x.strip() for x in text.split(",")]
    try:
        values = [int(x) for x in parts]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers, got {text!r}") from None
    bad = [v for v in values if v <= 0]
    if bad:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {bad[0]} in {text!r}")
    return values


def mode_list(text: str) -> list[str]:
    """An argparse type: comma-separated simulator modes (``"timing,data"``), duplicates dropped."""
    modes = [x.strip() for x in text.split(",")]
    bad = [m for m in modes if m not in ("timing", "data")]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown mode {bad[0]!r} in {text!r}; use timing, data or timing,data")
    return list(dict.fromkeys(modes))


def check_out_dir(out: Path) -> None:
    """Raise ValidationError unless ``out`` is, or can be created as, a writable directory."""
    from ..errors import ValidationError

    try:
        if out.exists() and not out.is_dir():
            raise ValidationError(f"--out {str(out)!r} is a file; --out names a directory for decode.csv and "
                                  f"decode.json.")
        existing = out
        while not existing.exists():  # created later: its nearest existing ancestor must allow that
            existing = existing.parent
    except OSError as exc:  # e.g. a name too long for the file system
        raise ValidationError(f"--out {str(out)[:80]!r}: {exc.strerror or exc}.") from None
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise ValidationError(f"--out {str(out)!r}: {str(existing)!r} is not a writable directory; "
                              f"pick a directory you can write to.")


#: The tile every decode case of the suite uses; --kv-lens must be multiples of it.
TILE = 128


def main(argv: list[str] | None = None) -> int:
    """Run ``kbwork bench``.

    Returns:
        0, or 1 when SimPy and kbwork disagree on a case, or 2 for a bad
        argument or a failed write (with one ``kbwork: error:`` line).
        Every argument, and the ``--out`` directory, is checked before
        anything is measured.

    Raises:
        SystemExit: from argparse for a malformed argument (status 2).
    """
    from ..cli import ArgumentParser
    from ..errors import KbworkError

    p = ArgumentParser(prog="kbwork bench", description=__doc__.splitlines()[0])
    p.add_argument("--suite", choices=["decode", "gemm", "panel", "steady", "loops", "device", "model"],
                   default="decode",
                   help="what to time: decode (default; opt2 and opt3 at each --kv-lens, timing and data mode, "
                        "against SimPy, the heap floor and numpy), gemm (the GEMM benches at each --scales), "
                        "panel (a calibration-panel slider move in JupyterLab in headless Chromium), steady "
                        "(the exact steady state against the full run, a sweep serially, on processes and on Dask, "
                        "cold start), loops (four ratios, each side measured interleaved in one run: the steady "
                        "state at 16M vs 4k tokens, the full run vs a bare heap loop, data mode vs a numpy "
                        "flash-decode, a data-mode compare's peak memory vs its float32 K and V; fixed sizes), "
                        "device (ratios, each side measured interleaved: 96 PEs of ahbm-device-v1 vs one PE's run, "
                        "4 PEs sharing a channel vs one PE's run, the one-PE run vs the code before the device "
                        "work), model (ratios: a Llama-3-70B decode step at batch 64 vs one head's run, uniform "
                        "and mixed contexts; a 200-point model sweep serially vs a 2-worker Dask cluster; and the "
                        "interactive step at batch 16)")
    p.add_argument("--kv-lens", type=int_list, default=None,
                   help=f"kv lengths, multiples of {TILE} (comma-separated; default "
                        f"{','.join(map(str, DEFAULT_KV))}, and {PANEL_KV} for the panel)")
    p.add_argument("--modes", type=mode_list, default=["timing", "data"],
                   help="comma-separated modes (default timing,data)")
    p.add_argument("--no-refs", action="store_true", help="skip the SimPy replay and the heap floor")
    p.add_argument("--out", type=Path, default=OUT_DIR,
                   help="directory for the CSV/JSON (default: benchmarks/results in the kbwork checkout)")
    p.add_argument("--scales", type=int_list, default=[1, 2, 4, 8, 12],
                   help="GEMM suite: size multipliers (default 1,2,4,8,12)")
    p.add_argument("--repeats", type=positive_int, default=3, help="GEMM suite: runs per case (default 3)")
    p.add_argument("--moves", type=positive_int, default=9, help="panel suite: timed moves per pass (default 9)")
    p.add_argument("--sweep-points", type=positive_int, default=10_000,
                   help="steady suite: points of the sweep timed serially, on processes and on Dask (default 10000)")
    p.add_argument("--no-dask", action="store_true",
                   help="steady and model suites: skip the Dask LocalCluster sweep")
    p.add_argument("--instructions", action="store_true",
                   help="device suite: also count the one-PE runs' machine instructions, now and before the device "
                        "work, under valgrind (deterministic where seconds are not; some minutes more)")
    p.add_argument("--before", type=Path, default=None, metavar="DIR",
                   help="device suite: a checkout of the code before the device work to measure the one-PE run "
                        "against (default: its commit extracted from this clone with git archive)")
    p.add_argument("--profile", type=positive_int, metavar="KV_LEN",
                   help=f"instead: print phase timings and a cProfile summary of one opt3 run at KV_LEN "
                        f"(a multiple of {TILE})")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar on stderr")
    args = p.parse_args(argv)
    if args.suite == "loops" and args.kv_lens is not None:
        p.error("--kv-lens does not apply to --suite loops: its sizes are fixed (16M and 4k, 32k, 256k tokens)")
    if args.suite in ("device", "model") and args.kv_lens is not None:
        p.error(f"--kv-lens does not apply to --suite {args.suite}: its sizes are fixed (32k tokens per task)")
    if args.before is not None and args.suite != "device":
        p.error("--before applies to --suite device only")
    if args.instructions and args.suite != "device":
        p.error("--instructions applies to --suite device only")
    if args.before is not None and not (args.before / "kbwork" / "__init__.py").is_file():
        from .device import AB_COMMIT

        p.error(f"--before {args.before}: no kbwork package there (no {args.before / 'kbwork' / '__init__.py'}); "
                f"give a checkout of the code before the device work, e.g. one made with git worktree add DIR "
                f"{AB_COMMIT}")
    if args.kv_lens is None:
        from .steady import DEFAULT_KV as STEADY_KV

        args.kv_lens = ([PANEL_KV] if args.suite == "panel" else list(STEADY_KV) if args.suite == "steady"
                        else list(DEFAULT_KV))
    from .. import decode

    repeated = sorted({kv for kv in args.kv_lens if args.kv_lens.count(kv) > 1})
    if repeated:  # the summary divides by the step between consecutive lengths
        args.kv_lens = list(dict.fromkeys(args.kv_lens))
        print(f"kbwork bench: note: --kv-lens lists {', '.join(map(str, repeated))} more than once; each length "
              f"is measured once", file=sys.stderr)
    for kv in ([args.profile] if args.profile else args.kv_lens if args.suite in ("decode", "panel", "steady")
               else []):
        try:
            decode._check_sizes(where="--profile" if args.profile else "--kv-lens", kv_len=kv, group=8,
                                head_dim=128, tile=TILE)
        except KbworkError as exc:
            p.error(str(exc))
    try:
        if args.profile:
            print(profile_case("opt3", args.profile))
            return 0
        if args.suite == "gemm":
            from .gemm import main as gemm_main

            return gemm_main(["--scales", ",".join(map(str, args.scales)), "--modes", ",".join(args.modes),
                              "--repeats", str(args.repeats)] + (["--quiet"] if args.quiet else []))
        check_out_dir(args.out)
        if args.suite == "panel":
            from .panel import main as panel_main

            return panel_main(args.kv_lens, args.moves, PASSES, args.out)
        if args.suite == "steady":
            return _steady_suite(args)
        if args.suite == "loops":
            return _loops_suite(args)
        if args.suite in ("device", "model"):
            return _ratio_suite(args)
        if not args.no_refs:
            try:
                import simpy  # noqa: F401
            except ImportError:
                print("kbwork bench: the SimPy reference needs simpy (pip install -e '.[bench]'), or pass --no-refs",
                      file=sys.stderr)
                return 2
        return _decode_suite(args)
    except KbworkError as exc:
        print(f"kbwork: error: {exc}", file=sys.stderr)
        return 2


def _steady_suite(args: argparse.Namespace) -> int:
    from .. import atomic
    from .steady import format_suite, run_suite

    if not args.no_dask:
        try:
            import distributed  # noqa: F401
        except ImportError:
            print("kbwork bench: the Dask sweep needs dask[distributed] (pip install -e '.[bench]'), or pass "
                  "--no-dask", file=sys.stderr)
            return 2
    try:
        import threadpoolctl  # noqa: F401
    except ImportError:
        print("kbwork bench: note: threadpoolctl is not installed (pip install -e '.[bench]'), so the float64 "
              "references run on as many BLAS threads as numpy starts, competing with the simulator for the "
              "cores; the figures are measured anyway", file=sys.stderr)
    result = run_suite(args.sweep_points, dask=not args.no_dask, kv_lens=tuple(args.kv_lens))
    result["machine"] = {"python": platform.python_version(), "platform": platform.platform(),
                         "processor": platform.processor(), "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    for line in format_suite(result):
        print(line)
    try:
        args.out.mkdir(parents=True, exist_ok=True)
        atomic.write_text(args.out / "steady.json", json.dumps(result, indent=1, default=float))
    except OSError as exc:
        print(f"kbwork: error: could not write {exc.filename!r}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    print(f"\nwrote {args.out / 'steady.json'}", file=sys.stderr)
    return 0


def _loops_suite(args: argparse.Namespace) -> int:
    from .loops import checks_failed, format_suite, run_suite

    try:
        import threadpoolctl  # noqa: F401
    except ImportError:
        print("kbwork bench: note: threadpoolctl is not installed (pip install -e '.[bench]'), so numpy's BLAS "
              "runs on as many threads as it starts in the data measure, competing with the simulator for the "
              "cores; the figures are measured anyway", file=sys.stderr)
    return _report(args, "loops.json", run_suite(show_progress=not args.quiet), format_suite, checks_failed)


def _ratio_suite(args: argparse.Namespace) -> int:
    """``--suite device`` or ``--suite model``: run it, print its table, write ``<suite>.json``."""
    if args.suite == "device":
        from .device import checks_failed, format_suite, run_suite

        result = run_suite(before=args.before, instructions=args.instructions, show_progress=not args.quiet)
    else:
        from .model import checks_failed, format_suite, run_suite

        if args.no_dask:
            print("kbwork bench: note: --no-dask: the sweep row is skipped", file=sys.stderr)
        result = run_suite(dask=not args.no_dask, show_progress=not args.quiet)
    return _report(args, f"{args.suite}.json", result, format_suite, checks_failed)


def _report(args: argparse.Namespace, name: str, result: dict[str, Any], format_suite: Callable,
            checks_failed: Callable) -> int:
    """Print a suite's table and failed checks, write ``result`` (with the machine) to ``args.out / name``.

    Returns:
        The exit status: 0, 1 when a check failed, 2 when the file could not be written.
    """
    from .. import atomic

    result["machine"] = _machine()
    for line in format_suite(result):
        print(line)
    bad = checks_failed(result)
    for line in bad:
        print(f"CHECK FAILED: {line}", file=sys.stderr)
    try:
        args.out.mkdir(parents=True, exist_ok=True)
        atomic.write_text(args.out / name, json.dumps(result, indent=1, default=float))
    except OSError as exc:
        print(f"kbwork: error: could not write {exc.filename!r}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    print(f"\nwrote {args.out / name}", file=sys.stderr)
    return 1 if bad else 0


def _machine() -> dict[str, str]:
    import numpy
    import pandas

    return {"python": platform.python_version(), "numpy": numpy.__version__, "pandas": pandas.__version__,
            "platform": platform.platform(), "processor": platform.processor(), "cpus": str(os.cpu_count()),
            "date": time.strftime("%Y-%m-%d %H:%M:%S")}


def _decode_suite(args: argparse.Namespace) -> int:
    from .. import atomic

    result = run_decode_suite(args.kv_lens, args.modes, with_refs=not args.no_refs, show_progress=not args.quiet)
    result["machine"] = {"python": platform.python_version(), "platform": platform.platform(),
                         "processor": platform.processor(), "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    print(format_rows(result["rows"]))
    print()
    for line in summarize(result):
        print(line)
    bad = [r for r in result["rows"] if r.get("simpy_match") is False]
    for r in bad:
        print(f"MISMATCH: SimPy and kbwork disagree on {r['variant']} kv_len {r['kv_len']}", file=sys.stderr)
    import pandas as pd

    try:
        args.out.mkdir(parents=True, exist_ok=True)
        atomic.write_text(args.out / "decode.json", json.dumps(result, indent=1, default=float))
        atomic.write_text(args.out / "decode.csv", pd.DataFrame(result["rows"]).to_csv(index=False,
                                                                                        lineterminator="\n"))
    except OSError as exc:
        print(f"kbwork: error: could not write {exc.filename!r}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    print(f"\nwrote {args.out / 'decode.csv'} and {args.out / 'decode.json'}", file=sys.stderr)
    return 1 if bad else 0
