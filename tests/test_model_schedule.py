"""The list scheduler behind serial and ping-pong (DESIGN.md §15), by hand: a tiny ping-pong case whose
every start and end is worked out below, the key breaking a tie, and the serial chain's closed form."""

from __future__ import annotations

import pytest

from kbwork import SimulationError, ValidationError
from kbwork.model.schedule import HalfCosts, Job, chain_jobs, list_schedule, serial_seconds


def _times(timeline):
    return {r.task: (r.start, r.end) for r in timeline.itertuples()}


def test_a_tiny_ping_pong_by_hand():
    # two layers, two identical halves: QKV 1, attention 4 (device), O+FFN 2, LM head 1; hand-off 0.5
    half = HalfCosts(qkv=1, attention=4, o_ffn=2, lm_head=1, handoff=0.5)
    tl = list_schedule(chain_jobs(2, [half, half]))
    # host:   QKV A0 0-1, QKV B0 1-2, (idle), O+FFN A0 6-8, QKV A1 8-9, O+FFN B0 10-12, QKV B1 12-13,
    #         O+FFN A1 14-16, LM head A 16-17, O+FFN B1 18-20, LM head B 20-21
    # device: attention A0 1.5-5.5 (QKV A0 + hand-off), B0 5.5-9.5 (ready at 2.5, the device busy),
    #         A1 9.5-13.5 (QKV A1 ended at 9, + 0.5), B1 13.5-17.5
    want = {"QKV A0": (0, 1), "QKV B0": (1, 2), "attention A0": (1.5, 5.5), "attention B0": (5.5, 9.5),
            "O+FFN A0": (6, 8), "QKV A1": (8, 9), "attention A1": (9.5, 13.5), "O+FFN B0": (10, 12),
            "QKV B1": (12, 13), "attention B1": (13.5, 17.5), "O+FFN A1": (14, 16), "LM head A": (16, 17),
            "O+FFN B1": (18, 20), "LM head B": (20, 21)}
    assert _times(tl) == want
    assert tl["end"].max() == 21
    assert list(tl.columns) == ["task", "half", "layer", "phase", "resource", "start", "end"]
    assert list(tl.start) == sorted(tl.start)  # rows in start order
    row = tl.set_index("task").loc["attention B1"]
    assert (row.half, row.layer, row.phase, row.resource) == ("B", 1, "attention", "device")
    # each resource runs one task at a time
    for _, g in tl.groupby("resource"):
        g = g.sort_values("start")
        assert (g.start.to_numpy()[1:] >= g.end.to_numpy()[:-1]).all()


def test_the_smallest_key_wins_a_tie():
    # everything 1, no hand-off: at t=3 the host may start O+FFN B0 (key (0, B, O+FFN)) or QKV A1
    # (key (1, A, QKV)); the lower layer goes first
    half = HalfCosts(qkv=1, attention=1, o_ffn=1, lm_head=1)
    t = _times(list_schedule(chain_jobs(2, [half, half])))
    assert t["QKV A0"] == (0, 1) and t["QKV B0"] == (1, 2) and t["attention A0"] == (1, 2)
    assert t["O+FFN A0"] == (2, 3) and t["attention B0"] == (2, 3)
    assert t["O+FFN B0"] == (3, 4) and t["QKV A1"] == (4, 5)


def test_one_chain_is_the_serial_closed_form():
    c = HalfCosts(qkv=3e-6, attention=40e-6, o_ffn=11e-6, lm_head=7e-6, handoff=2e-6)
    tl = list_schedule(chain_jobs(5, [c]))
    assert len(tl) == 5 * 3 + 1
    assert tl["end"].max() == pytest.approx(serial_seconds(5, c), rel=1e-12)
    assert serial_seconds(5, c) == pytest.approx(5 * (3 + 2 * 2 + 40 + 11) * 1e-6 + 7e-6, rel=1e-12)
    # back to back: each task starts when the previous one ends, plus the hand-off around attention
    gaps = (tl.start.to_numpy()[1:] - tl.end.to_numpy()[:-1]).round(12)
    assert set(gaps) <= {0.0, 2e-6}


def test_bad_job_lists_are_refused():
    a = Job("a", "host", 1.0, (("b", 0.0),), (0,))
    b = Job("b", "host", 1.0, (("a", 0.0),), (1,))
    with pytest.raises(SimulationError, match="can never start"):
        list_schedule([a, b])
    with pytest.raises(SimulationError, match="unknown job 'z'"):
        list_schedule([Job("a", "host", 1.0, (("z", 0.0),), (0,))])
    with pytest.raises(SimulationError, match="share a name"):
        list_schedule([Job("a", "host", 1.0, (), (0,)), Job("a", "device", 1.0, (), (1,))])


def _job(**kw):
    return Job(**{**dict(name="a", resource="host", duration=1.0, preds=(), key=(0,)), **kw})


@pytest.mark.parametrize("jobs, match", [
    ([5], r"list_schedule: jobs\[0\] is 5 \(int\); every job is a kbwork.model.Job"),
    (5, r"list_schedule: jobs must be a list or tuple of kbwork.model.Job records.*got 5 \(int\)"),
    (None, "jobs must be a list or tuple"),
    (_job(), r"jobs must be a list or tuple .*\(Job\)"),
    ([_job(name=5)], "job 0 .*name must be a non-empty string"),
    ([_job(resource=None)], r"resource must be a non-empty string \(e.g. 'host' or 'device'\), got None"),
    ([_job(duration="1")], r"duration must be a finite number of seconds >= 0, got '1'"),
    ([_job(duration=-1.0)], "duration must be a finite number of seconds >= 0, got -1.0"),
    ([_job(duration=float("nan"))], "duration must be a finite number of seconds >= 0, got nan"),
    ([_job(preds=None)], r"preds must be a tuple of \(name, latency\) pairs, got None"),
    ([_job(preds=(5,))], r"preds must be \(name, latency\) pairs .*got 5"),
    ([_job(preds=(("b", "x"),)), _job(name="b")], r"preds must be \(name, latency\) pairs .*got \('b', 'x'\)"),
    ([_job(key=5)], r"key must be a tuple \(e.g. \(layer, half, phase\)\), got 5"),
    ([_job(key=(0,)), _job(name="b", key=("x",))], r"the keys of jobs 'a' \(\(0,\)\) and 'b' \(\('x',\)\) cannot "
                                                   r"be compared"),
])
def test_jobs_that_are_not_jobs_are_validation_errors(jobs, match):
    with pytest.raises(ValidationError, match=match):
        list_schedule(jobs)


def test_no_jobs_is_an_empty_timeline():
    tl = list_schedule([])
    assert tl.empty and list(tl.columns) == ["task", "half", "layer", "phase", "resource", "start", "end"]
