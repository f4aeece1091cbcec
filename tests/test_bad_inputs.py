"""Bad input gets a typed error that names the offending thing, never a bare Python exception.

Table-driven: each row is one mistake a researcher can make, the KbworkError
subclass it must raise and a regex its message must match (the regex names
the offending key, argument, flag or file). The tables are grouped by entry
point: ``TOML_CASES`` (topology files), ``CONFIG_CASES`` (``load_topology`` and
``Topology.replace``), ``SIMULATOR_CASES``, ``DECODE_CASES`` (``decode.run``,
``compare``, ``sweep``), ``CLI_CASES`` and ``BENCH_CASES`` (the ``kbwork``
command, run in-process: exit status 2, a short message, no traceback).
Kernel-language rows belong in tables of their own in this file.
"""

from __future__ import annotations

import errno
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import kbwork
from kbwork import ConfigError, KbworkError, Simulator, ValidationError, decode, load_topology
from kbwork.__main__ import main as cli_main  # the command's entry point (kbwork bench included)

REPO = Path(kbwork.__file__).resolve().parent.parent


def _raises(fn, exc_type, pattern):
    with pytest.raises(KbworkError) as info:
        fn()
    assert type(info.value) is exc_type, f"{type(info.value).__name__}: {info.value}"
    assert re.search(pattern, str(info.value)), f"{pattern!r} not in {str(info.value)!r}"
    return info.value


# --- topology files ----------------------------------------------------------------------------------
TOML_CASES = [
    pytest.param(b"[dispatch]\nfixed_cyclez = 3\n", r"'fixed_cyclez'.*Did you mean 'fixed_cycles'", id="unknown-key"),
    pytest.param(b"[dispatch.fast]\nfixed_cycles = 3\n", r"\[dispatch\.fast\].*nested", id="nested-section"),
    pytest.param(b"[a]\ntile_k = 64\n[b]\ntile_k = 32\n", r"'tile_k' appears twice", id="duplicate-across-sections"),
    pytest.param(b"tile_k = 64\ntile_k = 32\n", r"not valid TOML", id="duplicate-in-one-table"),
    pytest.param(b'name = "caf\xe9"\n', r"not a UTF-8 text file \(byte 11 is 0xe9\)", id="latin-1-bytes"),
    pytest.param(b"\xff\xfe\x00n\x00a\x00m\x00e", r"not a UTF-8", id="utf-16-file"),
    pytest.param(b"fixed_cycles = [", r"not valid TOML", id="invalid-toml"),
    pytest.param(b'fixed_cycles = "40"\n', r"'fixed_cycles'.*the string '40'.*without quotes", id="string-for-int"),
    pytest.param(b'clock_ghz = "1.25"\n', r"'clock_ghz'.*the string '1.25'", id="string-for-float"),
    pytest.param(b"fixed_cycles = true\n", r"'fixed_cycles'.*True \(a bool\)", id="bool-for-int"),
    pytest.param(b"fixed_cycles = [40]\n", r"'fixed_cycles'.*\(a list\)", id="array-for-int"),
    pytest.param(b"fixed_cycles = 1979-05-27\n", r"'fixed_cycles'.*\(a date\)", id="date-for-int"),
    pytest.param(b"tile_m = 1.5\n", r"'tile_m'.*integer", id="fraction-for-int"),
    pytest.param(b"fixed_cycles = -1\n", r"'fixed_cycles' is -1; it cannot be negative", id="negative"),
    pytest.param(b"[dma]\ndma_bytes_per_cycle = 0\n", r"'dma_bytes_per_cycle' is 0; it must be positive",
                 id="zero-bandwidth"),
    pytest.param(b"fixed_cycles = 10000000000000000000\n", r"'fixed_cycles' is 1\.000e\+19.*4294967296",
                 id="huge-int"),
    pytest.param(b"[memory]\ntcm_bytes = 4398046511104\n", r"'tcm_bytes'.*1073741824 \(2\*\*30\)", id="huge-tcm"),
    pytest.param(b"clock_ghz = inf\n", r"'clock_ghz' must be a finite number", id="inf-clock"),
    pytest.param(b"clock_ghz = nan\n", r"'clock_ghz' must be a finite number", id="nan-clock"),
    pytest.param(b"clock_ghz = 1e-9\n", r"'clock_ghz'.*between 0.001 and 1000", id="tiny-clock"),
    pytest.param(b"r_cycles_per_byte = 1e300\n", r"'r_cycles_per_byte'.*between", id="huge-r"),
    pytest.param(b"hazard_policy = 3\n", r"'hazard_policy' must be a string", id="int-policy"),
    pytest.param(b'hazard_policy = "random"\n', r"'hazard_policy' is 'random'.*strict_fifo", id="unknown-policy"),
    pytest.param(b"name = 5\n", r"'name' must be a non-empty string", id="int-name"),
    pytest.param(b'name = ""\n', r"'name' must be a non-empty string", id="empty-name"),
    pytest.param(b"[[dispatch]]\nfixed_cycles = 1\n", r"unknown topology key 'dispatch'", id="array-of-tables"),
    pytest.param(b'source = "elsewhere"\n', r"unknown topology key 'source'", id="source-key"),
]


@pytest.mark.parametrize("content,pattern", TOML_CASES)
def test_bad_topology_file(tmp_path, content, pattern):
    path = tmp_path / "bad.toml"
    path.write_bytes(content)
    err = _raises(lambda: load_topology(path), ConfigError, pattern)
    assert "bad.toml" in str(err), "the message names the file"
    _raises(lambda: Simulator(str(path)), ConfigError, pattern)


def test_topology_path_that_is_a_directory(tmp_path):
    (tmp_path / "topo.toml").mkdir()
    _raises(lambda: load_topology(tmp_path / "topo.toml"), ConfigError, r"is a directory")
    _raises(lambda: load_topology(tmp_path), ConfigError, r"is a directory .*pass a \.toml file")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes")
def test_topology_path_that_is_a_pipe_does_not_block(tmp_path):
    fifo = tmp_path / "pipe.toml"
    os.mkfifo(fifo)
    _raises(lambda: load_topology(fifo), ConfigError, r"pipe\.toml.*not a regular file")


@pytest.mark.skipif(os.geteuid() == 0 if hasattr(os, "geteuid") else True, reason="root reads any file")
def test_unreadable_topology_file(tmp_path):
    path = tmp_path / "secret.toml"
    path.write_text("fixed_cycles = 1\n")
    path.chmod(0)
    _raises(lambda: load_topology(path), ConfigError, r"secret\.toml: cannot read")


def test_topology_file_is_read_again_after_an_edit(tmp_path):
    # nothing caches a parsed file: an edit within the same second is seen
    path = tmp_path / "t.toml"
    path.write_text("fixed_cycles = 1\n")
    assert load_topology(path).fixed_cycles == 1
    path.write_text("fixed_cycles = 2\n")
    assert load_topology(path).fixed_cycles == 2


# --- load_topology and Topology.replace ------------------------------------------------------------
def _replace(**kw):
    return lambda: load_topology().replace(**kw)


def _load(*args, **kw):
    return lambda: load_topology(*args, **kw)


CONFIG_CASES = [
    pytest.param(_load(123), r"topology must be a name.*got 123 \(a int\)", id="int-topology"),
    pytest.param(_load(["ahbm-pe-v1"]), r"got \['ahbm-pe-v1'\] \(a list\)", id="list-topology"),
    pytest.param(_load(b"ahbm-pe-v1"), r"\(a bytes\)", id="bytes-topology"),
    pytest.param(_load(""), r"topology name is empty", id="empty-name"),
    pytest.param(_load("no-such-topology"), r"'no-such-topology' not found.*ahbm-pe-v1", id="unknown-name"),
    pytest.param(_load("ahbm-devce-v1"), r"ahbm-pe-v1 \(did you mean 'ahbm-device-v1'\?\); or pass a path",
                 id="misspelt-name"),
    pytest.param(_load("a\0b"), r"contains a NUL character", id="nul-in-name"),
    pytest.param(_load("x" * 5000), r"xxx\.\.\.: cannot read the topology file: File name too long",
                 id="name-too-long"),
    pytest.param(_load(fixed_cycles=10**19), r"'fixed_cycles' is 1\.000e\+19.*largest", id="fixed-1e19"),
    pytest.param(_load(fixed_cycles=2**32 + 1), r"'fixed_cycles' is 4294967297", id="fixed-just-over"),
    pytest.param(_load(fixed_cycles=1e300), r"'fixed_cycles' is 1\.000e\+300", id="fixed-huge-float"),
    pytest.param(_load(tcm_bytes=2**42), r"'tcm_bytes'.*1073741824", id="tcm-4TiB"),
    pytest.param(_load(clock_ghz=1e9), r"'clock_ghz'.*between", id="clock-1e9"),
    pytest.param(_load(clock_ghz=True), r"'clock_ghz' must be a finite number, got True", id="clock-bool"),
    pytest.param(_load(r_cycles_per_byte=float("inf")), r"'r_cycles_per_byte' must be a finite", id="r-inf"),
    pytest.param(_load(r_cycles_per_byte="0.1"), r"'r_cycles_per_byte'.*the string '0.1'", id="r-string"),
    pytest.param(_load(fixed_cycles="40"), r"'fixed_cycles'.*the string '40'", id="fixed-string"),
    pytest.param(_load(fixed_cycles=None), r"'fixed_cycles'.*None \(a NoneType\)", id="fixed-none"),
    pytest.param(_load(fixed_cycles=np.float64(1.5)), r"'fixed_cycles'.*1\.5", id="fixed-numpy-fraction"),
    pytest.param(_load(hazard_policy=5), r"'hazard_policy' must be a string, got 5", id="policy-int"),
    pytest.param(_load(hazard_policy=None), r"'hazard_policy' must be a string", id="policy-none"),
    pytest.param(_load(name=None), r"'name' must be a non-empty string", id="name-none"),
    pytest.param(_load(fixed_cycle=80), r"'fixed_cycle'.*Did you mean 'fixed_cycles'", id="typo-key"),
    pytest.param(_replace(cmd_queue_depth=0), r"'cmd_queue_depth' is 0", id="replace-queue-0"),
    pytest.param(_replace(math_cost_exp=-3), r"'math_cost_exp' is -3", id="replace-negative"),
    pytest.param(_replace(tile_n=2**40), r"'tile_n' is 1099511627776", id="replace-huge-tile"),
    pytest.param(_replace(source="x"), r"unknown topology key 'source'", id="replace-source"),
    pytest.param(_replace(dma_channelz=2), r"unknown topology key 'dma_channelz'", id="replace-unknown"),
]


@pytest.mark.parametrize("action,pattern", CONFIG_CASES)
def test_bad_topology_argument(action, pattern):
    _raises(action, ConfigError, pattern)


def test_bounds_are_inclusive_and_generous():
    topo = load_topology(fixed_cycles=2**32, tcm_bytes=2**30, clock_ghz=1e-3, r_cycles_per_byte=1e6)
    assert (topo.fixed_cycles, topo.tcm_bytes) == (2**32, 2**30)
    assert load_topology(fixed_cycles=np.int64(7), clock_ghz=np.float32(2.0)).fixed_cycles == 7


# --- Simulator ------------------------------------------------------------------------------------
SIMULATOR_CASES = [
    pytest.param(dict(topology=123), ConfigError, r"got 123 \(a int\)", id="int-topology"),
    pytest.param(dict(topology=[1, 2]), ConfigError, r"\(a list\)", id="list-topology"),
    pytest.param(dict(topology={"fixed_cycles": 1}), ConfigError, r"\(a dict\)", id="dict-topology"),
    pytest.param(dict(mode="fast"), ValidationError, r"mode 'fast'", id="mode-fast"),
    pytest.param(dict(mode=None), ValidationError, r"mode None", id="mode-none"),
    pytest.param(dict(fixed_cycles=10**19), ConfigError, r"'fixed_cycles'", id="fixed-1e19"),
    # a 4 TiB TCM would be allocated (and fail with MemoryError) in data mode: refused at load time
    pytest.param(dict(tcm_bytes=2**42), ConfigError, r"'tcm_bytes'.*1073741824", id="tcm-4TiB-data"),
    pytest.param(dict(tcm_bytes=2**42, mode="timing"), ConfigError, r"'tcm_bytes'", id="tcm-4TiB-timing"),
]


@pytest.mark.parametrize("kwargs,exc_type,pattern", SIMULATOR_CASES)
def test_bad_simulator_argument(kwargs, exc_type, pattern):
    _raises(lambda: Simulator(**kwargs), exc_type, pattern)


# --- decode.run / compare / sweep ------------------------------------------------------------------
def _run(*args, **kw):
    kw.setdefault("kv_len", 256)
    return lambda: decode.run(*(args or ("opt2",)), **kw)


def _compare(**kw):
    kw.setdefault("kv_len", 256)
    return lambda: decode.compare(**kw)


def _sweep(**kw):
    kw.setdefault("progress", False)
    return lambda: decode.sweep(**kw)


_Q, _KV = np.zeros((8, 64), np.float32), np.zeros((128, 64), np.float32)

DECODE_CASES = [
    pytest.param(_run(seed=-1), ValidationError, r"seed must be a non-negative int, got -1", id="seed-negative"),
    pytest.param(_run(seed=1.5), ValidationError, r"seed .* got 1\.5 \(float\)", id="seed-float"),
    pytest.param(_run(seed="0"), ValidationError, r"seed .* got '0' \(str\)", id="seed-string"),
    pytest.param(_run(seed=True), ValidationError, r"seed .* got True \(bool\)", id="seed-bool"),
    pytest.param(_run(seed=None), ValidationError, r"seed .* got None", id="seed-none"),
    pytest.param(_run(mode="fast"), ValidationError, r"mode 'fast' is unknown", id="mode-fast"),
    pytest.param(_run(mode=0), ValidationError, r"mode 0 is unknown", id="mode-int"),
    pytest.param(_run("opt4"), ValidationError, r"variant 'opt4' is unknown.*opt2, opt3", id="variant-unknown"),
    pytest.param(_run(None), ValidationError, r"variant None is unknown", id="variant-none"),
    pytest.param(_run(["opt2"]), ValidationError, r"variant \['opt2'\]", id="variant-list"),
    pytest.param(_run(dtype="int8"), ValidationError, r"dtype 'int8' is not supported", id="dtype-int8"),
    pytest.param(_run(dtype=5), ValidationError, r"dtype 5", id="dtype-int"),
    pytest.param(_run(topology=123), ConfigError, r"topology must be a name.*\(a int\)", id="topology-int"),
    pytest.param(_run(topology=3.5), ConfigError, r"\(a float\)", id="topology-float"),
    pytest.param(_run(kv_len=0), ValidationError, r"kv_len must be a positive int, got 0", id="kv-zero"),
    pytest.param(_run(kv_len=-128), ValidationError, r"kv_len .* got -128", id="kv-negative"),
    pytest.param(_run(kv_len=256.0), ValidationError, r"kv_len .* got 256\.0 \(float\)", id="kv-float"),
    pytest.param(_run(kv_len="256"), ValidationError, r"kv_len .* got '256' \(str\)", id="kv-string"),
    pytest.param(_run(kv_len=True), ValidationError, r"kv_len .* got True", id="kv-bool"),
    pytest.param(_run(tile=0), ValidationError, r"tile must be a positive int, got 0", id="tile-zero"),
    pytest.param(_run(tile=-4), ValidationError, r"tile .* got -4", id="tile-negative"),
    pytest.param(_run(group=0), ValidationError, r"group .* got 0", id="group-zero"),
    pytest.param(_run(head_dim=0), ValidationError, r"head_dim .* got 0", id="head-dim-zero"),
    pytest.param(_run(kv_len=1000), ValidationError, r"kv_len 1000 is not a multiple of tile 128", id="kv-ragged"),
    pytest.param(_run(kv_len=2**40, mode="timing"), ValidationError,
                 r"8589934592 tiles; one run simulates at most 262144", id="kv-2**40-timing"),
    pytest.param(_run(kv_len=2**40, mode="data"), ValidationError, r"8589934592 tiles", id="kv-2**40-data"),
    pytest.param(_run(kv_len=2**25), ValidationError, r"kv_len=33554432.*32\.0 GiB.*4\.0 GiB limit",
                 id="kv-32M-data"),
    pytest.param(_run(group=2**40), ValidationError, r"group=1099511627776.*512\.0 TiB", id="group-2**40-data"),
    pytest.param(_run(head_dim=2**40), ValidationError, r"head_dim=1099511627776.*TiB", id="head-dim-2**40-data"),
    pytest.param(_run(fixed_cycles=10**19, mode="timing"), ConfigError, r"'fixed_cycles'", id="fixed-1e19"),
    pytest.param(_run(fixed_cycle=1), ConfigError, r"Did you mean 'fixed_cycles'", id="override-typo"),
    pytest.param(_run(q=_Q), ValidationError, r"pass all of q, k and v", id="q-only"),
    pytest.param(_run(q=np.array([[object()]]), k=_KV, v=_KV), ValidationError, r"q must hold real numbers.*object",
                 id="q-object"),
    pytest.param(_run(q=_Q + 1j, k=_KV, v=_KV), ValidationError, r"q must hold real numbers.*complex", id="q-complex"),
    pytest.param(_run(q=_Q, k=[[1, 2], [3]], v=_KV), ValidationError, r"k is not an array of numbers", id="k-ragged"),
    pytest.param(_run(q=_Q, k=_KV.astype(str), v=_KV), ValidationError, r"k must hold real numbers", id="k-strings"),
    pytest.param(_compare(seed=-1), ValidationError, r"seed must be a non-negative int", id="compare-seed"),
    pytest.param(_compare(mode="fast"), ValidationError, r"mode 'fast'", id="compare-mode"),
    pytest.param(_compare(fixed_cycles=-1), ConfigError, r"'fixed_cycles' is -1", id="compare-fixed-negative"),
    pytest.param(_compare(r_cycles_per_byte="0"), ConfigError, r"'r_cycles_per_byte'.*string", id="compare-r-str"),
    pytest.param(_sweep(kv_len="abc"), ValidationError, r"axis 'kv_len' takes positive ints, got 'abc'",
                 id="sweep-kv-string"),
    pytest.param(_sweep(kv_len=[256, None]), ValidationError, r"axis 'kv_len'.*None", id="sweep-kv-none"),
    pytest.param(_sweep(tile=[128, 0]), ValidationError, r"axis 'tile'.*got 0", id="sweep-tile-zero"),
    pytest.param(_sweep(kv_len=[]), ValidationError, r"axis 'kv_len' has no values", id="sweep-empty-axis"),
    pytest.param(_sweep(dtype=["bf16", 5]), ValidationError, r"axis 'dtype'.*dtype 5", id="sweep-dtype"),
    pytest.param(_sweep(fixed_cycles=[0, "40"]), ConfigError, r"axis 'fixed_cycles'.*string '40'", id="sweep-fixed-str"),
    pytest.param(_sweep(hazard_policy=["rw_aware", 5]), ConfigError, r"axis 'hazard_policy'", id="sweep-policy"),
    pytest.param(_sweep(kv_len=[256, 1000]), ValidationError, r"sweep: kv_len 1000 is not a multiple of tile 128",
                 id="sweep-ragged-point"),
    pytest.param(_sweep(kv_len=[256], variants="opt2"), ValidationError, r"variants must be a non-empty list",
                 id="sweep-variants-string"),
    pytest.param(_sweep(kv_len=[256], variants=("opt2", "opt9")), ValidationError, r"variant 'opt9'",
                 id="sweep-variant-unknown"),
    pytest.param(_sweep(kv_len=[256], mode="fast"), ValidationError, r"sweep: mode 'fast'", id="sweep-mode"),
    pytest.param(_sweep(kv_len=[256], seqlen=[1]), ValidationError, r"unknown axis seqlen", id="sweep-unknown-axis"),
    pytest.param(_sweep(kv_len=[256], progress="no"), ValidationError, r"sweep: progress='no'; pass True \(a "
                 r"progress bar on stderr\) or False", id="sweep-progress-string"),
    pytest.param(_sweep(kv_len=[256], topology=123), ConfigError, r"\(a int\)", id="sweep-topology"),
    pytest.param(_sweep(kv_len=[256], client="not an address"), ValidationError,
                 r"client='not an address' is not a Dask scheduler address \(missing port number.*tcp://",
                 id="sweep-client-not-an-address"),
    pytest.param(_sweep(kv_len=[256], client="tcp://localhost"), ValidationError,
                 r"client='tcp://localhost' is not a Dask scheduler address", id="sweep-client-no-port"),
    pytest.param(_sweep(kv_len=[256], client=3.5), ValidationError, r"client must be a distributed\.Client or a "
                 r"scheduler address string, got 3\.5", id="sweep-client-float"),
    pytest.param(_sweep(kv_len=[256], resume=True), ValidationError, r"sweep: resume=True continues the sweep "
                 r"recorded in out=, but no out= is given", id="sweep-resume-without-out"),
    pytest.param(lambda: kbwork.analysis.gate(float("nan"), 1), ValidationError, r"gate: candidate_cycles=nan is not a "
                 r"number", id="gate-nan"),
    pytest.param(_run(q=np.full((8, 64), 1e5), k=_KV, v=_KV, dtype="fp16"), ValidationError,
                 r"decode\.run: q holds values up to 1e\+05, which overflow fp16 \(largest finite 6\.55e\+04\)",
                 id="run-input-overflows-dtype"),
]


@pytest.mark.parametrize("action,exc_type,pattern", DECODE_CASES)
def test_bad_decode_argument(action, exc_type, pattern, monkeypatch):
    # every check happens before anything is simulated
    monkeypatch.setattr(decode.Simulator, "run", lambda *a, **k: pytest.fail("simulated before checking"))
    _raises(action, exc_type, pattern)


def test_a_bad_client_is_refused_before_the_out_file_is_written(tmp_path):
    _raises(_sweep(kv_len=[256], client="not an address", out=tmp_path / "s.csv"), ValidationError, "not a Dask")
    assert list(tmp_path.iterdir()) == []


def test_sweep_checks_every_point_before_the_first_runs(monkeypatch):
    calls = []
    monkeypatch.setattr(decode, "run", lambda *a, **k: calls.append(k))
    with pytest.raises(ValidationError, match="1000"):
        decode.sweep(kv_len=[256, 512, 1000], progress=False)
    assert calls == []


def test_good_seeds_and_sizes_still_work():
    a = decode.run("opt2", kv_len=256, seed=np.int64(3))
    b = decode.run("opt2", kv_len=256, seed=3)
    assert a.params["seed"] == 3 and np.array_equal(a.O, b.O)
    assert decode.run("opt2", kv_len=np.int32(256), mode="timing").n_tiles == 2


def test_to_npz_of_a_timing_run():
    r = decode.run("opt2", kv_len=256, mode="timing")
    _raises(lambda: r.to_npz("x.npz"), ValidationError, r"timing-mode run has no numbers.*mode='data'")


# --- analysis.what_if and decode.what_if ---------------------------------------------------------------
BAD_WHAT_IF_RUN = Simulator(mode="timing").run(lambda tl: tl.full((1, 1), 0.0, name="x"))
WHAT_IF_CASES = [
    pytest.param(dict(speedup=2**70), r"speedup=1180591620717411303424 is out of range; pass a real number from "
                 r"0\.001 to 1e\+06", id="speedup-2**70"),
    pytest.param(dict(speedup=7e-15), r"speedup=7e-15 is out of range", id="speedup-7e-15"),
    pytest.param(dict(speedup=1e-300), r"speedup=1e-300 is out of range", id="speedup-1e-300"),
    pytest.param(dict(speedup=0), r"speedup=0 is not positive", id="speedup-zero"),
    pytest.param(dict(speedup=-2), r"speedup=-2 is not positive", id="speedup-negative"),
    pytest.param(dict(speedup=float("nan")), r"speedup=nan is not finite", id="speedup-nan"),
    pytest.param(dict(speedup=np.float32("inf")), r"speedup=np\.float32\(inf\) is not finite", id="speedup-inf32"),
    pytest.param(dict(speedup="2"), r"speedup='2' is a str, not a real number", id="speedup-string"),
    pytest.param(dict(speedup=None), r"speedup=None is a NoneType", id="speedup-none"),
    pytest.param(dict(speedup=True), r"speedup=True is a bool", id="speedup-bool"),
    pytest.param(dict(speedup=2 + 0j), r"speedup=\(2\+0j\) is a complex", id="speedup-complex"),
    pytest.param(dict(engine=5), r"engine=5; pass an engine name \(PE_CPU, .*\), a non-empty list", id="engine-int"),
    pytest.param(dict(engine=[5]), r"unknown engine 5; use one of PE_CPU", id="engine-list-of-int"),
    pytest.param(dict(engine=[]), r"engine=\[\]; pass an engine name", id="engine-empty"),
    pytest.param(dict(engine={"PE_DMA": 1}), r"engine=\{'PE_DMA': 1\}; pass an engine name", id="engine-dict"),
    pytest.param(dict(engine="PE_DMA1"), r"'PE_DMA1' is a channel; name its engine", id="engine-channel"),
]


@pytest.mark.parametrize("kwargs,pattern", WHAT_IF_CASES)
def test_bad_what_if_argument(kwargs, pattern, monkeypatch):
    from kbwork import analysis

    # decode.what_if from parameters: nothing may be simulated before the arguments are checked
    monkeypatch.setattr(decode, "run", lambda *a, **k: pytest.fail("ran before checking"))
    _raises(lambda: decode.what_if(dict(variant="opt2", kv_len=256), **kwargs), ValidationError, pattern)
    # analysis.what_if of a run: nothing re-simulated, and the same message
    run = BAD_WHAT_IF_RUN
    monkeypatch.setattr(type(run), "rescaled", lambda *a, **k: pytest.fail("re-simulated before checking"))
    _raises(lambda: analysis.what_if(run, **kwargs), ValidationError, pattern)


def test_what_if_takes_every_real_number_type_exactly():
    from decimal import Decimal
    from fractions import Fraction

    from kbwork import analysis

    r = decode.run("opt2", kv_len=256, mode="timing")
    two, half = analysis.what_if(r, speedup=2), analysis.what_if(r, speedup=1.5)
    for same in (2.0, np.float32(2), np.float16(2), np.int64(2), np.uint8(2), Fraction(2), Decimal(2)):
        assert analysis.what_if(r, speedup=same).equals(two), repr(same)
    for same in (Fraction(3, 2), np.float32(1.5), Decimal("1.5")):
        assert analysis.what_if(r, speedup=same).equals(half), repr(same)
    # read as written: np.float32(0.1) is 1/10, not the binary float32 nearest it
    assert analysis.what_if(r, speedup=np.float32(0.1)).equals(analysis.what_if(r, speedup=Fraction(1, 10)))
    assert list(analysis.what_if(r, engine=np.array(["PE_DMA"])).engine) == ["PE_DMA"]
    assert (two.cycles < two.baseline_cycles).any() and (half.cycles >= two.cycles).all()


# --- the calibration panel ------------------------------------------------------------------------------
PANEL_CASES = [
    pytest.param(dict(fixed=40.7), r"FIXED .*whole number of cycles >= 0; got 40\.7, which is not a whole number",
                 id="fixed-40.7"),
    pytest.param(dict(fixed=-0.5), r"FIXED .*got -0\.5", id="fixed-minus-half"),
    pytest.param(dict(fixed=-1), r"FIXED .*got -1\b", id="fixed-negative"),
    pytest.param(dict(fixed=float("nan")), r"FIXED .*got nan", id="fixed-nan"),
    pytest.param(dict(fixed=float("inf")), r"FIXED .*got inf", id="fixed-inf"),
    pytest.param(dict(fixed=-float("inf")), r"FIXED .*got -inf", id="fixed-minus-inf"),
    pytest.param(dict(fixed=np.float32(2.5)), r"FIXED .*got np\.float32\(2\.5\)", id="panel-fixed-numpy-fraction"),
    pytest.param(dict(fixed="40"), r"FIXED .*got '40' \(str\)", id="fixed-string"),
    pytest.param(dict(fixed=None), r"FIXED .*got None", id="fixed-none"),
    pytest.param(dict(r="0.1"), r"r must be a number, got '0\.1'", id="r-string"),
    pytest.param(dict(tile=0), r"tile must be a positive int, got 0", id="tile-zero"),
    pytest.param(dict(fixd=3), r"unknown control\(s\) \['fixd'\]", id="unknown-control"),
]


@pytest.fixture(scope="module")
def panel():
    from kbwork.widgets import CalibrationPanel

    return CalibrationPanel(kv_len=512, draw=False)


@pytest.mark.parametrize("changes,pattern", PANEL_CASES)
def test_bad_panel_setting(changes, pattern, panel):
    before = panel.setting_text()
    _raises(lambda: panel.update(**changes), ValidationError, pattern)
    assert panel.setting_text() == before, "the text shows what was last simulated"
    if "fixd" not in changes:  # from a widget: the panel shows the message, nothing is raised
        panel._apply(changes)
        assert re.search(pattern, panel.error) and "bug in kbwork" not in panel.error


# --- resuming a sweep from its file ----------------------------------------------------------------------
# Each row damages a good sweep file (kv_len 256 and 512, opt2 and opt3: a header and four rows) or its
# .meta.json record, or resumes it under other settings; the resume must refuse, naming what is wrong,
# before anything is simulated and without touching the file.
RESUME_AXES = dict(kv_len=[256, 512])


def _line(n, edit):
    """A mutation of line ``n`` (0 is the header) of the CSV."""
    def mutate(lines, meta):
        lines[n] = edit(lines[n])
        return lines, meta
    return mutate


def _field(n, column, value):
    def edit(line):
        fields = line.split(",")
        fields[["point", "kv_len", "variant", "cycles", "us", "dispatch_per_tile", "dispatch_total", "commands",
                "stages", "n_tiles"].index(column)] = value
        return ",".join(fields)
    return _line(n, edit)


def _meta(edit):
    def mutate(lines, meta):
        return lines, edit(meta)
    return mutate


def _same(lines, meta):
    return lines, meta


RESUME_CASES = [
    pytest.param(_field(2, "cycles", "banana"), {}, r"line 3: cycles is 'banana', not a whole number >= 1.*Remove "
                 r"that line", id="cycles-banana"),
    pytest.param(_line(3, lambda line: ",".join(line.split(",")[:6])), {}, r"line 4 has 6 fields, not 10",
                 id="row-cut-to-6-fields"),
    pytest.param(_field(1, "point", ""), {}, r"line 2: point is '', not a whole number", id="empty-point"),
    pytest.param(_field(1, "point", "7"), {}, r"line 2: point is '7', not a point index of this sweep \(0 to 1\)",
                 id="point-out-of-range"),
    pytest.param(_field(1, "point", "-1"), {}, r"line 2: point is '-1', not a whole number", id="point-negative"),
    pytest.param(_field(1, "cycles", "-5"), {}, r"line 2: cycles is '-5'", id="cycles-negative"),
    pytest.param(_field(1, "cycles", "6406.5"), {}, r"line 2: cycles is '6406\.5'", id="cycles-fraction"),
    pytest.param(_field(1, "us", "nan"), {}, r"line 2: us is 'nan', not cycles 6406 in microseconds", id="us-nan"),
    # us a number but not cycles at the clock: computed again with a warning (tests/test_sweep_engine.py)
    pytest.param(_field(1, "kv_len", "512"), {}, r"line 2: kv_len is '512', not point 0's kv_len 256",
                 id="axis-not-the-point"),
    pytest.param(_field(1, "variant", "opt9"), {}, r"line 2: variant is 'opt9', not one of this sweep's variants",
                 id="variant-unknown"),
    pytest.param(_field(1, "n_tiles", "3"), {}, r"line 2: n_tiles is '3', not point 0's kv_len / tile = 2",
                 id="n-tiles-wrong"),
    pytest.param(_line(2, lambda line: line.replace("opt3", "opt2", 1)), {}, r"line 3 repeats point 0's opt2 row of "
                 r"line 2", id="duplicate-row"),
    pytest.param(_line(0, lambda line: line.replace("cycles", "cycle")), {}, r"its columns .* are not this sweep's",
                 id="header-changed"),
    pytest.param(lambda lines, meta: ([lines[0], b"\xff\xfe" + lines[1].encode(), *lines[2:]], meta), {},
                 r"it is not UTF-8 text \(byte \d+ is 0x", id="not-utf8"),
    pytest.param(lambda lines, meta: (lines, None), {}, r"there is no s\.csv\.meta\.json beside it", id="no-record"),
    pytest.param(lambda lines, meta: (lines, "{not json"), {}, r"its record s\.csv\.meta\.json is not valid JSON",
                 id="record-not-json"),
    pytest.param(_meta(lambda m: [m]), {}, r"s\.csv\.meta\.json is not a kbwork sweep record", id="record-a-list"),
    pytest.param(_meta(lambda m: {**m, "schema": 0}), {}, r"sweep schema 0 .* this kbwork's is 1", id="other-schema"),
    pytest.param(_same, dict(topology=load_topology(dma_base_cycles=1000)), r"another sweep wrote it .*topology "
                 r"dma_base_cycles is 200 there, 1000 here", id="other-topology"),
    pytest.param(_same, dict(mode="data"), r"mode 'timing' there, 'data' here", id="other-mode"),
    pytest.param(_same, dict(kv_len=[256, 1024]), r"axis 'kv_len' is \[256, 512\] there, \[256, 1024\] here",
                 id="other-axis-values"),
    pytest.param(_same, dict(tile=[128]), r"axes \(kv_len\) there, \(kv_len, tile\) here", id="other-axes"),
    pytest.param(_same, dict(variants=("opt2",)), r"variants opt2, opt3 there, opt2 here \(without opt3",
                 id="fewer-variants"),
    pytest.param(_same, dict(attribution=True), r"attribution=False there, True here", id="other-attribution"),
]


@pytest.fixture(scope="module")
def good_sweep(tmp_path_factory):
    path = tmp_path_factory.mktemp("sweep") / "s.csv"
    decode.sweep(out=path, workers=1, progress=False, **RESUME_AXES)
    return path.read_text(), Path(f"{path}.meta.json").read_text()


@pytest.mark.parametrize("mutate,kwargs,pattern", RESUME_CASES)
def test_a_resume_refuses_a_damaged_or_foreign_file(mutate, kwargs, pattern, good_sweep, tmp_path, monkeypatch):
    import json

    text, meta_text = good_sweep
    lines, meta = mutate(text.splitlines(), json.loads(meta_text))
    path, record = tmp_path / "s.csv", tmp_path / "s.csv.meta.json"
    path.write_bytes(b"".join((line if isinstance(line, bytes) else line.encode()) + b"\n" for line in lines))
    if meta is not None:
        record.write_text(meta if isinstance(meta, str) else json.dumps(meta))
    before = (path.read_bytes(), record.read_bytes() if record.exists() else None)
    monkeypatch.setattr(decode, "_sweep_point", lambda task: pytest.fail("simulated before refusing"))
    _raises(lambda: decode.sweep(out=path, resume=True, workers=1, progress=False, **{**RESUME_AXES, **kwargs}),
            ValidationError, pattern)
    assert (path.read_bytes(), record.read_bytes() if record.exists() else None) == before, "the file was changed"


# --- the command line ------------------------------------------------------------------------------
def _cli(argv, capsys):
    """Run ``kbwork argv`` in-process: (exit status, stdout, stderr)."""
    try:
        code = cli_main(list(argv))
    except SystemExit as exc:  # argparse's own errors
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


RUN = ["run", "--variant", "opt2", "--kv-len", "256"]
CMP = ["compare", "--kv-len", "256"]

CLI_CASES = [
    pytest.param(RUN + ["--oplog", "{tmp}/missing/log.csv"], r"--oplog: the directory .*missing.* does not exist",
                 id="oplog-missing-dir"),
    pytest.param(RUN + ["--oplog", "{tmp}"], r"--oplog: .* is a directory", id="oplog-is-dir"),
    pytest.param(RUN + ["--oplog", "{tmp}/log.txt"], r"--oplog: .*log\.txt' does not end in \.csv", id="oplog-suffix"),
    pytest.param(RUN + ["--oplog", "x" * 300 + ".csv"], r"--oplog: cannot use 'xxx.*\.\.\.': File name too long",
                 id="oplog-name-too-long"),
    pytest.param(RUN + ["--oplog", ""], r"argument --oplog: expected a file path, got ''", id="oplog-empty"),
    pytest.param(RUN + ["--oplog", "."], r"--oplog: '\.' is not a file name", id="oplog-dot"),
    pytest.param(RUN + ["--oplog", "{tmp}/afile/log.csv"], r"--oplog: .*afile' in .* is not a directory",
                 id="oplog-parent-is-file"),
    pytest.param(RUN + ["--npz", "{tmp}/x.txt"], r"--npz: .*x\.txt' does not end in \.npz", id="npz-suffix"),
    pytest.param(RUN + ["--npz", "{tmp}/x.npz", "--mode", "timing"], r"--npz needs --mode data", id="npz-timing"),
    pytest.param(RUN + ["--trace", "{tmp}/t.csv"], r"--trace: .* does not end in \.json", id="trace-suffix"),
    pytest.param(RUN + ["--trace", "{tmp}/nope/t.json"], r"--trace: the directory", id="trace-missing-dir"),
    pytest.param(RUN + ["--gantt", "{tmp}/g.jpg"], r"--gantt: .* does not end in \.png", id="run-gantt-suffix"),
    pytest.param(CMP + ["--gantt", "{tmp}/none/g.png"], r"--gantt: the directory", id="compare-gantt-dir"),
    pytest.param(CMP + ["--gantt", "{tmp}/g.svg"], r"--gantt: .* does not end in \.png", id="compare-gantt-suffix"),
    pytest.param(CMP + ["--seed", "-1"], r"argument --seed: expected a non-negative integer, got -1", id="seed-negative"),
    pytest.param(CMP + ["--seed", "x"], r"argument --seed: .*got 'x'", id="seed-text"),
    pytest.param(CMP + ["--gantt-tiles", "0"], r"argument --gantt-tiles: expected a positive integer, got 0",
                 id="gantt-tiles-zero"),
    pytest.param(["compare", "--kv-len", "0"], r"argument --kv-len: expected a positive integer, got 0", id="kv-zero"),
    pytest.param(["compare", "--kv-len", "abc"], r"argument --kv-len: .*'abc'", id="kv-text"),
    pytest.param(["compare", "--kv-len", "1000"], r"--kv-len 1000 is not a multiple of tile 128 \(--tile\)",
                 id="kv-ragged"),
    pytest.param(["compare", "--tile", "-5"], r"argument --tile: .*got -5", id="tile-negative"),
    pytest.param(CMP + ["--group", "0"], r"argument --group", id="group-zero"),
    pytest.param(CMP + ["--head-dim", "-1"], r"argument --head-dim", id="head-dim-negative"),
    pytest.param(CMP + ["--fixed", "-1"], r"argument --fixed: expected an integer between 0 and 4294967296",
                 id="fixed-negative"),
    pytest.param(CMP + ["--fixed", "10000000000000000000"], r"argument --fixed: .*got 10000000000000000000",
                 id="fixed-huge"),
    pytest.param(CMP + ["--r", "nan"], r"argument --r: .*got 'nan'", id="r-nan"),
    pytest.param(CMP + ["--r", "-0.5"], r"argument --r: .*got '-0.5'", id="r-negative"),
    pytest.param(CMP + ["--r", "1e300"], r"argument --r: expected a number between 0 and 1e\+06", id="r-huge"),
    pytest.param(CMP + ["--dtype", "int8"], r"argument --dtype: invalid choice: 'int8'", id="dtype"),
    pytest.param(CMP + ["--mode", "fast"], r"argument --mode: invalid choice: 'fast'", id="mode"),
    pytest.param(CMP + ["--hazard-policy", "fifo"], r"argument --hazard-policy: invalid choice", id="policy"),
    pytest.param(CMP + ["--topology", "nope"], r"kbwork: error: topology 'nope' not found", id="topology-unknown"),
    pytest.param(CMP + ["--topology", "{tmp}"], r"kbwork: error: topology .* is a directory", id="topology-dir"),
    pytest.param(CMP + ["--topology", "{tmp}/bad.toml"], r"bad\.toml: not a UTF-8", id="topology-not-utf8"),
    pytest.param(["compare", "--kv-len", str(2**40), "--mode", "timing"], r"8589934592 tiles", id="kv-2**40"),
    pytest.param(["compare", "--kv-len", str(2**25)], r"32\.0 GiB .*use mode='timing'", id="kv-32M-data"),
    pytest.param(["run", "--variant", "opt4"], r"argument --variant: invalid choice: 'opt4'", id="variant"),
    pytest.param(["run"], r"the following arguments are required: --variant", id="variant-missing"),
    pytest.param(["frobnicate"], r"invalid choice: 'frobnicate'", id="unknown-command"),
    pytest.param([], r"the following arguments are required: command", id="no-command"),
    pytest.param(["golden"], r"one of the arguments --check --update is required", id="golden-no-action"),
    pytest.param(RUN + ["--oplog", "/proc/x.csv"], r"--oplog: .*'/proc'", id="oplog-in-proc",
                 marks=pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs /proc")),
    pytest.param(RUN + ["--head-dim", "100000"], r"TCM overflow allocating 'Q'.* On the command line: --set "
                 r"tcm_bytes=8388608 \(now 1048576\)", id="tcm-overflow-data"),
    pytest.param(RUN + ["--head-dim", "100000", "--mode", "timing", "--set", "tcm_bytes=4194304"],
                 r"TCM overflow allocating 'O'.*--set tcm_bytes=8388608 \(now 4194304\)", id="tcm-overflow-timing"),
    pytest.param(CMP + ["--head-dim", "100000000", "--mode", "timing"], r"No TCM kbwork allows is large enough.*"
                 r"tcm_bytes=1073741824", id="tcm-overflow-beyond-any"),
    pytest.param(CMP + ["--set", "tcm_byte=3"], r"--set tcm_byte=3: unknown topology key 'tcm_byte'.*Did you mean "
                 r"'tcm_bytes'", id="set-unknown-key"),
    pytest.param(CMP + ["--set", "tcm_bytes=2.5"], r"--set tcm_bytes=2\.5: tcm_bytes takes a whole number",
                 id="set-fraction-for-int"),
    pytest.param(CMP + ["--set", "clock_ghz=fast"], r"--set clock_ghz=fast: clock_ghz takes a number", id="set-text"),
    pytest.param(CMP + ["--set", "dma_channels=0"], r"--set dma_channels=0: topology key 'dma_channels' is 0",
                 id="set-zero"),
    pytest.param(CMP + ["--set", "hazard_policy=fifo"], r"--set hazard_policy=fifo: .*'fifo'; use one of",
                 id="set-policy"),
    pytest.param(CMP + ["--set", "dma_channels"], r"argument --set: expected key=value", id="set-no-value"),
    pytest.param(CMP + ["--set", "fixed_cycles=3", "--fixed", "4"], r"fixed_cycles is already set by --fixed 4",
                 id="set-and-flag"),
    pytest.param(CMP + ["--set", "tile_k=64", "--set", "tile_k=32"], r"--set tile_k=32: tile_k is already set by "
                 r"--set tile_k=64", id="set-twice"),
    pytest.param(CMP + ["--kv_len", "256"], r"unrecognized arguments: --kv_len 256 \(did you mean --kv-len\?\)",
                 id="kv_len-underscore"),
    pytest.param(RUN + ["--varaint", "opt3"], r"did you mean --variant\?", id="misspelt-option"),
    pytest.param(CMP + ["--variants", "opt2,,opt3"], r"argument --variants: 'opt2,,opt3' has an empty entry",
                 id="variants-empty-entry"),
    pytest.param(CMP + ["--kv-len", "99999999999999999999"], r"--kv-len 99999999999999999999 is not a multiple of "
                 r"tile 128 \(--tile\), and the nearest multiple, 781250000000000000 tiles, is beyond the 262144 a run "
                 r"simulates; e\.g\. "
                 r"--kv-len 33554432", id="kv-huge-and-ragged"),
    pytest.param(RUN + ["--gantt-tiles", "2"], r"--gantt-tiles 2 needs --gantt", id="run-gantt-tiles-alone"),
    pytest.param(CMP + ["--gantt-tiles", "all"], r"--gantt-tiles all needs --gantt", id="compare-gantt-tiles-alone"),
]


@pytest.fixture
def cli_tmp(tmp_path):
    (tmp_path / "afile").write_text("not a directory")
    (tmp_path / "bad.toml").write_bytes(b"name = 'caf\xe9'\n")
    return tmp_path


@pytest.mark.parametrize("argv,pattern", CLI_CASES)
def test_bad_cli_invocation(argv, pattern, cli_tmp, capsys):
    argv = [a.replace("{tmp}", str(cli_tmp)) for a in argv]
    code, out, err = _cli(argv, capsys)
    assert code == 2, (code, err)
    assert re.search(pattern, err), f"{pattern!r} not in {err!r}"
    assert "Traceback" not in err + out
    assert len(err.splitlines()) <= 12, "a short message, not a dump"


# Output paths are checked before anything is simulated: a bad path fails in milliseconds.
FAIL_FAST_CASES = [
    pytest.param(RUN + ["--oplog", "{tmp}/missing/log.csv"], "run", id="run-oplog"),
    pytest.param(RUN + ["--npz", "{tmp}/x.txt"], "run", id="run-npz"),
    pytest.param(RUN + ["--trace", "{tmp}"], "run", id="run-trace"),
    pytest.param(RUN + ["--gantt", "{tmp}/g.pdf"], "run", id="run-gantt"),
    pytest.param(RUN + ["--npz", "{tmp}/x.npz", "--mode", "timing"], "run", id="run-npz-timing"),
    pytest.param(CMP + ["--gantt", "{tmp}/missing/g.png"], "compare", id="compare-gantt"),
    pytest.param(RUN + ["--oplog", "/proc/x.csv"], "run", id="run-oplog-in-proc",
                 marks=pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs /proc")),
    pytest.param(RUN + ["--gantt-tiles", "2"], "run", id="run-gantt-tiles-alone"),
    pytest.param(CMP + ["--set", "tcm_byte=3"], "compare", id="compare-set-unknown"),
]


@pytest.mark.parametrize("argv,entry", FAIL_FAST_CASES)
def test_cli_checks_outputs_before_simulating(argv, entry, tmp_path, capsys, monkeypatch):
    def simulated(*a, **k):
        raise AssertionError("simulated")

    monkeypatch.setattr(decode, entry, simulated)
    code, _, err = _cli([a.replace("{tmp}", str(tmp_path)) for a in argv], capsys)
    assert code == 2 and "kbwork: error:" in err and "simulated" not in err


def test_a_data_run_that_cannot_fit_the_tcm_is_refused_before_its_inputs_are_made(capsys, monkeypatch):
    monkeypatch.setattr(decode, "make_inputs", lambda *a, **k: pytest.fail("inputs made before the TCM check"))
    real, runs = decode.run, []
    monkeypatch.setattr(decode, "run", lambda *a, **k: runs.append(k) or real(*a, **k))
    code, _, err = _cli(["run", "--variant", "opt2", "--head-dim", "100000", "--kv-len", "2048"], capsys)
    assert code == 2 and "TCM overflow" in err and "--set tcm_bytes=8388608" in err
    assert runs and all(k["mode"] == "timing" and k["kv_len"] == 128 for k in runs)  # one-tile timing runs only
    # what the hint says to type is enough
    code, out, err = _cli(["run", "--variant", "opt2", "--head-dim", "100000", "--kv-len", "256", "--mode",
                           "timing", "--set", "tcm_bytes=8388608"], capsys)
    assert code == 0, err


def test_cli_write_failure_is_a_message_not_a_traceback(tmp_path, capsys, monkeypatch):
    def disk_full(self, path=None):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(decode.DecodeRun, "to_csv", disk_full)
    code, _, err = _cli(RUN + ["--mode", "timing", "--oplog", str(tmp_path / "log.csv")], capsys)
    assert code == 2
    assert "--oplog: could not write" in err and "No space left on device" in err
    assert "Traceback" not in err


BENCH_CASES = [
    pytest.param(["--kv-lens", "1000"], r"--kv-lens: kv_len 1000 is not a multiple of tile 128", id="kv-ragged"),
    pytest.param(["--kv-lens", "abc"], r"argument --kv-lens: expected comma-separated positive integers", id="kv-text"),
    pytest.param(["--kv-lens", "1024,0"], r"argument --kv-lens: expected positive integers, got 0", id="kv-zero"),
    pytest.param(["--kv-lens", str(2**40)], r"--kv-lens: .*8589934592 tiles", id="kv-huge"),
    pytest.param(["--modes", "fast"], r"argument --modes: unknown mode 'fast'", id="modes"),
    pytest.param(["--modes", "timing,"], r"argument --modes: unknown mode ''", id="modes-trailing-comma"),
    pytest.param(["--repeats", "0"], r"argument --repeats: expected a positive integer, got 0", id="repeats"),
    pytest.param(["--scales", "x"], r"argument --scales", id="scales-text"),
    pytest.param(["--suite", "gemm", "--scales", "1,0"], r"argument --scales: expected positive integers",
                 id="scales-zero"),
    pytest.param(["--suite", "gemm", "--scales", "1000"], r"--scales: 1000 is too large; at most 32",
                 id="scales-huge"),
    pytest.param(["--profile", "0"], r"argument --profile: expected a positive integer", id="profile-zero"),
    pytest.param(["--profile", "100"], r"--profile: kv_len 100 is not a multiple of tile 128", id="profile-ragged"),
    pytest.param(["--suite", "fast"], r"argument --suite: invalid choice", id="suite"),
    pytest.param(["--kv-lens", "256", "--no-refs", "--out", "{tmp}/afile"], r"--out .*afile' is a file",
                 id="out-is-file"),
    pytest.param(["--kv-lens", "256", "--no-refs", "--out", "{tmp}/afile/sub"], r"--out .*is not a writable directory",
                 id="out-under-file"),
    pytest.param(["--kv_lens", "256"], r"unrecognized arguments: --kv_lens 256 \(did you mean --kv-lens\?\)",
                 id="kv_lens-underscore"),
    pytest.param(["--suite", "device", "--before", "{tmp}/afile"], r"--before .*afile: no kbwork package there",
                 id="before-not-a-checkout"),
]


@pytest.mark.parametrize("argv,pattern", BENCH_CASES)
def test_bad_bench_invocation(argv, pattern, cli_tmp, capsys, monkeypatch):
    from kbwork import bench
    from kbwork.bench import gemm

    # nothing may be measured before the arguments are checked
    monkeypatch.setattr(bench, "run_decode_suite", lambda *a, **k: pytest.fail("measured before checking"))
    monkeypatch.setattr(bench, "profile_case", lambda *a, **k: pytest.fail("profiled before checking"))
    monkeypatch.setattr(gemm, "run_benchmark", lambda *a, **k: pytest.fail("measured before checking"))
    code, out, err = _cli(["bench"] + [a.replace("{tmp}", str(cli_tmp)) for a in argv], capsys)
    assert code == 2, (code, err)
    assert re.search(pattern, err), f"{pattern!r} not in {err!r}"
    assert "Traceback" not in err + out


def test_bench_with_a_kv_length_twice_measures_it_once_and_finishes(tmp_path, capsys, monkeypatch):
    import json

    from kbwork import bench

    # the suite's fixed large cases are not what this is about: stand-ins for them
    monkeypatch.setattr(bench, "MIN_SECONDS", 0.0)
    monkeypatch.setattr(bench, "compare_case", lambda kv, budget: {"kv_len": kv, "compare_ms": 1.0,
                                                                   "budget_ms": budget, "within_budget": True})
    monkeypatch.setattr(bench, "gantt_case", lambda: None)
    code, out, err = _cli(["bench", "--kv-lens", "128,128", "--modes", "timing", "--no-refs", "--out",
                           str(tmp_path)], capsys)
    assert code == 0, err
    assert "Traceback" not in err and "--kv-lens lists 128 more than once; each length is measured once" in err
    rows = json.loads((tmp_path / "decode.json").read_text())["rows"]
    assert [(r["variant"], r["kv_len"]) for r in rows] == [("opt2", 128), ("opt3", 128)]
    # the summary of rows that repeat a size (a caller of run_decode_suite may pass them) divides by no zero
    lines = bench.summarize({"rows": rows + rows, "compare": [], "gantt": None})
    assert any("time per tile" in line for line in lines)


def test_bench_steady_without_threadpoolctl_says_so_and_runs(tmp_path, capsys, monkeypatch):
    import json

    from kbwork.bench import steady

    monkeypatch.setitem(sys.modules, "threadpoolctl", None)  # as under the README's [test] install
    monkeypatch.setattr(steady, "steady_vs_full", lambda kv_lens: [])
    monkeypatch.setattr(steady, "compare_flatness", lambda kv: {"ratio_largest_to_smallest": 1.0})
    monkeypatch.setattr(steady, "sweep_scaling", lambda n, dask: {"points": n, "serial_s": 1.0,
                                                                  "local_processes_s": 1.0, "local_equal": True})
    monkeypatch.setattr(steady, "cold_start", lambda: dict.fromkeys(
        ("python_s", "import_kbwork_s", "first_compare_s", "first_compare_data_s"), 0.1))
    code, out, err = _cli(["bench", "--suite", "steady", "--no-dask", "--out", str(tmp_path)], capsys)
    assert code == 0, err
    assert "Traceback" not in err and "threadpoolctl is not installed" in err
    assert "BLAS threads were not capped" in out
    assert json.loads((tmp_path / "steady.json").read_text())["blas_one_thread"] is False


@pytest.mark.parametrize("argv,pattern", [
    (["run", "--variant", "opt2", "--kv-len", "256", "--npz", "x.txt"], r"--npz: 'x\.txt' does not end in \.npz"),
    (["compare", "--seed", "-1"], r"argument --seed"),
    (["compare", "--kv-len", "1000"], r"not a multiple of tile"),
    (["bench", "--modes", "fast"], r"unknown mode 'fast'"),
    (["compare", "--topology", "no-such"], r"topology 'no-such' not found"),
], ids=["npz-suffix", "seed", "kv-ragged", "bench-modes", "topology"])
def test_no_traceback_reaches_the_terminal(argv, pattern, tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO), MPLBACKEND="Agg")
    p = subprocess.run([sys.executable, "-m", "kbwork", *argv], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 2, p.stderr
    assert re.search(pattern, p.stderr), p.stderr
    assert "Traceback" not in p.stderr
    assert list(tmp_path.iterdir()) == [], "nothing written"


# --- the kernel language, host data and results ---------------------------------------------------------
def _kernel_case(body, mode: str = "data", **topo):
    """A run of ``body(tl, A, B, C)`` on a fresh simulator (A 8x16, B 16x8 fp32 in HBM, C 8x8 out)."""
    def go():
        sim = Simulator(mode=mode, **topo)
        A = sim.hbm("A", np.ones((8, 16), np.float32))
        B = sim.hbm("B", np.ones((16, 8), np.float32))
        C = sim.hbm("C", shape=(8, 8))
        return sim.run(lambda tl: body(tl, A, B, C))
    return go


def _merge_state(tl, m_shape=(8, 1)):
    return dict(s=tl.alloc((8, 16), name="s"), m=tl.alloc(m_shape, name="m"), l=tl.alloc((8, 1), name="l"),
                O=tl.alloc((8, 8), name="O"))


_OP = kbwork.OpSpec
KERNEL_CASES = [
    pytest.param(lambda tl, A, B, C: tl.composite(), r"op=None; use op='gemm' or op='math'", id="composite-no-op"),
    pytest.param(lambda tl, A, B, C: tl.composite(op=["gemm"]), r"op=\['gemm'\]", id="composite-op-list"),
    pytest.param(lambda tl, A, B, C: tl.composite(op="gemm", a="A", b=B, out=C), r"a= must be a tensor handle, got 'A'",
                 id="gemm-a-string"),
    pytest.param(lambda tl, A, B, C: tl.composite(op="gemm", a=A, b=A, out=C), r"shape mismatch: a=A .* b=A",
                 id="gemm-shapes"),
    pytest.param(lambda tl, A, B, C: tl.composite(op="gemm", a=A, b=B, out=C, trans_b="yes"),
                 r"trans_b must be True or False, got 'yes'", id="gemm-trans-b-string"),
    pytest.param(lambda tl, A, B, C: tl.composite(op="gemm", a=A, b=B), r"out= must be a tensor handle, got None",
                 id="gemm-no-out"),
    pytest.param(lambda tl, A, B, C: tl.composite(op="math", math_op="foo", a=A, out=C), r"math_op='foo' is unknown",
                 id="math-op-unknown"),
    pytest.param(lambda tl, A, B, C: tl.composite(op="math", math_op="copy", a=A, b=A, out=tl.alloc((8, 16), name="x")),
                 r"math op 'copy' takes 1 operand", id="math-too-many-operands"),
    pytest.param(lambda tl, A, B, C: tl.composite(op="math", math_op="copy", a=A, out=tl.alloc((8, 16), name="x"),
                                                  value=3.0), r"scalars \['value'\] do not match; copy takes none",
                 id="math-stray-scalar"),
    pytest.param(lambda tl, A, B, C: tl.composite(op="math", math_op="fill", out=tl.alloc((2, 2), name="x")),
                 r"scalars \[\] do not match; fill takes value", id="fill-without-value"),
    pytest.param(lambda tl, A, B, C: tl.composite(op="gemm", a=A, b=B, out=C, epilogue={"op": "scale", "factor": 2}),
                 r"epilogue= must be a list, got dict.*wrap the dict in a list", id="epilogue-dict"),
    pytest.param(lambda tl, A, B, C: tl.composite(op="gemm", a=A, b=B, out=C, epilogue=[{"op": ["scale"]}]),
                 r"epilogue\[0\]: 'op' must name an op or recipe", id="epilogue-op-list"),
    pytest.param(lambda tl, A, B, C: tl.composite(op="gemm", a=A, b=B, out=C,
                                                  epilogue=[{"op": "scale", "factor": 2, "scope": "tile"}]),
                 r"epilogue\[0\]: scope 'tile' is unknown", id="epilogue-scope"),
    pytest.param(lambda tl, A, B, C: tl.composite(op="gemm", a=A, b=B, out=C, epilogue=[{"op": "add", "other": C}]),
                 r"epilogue operand other=C is in HBM.*tl\.load", id="epilogue-hbm-operand"),
    pytest.param(lambda tl, A, B, C: tl.composite(op="gemm", a=A, b=B, out=C, epilogue=[{"op": "scale", "factor": 2,
                                                                                          "bogus": 1}]),
                 r"operands \['bogus'\] do not match; scale takes no operands", id="epilogue-unknown-key"),
    pytest.param(lambda tl, A, B, C: tl.composite(op="gemm", a=A, b=B, out=C, epilogue=[{"op": "gemm"}]),
                 r"epilogue\[0\]: unknown op 'gemm'", id="epilogue-gemm"),
    pytest.param(lambda tl, A, B, C: tl.composite(op="gemm", a=A, b=B, out=C, epilogue=[{"op": "scale",
                                                                                          "factor": None}]),
                 r"op 1 \(scale\): factor=None; give it a number", id="epilogue-factor-none"),
    pytest.param(lambda tl, A, B, C: tl.composite(ops=5), r"ops=\.\.\.\): ops must be a list, got int", id="ops-int"),
    pytest.param(lambda tl, A, B, C: tl.composite(ops=["x"]), r"item 0 is str, not an OpSpec", id="ops-item-str"),
    pytest.param(lambda tl, A, B, C: tl.composite(ops=[]), r"a composite needs at least one op", id="ops-empty"),
    pytest.param(lambda tl, A, B, C: tl.composite(ops=[_OP("copy", operands=[A])]), r"OpSpec 'copy': operands must "
                 r"be a dict", id="opspec-operands-list"),
    pytest.param(lambda tl, A, B, C: tl.composite(ops=[_OP(5)]), r"OpSpec kind must be an op name", id="opspec-kind"),
    pytest.param(lambda tl, A, B, C: tl.composite(ops=[_OP("copy", scope="bad")]), r"scope 'bad' is unknown",
                 id="opspec-scope"),
    pytest.param(lambda tl, A, B, C: tl.composite(ops=[_OP("fill", extra={"value": None},
                                                           out=tl.alloc((2, 2), name="q"))]),
                 r"op 0 \(fill\): value=None", id="opspec-scalar-none"),
    pytest.param(lambda tl, A, B, C: tl.composite(ops=[_OP("gemm", operands={"a": A, "b": B}, out=C,
                                                           extra={"m": 8.0, "k": 16, "n": 8, "trans_b": False})]),
                 r"m, k, n must be ints and trans_b a bool; got m=8\.0", id="opspec-gemm-float-m"),
    pytest.param(lambda tl, A, B, C: tl.composite(ops=[_OP("copy", operands={"a": kbwork.Handle(
                 "h", kbwork.Space.TCM, 0, (2, 2), "fp32", True)}, out=tl.alloc((2, 2), name="q"))]),
                 r"handle 'h' was not made by this simulator", id="opspec-hand-built-handle"),
    pytest.param(lambda tl, A, B, C: tl.composite(ops=[_OP("gemm", operands={"a": A, "b": B}, out=C,
                                                           extra={"m": 8, "k": 16, "n": 8, "trans_b": False}),
                                                       _OP("gemm", operands={"a": A, "b": B}, out=C,
                                                           extra={"m": 8, "k": 16, "n": 8, "trans_b": False})]),
                 r"2 GEMM ops .* at most one GEMM", id="two-gemms"),
    pytest.param(lambda tl, A, B, C: tl.composite(op="gemm", a=A, b=B, out=C, rw_handles=["x"]),
                 r"rw_handles holds 'x', which is not a tensor handle", id="rw-handles-string"),
    pytest.param(lambda tl, A, B, C: tl.composite(op="gemm", a=A, b=B, out=C, label=5), r"label= must be a string",
                 id="label-int"),
    pytest.param(lambda tl, A, B, C: tl.alloc("abc", name="x"), r"tensor 'x': shape 'abc' is not a tuple of ints",
                 id="alloc-shape-string"),
    pytest.param(lambda tl, A, B, C: tl.alloc((2.5, 3), name="x"), r"tensor 'x': shape .* must hold ints only",
                 id="alloc-float-shape"),
    pytest.param(lambda tl, A, B, C: tl.alloc((2, 2, 2), name="x"), r"tensor 'x': shape \(2, 2, 2\) must be 1-D or 2-D",
                 id="alloc-3d"),
    pytest.param(lambda tl, A, B, C: tl.alloc((0, 2), name="x"), r"shape \(0, 2\) must be 1-D or 2-D with positive",
                 id="alloc-zero"),
    pytest.param(lambda tl, A, B, C: tl.alloc((2, 2), "int8", name="x"), r"dtype 'int8' is not supported",
                 id="alloc-dtype"),
    pytest.param(lambda tl, A, B, C: tl.alloc((2, 2), name=5), r"tensor names must be non-empty strings, got 5",
                 id="alloc-name-int"),
    pytest.param(lambda tl, A, B, C: tl.alloc((10 ** 6, 10 ** 6), name="x"), r"tensor 'x' of shape .* needs "
                 r"4000000000000 B", id="alloc-huge"),
    pytest.param(lambda tl, A, B, C: tl.full((2, 2), "1", name="x"), r"value='1' \(str\) is not a real number",
                 id="full-value-string"),
    pytest.param(lambda tl, A, B, C: tl.full((2, 2), float("nan"), name="x"), r"value is NaN", id="full-nan"),
    pytest.param(lambda tl, A, B, C: tl.full((2, 2), 7e4, "fp16", name="x"), r"value=70000\.0 overflows out=x's dtype "
                 r"fp16", id="full-overflow-fp16"),
    pytest.param(lambda tl, A, B, C: tl.load(tl.alloc((2, 2), name="x")), r"tl\.load expects a HBM handle",
                 id="load-tcm"),
    pytest.param(lambda tl, A, B, C: tl.store(tl.alloc((2, 2), name="x"), C), r"tl\.store x -> C: shapes/dtypes "
                 r"differ", id="store-shapes"),
    pytest.param(lambda tl, A, B, C: tl.wait(0), r"tl\.wait expects the Completion of an emitted command, got 0",
                 id="wait-int"),
    pytest.param(lambda tl, A, B, C: tl.wait(kbwork.Completion(5)), r"Completion\(cmd=5\) names no emitted command",
                 id="wait-future"),
    pytest.param(lambda tl, A, B, C: tl.iteration(1.5), r"tl\.iteration expects a non-negative int loop index, got 1\.5",
                 id="iteration-float"),
    pytest.param(lambda tl, A, B, C: A[0:4:2], r"handle 'A': only contiguous row slices", id="slice-step"),
    pytest.param(lambda tl, A, B, C: A[0:100], r"handle 'A': row slice \[0:100\] is empty or out of range",
                 id="slice-range"),
    pytest.param(lambda tl, A, B, C: tl.composite(op="gemm", b=B, out=C, prologue=[{"op": "softmax_merge",
                                                                                   **_merge_state(tl), "x": A}]),
                 r"recipe 'softmax_merge': unknown operand\(s\) x", id="recipe-unknown-operand"),
    pytest.param(lambda tl, A, B, C: tl.composite(op="gemm", b=B, out=C, prologue=[{"op": "softmax_merge",
                                                                                   **{**_merge_state(tl), "s": A}}]),
                 r"recipe 'softmax_merge': operand s=A is in HBM", id="recipe-hbm-operand"),
    pytest.param(lambda tl, A, B, C: tl.composite(op="gemm", b=B, out=C, prologue=[{"op": "softmax_merge",
                                                                                   **_merge_state(tl, (8, 2))}]),
                 r"op 0 \(rmax, step 1 of recipe 'softmax_merge' in prologue\[0\]\): rmax reduces",
                 id="recipe-bad-shape"),
    pytest.param(lambda tl, A, B, C: tl.composite(op="gemm", a=A, b=B, out=C, prologue=[{"op": "softmax_merge",
                                                                                        **_merge_state(tl)}]),
                 r"recipe 'softmax_merge' binds the head GEMM's a .* also gives a=A .* D6\.6", id="recipe-explicit-a"),
    pytest.param(lambda tl, A, B, C: tl.composite(op="math", a=A, prologue=[{"op": "softmax_merge",
                                                                           **_merge_state(tl)}]),
                 r"a MATH-only recipe composite is the recipe's ops alone; it takes no a", id="recipe-math-with-a"),
    pytest.param(lambda tl, A, B, C: tl.composite(op="gemm", a=A, b=B, out=C, epilogue=[{"op": "softmax_merge"}]),
                 r"recipe 'softmax_merge' can only appear in prologue", id="recipe-in-epilogue"),
    pytest.param(lambda tl, A, B, C: tl.composite(prologue=[{"op": "rmsnorm", "x": tl.alloc((8, 16), name="x"),
                                                             "g": tl.alloc((1, 16), name="g"), "eps": "tiny"}],
                                                  op="gemm", b=B, out=C),
                 r"recipe 'rmsnorm': eps='tiny' \(str\) is not a real number", id="recipe-param-string"),
    pytest.param(lambda tl, A, B, C: None, r"emitted no commands", id="kernel-emits-nothing"),
    pytest.param(lambda tl, A, B, C: (tl.full((1, 1), 0.0, name="x"), tl.wait(kbwork.Completion(1))),
                 r"names no emitted command", id="wait-on-itself"),
]


@pytest.mark.parametrize("body,pattern", KERNEL_CASES)
@pytest.mark.parametrize("mode", ["data", "timing"])
def test_bad_kernel_call(body, pattern, mode):
    with pytest.raises(KbworkError) as info:
        _kernel_case(body, mode)()
    assert isinstance(info.value, (ValidationError, kbwork.SimulationError)), f"{type(info.value)}: {info.value}"
    assert re.search(pattern, str(info.value)), f"{pattern!r} not in {str(info.value)!r}"


HOST_CASES = [
    pytest.param(lambda s: s.hbm(5, np.ones(3)), r"the name must be a non-empty string, got 5", id="hbm-name-int"),
    pytest.param(lambda s: s.hbm("x", [[1, 2], [3]]), r"sim\.hbm\('x'\): cannot read the data as an array",
                 id="hbm-ragged"),
    pytest.param(lambda s: s.hbm("x", ["a", "b"]), r"sim\.hbm\('x'\): the array holds <U1 values", id="hbm-strings"),
    pytest.param(lambda s: s.hbm("x", np.array([True])), r"the array holds bool values", id="hbm-bool"),
    pytest.param(lambda s: s.hbm("x", np.array([1 + 2j])), r"the array is complex", id="hbm-complex"),
    pytest.param(lambda s: s.hbm("x", np.array([np.inf])), r"the array holds NaN or inf", id="hbm-inf"),
    pytest.param(lambda s: s.hbm("x", np.array([1e39])), r"values up to 1e\+39 overflow fp32", id="hbm-overflow-fp32"),
    pytest.param(lambda s: s.hbm("x", np.array([7e4]), dtype="fp16"), r"values up to 7e\+04 overflow fp16",
                 id="hbm-overflow-fp16"),
    pytest.param(lambda s: s.hbm("x", np.float32(3)), r"tensor 'x': shape \(\) must be 1-D or 2-D", id="hbm-0d"),
    pytest.param(lambda s: s.hbm("x", shape=(2.5, 3)), r"tensor 'x': shape .* must hold ints only", id="hbm-float-shape"),
    pytest.param(lambda s: s.hbm("x", np.ones(3), shape=(4,)), r"shape=\(4,\) disagrees with the array's shape",
                 id="hbm-shape-disagrees"),
    pytest.param(lambda s: s.hbm("x"), r"pass an array, or shape=", id="hbm-nothing"),
    pytest.param(lambda s: (s.hbm("x", shape=(2,)), s.hbm("x", shape=(2,))), r"HBM tensor 'x' already exists",
                 id="hbm-duplicate"),
    pytest.param(lambda s: s.hbm("x", shape=(10 ** 6, 10 ** 6)), r"tensor 'x' of shape .* needs 4000000000000 B",
                 id="hbm-huge"),
    pytest.param(lambda s: s.run(5), r"Simulator\.run expects a kernel function", id="run-not-callable"),
    pytest.param(lambda s: s.run(lambda tl: tl.full((1, 1), 0.0, name="x")).read(5),
                 r"Run\.read expects a tensor handle or a tensor name, got 5", id="read-int"),
    pytest.param(lambda s: s.run(lambda tl: tl.full((1, 1), 0.0, name="x")).read("y"),
                 r"no tensor named 'y' in this run; known: x", id="read-unknown"),
    pytest.param(lambda s: s.run(lambda tl: (tl.full((1, 1), 0.0, name="x"), tl.full((1, 1), 1.0, name="x"))).read("x"),
                 r"the name 'x' is given to 2 tensors", id="read-ambiguous"),
    pytest.param(lambda s: s.hbm("c", shape=(10, 4))[-5:], r"handle 'c': row slice \[-5:None\] counts from the "
                 r"end; handles take row numbers from 0 \(of 10 rows\), e\.g\. \[5:10\]", id="slice-negative"),
    pytest.param(lambda s: s.run(lambda tl: tl.full((1, 1), 0.0, name="x")).pe("0"),
                 r"run\.pe\('0'\): a PE is named by its number, an int", id="pe-str"),
    pytest.param(lambda s: s.run(lambda tl: tl.full((1, 1), 0.0, name="x")).to_csv(5),
                 r"to_csv: path: 5 \(int\) is not a file path; give a str or a pathlib\.Path", id="to-csv-int-path"),
    pytest.param(lambda s: s.run(lambda tl: tl.full((1, 1), 0.0, name="x")).to_perfetto(b"t.json"),
                 r"to_perfetto: path: b't\.json' \(bytes\) is not a file path", id="to-perfetto-bytes-path"),
]


@pytest.mark.parametrize("action,pattern", HOST_CASES)
def test_bad_host_data_and_results(action, pattern):
    with pytest.raises(ValidationError) as info:
        action(Simulator())
    assert re.search(pattern, str(info.value)), f"{pattern!r} not in {str(info.value)!r}"


def test_the_tables_hold_at_least_eighty_distinct_mistakes():
    tables = dict(toml=TOML_CASES, config=CONFIG_CASES, simulator=SIMULATOR_CASES, decode=DECODE_CASES,
                  resume=RESUME_CASES, panel=PANEL_CASES, what_if=WHAT_IF_CASES, cli=CLI_CASES, bench=BENCH_CASES,
                  kernel=KERNEL_CASES, host=HOST_CASES, analysis=ANALYSIS_CASES)
    ids = [(name, p.id) for name, t in tables.items() for p in t]
    assert len(ids) == len(set(ids)) and len(ids) >= 80


@pytest.fixture(scope="module")
def timing_run():
    return decode.run("opt2", kv_len=256, mode="timing").run


ANALYSIS_CASES = [
    pytest.param(lambda r: kbwork.analysis.utilization(r.op_log.assign(start=r.op_log.start.astype(str))),
                 r"utilization: column 'start' holds (object|str) values; an op_log's start and end are whole cycles",
                 id="utilization-text-cycles"),
    pytest.param(lambda r: kbwork.analysis.utilization(r.op_log.assign(end=np.nan)),
                 r"utilization: column 'end' holds float64 values", id="utilization-nan-cycles"),
    pytest.param(lambda r: kbwork.analysis.utilization_over_time(r, bins=[0, np.inf]),
                 r"increasing finite edges", id="utilization-over-time-inf-edge"),
    pytest.param(lambda r: kbwork.analysis.channels_over_time(r, bins=[0, 1e30]),
                 r"channels_over_time: bins=\[0, 1e\+30\].*up to at most 2\*\*62", id="channels-over-time-huge-edge"),
    pytest.param(lambda r: kbwork.analysis.ratio_grid(60, [60], [40], [0.1]),
                 r"ratio_grid: baseline_bytes=60 must be a list", id="ratio-grid-scalar"),
]


@pytest.mark.parametrize("action,pattern", ANALYSIS_CASES)
def test_bad_analysis_argument(action, pattern, timing_run):
    _raises(lambda: action(timing_run), ValidationError, pattern)


@pytest.mark.parametrize("names, pattern", [
    (None, r"engine_tracks: names must be a list of engine unit names .* got NoneType None"),
    ("PE_CPU", r"engine_tracks: names must be a list .* got str 'PE_CPU'"),
    ([5], r"op_log engine 5 is not an engine unit name"),
    (["PE_TPU"], r"op_log engine 'PE_TPU' is not one of PE_CPU"),
])
def test_engine_tracks_refuses_what_is_not_engine_names(names, pattern):
    from kbwork.oplog import engine_tracks
    _raises(lambda: engine_tracks(names), ValidationError, pattern)


def test_a_ratio_grid_of_no_dispatch_at_all_is_undefined_not_infinite():
    import kbwork.analysis as an
    grid = an.ratio_grid([], [], [40], [0.1])
    assert np.isnan(grid.iloc[0, 0])
    assert an.ratio_grid([], [60], [40], [0.1]).iloc[0, 0] == np.inf


def test_a_recipes_own_ops_are_still_checked_for_scalars_shapes_and_the_ops_around_them(monkeypatch):
    """Validation trusts a recipe's expansion for what its descriptor and operand checks guarantee (operand
    names, handle types, spaces), never for scalars or shapes, nor for the composite's other ops."""
    from kbwork.triton_emu.tl_recipes import RECIPE_DESCRIPTORS, EngineOp, RecipeDescriptor, ScratchSpec

    # copy ships no scalar: a descriptor may bind one all the same, and the expansion must refuse it
    monkeypatch.setitem(RECIPE_DESCRIPTORS, "scaled_copy", RecipeDescriptor(
        name="scaled_copy", operands={"x": "R"}, scratch=(ScratchSpec("y", "x", "fp32"),),
        engine_seq=(EngineOp("MATH", "copy", ("x",), "y", scalars={"factor": 2.0}),)))
    other = Simulator(mode="timing")
    foreign = other.hbm("F", shape=(8, 8), dtype="fp32")

    def run(body):
        sim = Simulator(mode="timing")
        a = sim.hbm("A", shape=(4, 8), dtype="fp32")
        return sim.run(lambda tl, a: body(tl, a), a)

    def bad_scalar(tl, a):
        x = tl.load(a, name="x")
        tl.composite(op="math", prologue=[{"op": "scaled_copy", "x": x}])

    with pytest.raises(ValidationError, match=r"op 0 \(copy, step 1 of recipe 'scaled_copy' in prologue\[0\]\): "
                                              r"scalars \['factor'\] do not match; copy takes none"):
        run(bad_scalar)

    def foreign_head(tl, a):  # the recipe's ops are fine; the GEMM after them holds another simulator's tensor
        s = tl.alloc((4, 8), "fp32", name="s")
        m, l = tl.full((4, 1), 0.0, "fp32", name="m"), tl.full((4, 1), 0.0, "fp32", name="l")
        O = tl.full((4, 8), 0.0, "fp32", name="O")
        tl.composite(prologue=[{"op": "softmax_merge", "s": s, "m": m, "l": l, "O": O}], op="gemm",
                     b=foreign, out=O)

    with pytest.raises(ValidationError, match=r"op 8 \(gemm\): handle 'F' comes from the HBM of simulator #\d+, "
                                              r"not the HBM of simulator #\d+"):
        run(foreign_head)


@pytest.mark.parametrize("scratch, step, pattern", [
    (("y", ("x0", 1), "fp32"), None, r"scratch 'y': dimension 'x0' of shape \('x0', 1\) is neither a positive int "
                                     r"nor 'x\[i\]'"),
    (("y", (0, 1), "fp32"), None, r"dimension 0 of shape \(0, 1\)"),
    (("y", (), "fp32"), None, r"shape \(\) must be an operand's name or a non-empty tuple"),
    (("y", "z", "fp32"), None, r"scratch 'y' derives from \['z'\], which are not all operands \(x\)"),
    (("y", "x", "fp33"), None, r"dtype 'fp33' is neither a dtype \(bf16, fp16, fp32\) nor an operand"),
    (("y", "x", "fp32"), ("GEMM", "copy", ("x",), "y", {}), r"runs on engine 'GEMM'; recipe steps are MATH ops"),
    (("y", "x", "fp32"), ("MATH", "fill", (), "y", {"value": float("nan")}),
     r"binds scalar 'value' to nan; bind it to a param's name or a number"),
    (("y", "x", "fp32"), ("MATH", "fill", (), "y", {"value": True}), r"binds scalar 'value' to True"),
])
def test_a_recipe_descriptor_an_expansion_could_not_apply_is_refused_when_it_is_made(scratch, step, pattern):
    """A new recipe's mistakes surface where it is written, as a ValidationError naming the recipe and the rule,
    not mid-kernel as a KeyError (a dtype that is not one) or an AttributeError (a dimension not 'x[i]')."""
    from kbwork.triton_emu.tl_recipes import EngineOp, RecipeDescriptor, ScratchSpec

    engine, kind, srcs, dst, scalars = step or ("MATH", "copy", ("x",), "y", {})
    _raises(lambda: RecipeDescriptor(name="mine", operands={"x": "R"}, scratch=(ScratchSpec(*scratch),),
                                     engine_seq=(EngineOp(engine, kind, srcs, dst, scalars=scalars),)),
            ValidationError, r"^recipe descriptor 'mine': .*" + pattern)
    # the same rules, written well, are taken
    RecipeDescriptor(name="mine", operands={"x": "R"}, scratch=(ScratchSpec("y", ("x[0]", 1), "x"),),
                     engine_seq=(EngineOp("MATH", "rmax", ("x",), "y"),))


@pytest.mark.parametrize("kw, pattern", [
    (dict(operands="a", fn=np.negative), r"^OpInfo 'neg': operands must be a tuple of names, got 'a'; write \('a',\)"),
    (dict(operands=("a",)), r"^OpInfo 'neg': fn must be its numpy meaning, called as fn\(\*operands, \*\*scalars\)"),
    (dict(operands=("a", "out"), fn=np.add), r"names must be distinct and not 'out', got \['a', 'out'\]"),
    (dict(operands=("a",), scalars=("a",), fn=np.add), r"names must be distinct"),
    (dict(operands=("a",), scalars=["k"], fn=np.add), r"scalars must be a tuple of names, got \['k'\]"),
    (dict(operands=(), accumulator=True, reduction=True, fn=np.add), r"cannot also be a row reduction"),
    (dict(kind="neg op", operands=("a",), fn=np.negative), r"^OpInfo: kind 'neg op' must be a name"),
])
def test_an_op_table_entry_that_could_not_run_is_refused_when_it_is_made(kw, pattern):
    """A new MATH op's mistakes surface where the OpInfo is written, not as a TypeError in a data-mode run."""
    from kbwork.pe.ops import OpInfo

    _raises(lambda: OpInfo(**{"kind": "neg", **kw}), ValidationError, pattern)
    assert OpInfo("neg", ("a",), fn=np.negative).operand_set == {"a"}
