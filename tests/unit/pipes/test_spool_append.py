"""The spool log's append of a head and a payload (one writev, no joining copy) and its CRC-32
(zlib-ng's when installed): the bytes on disk are those zlib's CRC always gave, so spool files
of either read back with the other."""

from __future__ import annotations

import importlib
import os
import sys
import zlib
from pathlib import Path

import pytest

from truba.pipes import crc, spool_files, spool_log
from truba.pipes.spool_format import LEN_SEQ, RECORD_HEADER, SEGMENT_HEADER, segment_header


def test_the_crc_is_zlib_s_over_any_buffer_and_chained() -> None:
    data = os.urandom(1 << 20) + b"tail"
    assert crc.FAST  # zlib-ng is a dependency
    assert crc.crc32(data) == zlib.crc32(data)
    assert crc.crc32(data, 0x12345678) == zlib.crc32(data, 0x12345678)
    assert crc.crc32(memoryview(data)[3:77]) == zlib.crc32(data[3:77])
    assert crc.crc32(b"") == 0 and crc.crc32(b"", 42) == 42


def test_without_zlib_ng_it_falls_back_to_zlib(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "zlib_ng", None)  # as if it were not installed
    monkeypatch.setitem(sys.modules, "zlib_ng.zlib_ng", None)
    try:
        fallback = importlib.reload(crc)
        assert not fallback.FAST and fallback.crc32 is zlib.crc32
    finally:
        monkeypatch.undo()
        importlib.reload(crc)
    assert crc.FAST


def test_a_head_and_a_payload_are_one_record_written_in_one_writev(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    writes: list[tuple[bytes, ...]] = []
    write_all = spool_files.write_all

    def recording(fd: int, *parts: bytes) -> None:
        writes.append(parts)
        write_all(fd, *parts)

    monkeypatch.setattr(spool_log, "write_all", recording)
    log = spool_log.SpoolLog.open(tmp_path, durable=False, segment_bytes=1 << 24)
    payload = os.urandom(1 << 20)
    assert log.append(b"head:", payload) == 0 and log.append(b"alone") == 1
    header, first, second = writes  # the segment's header, then one write per record
    assert header[0].startswith(b"TRSPOOL1")
    assert first[1:] == (b"head:", payload) and second[1:] == (b"alone",)
    assert first[2] is payload  # handed to the kernel as it is: not joined to the head
    log.close()
    again = spool_log.SpoolLog.open(tmp_path, durable=False, segment_bytes=1 << 24)
    assert again.recovered == [(0, b"head:" + payload), (1, b"alone")]
    again.close()


def test_a_spool_file_with_zlib_s_crcs_is_recovered(tmp_path: Path) -> None:
    # Written as before zlib-ng (every CRC from zlib.crc32): all of it comes back.
    def record(seq: int, payload: bytes) -> bytes:
        check = zlib.crc32(payload, zlib.crc32(LEN_SEQ.pack(len(payload), seq)))
        return RECORD_HEADER.pack(len(payload), check, seq) + payload

    big = os.urandom(300_000)
    header = segment_header(7)
    assert SEGMENT_HEADER.unpack(header)[2] == zlib.crc32(header[:12])
    (tmp_path / f"{0:016x}.seg").write_bytes(header + record(0, b"first") + record(1, big))
    log = spool_log.SpoolLog.open(tmp_path, durable=False, segment_bytes=1 << 24)
    assert log.recovered == [(0, b"first"), (1, big)] and log.next_seq == 2
    log.close()


def test_a_corrupt_payload_ends_the_segment_there(tmp_path: Path) -> None:
    log = spool_log.SpoolLog.open(tmp_path, durable=False, segment_bytes=1 << 24)
    log.append(b"good")
    log.append(b"head", b"payload")
    log.close()
    [path] = tmp_path.glob("*.seg")
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF  # the second record's payload, flipped
    path.write_bytes(bytes(data))
    again = spool_log.SpoolLog.open(tmp_path, durable=False, segment_bytes=1 << 24)
    assert again.recovered == [(0, b"good")]
    again.close()
