"""The disk buffer's on-disk log: checksummed segment files, forget marks, and an exclusive lock.

This module is synchronous plain file I/O; :mod:`truba.pipes.spool` decides *when* to fsync.
The files and their bytes are described in :mod:`truba.pipes.spool_format`; what an open finds
of earlier runs, in :mod:`truba.pipes.spool_recovery`.

Forget marks are written in batches and never fsynced: a lost mark only brings a confirmed
record back as a duplicate after a crash.

Compaction: the active segment rotates at ``segment_bytes``; a segment is deleted once it is not
the active one and every record in it is forgotten. Sequence numbers are unique and grow across
runs: a crash leaves the active segment behind, and ``NEXT`` keeps the count when none is left,
so an owner can use ``next_seq`` as the number of records ever appended.
"""

from __future__ import annotations

import bisect
import logging
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Final, final

from truba.pipes.crc import crc32
from truba.pipes.errors import SpoolError, SpoolFull, SpoolLocked
from truba.pipes.spool_files import (
    close_fd,
    fsync_dir,
    lock_directory,
    save_next_seq,
    write_all,
    write_error,
)
from truba.pipes.spool_format import (
    ACK,
    LEN_SEQ,
    MAX_RECORD,
    RECORD_HEADER,
    SEGMENT_HEADER,
    Segment,
    ack_crc,
    new_salt,
    segment_header,
)
from truba.pipes.spool_recovery import read_records, recover

__all__ = ["SpoolError", "SpoolFull", "SpoolLocked", "SpoolLog"]

log = logging.getLogger(__name__)

_MAX_PARTS: Final = 1024
"""Buffers in one ``writev`` at most (Linux's IOV_MAX): two per record."""


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
        self._segments: list[Segment] = []
        self._firsts: list[int] = []
        self._active: Segment | None = None
        self._next_seq = 0
        self._closed = False

    @classmethod
    def open(cls, directory: str | os.PathLike[str], *, durable: bool, segment_bytes: int) -> SpoolLog:
        """Locks ``directory`` (created if missing) and recovers the records of earlier runs."""
        path = Path(directory)
        try:
            path.mkdir(parents=True, exist_ok=True)
            spool = cls(path, lock_directory(path), durable, segment_bytes)
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
        return read_records(self.directory, self._segments, self._firsts, seqs)

    def append(self, head: bytes, data: bytes = b"") -> int:
        """Writes one record, ``head`` followed by ``data`` (one ``writev``: a large ``data`` is
        not copied to join them; no fsync), and returns its seq."""
        if self.sync_error is not None:
            raise self.sync_error
        size = len(head) + len(data)
        if size > MAX_RECORD:
            raise SpoolError(f"spool {self.directory}: a {size}-byte message exceeds {MAX_RECORD}")
        segment = self._active
        need = RECORD_HEADER.size + size
        if segment is None or (segment.size + need > self.segment_bytes and segment.records):
            segment = self._rotate()
        seq = self._next_seq
        crc = crc32(head, crc32(LEN_SEQ.pack(size, seq)))
        if data:
            crc = crc32(data, crc)
            self._write(segment, (RECORD_HEADER.pack(size, crc, seq), head, data), 1, size)
        else:
            self._write(segment, (RECORD_HEADER.pack(size, crc, seq), head), 1, size)
        return seq

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
            first = self._next_seq
            start = self._append_run(records, start)
            seqs.extend(range(first, self._next_seq))
        return seqs

    def _append_run(self, records: Sequence[bytes], start: int) -> int:
        """Appends ``records[start:]`` while they fit in the active segment (rotating first if
        the first one does not), with one write; returns the index after the last one written."""
        need = RECORD_HEADER.size + len(records[start])
        segment = self._active
        if segment is None or (segment.size + need > self.segment_bytes and segment.records):
            segment = self._rotate()
        parts: list[bytes] = []
        size, seq, end, payload = segment.size, self._next_seq, start, 0
        while end < len(records) and len(parts) < _MAX_PARTS:
            data = records[end]
            need = RECORD_HEADER.size + len(data)
            if end > start and size + need > self.segment_bytes:
                break
            crc = crc32(data, crc32(LEN_SEQ.pack(len(data), seq)))
            parts += (RECORD_HEADER.pack(len(data), crc, seq), data)
            size, seq, end, payload = size + need, seq + 1, end + 1, payload + len(data)
        self._write(segment, parts, end - start, payload)
        return end

    def _write(self, segment: Segment, parts: Sequence[bytes], records: int, payload: int) -> None:
        """Appends ``records`` records (``parts``: their headers and payloads, ``payload``
        bytes of payload) to ``segment`` with one write, and counts them in."""
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
            raise write_error(self.directory, "append", exc, payload) from exc
        seq = self._next_seq + records
        segment.records += records
        segment.live += records
        self._next_seq = seq
        segment.size += payload + RECORD_HEADER.size * records
        segment.last = seq - 1

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
            segment.acks += ACK.pack(seq, ack_crc(seq, segment.salt))

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
                save_next_seq(self.directory, self._next_seq, self.durable)
            except OSError as exc:
                log.warning("pipe.spool.next_seq_unsaved", extra={"error": repr(exc)})
            if self._active is not None:
                self._seal(self._active)
            for segment in list(self._segments):
                close_fd(segment.ack_fd)
                segment.ack_fd = None
                if segment.live <= 0:
                    self._delete(segment)
        finally:
            self._closed = True
            close_fd(self._lock_fd)  # closing the descriptor releases the flock
            self._lock_fd = None

    # -- segments ----------------------------------------------------------------------------

    def _rotate(self) -> Segment:
        if self._active is not None:
            self._seal(self._active)
            if self.sync_error is not None:
                raise self.sync_error
        first = self._next_seq
        name = f"{first:016x}"
        segment = Segment(first, self.directory / f"{name}.seg", self.directory / f"{name}.ack", new_salt())
        header = segment_header(segment.salt)
        try:
            segment.ack_path.unlink(missing_ok=True)
            fd = os.open(segment.seg_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL, 0o644)
        except OSError as exc:
            raise write_error(self.directory, "create segment", exc, 0) from exc
        try:
            write_all(fd, header, b"")
            if self.durable:
                os.fdatasync(fd)
                fsync_dir(self.directory)
        except OSError as exc:
            os.close(fd)
            segment.seg_path.unlink(missing_ok=True)
            raise write_error(self.directory, "create segment", exc, 0) from exc
        segment.fd, segment.size = fd, SEGMENT_HEADER.size
        self._segments.append(segment)
        self._firsts.append(first)
        self._active = segment
        log.debug("pipe.spool.segment_created", extra={"segment": segment.seg_path.name})
        return segment

    def _seal(self, segment: Segment) -> None:
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

    def _delete(self, segment: Segment) -> None:
        if segment not in self._segments:
            return
        index = self._segments.index(segment)
        del self._segments[index]
        del self._firsts[index]
        close_fd(segment.fd)
        close_fd(segment.ack_fd)
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

    # -- recovery ------------------------------------------------------------------------------

    def _recover(self) -> None:
        found = recover(self.directory)
        self._next_seq = found.next_seq
        self._segments = found.segments
        self._firsts = [segment.first for segment in found.segments]
        self.recovered = found.records
        save_next_seq(self.directory, self._next_seq, self.durable)
