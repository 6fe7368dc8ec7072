"""The disk buffer's plain file operations: the directory lock, appends, fsyncs, the ``NEXT``
file, and what a failed write tells its owner.

Synchronous, on the caller's thread (or a worker thread, for :func:`fdatasync_and_close`).
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import shutil
from pathlib import Path
from typing import Final

from truba.pipes.errors import SpoolError, SpoolFull, SpoolLocked
from truba.pipes.spool_format import NEXT_FILE

log = logging.getLogger(__name__)

_FULL_ERRNOS: Final = frozenset({errno.ENOSPC, errno.EDQUOT})


def lock_directory(directory: Path) -> int:
    """Takes ``directory``'s ``LOCK`` (``flock``, held while the returned descriptor is open) and
    writes our pid in it.

    Raises:
        SpoolLocked: another process (or another descriptor in this one) holds it.
    """
    fd = os.open(directory / "LOCK", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        owner = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise SpoolLocked(f"spool {directory} is in use by another owner (pid {owner})") from None
    except BaseException:
        os.close(fd)
        raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def write_all(fd: int, *parts: bytes) -> None:
    """Appends ``parts`` with one ``writev`` (more only after a short write)."""
    total = sum(map(len, parts))
    written = os.writev(fd, parts)
    if written < total:  # a short write: usually the disk filling up; the next write says why
        rest = b"".join(parts)[written:]
        while rest:
            rest = rest[os.write(fd, rest) :]


def fdatasync_and_close(fd: int) -> None:
    """Flushes a (duplicated) descriptor's data to disk, then closes it; for a worker thread."""
    try:
        os.fdatasync(fd)
    finally:
        os.close(fd)


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_next_seq(directory: Path, next_seq: int, durable: bool) -> None:
    """Keeps the next seq in :data:`~truba.pipes.spool_format.NEXT_FILE` (replaced atomically),
    so seqs keep growing when no segment is left."""
    path = directory / NEXT_FILE
    scratch = path.with_suffix(".tmp")
    scratch.write_text(str(next_seq))
    if durable:
        fd = os.open(scratch, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    scratch.replace(path)


def read_next_seq(directory: Path) -> int | None:
    try:
        return int((directory / NEXT_FILE).read_text())
    except (FileNotFoundError, ValueError):
        return None


def free_bytes(directory: Path) -> int | None:
    try:
        return shutil.disk_usage(directory).free
    except OSError:
        return None


def close_fd(fd: int | None) -> None:
    if fd is not None:
        try:
            os.close(fd)
        except OSError:
            pass


def write_error(directory: Path, what: str, exc: OSError, size: int) -> SpoolError:
    """The error (logged) for a write of a ``size``-byte message that failed with ``exc``:
    SpoolFull when the file system is full or over quota."""
    free = free_bytes(directory)
    extra = {"directory": str(directory), "free_bytes": free, "size": size, "error": repr(exc)}
    if exc.errno in _FULL_ERRNOS:
        log.error("pipe.spool.full", extra=extra)
        return SpoolFull(
            f"spool {directory} is full ({free} bytes free): {what} of a {size}-byte message "
            f"failed: {exc.strerror}; the message was not spooled and not sent"
        )
    log.error("pipe.spool.write_failed", extra=extra)
    return SpoolError(
        f"spool {directory} ({free} bytes free): {what} failed: {exc}; "
        "the message was not spooled and not sent"
    )
