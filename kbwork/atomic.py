"""Atomic file writes: every file kbwork writes appears whole or not at all.

A write goes to a temporary file beside the target (same directory, so the
same file system) and is moved onto the target with ``os.replace`` only once
it is complete. A write that fails part-way (disk full, a file-size limit,
an exception while producing the content) removes the temporary file and
leaves an existing target exactly as it was.

:func:`check_output_path` is the cheap check a command runs on an output
path *before* it spends minutes simulating.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from pathlib import Path
from typing import IO, Any, Callable

from .errors import FileError, ValidationError

__all__ = ["write_text", "write_bytes", "write_with", "append_whole", "check_output_path", "as_path"]


def write_text(path: str | os.PathLike[str], text: str, *, encoding: str = "utf-8", sync: bool = True) -> Path:
    """Write ``text`` to ``path`` atomically, byte for byte (no newline translation); ``sync`` as
    :func:`write_with`.

    Returns:
        The path written (exactly ``path``; no suffix is added).

    Raises:
        FileError: the file cannot be written (an OSError too; the message names
            ``path``); an existing file at ``path`` is left intact.
    """
    data = text.encode(encoding)
    return write_with(path, lambda f: f.write(data), sync=sync)


def write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically. Returns and raises as :func:`write_text`."""
    return write_with(path, lambda f: f.write(data))


def write_with(path: str | os.PathLike[str], writer: Callable[[IO[bytes]], Any], *, sync: bool = True) -> Path:
    """Call ``writer(f)`` with a binary file object and move what it wrote onto ``path`` atomically.

    ``writer`` may be any function that writes to a file object (``np.savez``,
    ``fig.savefig(f, format="png")``, ...); it must not close ``f``.
    ``sync=False`` skips flushing the data to the disk before the move (several
    milliseconds): the file is still whole or absent if the program stops, but
    not necessarily if the machine does. For a file rewritten often whose loss
    costs only work (a sweep's record between two points).

    An existing target that is not a regular file (``/dev/null``, a named
    pipe) cannot be replaced; it is written in place, as ``open`` would.

    Returns:
        The path written (exactly ``path``).

    Raises:
        FileError: the file cannot be written (an OSError too); the message names
            ``path``, not the temporary file. The temporary file is removed and an existing
            target is left intact. Whatever ``writer`` raises propagates the
            same way, after the same clean-up.
    """
    target = as_path(path)
    try:
        st: os.stat_result | None = os.stat(target)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise _named(exc, target) from exc
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise FileError(errno.EISDIR, "is a directory, not a file", str(target))
    if st is not None and not stat.S_ISREG(st.st_mode):
        with open(target, "wb") as f:  # a device or a pipe: there is nothing to replace
            writer(f)
        return target
    # write beside the file a symlink points to, so the link survives and the rename stays on one device
    real = Path(os.path.realpath(target)) if target.is_symlink() else target
    tmp, fd = _create_temp(real)
    try:
        with os.fdopen(fd, "wb") as f:
            writer(f)
            f.flush()
            if sync:
                os.fsync(f.fileno())
        if st is not None:
            os.chmod(tmp, stat.S_IMODE(st.st_mode))  # replacing a file keeps its permissions
        os.replace(tmp, real)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(exc, OSError) and exc.errno is not None:
            raise _named(exc, target) from exc
        raise
    return target


def as_path(path: Any, what: str = "path") -> Path:
    """``path`` as a :class:`~pathlib.Path`.

    Raises:
        ValidationError: ``path`` is not text or an ``os.PathLike`` of text (an int, bytes, None).
    """
    if isinstance(path, str) or (isinstance(path, os.PathLike) and isinstance(os.fspath(path), str)):
        return Path(path)
    raise ValidationError(f"{what}: {path!r} ({type(path).__name__}) is not a file path; give a str or a "
                          f"pathlib.Path.")


def append_whole(path: str | os.PathLike[str], data: bytes, what: str = "the data") -> None:
    """Append ``data`` to the existing file ``path`` whole: one write, undone if the system cuts it short
    (a resumable file never keeps a torn record).

    Raises:
        FileError: ``data`` could not be written (the file is as it was; ``what`` names it in the message).
    """
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        size = os.fstat(fd).st_size
        try:
            written = os.write(fd, data)
        except OSError as exc:
            os.ftruncate(fd, size)
            raise FileError(exc.errno, exc.strerror or str(exc), str(path)) from None
        if written != len(data):  # a full disk or a size limit: no torn record stays behind
            os.ftruncate(fd, size)
            raise FileError(errno.ENOSPC, f"only {written} of {len(data)} bytes of {what} could be written",
                            str(path))
    finally:
        os.close(fd)


def _create_temp(real: Path) -> tuple[Path, int]:
    """Create an empty temporary file beside ``real``; return its path and an open descriptor.

    ``os.open`` with mode 0o666 lets the umask decide the permissions, as for
    any new file (``mkstemp`` would make it owner-only).
    """
    for _ in range(100):
        tmp = real.with_name(f".{real.name}.{secrets.token_hex(4)}.tmp")
        try:
            return tmp, os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
        except FileExistsError:
            continue
        except OSError as exc:
            raise _named(exc, real) from exc
    raise FileError(errno.EEXIST, "could not create a temporary file beside it", str(real))


def _named(exc: OSError, target: Path) -> FileError:
    """A :class:`FileError` with the OS error's errno and reason, naming the target (not a temporary file)."""
    return FileError(exc.errno, exc.strerror or os.strerror(exc.errno), str(target))


def check_output_path(path: str | os.PathLike[str], *, suffix: str | None = None, what: str = "output") -> Path:
    """Check, leaving nothing behind, that ``path`` can be written as an output file.

    The parent directory must exist and be a writable directory, ``path`` must
    not be a directory (nor an existing read-only file), and, when ``suffix``
    is given, its name must end with it (case-insensitively): kbwork writes
    exactly the path it is given and never appends a suffix. Where the write
    would go through a temporary file beside the target, that file is created
    and removed at once: permission bits do not tell (root passes
    ``os.access`` on ``/proc``, where no file can be created).

    Returns:
        ``path`` as a :class:`~pathlib.Path`.

    Raises:
        ValidationError: naming ``what`` (e.g. ``"--oplog"``), the path and the fix.
    """
    p = as_path(path, what)
    shown = repr(str(path)) if len(str(path)) <= 80 else repr(str(path)[:77] + "...")
    if str(path) == "" or p.name in ("", ".", ".."):
        raise ValidationError(f"{what}: {shown} is not a file name; give a file path"
                              + (f" ending in {suffix}" if suffix else "") + ".")
    st = _stat(p, what, shown)
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise ValidationError(f"{what}: {shown} is a directory; give a file path inside it "
                              f"(e.g. {p / ('out' + (suffix or ''))}).")
    if suffix is not None and not p.name.lower().endswith(suffix.lower()):
        raise ValidationError(f"{what}: {shown} does not end in {suffix}; kbwork writes exactly the path "
                              f"it is given, so name the file *{suffix} (e.g. {p.stem or 'out'}{suffix}).")
    parent = p.parent
    parent_st = _stat(parent, what, shown)
    if parent_st is None:
        raise ValidationError(f"{what}: the directory {str(parent)!r} of {shown} does not exist; "
                              f"create it first (mkdir -p {parent}).")
    if not stat.S_ISDIR(parent_st.st_mode):
        raise ValidationError(f"{what}: {str(parent)!r} in {shown} is not a directory.")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ValidationError(f"{what}: the directory {str(parent)!r} is not writable; "
                              f"pick a path in a directory you can write to.")
    if st is not None and not os.access(p, os.W_OK):
        raise ValidationError(f"{what}: {shown} exists and is read-only; pick another name or make it writable.")
    if st is None or stat.S_ISREG(st.st_mode):  # what write_with will do: a temporary file beside the target
        real = Path(os.path.realpath(p)) if p.is_symlink() else p
        try:
            tmp, fd = _create_temp(real)
        except FileError as exc:
            raise ValidationError(f"{what}: cannot write a file in the directory {str(real.parent)!r} "
                                  f"({exc.strerror}); pick a path in a directory you can write to.") from None
        os.close(fd)
        try:
            os.unlink(tmp)
        except OSError:
            pass
    return p


def _stat(p: Path, what: str, shown: str) -> os.stat_result | None:
    """``os.stat(p)``, or None when nothing is there; any other failure is a ValidationError."""
    try:
        return os.stat(p)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        raise ValidationError(f"{what}: cannot use {shown}: {exc.strerror or exc}.") from None
