"""The measured anchor (DESIGN.md §17): kbwork's bf16 kernel against FlashAttention decode on a real H200.

Every test reads whatever ``data/measured/h200_flash_decode/decode_n<n>.npz`` files are stored, so a new n is
checked by adding its file (and its README row).
"""

from __future__ import annotations

import numpy as np
import pytest

from kbwork import anchor, decode

POINTS = anchor.points()
VARIANTS = ("opt2", "opt3", "a1")


def test_the_shared_points_are_stored_with_their_readme():
    have = {p.n for p in POINTS}
    assert {128, 1024, 4096} <= have
    assert (anchor.ANCHOR_DIR / "README.md").is_file()
    for p in POINTS:
        arr = p.arrays()
        assert arr["o_ref"].dtype == np.float64 and arr["o_ref"].shape == (anchor.GROUP, anchor.HEAD_DIM)
        assert arr["flash_bf16"].shape == (anchor.GROUP, anchor.HEAD_DIM)


@pytest.mark.parametrize("point", POINTS, ids=lambda p: f"n{p.n}")
def test_the_seed_regenerates_the_gpu_inputs(point):
    r = decode.run("opt2", kv_len=point.n, group=8, head_dim=128, tile=128, dtype="bf16", mode="data",
                   seed=point.seed)
    got = float(r.k.astype(np.float64).sum()) + float(r.v.astype(np.float64).sum()) + \
        float(r.q.astype(np.float64).sum())
    assert got == anchor.checksum(r.q, r.k, r.v)
    if point.input_checksum is not None:
        assert got == point.input_checksum  # exactly: the sums are of the same bf16 values in the same order
    # the float64 reference of those inputs is the file's
    np.testing.assert_allclose(r.reference, point.arrays()["o_ref"], rtol=0, atol=1e-12)


@pytest.mark.parametrize("point", POINTS, ids=lambda p: f"n{p.n}")
def test_three_numerics_against_the_stored_h200_arrays(point):
    arr = point.arrays()
    ref = arr["o_ref"]
    flash_max, flash_mean = anchor.errors(arr["flash_bf16"], ref)
    runs = {}
    for v in VARIANTS:
        runs[v] = anchor.run_point(point, v, p_dtype="bf16", out_dtype="bf16")
        mx, mean = anchor.errors(runs[v].O, ref)
        # the bf16 kernel sits at the GPU's own distance from float64
        assert mx <= 2 * flash_max, (v, mx, flash_max)
        assert 0.8 * flash_mean <= mean <= 1.25 * flash_mean, (v, mean / flash_mean)
    # the fp32 path is far closer than any bf16 kernel; rounding O alone rounds less than the GPU does
    fp32 = anchor.run_point(point, "opt2")
    assert anchor.errors(fp32.O, ref)[0] < flash_max / 50
    o_only = anchor.run_point(point, "opt2", out_dtype="bf16")
    assert anchor.errors(o_only.O, ref)[1] < 0.8 * flash_mean
    # opt2, opt3 and a1 stay bit-equal with P in bf16 (the same flat ops on the same dtypes)
    for v in VARIANTS[1:]:
        for name in ("m", "l", "O"):
            assert np.array_equal(getattr(runs[v], name), getattr(runs["opt2"], name)), (v, name)


def test_the_numerics_table_covers_every_stored_n():
    t = anchor.numerics()
    assert sorted(t.n.unique()) == [p.n for p in POINTS]
    kernel = t[t.numerics == "bf16 kernel"]
    assert len(kernel) == len(POINTS) * len(VARIANTS)
    assert (kernel.max_ratio <= 2).all() and kernel.mean_ratio.between(0.8, 1.25).all()
    assert t[t.numerics != "H200"].variants_bit_equal.all()
    flash = t[(t.numerics == "H200") & (t.source == "flash_bf16")]
    assert (flash.max_ratio == 1).all() and (flash.mean_ratio == 1).all()


def test_a_file_without_a_readme_row_takes_the_readme_seed_rule(tmp_path):
    import shutil
    for p in POINTS[:1]:
        shutil.copy(p.path, tmp_path / p.path.name)
    shutil.copy(anchor.ANCHOR_DIR / "README.md", tmp_path / "README.md")
    extra = POINTS[0]
    np.savez(tmp_path / "decode_n256.npz", **extra.arrays())
    pts = {p.n: p for p in anchor.points(tmp_path)}
    assert pts[256].input_checksum is None and pts[256].seed - 256 == extra.seed - extra.n
