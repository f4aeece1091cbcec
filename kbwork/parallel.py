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

A task that raises on another process raises here the same error class with
the same message (its remote traceback added as a note), after the tasks that
finished before it have been handed to ``on_result``. Exceptions never cross
a process boundary as pickled objects: the worker sends a plain description
(class, message, simple arguments) and this process rebuilds the error. Dask
pickles exceptions with ``tblib``, which cannot rebuild every class (a
``MemoryError`` subclass such as :class:`~kbwork.errors.TcmOverflowError`),
and once ``distributed`` is imported the same happens to local process pools,
leaving them broken for the next call.
"""

from __future__ import annotations

import builtins
import contextlib
import importlib
import math
import multiprocessing
import os
import traceback
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Any, Callable, Iterator, NamedTuple, Sequence

from .errors import KbworkError, ValidationError

#: Fewer tasks than this run in this process even when processes are allowed: starting a
#: process pool costs about as much as a dozen small simulations.
MIN_TASKS_FOR_PROCESSES = 16
#: Chunks per worker: enough to balance uneven tasks, few enough to keep scheduling cheap.
CHUNKS_PER_WORKER = 8


class RemoteError(KbworkError, RuntimeError):
    """A task failed on another process with an error that cannot be rebuilt here (its class is not
    importable, or does not take its own arguments back); the message names the class."""


class _Failure(NamedTuple):
    """What a worker sends back instead of an exception: plain data that pickles anywhere."""

    position: int        # of the failed task in its chunk
    module: str
    qualname: str
    message: str
    args: tuple | None   # the exception's args when they are plain values, else None
    traceback: str


_PLAIN = (str, bytes, int, float, bool, type(None))


def _describe(position: int, exc: Exception) -> _Failure:
    cls = type(exc)
    args = tuple(exc.args) if all(isinstance(a, _PLAIN) for a in exc.args) else None
    return _Failure(position, cls.__module__, cls.__qualname__, str(exc), args,
                    "".join(traceback.format_exception(exc)))


def _run_chunk(fn: Callable[[Any], Any], chunk: Sequence[Any]) -> tuple[list[Any], _Failure | None]:
    """The results of ``fn`` on the chunk's tasks, up to the first that raises, and that failure (or None)."""
    out = []
    for position, task in enumerate(chunk):
        try:
            out.append(fn(task))
        except Exception as exc:  # noqa: BLE001 - sent back as data, re-raised in the caller
            return out, _describe(position, exc)
    return out, None


def _error_class(module: str, qualname: str) -> type | None:
    """The exception class named by ``module`` and ``qualname``, if this process can import it."""
    try:
        obj: Any = builtins if module == "builtins" else importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except Exception:  # noqa: BLE001 - any failure to find it means: not rebuildable
        return None
    return obj if isinstance(obj, type) and issubclass(obj, Exception) else None


def _rebuild(failure: _Failure, task: int, n_tasks: int) -> Exception:
    """The worker's error as an exception of the same class and message, raised in this process."""
    cls = _error_class(failure.module, failure.qualname)
    exc: Exception | None = None
    if cls is not None:
        for args in ((failure.args,) if failure.args is not None else ()) + ((failure.message,),):
            try:
                candidate = cls(*args)
            except Exception:  # noqa: BLE001 - a constructor that wants other arguments
                continue
            if str(candidate) == failure.message:
                exc = candidate
                break
    if exc is None:
        exc = RemoteError(f"{failure.qualname}: {failure.message}")
    exc.add_note(f"(task {task + 1} of {n_tasks}, raised on a worker process; its traceback there:)\n"
                 + failure.traceback.rstrip())
    return exc


def _check_address(address: str) -> None:
    """Refuse a scheduler address that cannot name one (before Dask tries, and times out, to connect)."""
    from distributed.comm import parse_address
    from distributed.comm.addressing import get_address_host_port

    try:
        scheme, _ = parse_address(address)
        if scheme in ("tcp", "tls"):
            get_address_host_port(address)
    except (ValueError, TypeError) as exc:
        raise ValidationError(f"client={address!r} is not a Dask scheduler address ({exc}); give one such as "
                              f"'tcp://10.0.0.5:8786' (what `dask scheduler` prints), a distributed.Client, "
                              f"or client=None to run locally.") from None


def _client(client: Any) -> Any:
    """A ``distributed.Client`` for ``client`` (a Client, or a scheduler address to connect to).

    Raises:
        ValidationError: Dask is not installed, the address is malformed or unreachable, or ``client`` is
            neither a Client nor a string.
    """
    if not isinstance(client, str) and type(client).__name__ != "Client":
        raise ValidationError(f"client must be a distributed.Client or a scheduler address string, "
                              f"got {client!r}.")
    try:
        import distributed
    except ImportError:
        raise ValidationError("a Dask client was given but Dask's distributed package is not installed; "
                              "pip install -e '.[dask]' (or pass client=None to run locally).") from None
    if isinstance(client, distributed.Client):
        return client
    if isinstance(client, str):
        _check_address(client)
        try:
            return distributed.Client(client, timeout="10s")
        except (OSError, TimeoutError, ValueError) as exc:
            raise ValidationError(f"cannot reach the Dask scheduler at {client!r} ({exc}); start one "
                                  f"(dask scheduler) or pass client=None to run locally.") from None
    raise ValidationError(f"client must be a distributed.Client or a scheduler address string, got {client!r}.")


@contextlib.contextmanager
def connected(client: Any) -> Iterator[Any]:
    """``client`` as a ``distributed.Client`` (``None`` stays ``None``) for the ``with`` block; a client
    connected here from an address is closed at its end.

    Raises:
        ValidationError: as :func:`_client`, on entering.
    """
    if client is None:
        yield None
        return
    dask_client = _client(client)
    try:
        yield dask_client
    finally:
        if dask_client is not client:
            dask_client.close()


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
        Whatever ``fn`` raises, for the first task that fails (seen first, when tasks run in parallel):
            the same class and message wherever the task ran (see the module docstring), or a
            :class:`RemoteError` naming the class when this process cannot rebuild it.
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
        with connected(client) as dask_client, bar() as b:
            _on_dask(dask_client, fn, tasks, done, b)
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
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=_context())
    try:
        # the workers start at the first submit, before the bar (and its monitor thread) exist
        futures = {pool.submit(_run_chunk, fn, [tasks[i] for i in chunk]): chunk for chunk in _chunks(n, workers)}
        first: Exception | None = None
        with bar() as b:
            for fut in as_completed(futures):
                if fut.cancelled():
                    continue
                failed = _collect(futures[fut], fut.result(), done, n)
                b.update(len(futures[fut]))
                if failed is not None and first is None:
                    # the chunks not started yet are dropped; those running finish and are handed on
                    first = failed
                    for other in futures:
                        other.cancel()
        if first is not None:
            raise first
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    return results


def _collect(chunk: range, outcome: tuple[list[Any], _Failure | None], done: Callable[[int, Any], None],
             n_tasks: int) -> Exception | None:
    """Hand a chunk's results to ``done``; return the chunk's failure rebuilt as an exception (or None)."""
    results, failure = outcome
    for i, result in zip(chunk, results):
        done(i, result)
    return None if failure is None else _rebuild(failure, chunk[failure.position], n_tasks)


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
    try:
        for fut in distributed.as_completed(futures):
            chunk = where[fut.key]
            failed = _collect(chunk, fut.result(), done, len(tasks))
            bar.update(len(chunk))
            if failed is not None:
                raise failed
    except BaseException:
        client.cancel(futures)  # the chunks still queued are not run to no purpose
        raise
