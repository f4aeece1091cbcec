"""Every file kbwork writes appears whole or not at all (kbwork/atomic.py).

The partial-write tests run the write in a subprocess under a file-size limit
(``RLIMIT_FSIZE``, with ``SIGXFSZ`` ignored so the write fails with an OSError
instead of killing the process): the write must fail, and the good file it
was about to replace must still be there, whole and readable.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import kbwork
from kbwork import atomic, decode, oplog

REPO = Path(kbwork.__file__).resolve().parent.parent

# Writes a big output over ``path`` with files limited to LIMIT bytes; exit 3 on the expected OSError.
_WRITER = textwrap.dedent("""
    import resource, signal, sys
    from kbwork import decode

    kind, path, limit = sys.argv[1], sys.argv[2], int(sys.argv[3])
    r = decode.run("opt3", kv_len=8192, mode="data" if kind == "npz" else "timing")
    write = {"csv": r.to_csv, "json": r.to_perfetto, "npz": r.to_npz}[kind]
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)   # a write past the limit raises EFBIG instead
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    try:
        write(path)
    except OSError as exc:
        print(exc.errno, exc.filename)
        sys.exit(3)
""")


def _good_small(kind: str, path: Path) -> None:
    r = decode.run("opt2", kv_len=256, mode="data")
    {"csv": r.to_csv, "json": r.to_perfetto, "npz": r.to_npz}[kind](path)


def _readable(kind: str, path: Path) -> object:
    if kind == "csv":
        return oplog.read_csv(path)
    if kind == "json":
        return json.loads(path.read_text())
    with np.load(path) as z:
        return {k: z[k] for k in z.files}


@pytest.mark.parametrize("kind,name", [("csv", "log.csv"), ("json", "trace.json"), ("npz", "out.npz")])
def test_a_failed_write_leaves_the_old_file_intact(kind, name, tmp_path):
    pytest.importorskip("resource")  # POSIX only
    path = tmp_path / name
    _good_small(kind, path)
    before = path.read_bytes()
    limit = len(before) + 4096  # the old file fits; the new, much larger one does not
    env = dict(os.environ, PYTHONPATH=str(REPO))
    p = subprocess.run([sys.executable, "-c", _WRITER, kind, str(path), str(limit)], env=env, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 3, p.stdout + p.stderr
    code, filename = p.stdout.split()
    assert int(code) == errno.EFBIG and filename == str(path)  # the error names the target, not a temp file
    assert path.read_bytes() == before
    _readable(kind, path)
    assert sorted(tmp_path.iterdir()) == [path], "the temporary file is gone"


# --- the helper itself ------------------------------------------------------------------------------
def test_write_replaces_the_target_with_exactly_the_bytes(tmp_path):
    path = tmp_path / "a.csv"
    path.write_text("old\n")
    assert atomic.write_text(path, "x,y\r\n1,2\n") == path
    assert path.read_bytes() == b"x,y\r\n1,2\n"  # no newline translation
    assert atomic.write_bytes(str(path), b"\x00\x01") == path
    assert path.read_bytes() == b"\x00\x01"
    assert os.listdir(tmp_path) == ["a.csv"]


def test_writer_that_fails_leaves_target_and_no_temp_file(tmp_path):
    path = tmp_path / "keep.json"
    path.write_text('{"good": true}')

    def half_then_fail(f):
        f.write(b'{"trunc')
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        atomic.write_with(path, half_then_fail)
    assert path.read_text() == '{"good": true}'
    assert os.listdir(tmp_path) == ["keep.json"]


def test_os_error_names_the_target_and_keeps_its_errno(tmp_path):
    path = tmp_path / "full.csv"
    path.write_text("old")

    def disk_full(f):
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OSError) as info:
        atomic.write_with(path, disk_full)
    assert info.value.errno == errno.ENOSPC and info.value.filename == str(path)
    assert path.read_text() == "old" and os.listdir(tmp_path) == ["full.csv"]


def test_missing_directory_and_directory_targets(tmp_path):
    # a FileError: a KbworkError and an OSError with the OS's errno, naming the target
    with pytest.raises(kbwork.FileError) as info:
        atomic.write_text(tmp_path / "no" / "x.csv", "x")
    assert isinstance(info.value, OSError) and info.value.errno == errno.ENOENT
    assert info.value.filename == str(tmp_path / "no" / "x.csv")
    with pytest.raises(kbwork.FileError) as info:
        atomic.write_text(tmp_path, "x")
    assert info.value.errno == errno.EISDIR and info.value.filename == str(tmp_path)


def test_permissions_follow_the_umask_or_the_replaced_file(tmp_path):
    old = os.umask(0o022)
    try:
        fresh = atomic.write_text(tmp_path / "new.csv", "x")
        assert stat.S_IMODE(fresh.stat().st_mode) == 0o644  # like open(), not mkstemp's 0o600
        kept = tmp_path / "kept.csv"
        kept.write_text("x")
        kept.chmod(0o640)
        atomic.write_text(kept, "y")
        assert stat.S_IMODE(kept.stat().st_mode) == 0o640
    finally:
        os.umask(old)


def test_a_symlink_is_written_through(tmp_path):
    real = tmp_path / "real.csv"
    real.write_text("old")
    link = tmp_path / "link.csv"
    link.symlink_to(real)
    atomic.write_text(link, "new")
    assert link.is_symlink() and real.read_text() == "new"


def test_a_device_is_written_in_place():
    atomic.write_text(os.devnull, "discarded")  # replacing /dev/null with a file would be a disaster
    assert not Path(os.devnull).is_file()


def test_check_output_path_accepts_what_it_should(tmp_path):
    assert atomic.check_output_path(tmp_path / "a.CSV", suffix=".csv") == tmp_path / "a.CSV"
    (tmp_path / "exists.png").write_bytes(b"")
    assert atomic.check_output_path(str(tmp_path / "exists.png"), suffix=".png")
    assert atomic.check_output_path(tmp_path / "anything.bin")


# --- every writer of kbwork writes exactly the path it is given ------------------------------------
def test_to_npz_writes_exactly_the_given_path(tmp_path):
    r = decode.run("opt2", kv_len=256)
    for name in ("x.txt", "plain", "out.npz"):
        assert r.to_npz(tmp_path / name) == tmp_path / name
        with np.load(tmp_path / name) as z:
            assert np.array_equal(z["O"], r.O) and str(z["variant"]) == "opt2"
    assert sorted(os.listdir(tmp_path)) == ["out.npz", "plain", "x.txt"]


def test_cli_run_writes_exactly_the_printed_paths(tmp_path, capsys):
    from kbwork.cli import main

    paths = {"--oplog": tmp_path / "log.CSV", "--npz": tmp_path / "in.npz", "--trace": tmp_path / "t.json",
             "--gantt": tmp_path / "g.png"}
    argv = ["run", "--variant", "opt2", "--kv-len", "256"]
    for flag, path in paths.items():
        argv += [flag, str(path)]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert sorted(tmp_path.iterdir()) == sorted(paths.values())
    for path in paths.values():
        assert f"wrote {path}" in err
    assert (tmp_path / "g.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_golden_update_is_atomic(tmp_path, monkeypatch):
    from kbwork import golden

    monkeypatch.setattr(golden, "golden_benches", lambda: {"a": lambda: "x\n", "b": lambda: "y\n"})
    assert golden.update(tmp_path) == ["a", "b"]
    assert (tmp_path / "a.csv").read_text() == "x\n"
    assert sorted(os.listdir(tmp_path)) == ["a.csv", "b.csv"]
