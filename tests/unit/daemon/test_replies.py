"""The daemon's reader of a slot's replies: whole frames, however the bytes arrive."""

from __future__ import annotations

import asyncio
import os

import pytest

from truba.daemon.replies import ReplyReader, reply_reader
from truba.daemon.slot_main import HEADER


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
