"""The GEMM suite: stages simulated per second on the GEMM benches, in timing and data mode.

Run ``kbwork bench --suite gemm``. Each case is timed by its run's phases
(``Run.timings``: emit, schedule, simulate, op_log; inputs and numpy
references excluded), repeated, and the median reported. This is a benchmark, not a test: it
asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any, Callable

from ..sim import Simulator


def _measure(make: Callable[[Simulator], Any], mode: str, repeats: int) -> tuple[int, float]:
    times, stages = [], 0
    for _ in range(repeats):
        res = make(Simulator(mode=mode))
        run = getattr(res, "run", res)
        _ = run.op_log
        stages = run.n_stages
        times.append(sum(run.timings.values()))  # emit, schedule, simulate, op_log
    return stages, statistics.median(times)


def gemm_cases(scales: list[int]) -> list[tuple[str, int, Callable[[Simulator], Any]]]:
    from ..kernels.gemm import BENCHES

    cases = []
    for name in ("gemm_hbm", "gemm_pinned_a", "gemm_epilogues"):
        for s in scales:
            cases.append((name, s, lambda sim, fn=BENCHES[name], s=s: fn(sim, scale=s)))
    return cases


def run_benchmark(scales: list[int], modes: list[str], repeats: int, progress: bool = True) -> list[dict]:
    """Time every case and return one dict per (case, mode)."""
    rows = []
    cases = gemm_cases(scales)
    total = len(cases) * len(modes)
    done = 0
    for name, scale, make in cases:
        for mode in modes:
            if mode == "data" and scale > 4:
                continue  # data mode at the largest sizes costs minutes of numpy for no new information
            stages, secs = _measure(make, mode, repeats)
            rows.append({"bench": name, "scale": scale, "mode": mode, "stages": stages,
                         "seconds": round(secs, 6), "stages_per_s": round(stages / secs)})
            done += 1
            if progress:
                print(f"\r[{done}/{total}] {name} x{scale} {mode}: {stages} stages, "
                      f"{stages / secs:,.0f} stages/s      ", end="", file=sys.stderr, flush=True)
    if progress:
        print(file=sys.stderr)
    return rows


def format_table(rows: list[dict]) -> str:
    head = f"{'bench':<16}{'scale':>6}{'mode':>8}{'stages':>10}{'median s':>11}{'stages/s':>12}"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['bench']:<16}{r['scale']:>6}{r['mode']:>8}{r['stages']:>10}{r['seconds']:>11.4f}"
                     f"{r['stages_per_s']:>12,}")
    return "\n".join(lines)


#: The largest size multiplier: a GEMM bench grows as scale**3 stages (scale 32 is ~600k stages).
MAX_SCALE = 32


def main(argv: list[str] | None = None) -> int:
    """Run ``kbwork bench --suite gemm``.

    Returns:
        0, or 2 for a failed write of ``--json``/``--csv`` (one error line).
        Every argument and output path is checked before anything is timed.

    Raises:
        SystemExit: from argparse for a bad argument (status 2).
    """
    from .. import atomic
    from ..errors import KbworkError
    from . import int_list, mode_list, positive_int

    p = argparse.ArgumentParser(prog="kbwork bench --suite gemm", description=__doc__.splitlines()[0])
    p.add_argument("--scales", type=int_list, default=[1, 2, 4, 8, 12],
                   help=f"comma-separated size multipliers, at most {MAX_SCALE} (default 1,2,4,8,12)")
    p.add_argument("--modes", type=mode_list, default=["timing", "data"],
                   help="comma-separated modes (default timing,data)")
    p.add_argument("--repeats", type=positive_int, default=3,
                   help="runs per case; the median is reported (default 3)")
    p.add_argument("--json", type=Path, help="also write the rows as JSON to this .json file")
    p.add_argument("--csv", type=Path, help="also write the rows as CSV to this .csv file")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress line on stderr")
    args = p.parse_args(argv)
    big = [s for s in args.scales if s > MAX_SCALE]
    if big:
        p.error(f"--scales: {big[0]} is too large; at most {MAX_SCALE} (a GEMM bench grows as scale**3 stages)")
    for flag, path, suffix in (("--json", args.json, ".json"), ("--csv", args.csv, ".csv")):
        if path is not None:
            try:
                atomic.check_output_path(path, suffix=suffix, what=flag)
            except KbworkError as exc:
                p.error(str(exc))
    rows = run_benchmark(args.scales, args.modes, args.repeats, progress=not args.quiet)
    print(format_table(rows))
    try:
        if args.json:
            atomic.write_text(args.json, json.dumps(rows, indent=1))
        if args.csv:
            import pandas as pd

            atomic.write_text(args.csv, pd.DataFrame(rows).to_csv(index=False, lineterminator="\n"))
    except OSError as exc:
        print(f"kbwork: error: could not write {exc.filename!r}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
