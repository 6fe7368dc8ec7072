"""Reading a spool directory's records back: at open, those of earlier runs that were never
forgotten (:func:`recover`); later, live records by seq (:func:`read_records`).

A crash mid-append leaves a torn tail: it is ignored with a warning while every record before it
is recovered. A run never appends to a segment of an earlier run (it starts a new one), so a torn
tail is always a segment's last record. A segment whose header is not intact is moved aside
(``.corrupt``); a segment with no record left to replay is deleted, with its marks.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from truba.pipes.errors import SpoolError
from truba.pipes.spool_files import read_next_seq
from truba.pipes.spool_format import SEGMENT_HEADER, Segment, header_salt, parse_records, read_marks

log = logging.getLogger(__name__)


@dataclass
class Recovered:
    """What :func:`recover` found: the segments still holding live records, oldest first."""

    next_seq: int = 0
    """The seq the next record gets (above every seq found, and at least what ``NEXT`` says)."""
    segments: list[Segment] = field(default_factory=list)
    records: list[tuple[int, bytes]] = field(default_factory=list)
    """(seq, payload) of the records never forgotten, oldest first."""


def recover(directory: Path) -> Recovered:
    """Reads every segment of ``directory``; cleans up what holds nothing to replay.

    Raises:
        OSError: a file could not be read, renamed or deleted.
    """
    for ack in directory.glob("*.ack"):
        if not ack.with_suffix(".seg").exists():
            ack.unlink(missing_ok=True)
    paths = []
    for path in directory.glob("*.seg"):
        try:
            paths.append((int(path.stem, 16), path))
        except ValueError:
            log.warning("pipe.spool.stray_file", extra={"path": str(path)})
    found = Recovered(next_seq=read_next_seq(directory) or 0)
    for first, path in sorted(paths):
        found.next_seq = max(found.next_seq, first + 1)
        _recover_segment(found, first, path)
    return found


def _recover_segment(found: Recovered, first: int, path: Path) -> None:
    data = path.read_bytes()
    segment = Segment(first, path, path.with_suffix(".ack"), 0, size=len(data))
    if len(data) < SEGMENT_HEADER.size:  # torn while being created: it never held a record
        _delete_files(segment)
        return
    salt = header_salt(data)
    if salt is None:
        aside = path.with_name(path.name + ".corrupt")
        path.rename(aside)
        log.error("pipe.spool.corrupt_segment", extra={"segment": path.name, "moved_to": str(aside)})
        return
    segment.salt = salt
    records, end = parse_records(data)
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
    forgotten = read_marks(segment)
    held = [(seq, payload) for seq, payload in records if seq not in forgotten]
    if records:
        found.next_seq = max(found.next_seq, records[-1][0] + 1)
    if not held:
        _delete_files(segment)
        return
    segment.records = len(records)
    segment.live = len(held)
    segment.last = records[-1][0]
    found.segments.append(segment)
    found.records.extend(held)


def _delete_files(segment: Segment) -> None:
    segment.seg_path.unlink(missing_ok=True)
    segment.ack_path.unlink(missing_ok=True)


def read_records(
    directory: Path, segments: Sequence[Segment], firsts: Sequence[int], seqs: Iterable[int]
) -> dict[int, bytes]:
    """The payloads of records ``seqs`` of ``segments`` (whose first seqs are ``firsts``); a seq
    of no segment there is left out (forget marks are not consulted).

    Raises:
        SpoolError: a segment could not be read.
    """
    found: dict[int, bytes] = {}
    by_segment: dict[int, list[int]] = {}
    for seq in sorted(set(seqs)):
        index = bisect.bisect_right(firsts, seq) - 1
        if index >= 0 and seq <= segments[index].last:
            by_segment.setdefault(index, []).append(seq)
    for index, members in by_segment.items():
        segment = segments[index]
        try:
            data = segment.seg_path.read_bytes()
        except OSError as exc:
            raise SpoolError(f"spool {directory}: cannot read {segment.seg_path.name}: {exc}") from exc
        want = set(members)
        for seq, payload in parse_records(data)[0]:
            if seq in want:
                found[seq] = payload
    return found
