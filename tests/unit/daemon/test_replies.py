"""The daemon's reader of a slot's replies: whole frames, however the bytes arrive."""

from __future__ import annotations

import asyncio
import os

import pytest

from truba.daemon.replies import ReplyReader, reply_reader
from truba.daemon.slot_main import HEADER, LARGE_FRAME


def framed(*bodies: bytes) -> bytes:
    return b"".join(HEADER.pack(len(body)) + body for body in bodies)


async def test_frames_are_split_however_the_bytes_arrive() -> None:
    reader = ReplyReader()
    data = framed(b"one", b"", b"three" * 1000)
    reader.data_received(data[:2])  # half a header
    assert reader.take() is None
    reader.data_received(data[2:9])  # the first frame and a part of the second header
    assert reader.take() == b"one" and reader.take() is None
    reader.data_received(data[9:])
    assert reader.take() == b"" and await reader.read() == b"three" * 1000
    assert reader.take() is None


async def test_a_reader_waits_for_the_next_frame_and_eof_ends_it_with_the_partial_one() -> None:
    reader = ReplyReader()
    waiting = asyncio.create_task(reader.read())
    await asyncio.sleep(0)
    assert not waiting.done()
    reader.data_received(framed(b"reply"))
    assert await waiting == b"reply"
    reader.data_received(framed(b"cut short")[:7])
    reader.eof_received()
    with pytest.raises(asyncio.IncompleteReadError) as ended:
        await reader.read()
    assert ended.value.partial == framed(b"cut short")[:7]


async def test_it_reads_a_real_pipe_and_sees_the_writer_close() -> None:
    read_end, write_end = os.pipe()
    reader = await reply_reader(read_end)
    os.write(write_end, framed(b"a", b"b"))
    assert await reader.read() == b"a" and reader.take() == b"b"
    os.close(write_end)  # the slot exited
    with pytest.raises(asyncio.IncompleteReadError):
        await asyncio.wait_for(reader.read(), 5)


async def test_a_large_frame_is_whole_however_its_chunks_come_and_what_follows_is_split() -> None:
    reader = ReplyReader()
    large = bytes(range(256)) * (LARGE_FRAME // 256 + 7)
    data = framed(b"before", large, b"after", b"last")
    waiting = asyncio.create_task(reader.read())
    await asyncio.sleep(0)
    at = len(framed(b"before")) + 3  # the first frame and part of the large one's header
    reader.data_received(data[:at])
    assert await waiting == b"before"
    waiting = asyncio.create_task(reader.read())
    for start in range(at, at + len(large), 10_000):  # the large frame, then the next ones
        stop = min(start + 10_000, at + len(large) + 5)
        reader.data_received(data[start:stop])
    await asyncio.sleep(0)
    assert waiting.done() and waiting.result() == large
    assert reader.take() is None
    reader.data_received(data[at + len(large) + 5 :])
    assert reader.take() == b"after" and reader.take() == b"last" and reader.take() is None


async def test_eof_in_the_middle_of_a_large_frame_ends_the_reader() -> None:
    reader = ReplyReader()
    reader.data_received(framed(b"y" * LARGE_FRAME)[:-1])
    reader.eof_received()
    with pytest.raises(asyncio.IncompleteReadError) as ended:
        await reader.read()
    assert ended.value.partial == b"y" * (LARGE_FRAME - 1)
