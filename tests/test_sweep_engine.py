"""The sweep engine (kbwork/sweep.py) alone, with a toy point function; and decode.sweep and model.sweep each
resuming, refusing a changed record and re-checking the rows they take back through that one engine
(DESIGN.md §12, §19; a row edited by hand is computed again with a warning)."""

from __future__ import annotations

import json
import re
import warnings

import pandas as pd
import pytest

from kbwork import ValidationError, decode, load_topology
from kbwork import model as mdl
from kbwork import sweep as engine

CALLS: list[tuple] = []


def _toy_point(task: tuple) -> list[dict]:
    """A toy point: for each key ("sum", "product") the sum or product of the point's a and b, and its square."""
    point, keys, offset = task
    CALLS.append((point["a"], point["b"], keys))
    rows = []
    for key in keys:
        value = point["a"] + point["b"] + offset if key == "sum" else point["a"] * point["b"] + offset
        rows.append({**point, "op": key, "value": value, "square": value * value})
    return rows


def _toy_read(fields: dict, point: dict, bad) -> dict:
    out = {}
    for column in ("value", "square"):
        text = fields[column]
        if not text.lstrip("-").isdigit():
            raise bad(column, "an int")
        out[column] = int(text)
    return out


def _toy_check(row: dict, point: dict) -> str | None:
    return None if row["square"] == row["value"] ** 2 else f"square {row['square']} is not value {row['value']} squared"


def _toy_front(offset: int = 0, keys: tuple = ("sum", "product"), whole_points: bool = False) -> engine.Front:
    return engine.Front(label="toy sweep", what="toy", schema=1, point=_toy_point,
                        task=lambda point, missing: (point, missing, offset), keys=keys, key_columns=("op",),
                        metrics=("op", "value", "square"), read_row=_toy_read, check_row=_toy_check,
                        record={"ops": list(keys), "setup": {"offset": offset, "name": "toy"}}, keys_field="ops",
                        compared=("ops", "columns"), setups=("setup",), whole_points=whole_points)


def _toy(out=None, resume=False, **kw):
    axes = dict(a=[1, 2, 3], b=[10, 20])
    names = list(axes)
    values = engine.axis_values(axes, names)
    CALLS.clear()
    return engine.run(_toy_front(**kw), names, values, engine.points(names, values), out=out, resume=resume,
                      progress=False, workers=1)


def test_the_engine_computes_every_key_at_every_point_in_order():
    df = _toy()
    assert list(df.columns) == ["a", "b", "op", "value", "square"] and len(df) == 12
    assert list(df.op[:2]) == ["sum", "product"] and list(df.value[:2]) == [11, 10]
    assert list(zip(df.a, df.b))[::2] == [(1, 10), (1, 20), (2, 10), (2, 20), (3, 10), (3, 20)]
    assert len(CALLS) == 6


def test_the_engine_resumes_refuses_another_record_and_recomputes_a_row_that_fails_its_checks(tmp_path):
    out = tmp_path / "toy.csv"
    full = _toy(out=out)
    lines = out.read_text().splitlines()
    record = json.loads((tmp_path / "toy.csv.meta.json").read_text())
    assert record["what"] == "toy" and len(record[engine.ROW_DIGESTS]) == 12
    assert lines[0] == "point,a,b,op,value,square"
    # cut short inside point 3's second row: points 0-2 and point 3's sum are taken back
    out.write_text("\n".join(lines[:8]) + "\n" + lines[8][:4])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing to warn about
        again = _toy(out=out, resume=True)
    assert again.equals(full) and out.read_text().splitlines() == lines
    assert CALLS == [(2, 20, ("product",)), (3, 10, ("sum", "product")), (3, 20, ("sum", "product"))]
    # a row edited by hand (still consistent) and one inconsistent: both computed again, with a warning each
    edited = list(lines)
    edited[3] = edited[3].replace(",sum,21,441", ",sum,5,25")
    edited[8] = edited[8].replace(",product,40,1600", ",product,40,1601")
    assert edited[3] != lines[3] and edited[8] != lines[8]
    out.write_text("\n".join(edited) + "\n")
    with pytest.warns(UserWarning) as caught:
        again = _toy(out=out, resume=True)
    (message,) = [str(w.message) for w in caught]
    assert "2 rows of toy.csv not taken back, computed again" in message
    assert "line 4 (point 1, sum): it is not a row this sweep wrote" in message
    assert "line 9 (point 3, product): it is not a row this sweep wrote" in message
    assert "square 1601 is not value 40 squared" in message
    assert again.equals(full) and out.read_text().splitlines() == lines
    assert CALLS == [(1, 20, ("sum",)), (2, 20, ("product",))]
    # another setup, other axes: refused, naming every difference, the file untouched
    with pytest.raises(ValidationError, match=r"another sweep wrote it .*setup offset is 0 there, 1 here"):
        _toy(out=out, resume=True, offset=1)
    with pytest.raises(ValidationError, match=r"ops \['sum', 'product'\] there, \['sum'\] here"):
        _toy(out=out, resume=True, keys=("sum",))
    # a damaged value is refused, naming the line, never computed again in silence
    out.write_text("\n".join([*lines[:7], lines[7].replace(",sum,22,", ",sum,x,"), *lines[8:]]) + "\n")
    with pytest.raises(ValidationError, match=r"line 8: value is 'x', not an int; the file is damaged"):
        _toy(out=out, resume=True)
    assert CALLS == []


def test_whole_points_run_again_whole(tmp_path):
    out = tmp_path / "toy.csv"
    _toy(out=out, whole_points=True)
    lines = out.read_text().splitlines()
    out.write_text("\n".join(lines[:6]) + "\n")  # points 0 and 1, and point 2's sum
    _toy(out=out, resume=True, whole_points=True)
    assert CALLS == [(a, b, ("sum", "product")) for a, b in ((2, 10), (2, 20), (3, 10), (3, 20))]
    assert out.read_text().splitlines() == lines


def test_a_record_without_row_digests_is_checked_for_consistency_only(tmp_path):
    out = tmp_path / "toy.csv"
    full = _toy(out=out)
    meta = tmp_path / "toy.csv.meta.json"
    record = json.loads(meta.read_text())
    del record[engine.ROW_DIGESTS]   # as an older kbwork wrote it
    meta.write_text(json.dumps(record))
    with pytest.warns(UserWarning, match=r"records no row digests .* checked for consistency only"):
        assert _toy(out=out, resume=True).equals(full)
    assert CALLS == [] and len(json.loads(meta.read_text())[engine.ROW_DIGESTS]) == 12


def test_axes_are_checked_by_the_engine():
    with pytest.raises(ValidationError, match=r"sweep: unknown axis c; axes are a, b"):
        engine.check_axis_names({"a": 1, "c": 2}, ("a", "b"))
    with pytest.raises(ValidationError, match=r"axis 'b' has no values"):
        engine.check_axes(["a", "b"], [[1], []], lambda name, val: None)
    import numpy as np

    assert engine.axis_values({"a": np.arange(2), "b": 3.5}, ["a", "b"]) == [[0, 1], [3.5]]
    assert type(engine.axis_values({"a": np.arange(2)}, ["a"])[0][0]) is int


# --- the two front ends, through the one engine ----------------------------------------------------------------
@pytest.fixture
def spy(monkeypatch):
    """Counts the engine's record comparisons and row reads (whoever calls them)."""
    seen = {"differences": [], "rows": 0}
    differences, row = engine.record_differences, engine.SweepFile._row

    def spy_differences(front, recorded, meta):
        seen["differences"].append(front.what)
        return differences(front, recorded, meta)

    def spy_row(self, line, number):
        seen["rows"] += 1
        return row(self, line, number)

    monkeypatch.setattr(engine, "record_differences", spy_differences)
    monkeypatch.setattr(engine.SweepFile, "_row", spy_row)
    return seen


def _edit(path, line, column, value):
    lines = path.read_text().splitlines()
    header = lines[0].split(",")
    fields = lines[line].split(",")
    for c, v in zip([column] if isinstance(column, str) else column, [value] if isinstance(column, str) else value):
        fields[header.index(c)] = v
    lines[line] = ",".join(fields)
    path.write_text("\n".join(lines) + "\n")


def test_decode_sweep_resumes_refuses_and_rechecks_through_the_engine(tmp_path, spy, monkeypatch):
    out = tmp_path / "d.csv"
    axes = dict(kv_len=[256, 512])
    full = decode.sweep(out=out, workers=1, progress=False, **axes)
    lines = out.read_text().splitlines()
    # us is no longer cycles at the clock: the row runs again, with a warning
    _edit(out, 1, "us", "9.9")
    ran = []
    orig = decode._sweep_point
    monkeypatch.setattr(decode, "_sweep_point", lambda task: ran.append(task[:2]) or orig(task))
    with pytest.warns(UserWarning, match=r"line 2 \(point 0, opt2\): it is not a row this sweep wrote .*and us 9\.9 "
                                         r"is not cycles \d+ in microseconds"):
        again = decode.sweep(out=out, resume=True, workers=1, progress=False, **axes)
    assert again.equals(full) and out.read_text().splitlines() == lines
    assert ran == [({"kv_len": 256}, ("opt2",))]
    assert spy["differences"] == ["kbwork.decode.sweep"] and spy["rows"] == 4
    with pytest.raises(ValidationError, match=r"topology dma_base_cycles is 200 there, 1000 here"):
        decode.sweep(out=out, resume=True, workers=1, progress=False, topology=load_topology(dma_base_cycles=1000),
                     **axes)
    assert spy["differences"] == ["kbwork.decode.sweep"] * 2


@pytest.mark.parametrize("line, columns, values, why", [
    # batch 1: still consistent (1 token / 1.0 s), caught by its digest alone
    (1, ("seconds", "tokens_per_s"), ("1.0", "1.0"), r"line 2 \(point 0, -, host, serial\): it is not a row this "
                                                     r"sweep wrote \(its digest is not among"),
    # batch 2: tokens_per_s is not the batch over seconds
    (2, ("seconds", "tokens_per_s"), ("1.0", "1.0"), r"tokens_per_s 1\.0 is not the batch 2 over seconds 1\.0"),
    (1, ("tokens_per_s",), ("1.5",), r"tokens_per_s 1\.5 is not the batch 1 over seconds"),
    (1, ("attention_us_per_layer",), ("1e9",), r"attention_us_per_layer 1000000000\.0 over 32 layers is .* longer "
                                               r"than the whole step"),
    (2, ("bound",), ("host flops",), r"bound 'host flops' contradicts bound_kind 'host bandwidth'"),
    (1, ("bound_kind", "bound"), ("ahbm", "ahbm"), r"bound_kind 'ahbm' is not what can bound a step placed on host"),
])
def test_model_sweep_recomputes_a_hand_edited_row_with_a_warning(tmp_path, spy, line, columns, values, why):
    out = tmp_path / "m.csv"
    axes = dict(context=[1024], batch=[1, 2])
    full = mdl.sweep(out=out, placements=("host",), workers=1, progress=False, **axes)
    lines = out.read_text().splitlines()
    _edit(out, line, columns, values)
    with pytest.warns(UserWarning, match=r"model sweep: 1 row of m\.csv not taken back, computed again: .*" + why):
        again = mdl.sweep(out=out, resume=True, placements=("host",), workers=1, progress=False, **axes)
    assert again.equals(full) and out.read_text().splitlines() == lines
    assert spy["differences"] == ["kbwork.model.sweep"] and spy["rows"] == 2
    with pytest.raises(ValidationError, match=r"host hbm_tb_s is 4\.8 there, 9\.6 here"):
        mdl.sweep(out=out, resume=True, placements=("host",), host={"hbm_tb_s": 9.6}, workers=1, progress=False,
                  **axes)


def test_model_sweep_resumes_through_the_engine(tmp_path, spy):
    out = tmp_path / "m.csv"
    axes = dict(context=[512], batch=[1, 2, 4])
    cases = dict(variants=("opt2",), placements=("ahbm", "host"))
    full = mdl.sweep(out=out, workers=1, progress=False, **cases, **axes)
    lines = out.read_text().splitlines()
    out.write_text("\n".join(lines[:4]) + "\n")   # point 0 whole, point 1's device row: point 1 runs again whole
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = mdl.sweep(out=out, resume=True, workers=1, progress=False, **cases, **axes)
    assert again.equals(full) and out.read_text().splitlines() == lines
    assert spy["rows"] == 3
    record = json.loads((tmp_path / "m.csv.meta.json").read_text())
    assert record["cases"] == [["opt2", "ahbm", "serial"], ["opt2", "host", "serial"]]
    assert len(record[engine.ROW_DIGESTS]) == 6
    assert re.fullmatch(r"[0-9a-f]{16}", record[engine.ROW_DIGESTS][0])
    assert isinstance(again, pd.DataFrame) and again.attrs["host"]["hbm_tb_s"] == 4.8
