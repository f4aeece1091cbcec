"""decode.sweep: the same DataFrame serially, on local processes and on a Dask LocalCluster; a tqdm
bar; rows written as points finish and a sweep resumed from a partial file (DESIGN.md §12)."""

from __future__ import annotations

import pytest

from kbwork import ValidationError, decode, parallel

AXES = dict(kv_len=[256, 512], fixed_cycles=[0, 40, 160], tile=[64, 128])


@pytest.fixture(scope="module")
def serial():
    return decode.sweep(workers=1, progress=False, **AXES)


def test_local_processes_give_the_serial_frame(serial):
    assert len(serial) == 2 * 3 * 2 * 2 and list(serial.variant[:2]) == ["opt2", "opt3"]
    assert decode.sweep(workers=2, progress=False, **AXES).equals(serial)


def test_a_dask_local_cluster_gives_the_serial_frame(serial):
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                                  dashboard_address=None) as cluster:
        with distributed.Client(cluster) as client:
            assert decode.sweep(client=client, progress=False, **AXES).equals(serial)
        # or by the scheduler's address: the sweep connects, and closes its own client
        assert decode.sweep(client=cluster.scheduler_address, progress=False, **AXES).equals(serial)


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
    with pytest.raises(ValidationError, match="its columns .* are not this sweep's"):
        decode.sweep(out=out, resume=True, progress=False, kv_len=[256])
    with pytest.raises(ValidationError, match="point 0 is .* the axes differ"):
        decode.sweep(out=out, resume=True, progress=False, **{**AXES, "kv_len": [1024, 512]})
