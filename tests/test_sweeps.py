"""decode.sweep: the same DataFrame serially, on local processes and on a Dask LocalCluster; a tqdm
bar; rows written as points finish and a sweep resumed from a partial file (DESIGN.md §12)."""

from __future__ import annotations

import pytest

from kbwork import ConfigError, ValidationError, decode, parallel

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
    assert lines[0].endswith(",path_scheduler,path_order") and len(lines) == 1 + len(with_paths)
    out.write_text("\n".join(lines[:5]) + "\n")
    resumed = decode.sweep(variants=("opt2", "a1"), attribution=True, out=out, resume=True, workers=1,
                           progress=False, **ATTR_AXES)
    assert resumed.equals(with_paths) and out.read_text().splitlines() == lines
    with pytest.raises(ValidationError, match="its columns .* are not this sweep's"):
        decode.sweep(variants=("opt2", "a1"), out=out, resume=True, workers=1, progress=False, **ATTR_AXES)
