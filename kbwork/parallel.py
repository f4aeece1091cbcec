"""Run many independent simulations: in this process, on local processes, or on a Dask cluster.

:func:`map_tasks` calls a module-level function on every task and returns the
results in task order, whichever finished first, so a sweep's DataFrame is the
same however it ran. Tasks go out in chunks (a few per worker), each chunk a
single call on the worker, so the per-task overhead stays small next to a
simulation. Progress is a ``tqdm.auto`` bar: a widget in Jupyter, a line on
stderr elsewhere.

Where it runs:

* ``client=None, workers=None``: this machine's cores, in processes, once
  there are enough tasks to be worth starting them (:data:`MIN_TASKS_FOR_PROCESSES`);
  fewer run here, in order. Processes are forked where the platform can (Linux);
  elsewhere they are spawned, and a script must then guard its entry point
  with ``if __name__ == "__main__":``.
* ``workers=1``: here, in order. ``workers=k``: k local processes.
* ``client=``: a ``distributed.Client``, or a scheduler address such as
  ``"tcp://10.0.0.5:8786"`` (Dask's ``distributed`` package: ``pip install -e
  ".[dask]"``). The workers must be able to import kbwork.
"""

from __future__ import annotations

import math
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Any, Callable, Sequence

from .errors import ValidationError

#: Fewer tasks than this run in this process even when processes are allowed: starting a
#: process pool costs about as much as a dozen small simulations.
MIN_TASKS_FOR_PROCESSES = 16
#: Chunks per worker: enough to balance uneven tasks, few enough to keep scheduling cheap.
CHUNKS_PER_WORKER = 8


def _run_chunk(fn: Callable[[Any], Any], chunk: Sequence[Any]) -> list[Any]:
    return [fn(task) for task in chunk]


def _client(client: Any) -> Any:
    """A ``distributed.Client`` for ``client`` (a Client, or a scheduler address to connect to)."""
    try:
        import distributed
    except ImportError:
        raise ValidationError("a Dask client was given but Dask's distributed package is not installed; "
                              "pip install -e '.[dask]' (or pass client=None to run locally).") from None
    if isinstance(client, distributed.Client):
        return client
    if isinstance(client, str):
        try:
            return distributed.Client(client, timeout="10s")
        except (OSError, TimeoutError) as exc:
            raise ValidationError(f"cannot reach the Dask scheduler at {client!r} ({exc}); start one "
                                  f"(dask scheduler) or pass client=None to run locally.") from None
    raise ValidationError(f"client must be a distributed.Client or a scheduler address string, got {client!r}.")


def _chunks(n_tasks: int, n_workers: int) -> list[range]:
    size = max(1, math.ceil(n_tasks / (n_workers * CHUNKS_PER_WORKER)))
    return [range(i, min(n_tasks, i + size)) for i in range(0, n_tasks, size)]


def map_tasks(fn: Callable[[Any], Any], tasks: Sequence[Any], *, client: Any = None, workers: int | None = None,
              progress: bool = True, desc: str = "", unit: str = "task",
              on_result: Callable[[int, Any], None] | None = None) -> list[Any]:
    """``[fn(t) for t in tasks]``, run where the module docstring says, in task order.

    Args:
        fn: a module-level function (it is pickled to other processes by name).
        tasks: picklable arguments, one call each.
        client: a ``distributed.Client`` or scheduler address, or ``None``.
        workers: local processes (``1``: this process), or ``None`` for the default.
        progress: show a ``tqdm.auto`` bar.
        desc, unit: the bar's label and unit.
        on_result: called as ``on_result(i, result)`` as each task finishes
            (completion order), e.g. to save results incrementally.

    Returns:
        The results, ``results[i] == fn(tasks[i])``.

    Raises:
        ValidationError: a bad ``client`` or ``workers``.
        Whatever ``fn`` raises, for the first task that fails.
    """
    from tqdm.auto import tqdm

    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise ValidationError(f"workers must be a positive int (1 runs in this process), got {workers!r}.")
    n = len(tasks)
    results: list[Any] = [None] * n

    def done(i: int, result: Any) -> None:
        results[i] = result
        if on_result is not None:
            on_result(i, result)

    def bar() -> Any:
        return tqdm(total=n, desc=desc or None, unit=unit, disable=not progress, dynamic_ncols=True)

    if client is not None:
        dask_client = _client(client)
        try:
            with bar() as b:
                _on_dask(dask_client, fn, tasks, done, b)
        finally:
            if dask_client is not client:  # connected here from an address: ours to close
                dask_client.close()
        return results
    cpus = os.cpu_count() or 1
    if workers is None:
        workers = cpus if n >= MIN_TASKS_FOR_PROCESSES and cpus > 1 else 1
    if workers == 1 or n <= 1:
        with bar() as b:
            for i, task in enumerate(tasks):
                done(i, fn(task))
                b.update()
        return results
    workers = min(workers, n)
    with ProcessPoolExecutor(max_workers=workers, mp_context=_context()) as pool:
        # the workers start at the first submit, before the bar (and its monitor thread) exist
        futures = {pool.submit(_run_chunk, fn, [tasks[i] for i in chunk]): chunk for chunk in _chunks(n, workers)}
        with bar() as b:
            for fut in as_completed(futures):
                for i, result in zip(futures[fut], fut.result()):
                    done(i, result)
                b.update(len(futures[fut]))
    return results


def _context() -> Any:
    """fork where there is one: children start at once and never re-import the caller's script (a script
    without an ``if __name__ == "__main__"`` guard would otherwise run again in every worker)."""
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("fork" if "fork" in methods else "spawn")


def _on_dask(client: Any, fn: Callable[[Any], Any], tasks: Sequence[Any], done: Callable[[int, Any], None],
             bar: Any) -> None:
    import distributed

    n_workers = max(1, sum(w.get("nthreads", 1) for w in client.scheduler_info().get("workers", {}).values()))
    chunks = _chunks(len(tasks), n_workers)
    futures = client.map(_run_chunk, [fn] * len(chunks), [[tasks[i] for i in c] for c in chunks], pure=False)
    where = {f.key: c for f, c in zip(futures, chunks)}
    for fut in distributed.as_completed(futures):
        chunk = where[fut.key]
        for i, result in zip(chunk, fut.result()):
            done(i, result)
        bar.update(len(chunk))
