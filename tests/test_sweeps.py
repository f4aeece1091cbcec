"""decode.sweep: the same DataFrame serially, on local processes and on a Dask LocalCluster; a tqdm
bar; rows written as points finish and a sweep resumed from a partial file (DESIGN.md §12)."""

from __future__ import annotations

import json

import pytest

from kbwork import ConfigError, TcmOverflowError, ValidationError, decode, load_topology, parallel

AXES = dict(kv_len=[256, 512], fixed_cycles=[0, 40, 160], tile=[64, 128])


@pytest.fixture(scope="module")
def serial():
    return decode.sweep(workers=1, progress=False, **AXES)


@pytest.fixture(scope="module")
def cluster():
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                                  dashboard_address=None) as cluster:
        yield cluster


def test_local_processes_give_the_serial_frame(serial):
    assert len(serial) == 2 * 3 * 2 * 2 and list(serial.variant[:2]) == ["opt2", "opt3"]
    assert decode.sweep(workers=2, progress=False, **AXES).equals(serial)


def test_a_dask_local_cluster_gives_the_serial_frame(serial, cluster):
    import distributed

    with distributed.Client(cluster) as client:
        assert decode.sweep(client=client, progress=False, **AXES).equals(serial)
    # or by the scheduler's address: the sweep connects, and closes its own client
    assert decode.sweep(client=cluster.scheduler_address, progress=False, **AXES).equals(serial)


# --- errors on other processes ----------------------------------------------------------------------------
# head_dim 100000 does not fit the TCM: every run at that point raises TcmOverflowError (a MemoryError
# subclass, which tblib, used by Dask, cannot rebuild), the other point runs
TOO_BIG = dict(kv_len=[256], head_dim=[128, 100000])
SMALL = dict(kv_len=[256, 512], tile=[64, 128])


def _small_serial():
    return decode.sweep(workers=1, progress=False, **SMALL)


@pytest.mark.parametrize("where", ["processes", "dask"])
def test_an_error_at_a_remote_point_keeps_its_class_and_message_and_the_process_usable(where, cluster, tmp_path):
    import distributed

    with distributed.Client(cluster) if where == "dask" else _no_client() as client:
        kw = dict(client=client) if where == "dask" else dict(workers=2)
        with pytest.raises(TcmOverflowError, match=r"TCM overflow allocating 'Q' \(1600000 B.*raise tcm_bytes") as info:
            decode.sweep(out=tmp_path / "s.csv", progress=False, **kw, **TOO_BIG)
        assert type(info.value) is TcmOverflowError
        assert any("raised on a worker process" in note for note in info.value.__notes__)
        # the file keeps whatever finished before the error was seen
        rows = (tmp_path / "s.csv").read_text().splitlines()
        assert len(rows) in (1, 3)  # the header, and the point at head_dim 128 if it finished first
    # later sweeps in this process, on processes and on Dask, still work
    assert decode.sweep(workers=2, progress=False, **SMALL).equals(_small_serial())
    with distributed.Client(cluster) as client:
        assert decode.sweep(client=client, progress=False, **SMALL).equals(_small_serial())


class _no_client:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


class _Picky(Exception):
    """An error whose class takes two arguments: it cannot be rebuilt from its message."""

    def __init__(self, a, b):
        super().__init__(f"{a} and {b}")


def _fails_at_seven(x: int) -> int:
    if x == 7:
        raise ZeroDivisionError(f"task {x} divides by zero")
    if x == 9:
        raise _Picky("left", "right")
    return x


def test_a_worker_error_of_any_class_reaches_the_caller_after_the_results_before_it():
    seen = []
    with pytest.raises(ZeroDivisionError) as info:
        parallel.map_tasks(_fails_at_seven, list(range(9)), workers=2, progress=False,
                           on_result=lambda i, r: seen.append(i))
    assert type(info.value) is ZeroDivisionError and str(info.value) == "task 7 divides by zero"
    assert set(range(7)) <= set(seen) and 7 not in seen
    with pytest.raises(parallel.RemoteError) as info:
        parallel.map_tasks(_fails_at_seven, list(range(8, 20)), workers=2, progress=False)
    assert str(info.value) == "_Picky: left and right"
    assert parallel.map_tasks(_square, list(range(20)), workers=2, progress=False) == [x * x for x in range(20)]


def test_results_come_back_in_task_order_whatever_finishes_first():
    tasks = list(range(40, 0, -1))
    assert parallel.map_tasks(_square, tasks, workers=2, progress=False) == [t * t for t in tasks]
    seen = []
    parallel.map_tasks(_square, tasks, workers=1, progress=False, on_result=lambda i, r: seen.append(i))
    assert seen == list(range(40))
    with pytest.raises(ValidationError, match="workers must be a positive int"):
        parallel.map_tasks(_square, tasks, workers=0)
    with pytest.raises(ValidationError, match="client must be a distributed.Client or a scheduler address"):
        parallel.map_tasks(_square, tasks, client=42)


def _square(x: int) -> int:
    return x * x


def test_sweep_shows_a_tqdm_bar_unless_told_not_to(capsys):
    decode.sweep(kv_len=[256, 512], fixed_cycles=[0, 40], workers=1)
    err = capsys.readouterr().err
    assert "sweep: 100%" in err and "4/4" in err  # tqdm's own line
    decode.sweep(kv_len=[256, 512], fixed_cycles=[0, 40], workers=1, progress=False)
    assert capsys.readouterr().err == ""


def test_rows_are_written_as_points_finish_and_a_sweep_resumes(tmp_path, serial):
    out = tmp_path / "sweep.csv"
    full = decode.sweep(out=out, progress=False, **AXES)
    assert full.equals(serial)
    lines = out.read_text().splitlines()
    assert lines[0].startswith("point,kv_len,fixed_cycles,tile,variant,cycles")
    assert len(lines) == 1 + len(serial) and lines[1].startswith("0,") and lines[-1].startswith("11,")
    # a run cut short: seven points written, the eighth torn half-way through its first row
    out.write_text("\n".join(lines[:15]) + "\n" + lines[15][:7])
    ran = []
    orig = decode._sweep_point
    try:
        decode._sweep_point = lambda task: ran.append(task[0]) or orig(task)
        resumed = decode.sweep(out=out, resume=True, workers=1, progress=False, **AXES)
    finally:
        decode._sweep_point = orig
    assert resumed.equals(serial) and len(ran) == 12 - 7
    assert out.read_text().splitlines() == lines  # rewritten whole, in point order
    with pytest.raises(ValidationError, match="exists; pass resume=True"):
        decode.sweep(out=out, progress=False, **AXES)
    with pytest.raises(ValidationError, match=r"axes \(kv_len, fixed_cycles, tile\) there, \(kv_len\) here"):
        decode.sweep(out=out, resume=True, progress=False, kv_len=[256])
    with pytest.raises(ValidationError, match=r"axis 'kv_len' is \[256, 512\] there, \[1024, 512\] here"):
        decode.sweep(out=out, resume=True, progress=False, **{**AXES, "kv_len": [1024, 512]})


# --- DMA channels as an axis; where the time goes, per point --------------------------------------------
ATTR_AXES = dict(kv_len=[512], tile=[64, 128], hazard_policy=["strict_fifo", "rw_aware"], dma_channels=[1, 2])


@pytest.fixture(scope="module")
def with_paths():
    return decode.sweep(variants=("opt2", "a1"), attribution=True, workers=1, progress=False, **ATTR_AXES)


def test_dma_channels_is_a_sweep_axis(with_paths):
    assert "dma_channels" in decode.SWEEP_AXES
    assert list(with_paths.columns[:5]) == ["kv_len", "tile", "hazard_policy", "dma_channels", "variant"]
    one = with_paths[(with_paths.tile == 64) & (with_paths.hazard_policy == "strict_fifo")
                     & (with_paths.dma_channels == 2) & (with_paths.variant == "opt2")]
    assert one.cycles.item() == decode.run("opt2", kv_len=512, tile=64, mode="timing", dma_channels=2).cycles
    with pytest.raises(ConfigError, match="axis 'dma_channels'"):
        decode.sweep(kv_len=[512], dma_channels=[1, 0], progress=False)


def test_attribution_adds_the_critical_path_by_engine_and_by_cause(with_paths):
    from kbwork import analysis

    cols = list(analysis.PATH_COLUMNS)
    assert list(with_paths.columns[-len(cols):]) == cols
    engines = [c for c in cols if c.startswith("path_PE_")]
    causes = [c for c in cols if c not in engines]
    assert (with_paths[engines].sum(axis=1) == with_paths.cycles).all()
    assert (with_paths[causes].sum(axis=1) == with_paths.cycles).all()
    for row in with_paths.itertuples():
        r = decode.run(row.variant, kv_len=512, tile=row.tile, mode="timing", hazard_policy=row.hazard_policy,
                       dma_channels=row.dma_channels)
        att = analysis.attribution(r.run).set_index(["by", "name"]).cycles
        dma = sum(v for (by, name), v in att.items() if by == "engine" and name.startswith("PE_DMA"))
        assert row.path_PE_DMA == dma and row.path_PE_GEMM == att["engine", "PE_GEMM"]
        assert row.path_hazard == att["cause", "hazard"] and row.path_dependency == att["cause", "dependency"]
    plain = decode.sweep(variants=("opt2", "a1"), workers=1, progress=False, **ATTR_AXES)
    assert not set(cols) & set(plain.columns)
    assert plain.equals(with_paths.drop(columns=cols))
    with pytest.raises(ValidationError, match="attribution must be True or False"):
        decode.sweep(kv_len=[512], attribution="yes", progress=False)


def test_a_sweep_with_attribution_writes_and_resumes_its_path_columns(tmp_path, with_paths):
    out = tmp_path / "paths.csv"
    full = decode.sweep(variants=("opt2", "a1"), attribution=True, out=out, workers=1, progress=False, **ATTR_AXES)
    assert full.equals(with_paths)
    lines = out.read_text().splitlines()
    assert lines[0].endswith(",path_scheduler,path_order,path_launch") and len(lines) == 1 + len(with_paths)
    out.write_text("\n".join(lines[:5]) + "\n")
    resumed = decode.sweep(variants=("opt2", "a1"), attribution=True, out=out, resume=True, workers=1,
                           progress=False, **ATTR_AXES)
    assert resumed.equals(with_paths) and out.read_text().splitlines() == lines
    with pytest.raises(ValidationError, match="attribution=True there, False here"):
        decode.sweep(variants=("opt2", "a1"), out=out, resume=True, workers=1, progress=False, **ATTR_AXES)


# --- resuming: what the file records, and that it never loses a row -------------------------------------------
V3 = ("opt2", "opt3", "a1")


def test_a_resume_under_another_topology_is_refused_and_more_variants_extend_the_file(tmp_path, monkeypatch):
    out = tmp_path / "s.csv"
    two = decode.sweep(out=out, workers=1, progress=False, **SMALL)
    old = out.read_text().splitlines()
    meta = json.loads((tmp_path / "s.csv.meta.json").read_text())
    assert meta["variants"] == ["opt2", "opt3"] and meta["topology"]["dma_base_cycles"] == 200
    slow = load_topology(dma_base_cycles=1000)
    with pytest.raises(ValidationError, match="topology dma_base_cycles is 200 there, 1000 here"):
        decode.sweep(out=out, resume=True, topology=slow, workers=1, progress=False, **SMALL)
    assert out.read_text().splitlines() == old
    other = decode.sweep(out=tmp_path / "slow.csv", topology=slow, workers=1, progress=False, **SMALL)
    assert (other.cycles > two.cycles).all()  # what the refused resume would have had to return
    ran = []
    orig = decode._sweep_point
    monkeypatch.setattr(decode, "_sweep_point", lambda task: ran.append(task[1]) or orig(task))
    three = decode.sweep(out=out, resume=True, variants=V3, workers=1, progress=False, **SMALL)
    assert ran == [("a1",)] * 4  # only the new variant runs
    monkeypatch.setattr(decode, "_sweep_point", orig)
    assert three.equals(decode.sweep(variants=V3, workers=1, progress=False, **SMALL))
    lines = out.read_text().splitlines()
    assert set(old) <= set(lines) and len(lines) == 1 + 12 and lines[0] == old[0]
    assert json.loads((tmp_path / "s.csv.meta.json").read_text())["variants"] == list(V3)


def test_a_resume_with_more_variants_never_loses_a_finished_row(tmp_path, monkeypatch):
    out = tmp_path / "s.csv"
    decode.sweep(out=out, workers=1, progress=False, **SMALL)
    old = out.read_text().splitlines()
    snapshots = []
    append = decode._SweepLog.append
    monkeypatch.setattr(decode._SweepLog, "append",
                        lambda self, point, rows: (append(self, point, rows), snapshots.append(out.read_text())))
    orig, calls = decode._sweep_point, []

    def killed_after_two(task):
        if len(calls) == 2:
            raise KeyboardInterrupt  # the user stops the sweep
        calls.append(task)
        return orig(task)

    monkeypatch.setattr(decode, "_sweep_point", killed_after_two)
    with pytest.raises(KeyboardInterrupt):
        decode.sweep(out=out, resume=True, variants=V3, workers=1, progress=False, **SMALL)
    assert len(snapshots) == 2
    for text in snapshots + [out.read_text()]:  # at every moment: every old row, and no torn one
        lines = text.splitlines()
        assert text.endswith("\n") and lines[0] == old[0] and set(old[1:]) <= set(lines[1:])
        assert all(len(line.split(",")) == len(old[0].split(",")) for line in lines)
    assert len(out.read_text().splitlines()) == len(old) + 2
    monkeypatch.setattr(decode, "_sweep_point", orig)
    resumed = decode.sweep(out=out, resume=True, variants=V3, workers=1, progress=False, **SMALL)
    assert resumed.equals(decode.sweep(variants=V3, workers=1, progress=False, **SMALL))


def test_an_axis_mixing_ints_and_floats_resumes_from_its_own_file(tmp_path, monkeypatch):
    axes = dict(kv_len=[256], r_cycles_per_byte=[0, 0.0625], fixed_cycles=[40.0, 0])
    out = tmp_path / "mixed.csv"
    full = decode.sweep(out=out, workers=1, progress=False, **axes)
    monkeypatch.setattr(decode, "_sweep_point", lambda task: pytest.fail(f"ran {task[0]} again"))
    again = decode.sweep(out=out, resume=True, workers=1, progress=False, **axes)
    assert again.equals(full)
    # by value, not by spelling: 0.0 is the 0 the file records
    assert decode.sweep(out=out, resume=True, workers=1, progress=False,
                        **{**axes, "r_cycles_per_byte": [0.0, 0.0625]}).equals(full)
