"""The disk buffer's file format: what a spool directory holds, byte for byte.

::

    LOCK                    flock()ed by the one process that owns the spool; contains its pid
    NEXT                    the next seq, as of the last open or close
    00000000000003e8.seg    a segment (named by the hex seq of its first record), append-only
    00000000000003e8.ack    forget marks for that segment's records

A segment starts with a 16-byte header ``<8s magic "TRSPOOL1"><u32 salt><u32 crc32>`` followed by
records ``<u32 length><u32 crc32><u64 seq><payload>``, the CRC covering length, seq and payload.
A record cut short or failing its CRC ends its segment (:func:`parse_records` stops there).

An ``.ack`` file holds 12-byte marks ``<u64 seq><u32 crc32(seq, salt)>`` of forgotten records.
The salt ties a mark to one incarnation of a segment, so a stale mark can never forget a newer
record; a torn or stale mark forgets nothing (:func:`read_marks`).
"""

from __future__ import annotations

import secrets
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from truba.pipes.crc import crc32

MAGIC: Final = b"TRSPOOL1"
SEGMENT_HEADER: Final = struct.Struct("<8sII")  # magic, salt, crc32(magic + salt)
RECORD_HEADER: Final = struct.Struct("<IIQ")  # payload length, crc32, seq
ACK: Final = struct.Struct("<QI")  # seq, crc32(seq, salt)
LEN_SEQ: Final = struct.Struct("<IQ")
"""What a record's CRC covers before its payload: ``crc32(payload, crc32(LEN_SEQ.pack(...)))``."""
SALT: Final = struct.Struct("<I")
NEXT_FILE: Final = "NEXT"
"""Holds the next seq (written at open and close), so seqs grow across runs even when every
segment was deleted."""
MAX_RECORD: Final = 1 << 30
"""Longest payload accepted; a longer length field in a record is treated as corruption."""


@dataclass(eq=False)
class Segment:
    """One segment file and its forget marks, as its owner tracks them."""

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


def new_salt() -> int:
    return secrets.randbits(32)


def segment_header(salt: int) -> bytes:
    return SEGMENT_HEADER.pack(MAGIC, salt, _header_crc(salt))


def header_salt(data: bytes) -> int | None:
    """The salt of a segment whose bytes are ``data``; None if its header is not intact."""
    magic, salt, crc = SEGMENT_HEADER.unpack_from(data)
    if magic != MAGIC or crc != _header_crc(salt):
        return None
    return int(salt)


def _header_crc(salt: int) -> int:
    return crc32(MAGIC + SALT.pack(salt))


def ack_crc(seq: int, salt: int) -> int:
    return crc32(SALT.pack(salt), crc32(seq.to_bytes(8, "little")))


def parse_records(data: bytes) -> tuple[list[tuple[int, bytes]], int]:
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
        if crc32(payload, crc32(LEN_SEQ.pack(length, seq))) != crc:
            break
        records.append((seq, bytes(payload)))
        offset = start + length
    return records, offset


def read_marks(segment: Segment) -> set[int]:
    """The seqs that ``segment``'s ``.ack`` file marks forgotten (none if it has no such file)."""
    try:
        raw = segment.ack_path.read_bytes()
    except FileNotFoundError:
        return set()
    marks = set()
    for offset in range(0, len(raw) - ACK.size + 1, ACK.size):
        seq, crc = ACK.unpack_from(raw, offset)
        if crc == ack_crc(seq, segment.salt):  # a torn or stale mark forgets nothing
            marks.add(seq)
    return marks
