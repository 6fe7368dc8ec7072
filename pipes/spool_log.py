"""The disk buffer's on-disk log: checksummed segment files, forget marks, and an exclusive lock.

This module is synchronous plain file I/O; :mod:`truba.pipes.spool` decides *when* to fsync.
A spool directory holds::

    LOCK                    flock()ed by the one process that owns the spool; contains its pid
    NEXT                    the next seq, as of the last open or close
    00000000000003e8.seg    a segment (named by the hex seq of its first record), append-only
    00000000000003e8.ack    forget marks for that segment's records

A segment starts with a 16-byte header ``<8s magic "TRSPOOL1"><u32 salt><u32 crc32>`` followed by
records ``<u32 length><u32 crc32><u64 seq><payload>``, the CRC covering length, seq and payload.
A record cut short or failing its CRC ends its segment: a crash mid-append leaves such a tail, and
it is ignored with a warning while every record before it is recovered. A run never appends to a
segment of an earlier run (it starts a new one), so a torn tail is always a segment's last record.

An ``.ack`` file holds 12-byte marks ``<u64 seq><u32 crc32(seq, salt)>`` of forgotten records.
Marks are written in batches and never fsynced: a lost mark only brings a confirmed record back
as a duplicate after a crash. The salt ties a mark to one incarnation of a segment, so a stale
mark can never forget a newer record.

Compaction: the active segment rotates at ``segment_bytes``; a segment is deleted once it is not
the active one and every record in it is forgotten. Sequence numbers are unique and grow across
runs: a crash leaves the active segment behind, and ``NEXT`` keeps the count when none is left,
so an owner can use ``next_seq`` as the number of records ever appended.
"""

from __future__ import annotations

import bisect
import errno
import fcntl
import logging
import os
import secrets
import shutil
import struct
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, final

from truba.pipes.errors import PipeError

log = logging.getLogger(__name__)

MAGIC: Final = b"TRSPOOL1"
SEGMENT_HEADER: Final = struct.Struct("<8sII")  # magic, salt, crc32(magic + salt)
RECORD_HEADER: Final = struct.Struct("<IIQ")  # payload length, crc32, seq
ACK: Final = struct.Struct("<QI")  # seq, crc32(seq, salt)
_LEN_SEQ: Final = struct.Struct("<IQ")
_SALT: Final = struct.Struct("<I")
NEXT_FILE: Final = "NEXT"
"""Holds the next seq (written at open and close), so seqs grow across runs even when every
segment was deleted."""
MAX_RECORD: Final = 1 << 30
"""Longest payload accepted; a longer length field in a record is treated as corruption."""
_FULL_ERRNOS: Final = frozenset({errno.ENOSPC, errno.EDQUOT})
_MAX_PARTS: Final = 1024
"""Buffers in one ``writev`` at most (Linux's IOV_MAX): two per record."""


class SpoolError(PipeError):
    """The disk buffer could not write its log: the message was not spooled and not sent."""


class SpoolFull(SpoolError):
    """The spool's file system is full (or over quota); the message was not spooled and not sent."""


class SpoolLocked(SpoolError):
    """Another process (or another SpoolSender in this one) owns the spool directory."""


def write_all(fd: int, *parts: bytes) -> None:
    """Appends ``parts`` with one ``writev`` (more only after a short write)."""
    total = sum(len(part) for part in parts)
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


def _ack_crc(seq: int, salt: int) -> int:
    return zlib.crc32(_SALT.pack(salt), zlib.crc32(seq.to_bytes(8, "little")))


@dataclass(eq=False)
class _Segment:
    first: int
    seg_path: Path
    ack_path: Path
    salt: int
    live: int = 0  # records not forgotten
    records: int = 0
    last: int = -1  # seq of the last record
    size: int = 0
    fd: int | None = None  # open for appending while this is the active segment
    ack_fd: int | None = None
    acks: bytearray = field(default_factory=bytearray)


@final
class SpoolLog:
    """The segments of one spool directory, owned exclusively (``flock``) by this object.

    ``recovered`` lists the records of earlier runs that were never forgotten, oldest first; the
    owner takes them over. ``durable`` (fsync policies "always"/"batch") makes segment creation and
    rotation fsync the file and the directory; fsyncing appended records is the owner's job
    (:meth:`sync`, or :meth:`sync_fd` for a worker thread).

    Raises:
        SpoolLocked: the directory is owned by another process or object.
        SpoolFull, SpoolError: appending failed; nothing of the record is left for replay.
    """

    def __init__(self, directory: Path, lock_fd: int, durable: bool, segment_bytes: int) -> None:
        self.directory = directory
        self.durable = durable
        self.segment_bytes = segment_bytes
        self.recovered: list[tuple[int, bytes]] = []
        self.sync_error: SpoolError | None = None
        """Set (for good) when an fsync failed: page-cache state is unknown, so nothing is trusted."""
        self._lock_fd: int | None = lock_fd
        self._segments: list[_Segment] = []
        self._firsts: list[int] = []
        self._active: _Segment | None = None
        self._next_seq = 0
        self._closed = False

    @classmethod
    def open(cls, directory: str | os.PathLike[str], *, durable: bool, segment_bytes: int) -> SpoolLog:
        """Locks ``directory`` (created if missing) and recovers the records of earlier runs."""
        path = Path(directory)
        try:
            path.mkdir(parents=True, exist_ok=True)
            spool = cls(path, _lock(path), durable, segment_bytes)
        except OSError as exc:
            raise SpoolError(f"spool {path}: cannot open: {exc}") from exc
        try:
            spool._recover()
        except BaseException as exc:
            spool.close()
            if isinstance(exc, OSError):
                raise SpoolError(f"spool {path}: cannot recover: {exc}") from exc
            raise
        return spool

    @property
    def segment_count(self) -> int:
        return len(self._segments)

    @property
    def next_seq(self) -> int:
        """The seq the next record gets: the number of records ever appended in this directory,
        earlier runs' included (kept by the segments a crash leaves, else by ``NEXT``)."""
        return self._next_seq

    def read(self, seqs: Iterable[int]) -> dict[int, bytes]:
        """The payloads of the live records ``seqs``, read back from their segments.

        For owners that keep only the seqs of their live records in memory; a seq of no known
        segment is left out (the forget marks are not consulted).

        Raises:
            SpoolError: a segment could not be read.
        """
        wanted = sorted(set(seqs))
        found: dict[int, bytes] = {}
        by_segment: dict[int, list[int]] = {}
        for seq in wanted:
            index = bisect.bisect_right(self._firsts, seq) - 1
            if index >= 0 and seq <= self._segments[index].last:
                by_segment.setdefault(index, []).append(seq)
        for index, members in by_segment.items():
            segment = self._segments[index]
            try:
                data = segment.seg_path.read_bytes()
            except OSError as exc:
                raise SpoolError(
                    f"spool {self.directory}: cannot read {segment.seg_path.name}: {exc}"
                ) from exc
            want = set(members)
            for seq, payload in _parse_records(data)[0]:
                if seq in want:
                    found[seq] = payload
        return found

    def append(self, data: bytes) -> int:
        """Writes one record (one syscall, no fsync) and returns its seq."""
        return self.append_many((data,))[0]

    def append_many(self, records: Sequence[bytes]) -> list[int]:
        """Writes records in order, with one syscall per run of them that fits in a segment
        (no fsync), and returns their seqs.

        If a write fails, the runs written before it stay appended: at most one segment
        rotation's worth, which an owner batching marks (not messages) can ignore.
        """
        if self.sync_error is not None:
            raise self.sync_error
        for data in records:
            if len(data) > MAX_RECORD:
                raise SpoolError(f"spool {self.directory}: a {len(data)}-byte message exceeds {MAX_RECORD}")
        seqs: list[int] = []
        start = 0
        while start < len(records):
            start = self._append_run(records, start, seqs)
        return seqs

    def _append_run(self, records: Sequence[bytes], start: int, seqs: list[int]) -> int:
        """Appends ``records[start:]`` while they fit in the active segment (rotating first if
        the first one does not), with one write; returns the index after the last one written."""
        need = RECORD_HEADER.size + len(records[start])
        segment = self._active
        if segment is None or (segment.size + need > self.segment_bytes and segment.records):
            segment = self._rotate()
        parts: list[bytes] = []
        size, seq, end = segment.size, self._next_seq, start
        while end < len(records) and len(parts) < _MAX_PARTS:
            data = records[end]
            need = RECORD_HEADER.size + len(data)
            if end > start and size + need > self.segment_bytes:
                break
            crc = zlib.crc32(data, zlib.crc32(_LEN_SEQ.pack(len(data), seq)))
            parts += (RECORD_HEADER.pack(len(data), crc, seq), data)
            size, seq, end = size + need, seq + 1, end + 1
        assert segment.fd is not None
        try:
            write_all(segment.fd, *parts)
        except OSError as exc:
            # A partial record must stay the segment's last: cut it off if we can, and seal the
            # segment either way, so later records go to a fresh one.
            try:
                os.ftruncate(segment.fd, segment.size)
            except OSError:
                pass
            self._seal(segment)
            raise self._write_error("append", exc, sum(map(len, records[start:end]))) from exc
        seqs.extend(range(self._next_seq, seq))
        segment.records += seq - self._next_seq
        segment.live += seq - self._next_seq
        self._next_seq = seq
        segment.size = size
        segment.last = seq - 1
        return end

    def sync(self) -> None:
        """fdatasyncs the active segment now (on the caller's thread)."""
        if self.sync_error is not None:
            raise self.sync_error
        if self._active is not None and self._active.fd is not None:
            try:
                os.fdatasync(self._active.fd)
            except OSError as exc:
                raise self.sync_failed(exc) from exc

    def sync_fd(self) -> int | None:
        """A duplicate of the active segment's descriptor, to fsync on another thread and close.

        Records appended before this call are durable once that fsync returns: older segments
        were fsynced when they were sealed. Rotation may close the original meanwhile, hence dup.
        """
        if self.sync_error is not None:
            raise self.sync_error
        if self._active is None or self._active.fd is None:
            return None
        return os.dup(self._active.fd)

    def sync_failed(self, exc: OSError) -> SpoolError:
        """Records a failed fsync; every later write or sync raises the returned error."""
        if self.sync_error is None:
            self.sync_error = SpoolError(f"spool {self.directory}: fsync failed: {exc}")
            log.error("pipe.spool.fsync_failed", extra={"directory": str(self.directory), "error": repr(exc)})
        return self.sync_error

    def forget(self, seq: int) -> None:
        """Marks record ``seq`` forgotten (buffered; see :meth:`flush_forgets`).

        Each seq must be forgotten at most once; a segment whose records are all forgotten is
        deleted unless it is the active one.
        """
        if self._closed:
            return
        index = bisect.bisect_right(self._firsts, seq) - 1
        if index < 0:
            return
        segment = self._segments[index]
        if seq > segment.last:  # a seq of a deleted segment: forgetting it twice is a bug
            log.critical("pipe.spool.unknown_seq", extra={"seq": seq, "segment": segment.seg_path.name})
            return
        segment.live -= 1
        if segment.live <= 0 and segment is not self._active:
            self._delete(segment)
        else:
            segment.acks += ACK.pack(seq, _ack_crc(seq, segment.salt))

    def flush_forgets(self) -> None:
        """Writes buffered forget marks, one write per segment; failures only cost duplicates."""
        for segment in self._segments:
            if not segment.acks:
                continue
            marks, segment.acks = segment.acks, bytearray()
            try:
                if segment.ack_fd is None:
                    segment.ack_fd = os.open(segment.ack_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                os.write(segment.ack_fd, marks)
            except OSError as exc:
                log.warning(
                    "pipe.spool.forget_failed",
                    extra={
                        "segment": segment.seg_path.name,
                        "marks": len(marks) // ACK.size,
                        "error": repr(exc),
                    },
                )

    def close(self) -> None:
        """Flushes forget marks, seals the active segment, deletes forgotten ones; unlocks. Idempotent."""
        if self._closed:
            return
        try:
            self.flush_forgets()
            try:
                self._save_next_seq()
            except OSError as exc:
                log.warning("pipe.spool.next_seq_unsaved", extra={"error": repr(exc)})
            if self._active is not None:
                self._seal(self._active)
            for segment in list(self._segments):
                _close_fd(segment.ack_fd)
                segment.ack_fd = None
                if segment.live <= 0:
                    self._delete(segment)
        finally:
            self._closed = True
            _close_fd(self._lock_fd)  # closing the descriptor releases the flock
            self._lock_fd = None

    # -- segments ----------------------------------------------------------------------------

    def _rotate(self) -> _Segment:
        if self._active is not None:
            self._seal(self._active)
            if self.sync_error is not None:
                raise self.sync_error
        first = self._next_seq
        name = f"{first:016x}"
        segment = _Segment(first, self.directory / f"{name}.seg", self.directory / f"{name}.ack", _new_salt())
        header = SEGMENT_HEADER.pack(MAGIC, segment.salt, zlib.crc32(MAGIC + _SALT.pack(segment.salt)))
        try:
            segment.ack_path.unlink(missing_ok=True)
            fd = os.open(segment.seg_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL, 0o644)
        except OSError as exc:
            raise self._write_error("create segment", exc, 0) from exc
        try:
            write_all(fd, header, b"")
            if self.durable:
                os.fdatasync(fd)
                _fsync_dir(self.directory)
        except OSError as exc:
            os.close(fd)
            segment.seg_path.unlink(missing_ok=True)
            raise self._write_error("create segment", exc, 0) from exc
        segment.fd, segment.size = fd, SEGMENT_HEADER.size
        self._segments.append(segment)
        self._firsts.append(first)
        self._active = segment
        log.debug("pipe.spool.segment_created", extra={"segment": segment.seg_path.name})
        return segment

    def _seal(self, segment: _Segment) -> None:
        """No more appends to ``segment``: fsync it (durable policies), close it, maybe delete it."""
        if segment is self._active:
            self._active = None
        if segment.fd is not None:
            fd, segment.fd = segment.fd, None
            try:
                if self.durable:
                    os.fdatasync(fd)
            except OSError as exc:
                self.sync_failed(exc)
            finally:
                os.close(fd)
        if segment.live <= 0 and not self._closed:
            self._delete(segment)

    def _delete(self, segment: _Segment) -> None:
        if segment not in self._segments:
            return
        index = self._segments.index(segment)
        del self._segments[index]
        del self._firsts[index]
        _close_fd(segment.fd)
        _close_fd(segment.ack_fd)
        segment.fd = segment.ack_fd = None
        try:
            segment.seg_path.unlink(missing_ok=True)  # the records first: a leftover .ack is harmless
            segment.ack_path.unlink(missing_ok=True)
        except OSError as exc:
            log.warning(
                "pipe.spool.delete_failed", extra={"segment": segment.seg_path.name, "error": repr(exc)}
            )
            return
        log.debug("pipe.spool.segment_deleted", extra={"segment": segment.seg_path.name})

    def _write_error(self, what: str, exc: OSError, size: int) -> SpoolError:
        free = _free_bytes(self.directory)
        extra = {"directory": str(self.directory), "free_bytes": free, "size": size, "error": repr(exc)}
        if exc.errno in _FULL_ERRNOS:
            log.error("pipe.spool.full", extra=extra)
            return SpoolFull(
                f"spool {self.directory} is full ({free} bytes free): {what} of a {size}-byte message "
                f"failed: {exc.strerror}; the message was not spooled and not sent"
            )
        log.error("pipe.spool.write_failed", extra=extra)
        return SpoolError(
            f"spool {self.directory} ({free} bytes free): {what} failed: {exc}; "
            "the message was not spooled and not sent"
        )

    # -- recovery ------------------------------------------------------------------------------

    def _recover(self) -> None:
        for ack in self.directory.glob("*.ack"):
            if not ack.with_suffix(".seg").exists():
                ack.unlink(missing_ok=True)
        paths = []
        for path in self.directory.glob("*.seg"):
            try:
                paths.append((int(path.stem, 16), path))
            except ValueError:
                log.warning("pipe.spool.stray_file", extra={"path": str(path)})
        try:
            self._next_seq = int((self.directory / NEXT_FILE).read_text())
        except (FileNotFoundError, ValueError):
            pass
        for first, path in sorted(paths):
            self._next_seq = max(self._next_seq, first + 1)
            self._recover_segment(first, path)
        self._save_next_seq()

    def _save_next_seq(self) -> None:
        """Keeps the next seq in :data:`NEXT_FILE`, so seqs keep growing when no segment is left."""
        path = self.directory / NEXT_FILE
        scratch = path.with_suffix(".tmp")
        scratch.write_text(str(self._next_seq))
        if self.durable:
            fd = os.open(scratch, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        scratch.replace(path)

    def _recover_segment(self, first: int, path: Path) -> None:
        data = path.read_bytes()
        segment = _Segment(first, path, path.with_suffix(".ack"), 0, size=len(data))
        if len(data) < SEGMENT_HEADER.size:  # torn while being created: it never held a record
            self._delete_file(segment)
            return
        magic, salt, crc = SEGMENT_HEADER.unpack_from(data)
        if magic != MAGIC or crc != zlib.crc32(MAGIC + _SALT.pack(salt)):
            aside = path.with_name(path.name + ".corrupt")
            path.rename(aside)
            log.error("pipe.spool.corrupt_segment", extra={"segment": path.name, "moved_to": str(aside)})
            return
        segment.salt = salt
        records, end = _parse_records(data)
        if end < len(data):
            log.warning(
                "pipe.spool.corrupt_tail",
                extra={
                    "segment": path.name,
                    "offset": end,
                    "ignored_bytes": len(data) - end,
                    "records": len(records),
                },
            )
        forgotten = self._read_marks(segment)
        held = [(seq, payload) for seq, payload in records if seq not in forgotten]
        if records:
            self._next_seq = max(self._next_seq, records[-1][0] + 1)
        if not held:
            self._delete_file(segment)
            return
        segment.records = len(records)
        segment.live = len(held)
        segment.last = records[-1][0]
        self._segments.append(segment)
        self._firsts.append(first)
        self.recovered.extend(held)

    def _read_marks(self, segment: _Segment) -> set[int]:
        try:
            raw = segment.ack_path.read_bytes()
        except FileNotFoundError:
            return set()
        marks = set()
        for offset in range(0, len(raw) - ACK.size + 1, ACK.size):
            seq, crc = ACK.unpack_from(raw, offset)
            if crc == _ack_crc(seq, segment.salt):  # a torn or stale mark forgets nothing
                marks.add(seq)
        return marks

    def _delete_file(self, segment: _Segment) -> None:
        segment.seg_path.unlink(missing_ok=True)
        segment.ack_path.unlink(missing_ok=True)


def _parse_records(data: bytes) -> tuple[list[tuple[int, bytes]], int]:
    """The valid records of a segment's bytes and the offset where they end."""
    records: list[tuple[int, bytes]] = []
    offset = SEGMENT_HEADER.size
    view = memoryview(data)
    while offset + RECORD_HEADER.size <= len(data):
        length, crc, seq = RECORD_HEADER.unpack_from(data, offset)
        start = offset + RECORD_HEADER.size
        if length > MAX_RECORD or start + length > len(data):
            break
        payload = view[start : start + length]
        if zlib.crc32(payload, zlib.crc32(_LEN_SEQ.pack(length, seq))) != crc:
            break
        records.append((seq, bytes(payload)))
        offset = start + length
    return records, offset


def _lock(directory: Path) -> int:
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


def _new_salt() -> int:
    return secrets.randbits(32)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _free_bytes(directory: Path) -> int | None:
    try:
        return shutil.disk_usage(directory).free
    except OSError:
        return None


def _close_fd(fd: int | None) -> None:
    if fd is not None:
        try:
            os.close(fd)
        except OSError:
            pass
