"""A dropped run is freed at once, by reference counting: nothing it made sits in a reference cycle.

A run holds tens of thousands of small objects (a device's traces, its schedule, the steady state's
expansion). In a cycle, they would stay until Python's cyclic collector runs, and that collector's
passes over them would land inside whatever the notebook does next.
"""

import gc

import pytest

import kbwork
from kbwork import decode
from kbwork.kernels.gqa_decode import gqa_decode


def _cyclic_garbage(make) -> list[str]:
    """The types of the objects ``make()``'s result leaves for the cyclic collector once dropped."""
    gc.collect()
    was = gc.get_debug()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        result = make()
        del result
        gc.collect()
        return sorted({type(o).__name__ for o in gc.garbage})
    finally:
        gc.set_debug(was)
        gc.garbage.clear()


def _device(pes: int, **overrides):
    sim = kbwork.Simulator("ahbm-device-v1", mode="timing", **overrides)
    launches = {}
    for p in range(pes):
        ch = sim.topo.home_channel(p)
        q = sim.hbm(f"q{p}", shape=(4, 64), dtype="bf16", channel=ch)
        K = sim.hbm(f"K{p}", shape=(1024, 64), dtype="bf16", channel=ch)
        V = sim.hbm(f"V{p}", shape=(1024, 64), dtype="bf16", channel=ch)
        O = sim.hbm(f"O{p}", shape=(4, 64), dtype="fp32", channel=ch)
        launches[p] = [kbwork.Launch(gqa_decode, q, K, V, O, variant="opt2", tile=128)]
    return sim.run_device(launches)


@pytest.mark.parametrize("make", [
    pytest.param(lambda: decode.run("opt2", kv_len=4096, mode="timing"), id="one PE, steady"),
    pytest.param(lambda: decode.run("opt3", kv_len=1024, mode="timing", steady_state=False), id="one PE, full"),
    pytest.param(lambda: decode.run("opt2", kv_len=256, mode="data"), id="one PE, data"),
    pytest.param(lambda: _device(4), id="4 PEs, replicated"),
    pytest.param(lambda: _device(3, hbm_channels=1, channel_bytes_per_cycle=64), id="3 PEs on one channel"),
])
def test_a_dropped_run_leaves_nothing_for_the_cyclic_collector(make):
    assert _cyclic_garbage(make) == []


def test_a_handle_still_pickles_and_its_copy_belongs_to_no_simulator():
    # an origin holds its arena weakly (no cycle); a pickled handle keeps where it came from in words
    import copy
    import pickle

    def load(tl, x):
        tl.load(x, name="X")

    sim = kbwork.Simulator(mode="timing")
    q = sim.hbm("q", shape=(4, 64), dtype="bf16")
    for twin in (pickle.loads(pickle.dumps(q)), copy.deepcopy(q)):
        assert twin == q and twin.origin.arena is None and repr(twin.origin) == repr(q.origin)
        with pytest.raises(kbwork.ValidationError, match=r"'q' is a pickled or deep-copied copy of a handle of "
                                                         r"the HBM of simulator #\d+; a copy belongs to no simulator"):
            sim.run(load, twin)
    assert sim.run(load, q).cycles > 0
