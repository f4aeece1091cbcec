"""Which variant wins at each sweep point, and where one variant's extra cycles sit on the critical path
(analysis.winners, analysis.attribution_gap, analysis.path_cycles)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from kbwork import ValidationError, analysis, decode


def _frame(rows):
    return pd.DataFrame(rows, columns=["kv_len", "fixed_cycles", "variant", "cycles"])


def test_winners_ranks_every_point_in_sweep_order_and_breaks_ties_by_variant_order():
    df = _frame([(4096, 0, "opt2", 100), (4096, 0, "opt3", 90), (4096, 0, "a1", 95),
                 (1024, 40, "opt2", 100), (1024, 40, "opt3", 120), (1024, 40, "a1", 100)])
    w = analysis.winners(df)
    assert list(w.index) == [(4096, 0), (1024, 40)] and w.index.names == ["kv_len", "fixed_cycles"]
    assert list(w.columns) == ["opt2", "opt3", "a1", "best", "runner_up", "margin", "opt2/best", "opt3/best",
                               "a1/best"]
    first, second = w.iloc[0], w.iloc[1]
    assert (first.best, first.runner_up) == ("opt3", "a1") and first.margin == pytest.approx(95 / 90 - 1)
    assert first["opt2/best"] == pytest.approx(100 / 90) and first["opt3/best"] == 1.0
    assert (second.best, second.runner_up, second.margin) == ("opt2", "a1", 0.0)  # a tie: the first named
    assert w["opt3"].dtype == np.int64
    only = analysis.winners(df, variants=["a1", "opt2"])
    assert list(only.best) == ["a1", "a1"] and list(only.columns[:2]) == ["a1", "opt2"]


def test_winners_of_a_real_sweep_and_of_a_one_point_sweep():
    sw = decode.sweep(kv_len=[256, 512], tile=[64], variants=("opt2", "opt3", "a1"), workers=1, progress=False)
    w = analysis.winners(sw)
    assert len(w) == 2 and w.index.names == ["kv_len", "tile"]
    for (kv, tile), row in w.iterrows():
        got = sw[sw.kv_len == kv].set_index("variant").cycles
        assert row.best == got.idxmin() and row[row.best] == got.min()
    one = decode.sweep(kv_len=256, variants=("opt2", "a1"), workers=1, progress=False).drop(columns="kv_len")
    assert list(analysis.winners(one).index) == [0]


def test_winners_refuses_what_it_cannot_rank():
    df = _frame([(4096, 0, "opt2", 100), (4096, 0, "opt3", 90), (1024, 40, "opt2", 100)])
    with pytest.raises(ValidationError, match="not every point holds every variant"):
        analysis.winners(df)
    with pytest.raises(ValidationError, match="two or more"):
        analysis.winners(df, variants=["opt2"])
    with pytest.raises(ValidationError, match="two or more"):
        analysis.winners(df, variants=["opt2", "b9"])
    with pytest.raises(ValidationError, match="holds a variant twice"):
        analysis.winners(pd.concat([df, df]))
    with pytest.raises(ValidationError, match="decode.sweep"):
        analysis.winners(df.drop(columns="cycles"))


@pytest.fixture(scope="module")
def paths():
    return decode.sweep(kv_len=[512], tile=[64, 128], hazard_policy=["strict_fifo", "rw_aware"], dma_channels=[1, 2],
                        variants=("opt2", "opt3", "a1"), attribution=True, workers=1, progress=False)


@pytest.mark.parametrize("by", ["engine", "cause"])
def test_attribution_gap_splits_the_end_to_end_difference(paths, by):
    gap = analysis.attribution_gap(paths, "a1", "opt2", by=by)
    w = analysis.winners(paths)
    assert list(gap.index) == list(w.index) and gap.columns[0] == "gap" and gap.columns.name == by
    assert (gap["gap"] == w["a1"] - w["opt2"]).all()
    assert (gap.drop(columns="gap").sum(axis=1) == gap["gap"]).all()
    names = analysis.ENGINE_NAMES if by == "engine" else analysis.CAUSES
    full = analysis.attribution_gap(paths, "a1", "opt2", by=by, drop_zero=False)
    assert list(full.columns) == ["gap", *names]
    assert set(gap.columns) - {"gap"} == {n for n in names if (full[n] != 0).any()}
    a1 = paths[(paths.variant == "a1")].set_index(["kv_len", "tile", "hazard_policy", "dma_channels"])
    o2 = paths[(paths.variant == "opt2")].set_index(["kv_len", "tile", "hazard_policy", "dma_channels"])
    name = names[-1] if by == "cause" else "PE_MATH"
    assert (full[name] == a1[f"path_{name}"] - o2[f"path_{name}"]).all()


def test_attribution_gap_needs_the_path_columns_and_two_variants(paths):
    plain = paths.drop(columns=list(analysis.PATH_COLUMNS))
    with pytest.raises(ValidationError, match="attribution=True"):
        analysis.attribution_gap(plain, "a1", "opt2")
    with pytest.raises(ValidationError, match="two of the sweep's variants"):
        analysis.attribution_gap(paths, "a1", "a1")
    with pytest.raises(ValidationError, match="two of the sweep's variants"):
        analysis.attribution_gap(paths, "a1", "b9")
    with pytest.raises(ValidationError, match="by="):
        analysis.attribution_gap(paths, "a1", "opt2", by="unit")


@pytest.mark.parametrize("channels", [1, 2])
def test_path_cycles_is_the_attribution_with_dma_channels_summed(channels):
    r = decode.run("opt2", kv_len=512, tile=64, mode="timing", dma_channels=channels, fixed_cycles=400)
    rec = analysis.path_cycles(r)
    assert list(rec) == list(analysis.PATH_COLUMNS)
    att = analysis.attribution(r.run)
    eng = att[att.by == "engine"]
    assert rec["path_PE_DMA"] == eng[eng.name.str.startswith("PE_DMA")].cycles.sum()
    assert sum(v for k, v in rec.items() if k.startswith("path_PE_")) == r.cycles
    assert sum(v for k, v in rec.items() if not k.startswith("path_PE_")) == r.cycles
    assert analysis.path_cycles(r.run) == rec
