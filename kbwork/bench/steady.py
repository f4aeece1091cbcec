"""The steady-state suite: how much the exact steady state saves, and what a sweep costs where.

``kbwork bench --suite steady`` measures, in one run:

* each variant's timing-mode ``decode.run`` by the steady state against the
  full simulation (``steady_state=False``) from 4k to 1M tokens, checking that
  both give the same cycles;
* ``decode.compare`` (timing) at 1M tokens against 4k (the target: within 2x,
  flat in kv_len);
* a sweep of N points (default 10,000) serially, on local processes, and on a
  2-worker Dask ``LocalCluster`` on loopback (same DataFrame each way);
* cold start: ``import kbwork`` and the first ``compare``, each in a fresh
  interpreter.

A benchmark, not a test: it prints and saves figures and asserts nothing
about speed.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from typing import Any, Callable

DEFAULT_KV = (4096, 32768, 131072, 1048576)


def _median(fn: Callable[[], Any], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def steady_vs_full(kv_lens: tuple[int, ...] = DEFAULT_KV, variants: tuple[str, ...] = ("opt2", "opt3", "a1"),
                   repeats: int = 5) -> list[dict[str, Any]]:
    """Median seconds of a timing-mode run by the steady state and in full, per variant and kv_len."""
    from .. import decode

    rows = []
    for kv in kv_lens:
        for v in variants:
            fast = decode.run(v, kv_len=kv, mode="timing")
            full = decode.run(v, kv_len=kv, mode="timing", steady_state=False)
            if fast.cycles != full.cycles:  # the one thing this suite checks
                raise AssertionError(f"{v} at {kv}: steady state {fast.cycles} cycles, full {full.cycles}")
            t_fast = _median(lambda: decode.run(v, kv_len=kv, mode="timing"), repeats)
            t_full = _median(lambda: decode.run(v, kv_len=kv, mode="timing", steady_state=False),
                             repeats if kv <= 131072 else 2)
            rows.append({"variant": v, "kv_len": kv, "steady_s": t_fast, "full_s": t_full,
                         "speedup": t_full / t_fast, "path": fast.run.steady_state.path,
                         "period_tiles": fast.run.steady_state.period, "cycles": fast.cycles})
    return rows


def compare_flatness(kv_lens: tuple[int, int] = (4096, 1048576), repeats: int = 9) -> dict[str, Any]:
    """Median ``decode.compare`` (timing) at the smallest and largest kv_len, and their ratio."""
    from .. import decode

    out: dict[str, Any] = {}
    for kv in kv_lens:
        decode.compare(kv_len=kv, mode="timing")
        out[f"compare_{kv}_ms"] = _median(lambda: decode.compare(kv_len=kv, mode="timing"), repeats) * 1e3
    lo, hi = kv_lens
    out["ratio_largest_to_smallest"] = out[f"compare_{hi}_ms"] / out[f"compare_{lo}_ms"]
    return out


def sweep_points(n_points: int) -> dict[str, list]:
    """Sweep axes with about ``n_points`` points (FIXED x R x tile x kv_len)."""
    r = [0.0, 0.0625, 0.125, 0.25, 0.5]
    tiles = [64, 128]
    kv = [4096, 8192, 16384, 32768, 65536]
    per = len(r) * len(tiles) * len(kv)
    fixed = list(range(0, 4 * max(1, -(-n_points // per)), 4))  # FIXED 0, 4, 8, ... as many as it takes
    return dict(fixed_cycles=fixed, r_cycles_per_byte=r, tile=tiles, kv_len=kv)


def sweep_scaling(n_points: int = 10_000, dask: bool = True) -> dict[str, Any]:
    """Wall seconds of one sweep serially, on local processes and on a 2-worker Dask LocalCluster."""
    from .. import decode

    axes = sweep_points(n_points)
    out: dict[str, Any] = {"points": 1}
    for v in axes.values():
        out["points"] *= len(v)
    t0 = time.perf_counter()
    serial = decode.sweep(workers=1, progress=False, **axes)
    out["serial_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    local = decode.sweep(progress=False, **axes)
    out["local_processes_s"] = time.perf_counter() - t0
    out["local_equal"] = bool(local.equals(serial))
    if dask:
        import distributed

        with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                                      dashboard_address=None) as cluster, distributed.Client(cluster) as client:
            t0 = time.perf_counter()
            on_dask = decode.sweep(client=client, progress=False, **axes)
            out["dask_2_workers_s"] = time.perf_counter() - t0
        out["dask_equal"] = bool(on_dask.equals(serial))
    return out


def cold_start(repeats: int = 5) -> dict[str, float]:
    """Median seconds, each in a fresh interpreter, of ``import kbwork`` and of that plus a first compare."""
    def run(code: str) -> float:
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
            times.append(time.perf_counter() - t0)
        return statistics.median(times)

    bare = run("pass")
    return {"python_s": bare, "import_kbwork_s": run("import kbwork"),
            "first_compare_s": run("from kbwork import decode; decode.compare(mode='timing')"),
            "first_compare_data_s": run("from kbwork import decode; decode.compare()")}


def one_blas_thread() -> Any:
    """A context in which numpy's BLAS runs on one thread (``threadpoolctl``), or ``None`` when
    threadpoolctl is not installed (it is in the ``bench`` extra, not in ``test``)."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return None
    return threadpool_limits(limits=1)


def run_suite(n_points: int = 10_000, dask: bool = True, kv_lens: tuple[int, ...] = DEFAULT_KV) -> dict[str, Any]:
    """Every measurement of the module docstring, the float64 references on one BLAS thread where
    threadpoolctl is installed (``result["blas_one_thread"]`` says whether they were)."""
    import contextlib

    limit = one_blas_thread()
    with limit if limit is not None else contextlib.nullcontext():  # BLAS threads would fight the simulator
        return {"steady_vs_full": steady_vs_full(kv_lens), "compare": compare_flatness((kv_lens[0], kv_lens[-1])),
                "sweep": sweep_scaling(n_points, dask), "cold_start": cold_start(),
                "blas_one_thread": limit is not None}


def format_suite(result: dict[str, Any]) -> list[str]:
    """The figures as lines of text."""
    lines = [f"{'variant':<8}{'kv_len':>9}{'steady ms':>11}{'full ms':>10}{'x faster':>10}{'period':>8}"]
    for r in result["steady_vs_full"]:
        period = "-" if r["period_tiles"] is None else r["period_tiles"]  # None: too few tiles for a steady state
        lines.append(f"{r['variant']:<8}{r['kv_len']:>9}{r['steady_s'] * 1e3:>11.1f}{r['full_s'] * 1e3:>10.1f}"
                     f"{r['speedup']:>10.1f}{period:>8}")
    c = result["compare"]
    keys = [k for k in c if k.startswith("compare_")]
    lines.append("decode.compare (timing): " + ", ".join(f"{k[8:-3]} tokens {c[k]:.1f} ms" for k in keys)
                 + f"; largest / smallest = {c['ratio_largest_to_smallest']:.2f}")
    s = result["sweep"]
    line = (f"sweep of {s['points']} points: serial {s['serial_s']:.1f} s, local processes "
            f"{s['local_processes_s']:.1f} s")
    if "dask_2_workers_s" in s:
        line += f", Dask LocalCluster (2 workers) {s['dask_2_workers_s']:.1f} s"
    lines.append(line + f" (same frame: {s['local_equal'] and s.get('dask_equal', True)})")
    cs = result["cold_start"]
    lines.append(f"cold start: python {cs['python_s']:.2f} s, import kbwork {cs['import_kbwork_s']:.2f} s, "
                 f"first compare (timing) {cs['first_compare_s']:.2f} s, (data) {cs['first_compare_data_s']:.2f} s")
    if result.get("blas_one_thread") is False:
        lines.append("(numpy's BLAS threads were not capped: threadpoolctl is not installed)")
    return lines
